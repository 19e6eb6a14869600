"""The manifest: the one JSON file per split that names every shard and says what a sample is.

It is written last and atomically (temp name, fsync, rename: :func:`shardkit.publish.dump_manifest`):
a split folder whose manifest exists is complete. Readers trust nothing in it blindly: every shard path
is checked to stay inside the split folder, and versions are checked on load.
The JSON Schema is ``formats/manifest.schema.json``; ``formats/manifest.md`` explains it.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

from . import encoding
from .errors import ShardFormatError, UnsafePathError

MANIFEST_NAME = "manifest.json"
SCHEMA_ID = "shardkit.manifest"
MANIFEST_VERSION = 1
# Bounds on manifest numbers, checked before anything is allocated from them.
MAX_CLASSES = 65536  # class ids are stored as uint8 or uint16
MAX_SIDE = 65536  # pixels per image side
MAX_PIXELS = 1 << 28  # pixels per image (a 16384 x 16384 image)
CLASS_ID_DTYPES = ("|u1", "<u2")


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class ShardFile:
    """One file of a shard as it lies on disk under its final name."""

    name: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class ShardInfo:
    """One shard: its files, how many samples it holds and the global index of its first sample."""

    index: int
    num_samples: int
    first_index: int
    files: tuple[ShardFile, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "num_samples": self.num_samples,
            "first_index": self.first_index,
            "files": [asdict(f) for f in self.files],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ShardInfo:
        return cls(
            index=int(d["index"]),
            num_samples=int(d["num_samples"]),
            first_index=int(d["first_index"]),
            files=tuple(ShardFile(str(f["name"]), int(f["bytes"]), str(f["sha256"])) for f in d["files"]),
        )


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to serve a split, and everything a person needs to trust it."""

    format: str
    format_version: int
    split: str
    num_samples: int
    sample: dict[str, Any]
    classes: dict[str, Any]
    preprocessing: dict[str, Any]
    source: dict[str, Any]
    shards: tuple[ShardInfo, ...]
    samples: tuple[dict[str, Any], ...]
    stats: dict[str, Any]
    skipped: tuple[dict[str, Any], ...] = ()
    format_options: dict[str, Any] = field(default_factory=dict)
    tool_version: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_ID,
            "manifest_version": MANIFEST_VERSION,
            "tool": {"name": "shardkit", "version": self.tool_version},
            "format": self.format,
            "format_version": self.format_version,
            "format_options": self.format_options,
            "split": self.split,
            "num_samples": self.num_samples,
            "sample": self.sample,
            "classes": self.classes,
            "preprocessing": self.preprocessing,
            "source": self.source,
            "stats": self.stats,
            "shards": [s.to_json() for s in self.shards],
            "samples": list(self.samples),
            "skipped": list(self.skipped),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], *, origin: Path | None = None) -> Manifest:
        where = origin or Path(MANIFEST_NAME)
        if not isinstance(d, dict) or d.get("schema") != SCHEMA_ID:
            raise ShardFormatError("not a shardkit manifest", path=where,
                                   fix="point at a folder written by shardkit convert")
        version = d.get("manifest_version")
        if version != MANIFEST_VERSION:
            raise ShardFormatError(
                f"manifest version {version!r} is not supported (this shardkit reads version {MANIFEST_VERSION})",
                path=where,
                fix="re-convert with this shardkit version or upgrade shardkit",
            )
        try:
            manifest = cls(
                format=str(d["format"]),
                format_version=int(d["format_version"]),
                split=str(d["split"]),
                num_samples=int(d["num_samples"]),
                sample=dict(d["sample"]),
                classes=dict(d["classes"]),
                preprocessing=dict(d["preprocessing"]),
                source=dict(d["source"]),
                shards=tuple(ShardInfo.from_json(s) for s in d["shards"]),
                samples=tuple(d["samples"]),
                stats=dict(d["stats"]),
                skipped=tuple(d.get("skipped", ())),
                format_options=dict(d.get("format_options", {})),
                tool_version=str(d.get("tool", {}).get("version", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ShardFormatError(f"manifest is malformed ({exc!r})", path=where,
                                   fix="re-convert this split") from None
        manifest.check_bounds(where)
        manifest.check_consistency(where)
        return manifest

    def check_bounds(self, where: Path) -> None:
        """Every number a reader sizes memory from, or indexes with, has the right type and a sane size."""

        def bad(problem: str) -> ShardFormatError:
            return ShardFormatError(f"manifest {problem}", path=where,
                                    fix="re-convert this split; do not use manifests from untrusted sources")

        from .formats.registry import names  # here: the formats package imports this module

        if self.format not in names():
            raise bad(f"format {self.format!r} is not one of {', '.join(names())}")
        image, label = self.sample.get("image"), self.sample.get("label")
        if not isinstance(image, dict) or not isinstance(label, dict):
            raise bad("sample has no image and label description")
        n = label.get("num_classes")
        if not _is_int(n) or not 1 <= n <= MAX_CLASSES:
            raise bad(f"num_classes {n!r} is not an integer in 1..{MAX_CLASSES}")
        if label.get("encoding") not in encoding.NAMES:
            raise bad(f"label encoding {label.get('encoding')!r} is not one of {', '.join(encoding.NAMES)}")
        if label.get("class_id_dtype") not in CLASS_ID_DTYPES:
            raise bad(f"class_id_dtype {label.get('class_id_dtype')!r} is not one of {', '.join(CLASS_ID_DTYPES)}")
        shape = image.get("shape")
        if not isinstance(shape, list) or len(shape) != 3 or (shape[0] is None) != (shape[1] is None):
            raise bad(f"image shape {shape!r} is not [H, W, 3] or [null, null, 3]")
        if shape[0] is not None:
            self._check_size(shape[0], shape[1], "image shape", bad)
        ignore = self.classes.get("ignore_index")
        if ignore is not None and (not _is_int(ignore) or not 0 <= ignore < MAX_CLASSES):
            raise bad(f"ignore_index {ignore!r} is not an integer in 0..{MAX_CLASSES - 1}")
        classes = self.classes.get("classes")
        if not isinstance(classes, list):
            raise bad("classes.classes is not a list")
        for c in classes:
            if not isinstance(c, dict) or not _is_int(c.get("id")) or not 0 <= c["id"] < n:
                raise bad(f"class {c!r} has no integer id in 0..{n - 1}")
            if not isinstance(c.get("name"), str):
                raise bad(f"class {c['id']} has no name string")
            colour = c.get("colour")
            if colour is not None and (not isinstance(colour, list) or len(colour) != 3
                                       or not all(_is_int(v) and 0 <= v <= 255 for v in colour)):
                raise bad(f"class {c['id']} colour {colour!r} is not three integers 0..255")
        for i, rec in enumerate(self.samples):
            if not isinstance(rec, dict):
                raise bad(f"sample record {i} is not an object")
            self._check_size(rec.get("height"), rec.get("width"), f"sample {i}", bad)
        for key in ("class_pixels", "class_share", "image_mean", "image_std"):
            values = self.stats.get(key, [])
            if not isinstance(values, list) or not all(_is_number(v) for v in values):
                raise bad(f"stats.{key} is not a list of numbers")
        for shard in self.shards:
            if shard.num_samples < 0 or any(f.bytes < 0 for f in shard.files):
                raise bad(f"shard {shard.index} has a negative sample or byte count")

    @staticmethod
    def _check_size(h: Any, w: Any, what: str, bad: Any) -> None:
        if not (_is_int(h) and _is_int(w) and 1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE and h * w <= MAX_PIXELS):
            raise bad(f"{what} {h!r}x{w!r} is not two integers in 1..{MAX_SIDE} with at most {MAX_PIXELS} pixels")

    def check_consistency(self, where: Path) -> None:
        """Counts add up, shards are contiguous, every file name is a plain name inside the folder."""
        expected = 0
        for shard in self.shards:
            if shard.first_index != expected or shard.num_samples < 0:
                raise ShardFormatError(
                    f"shard {shard.index} starts at {shard.first_index}, expected {expected}",
                    path=where,
                    fix="re-convert this split",
                )
            expected += shard.num_samples
            for f in shard.files:
                safe_member(f.name, where)
        if expected != self.num_samples or len(self.samples) != self.num_samples:
            raise ShardFormatError(
                f"manifest counts disagree: {self.num_samples} samples, shards hold {expected}, "
                f"{len(self.samples)} sample records",
                path=where,
                fix="re-convert this split",
            )


def safe_member(name: str, where: Path) -> str:
    """A shard file name from a manifest, refused unless it is a plain relative name in the folder."""
    p = PurePosixPath(name)
    if (
        not name
        or p.is_absolute()
        or "\\" in name
        or any(part in ("..", "") for part in p.parts)
        or ":" in name
        or name.startswith(".")
        or any(ord(ch) < 32 or ord(ch) == 127 for ch in name)
    ):
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


def load_manifest(directory: Path) -> Manifest:
    """Read and validate ``directory/manifest.json`` (a split folder)."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME if directory.is_dir() else directory
    if not path.is_file():
        from .errors import InputNotFoundError

        raise InputNotFoundError(
            "no manifest.json here",
            path=directory,
            fix="point at a split folder written by shardkit convert (e.g. out/train)",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardFormatError(f"manifest cannot be read ({exc})", path=path, fix="re-convert this split") from None
    except RecursionError:
        raise ShardFormatError("manifest is nested too deeply to be a shardkit manifest", path=path,
                               fix="re-convert this split; do not use manifests from untrusted sources") from None
    return Manifest.from_json(data, origin=path)
