"""The frozen description of one conversion: every option the CLI (or a caller) chose, declared once.

A :class:`ConvertConfig` is built once, validated once, and handed unchanged to
discovery, planning and the workers. Its :meth:`ConvertConfig.preprocessing` dict
is what the manifest records and what sample fingerprints hash.

**Every convert option is declared once, here**, as a field of :class:`ConvertConfig` made with
:func:`option`: its name, type and default are the field's; its group (``geometry``, ``labels``,
``output``, ``run``), help, flags, choices and value range are its :class:`OptionSpec`. From that one
declaration the CLI (:mod:`shardkit.cli`) generates the ``shardkit convert`` click option (under its group's
heading in ``--help``), its ``--config`` TOML key and its ``SHARDKIT_<FLAG>`` variable, and
:class:`ConvertConfig` checks its choices. To add an option, add one field, e.g.::

    #: what the option does (for the reader of this class)
    rescale: str = option("none", group="geometry", choices=("none", "minmax"),
                          help="How pixel values are rescaled before they are stored.")

then use ``cfg.rescale`` where it matters (and, if a worker needs it, give
:class:`~shardkit.conversion.worker.WorkerContext`
a field of the same name: :meth:`~shardkit.conversion.worker.WorkerContext.from_config` copies it). If it changes stored
bytes, add it to :meth:`ConvertConfig.preprocessing`. Nothing else: no click decorator, no signature, no
keyword list. Values from the CLI arrive as the CLI spells them (``"352x480"``, ``"256MB"``, ``"key=value"``
strings); :meth:`ConvertConfig._normalise` turns them into the field's type, so Python callers may use either.

This module imports nothing heavy (no numpy, no format or codec module): ``shardkit --help`` imports it.
Choices and help texts that come from the formats or layouts are callables, evaluated only when asked for.
"""

# option() returns a dataclasses.field() with the option's spec as metadata (RUF009 takes it for a default value):
# ruff: noqa: RUF009
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..support.limits import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_TILE_RATIO,
    DEFAULT_MAX_VOXELS,
    MAX_PIXELS,
    MAX_SHARD_BYTES,
    MAX_SHARD_SAMPLES,
    MAX_SIDE,
)

if TYPE_CHECKING:
    from ..images.tiles import Tiling
    from ..labels.values import ValueMap

#: The help groups of ``shardkit convert``, in the order ``--help`` shows them, with their headings.
GROUPS = {"geometry": "Geometry", "labels": "Input and label", "output": "Output",
          "run": "Run"}


@dataclass(frozen=True)
class OptionSpec:
    """How one :class:`ConvertConfig` field is offered as a ``shardkit convert`` option (see the module notes)."""

    group: str
    #: the help text, or a callable that builds it on demand (from the formats' facts, say)
    help: str | Callable[[], str]
    #: the flags, e.g. ("--colour-tolerance", "--color-tolerance"); default: ``--`` + the field name with dashes
    flags: tuple[str, ...] = ()
    #: a boolean's "off" flag (``--cityscapes-label-ids``); without it a boolean is an on-only flag
    off_flag: str | None = None
    #: the click parameter's name when it is not the field's (it also names the ``SHARDKIT_*`` variable)
    param: str | None = None
    #: the allowed values, or a callable giving them (looked up only when needed)
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None
    #: whether :class:`ConvertConfig` refuses a value outside ``choices`` (the CLI always does)
    checked: bool = True
    #: an integer option's inclusive bounds (None: unbounded)
    range: tuple[int | None, int | None] | None = None
    #: the value names an existing file
    file: bool = False
    #: repeatable (the field holds the values given, in order)
    multiple: bool = False
    metavar: str | None = None

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"option group {self.group!r} is not one of {', '.join(GROUPS)}")

    def choice_list(self) -> tuple[str, ...]:
        """The allowed values (empty: any)."""
        found = self.choices() if callable(self.choices) else self.choices
        return tuple(found or ())

    def help_text(self) -> str:
        return self.help() if callable(self.help) else self.help


def option(default: Any = dataclasses.MISSING, *, factory: Callable[[], Any] | None = None, **spec: Any) -> Any:
    """A :class:`ConvertConfig` field that is also a ``shardkit convert`` option: ``spec`` is its
    :class:`OptionSpec` (group, help, flags, choices …)."""
    meta = {"cli": OptionSpec(**spec)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def cli_options() -> list[tuple[dataclasses.Field[Any], OptionSpec]]:
    """Every field of :class:`ConvertConfig` that is a command-line option, with its spec, in declaration order."""
    return [(f, f.metadata["cli"]) for f in dataclasses.fields(ConvertConfig) if "cli" in f.metadata]


def _format_names() -> tuple[str, ...]:
    from ..formats.registry import names  # the formats' modules load h5py, lmdb …: only when asked

    return names()


def _compressions() -> list[str]:
    """Every ``--compression`` value some format takes (the format then checks its own)."""
    from ..formats.registry import all_formats

    return list(dict.fromkeys(c for fmt in all_formats() for c in fmt.compressions))


def _takes(fact: str) -> str:
    """Which format takes which values of one option, from the formats' own facts: 'lmdb: raw, zstd; …'."""
    from ..formats.registry import all_formats

    parts = [f"{fmt.name}: {', '.join(v for v in getattr(fmt, fact) if v not in ('none', 'raw'))}"
             for fmt in all_formats() if len(getattr(fmt, fact)) > 1]
    return "; ".join(parts) or "none"


def _encodings() -> tuple[str, ...]:
    from ..codecs.encoding import NAMES  # numpy: not for ``shardkit --help``

    return NAMES


def _layouts() -> tuple[str, ...]:
    from .layouts.registry import names  # the layouts bring the label decoders (OpenCV)

    return ("auto", *names(auto_only=True))


DEFAULT_SHARD_SAMPLES = 500
#: Publishes of a split kept by default (``convert --keep-versions``): the current one and the two before
#: it, so a reader that opened a split survives two more publishes even where it could not take a lease
#: (a read-only folder, object storage), e.g. a two-day training job under a nightly convert.
DEFAULT_KEEP_VERSIONS = 3

_SIZE_RE = re.compile(r"^\s*(\d+)\s*[xX×,]\s*(\d+)\s*$")
_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?)[bB]\s*$")
_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


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

    def __str__(self) -> str:
        """As ``--shard-size`` takes it: ``500`` or ``256000000B``."""
        return str(self.samples) if self.samples is not None else f"{self.nbytes}B"

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
    """Every option of ``shardkit convert``. Frozen: built once by the CLI, read everywhere.

    ``ConvertConfig(Path("raw"), Path("out"), size="352x480", format="lmdb")``: ``input`` and ``output`` are
    required; every other field is a command-line option of the same name (``--size``; the API reference lists
    them all), given as a value or as the CLI spells it. A bad value is a ``ConfigError``."""

    input: Path
    output: Path
    format: str = option("npy", group="output", choices=_format_names, help="Shard format.")
    size: tuple[int, int] | None = option(
        None, group="geometry", metavar="HxW", help="Target size, e.g. 352x480 (height x width).")
    resize: str = option(
        "none", group="geometry", choices=("none", "exact", "shorter"),
        help="none: no scaling; exact: scale to --size; shorter: scale keeping aspect so --size is covered.")
    crop: str = option(
        "center", group="geometry", choices=("center", "none"),
        help="center: crop or pad to --size (TF resize_image_with_crop_or_pad); none: shape set by --resize only.")
    label_encoding: str = option(
        "index", group="output", choices=_encodings,
        help="Stored labels: class ids, one-hot uint8, or bit-packed one-hot.")
    label_suffix: str | None = option(
        None, group="labels", help="Label file name = image stem + this suffix (e.g. _L, _mask).")
    layout: str = option("auto", group="labels", choices=_layouts, checked=False,  # the layout registry checks it
                         help="Input layout (docs/layouts.md); auto tries each in turn.")
    class_dict: Path | None = option(
        None, group="labels", file=True, help="class_dict.csv (name,r,g,b) if not at the input root.")
    palette: Path | None = option(
        None, group="labels", file=True, help="Colour table file (CSV, JSON or 'r g b name' lines) for colour masks.")
    num_classes: int | None = option(
        None, group="labels", range=(1, 65535),
        help="Number of classes of id labels (names class_0 …); without it, --classes or a table the layout "
             "identifies, the ids found in the label files are used.")
    ignore_index: int | None = option(
        None, group="labels", range=(0, 65535), help="Stored id meaning 'ignore' (e.g. 255).")
    colour_tolerance: int = option(
        0, group="labels", flags=("--colour-tolerance", "--color-tolerance"), range=(0, 255),
        help="Map colours within N per channel to their nearest class colour.")
    unknown_as: int | None = option(
        None, group="labels", range=(0, 65535), help="Map unknown colours / out-of-range ids to this id.")
    cityscapes_train_ids: bool = option(
        True, group="labels", off_flag="--cityscapes-label-ids",
        help="Cityscapes: apply the official labelId→trainId mapping.")
    # label values (shardkit.labels.values): at most one of the three
    #: "255:1,0:0" / "128-255:1", or a file of such entries
    label_map: str | None = option(
        None, group="labels", metavar="SRC:ID,…|FILE",
        help="Map raw label values to class ids, e.g. 255:1,0:0 for 0/255 masks (ranges: 128-255:1), or a "
             "file of SRC:ID lines / a JSON object; values it does not name are kept.")
    reduce_zero_label: bool = option(
        False, group="labels",
        help="mmsegmentation's rule (ADE20K, LoveDA): 0 becomes the ignore id (255 unless --ignore-index), "
             "every other value v becomes v-1.")
    threshold: int | None = option(
        None, group="labels", range=(0, 65534), metavar="T",
        help="Binary masks (JPEG ones too): value > T is class 1, else 0 (e.g. --threshold 127); refused on "
             "labels with more than two classes.")
    #: a pattern on each sample's key naming its group (shardkit.store.groups; docs/split.md), recorded in the
    #: manifest for ``shardkit split`` / ``audit`` / ``info``
    group_by: str | None = option(
        None, group="labels", metavar="REGEX",
        help="Record each sample's group: this pattern's first group in its key, e.g. '(\\w+?)_' for CamVid's "
             "sequences (every key must match); shardkit split, audit and info then keep groups whole.")
    # annotation sources (shardkit.labels.sources; docs/annotations.md): labels drawn from shapes in a file
    annotations: str | None = option(
        None, group="labels", metavar="SOURCE[:PATH]",
        help="Labels are shapes in annotation files: coco[:FILE.json] (COCO instances), coco-panoptic[:FILE.json], "
             "cvat[:annotations.xml] (CVAT for images 1.1), labelme[:FOLDER] or instance-masks[:FOLDER] "
             "(<id>/images + <id>/masks/*.png); found by themselves when no mask layout fits; none: never use them.")
    #: None: the source's own tool behaviour (named in the log of every run)
    object_overlap: str | None = option(
        None, group="labels", choices=("order", "z-order", "area", "ignore"),
        help="Annotation objects that overlap: order: file order, later on top; z-order: by z value; area: the "
             "smaller on top; ignore: pixels of objects of different classes become the ignore id. Default: the "
             "source tool's rule (COCO, labelme: order).")
    crowd: str | None = option(
        None, group="labels", choices=("ignore", "class", "drop"),
        help="COCO iscrowd objects: ignore: their pixels become the ignore id; class: painted with their class "
             "(default, as annToMask); drop: left out.")
    on_lost_object: str = option(
        "warn", group="labels", choices=("warn", "error"),
        help="Annotation objects left with no visible pixel (painted over or degenerate): warn: count and list "
             "them in the manifest; error: stop, naming them.")
    splits: tuple[str, ...] = option(
        (), group="run", flags=("--split",), multiple=True, help="Only convert this split (repeatable).")
    shard_size: ShardSize = option(
        factory=lambda: ShardSize(samples=DEFAULT_SHARD_SAMPLES), group="output",
        help="Samples per shard (500), or, given a byte size such as 256MB, bytes per shard instead.")
    compression: str = option(
        "none", group="output", choices=_compressions, checked=False,  # the format checks its own
        help=lambda: "Whole-shard compression: " + _takes("compressions") + ".")
    #: per-array codecs (``shardkit.codecs.registry``): "raw", "zstd", "zstd:9", "lz4", "png", "jpeg:95"
    image_codec: str = option(
        "raw", group="output", metavar="CODEC",
        help=lambda: "Per-image codec (docs/codecs.md): " + _takes("image_codecs") + "; jpeg:Q is lossy (Q 1-100).")
    label_codec: str = option(
        "raw", group="output", metavar="CODEC",
        help=lambda: "Per-label codec, always lossless: " + _takes("label_codecs") + ".")
    workers: int = option(0, group="run", range=(0, None), help="Worker processes; 0 = all cores.")
    backend: str = option(
        "local", group="run", choices=("local", "dask"),
        help="local: a process pool on this machine; dask: the same shard tasks on a Dask cluster.")
    scheduler: str | None = option(
        None, group="run", metavar="ADDRESS", help="Dask scheduler, e.g. tcp://host:8786 (default: a local cluster).")
    on_error: str = option(
        "fail", group="run", choices=("fail", "skip"),
        help="fail: stop at the first bad input; skip: leave it out, list it in the manifest, exit 3.")
    #: identical images (by decoded pixels) within or across splits: "warn" (log them), "error" (exit 4, no
    #: manifest written) or "skip" (keep the first copy in plan order, leave the others out)
    on_duplicate: str = option(
        "warn", group="output", choices=("warn", "error", "skip"),  # duplicates.ON_DUPLICATE
        help="Identical images (same decoded pixels) within or across splits: warn: list them; error: exit 4 "
             "before writing a manifest; skip: keep the first copy (split order, then index), drop the rest.")
    strict: bool = option(
        False, group="labels", help="Images without labels (or labels without images) are an error.")
    dry_run: bool = option(False, group="run", help="Report what was found; write nothing.")
    force: bool = option(False, group="run", help="Rebuild every shard, even those an earlier run left intact.")
    rehash: bool = option(
        False, group="run",
        help="Trust no file's (size, mtime, ctime, inode): re-hash every source and shard file before reusing a "
             "shard (reads everything; catches what a stat cannot see, e.g. bit rot).")
    #: publishes of each split kept for readers that opened them (``--keep-versions``; formats/manifest.md)
    keep_versions: int = option(
        DEFAULT_KEEP_VERSIONS, group="output", range=(1, None),
        help="Publishes of each split kept (manifest-v<N>.json and their shards) for readers that opened them; "
             "older ones are removed unless a live reader holds a lease on them.")
    quiet: bool = option(False, group="run", flags=("-q", "--quiet"),
                         help="No progress bar, warnings and errors only.")
    max_pixels: int = option(
        DEFAULT_MAX_PIXELS, group="geometry", range=(1, None),
        help="Largest image or label (height x width, read from its header before any decoder runs); also caps "
             "--size. The default, 4096x4096, keeps one worker under ~1 GB (0.5 GB measured at the limit); raise "
             "it for larger images and expect ~30 bytes per pixel per worker.")
    # -- tiling (shardkit.images.tiles; docs/tiling.md): each source stored as a grid of tiles of ``tile`` (HxW)
    tile: tuple[int, int] | str | None = option(
        None, group="geometry", metavar="HxW",
        help="Store each source as a grid of HxW tiles (docs/tiling.md); the last row and column align to the "
             "image edge, sources smaller than a tile are padded.")
    #: tile starts' step (HxW; default: the tile), or ``overlap`` (stride = tile - overlap): not both
    stride: tuple[int, int] | str | None = option(
        None, group="geometry", metavar="HxW",
        help="Step between tile starts (default: the tile size); needs --tile. With --patch: DxHxW between 3-D "
             "patches.")
    overlap: tuple[int, int] | str | None = option(
        None, group="geometry", metavar="HxW",
        help="Overlap of neighbouring tiles (stride = tile - overlap); needs --tile.")
    #: drop a tile whose stored label is at least this share ignore index (0..1]; counted in the manifest
    drop_tiles_ignored: float | None = option(
        None, group="output", metavar="SHARE",
        help="Drop tiles whose label is at least SHARE ignore index, e.g. 0.95 (counted in the manifest).")
    #: most pixels a tiling may store per source pixel, estimated from each source's header before decoding
    max_tile_ratio: float | str = option(
        DEFAULT_MAX_TILE_RATIO, group="geometry", metavar="R",
        help="Refuse a tiling that would store more than R times a source's pixels (overlapping tiles; estimated "
             "from the headers before decoding). 16 allows a stride of a quarter tile; --stride 1 is refused.")
    # -- 3-D volumes (shardkit.conversion.volumes; docs/volumes.md): nnU-Net/MSD and per-case-folder trees
    slices: str | None = option(
        None, group="geometry", metavar="AXIS",
        help="3-D volumes (NIfTI, NRRD, DICOM series; docs/volumes.md): store 2-D slices along array axis i, j or "
             "k; auto (the default for a volume tree): the axis of largest spacing.")
    context: int = option(
        0, group="geometry", metavar="K",
        help="Volumes: add the K slices on each side of a slice as bands (2.5-D; edge slices repeated).")
    empty_slices: str = option(
        "keep", group="output", choices=("keep", "drop"),
        help="Volumes: keep or drop slices whose label is all background (id 0); counted in the manifest.")
    #: 3-D patches (D x H x W) instead of slices; ``--stride`` then takes D x H x W too
    patch: str | None = option(
        None, group="geometry", metavar="DxHxW",
        help="Volumes: store 3-D patches of D x H x W voxels (stride: --stride DxHxW, default the patch) instead "
             "of slices; a volume shorter than the patch is padded (labels with the ignore index).")
    modalities: str | None = option(
        None, group="labels", metavar="A,B,…",
        help="Volumes in per-case folders or --images templates with {modality}: the modality order as bands "
             "(default: name order).")
    spacing: str | None = option(
        None, group="geometry", metavar="X,Y,Z",
        help="Volumes: resample every case once to this voxel spacing along array axes i, j, k (header units, mm; "
             "MONAI Spacing's grid): images by --image-interp, stored float32; labels by --label-interp. Recorded "
             "per case.")
    image_interp: str = option(
        "linear", group="geometry", choices=("linear", "cubic"),
        help="Volumes with --spacing: images by linear interpolation, or cubic B-spline (MONAI mode=3, scipy "
             "order 3).")
    label_interp: str = option(
        "nearest", group="labels", choices=("nearest", "onehot-linear"),
        help="Volumes with --spacing: labels by nearest voxel, or each class's one-hot mask linear then argmax "
             "(nnU-Net's one-hot idea, argmax here; ties to the lower id).")
    max_voxels: int = option(
        DEFAULT_MAX_VOXELS, group="run", metavar="N", range=(1, None),
        help="Refuse a volume of more voxels, from its header before decoding (2^28: 512x512x1024).")
    # -- layout, pairing and classes (shardkit.conversion.layouts, labels/policy.py)
    #: explicit pairing templates, relative to ``input``: ``"img/{split}/{name}.tif"`` (both or neither)
    images: str | None = option(
        None, group="labels", metavar="TEMPLATE",
        help="Pair explicitly: image paths under INPUT_DIR, e.g. 'img/{split}/{name}.tif' ({split} optional, "
             "{name} the part image and label share; * ? ** globs). 3-D volumes: {case} (and {modality}) in place of "
             "{name}, e.g. '{case}/{case}_{modality}.nii.gz'; a match may be a DICOM series folder. Needs --labels.")
    labels: str | None = option(None, group="labels", metavar="TEMPLATE",
                                help="Label paths for --images, e.g. 'gt/{split}/{name}_mask.gif' (volumes: "
                                     "'{case}/{case}_seg.nii.gz').")
    #: (split, list file) pairs from ``--split-list SPLIT=PATH``: the files may live anywhere
    split_lists: tuple[tuple[str, Path], ...] = option(
        (), group="labels", flags=("--split-list",), param="split_list", multiple=True, metavar="SPLIT=FILE",
        help="A list file from anywhere for one split (repeatable): 'image label' lines, or one image name a "
             "line choosing among the pairs found.")
    #: a class list (names, optionally ids and colours; JSON, CSV or text) from ``--classes FILE``
    classes: Path | None = option(
        None, group="labels", file=True,
        help="Class list: names, optionally ids and colours (JSON, CSV with a name column, or text lines 'name', "
             "'id name', 'r g b name').")
    # -- image type and bands (shardkit.images.imagetypes; docs/images.md): images are stored as decoded unless asked
    image_dtype: str | None = option(
        None, group="geometry", choices=("uint8", "uint16", "int16", "float32"),
        help="Store images as this type (default: as decoded). Lossless widening needs nothing; anything else "
             "--rescale.")
    rescale: str | None = option(
        None, group="geometry", metavar="shift|minmax|percentile:P",
        help="How --image-dtype changes values: shift (drop low bits: uint16 >> 8), minmax or percentile:P "
             "(per image and band, clipped at the P and 100-P percentiles).")
    #: 1-based band numbers ("4,3,2" from the CLI; a tuple once checked)
    bands: tuple[int, ...] | str = option(
        "", group="geometry", metavar="N,N,…",
        help="Store only these bands of each image, in this order (1-based), e.g. 4,3,2.")
    pages_as_bands: bool = option(
        False, group="geometry", help="A multi-page TIFF's pages are the bands of one image.")

    #: fsspec URLs (``s3://bucket/x``) when the input / output is on object storage; ``input``/``output``
    #: then only echo them. Set from ``input``/``output`` themselves; ``file://`` becomes a local path.
    input_url: str | None = None
    output_url: str | None = None
    #: fsspec storage options (endpoint, credentials, profile …) for the URLs; the environment completes them.
    storage_options: dict[str, Any] = option(
        factory=dict, group="output", flags=("--storage-option",), param="storage_option", multiple=True,
        metavar="KEY=VALUE",
        help="fsspec option for s3:// (or any fsspec URL) input/output, e.g. endpoint_url=http://host:9000, "
             "profile=NAME, anon=true (repeatable; dots nest: client_kwargs.region_name=eu-west-1).")

    def __post_init__(self) -> None:
        from ..files.storage import is_url, local_path, normalize_url

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
        from ..codecs.registry import ArrayCodecs
        from ..formats.registry import get

        for f, spec in cli_options():  # each option's declared choices
            if spec.choices is not None and spec.checked and not (f.default is None and getattr(self, f.name) is None):
                self._check_choice(f.name, getattr(self, f.name), spec.choice_list())
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
        self._check_tiling()
        self._check_stored_size()
        if self.slices is not None or self.context or self.empty_slices != "keep" or self.patch is not None:
            _ = self.slicing  # a bad --slices / --context / --patch is a usage error up front
        _ = self.resampling  # and a bad --spacing
        for flag, value, default in (("--label-interp", self.label_interp, "nearest"),
                                     ("--image-interp", self.image_interp, "linear")):
            if self.spacing is None and value != default:
                raise ConfigError(f"{flag} {value} chooses how --spacing resamples, and no --spacing is given",
                                  fix=f"add --spacing X,Y,Z, or leave out {flag}")
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
        if self.group_by is not None:
            from ..store.groups import compile_group_pattern

            compile_group_pattern(str(self.group_by))
        if not isinstance(self.storage_options, dict):  # the CLI's KEY=VALUE strings
            from ..files.storage import parse_storage_options

            object.__setattr__(self, "storage_options", parse_storage_options(self.storage_options))
        for name in ("class_dict", "palette", "classes"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        for name in ("num_classes", "ignore_index", "unknown_as", "colour_tolerance", "workers", "max_pixels",
                     "threshold", "context", "max_voxels"):
            value = getattr(self, name)
            if value is None or (isinstance(value, int) and not isinstance(value, bool)):
                continue
            try:
                object.__setattr__(self, name, int(str(value)))
            except ValueError:
                raise ConfigError(f"{name}={value!r} is not an integer") from None

    def _check_stored_size(self) -> None:
        """Refuse what would store a sample larger than a reader allows (:data:`~shardkit.support.limits.MAX_SIDE` per
        side,
        :data:`~shardkit.support.limits.MAX_PIXELS`): a --size or --tile beyond them, or a --max-pixels beyond
        MAX_PIXELS where images are stored whole (neither --size nor --tile)."""
        for flag, hw in (("--size", self.size), ("--tile", self.tile)):
            if isinstance(hw, tuple) and (max(hw) > MAX_SIDE or hw[0] * hw[1] > MAX_PIXELS):
                raise ConfigError(f"{flag} {hw[0]}x{hw[1]} is larger than a stored sample may be (at most {MAX_SIDE} "
                                  f"per side and {MAX_PIXELS} pixels, what every reader allows)",
                                  fix=f"choose a smaller {flag}")
        if self.max_pixels > MAX_PIXELS and self.size is None and self.tile is None:
            raise ConfigError(f"--max-pixels {self.max_pixels} is more than the {MAX_PIXELS} pixels a stored sample "
                              "may have (what every reader allows), and images are stored whole",
                              fix=f"keep --max-pixels at most {MAX_PIXELS}, or add --tile HxW or --size HxW")
        try:
            ratio = float(self.max_tile_ratio)
        except (TypeError, ValueError):
            ratio = float("nan")
        if not 1.0 <= ratio < float("inf"):
            raise ConfigError(f"--max-tile-ratio {self.max_tile_ratio!r} is not a number of at least 1",
                              fix=f"write it like --max-tile-ratio {DEFAULT_MAX_TILE_RATIO:g}")
        object.__setattr__(self, "max_tile_ratio", ratio)

    def _check_tiling(self) -> None:
        """Normalise ``tile``/``stride`` (``overlap`` folded into ``stride``) and refuse what cannot be tiled."""
        if (self.tile, self.stride, self.overlap, self.drop_tiles_ignored) == (None, None, None, None):
            return
        if self.patch is not None and self.tile is None and self.overlap is None:  # --stride DxHxW of --patch
            return
        from ..images.tiles import Tiling  # numpy: not for ``shardkit --help`` (this module stays light)

        tiling = Tiling.from_options(self.tile, self.stride, self.overlap, self.drop_tiles_ignored)
        if tiling is None:
            return
        if self.size is not None or self.resize != "none":
            raise ConfigError("--tile cuts sources at their own resolution: --size/--resize do not combine with it",
                              fix="drop --size/--resize (or resize the sources first)")
        if self.on_duplicate != "warn" and tiling.drop_ignored is not None:
            raise ConfigError(f"--on-duplicate {self.on_duplicate} compares whole sources by their tiles, and "
                              "--drop-tiles-ignored leaves some tiles unstored", fix="drop one of the two (tiled "
                              "conversions with --drop-tiles-ignored skip the duplicate check)")
        if tiling.tile[0] * tiling.tile[1] > self.max_pixels:
            h, w = tiling.tile
            raise ConfigError(f"--tile {h}x{w} is {h * w} pixels, more than --max-pixels {self.max_pixels}",
                              fix="choose a smaller --tile or raise --max-pixels")
        object.__setattr__(self, "tile", tiling.tile)
        object.__setattr__(self, "stride", tiling.stride)
        object.__setattr__(self, "overlap", None)
        object.__setattr__(self, "drop_tiles_ignored", tiling.drop_ignored)

    @property
    def tiling(self) -> Tiling | None:
        """The :class:`~shardkit.images.tiles.Tiling` of ``tile``/``stride``/``drop_tiles_ignored``; None without a
        tile."""
        if self.tile is None:
            return None
        from ..images.tiles import Tiling  # numpy: only when tiling

        return Tiling.from_options(self.tile, self.stride, None, self.drop_tiles_ignored)

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
    def slicing(self) -> Any:
        """The volume slicing of ``--slices/--context/--empty-slices``
        (:class:`~shardkit.volumes.slices.Slicing`; a volume tree without ``--slices`` is sliced along the
        largest spacing), or with ``--patch`` the 3-D :class:`~shardkit.volumes.patches.Patching` (``--stride``,
        and ``--empty-slices`` for empty patches)."""
        from ..volumes.slices import Slicing, parse_axis

        if self.patch is not None:
            from ..volumes.patches import Patching

            if self.slices is not None or self.context:
                raise ConfigError("--patch stores 3-D patches; --slices and --context are for 2-D slices",
                                  fix="leave out --slices/--context, or --patch")
            stride = self.stride
            if isinstance(stride, tuple):
                stride = "x".join(map(str, stride))
            return Patching.parse(self.patch, stride, self.empty_slices)

        context = self.context
        if isinstance(context, str) and context.strip().isdigit():
            context = int(context)
        if isinstance(context, bool) or not isinstance(context, int):
            raise ConfigError(f"--context {context!r} is not a number of slices", fix="write it like --context 1")
        return Slicing(parse_axis(self.slices), context, self.empty_slices)

    @property
    def resampling(self) -> Any:
        """``--spacing/--label-interp`` (:class:`~shardkit.volumes.resample.Resampling`); None without --spacing."""
        if self.spacing is None:
            return None
        from ..volumes.resample import Resampling

        return Resampling.parse(self.spacing, self.label_interp, self.image_interp)

    def volume_flags(self) -> tuple[str, ...]:
        """The volume options given (not at their defaults), as flags: refused by a run whose input holds images."""
        return tuple(flag for flag, on in (
            ("--slices", self.slices is not None), ("--context", self.context != 0),
            ("--empty-slices", self.empty_slices != "keep"), ("--max-voxels", self.max_voxels != DEFAULT_MAX_VOXELS),
            ("--spacing", self.spacing is not None), ("--label-interp", self.label_interp != "nearest"),
            ("--image-interp", self.image_interp != "linear"), ("--patch", self.patch is not None))
            if on)

    @property
    def value_map(self) -> ValueMap:
        """The label value map of ``label_map`` / ``reduce_zero_label`` / ``threshold`` (checked on init)."""
        from ..labels.values import ValueMap  # the labels package loads OpenCV: not for every CLI command

        return ValueMap.from_options(self.label_map, self.reduce_zero_label, self.threshold)

    @property
    def image_options(self) -> Any:
        """The :class:`~shardkit.images.imagetypes.ImageOptions` of image_dtype, rescale, bands and pages_as_bands."""
        from ..images.imagetypes import ImageOptions, parse_bands

        return ImageOptions(self.image_dtype, self.rescale, parse_bands(self.bands), self.pages_as_bands)

    @property
    def codecs(self) -> Any:
        """The :class:`~shardkit.codecs.registry.ArrayCodecs` of ``image_codec``/``label_codec`` (checked on init)."""
        from ..codecs.registry import ArrayCodecs

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
            **(self.tiling.to_json() if self.tiling is not None else {}),  # nothing when not tiling
            **self.image_options.to_json(),  # bands / type asked for; nothing when none (images as decoded)
        }

    def replace(self, **changes: Any) -> ConvertConfig:
        return dataclasses.replace(self, **changes)
