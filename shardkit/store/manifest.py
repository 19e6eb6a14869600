"""The manifest: the one JSON file per split that names every shard and says what a sample is.

It is written last and atomically (temp name, fsync, rename: :func:`shardkit.store.publish.dump_manifest`):
a split folder whose manifest exists is complete. Readers trust nothing in it blindly: every shard path
is checked to stay inside the split folder, and versions are checked on load.
The JSON Schema is ``formats/manifest.schema.json``; ``formats/manifest.md`` explains it.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputNotFoundError, ShardFormatError
from ..files.samples import SampleTable, Sidecars
from ..files.splitfiles import (
    ClassTable,
    Preprocessing,
    SampleSpec,
    ShardInfo,
    Source,
    SplitStats,
    _is_int,
    check_size,
    member_path,
    safe_member,
    strict_int,
)
from ..formats.registry import names
from ..support.limits import MAX_MANIFEST_BYTES, MAX_PARSE_BYTES
from ..support.smallfile import loads_bounded, read_guarded

MANIFEST_NAME = "manifest.json"
SCHEMA_ID = "shardkit.manifest"
#: The manifest version of splits of (H, W, 3) uint8 RGB images (what every split was before version 4).
MANIFEST_VERSION = 3
#: Version 4: images of any stored type and band count (``sample.image``), and provenance columns in the
#: sidecars (formats/manifest.md). Written only where it is needed, so RGB uint8 splits stay byte-identical.
IMAGES_MANIFEST_VERSION = 4
#: Manifest versions this shardkit reads: 1 keeps sample records inline, 2 in one sidecar per shard, 3 is 2
#: plus the split's publish number (``version``; each publish also kept as ``manifest-v<N>.json``), 4 is 3 with
#: images of any type and bands.
READ_VERSIONS = (1, 2, 3, 4)
#: A kept publish of a split: ``manifest-v<N>.json`` beside ``manifest.json`` (which is a copy of the newest).
_VERSION_NAME = re.compile(r"manifest-v([1-9][0-9]{0,8})\.json\Z")
# Bounds on manifest numbers, checked before anything is allocated from them (the size bounds, MAX_CLASSES and the
# pixel bounds are declared in shardkit.support.limits; CLASS_ID_DTYPES lives with the typed records, in
# shardkit.files.splitfiles).
#: Largest publish number (nine digits in a version file name).
MAX_PUBLISH = 999_999_999


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to serve a split, and everything a person needs to trust it."""

    format: str
    format_version: int
    split: str
    num_samples: int
    sample: SampleSpec
    classes: ClassTable
    preprocessing: Preprocessing
    source: Source
    shards: tuple[ShardInfo, ...]
    #: one record per sample (:class:`~shardkit.files.samples.SampleTable`: inline in version 1, sidecars in 2)
    samples: SampleTable
    stats: SplitStats
    skipped: tuple[dict[str, Any], ...] = ()
    format_options: dict[str, Any] = field(default_factory=dict)
    tool_version: str = ""
    manifest_version: int = MANIFEST_VERSION
    #: the split's publish number (manifest version 3; None for older manifests, which carry none)
    version: int | None = None

    def __post_init__(self) -> None:
        """Parts given as their JSON (dicts, e.g. by a script or test that builds a manifest) become their types;
        checked ones raise a ValueError naming the problem."""
        sample = SampleSpec.from_json(self.sample)
        typed = {"sample": sample, "classes": ClassTable.from_manifest(self.classes, sample.num_classes),
                 "preprocessing": Preprocessing.from_json(self.preprocessing), "source": Source.from_json(self.source),
                 "stats": SplitStats.from_json(self.stats, sample.image_channels)}
        for name, value in typed.items():
            if value is not getattr(self, name):
                object.__setattr__(self, name, value)

    def to_json(self) -> dict[str, Any]:
        """The manifest as JSON; version 1 carries ``samples`` inline, version 2 names a sidecar per shard."""
        inline = {"samples": list(self.samples)} if self.manifest_version == 1 else {}
        shards = [s.to_json() for s in self.shards]
        if self.manifest_version == 1:
            for s in shards:
                s.pop("samples", None)
        return {
            "schema": SCHEMA_ID,
            "manifest_version": self.manifest_version,
            "tool": {"name": "shardkit", "version": self.tool_version},
            "format": self.format,
            "format_version": self.format_version,
            "format_options": self.format_options,
            "split": self.split,
            "num_samples": self.num_samples,
            "sample": self.sample.to_json(),
            "classes": self.classes.to_json(),
            "preprocessing": self.preprocessing.to_json(),
            "source": self.source.to_json(),
            "stats": self.stats.to_json(),
            "shards": shards,
            **inline,
            "skipped": list(self.skipped),
            **({"version": self.version} if self.manifest_version >= 3 else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], *, origin: Path | None = None, sidecars: Sidecars | None = None) -> Manifest:
        """The checked manifest of parsed JSON ``d`` (``origin`` names it in errors; its folder holds the sidecars,
        unless ``sidecars`` hands each shard's out: :class:`~shardkit.files.samples.SampleTable`)."""
        where = origin or Path(MANIFEST_NAME)
        if not isinstance(d, dict) or d.get("schema") != SCHEMA_ID:
            raise ShardFormatError("not a shardkit manifest", path=where,
                                   fix="point at a folder written by shardkit convert")
        version = d.get("manifest_version")
        if not _is_int(version) or version not in READ_VERSIONS:
            raise ShardFormatError(
                f"manifest version {version!r} is not supported (this shardkit reads versions "
                f"{', '.join(map(str, READ_VERSIONS))})",
                path=where,
                fix="re-convert with this shardkit version or upgrade shardkit",
            )
        try:
            tool = d.get("tool", {})
            if not isinstance(tool, dict) or not isinstance(tool.get("version", ""), str):
                raise TypeError("tool is not an object with a version string")
            if not isinstance(d["shards"], list):
                raise TypeError("shards is not a list")
            shards = tuple(ShardInfo.from_json(s) for s in d["shards"])
            if version == 1:
                if not isinstance(d["samples"], list) or any(s.samples is not None for s in shards):
                    raise TypeError("version 1: samples is not a list, or a shard names a sidecar")
                inline: list[Any] | None = d["samples"]
            else:
                if "samples" in d or any(s.samples is None for s in shards):
                    raise TypeError(f"version {version}: samples are inline, or a shard names no sidecar")
                inline = None
            published = strict_int(d["version"], "version") if version >= 3 else None
            if published is not None and not 1 <= published <= MAX_PUBLISH:
                raise ValueError(f"version {published} is not in 1..{MAX_PUBLISH}")
            parts = {key: dict(d[key]) for key in ("sample", "classes", "preprocessing", "source", "stats")}
            fields = {"format": str(d["format"]), "format_version": strict_int(d["format_version"], "format_version"),
                      "split": str(d["split"]), "num_samples": strict_int(d["num_samples"], "num_samples"),
                      "skipped": tuple(d.get("skipped", ())), "format_options": dict(d.get("format_options", {})),
                      "tool_version": tool.get("version", "")}
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ShardFormatError(f"manifest is malformed ({exc!r})", path=where,
                                   fix="re-convert this split") from None
        try:  # each part's own checks (what a reader sizes memory from), in the order a reader relies on them
            if fields["format"] not in names():
                raise ValueError(f"format {fields['format']!r} is not one of {', '.join(names())}")
            sample = SampleSpec.from_json(parts["sample"])
            manifest = cls(**fields, sample=sample, classes=ClassTable.from_manifest(parts["classes"],
                                                                                    sample.num_classes),
                           preprocessing=Preprocessing.from_json(parts["preprocessing"]),
                           source=Source.from_json(parts["source"]), shards=shards,
                           samples=SampleTable(shards, sample.num_classes, where.parent, inline,
                                               sample.size, sidecars=sidecars),
                           stats=SplitStats.from_json(parts["stats"], sample.image_channels),
                           manifest_version=version, version=published)
        except ValueError as exc:
            raise ShardFormatError(f"manifest {exc}", path=where,
                                   fix="re-convert this split; do not use manifests from untrusted sources") from None
        manifest.check_bounds(where)
        manifest.check_consistency(where)
        return manifest

    def check_bounds(self, where: Path) -> None:
        """Every number a reader sizes memory from, or indexes with, has the right type and a sane size (the sample,
        classes, source and stats check themselves as they are parsed)."""

        def bad(problem: str) -> ShardFormatError:
            return ShardFormatError(f"manifest {problem}", path=where,
                                    fix="re-convert this split; do not use manifests from untrusted sources")

        if self.format not in names():
            raise bad(f"format {self.format!r} is not one of {', '.join(names())}")
        if "codecs" in self.format_options:  # read by info, show and every reader: checked once, here
            from ..codecs.registry import ArrayCodecs

            try:
                ArrayCodecs.from_json(self.format_options["codecs"])
            except ValueError as exc:
                raise bad(f"format_options.codecs is invalid ({exc})") from None
        if self.manifest_version < IMAGES_MANIFEST_VERSION and not self.sample.legacy_image:
            raise bad(f"version {self.manifest_version} stores [H, W, 3] uint8 RGB images, not "
                      f"{self.sample.image_dtype!r} with {self.sample.image_channels} channels "
                      f"{self.sample.channel_kind!r}")
        inline = getattr(self.samples, "inline", self.samples)  # version 2 sidecars are checked when read
        for i, rec in enumerate(inline or ()):
            if not isinstance(rec, dict) or not isinstance(rec.get("key"), str):
                raise bad(f"sample record {i} is not an object with a key string")
            try:
                check_size(rec.get("height"), rec.get("width"), f"sample {i}")
            except ValueError as exc:
                raise bad(str(exc)) from None
        for shard in self.shards:
            if shard.num_samples < 0 or any(f.bytes < 0 for f in shard.all_files):
                raise bad(f"shard {shard.index} has a negative sample or byte count")

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
            for f in shard.all_files:
                safe_member(f.name, where)
        if expected != self.num_samples or len(self.samples) != self.num_samples:
            raise ShardFormatError(
                f"manifest counts disagree: {self.num_samples} samples, shards hold {expected}, "
                f"{len(self.samples)} sample records",
                path=where,
                fix="re-convert this split",
            )


def manifest_version_for(spec: Any, provenance: bool = False) -> int:
    """The manifest version a split is written in: :data:`MANIFEST_VERSION` for (H, W, 3) uint8 RGB images and
    plain sidecars, else :data:`IMAGES_MANIFEST_VERSION` (other images, or ``provenance`` columns)."""
    return MANIFEST_VERSION if spec.legacy_image and not provenance else IMAGES_MANIFEST_VERSION


def parse_cost(raw: bytes) -> int:
    """An upper estimate of the memory ``json.loads(raw)`` takes, from counts of its structural bytes (a C
    scan, no parse): the text itself, each object or array, each string, each value after a comma or colon.
    Calibrated with ``tracemalloc`` on the costliest shapes (empty and nested containers, distinct keys,
    floats, short and escaped strings): 1.1 to 2.2 times the measured peak, never below it."""
    containers = raw.count(b"{") + raw.count(b"[")
    return 2 * len(raw) + 96 * containers + 48 * raw.count(b",") + 40 * raw.count(b'"') + 24 * raw.count(b":")


def version_name(number: int) -> str:
    """The file name of a split's kept publish ``number``: ``manifest-v<N>.json``."""
    return f"manifest-v{int(number)}.json"


def version_number(name: str) -> int | None:
    """``manifest-v7.json`` → 7; None for any other name."""
    m = _VERSION_NAME.match(name)
    return int(m.group(1)) if m else None


def kept_versions(names: Iterable[str]) -> list[int]:
    """The publish numbers among file ``names`` (a split folder's listing), ascending."""
    return sorted(n for n in map(version_number, names) if n is not None)


def named_files(data: Any) -> set[str]:
    """Every file name a parsed manifest (JSON) names, sidecars included; empty for anything malformed.

    Used to decide what must be kept for a kept version: a manifest shardkit wrote itself, read without the
    full validation (a damaged one names nothing, so nothing is kept for it)."""
    names: set[str] = set()
    try:
        for shard in data["shards"]:
            for f in [*shard["files"], *([shard["samples"]] if "samples" in shard else [])]:
                if isinstance(f.get("name"), str):
                    names.add(f["name"])
    except (KeyError, TypeError, AttributeError):
        return set()
    return names


def parse_manifest_bytes(raw: bytes, path: str | Path) -> Any:
    """The parsed JSON of a manifest's bytes (``path`` names it in errors): a ShardFormatError when it is longer
    than :data:`MAX_MANIFEST_BYTES`, when its parse would take more than :data:`MAX_PARSE_BYTES`
    (:func:`parse_cost`, checked before parsing), or when it is not JSON."""
    if len(raw) > MAX_MANIFEST_BYTES or parse_cost(raw) > MAX_PARSE_BYTES:
        raise ShardFormatError(
            f"manifest ({len(raw)} bytes) would take more than {MAX_PARSE_BYTES >> 20} MiB to parse "
            "(a shardkit manifest names shards, not samples)", path=path,
            fix="re-convert this split; do not use manifests from untrusted sources")
    try:
        return loads_bounded(raw, "its text")
    except ValueError as exc:  # not UTF-8, not JSON, nested deeper than any manifest
        raise ShardFormatError(f"manifest cannot be read ({exc})", path=path,
                               fix="re-convert this split; do not use manifests from untrusted sources") from None


#: The fix for a manifest name that is not a regular file (a FIFO, a folder): nothing shardkit wrote.
_NOT_REGULAR_FIX = "remove it (shardkit writes manifests as regular files only) or re-convert this split"


def read_manifest_json(path: Path) -> Any:
    """The parsed JSON of the manifest file ``path`` (``manifest.json`` or a kept ``manifest-v<N>.json``): its real
    path must lie inside its folder, and it is read and parsed within the bounds of :func:`parse_manifest_bytes`
    (a file over :data:`MAX_MANIFEST_BYTES` is refused unread)."""
    member_path(path.name, path.parent)  # a manifest.json symlinked to outside the folder is refused
    try:
        raw = read_guarded(path, "manifest", limit=MAX_MANIFEST_BYTES)  # a FIFO or folder: refused, never opened
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise ShardFormatError(f"{exc.strerror} (more than the limit a shardkit manifest may have)", path=path,
                                   fix="re-convert this split; do not use manifests from untrusted sources") from None
        raise ShardFormatError(f"manifest cannot be read ({exc.strerror or exc})", path=path,
                               fix=_NOT_REGULAR_FIX if exc.errno == errno.EINVAL else "re-convert this split") from None
    return parse_manifest_bytes(raw, path)


def requested_version(version: int | None) -> int | None:
    """``version`` as a reader asked for it: None (the current one) or a publish number; anything else is a
    ConfigError."""
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                or not 1 <= version <= MAX_PUBLISH):
        raise ConfigError(f"version={version!r} is not a publish number (an integer from 1)",
                          fix="list the kept versions with: shardkit info SPLIT")
    return version


def checked_version(manifest: Manifest, path: Path, version: int | None) -> Manifest:
    """``manifest``, read from the file of kept ``version`` (``path``), when it says it is that version."""
    if version is not None and manifest.version not in (None, version):
        raise ShardFormatError(f"{path.name} says it is version {manifest.version}", path=path,
                               fix="re-convert this split; do not edit version files")
    return manifest


def manifest_from_bytes(raw: bytes, path: Path, *, sidecars: Sidecars | None = None) -> Manifest:
    """The checked manifest in ``raw`` (named ``path`` in errors), parsed once under the parse bounds
    (:func:`parse_manifest_bytes`)."""
    return Manifest.from_json(parse_manifest_bytes(raw, path), origin=path, sidecars=sidecars)


def load_manifest(directory: Path, version: int | None = None, *, sidecars: Sidecars | None = None) -> Manifest:
    """Read and validate ``directory/manifest.json`` (a split folder), or the kept publish ``version``
    (``manifest-v<N>.json``) of it.

    The manifest must be a regular file whose real path lies inside the split folder, at most
    :data:`MAX_MANIFEST_BYTES` long and at most :data:`MAX_PARSE_BYTES` to parse (:func:`parse_cost`, checked
    before parsing): memory stays bounded and nothing outside the folder is read. Keys the spec does not
    name are ignored (formats/manifest.md), and count toward the parse cost like any other.
    """
    directory = Path(directory)
    path = directory / MANIFEST_NAME if directory.is_dir() else directory
    version = requested_version(version)
    if version is not None:
        path = path.parent / version_name(version)
        if path.exists() and not path.is_file():
            raise ShardFormatError(f"{path.name} is not a regular file, so version {version} cannot be read",
                                   path=path, fix=_NOT_REGULAR_FIX)
        if not path.is_file():
            kept = kept_versions(p.name for p in path.parent.iterdir()) if path.parent.is_dir() else []
            raise InputNotFoundError(
                f"version {version} of this split is not kept (kept: {', '.join(map(str, kept)) or 'none'})",
                path=path.parent, fix="open one of the kept versions, or the current one without version=")
    if path.exists() and not path.is_file():
        raise ShardFormatError(f"{path.name} is not a regular file", path=path, fix=_NOT_REGULAR_FIX)
    if not path.is_file():
        raise InputNotFoundError(
            "no manifest.json here",
            path=directory,
            fix="point at a split folder written by shardkit convert (e.g. out/train)",
        )
    return checked_version(Manifest.from_json(read_manifest_json(path), origin=path, sidecars=sidecars), path, version)


def inline_manifest(manifest: Manifest) -> Manifest:
    """``manifest`` as manifest version 1: every record inline, ``source.fingerprint`` as version 1 computes it.

    For readers that only know version 1, and for benchmarks and golden examples of it; the sidecars are
    then files the manifest does not name.
    """
    records = list(manifest.samples)
    table = SampleTable(manifest.shards, manifest.samples.num_classes, manifest.samples.directory, records)
    shards = tuple(replace(s, samples=None) for s in manifest.shards)
    return replace(manifest, shards=shards, samples=table, manifest_version=1,
                   source=replace(manifest.source, fingerprint=table.fingerprint()))
