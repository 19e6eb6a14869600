"""Conversion from an annotation source (:mod:`shardkit.labels.sources`) instead of label images.

The parent reads the annotation file(s) once (:func:`find_annotations`), turns them into a
:class:`~shardkit.conversion.layouts.base.Discovery` whose pairs have no label file, and gives each shard task
only its own samples' shapes (:func:`attach`); a worker rasterises them at the decoded image's size
(:func:`rasterise_sample`) where it would decode a label image. The class table, the policies in effect and
the tool rule they follow are logged in every run; each split's rasterisation report goes into its manifest
(``source.extra.annotations``, :func:`split_report`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError, DecodeError, LabelError, LayoutError
from ..images.imageio import read_header, read_image_size
from ..labels.classes import ClassTable
from ..labels.policy import TableChoice
from ..labels.raster import RasterReport
from ..labels.sources import registry
from ..labels.sources.base import Annotations, Policies, SampleShapes, rasterise, sample_digest
from ..store.records import ShardRecord
from .config import ConvertConfig
from .layouts import Discovery
from .pairs import PairBuilder
from .plan import ShardTask

if TYPE_CHECKING:
    from .staging import RemoteSource

log = logging.getLogger(__name__)
#: lost object ids a manifest lists at most per split (their count is always exact)
MAX_LOST_LISTED = 100
#: the fix for an image too large to rasterise whole under ``--tile`` (only mask images are tiled window by window)
ANNOTATED_TILE_FIX = ("raise --max-pixels if memory allows the whole image, or export label images (a tiled TIFF "
                      "label is tiled window by window)")
#: sources whose shapes lie wholly in their annotation files: the ones read from object storage (the others'
#: workers read label-side files — panoptic PNGs, instance masks — which are not fetched)
REMOTE_SOURCES = ("coco", "cvat", "labelme")
#: split → sample key → its shapes
Shapes = dict[str, dict[str, SampleShapes]]


@dataclass(frozen=True)
class AnnotationRun:
    """What a worker needs to rasterise: the source's name and the policies (the table is the decoder's)."""

    source: str
    policies: Policies


def find_annotations(cfg: ConvertConfig, discover: Callable[[], Discovery], remote: RemoteSource | None = None,
                     ) -> Discovery | tuple[Discovery, TableChoice, AnnotationRun, Shapes]:
    """The annotation source to convert from, read once — or, to convert mask images, what ``discover`` found
    (discovery runs once either way).

    ``--annotations SOURCE[:PATH]`` forces one; otherwise a source is looked for only when no mask layout fits
    (``discover`` raises LayoutError), and more than one found is a one-line refusal naming them. ``remote``: the
    input is on object storage (``cfg.input`` its listing's skeleton): its annotation files are fetched before a
    source is looked for, and image sizes come from the objects' first bytes."""
    root = Path(cfg.input).expanduser().resolve()
    if cfg.annotations is not None and cfg.annotations.strip().lower() == "none":
        return discover()
    if cfg.annotations is not None:
        cls, where = registry.parse(cfg.annotations)
        if remote is not None:
            remote.fetch_annotations()
        if where is not None and not where.is_absolute():
            local = Path.cwd() / where
            where = local if local.exists() and remote is None else root / where  # remote: relative to the URL
        where = where.resolve() if where is not None else cls().detect(root)
        if where is None or not where.exists():
            raise LayoutError(f"no {cls.name} annotations found", path=where or root,
                              fix=f"expected {cls.expected}; or pass --annotations {cls.name}:PATH")
    else:
        try:
            return discover()
        except LayoutError as exc:
            if not root.is_dir():
                raise
            if remote is not None:
                remote.fetch_annotations()
            candidates = registry.detect(root)
            if not candidates:
                raise
            if len(candidates) > 1:
                named = ", ".join(f"{c.name} ({w})" for c, w in candidates)
                raise LayoutError(f"no mask layout fits, and annotations of more than one kind are here: {named}",
                                  path=root, fix=f"choose one with --annotations {candidates[0][0].name}:PATH"
                                  ) from exc
            cls, where = candidates[0]
            log.info("%s: no mask layout fits; labels from %s annotations in %s", root, cls.name, where)
    if remote is not None and cls.name not in REMOTE_SOURCES:
        raise ConfigError(f"{cls.name} annotations are not read from object storage yet (the workers would read its "
                          "label files, which are not fetched)", path=remote.remote.url,
                          fix=f"copy the dataset to a local folder and convert that (object storage reads "
                              f"{', '.join(REMOTE_SOURCES)} annotations)")
    source = cls()
    notes = source.read(root, where)
    overlap = cfg.object_overlap or source.overlap
    crowd = cfg.crowd or source.crowd
    if overlap not in source.overlaps:
        raise ConfigError(f"--object-overlap {overlap}: {cls.name} objects have no such order",
                          fix=f"choose one of {', '.join(source.overlaps)}")
    if (overlap == "ignore" or crowd == "ignore") and notes.table.ignore_index is None:
        raise ConfigError(f"{cls.name}: the table has {notes.table.num_classes} classes, no id is left for ignore",
                          fix="pass --object-overlap order and --crowd class (or drop)")
    said = [f"{name} {value}{'' if given is None else ' (asked for)'}"
            for name, value, given in (("overlap", overlap, cfg.object_overlap), ("crowd", crowd, cfg.crowd))]
    log.info("annotations: %s in %s; class table from %s; %s (defaults: %s)", cls.name, where, notes.table_origin,
             ", ".join(said), source.tool_rule,
             extra={"event": "annotations", "source": cls.name, "overlap": overlap, "crowd": crowd})
    policies = Policies(overlap, crowd, cfg.on_lost_object)
    _check_sizes(notes, cfg.splits, cfg.max_pixels if cfg.tiling is not None else None,
                 read_image_size if remote is None else remote.header_size)
    found = _discovery(notes, policies, source.tool_rule, cfg.splits)
    shapes = {s: {sh.key: sh for _, sh in notes.splits[s]} for s in found.splits}
    return found, TableChoice(notes.table, notes.table_origin), AnnotationRun(cls.name, policies), shapes


def _check_sizes(notes: Annotations, splits: Sequence[str], tiled_max_pixels: int | None,
                 size_of: Callable[[Path], tuple[int, int]]) -> None:
    """Every image's header against the size the annotations give it, before anything is written: a mismatch
    (shapes drawn for another image) is one line naming the image. ``tiled_max_pixels`` (``--tile``): an image
    above it, which ``--tile`` would read window by window, is refused too (shapes are drawn at the whole image's
    size)."""
    for split, samples in notes.splits.items():
        if splits and split not in splits:
            continue
        with ThreadPoolExecutor(max_workers=8) as pool:
            got = list(pool.map(functools.partial(_image_size, size_of=size_of), samples))
        for (image, sample), hw in zip(samples, got, strict=True):
            if hw != (sample.height, sample.width):
                raise LabelError(f"the annotations give this image as {sample.height}x{sample.width} (HxW); it is "
                                 f"{hw[0]}x{hw[1]}", path=image,
                                 fix="correct its height/width in the annotation file (or use the image it was "
                                     "annotated on)")
            if tiled_max_pixels is not None and hw[0] * hw[1] > tiled_max_pixels:
                raise ConfigError(f"image is {hw[0]}x{hw[1]} = {hw[0] * hw[1]} pixels, more than --max-pixels "
                                  f"{tiled_max_pixels}: --tile would read it window by window, and annotation "
                                  "shapes are drawn at the whole image's size", path=image, fix=ANNOTATED_TILE_FIX)


def _image_size(item: tuple[Path, SampleShapes], size_of: Callable[[Path], tuple[int, int]]) -> tuple[int, int]:
    """(H, W) from the image file's header (``size_of``), or from the header of the image the annotation file
    embeds."""
    image, sample = item
    if sample.embedded:
        try:
            header = read_header(image, "image", np.frombuffer(sample.embedded, np.uint8))
        except DecodeError as exc:
            problem = exc.problem.removeprefix(f"{exc.path}: ")
            raise LabelError(f"its embedded imageData (no image file lies beside it): {problem}", path=image,
                             fix="put the image file beside the JSON, or save the JSON again with its image in "
                                 "labelme") from None
        return header.height, header.width
    return size_of(image)


def embedded_images(found: Discovery, shapes: Shapes) -> dict[str, bytes]:
    """Image path (then the annotation file) → the image bytes it embeds, for the samples without an image file
    (labelme's imageData): the parent reads their headers and the first image from these bytes."""
    out = {}
    for split, pairs in found.splits.items():
        for i in range(len(pairs)):
            sample = shapes[split][pairs.keys[i]]
            if sample.embedded:
                out[str(pairs.path(i, 0))] = sample.embedded
    return out


def size_with_embedded(header_size: Callable[[Path], tuple[int, int]], embedded: dict[str, bytes]
                       ) -> Callable[[Path], tuple[int, int]]:
    """``header_size`` answering from the embedded image's header for the paths in ``embedded``."""
    if not embedded:
        return header_size

    def size(path: Path) -> tuple[int, int]:
        raw = embedded.get(str(path))
        if raw is None:
            return header_size(path)
        header = read_header(path, "image", np.frombuffer(raw, np.uint8))
        return header.height, header.width

    return size


def _discovery(notes: Annotations, policies: Policies, rule: str, splits: Sequence[str]) -> Discovery:
    """The annotations' samples as a :class:`Discovery` of pairs without label files."""
    unknown = [s for s in splits if s not in notes.splits]
    if unknown:
        raise ConfigError(f"unknown split {', '.join(unknown)}", fix=f"choose from {', '.join(notes.splits)}")
    tables = {}
    for split, samples in notes.splits.items():
        if splits and split not in splits:
            continue
        builder = PairBuilder(notes.root)
        for image, sample in samples:  # the key is the image file's, also when the annotation file embeds it
            builder.add(sample.key, str(image), None)
        tables[split] = builder.build()
    meta = {"source": notes.source, "files": [f.relative_to(notes.root).as_posix() if f.is_relative_to(notes.root)
                                              else str(f) for f in notes.files],
            "digest": notes.digest, "classes_from": notes.table_origin, "original_ids": list(notes.original_ids),
            "overlap": policies.overlap, "crowd": policies.crowd, "on_lost_object": policies.on_lost_object,
            "tool_rule": rule}
    return Discovery(notes.source, notes.root, tables, "ids", None, {}, {}, {}, meta)


def settings_of(found: Discovery) -> dict[str, Any]:
    """What the shards' settings digest takes of the annotations (``{}`` for mask images): all the manifest records
    but the files' digest — each sample's own shapes go into its fingerprint instead (:func:`with_shapes`), so an
    edit re-converts only the shards of the samples it changed."""
    if found.annotations is None:
        return {}
    return {"annotations": {k: v for k, v in found.annotations.items() if k != "digest"}}


def with_shapes(fingerprint: bytes, sample: SampleShapes) -> bytes:
    """A pair's fingerprint (its image file's) with the shapes its labels are drawn from
    (:func:`~shardkit.labels.sources.base.sample_digest`)."""
    return hashlib.sha256(b"shapes\0" + fingerprint + sample_digest(sample)).digest()


def fold_fingerprints(rows: np.ndarray, pairs: Any, shapes: dict[str, SampleShapes]) -> np.ndarray:
    """A split's (n, 32) fingerprint rows, each with its sample's shapes (:func:`with_shapes`)."""
    out = bytearray()
    for i, pair in enumerate(pairs):
        out += with_shapes(rows[i].tobytes(), shapes[pair.key])
    return np.frombuffer(bytes(out), np.uint8).reshape(-1, 32)


def attach(tasks: list[ShardTask], shapes: Shapes) -> list[ShardTask]:
    """Each task with its own samples' shapes (only those: a task pickles nothing of other shards)."""
    return [dataclasses.replace(t, shapes=tuple(shapes[t.split][p.key] for p in t.samples)) for t in tasks]


def rasterise_sample(run: AnnotationRun, sample: SampleShapes, image: np.ndarray, table: ClassTable,
                     path: Path, report: RasterReport) -> np.ndarray:
    """The sample's ids at the decoded image's size; the report merged into ``report``; lost objects refused
    with ``--on-lost-object error``."""
    try:
        ids, got = rasterise(registry.get(run.source)(), sample, int(image.shape[0]), int(image.shape[1]), table,
                             run.policies)
    except LabelError as exc:
        raise LabelError(exc.problem, path=path, fix=exc.fix) from None
    if got.lost and run.policies.on_lost_object == "error":
        raise LabelError(f"{len(got.lost)} object(s) have no visible pixel ({', '.join(got.lost[:5])}) under "
                         f"--object-overlap {run.policies.overlap}", path=path,
                         fix="pass --on-lost-object warn (they are then listed in the manifest), or another "
                             "--object-overlap (area puts smaller objects on top)")
    report.merge(got)
    return ids


def split_report(records: Sequence[ShardRecord], found: Discovery) -> dict[str, Any]:
    """``{"annotations": {...}}`` for the split's manifest: what was read and the report summed over its
    shards; ``{}`` for mask images."""
    if found.annotations is None:
        return {}
    total = RasterReport()
    lost: list[str] = []
    lost_count = 0
    for r in records:
        got = r.stats.get("raster")
        if not got:
            continue
        for name in ("samples", "objects", "pixels", "painted_over", "overlap_ignored", "crowd_pixels",
                     "unlabelled", "clipped", "degenerate"):
            setattr(total, name, getattr(total, name) + int(got.get(name, 0)))
        lost_count += int(got.get("lost_objects", 0))
        lost += [str(i) for i in got.get("lost_ids", [])]
    report = total.to_json()
    report["lost_objects"] = lost_count
    report["lost_ids"] = lost[:MAX_LOST_LISTED]
    if lost_count:
        log.warning("%d annotation object(s) have no visible pixel (first: %s); listed in the manifest",
                    lost_count, ", ".join(lost[:5]))
    return {"annotations": {**found.annotations, "report": report}}
