"""The frozen description of one conversion: every option the CLI (or a caller) chose.

A :class:`ConvertConfig` is built once, validated once, and handed unchanged to
discovery, planning and the workers. Its :meth:`ConvertConfig.preprocessing` dict
is what the manifest records and what sample fingerprints hash.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import encoding
from .errors import ConfigError
from .publish import DEFAULT_KEEP_VERSIONS

if TYPE_CHECKING:
    from .labels.values import ValueMap

DEFAULT_SHARD_SAMPLES = 500
#: Largest image or label (height x width), checked from the file header before any decoder runs. 2^24
#: (4096 x 4096): one worker converting a sample at the limit peaks at 0.5 GB RSS (a colour-mask label, the
#: costliest kind; TFRecord 0.68 GB with TensorFlow loaded), under ~1 GB per worker at default settings
#: (scripts/max_pixels_memory.py; README "Memory"). 2^28 cost 3.4 GB per worker for one 16384^2 PNG.
DEFAULT_MAX_PIXELS = 2**24

_SIZE_RE = re.compile(r"^\s*(\d+)\s*[xX×,]\s*(\d+)\s*$")
_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?)[bB]\s*$")
_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
#: Largest --shard-size: more samples or bytes than any shard can hold (and than int64 counts).
MAX_SHARD_SAMPLES = 2**31 - 1
MAX_SHARD_BYTES = 2**62


def parse_size(text: str | None) -> tuple[int, int] | None:
    """Parse ``"352x480"`` (height x width) into ``(352, 480)``; ``None`` stays ``None``."""
    if text is None or text == "":
        return None
    m = _SIZE_RE.match(text)
    if not m or int(m.group(1)) <= 0 or int(m.group(2)) <= 0:
        raise ConfigError(f"--size {text!r} is not HEIGHTxWIDTH", fix="write it like --size 352x480")
    return int(m.group(1)), int(m.group(2))


def parse_bytes(text: str, what: str = "size", example: str = "20GB") -> int:
    """``"256MB"`` → 256000000, ``"1GiB"`` → 1073741824: a positive byte count (``what`` names it in errors)."""
    m = _BYTES_RE.match(text)
    if not m:
        raise ConfigError(f"{what} {text!r} is not a byte size", fix=f"write it like {example}")
    unit = _UNITS[m.group(2).lower()]
    if m.group(3):
        unit = {1: 1, 1000: 1024, 1000**2: 1024**2, 1000**3: 1024**3, 1000**4: 1024**4}[unit]
    amount = float(m.group(1)) * unit
    if not amount <= MAX_SHARD_BYTES:  # also inf (hundreds of digits) and nan
        raise ConfigError(f"{what} {text!r} is too large (at most {MAX_SHARD_BYTES} bytes)",
                          fix=f"use e.g. {example}")
    nbytes = int(amount)
    if nbytes <= 0:
        raise ConfigError(f"{what} {text!r} must be positive")
    return nbytes


def parse_split_lists(value: Any) -> tuple[tuple[str, Path], ...]:
    """``--split-list`` values (``"train=lists/train.txt"`` strings, (split, path) pairs, or a {split: path}
    mapping) as (split, Path) pairs in the order given; a bad or repeated split is a ConfigError."""
    items = list(value.items()) if isinstance(value, dict) else [value] if isinstance(value, str) else list(value)
    out: list[tuple[str, Path]] = []
    for item in items:
        if isinstance(item, str):
            split, sep, path = item.partition("=")
            if not sep:
                raise ConfigError(f"--split-list {item!r} is not SPLIT=PATH", fix="write it like train=lists/train.txt")
        else:
            split, path = item
        split, text = str(split).strip(), str(path).strip()
        if not split or not text or "/" in split or "\\" in split or split in (".", ".."):
            raise ConfigError(f"--split-list {split}={text}: the split must be a plain name and the path not empty",
                              fix="write it like train=lists/train.txt")
        if split in (s for s, _ in out):
            raise ConfigError(f"--split-list names split {split!r} twice", fix="give each split one list file")
        out.append((split, Path(text).expanduser()))
    return tuple(out)


@dataclass(frozen=True)
class ShardSize:
    """A shard limit: a number of samples, or a number of bytes of stored sample data."""

    samples: int | None = None
    nbytes: int | None = None

    @classmethod
    def parse(cls, text: str | int) -> ShardSize:
        """``500`` → 500 samples; ``"256MB"``/``"1GiB"`` → bytes."""
        if isinstance(text, int):
            value = text
        else:
            s = text.strip()
            if s.isdigit():
                value = int(s)
            else:
                return cls(nbytes=parse_bytes(s, "--shard-size", "500 (samples) or 256MB"))
        if value <= 0:
            raise ConfigError(f"--shard-size {text!r} must be positive")
        if value > MAX_SHARD_SAMPLES:
            raise ConfigError(f"--shard-size {text!r} is too large (at most {MAX_SHARD_SAMPLES} samples)",
                              fix="use e.g. --shard-size 500")
        return cls(samples=value)


@dataclass(frozen=True)
class ConvertConfig:
    """Every option of ``shardkit convert``. Frozen: built once by the CLI, read everywhere."""

    input: Path
    output: Path
    format: str = "npy"
    size: tuple[int, int] | None = None
    resize: str = "none"
    crop: str = "center"
    label_encoding: str = "index"
    label_suffix: str | None = None
    layout: str = "auto"
    class_dict: Path | None = None
    palette: Path | None = None
    num_classes: int | None = None
    ignore_index: int | None = None
    colour_tolerance: int = 0
    unknown_as: int | None = None
    cityscapes_train_ids: bool = True
    # label values (shardkit.labels.values): at most one of the three
    label_map: str | None = None  # "255:1,0:0" / "128-255:1", or a file of such entries
    reduce_zero_label: bool = False
    threshold: int | None = None
    splits: tuple[str, ...] = ()
    shard_size: ShardSize = field(default_factory=lambda: ShardSize(samples=DEFAULT_SHARD_SAMPLES))
    compression: str = "none"
    #: per-array codecs (``shardkit.codecs``): "raw", "zstd", "zstd:9", "lz4", "png", "jpeg:95"
    image_codec: str = "raw"
    label_codec: str = "raw"
    workers: int = 0
    backend: str = "local"
    scheduler: str | None = None
    on_error: str = "fail"
    #: identical images (by decoded pixels) within or across splits: "warn" (log them), "error" (exit 4, no
    #: manifest written) or "skip" (keep the first copy in plan order, leave the others out)
    on_duplicate: str = "warn"
    strict: bool = False
    dry_run: bool = False
    force: bool = False
    rehash: bool = False
    #: publishes of each split kept for readers that opened them (``--keep-versions``; formats/manifest.md)
    keep_versions: int = DEFAULT_KEEP_VERSIONS
    quiet: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS
    # -- layout, pairing and classes (shardkit.layouts, labels/policy.py)
    #: explicit pairing templates, relative to ``input``: ``"img/{split}/{name}.tif"`` (both or neither)
    images: str | None = None
    labels: str | None = None
    #: (split, list file) pairs from ``--split-list SPLIT=PATH``: the files may live anywhere
    split_lists: tuple[tuple[str, Path], ...] = ()
    #: a class list (names, optionally ids and colours; JSON, CSV or text) from ``--classes FILE``
    classes: Path | None = None
    # -- image type and bands (shardkit.imagetypes): images are stored as decoded unless these ask otherwise
    image_dtype: str | None = None  # --image-dtype uint8|uint16|int16|float32
    rescale: str | None = None  # --rescale shift|minmax|percentile:P
    bands: tuple[int, ...] = ()  # --bands 4,3,2 (1-based)
    pages_as_bands: bool = False  # --pages-as-bands: a multi-page TIFF's pages are its bands

    #: fsspec URLs (``s3://bucket/x``) when the input / output is on object storage; ``input``/``output``
    #: then only echo them. Set from ``input``/``output`` themselves; ``file://`` becomes a local path.
    input_url: str | None = None
    output_url: str | None = None
    #: fsspec storage options (endpoint, credentials, profile …) for the URLs; the environment completes them.
    storage_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from .storage import is_url, local_path, normalize_url

        for name in ("input", "output"):
            value = getattr(self, name)
            if is_url(value):
                url = normalize_url(value)
                path = local_path(url)
                object.__setattr__(self, name, path if path is not None else Path(url))
                object.__setattr__(self, f"{name}_url", None if path is not None else url)
        object.__setattr__(self, "input", Path(self.input))
        object.__setattr__(self, "output", Path(self.output))
        self._normalise()
        from .codecs import ArrayCodecs
        from .formats.registry import get, names

        self._check_choice("format", self.format, names())
        self._check_choice("resize", self.resize, ("none", "exact", "shorter"))
        self._check_choice("crop", self.crop, ("center", "none"))
        self._check_choice("label_encoding", self.label_encoding, encoding.NAMES)
        self._check_choice("on_error", self.on_error, ("fail", "skip"))
        self._check_choice("on_duplicate", self.on_duplicate, ("warn", "error", "skip"))  # duplicates.ON_DUPLICATE
        self._check_choice("backend", self.backend, ("local", "dask"))
        if self.scheduler and self.backend != "dask":
            raise ConfigError("--scheduler needs --backend dask")
        if self.resize != "none" and self.size is None:
            raise ConfigError(f"--resize {self.resize} needs a target", fix="add --size HxW")
        if not 0 <= self.colour_tolerance <= 255:
            raise ConfigError("--colour-tolerance must be between 0 and 255")
        if self.class_dict is not None and self.palette is not None:
            raise ConfigError("--class-dict and --palette both given", fix="pass only one colour table")
        if self.max_pixels < 1:
            raise ConfigError(f"--max-pixels {self.max_pixels} must be at least 1")
        if self.size is not None and self.size[0] * self.size[1] > self.max_pixels:
            h, w = self.size
            raise ConfigError(f"--size {h}x{w} is {h * w} pixels, more than --max-pixels {self.max_pixels}",
                              fix="choose a smaller --size or raise --max-pixels")
        if self.workers < 0:
            raise ConfigError("--workers must be >= 0 (0 = all cores)")
        keep = self.keep_versions
        if isinstance(keep, str) and keep.strip().isdigit():
            keep = int(keep.strip())
            object.__setattr__(self, "keep_versions", keep)
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ConfigError(f"--keep-versions {keep!r} must be an integer of at least 1 (1 keeps only the current "
                              "version)")
        if self.label_map is not None and not isinstance(self.label_map, str):
            raise ConfigError(f"label_map {self.label_map!r} is not SRC:ID entries or a file path",
                              fix="write it like label_map = \"255:1,0:0\"")
        object.__setattr__(self, "bands", self.image_options.bands)  # "4,3,2" → (4, 3, 2), checked
        _ = self.value_map  # parsed once here, so a bad --label-map / --threshold is a usage error up front
        codecs = ArrayCodecs.parse(self.image_codec, self.label_codec)
        object.__setattr__(self, "image_codec", str(codecs.image))  # one spelling: "zstd:3" → "zstd"
        object.__setattr__(self, "label_codec", str(codecs.label))
        get(self.format).check_options(self.compression, codecs)  # the format says what it takes

    def _normalise(self) -> None:
        """Accept the CLI's spellings from Python callers: ``size="352x480"``, ``shard_size="256MB"``,
        ``splits="train,val"``, paths as strings, ints as strings; anything else wrong is a ConfigError."""
        size: Any = self.size
        if isinstance(size, str):
            size = parse_size(size)
        elif size is not None:
            try:
                h, w = (int(v) for v in size)
                ok = (h, w) == tuple(size) and h > 0 and w > 0
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ConfigError(f"size {size!r} is not (height, width) or 'HxW'", fix="write it like size='352x480'")
            size = (h, w)
        object.__setattr__(self, "size", size)
        if isinstance(self.shard_size, bool) or not isinstance(self.shard_size, (ShardSize, int, str)):
            raise ConfigError(f"shard_size {self.shard_size!r} is not a sample count or a byte size like '256MB'")
        if not isinstance(self.shard_size, ShardSize):
            object.__setattr__(self, "shard_size", ShardSize.parse(self.shard_size))
        if isinstance(self.splits, str):
            object.__setattr__(self, "splits", tuple(s.strip() for s in self.splits.split(",") if s.strip()))
        else:
            object.__setattr__(self, "splits", tuple(self.splits))
        object.__setattr__(self, "split_lists", parse_split_lists(self.split_lists))
        for name in ("class_dict", "palette", "classes"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        for name in ("num_classes", "ignore_index", "unknown_as", "colour_tolerance", "workers", "max_pixels",
                     "threshold"):
            value = getattr(self, name)
            if value is None or (isinstance(value, int) and not isinstance(value, bool)):
                continue
            try:
                object.__setattr__(self, name, int(str(value)))
            except ValueError:
                raise ConfigError(f"{name}={value!r} is not an integer") from None

    @staticmethod
    def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
        if value not in choices:
            raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}")

    def effective_workers(self) -> int:
        """``workers`` with 0 meaning every core this process may use."""
        if self.workers:
            return self.workers
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # pragma: no cover - non-Linux
            return max(1, os.cpu_count() or 1)

    @property
    def value_map(self) -> ValueMap:
        """The label value map of ``label_map`` / ``reduce_zero_label`` / ``threshold`` (checked on init)."""
        from .labels.values import ValueMap  # the labels package loads OpenCV: not for every CLI command

        return ValueMap.from_options(self.label_map, self.reduce_zero_label, self.threshold)

    @property
    def image_options(self) -> Any:
        """The :class:`~shardkit.imagetypes.ImageOptions` of image_dtype, rescale, bands and pages_as_bands."""
        from .imagetypes import ImageOptions

        return ImageOptions(self.image_dtype, self.rescale, self.bands, self.pages_as_bands)

    @property
    def codecs(self) -> Any:
        """The :class:`~shardkit.codecs.ArrayCodecs` of ``image_codec``/``label_codec`` (checked on init)."""
        from .codecs import ArrayCodecs

        return ArrayCodecs.parse(self.image_codec, self.label_codec)

    def preprocessing(self) -> dict[str, Any]:
        """The options that change stored bytes: recorded in the manifest and hashed into fingerprints.

        The codecs appear only when one is not raw, so raw datasets keep their version 1 manifests and
        fingerprints byte for byte.
        """
        codecs = {} if self.codecs.raw else {"image_codec": self.image_codec, "label_codec": self.label_codec}
        return {**codecs,
            "size": list(self.size) if self.size else None,
            "resize": self.resize,
            "crop": self.crop,
            "label_encoding": self.label_encoding,
            "ignore_index": self.ignore_index,
            "colour_tolerance": self.colour_tolerance,
            "unknown_as": self.unknown_as,
            "cityscapes_train_ids": self.cityscapes_train_ids,
            "compression": self.compression,
            "image_interpolation": "area-down-linear-up",
            "label_interpolation": "nearest",
            **self.value_map.to_json(),  # the label map's contents (not its file name); nothing when none
            **self.image_options.to_json(),  # bands / type asked for; nothing when none (images as decoded)
        }

    def replace(self, **changes: Any) -> ConvertConfig:
        return dataclasses.replace(self, **changes)
