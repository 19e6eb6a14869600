"""What runs inside a pool worker: decode, transform, encode and write one whole shard.

Decoded pixels never leave the worker; only a small :class:`ShardResult` (file names,
sizes, hashes, statistics) travels back to the parent. Per-sample records stay here too: the
worker writes them into the shard's samples sidecar (:mod:`shardkit.files.samples`).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..codecs.registry import RAW, ArrayCodecs
from ..errors import DecodeError, InputChangedError, LabelError, OutputError, ShardkitError
from ..files.samples import SidecarBuilder, pixel_hash, sidecar_name
from ..files.splitfiles import check_size
from ..formats.base import SampleSpec, WrittenFile
from ..formats.registry import get, writer_class
from ..images.imageio import (
    Georeference,
    check_pixels,
    decode_image,
    decodes_whole,
    georeference,
    read_header,
    read_image_size,
    regular_stat,
    window_as_stored,
)
from ..images.imagetypes import NAME_OF, ImageOptions, dtype_name
from ..images.looks import look_hash
from ..images.preprocess import content_box, fit_pair, pads, stored_to_source
from ..images.tiles import (
    Tile,
    TileCounts,
    Tiling,
    ignored_share,
    owned_box,
    tiles_in_memory,
    tiles_windowed,
    untiled_source,
)
from ..labels import LabelDecoder
from ..labels.raster import RasterReport
from ..labels.sources.base import SampleShapes
from ..store.duplicates import source_hash
from ..store.stats import Stats
from ..support.progress import CounterRef, worker_tick
from .annotated import ANNOTATED_TILE_FIX, AnnotationRun, rasterise_sample, with_shapes
from .config import DEFAULT_MAX_PIXELS, ConvertConfig
from .fingerprint import SourceCache, file_identity, sample_fingerprint, source_digest
from .layouts import rel_path
from .plan import ShardTask, hex_rows, shard_key, stem
from .volumes import VolumeJob, VolumeRun, cut_case, slice_counts, volume_wire, with_case_files

if TYPE_CHECKING:
    from .staging import RemoteSource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerContext:
    """Everything a worker needs besides its task: frozen, small, picklable."""

    format: str
    spec: SampleSpec
    decoder: LabelDecoder
    root: Path
    size: tuple[int, int] | None
    resize: str
    crop: str
    compression: str
    on_error: str
    #: fsync the shard files in the worker. The local backend leaves it to the parent, which flushes
    #: them while the workers decode the next shards; a Dask worker does it itself (the client may
    #: sit on another machine, where an fsync would not reach the worker's writes).
    sync_files: bool = True
    #: Largest image or label (height x width, from the file header) decoded; bigger ones are a DecodeError.
    max_pixels: int = DEFAULT_MAX_PIXELS
    #: per-array codecs (raw: format version 1 bytes)
    codecs: ArrayCodecs = RAW
    #: Inputs on object storage: each worker fetches its own shard's files
    #: (:class:`shardkit.conversion.staging.RemoteSource`).
    source: RemoteSource | None = None
    #: The conversion's :func:`~shardkit.conversion.plan.settings_text`: what a worker hashes into the fingerprints and
    #: the
    #: shard key of a task planned without them (``task.fingerprints is None``)
    settings: str = ""
    #: ``--on-duplicate skip``: ``(split, key, kept copy, pixel hash hex)`` of samples to leave out as duplicates of
    #: an earlier sample (decided by the parent from every shard's pixel hashes; see :mod:`shardkit.store.duplicates`)
    drop: tuple[tuple[str, str, str, str], ...] = ()
    #: ``--tile``: each source stored as its tiles (:mod:`shardkit.images.tiles`); None: one sample per source
    tiling: Tiling | None = None
    #: bands and element type asked for (``--bands``, ``--image-dtype``, ``--rescale``, ``--pages-as-bands``)
    image: ImageOptions = field(default_factory=ImageOptions)
    #: record each sample's georeference (GeoTIFF CRS and transform, on the stored grid) in the sidecar
    georef: bool = False
    #: labels from an annotation source: its name and policies (the task carries each sample's shapes)
    annotations: AnnotationRun | None = None
    #: a volume tree: each pair is a case, cut into slices (:mod:`shardkit.conversion.volumes`)
    volumes: VolumeJob | None = None

    @classmethod
    def from_config(cls, cfg: ConvertConfig, **given: Any) -> WorkerContext:
        """The context of a conversion: ``given`` (spec, decoder, root …), and every other field from the option
        of ``cfg`` with the same name — so an option a worker needs is one field here, filled without a line
        anywhere else."""
        names = {f.name for f in dataclasses.fields(cls)} - set(given)
        return cls(**given, **{name: getattr(cfg, name) for name in names if hasattr(cfg, name)})


@dataclass
class ShardResult:
    """What a worker sends back: no pixels, only metadata."""

    split: str
    index: int
    key: str
    directory: Path
    files: tuple[WrittenFile, ...]  # the format's files, then the samples sidecar
    num_samples: int = 0
    fingerprint: str = ""  # sha256 of the shard's raw sample fingerprints (formats/samples.md)
    stats: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    synced: bool = True  # False: the files still need an fsync before they are published
    padded: int = 0  # samples smaller than --size after resizing, padded (image 0, label the pad id)
    #: fingerprint cache entries of the source files this worker hashed (tasks planned without fingerprints),
    #: for the split's cache: an (m, 2) :data:`~shardkit.conversion.fingerprint.ENTRY` array aligned with the task's
    #: pairs
    sources: np.ndarray | None = None
    #: the written samples' pixel hashes, concatenated in order (the parent's duplicate check)
    pixels: bytes = b""


def check_image_spec(image: np.ndarray, spec: SampleSpec, path: Path) -> None:
    """Refuse an image whose type or band count is not the split's (set by its first image): never cast silently."""
    bands = image.shape[2]
    if dtype_name(image.dtype) != NAME_OF[spec.image_dtype] or bands != spec.image_channels:
        want = f"{NAME_OF[spec.image_dtype]} with {spec.image_channels} band{'s' * (spec.image_channels != 1)}"
        raise DecodeError(f"image is {dtype_name(image.dtype)} with {bands} band{'s' * (bands != 1)}; this split "
                          f"stores {want} (its first image's)", path=path,
                          fix="convert such images separately, or make them alike with --bands / --image-dtype "
                              "and --rescale")


def process_sample(pair: Any, ctx: WorkerContext, data: dict[Path, np.ndarray] | None = None,
                   shapes: SampleShapes | None = None, report: RasterReport | None = None,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int, int, int] | None]:
    """Decode + fit + encode one pair → (image, stored label, class ids, where the source lies when it was padded:
    (y0, y1, x0, x1), else None).

    ``data``: source files already read (and found regular) by :func:`fingerprint_pair`; others are read here.
    ``shapes``: the sample's annotation shapes, rasterised at the image's size instead of decoding a label
    (their report merged into ``report``).
    """
    image, ids = decode_pair(pair, ctx, data, shapes, report)
    pad = pad_label(ctx)
    hw = (int(image.shape[0]), int(image.shape[1]))
    padded = content_box(hw, ctx.size, ctx.resize, ctx.crop) if pads(hw, ctx.size, ctx.resize, ctx.crop) else None
    image, ids = fit_pair(image, ids, size=ctx.size, resize=ctx.resize, crop=ctx.crop, pad_label=pad,
                          label_path=pair.label)
    try:  # what every reader allows (a side over MAX_SIDE within --max-pixels: a 1 x 70000 strip)
        check_size(int(image.shape[0]), int(image.shape[1]), "image")
    except ValueError as exc:
        raise DecodeError(f"{exc} (the bounds of a stored sample)", path=pair.image,
                          fix="store it smaller with --size HxW, cut it with --tile HxW, or --on-error skip") from None
    return image, ctx.spec.encoding.encode(ids, allow_numba=False), ids, padded


def decode_pair(pair: Any, ctx: WorkerContext, data: dict[Path, np.ndarray] | None = None,
                shapes: SampleShapes | None = None, report: RasterReport | None = None,
                ) -> tuple[np.ndarray, np.ndarray]:
    """Decode one pair whole → (image, label ids), each file checked against ``--max-pixels`` first; with
    ``shapes`` (an annotation source) the labels are rasterised at the image's size instead, their report merged
    into ``report``."""
    if shapes is not None and ctx.annotations is not None and report is not None:
        if shapes.embedded:  # the image is in the annotation file (pair.image): decode those bytes
            data = {**(data or {}), pair.image: np.frombuffer(shapes.embedded, np.uint8)}
        image = decode_image_checked(pair, ctx, data)
        return image, rasterise_sample(ctx.annotations, shapes, image, ctx.decoder.table, pair.image, report)
    label_data = data.get(pair.label) if data and pair.label is not None else None
    if pair.label is not None:
        if label_data is None:
            regular_stat(pair.label, "label")
        check_pixels(pair.label, ctx.max_pixels, "label", label_data)
    image = decode_image_checked(pair, ctx, data)
    ids = ctx.decoder.decode(pair.label, label_data)  # JPEG labels: the decoder words their errors itself
    return image, ids


def decode_image_checked(pair: Any, ctx: WorkerContext, data: dict[Path, np.ndarray] | None = None) -> np.ndarray:
    """Decode one pair's image, checked against ``--max-pixels`` first and against the split's type after."""
    image_data = data.get(pair.image) if data else None
    if image_data is None:
        regular_stat(pair.image, "image")  # before anything opens it: a FIFO would block
    check_pixels(pair.image, ctx.max_pixels, "image", image_data)
    image = decode_image(pair.image, image_data, ctx.image)
    check_image_spec(image, ctx.spec, pair.image)
    return image


def pad_label(ctx: WorkerContext) -> int:
    """The id labels are padded with: the ignore index, else 0."""
    return ctx.decoder.table.ignore_index if ctx.decoder.table.ignore_index is not None else 0


def check_unchanged(pair: Any, expected: np.ndarray | None) -> None:
    """Refuse a pair whose image or label is not the file the run planned (``expected``: their identities then,
    :func:`~shardkit.conversion.fingerprint.input_identities`; 0 or None: unknown), checked after it was read: what was
    read
    may be the old content, the new one or a mix, and the version must not mix old and new inputs."""
    if expected is None:
        return
    for side, path in enumerate((pair.image, pair.label)):
        if path is not None and expected[side] and file_identity(path) != int(expected[side]):
            raise InputChangedError(
                "changed while the conversion ran (its size, modification time, status change time or inode differ "
                "from when the run planned it; or it was removed)", path=path,
                fix="re-run when the input is stable (nothing writing to it); finished shards are kept and reused")


def tile_pair(pair: Any, ctx: WorkerContext, tiling: Tiling, data: dict[Path, np.ndarray] | None,
              expected: np.ndarray | None = None, shapes: SampleShapes | None = None,
              report: RasterReport | None = None) -> Iterator[tuple[Tile, np.ndarray, np.ndarray] | None]:
    """One source's tiles (stored image, label ids) in grid order; None for each tile dropped as ignore.
    ``expected``: the pair's planned identities (:func:`check_unchanged`), checked once the source was read.
    ``shapes``: an annotation source's shapes, rasterised at the whole image's size and then tiled as a label
    image would be (a source read window by window is refused: its shapes would be drawn whole).

    A source within ``--max-pixels`` (pixels and decode bytes: :func:`~shardkit.images.imageio.decodes_whole`) is
    decoded
    whole; a larger TIFF is read window by window (tiled ones only; anything else is refused by
    :class:`~shardkit.images.tiles.TiledTiff`), any other larger file refused."""
    image_data = data.get(pair.image) if data else None
    if image_data is None:
        regular_stat(pair.image, "image")
    header = read_header(pair.image, "image", image_data)
    ignore = ctx.decoder.table.ignore_index
    # a TIFF is read window by window when it cannot be decoded whole; any other file above --max-pixels is refused
    # there (TiledTiff), one within it by the decode's own byte check
    whole = decodes_whole(header, ctx.max_pixels) if header.kind == "TIFF" else header.pixels <= ctx.max_pixels
    if shapes is not None and not whole:  # (the parent refuses one above --max-pixels before writing)
        raise DecodeError(f"image is {header.height}x{header.width}, too large to decode whole under --max-pixels "
                          f"{ctx.max_pixels}, and annotation shapes are drawn at the whole image's size",
                          path=pair.image, fix=ANNOTATED_TILE_FIX)
    if pair.label is None or whole:
        image, ids = decode_pair(pair, ctx, data, shapes, report)
        check_unchanged(pair, expected)  # before any of its tiles is written
        if image.shape[:2] != ids.shape[:2]:
            raise LabelError(f"label is {ids.shape[0]}x{ids.shape[1]} (HxW) but its image is "
                             f"{image.shape[0]}x{image.shape[1]}", path=pair.label,
                             fix="re-export the label at the image size")
        for tile, img, lab in tiles_in_memory(pair.key, image, ids, tiling, pad_label(ctx)):
            keep = tiling.drop_ignored is None or ignored_share(lab, ignore) < tiling.drop_ignored
            yield (tile, img, lab) if keep else None
        return
    if header.kind != "TIFF":
        raise untiled_source(pair.image, header.kind, header.height, header.width, ctx.max_pixels)
    regular_stat(pair.label, "label")

    def to_image(raw: np.ndarray) -> np.ndarray:
        image = window_as_stored(raw, pair.image, ctx.image)
        check_image_spec(image, ctx.spec, pair.image)
        return image

    yield from tiles_windowed(pair.key, pair.image, pair.label, tiling, ctx.max_pixels, ctx.decoder.decode_pixels,
                              pad_label(ctx), ignore, to_image, ctx.image.pages_as_bands)
    check_unchanged(pair, expected)  # read window by window: checked after the last one (the shard then fails)


def planned_tiles(task: ShardTask, tiling: Tiling) -> int:
    """Tiles the task's sources give at most (from their headers; 1 for a header that cannot be read)."""
    total = 0
    for pair in task.samples:
        try:
            total += tiling.count(read_image_size(pair.image))
        except ShardkitError:
            total += 1
    return total


def stored_georeference(pair: Any, ctx: WorkerContext, data: dict[Path, np.ndarray]) -> Georeference | None:
    """The image's georeference moved onto the stored sample's grid (resized, cropped or padded), or None."""
    image_data = data.get(pair.image)
    found = georeference(pair.image, image_data)
    if found is None:
        return None
    header = read_header(pair.image, "image", image_data)
    sy, sx, oy, ox = stored_to_source((header.height, header.width), ctx.size, ctx.resize, ctx.crop)
    a, b, c, d, e, f = found[1]
    return found[0], (a * sx, b * sy, c + a * sx * ox + b * sy * oy, d * sx, e * sy, f + d * sx * ox + e * sy * oy)


def fingerprint_pair(pair: Any, ctx: WorkerContext, options_digest: str, sources: SourceCache, i: int,
                     data: dict[Path, np.ndarray]) -> str:
    """The pair's fingerprint, exactly as :func:`shardkit.conversion.fingerprint.fingerprint_samples` computes it in the
    parent, from one read of each file: its bytes go into ``data`` for the decoder (files up to
    :data:`~shardkit.conversion.fingerprint.KEEP_LIMIT`), its cache entry into ``sources`` (as pair ``i``)."""
    digests: list[str | None] = []
    for side, path in enumerate((pair.image, pair.label)):
        if path is None:
            digests.append(None)
            continue
        entry, cacheable, kept = source_digest(path, None, ctx.on_error, keep=True)
        digests.append(str(entry[-1]))
        if cacheable:
            sources.set(i, side, entry)
        if kept is not None:
            data[path] = kept
    image, label = digests
    assert image is not None
    return sample_fingerprint(options_digest, image, label).hex()


#: Words in a writer library's message that mean the output device is full or failing (LMDB reports a full
#: disk as "mdb_txn_commit: Input/output error"; HDF5 as "errno = 28, error message = 'No space left on device'").
_DISK_FULL_WORDS = ("No space left", "Disk quota", "Input/output error", "errno = 28", "errno = 122")


def output_problem(exc: BaseException) -> str:
    """One line for a failed write: the OS's reason where the message carries one, else its first line."""
    text = str(exc.strerror) if isinstance(exc, OSError) and exc.strerror else str(exc)
    said = re.search(r"error message = '([^']*)'", text)  # HDF5's multi-line messages name the OS error
    if said:
        return said.group(1)
    first = " ".join(text.split())  # HDF5 messages span lines: one line, shortened
    return first[:200] or type(exc).__name__


def _write(fn: Any, task: ShardTask, *args: Any, errors: tuple[type[Exception], ...] = (OSError,)) -> Any:
    """Call a writer method; an output failure there (disk full, read-only, I/O error: ``errors``, the writer's
    :attr:`~shardkit.formats.base.ShardWriter.write_errors`) is the output's fault, said in one line."""
    try:
        return fn(*args)
    except errors as exc:
        text = str(exc)
        full = (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO)) or any(
            w in text for w in _DISK_FULL_WORDS)
        fix = ("free disk space (or choose another output folder) and re-run; finished shards are kept" if full
               else "check the output folder and re-run")
        raise OutputError(f"cannot write shard {task.stem} ({output_problem(exc)})", path=task.directory,
                          fix=fix) from None


_death_signal_for: int | None = None  # the parent pid this process already asked to die with


def die_with_parent(parent_pid: int) -> None:
    """In a worker process: ask Linux to SIGKILL it when its parent dies (``prctl(PR_SET_PDEATHSIG)``).

    So a parent killed with SIGKILL leaves no worker writing on. Once per process; a no-op off Linux,
    in the parent itself, or where libc cannot be loaded.
    """
    global _death_signal_for
    if _death_signal_for == parent_pid or os.getpid() == parent_pid or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG = 1
            log.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
            return
    except (OSError, AttributeError) as exc:  # pragma: no cover - no libc / no prctl
        log.debug("prctl(PR_SET_PDEATHSIG) unavailable: %s", exc)
        return
    _death_signal_for = parent_pid
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)


def convert_shard_in_worker(task: ShardTask, ctx: WorkerContext, parent_pid: int, counter: CounterRef | None = None,
                            slot: int = 0) -> ShardResult:
    """:func:`convert_shard` in a local pool process that dies with ``parent_pid``.

    ``counter``/``slot``: the parent's progress counter file and this task's slot in it.
    """
    die_with_parent(parent_pid)
    return convert_shard(task, ctx, worker_tick(counter, slot))


def convert_shard(task: ShardTask, ctx: WorkerContext, tick: Callable[[], None] | None = None) -> ShardResult:
    """Write shard ``task.stem`` of ``task.split`` to temporary names and describe it.

    ``tick`` is called once per sample written or skipped (the progress bar). With inputs on object
    storage, the shard's files are fetched first into a temporary folder (deleted after).
    """
    if ctx.source is not None:
        with ctx.source.staged(task) as (local_task, root):
            return convert_shard(local_task, dataclasses.replace(ctx, root=root, source=None), tick)
    try:
        import cv2

        cv2.setNumThreads(1)  # one process per core already; OpenCV threads would only contend
        # silent: every decode failure is reported as one shardkit line, not OpenCV chatter before it
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    except Exception:  # pragma: no cover
        pass
    stats = Stats(ctx.spec.num_classes, ctx.spec.image_channels, ranges=not ctx.spec.legacy_image)
    cls = writer_class(ctx.format)
    errors = cls.write_errors
    planned = len(task.samples) if ctx.tiling is None else planned_tiles(task, ctx.tiling)
    if ctx.volumes is not None:
        planned = sum(n for n, _ in slice_counts(task.samples, ctx.volumes))
    volume_run = VolumeRun(ctx.volumes.slicing) if ctx.volumes is not None else None
    writer = _write(cls, task, task.directory, task.stem, ctx.spec, planned, ctx.compression, ctx.codecs,
                    errors=errors)
    samples = SidecarBuilder(ctx.spec.num_classes, georef=ctx.georef)
    counts = TileCounts()
    whole: list[bytes] = []  # tiled: one pixel hash per source (duplicates.source_hash), for the duplicate check
    skipped: list[dict[str, str]] = []
    padded = 0
    given = None if task.fingerprints is None else hex_rows(task.fingerprints)
    fingerprints: list[str] = []
    sources = SourceCache(len(task.samples) if given is None else 0)  # entries of the files hashed here
    options_digest = hashlib.sha256(ctx.settings.encode()).hexdigest()
    drop = {key: (kept, pixels) for split, key, kept, pixels in ctx.drop if split == task.split}
    changed = False  # a sample left out because its input changed mid-run: the shard gets a key of its own
    raster = RasterReport()  # what rasterising annotation shapes lost (annotation sources only)

    def skip(i: int, pair: Any, exc: ShardkitError) -> None:
        nonlocal changed
        log.debug("skipped %s: %s", pair.key, exc)
        skipped.append({"key": pair.key, "reason": exc.problem})  # its fix was "--on-error skip"
        if isinstance(exc, InputChangedError):  # a fingerprint no input has: no later run reuses this shard
            fingerprints[i] = hashlib.sha256(f"changed while converted\0{fingerprints[i]}".encode()).hexdigest()
            if given is None:  # nor its cache entries: the next run reads the files again
                sources.set(i, 0, None)
                sources.set(i, 1, None)
            changed = True

    try:
        for i, pair in enumerate(task.samples):
            data: dict[Path, np.ndarray] = {}
            # hashed here (task.fingerprints None), from the bytes the decoder then uses
            fingerprint = given[i] if given is not None else fingerprint_pair(pair, ctx, options_digest, sources,
                                                                                i, data)
            if given is None and task.shapes is not None:  # as the parent folds them (annotated.fold_fingerprints)
                fingerprint = with_shapes(bytes.fromhex(fingerprint), task.shapes[i]).hex()
            if given is None and ctx.volumes is not None:  # as the parent folds them (volumes.fold_case_files)
                fingerprint = with_case_files(bytes.fromhex(fingerprint), pair, ctx.volumes, ctx.on_error).hex()
            fingerprints.append(fingerprint)
            expected = None if task.identities is None else task.identities[i]
            if pair.key in drop:  # --on-duplicate skip: the same pixels as an earlier sample
                kept, pixels = drop[pair.key]  # its hash stays in the record: later runs check it undecoded
                skipped.append({"key": pair.key, "reason": f"identical pixels to {kept}", "duplicate_of": kept,
                                "pixels": pixels})
                if tick is not None:
                    tick()
                continue
            if ctx.volumes is not None and volume_run is not None:
                written = len(samples)
                try:
                    _write_slices(pair, ctx, ctx.volumes, volume_run, writer, task, stats, samples, fingerprint,
                                  expected)
                except ShardkitError as exc:
                    if ctx.on_error != "skip" or len(samples) != written:  # some of its slices are written
                        raise
                    skip(i, pair, exc)
                if tick is not None:
                    tick()
                continue
            if ctx.tiling is not None:
                written = counts.written
                try:
                    padded += _write_tiles(pair, ctx, ctx.tiling, data, writer, task, stats, samples, fingerprint,
                                           counts, whole, expected,
                                           None if task.shapes is None else (task.shapes[i], raster))
                except ShardkitError as exc:
                    if ctx.on_error != "skip" or counts.written != written:  # some of its tiles are written
                        raise
                    skip(i, pair, exc)
                if tick is not None:
                    tick()
                continue
            try:
                image, stored, ids, was_padded = process_sample(
                    pair, ctx, data, None if task.shapes is None else task.shapes[i], raster)
                check_unchanged(pair, expected)  # after the read, before the sample is written
            except ShardkitError as exc:
                if ctx.on_error != "skip":
                    raise
                skip(i, pair, exc)
                if tick is not None:
                    tick()
                continue
            _write(writer.add, task, image, stored, pair.key, errors=errors)
            padded += was_padded is not None
            present = stats.add(image, ids, was_padded)
            samples.add(pair.key, rel_path(ctx.root, pair.label) if pair.label is not None else None,
                        int(image.shape[0]), int(image.shape[1]), fingerprint, present, pixel_hash(image),
                        geo=stored_georeference(pair, ctx, data) if ctx.georef else None, looks=look_hash(image))
            if tick is not None:
                tick()
        files = (*_write(writer.close, task, ctx.sync_files, errors=errors),
                 _write(_write_sidecar, task, writer, samples, ctx.sync_files, errors=errors))
    except BaseException:
        writer.abort()
        for p in task.directory.glob(writer.tmp_glob(sidecar_name(task.stem))):
            p.unlink(missing_ok=True)
        raise
    key = None if changed else task.key
    if key is None:  # the shard's final names (format files, then sidecar) carry the key its fingerprints give
        key = shard_key(ctx.settings, [p.key for p in task.samples], fingerprints)
        names = get(ctx.format).published_names(stem(task.index, key), ctx.spec)
        files = tuple(dataclasses.replace(f, final_name=name) for f, name in zip(files, names, strict=True))
    wire = stats.to_wire() if ctx.tiling is None else {**stats.to_wire(), "tiles": counts.to_json()}
    if ctx.annotations is not None:
        wire["raster"] = raster.to_json()
    if ctx.volumes is not None and volume_run is not None:
        wire["volumes"] = volume_wire(ctx.volumes, volume_run)
    return ShardResult(task.split, task.index, key, task.directory, files, len(samples), samples.digest(),
                       wire, skipped, ctx.sync_files, padded,
                       None if given is not None else sources.rows(0, len(task.samples)),
                       b"".join(samples.pixels if ctx.tiling is None else whole))


def _write_tiles(pair: Any, ctx: WorkerContext, tiling: Tiling, data: dict[Path, np.ndarray], writer: Any,
                 task: ShardTask, stats: Stats, samples: SidecarBuilder, fingerprint: str, counts: TileCounts,
                 whole: list[bytes], expected: np.ndarray | None = None,
                 shapes: tuple[SampleShapes, RasterReport] | None = None) -> int:
    """Write one source's tiles (each a sample with its provenance; every tile carries the source's
    fingerprint); returns how many were padded, and appends the source's pixel hash to ``whole`` (from its tiles'
    hashes: :func:`~shardkit.store.duplicates.source_hash`). A source decoded whole fails before any of its tiles is
    written; a windowed one may fail after (a bad TIFF tile deep inside): the caller then fails the shard, as
    ``--on-error skip`` cannot take back written tiles."""
    label = rel_path(ctx.root, pair.label) if pair.label is not None else None
    kept: list[tuple[Tile, np.ndarray, np.ndarray]] = []
    first, places = len(samples.pixels), []
    dropped = padded = held = 0
    for item in tile_pair(pair, ctx, tiling, data, expected, *(shapes or ())):
        if item is None:
            dropped += 1
        else:
            kept.append(item)
            places.append(item[0])
            held += item[1].nbytes + item[2].nbytes
        if len(kept) >= _TILE_BATCH or held >= _TILE_BATCH_BYTES:  # a windowed source: write as it goes
            padded += _flush_tiles(kept, ctx, tiling, writer, task, stats, samples, label, fingerprint)
            counts.written += len(kept)
            kept, held = [], 0
    padded += _flush_tiles(kept, ctx, tiling, writer, task, stats, samples, label, fingerprint)
    counts.written += len(kept)
    counts.dropped += dropped
    counts.sources += 1
    hw = (places[0].source_height, places[0].source_width) if places else (0, 0)
    whole.append(source_hash(*hw, ((t.values, h) for t, h in zip(places, samples.pixels[first:], strict=True))))
    return padded


#: Tiles of one source held before they are written, at most, and their bytes at most: many bands or pages make a
#: tile large (64 tiles of 512x512 x 12 uint8 bands are 200 MB), so memory stays bounded whatever the band count.
_TILE_BATCH = 64
_TILE_BATCH_BYTES = 32 << 20


def _flush_tiles(kept: list[tuple[Tile, np.ndarray, np.ndarray]], ctx: WorkerContext, tiling: Tiling, writer: Any,
                 task: ShardTask, stats: Stats, samples: SidecarBuilder, label: str | None, fingerprint: str) -> int:
    """Write tiles as samples; returns how many hold padding (their source is smaller than a tile)."""
    for tile, image, ids in kept:
        _write(writer.add, task, image, ctx.spec.encoding.encode(ids, allow_numba=False), tile.key,
               errors=type(writer).write_errors)
        present = stats.add(image, ids, owned_box(tile, tiling))  # band statistics: each source pixel once
        samples.add(tile.key, label, int(image.shape[0]), int(image.shape[1]), fingerprint, present,
                    pixel_hash(image), tile.values, looks=look_hash(image))
    return sum(1 for t, _, _ in kept if (t.height, t.width) != tiling.tile)


def _write_slices(pair: Any, ctx: WorkerContext, job: VolumeJob, run: VolumeRun, writer: Any, task: ShardTask,
                  stats: Stats, samples: SidecarBuilder, fingerprint: str, expected: np.ndarray | None) -> None:
    """Write one volume case's slices as samples (the case decoded once, checked whole before the first one)."""
    label = rel_path(ctx.root, pair.label) if pair.label is not None else None
    stored = (NAME_OF[ctx.spec.image_dtype], ctx.spec.image_channels)
    for piece in cut_case(pair, job, run, ctx.root, lambda: check_unchanged(pair, expected), stored):
        ids = piece.label
        if ids is None:  # discovery converts labelled cases only
            raise LabelError("case has no label volume", path=pair.image, fix="add its label volume")
        _write(writer.add, task, piece.image, ctx.spec.encoding.encode(ids, allow_numba=False), piece.key,
               errors=type(writer).write_errors)
        present = stats.add(piece.image, ids)
        samples.add(piece.key, label, int(piece.image.shape[0]), int(piece.image.shape[1]), fingerprint, present,
                    pixel_hash(piece.image), looks=look_hash(piece.image))


def _write_sidecar(writer: Any, samples: SidecarBuilder, sync: bool) -> WrittenFile:
    """Write the shard's samples sidecar under a temporary name, like the writer's own files."""
    from ..files.splitfiles import fsync_file

    name = sidecar_name(writer.stem)
    tmp = writer.tmp_path(name)
    digest = samples.write(tmp)
    if sync:
        fsync_file(tmp)
    return WrittenFile(name, tmp.name, tmp.stat().st_size, digest)
