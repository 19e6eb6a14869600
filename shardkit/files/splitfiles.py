"""The typed core under the manifest and the formats: what a sample is (:class:`SampleSpec`), a shard's file
records (:class:`ShardFile`, :class:`ShardInfo`), the class table (:class:`ClassTable`), a split's statistics
(:class:`SplitStats`), its source (:class:`Source`) and preprocessing; the safe names and regular files a split
folder may hold, the pixel bounds every stored size is checked against, and the temp-name and fsync rules of
writing into a split folder.

Each manifest part is a frozen dataclass whose ``from_json`` holds its checks (a ValueError naming the problem,
which the manifest turns into one line) and whose ``to_json`` writes it back unchanged.

Nothing here imports another shardkit module but the errors and the label encodings: the formats, the samples
sidecars, the labels and the manifest all build on it, so none of them needs another of them for these facts.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, TypeGuard

import numpy as np

from ..codecs import encoding
from ..codecs.encoding import LabelEncoding, id_dtype
from ..codecs.encoding import stored as stored_encoding
from ..errors import ConfigError, ShardFormatError, UnsafePathError
from ..support.limits import MAX_BANDS, MAX_CLASSES, MAX_PIXELS, MAX_SIDE

#: Marks a temporary name: ``.<final name>.tmp-<host>-<pid>-<random>``; anything hidden carrying it is
#: unfinished work of some run, and :func:`shardkit.store.publish.remove_temps` deletes it.
TMP_MARK = ".tmp-"


def is_temp_name(name: str) -> bool:
    """A temporary name (hidden, carrying :data:`TMP_MARK`): unfinished work of some run, never a finished file."""
    return name.startswith(".") and TMP_MARK in name


#: The temp names ``atomic_write_bytes`` gave before it used :data:`TMP_MARK` (a crash may have left some):
#: ``tempfile.mkstemp``'s ``.<final name>.<8 random characters>.tmp``.
_MKSTEMP_TEMP = re.compile(r"\.(?P<final>.+)\.[a-z0-9_]{8}\.tmp")


def mkstemp_temp_target(name: str) -> str | None:
    """The final name an older shardkit's ``.<final name>.<8 random characters>.tmp`` temp file was for; None for
    any other name. Only a caller that knows which final names shardkit writes may call such a file its own."""
    match = _MKSTEMP_TEMP.fullmatch(name)
    return match.group("final") if match else None


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
    if not isinstance(directory, Path):  # (a Path is not parsed again: opening a split calls this per file)
        directory = Path(directory)
    path = directory / safe_member(name, directory)
    if "/" not in name:  # one plain component: inside the folder unless it is a link (one lstat, not two
        try:  # realpath walks of every component: opening a split checks every shard file)
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                return path
        except OSError:  # missing or unreadable: the walk below, then the caller's stat, say what is wrong
            pass
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


# ------------------------------------------------------------------------------------ typed manifest records
#: Stored class-id dtypes (numpy strings, little-endian).
CLASS_ID_DTYPES = ("|u1", "<u2")
LABEL_ENCODINGS = encoding.NAMES
_MAX_LISTED = 5


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_size(h: Any, w: Any, what: str) -> None:
    """ValueError unless ``h`` x ``w`` is a size a reader may allocate for (both sides and the pixel count)."""
    if not (_is_int(h) and _is_int(w) and 1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE and h * w <= MAX_PIXELS):
        raise ValueError(f"{what} {h!r}x{w!r} is not two integers in 1..{MAX_SIDE} with at most {MAX_PIXELS} pixels")


class JsonView(Mapping[str, Any]):
    """Read-only dict access to a typed record's JSON form (``manifest.classes["ignore_index"]``): the manifest's
    parts were plain dicts before they were typed, and callers that index them keep working. New code reads the
    attributes. Each record's ``from_json`` checks what a reader sizes memory from, raising ValueError(problem)."""

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


#: Image element types a split may store (little-endian numpy dtype strings), format version 3.
IMAGE_DTYPES = ("|u1", "<u2", "<i2", "<f4")
#: What ``sample.image.channels`` says: ``RGB`` (three colour channels, the only value before format version 3),
#: or ``bands`` (1..N bands as the source stored them, in ``source_bands`` order).
IMAGE_CHANNEL_KINDS = ("RGB", "bands")


@dataclass(frozen=True, eq=True)
class SampleSpec(JsonView):
    """What one stored sample looks like (the manifest's ``sample``): an image (H, W, C) of ``image_dtype`` and an
    encoded label.

    Before format version 3 every image was (H, W, 3) uint8 RGB (the defaults); since, an image keeps the
    element type and bands it was decoded with (:data:`IMAGE_DTYPES`, 1..:data:`MAX_BANDS` bands).
    """

    size: tuple[int, int] | None
    label_encoding: str
    num_classes: int
    label_dtype: str  # numpy dtype string, little-endian: "|u1" or "<u2"
    image_dtype: str = "|u1"
    image_channels: int = 3
    channel_kind: str = "RGB"
    #: 3-D samples (volume patches): D, each stored as its (D * H, W, C) image and (D * H, W) label — the same
    #: bytes as (D, H, W, C) in C order — and read back as (D, H, W, C) / (D, H, W); ``size`` is (D * H, W).
    #: The manifest states it as a 4-D shape (readers before it refuse a 4-D shape rather than flatten).
    depth: int | None = None

    @property
    def volume_shape(self) -> tuple[int, int, int] | None:
        """(D, H, W) of every 3-D sample; None for 2-D samples."""
        if self.depth is None or self.size is None:
            return None
        return (self.depth, self.size[0] // self.depth, self.size[1])

    @property
    def image_dims(self) -> tuple[int | None, ...]:
        """A stored image's shape as the manifest states it: (H, W, C), or (D, H, W, C) for 3-D samples; H and W
        are None where the samples' sizes vary."""
        volume = self.volume_shape
        if volume is not None:
            return (*volume, self.image_channels)
        h, w = self.size if self.size else (None, None)
        return (h, w, self.image_channels)

    @property
    def legacy_image(self) -> bool:
        """True for (H, W, 3) uint8 RGB images: what format versions 1 and 2 (and manifest 3) can say."""
        return self.image_dtype == "|u1" and self.image_channels == 3 and self.channel_kind == "RGB"

    @property
    def stored_image_dtype(self) -> np.dtype:
        return np.dtype(self.image_dtype)

    def image_shape(self, hw: tuple[int, int]) -> tuple[int, int, int]:
        """Shape of one stored image of height/width ``hw``."""
        return (int(hw[0]), int(hw[1]), self.image_channels)

    def image_nbytes(self, hw: tuple[int, int]) -> int:
        return int(hw[0]) * int(hw[1]) * self.image_channels * self.stored_image_dtype.itemsize

    @cached_property
    def encoding(self) -> LabelEncoding:
        """The stored label encoding (:mod:`shardkit.codecs.encoding`): shape, dtype, encode, decode."""
        return stored_encoding(self.label_encoding, self.num_classes, self.label_dtype)

    @property
    def label_channels(self) -> int | None:
        """Trailing label axis length: None for index maps (H, W), C or ceil(C/8) otherwise."""
        return self.encoding.channels

    @property
    def stored_label_dtype(self) -> np.dtype:
        return self.encoding.dtype

    def label_shape(self, hw: tuple[int, int]) -> tuple[int, ...]:
        return self.encoding.shape(hw)

    def sample_nbytes(self, hw: tuple[int, int]) -> int:
        """Stored bytes of one sample of this (H, W): what shard byte limits count."""
        return self.image_nbytes(hw) + int(np.prod(self.label_shape(hw))) * self.stored_label_dtype.itemsize

    def flat_offsets(self, shapes: np.ndarray) -> np.ndarray:
        """Start of each sample in flattened image and label arrays (in elements): (n + 1, 2) int64, last row =
        totals."""
        px = np.asarray(shapes, dtype=np.int64).reshape(-1, 2).prod(axis=1)
        per_px = np.array([self.image_channels, int(np.prod(self.label_shape((1, 1))))], dtype=np.int64)
        offsets = np.zeros((len(px) + 1, 2), dtype=np.int64)
        np.cumsum(px[:, None] * per_px, axis=0, out=offsets[1:])
        return offsets

    def to_manifest(self) -> dict[str, Any]:
        image = list(self.image_dims)  # (H, W, C), or (D, H, W, C) for 3-D samples
        extent = image[:-1]  # the label's: (D, H, W) class ids for 3-D samples
        return {
            "image": {"dtype": self.image_dtype, "shape": image,
                      "layout": "HWC" if self.volume_shape is None else "DHWC", "channels": self.channel_kind},
            "label": {
                "dtype": self.stored_label_dtype.str,
                "shape": extent if self.label_channels is None else [*extent, self.label_channels],
                "encoding": self.label_encoding,
                "num_classes": self.num_classes,
                "class_id_dtype": self.label_dtype,
                "bitorder": self.encoding.bitorder,
            },
        }

    def to_json(self) -> dict[str, Any]:
        return self.to_manifest()

    @classmethod
    def from_manifest(cls, sample: Mapping[str, Any]) -> SampleSpec:
        """The spec of a manifest's ``sample`` (already a SampleSpec when it comes from a loaded manifest)."""
        if isinstance(sample, SampleSpec):
            return sample
        shape = sample["image"]["shape"]
        lab = sample["label"]
        image = sample["image"]
        if len(shape) == 4:  # 3-D samples (D, H, W, C): stored as (D * H, W, C)
            return cls((int(shape[0]) * int(shape[1]), int(shape[2])), str(lab["encoding"]), int(lab["num_classes"]),
                       str(lab["class_id_dtype"]), str(image.get("dtype", "|u1")), int(shape[3]),
                       str(image.get("channels", "RGB")), int(shape[0]))
        size = (int(shape[0]), int(shape[1])) if shape[0] is not None else None
        return cls(size, str(lab["encoding"]), int(lab["num_classes"]), str(lab["class_id_dtype"]),
                   str(image.get("dtype", "|u1")), int(shape[2]), str(image.get("channels", "RGB")))

    @classmethod
    def from_json(cls, sample: Any) -> SampleSpec:
        """A manifest's ``sample``, checked: a ValueError naming the problem for anything a reader cannot trust."""
        if isinstance(sample, SampleSpec):
            return sample
        image, label = (sample.get("image"), sample.get("label")) if isinstance(sample, dict) else (None, None)
        if not isinstance(image, dict) or not isinstance(label, dict):
            raise ValueError("sample has no image and label description")
        n = label.get("num_classes")
        if not _is_int(n) or not 1 <= n <= MAX_CLASSES:
            raise ValueError(f"num_classes {n!r} is not an integer in 1..{MAX_CLASSES}")
        if label.get("encoding") not in LABEL_ENCODINGS:
            raise ValueError(f"label encoding {label.get('encoding')!r} is not one of {', '.join(LABEL_ENCODINGS)}")
        if label.get("class_id_dtype") not in CLASS_ID_DTYPES:
            raise ValueError(f"class_id_dtype {label.get('class_id_dtype')!r} is not one of "
                             f"{', '.join(CLASS_ID_DTYPES)}")
        shape = image.get("shape")
        depth = None
        if (isinstance(shape, list) and len(shape) == 4 and image.get("layout") == "DHWC"
                and all(_is_int(v) and v >= 1 for v in shape[:3])):  # 3-D samples, stored as (D * H, W, C)
            depth, shape = shape[0], [shape[0] * shape[1], shape[2], shape[3]]
        if not isinstance(shape, list) or len(shape) != 3 or (shape[0] is None) != (shape[1] is None):
            raise ValueError(f"image shape {shape!r} is not [H, W, C], [null, null, C] or [D, H, W, C] (DHWC)")
        if image.get("dtype", "|u1") not in IMAGE_DTYPES:
            raise ValueError(f"image dtype {image.get('dtype')!r} is not one of {', '.join(IMAGE_DTYPES)}")
        if not _is_int(shape[2]) or not 1 <= shape[2] <= MAX_BANDS:
            raise ValueError(f"image channels {shape[2]!r} is not an integer in 1..{MAX_BANDS}")
        kind = image.get("channels", "RGB")
        if kind not in IMAGE_CHANNEL_KINDS or (kind == "RGB" and shape[2] != 3):
            raise ValueError(f"image channels {kind!r} is not 'RGB' (3 channels) or 'bands'")
        if shape[0] is not None:
            check_size(shape[0], shape[1], "image shape")
        return cls((shape[0], shape[1]) if shape[0] is not None else None, label["encoding"], n,
                   label["class_id_dtype"], image.get("dtype", "|u1"), shape[2], kind, depth)


def _check_colour(value: Any, where: str) -> Colour:
    """Validate ``value`` as an (r, g, b) triple of 0..255 ints; raise ConfigError naming ``where``."""
    try:
        rgb = tuple(int(v) for v in value)
        ok = len(rgb) == 3 and all(0 <= v <= 255 for v in rgb) and all(int(v) == v for v in value)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"{where}: colour {value!r} is not three integers 0..255")
    return rgb  # type: ignore[return-value]


Colour = tuple[int, int, int]
@dataclass(frozen=True)
class ClassInfo:
    """One class: stored id, display name, RGB colour (``None`` when the table has no colours)."""

    id: int
    name: str
    colour: Colour | None = None

    def __post_init__(self) -> None:
        if self.colour is not None:
            object.__setattr__(self, "colour", _check_colour(self.colour, f"class {self.id} {self.name!r}"))


@dataclass(frozen=True)
class ClassTable(JsonView):
    """The classes of a dataset as stored: ids ``0..C-1`` in order, an ignore id, an optional remap.

    ``ignore_index`` may be a real class (CamVid's Unlabelled, 11) or lie outside
    the classes (255). ``remap`` is a 256-entry lookup from raw label values to stored
    ids (Cityscapes labelId → trainId); ``None`` means raw values are stored ids.
    """

    classes: tuple[ClassInfo, ...]
    ignore_index: int | None
    remap: tuple[int, ...] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        classes = tuple(self.classes)
        object.__setattr__(self, "classes", classes)
        if not 1 <= len(classes) <= MAX_CLASSES:
            raise ConfigError(f"a class table needs 1..{MAX_CLASSES} classes, got {len(classes)}")
        for i, c in enumerate(classes):
            if c.id != i:
                raise ConfigError(
                    f"class table {self.source!r}: class {c.name!r} has id {c.id}, expected {i}"
                )
        ig = self.ignore_index
        if ig is not None and not 0 <= ig < MAX_CLASSES:
            raise ConfigError(f"ignore index {ig} must be between 0 and {MAX_CLASSES - 1}")
        if self.remap is not None:
            remap = tuple(int(v) for v in self.remap)
            object.__setattr__(self, "remap", remap)
            if len(remap) != 256:
                raise ConfigError(
                    f"class table {self.source!r}: remap has {len(remap)} entries, expected 256"
                )
            bad = sorted({v for v in remap if not self.is_stored_id(v)})
            if bad:
                raise ConfigError(
                    f"class table {self.source!r}: remap targets {bad[:_MAX_LISTED]} are neither a class "
                    f"(0..{len(classes) - 1}) nor the ignore index {ig}"
                )

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def is_stored_id(self, value: int) -> bool:
        """True for a class id or the ignore index: the values a decoded label may hold."""
        return 0 <= value < self.num_classes or value == self.ignore_index

    def label_dtype(self) -> np.dtype:
        """uint8 when every stored id (the ignore index included) fits a byte, else little-endian uint16."""
        return id_dtype(self.num_classes, self.ignore_index)

    def names(self) -> list[str]:
        return [c.name for c in self.classes]

    def to_json(self) -> dict[str, Any]:
        """The manifest form: plain JSON types only."""
        return {
            "num_classes": self.num_classes,
            "ignore_index": self.ignore_index,
            "source": self.source,
            "classes": [
                {"id": c.id, "name": c.name, "colour": list(c.colour) if c.colour is not None else None}
                for c in self.classes
            ],
            "remap": list(self.remap) if self.remap is not None else None,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ClassTable:
        """Inverse of :meth:`to_json`; a malformed dict (a damaged manifest) is a ShardFormatError."""
        if isinstance(d, ClassTable):
            return d
        try:
            classes = tuple(
                ClassInfo(
                    int(c["id"]), str(c["name"]), None if c.get("colour") is None else tuple(c["colour"])
                )
                for c in d["classes"]
            )
            ig = d.get("ignore_index")
            table = cls(
                classes=classes,
                ignore_index=None if ig is None else int(ig),
                remap=None if d.get("remap") is None else tuple(d["remap"]),
                source=str(d.get("source", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ShardFormatError(f"malformed class table in manifest: {exc!r}") from None
        if "num_classes" in d and d["num_classes"] != table.num_classes:
            raise ShardFormatError(
                f"class table says num_classes={d['num_classes']} but lists {table.num_classes} classes"
            )
        return table

    def with_ignore_index(self, ignore_index: int) -> ClassTable:
        """The same table with another ignore id; remap entries that pointed at the old one follow it."""
        remap = self.remap
        if remap is not None and self.ignore_index is not None:
            remap = tuple(ignore_index if v == self.ignore_index else v for v in remap)
        return replace(self, ignore_index=ignore_index, remap=remap)

    @classmethod
    def from_manifest(cls, d: Any, num_classes: int) -> ClassTable:
        """A manifest's ``classes`` for a split of ``num_classes`` classes, checked: a ValueError naming the problem
        (ids, names, colours, the ignore id), where :meth:`from_json` trusts a table shardkit wrote itself."""
        if isinstance(d, ClassTable):
            return d
        if not isinstance(d, dict):
            raise ValueError("classes is not an object")
        ignore = d.get("ignore_index")
        if ignore is not None and (not _is_int(ignore) or not 0 <= ignore < MAX_CLASSES):
            raise ValueError(f"ignore_index {ignore!r} is not an integer in 0..{MAX_CLASSES - 1}")
        classes = d.get("classes")
        if not isinstance(classes, list):
            raise ValueError("classes.classes is not a list")
        for c in classes:
            if not isinstance(c, dict) or not _is_int(c.get("id")) or not 0 <= c["id"] < num_classes:
                raise ValueError(f"class {c!r} has no integer id in 0..{num_classes - 1}")
            if not isinstance(c.get("name"), str):
                raise ValueError(f"class {c['id']} has no name string")
            colour = c.get("colour")
            if colour is not None and (not isinstance(colour, list) or len(colour) != 3
                                       or not all(_is_int(v) and 0 <= v <= 255 for v in colour)):
                raise ValueError(f"class {c['id']} colour {colour!r} is not three integers 0..255")
        remap = d.get("remap")
        if remap is not None and (not isinstance(remap, list) or not all(_is_int(v) for v in remap)):
            raise ValueError("classes.remap is not a list of integers")
        try:
            table = cls(tuple(ClassInfo(c["id"], c["name"], None if c.get("colour") is None else tuple(c["colour"]))
                              for c in classes), ignore, None if remap is None else tuple(remap),
                        str(d.get("source", "")))
        except ConfigError as exc:
            raise ValueError(f"class table is invalid ({exc})") from None
        if table.num_classes != num_classes or d.get("num_classes", num_classes) != num_classes:
            raise ValueError(f"classes lists {table.num_classes} classes, the sample has {num_classes}")
        return table


class OpenRecord(JsonView):
    """A typed record that keeps the keys this shardkit does not know in ``extra`` and writes them back unchanged
    (the manifest's ``source`` and ``stats``): its JSON is ``extra``, then every set field, ``_LISTS`` as lists."""

    _LISTS: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)  # type: ignore[attr-defined]
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name != "extra" and value is not None:
                out[f.name] = list(value) if f.name in self._LISTS else value
        return out


@dataclass(frozen=True)
class Source(OpenRecord):
    """Where a split came from (the manifest's ``source``): layout, label kind, input root, the fingerprint of
    every sample's inputs, the pair count and the files left unpaired. Keys this shardkit does not know are
    kept in ``extra`` and written back unchanged."""

    layout: str | None = None
    label_kind: str | None = None
    root: str | None = None
    fingerprint: str | None = None
    pairs: int | None = None
    unmatched_images: tuple[str, ...] | None = None
    unmatched_labels: tuple[str, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    _TEXT: ClassVar[tuple[str, ...]] = ("layout", "label_kind", "root", "fingerprint")
    _LISTS: ClassVar[tuple[str, ...]] = ("unmatched_images", "unmatched_labels")

    @classmethod
    def from_json(cls, d: Any) -> Source:
        """A manifest's ``source``, checked (a ValueError naming the problem)."""
        if isinstance(d, Source):
            return d
        if not isinstance(d, dict):
            raise ValueError("source is not an object")
        known: dict[str, Any] = {}
        for key in cls._TEXT:
            if d.get(key) is not None and not isinstance(d[key], str):
                raise ValueError(f"source.{key} is not a string")
            known[key] = d.get(key)
        if d.get("pairs") is not None and not _is_int(d["pairs"]):
            raise ValueError("source.pairs is not an integer")
        for key in cls._LISTS:
            if d.get(key) is not None:
                if not isinstance(d[key], list) or not all(isinstance(v, str) for v in d[key]):
                    raise ValueError(f"source.{key} is not a list of strings")
                known[key] = tuple(d[key])
        names = {f.name for f in fields(cls)}
        return cls(**known, pairs=d.get("pairs"), extra={k: v for k, v in d.items() if k not in names})


@dataclass(frozen=True)
class SplitStats(OpenRecord):
    """A split's statistics as the manifest keeps them (``stats``): pixel totals, each class's pixels and share,
    the image mean and standard deviation per channel (0-255 scale). Keys this shardkit does not know are kept
    in ``extra`` and written back unchanged."""

    pixels: int | None = None
    class_pixels: tuple[int, ...] | None = None
    ignore_pixels: int | None = None
    class_share: tuple[float, ...] | None = None
    image_mean: tuple[float, ...] | None = None
    image_std: tuple[float, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    _COUNTS: ClassVar[tuple[str, ...]] = ("pixels", "ignore_pixels")
    _LISTS: ClassVar[tuple[str, ...]] = ("class_pixels", "class_share", "image_mean", "image_std")

    @classmethod
    def from_json(cls, d: Any, channels: int = 3) -> SplitStats:
        """A manifest's ``stats``, checked for images of ``channels`` bands (a ValueError naming the problem)."""
        if isinstance(d, SplitStats):
            return d
        if not isinstance(d, dict):
            raise ValueError("stats is not an object")
        known: dict[str, Any] = {}
        for key in cls._LISTS:
            values = d.get(key, [])
            if not isinstance(values, list) or not all(_is_number(v) for v in values):
                raise ValueError(f"stats.{key} is not a list of numbers")
            if key in ("image_mean", "image_std") and key in d and len(values) != channels:
                raise ValueError(f"stats.{key} has {len(values)} values, not one per image channel ({channels})")
            known[key] = tuple(values) if key in d else None
        for key in ("image_min", "image_max"):  # version 4: each band's range (null: a band without values)
            values = d.get(key, [None] * channels)
            if not isinstance(values, list) or len(values) != channels or not all(
                    v is None or _is_number(v) for v in values):
                raise ValueError(f"stats.{key} is not one number (or null) per image channel ({channels})")
        for key in cls._COUNTS:
            if d.get(key) is not None and not _is_number(d[key]):
                raise ValueError(f"stats.{key} is not a number")
            known[key] = d.get(key)
        names = {f.name for f in fields(cls)}
        return cls(**known, extra={k: v for k, v in d.items() if k not in names})


@dataclass(frozen=True)
class Preprocessing(JsonView):
    """The options that shaped every stored sample (the manifest's ``preprocessing``), as the conversion
    recorded them: their names belong to the convert options, so they are kept as given."""

    options: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dict(self.options)

    @classmethod
    def from_json(cls, d: Any) -> Preprocessing:
        if isinstance(d, Preprocessing):
            return d
        if not isinstance(d, dict):
            raise ValueError("preprocessing is not an object")
        return cls(dict(d))
