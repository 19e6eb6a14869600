"""The annotation-source contract: what a source declares (name, tool defaults) and does (detect its files,
read them once into a class table and compact per-sample shapes, turn one sample's shapes into masks).

The parent process calls :meth:`AnnotationSource.detect` and :meth:`AnnotationSource.read` once per run: the
annotation file is parsed once (size cap before reading, bounded JSON depth), every hostile value refused there
in one line, and each shard task carries only its own samples' :class:`SampleShapes` (numpy arrays, picklable).
A worker calls :func:`rasterise` with the image's decoded size instead of decoding a label image.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...errors import LabelError
from ...images.imageio import regular_stat
from ...support.smallfile import open_regular, read_guarded
from ..classes import ClassTable
from ..raster import CROWDS, OVERLAPS, RasterReport, Region, Shape, paint


@dataclass(frozen=True, slots=True)
class ObjectShapes:
    """One annotated object: ``ident`` (the file's id for it, for reports), stored class id, the source's shape
    ``kind`` and its ``data`` (numpy arrays), crowd flag and z-order."""

    ident: str
    class_id: int
    kind: str
    data: tuple[Any, ...]
    crowd: bool = False
    z: int = 0


@dataclass(frozen=True, slots=True)
class SampleShapes:
    """One image's objects, in file order, and the size the annotation file gives for the image."""

    key: str
    height: int
    width: int
    objects: tuple[ObjectShapes, ...]
    #: label files the source checks whole per sample (:meth:`AnnotationSource.check`), e.g. a panoptic PNG
    files: tuple[str, ...] = ()
    #: the image file's bytes when the annotation file carries them and no image file exists (labelme's
    #: ``imageData``); the sample's image path is then the annotation file, and these bytes are decoded instead
    embedded: bytes = b""


@dataclass(frozen=True)
class Policies:
    """The overlap and crowd policies in effect, and what a lost object is (``warn``/``error``)."""

    overlap: str
    crowd: str
    on_lost_object: str = "warn"


@dataclass(frozen=True)
class Annotations:
    """What a source read: the class table (from the file), the original id of each stored class (``None``
    for one the source adds, as background), the samples per split (sorted by key), and where it all came from."""

    source: str
    root: Path
    files: tuple[Path, ...]
    table: ClassTable
    original_ids: tuple[int | str | None, ...]
    splits: dict[str, tuple[tuple[Path, SampleShapes], ...]]
    table_origin: str
    digest: str
    warnings: tuple[str, ...] = field(default_factory=tuple)


class AnnotationSource:
    """One kind of annotation file. Subclasses set the class facts and implement the three methods.

    - ``name``: what ``--annotations`` and the manifest call it;
    - ``expected``: the files it expects, for messages;
    - ``overlap``/``crowd``: the defaults, each the tool's own behaviour (``tool_rule`` says which);
    - ``overlaps``: the overlap policies it can honour (no z values: no ``z-order``).
    """

    name: ClassVar[str]
    expected: ClassVar[str]
    overlap: ClassVar[str] = "order"
    crowd: ClassVar[str] = "class"
    overlaps: ClassVar[tuple[str, ...]] = OVERLAPS
    tool_rule: ClassVar[str] = ""
    #: Pixels no object covers are void (the ignore id), not background (COCO panoptic's segment 0).
    void_is_ignore: ClassVar[bool] = False

    def detect(self, root: Path) -> Path | None:
        """The annotation file (or folder) of this source under ``root``, or None when it has none."""
        raise NotImplementedError

    def read(self, root: Path, where: Path) -> Annotations:
        """Parse the annotation file(s) at ``where`` once, refusing hostile content in one line."""
        raise NotImplementedError

    def region(self, obj: ObjectShapes, h: int, w: int) -> tuple[Region, bool, bool]:
        """One object's mask (as its box) by the tool's rule, whether it was clipped, whether it is degenerate."""
        raise NotImplementedError

    def check(self, sample: SampleShapes, h: int, w: int) -> None:
        """Refuse (one LabelError) a sample whose label files disagree with its objects; most sources have none."""


def annotation_error(what: Path, problem: str, document: str = "the annotation file", item: str = "entry"
                     ) -> LabelError:
    """A problem in an annotation file: one LabelError whose fix says to correct ``document``."""
    return LabelError(problem, path=what, fix=f"correct {document} (or leave that {item} out)")


def checked_int(value: Any, what: Path, name: str, lo: int = 0, hi: int = 2**62,
                document: str = "the annotation file") -> int:
    """``value`` if it is an integer (not a bool) in ``lo..hi``, else :func:`annotation_error` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise annotation_error(what, f"{name} is {value!r}, not an integer in {lo}..{hi}", document)
    return value


def file_head(path: Path, size: int = 1 << 16) -> bytes:
    """The first ``size`` bytes of a candidate annotation file, to recognise it without parsing it whole; b"" for
    anything that is not a readable regular file (a FIFO in its place is never opened for a blocking read)."""
    try:
        with os.fdopen(open_regular(path, "annotation file"), "rb") as fh:
            return fh.read(size)
    except OSError:
        return b""


def read_file(path: Path, what: str, limit: int) -> bytes:
    """An annotation file's bytes: a regular file of at most ``limit`` bytes (checked before reading), else one
    LabelError naming the problem (a FIFO, a folder, a file too large, an unreadable one)."""
    try:
        return read_guarded(path, what, limit=limit)
    except OSError as exc:
        raise LabelError(f"cannot read the {what} ({exc.strerror or exc})", path=path,
                         fix=f"point at a regular {what} of at most {limit >> 20} MiB") from None


def file_stamp(path: Path, what: str) -> tuple[int, int, int, int]:
    """(size, mtime_ns, ctime_ns, inode) of a label-side file a source reads in the workers (a panoptic PNG, an
    instance mask): the four values the fingerprint cache trusts for mask images, so that an edit which restores
    size and mtime (``touch -r``) or a file renamed over another still changes the annotations' digest."""
    st = regular_stat(path, what)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def _is_file(text: str) -> bool:
    """Whether ``text`` is an absolute path naming a file (a relative one would depend on the working folder)."""
    try:
        return os.path.isabs(text) and Path(text).is_file()  # noqa: PTH117 (most strings are no path: no Path)
    except (OSError, ValueError):  # no path can be this (a NUL, too long)
        return False


def sample_digest(sample: SampleShapes) -> bytes:
    """sha256 of everything a sample's labels are drawn from: its size, every object (class, kind, crowd, z and
    its data: arrays by type, shape and bytes) and, for each file its shapes name (a panoptic PNG, an instance
    mask), :func:`file_stamp` — so an edit to one image's annotations changes only that sample's fingerprint,
    and only its shard is converted again (as for an edited mask image)."""
    h = hashlib.sha256()
    update = h.update
    named: dict[str, None] = {}

    def feed(value: Any) -> None:
        kind = type(value)
        if kind is np.ndarray:
            arr = np.ascontiguousarray(value)
            update(f"a{arr.dtype.str}{arr.shape}\0".encode())
            update(arr.data)
        elif kind is tuple or kind is list:
            update(f"t{len(value)}\0".encode())
            for v in value:
                feed(v)
        elif kind is str:
            update(f"s{len(value)}\0{value}".encode("utf-8", "surrogateescape"))
            named[value] = None
        elif value is None or isinstance(value, (bool, int, float, np.integer, np.floating)):
            update(f"v{value!r}\0".encode())
        else:
            raise TypeError(f"sample_digest: {kind.__name__} in a sample's shapes")

    feed([sample.key, sample.height, sample.width, list(sample.files)])
    for o in sample.objects:
        update(f"o{len(o.ident)}\0{o.ident}\0{o.class_id}\0{o.kind}\0{o.crowd}\0{o.z}\0".encode(
            "utf-8", "surrogateescape"))
        feed(o.data)
    for text in named:  # absolute paths naming a file: that file's stat (a label-side file the workers read)
        if _is_file(text):
            update(f"f{text}\0{file_stamp(Path(text), 'label')}\0".encode("utf-8", "surrogateescape"))
    return h.digest()


def inside(root: Path, base: Path, name: str, what: Path) -> Path:
    """``base / name`` resolved, refused (one line) unless it lies inside ``root``."""
    if not name or "\x00" in name:
        raise LabelError(f"an image's file name is empty or holds a NUL ({name!r})", path=what,
                         fix="correct the annotation file")
    path = Path(os.path.realpath(base / name))
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, str(path)]) != real_root:
        raise LabelError(f"file name {name!r} points outside the input folder {root}", path=what,
                         fix="keep every image inside the input folder (or correct file_name)")
    return path


def rasterise(source: AnnotationSource, sample: SampleShapes, h: int, w: int, table: ClassTable,
              policies: Policies, background: int = 0) -> tuple[np.ndarray, RasterReport]:
    """One sample's id image (``table.label_dtype()``) and report, painted under ``policies``."""
    if (h, w) != (sample.height, sample.width):
        raise LabelError(f"the annotations give {sample.key} as {sample.height}x{sample.width} (HxW) but the image is "
                         f"{h}x{w}", fix="correct height/width in the annotation file (or the image)")
    if policies.overlap not in OVERLAPS or policies.crowd not in CROWDS:
        raise LabelError(f"policies {policies.overlap}/{policies.crowd} unknown")
    source.check(sample, h, w)
    if source.void_is_ignore and table.ignore_index is not None:
        background = table.ignore_index
    shapes = []
    for obj in sample.objects:
        region, clipped, degenerate = source.region(obj, h, w)
        shapes.append(Shape(obj.ident, obj.class_id, region, obj.crowd, obj.z, clipped, degenerate))
    return paint(shapes, h, w, table.label_dtype(), overlap=policies.overlap, crowd=policies.crowd,
                 background=background, ignore=table.ignore_index)


def sorted_unique(samples: list[tuple[Path, SampleShapes]], what: Path) -> tuple[tuple[Path, SampleShapes], ...]:
    """``samples`` sorted by key; an image named twice is refused in one line."""
    samples = sorted(samples, key=lambda item: item[1].key)
    for (path, a), (_, b) in itertools.pairwise(samples):
        if a.key == b.key:
            raise LabelError(f"image {path} is referenced twice", path=what,
                             fix="give each image one entry (merge its objects into it)")
    return tuple(samples)
