"""Per-shard records kept beside the shards: what lets a killed or repeated run reuse finished work.

When a shard is renamed into place the parent writes ``.shard-<key>.json`` (atomically):
its files with sizes and sha256, its sample records and statistics. A later run whose plan
contains the same shard key re-hashes the files and, if they match, reuses the shard
without decoding anything. Records are plain JSON — never pickle.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .formats.base import sha256_file
from .manifest import ShardFile, safe_member
from .publish import atomic_write_bytes, link_into_place

log = logging.getLogger(__name__)
RECORD_PREFIX = ".shard-"


@dataclass(frozen=True)
class ShardRecord:
    """A finished, published shard."""

    key: str
    files: tuple[ShardFile, ...]
    samples: tuple[dict[str, Any], ...]
    stats: dict[str, Any]
    skipped: tuple[dict[str, str], ...]

    @staticmethod
    def path(directory: Path, key: str) -> Path:
        return directory / f"{RECORD_PREFIX}{key}.json"

    def save(self, directory: Path) -> None:
        data = {"key": self.key, "files": [f.__dict__ for f in self.files], "samples": list(self.samples),
                "stats": self.stats, "skipped": list(self.skipped)}
        atomic_write_bytes(self.path(directory, self.key), json.dumps(data, sort_keys=True).encode())

    @classmethod
    def load(cls, directory: Path, key: str) -> ShardRecord | None:
        try:
            d = json.loads(cls.path(directory, key).read_text(encoding="utf-8"))
            return cls(
                key=str(d["key"]),
                files=tuple(ShardFile(safe_member(str(f["name"]), directory), int(f["bytes"]), str(f["sha256"]))
                            for f in d["files"]),
                samples=tuple(d["samples"]),
                stats=dict(d["stats"]),
                skipped=tuple(d["skipped"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None


def reuse(directory: Path, key: str, wanted_names: tuple[str, ...]) -> ShardRecord | None:
    """The record of shard ``key`` if its files are intact (size and sha256), linked to ``wanted_names``.

    A shard whose position moved (its stem's index changed) is hard-linked (or copied) to
    its new names, leaving the old names — possibly still named by the current manifest — intact.
    """
    record = ShardRecord.load(directory, key)
    if record is None or len(record.files) != len(wanted_names) or record.key != key:
        return None
    for f in record.files:
        p = directory / f.name
        try:
            if p.stat().st_size != f.bytes or sha256_file(p) != f.sha256:
                log.info("shard file %s changed on disk; rewriting its shard", p)
                return None
        except OSError:
            return None
    files = []
    for f, name in zip(record.files, wanted_names, strict=True):
        if f.name != name:
            link_into_place(directory, f.name, name)
        files.append(ShardFile(name, f.bytes, f.sha256))
    moved = ShardRecord(key, tuple(files), record.samples, record.stats, record.skipped)
    if moved != record:
        moved.save(directory)
    return moved
