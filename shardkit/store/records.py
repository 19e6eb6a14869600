"""Per-shard records kept beside the shards: what lets a killed or repeated run reuse finished work.

When a shard is renamed into place the parent writes ``.shard-<key>.json`` (atomically):
its files (the format's, then the samples sidecar) with sizes, sha256 and the
``(size, mtime_ns, ctime_ns, inode)`` each had once published, its sample count, fingerprint digest
and statistics — never per-sample records, which live in the sidecar. A later run whose plan contains the same shard
key reuses the shard without decoding anything, and — when every file's four stat values still
match — without reading a byte of it: any write through the file system moves ``ctime`` (which
no user call can set back), a replaced file has a new inode. What a stat cannot see (bit rot,
writes to the raw device, a clock set back) is what ``--rehash`` and ``shardkit verify`` are
for: they hash every file against its recorded sha256. Records are plain JSON — never pickle.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..files.splitfiles import ShardFile, safe_member
from ..formats.base import sha256_file
from ..support.smallfile import loads_bounded, read_guarded, read_json
from .publish import atomic_write_bytes, link_into_place

log = logging.getLogger(__name__)
RECORD_PREFIX = ".shard-"
#: Largest shard record read (a record names a shard's few files and its statistics; one written before
#: samples sidecars also holds the shard's sample records inline).
MAX_RECORD_BYTES = 64 << 20
#: (size, mtime_ns, ctime_ns, inode) of a published shard file.
FileStat = tuple[int, int, int, int]


def file_stat(path: Path) -> FileStat:
    """The four values that change whenever a file's content can have changed through the file system."""
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


@dataclass(frozen=True)
class ShardRecord:
    """A finished, published shard; ``stats_on_disk[i]`` is ``file_stat`` of ``files[i]`` (``None``: unknown)."""

    key: str
    files: tuple[ShardFile, ...]  # the format's files, then the samples sidecar
    num_samples: int
    fingerprint: str  # sha256 of the shard's raw sample fingerprints (formats/samples.md)
    stats: dict[str, Any]
    skipped: tuple[dict[str, str], ...]
    stats_on_disk: tuple[FileStat | None, ...] = field(default=(), compare=False)  # this copy's, not the shard's
    #: the inline sample records of a record written before samples sidecars (see :func:`reuse`)
    legacy_samples: tuple[dict[str, Any], ...] | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def name(key: str) -> str:
        """The record's file name in its split folder: ``.shard-<key>.json``."""
        return f"{RECORD_PREFIX}{key}.json"

    @staticmethod
    def path(directory: Path, key: str) -> Path:
        return directory / ShardRecord.name(key)

    def save(self, directory: Path) -> None:
        files = [{**f.__dict__, **({"stat": list(s)} if s is not None else {})}
                 for f, s in zip(self.files, self._padded_stats(), strict=True)]
        data = {"key": self.key, "files": files, "num_samples": self.num_samples, "fingerprint": self.fingerprint,
                "stats": self.stats, "skipped": list(self.skipped)}
        atomic_write_bytes(self.path(directory, self.key), json.dumps(data, sort_keys=True).encode())

    def _padded_stats(self) -> tuple[FileStat | None, ...]:
        return self.stats_on_disk if len(self.stats_on_disk) == len(self.files) else (None,) * len(self.files)

    def with_stats(self, directory: Path) -> ShardRecord:
        """This record with the current stat of each of its files (taken right after they were verified)."""
        stats = tuple(file_stat(directory / f.name) for f in self.files)
        return replace(self, stats_on_disk=stats)

    @classmethod
    def load(cls, directory: Path, key: str) -> ShardRecord | None:
        """The record of shard ``key``; None when there is none, or (with a warning) when it is damaged: not a
        regular file, too large, not JSON, a field of the wrong type. Its shard is then rewritten."""
        path = cls.path(directory, key)
        try:
            d = read_json(path, "shard record", limit=MAX_RECORD_BYTES)
            legacy = tuple(d["samples"]) if "num_samples" not in d else None  # written before sidecars
            return cls(
                key=str(d["key"]),
                files=tuple(ShardFile(safe_member(str(f["name"]), directory), int(f["bytes"]), str(f["sha256"]))
                            for f in d["files"]),
                num_samples=_count(d["num_samples"] if legacy is None else len(legacy)),
                fingerprint=str(d["fingerprint"]) if legacy is None else "",
                stats=dict(d["stats"]),
                skipped=tuple(d["skipped"]),
                stats_on_disk=tuple(_stat_of(f) for f in d["files"]),
                legacy_samples=legacy,
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
            log.warning("%s: damaged (%s), ignored: its shard is written again", path, problem)
            return None


def is_record_name(name: str) -> bool:
    """A shard record's file name (``.shard-<key>.json``; a temp name of one is hidden with a different prefix)."""
    return name.startswith(RECORD_PREFIX)


def records_within(directory: Path, names: set[str]) -> set[str]:
    """The names of the shard records in ``directory`` all of whose files are among ``names`` (files kept for
    a kept version): kept with them, so that a run that goes back to that content reuses the files."""
    out: set[str] = set()
    for p in directory.iterdir():
        if not is_record_name(p.name) or not p.name.endswith(".json"):
            continue
        try:
            files = read_json(p, "shard record", limit=MAX_RECORD_BYTES)["files"]
            if files and all(isinstance(f, dict) and f.get("name") in names for f in files):
                out.add(p.name)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def content_digest(path: Path) -> str:
    """sha256 of a split folder's file as two conversions of the same input must agree on it.

    Shard records are compared without each file's recorded stat (its inode and ctime belong to this
    copy of the file, not to what was converted); every other file byte for byte.
    """
    data = read_guarded(path, "split file", limit=1 << 62)  # any size a shard has; regular files only
    if Path(path).name.startswith(RECORD_PREFIX):
        try:
            record = loads_bounded(data, "shard record")
            for f in record.get("files", []):
                f.pop("stat", None)
            data = json.dumps(record, sort_keys=True).encode()
        except (ValueError, AttributeError, TypeError):
            pass  # not a record after all: compared as bytes
    return hashlib.sha256(data).hexdigest()


def _with_sidecar(directory: Path, record: ShardRecord, name: str, rehash: bool) -> ShardRecord | None:
    """A shard recorded before samples sidecars (its records inline in the journal), its files intact: its
    sidecar written from those records, so upgrading shardkit does not rewrite the shard. ``None``: not intact."""
    from ..files.samples import SidecarBuilder

    now = _intact(directory, record, rehash)
    if now is None or record.legacy_samples is None:
        return None
    try:
        builder = SidecarBuilder(int(record.stats["num_classes"]))
        for s in record.legacy_samples:
            builder.add(str(s["key"]), s.get("label"), int(s["height"]), int(s["width"]), str(s["fingerprint"]),
                        [int(c) for c in s.get("classes", ())],
                        bytes.fromhex(str(s["pixels"])) if "pixels" in s else None,
                        looks=bytes.fromhex(str(s["looks"])) if "looks" in s else None)
        data = builder.to_bytes()
    except (KeyError, TypeError, ValueError, IndexError):
        return None  # a malformed old record: the shard is rewritten
    atomic_write_bytes(directory / name, data)
    sidecar = ShardFile(name, len(data), hashlib.sha256(data).hexdigest())
    upgraded = replace(record, files=(*record.files, sidecar), fingerprint=builder.digest(),
                       stats_on_disk=(*now, file_stat(directory / name)), legacy_samples=None)
    upgraded.save(directory)
    log.info("shard %s: samples sidecar %s written from its record", record.key, name)
    return upgraded


def _count(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"sample count {v!r}")
    return v


def _stat_of(entry: dict[str, Any]) -> FileStat | None:
    """The recorded stat of one file entry; ``None`` when absent or malformed (records of older versions)."""
    s = entry.get("stat")
    if isinstance(s, list) and len(s) == 4 and all(isinstance(v, int) and not isinstance(v, bool) for v in s):
        return s[0], s[1], s[2], s[3]
    return None


def _intact(directory: Path, record: ShardRecord, rehash: bool) -> tuple[FileStat, ...] | None:
    """Each file's stat if every file is intact, else ``None``.

    A file whose stat equals the recorded one is trusted unread unless ``rehash``; any other is hashed.
    The stat is taken before hashing, so a write during the hash leaves a stat that the next run re-checks.
    """
    now: list[FileStat] = []
    for f, recorded in zip(record.files, record._padded_stats(), strict=True):
        p = directory / f.name
        try:
            st = file_stat(p)
            if st[0] != f.bytes:
                log.info("shard file %s changed size on disk; rewriting its shard", p)
                return None
            if (rehash or st != recorded) and sha256_file(p) != f.sha256:
                log.info("shard file %s changed on disk; rewriting its shard", p)
                return None
        except OSError:
            return None
        now.append(st)
    return tuple(now)


def reuse(directory: Path, key: str, wanted_names: tuple[str, ...], *, rehash: bool = False) -> ShardRecord | None:
    """The record of shard ``key`` if its files are intact, linked to ``wanted_names``.

    Intact means: each file's recorded ``(size, mtime_ns, ctime_ns, inode)`` is unchanged (nothing
    read), or — with ``rehash``, for a record without stats, or when a stat changed (a copy, a
    restore from backup) — its size and sha256 match; the record then gets the new stats, so the
    next run reads nothing again. A shard whose position moved (its stem's index changed) is
    hard-linked (or copied) to its new names, leaving the old names — possibly still named by the
    current manifest — intact.
    """
    record = ShardRecord.load(directory, key)
    if record is not None and record.legacy_samples is not None and len(record.files) == len(wanted_names) - 1:
        record = _with_sidecar(directory, record, wanted_names[-1], rehash)
    if record is None or len(record.files) != len(wanted_names) or record.key != key:
        return None
    now = _intact(directory, record, rehash)
    if now is None:
        return None
    files = []
    for f, name in zip(record.files, wanted_names, strict=True):
        if f.name != name:
            link_into_place(directory, f.name, name)
        files.append(ShardFile(name, f.bytes, f.sha256))
    moved = replace(record, files=tuple(files), stats_on_disk=now)
    if moved.files != record.files:  # a hard link changes the inode's ctime: record the new names' stats
        moved = moved.with_stats(directory)
    if moved != record or moved.stats_on_disk != record.stats_on_disk:
        moved.save(directory)
    return moved
