"""The typed core under the manifest and the formats: a shard's file records, the safe names and regular files a
split folder may hold, the pixel bounds every stored size is checked against, and the temp-name and fsync rules
of writing into a split folder.

Nothing here imports another shardkit module but the errors: the formats, the samples sidecars and the manifest
all build on it, so none of them needs another of them for these facts.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeGuard

from .errors import UnsafePathError

MAX_SIDE = 65536  # pixels per image side
MAX_PIXELS = 1 << 28  # pixels per image (a 16384 x 16384 image)
#: Marks a temporary name: ``.<final name>.tmp-<host>-<pid>-<random>``; anything hidden carrying it is
#: unfinished work of some run, and :func:`shardkit.publish.remove_temps` deletes it.
TMP_MARK = ".tmp-"


def is_temp_name(name: str) -> bool:
    """A temporary name (hidden, carrying :data:`TMP_MARK`): unfinished work of some run, never a finished file."""
    return name.startswith(".") and TMP_MARK in name


def fsync_file(path: Path) -> None:
    """Make a file's data durable before a name points at it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def strict_int(v: Any, what: str) -> int:
    """``v`` if it is a JSON integer (not a bool, float, string, NaN or Infinity), else TypeError naming ``what``."""
    if not _is_int(v):
        raise TypeError(f"{what} {str(v)[:40]!r} is not an integer")
    return v


@dataclass(frozen=True)
class ShardFile:
    """One file of a shard as it lies on disk under its final name."""

    name: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class ShardInfo:
    """One shard: its files, how many samples it holds, the global index of its first sample and (manifest
    version 2) its samples sidecar."""

    index: int
    num_samples: int
    first_index: int
    files: tuple[ShardFile, ...]
    samples: ShardFile | None = None

    @property
    def all_files(self) -> tuple[ShardFile, ...]:
        """The format's files and the sidecar: everything of the shard that is hashed, copied and cached."""
        return self.files + ((self.samples,) if self.samples is not None else ())

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "num_samples": self.num_samples,
            "first_index": self.first_index,
            "files": [asdict(f) for f in self.files],
            **({"samples": asdict(self.samples)} if self.samples is not None else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ShardInfo:
        if not isinstance(d, dict) or not isinstance(d["files"], list):
            raise TypeError(f"shard entry {str(d)[:80]!r} is not an object with a list of files")
        files = [_file_from_json(f) for f in d["files"]]
        return cls(
            index=strict_int(d["index"], "index"),
            num_samples=strict_int(d["num_samples"], "num_samples"),
            first_index=strict_int(d["first_index"], "first_index"),
            files=tuple(files),
            samples=_file_from_json(d["samples"]) if "samples" in d else None,
        )


def _file_from_json(f: Any) -> ShardFile:
    if not isinstance(f, dict) or not isinstance(f["name"], str) or not isinstance(f["sha256"], str):
        raise TypeError(f"shard file entry {str(f)[:80]!r} has no name and sha256 strings")
    return ShardFile(f["name"], strict_int(f["bytes"], "bytes"), f["sha256"])


#: Non-empty, not starting with "/" or ".", without "\\", ":" or control characters (checked once per name,
#: on every open: a regular expression, not a path parse).
_PLAIN = re.compile(r"(?![./])[^\x00-\x1f\x7f\\:]+\Z")


def safe_member(name: str, where: Path) -> str:
    """A shard file name from a manifest, refused unless it is a plain relative name in the folder."""
    if not isinstance(name, str) or not _PLAIN.match(name) or ".." in name.split("/"):
        raise UnsafePathError(
            f"shard path {name!r} escapes the dataset folder",
            path=where,
            fix="do not use manifests from untrusted sources; re-convert the data",
        )
    return name


def member_path(name: str, directory: Path) -> Path:
    """``directory / name`` for a shard file named in a manifest, refused unless it is a safe relative name
    (:func:`safe_member`) whose real path (symlinks resolved) stays inside the real ``directory``."""
    directory = Path(directory)
    path = directory / safe_member(name, directory)
    real, root = os.path.realpath(path), os.path.realpath(directory)
    if os.path.commonpath([real, root]) != root:
        raise UnsafePathError(
            f"shard file {name!r} resolves to {real}, outside the dataset folder",
            path=path,
            fix="do not use shards from untrusted sources; re-convert the data",
        )
    return path


def check_regular_file(path: Path) -> os.stat_result:
    """``stat`` of a shard file (symlinks followed), refused unless it is a regular file."""
    st = Path(path).stat()  # follows symlinks, like os.stat
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(
            "shard file is not a regular file",
            path=path,
            fix="do not use shards from untrusted sources; re-convert the data",
        )
    return st
