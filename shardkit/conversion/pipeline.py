"""One conversion end to end: discover → plan → pool → rename shards → manifest (last).

The parent never touches pixels. For each split, shards are renamed into place only
after every shard of the run succeeded, and the manifest — the commit marker — is
written after them, atomically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .._version import __version__
from ..errors import ConfigError, DecodeError, DuplicateError, InputNotFoundError, OutputError
from ..files.samples import PIXEL_HASH_BYTES, SampleTable, read_sidecar, split_fingerprint
from ..files.splitfiles import Preprocessing, ShardInfo, Source, SplitStats
from ..formats.base import SampleSpec
from ..formats.registry import get
from ..images.imageio import georeference, image_layout, label_palette, read_header
from ..images.imagetypes import NAME_OF
from ..images.preprocess import fixed_size
from ..images.tiles import TileCounts, untiled_source
from ..labels import ClassTable, LabelDecoder
from ..labels.builtin import with_palette_colours
from ..labels.idscan import SCAN_CACHE, ScanCache, scan_table
from ..labels.policy import TableChoice, choose_class_table
from ..labels.values import REDUCE_ZERO_IGNORE, ignore_warning
from ..store.duplicates import (
    Drops,
    DuplicateReport,
    ShardHashes,
    drops,
    find_duplicates,
    log_report,
    row_keys,
    source_hashes,
)
from ..store.groups import compile_group_pattern, key_group
from ..store.manifest import Manifest, manifest_version_for
from ..store.publish import remove_temps
from ..store.records import ShardRecord
from ..store.splitdir import CACHE_NAME, LocalSink, SplitSink, has_records, publish_shard
from ..store.stats import Stats
from .annotated import (
    Shapes,
    attach,
    embedded_images,
    find_annotations,
    fold_fingerprints,
    size_with_embedded,
    split_report,
)
from .annotated import settings_of as annotation_settings
from .config import ConvertConfig
from .fingerprint import SourceCache, input_identities, load_cache, save_cache
from .layouts import Discovery, discover, file_types, layout_ignore, layout_table, with_colour_table
from .pairs import PairTable
from .plan import ShardTask, checked_tiling, plan_split, settings_text
from .pool import run_tasks
from .staging import StorageSession
from .volumes import VolumeJob, fold_case_files, slice_counts, volume_image_layout, volume_job, volume_report
from .volumes import check_options as check_volume_options
from .worker import ShardResult, WorkerContext

log = logging.getLogger(__name__)


@dataclass
class ConvertSummary:
    """What a run did, for the CLI's last line and for callers."""

    discovery: Discovery
    table: ClassTable
    dry_run: bool
    table_reason: str = ""  # where the class table came from, in words (every run logs it)
    samples: int = 0
    shards: int = 0
    bytes: int = 0
    seconds: float = 0.0
    reused: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    manifests: list[Path | str] = field(default_factory=list)  # a URL where the output is on object storage
    duplicates: DuplicateReport | None = None  # identical images within and across the converted splits
    published: dict[str, int] = field(default_factory=dict)  # split → the version this run published (new ones)
    #: what failed after a version was published (a full disk writing the fingerprint cache or the no-op
    #: signature), one line each: the version is complete and readable, the run still reports it (CLI exit 5)
    warnings: list[str] = field(default_factory=list)

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def failed(self) -> list[dict[str, str]]:
        """The inputs left out for an error (``--on-error skip``); duplicates left out as asked are no failure."""
        return [s for s in self.skipped if "duplicate_of" not in s]

    def versions(self) -> str:
        """``"val version 3, train version 2"``: the versions this run published."""
        return ", ".join(f"{split} version {n}" for split, n in self.published.items())

    def line(self) -> str:
        if self.dry_run:
            return f"dry run: {self.discovery.total()} pairs found, nothing written"
        failed = self.failed
        dropped = len(self.skipped) - len(failed)
        dupes = "" if self.duplicates is None else f"; {self.duplicates.line()}" + (
            f" ({dropped} left out: --on-duplicate skip)" if dropped else "")
        if self.shards and self.reused == self.shards and not failed:  # nothing was decoded: no rate
            if self.published:  # e.g. an input edited and then reverted: an earlier version's shards, a new version
                return (f"published {self.versions()} from {self.shards} shards kept from earlier runs (none "
                        f"written): {self.samples} samples, {self.bytes / 1e6:.1f} MB, in {self.seconds:.1f} s{dupes}")
            return (f"nothing changed: {self.samples} samples in {self.shards} shards reused unchanged, "
                    f"{self.bytes / 1e6:.1f} MB, checked in {self.seconds:.1f} s{dupes}")
        return (
            f"converted {self.samples} samples into {self.shards} shards, {self.bytes / 1e6:.1f} MB, "
            f"in {self.seconds:.1f} s ({self.samples_per_second:.1f} samples/s)"
            + (f"; {self.reused} shards reused unchanged" if self.reused else "")
            + (f"; {len(failed)} inputs skipped" if failed else "")
            + (f"; not read (file type): {file_types(self.discovery.skipped_types)}"
               if self.discovery.skipped_types else "")
            + dupes
        )


def sample_spec(cfg: ConvertConfig, table: ClassTable,
                image: tuple[str, int, str] = ("|u1", 3, "RGB")) -> SampleSpec:
    """What every stored sample of this conversion looks like (its size, when one size fits all; ``image``: its
    images' dtype, bands and channel kind, from :func:`image_layout_of`)."""
    size = cfg.tiling.tile if cfg.tiling is not None else fixed_size(cfg.size, cfg.resize, cfg.crop)
    return SampleSpec(size, cfg.label_encoding, table.num_classes, table.label_dtype().str, *image)


def image_layout_of(cfg: ConvertConfig, found: Discovery, session: StorageSession,
                    embedded: dict[str, bytes] | None = None) -> tuple[tuple[str, int, str], bool]:
    """The image dtype, bands and channel kind of the conversion, and whether its images are georeferenced,
    from its first image (in plan order, decoded as a worker would): every other image must match it (each is
    checked as it is converted). Logged, since it is what shardkit concluded."""
    images = (p for pairs in found.splits.values() for i in range(len(pairs)) if (p := pairs.path(i, 0)))
    for first in images:
        with tempfile.TemporaryDirectory(prefix="shardkit-probe-") as tmp:
            path = Path(first)
            try:
                if session.source is not None:  # on object storage: fetch that one file
                    local = Path(tmp) / path.name
                    session.source.remote.download(session.source.rel(path), local)
                    path = local
                if cfg.tiling is not None and (head := read_header(path)).pixels > cfg.max_pixels \
                        and head.kind != "TIFF":
                    raise untiled_source(Path(first), head.kind, head.height, head.width, cfg.max_pixels)
                raw = (embedded or {}).get(first)  # an image its annotation file holds: those bytes
                layout = image_layout(path, cfg.image_options, cfg.max_pixels, windowed=cfg.tiling is not None,
                                      data=None if raw is None else np.frombuffer(raw, np.uint8))
            except (DecodeError, InputNotFoundError):
                if cfg.on_error != "skip":
                    raise
                continue  # --on-error skip: its worker skips it too; the next image decides
            geo = georeference(path) is not None
        break
    else:
        return ("|u1", 3, "RGB"), False  # no image decodes (every one is skipped): nothing is stored
    dtype, bands, kind = layout
    log.info("images: %s, %d band%s (%s), as the first image %s %s", NAME_OF[dtype], bands, "s" * (bands != 1),
             kind, Path(first).name, "is stored" if cfg.image_options.default else "is converted as asked",
             extra={"event": "images", "dtype": NAME_OF[dtype], "bands": bands, "channels": kind})
    if geo:
        log.info("images are GeoTIFFs: each sample's CRS and transform are kept in the samples sidecars")
    return layout, geo


def check_output(cfg: ConvertConfig) -> None:
    """Refuse an output folder inside the input (it would be discovered next time) or that is a file."""
    src, out = cfg.input.resolve(), cfg.output.resolve()
    if out == src or out.is_relative_to(src):
        raise OutputError(
            "the output folder is inside the input folder", path=out,
            fix="choose an output folder outside the dataset, e.g. next to it",
        )
    if out.exists() and not out.is_dir():
        raise OutputError("the output path exists and is not a folder", path=out, fix="choose another output path")


def convert(cfg: ConvertConfig, *, published: Callable[[ConvertSummary], None] | None = None) -> ConvertSummary:
    """Run one conversion as configured; raises a ShardkitError on anything a user must fix.

    Inputs and outputs on object storage (``cfg.input_url`` / ``cfg.output_url``) are staged through
    local folders by :class:`~shardkit.conversion.staging.StorageSession`; local folders are used as they are.
    ``published``: called with the summary once every split is published, while the run still holds the output
    lock (the CLI writes its no-op signature there, so no other run can change the output in between); an
    exception from it fails the run.
    """
    if cfg.input_url is None and cfg.output_url is None:
        return _convert(cfg, StorageSession(cfg), published)
    with StorageSession(cfg) as session:
        return _convert(session.cfg, session, published)


class _Labelled(NamedTuple):
    """What a run's labels are: the pairs found, the class table chosen (and why) with palette labels' colours,
    and for an annotation file its run and shapes and the images it embeds (image path → bytes: labelme)."""

    found: Discovery
    choice: TableChoice
    table: ClassTable
    run: Any
    shapes: Shapes | None
    embedded: dict[str, bytes]


def _labels(cfg: ConvertConfig, session: StorageSession, scans: list[ScanCache]) -> _Labelled:
    """Find the input's pairs and choose their class table (logged): mask images discovered and their table
    chosen (the label scans made go to ``scans``), or an annotation file's shapes and its own table."""
    def find() -> Discovery:
        found = discover(cfg.input, layout=cfg.layout, label_suffix=cfg.label_suffix, splits=cfg.splits,
                         strict=cfg.strict, images=cfg.images, labels=cfg.labels, split_lists=dict(cfg.split_lists),
                         on_error=cfg.on_error)
        return with_colour_table(found, cfg.class_dict or cfg.palette)

    looked = find_annotations(cfg, find, session.source)
    run = shapes = None
    embedded: dict[str, bytes] = {}  # image path → the bytes of an image the annotation file holds (labelme)
    if isinstance(looked, Discovery):  # mask images
        found = looked
        if found.layout in ("case-folders", "case-templates") and cfg.num_classes is None and cfg.classes is None:
            raise ConfigError("per-case volume folders carry no class table (nor do volume templates), and label "
                              "volumes are not scanned for their ids", path=found.root,
                              fix="pass --num-classes N (ids 0..N-1) or --classes FILE")
        choice = class_table(cfg, found, remote=session.source is not None, scans=scans)
    else:  # labels drawn from shapes: the table is the annotation file's
        found, choice, run, shapes = looked
        embedded = embedded_images(found, shapes)
    choice = cfg.value_map.adapt(choice)  # the ignore id --reduce-zero-label adds is in the logged line too
    table = choice.table
    if found.label_kind in ("ids", "palette"):  # palette labels' own colours draw them in `show` (header only)
        first = next((p for pairs in found.splits.values() if len(pairs) and (p := pairs.path(0, 1))), None)
        table = with_palette_colours(table, label_palette(Path(first)) if first else None)
    log.info("%s", choice.line(), extra={"event": "class_table", "source": table.source, "reason": choice.reason,
                                         "num_classes": table.num_classes, "ignore_index": table.ignore_index})
    return _Labelled(found, choice, table, run, shapes, embedded)


def _convert(cfg: ConvertConfig, session: StorageSession,
             published: Callable[[ConvertSummary], None] | None = None) -> ConvertSummary:
    started = time.perf_counter()
    values = cfg.value_map
    scans: list[ScanCache] = []
    found, choice, table, run, shapes, embedded = _labels(cfg, session, scans)
    annotated = shapes is not None
    decoder = LabelDecoder(found.label_kind, table, cfg.colour_tolerance, cfg.unknown_as, values)
    job = volume_job(found.layout, found.root, cfg.slicing, cfg.modalities, cfg.max_voxels,
                     tuple(range(table.num_classes)) + (() if table.ignore_index is None else (table.ignore_index,)),
                     cfg.volume_flags(), cfg.resampling, table.ignore_index, (cfg.images, cfg.labels))
    if job is not None:
        check_volume_options(cfg)
    _check_groups(cfg, found)
    summary = ConvertSummary(found, table, cfg.dry_run, choice.reason)
    if cfg.dry_run:  # the caller (the CLI) prints the report itself
        if job is not None and job.resampling is not None:
            log.info("volumes: %s", job.resampling.describe())
        return summary
    for line in found.report_lines():
        log.info("%s", line)
    check_output(cfg)
    if cfg.drop_tiles_ignored is not None and table.ignore_index is None:
        raise ConfigError(f"--drop-tiles-ignored {cfg.drop_tiles_ignored} drops tiles of ignore pixels, but the class "
                          "table has no ignore index", fix="pass --ignore-index ID")
    # refuses what no split may store (limits) first
    layout, georef = ((volume_image_layout(found, job, cfg.on_error), False) if job
                      else image_layout_of(cfg, found, session, embedded))
    spec = sample_spec(cfg, table, layout)
    if job is not None and job.patch_size is not None:  # 3-D patches: one size, stored as (D * H, W)
        d, h, w = job.patch_size
        spec = dataclasses.replace(spec, size=(d * h, w), depth=d)
    options = cfg.preprocessing()
    # The manifest records what took effect: the Cityscapes id remap only means something for Cityscapes.
    # (Fingerprints keep hashing the options as given, so existing shard names stay valid.)
    recorded = options | ({} if found.layout == "cityscapes" else {"cityscapes_train_ids": None})
    fmt = get(cfg.format)
    fmt.check_image(spec, cfg.codecs)
    if scans:  # written only once the images are known storable: a refused run leaves nothing behind
        cfg.output.mkdir(parents=True, exist_ok=True)
        for scan in scans:
            scan.save()
    settings = _settings(cfg, fmt, spec, table, options, found, georef, job)
    ctx = WorkerContext.from_config(cfg, spec=spec, decoder=decoder, root=found.root.resolve(),
                                    sync_files=cfg.backend == "dask", source=session.source,
                                    settings=settings_text(settings), image=cfg.image_options,
                                    georef=georef, annotations=run if annotated else None, volumes=job)
    run_facts = _Run(cfg, session, found, table, spec, fmt, recorded, georef, job, shapes, settings, ctx)
    return _write_and_publish(run_facts, embedded, summary, published, started)


@dataclass(frozen=True)
class _Run:
    """What a run writes, fixed before its first shard: the input found, its class table, the sample spec and
    format, the preprocessing the manifest records, the settings every shard key hashes, every worker's context."""

    cfg: ConvertConfig
    session: StorageSession
    found: Discovery
    table: ClassTable
    spec: SampleSpec
    fmt: Any
    recorded: dict[str, Any]
    georef: bool
    job: VolumeJob | None
    shapes: Shapes | None
    settings: dict[str, Any]
    ctx: WorkerContext


def _check_groups(cfg: ConvertConfig, found: Discovery) -> None:
    """With ``--group-by``, every key must name its group, before anything is written."""
    if cfg.group_by is not None:
        pattern = compile_group_pattern(cfg.group_by)
        for pairs in found.splits.values():
            for i in range(len(pairs)):
                key_group(pattern, pairs.keys[i])


def _settings(cfg: ConvertConfig, fmt: Any, spec: SampleSpec, table: ClassTable, options: dict[str, Any],
              found: Discovery, georef: bool, job: VolumeJob | None) -> dict[str, Any]:
    """What every shard's key hashes besides its inputs: the format and its version, the sample spec, the class
    table, the preprocessing as given, the error policy, annotation, georeference and volume settings."""
    return {"format": cfg.format, "format_version": fmt.version_for(cfg.compression, cfg.codecs, spec),
            "sample": spec.to_manifest(),
            "classes": table.to_json(), "preprocessing": options, "on_error": cfg.on_error,
            **annotation_settings(found),
            **({"georeference": True} if georef else {}),
            **({"volumes": job.to_json()} if job is not None else {})}


def _write_and_publish(run: _Run, embedded: dict[str, bytes], summary: ConvertSummary,
           published: Callable[[ConvertSummary], None] | None, started: float) -> ConvertSummary:
    """Plan the shards, write those not reused, rewrite those that hold duplicates to drop, publish every split
    (under the output lock) and log the run's summary."""
    cfg, session, found = run.cfg, run.session, run.found
    log.info("convert %s → %s as %s", session.input_name, session.output_name, cfg.format,
             extra={"event": "start", "input": session.input_name, "output": session.output_name,
                    "format": cfg.format, "workers": cfg.effective_workers(), "backend": cfg.backend})
    header_size = _header_size(cfg, found, session, embedded, run.spec)
    digest = hashlib.sha256(settings_text(run.settings).encode()).hexdigest()
    with session.lock(), contextlib.ExitStack() as stack:
        tasks, reused, caches = _plan(cfg, found, run.spec, run.settings, digest, session, header_size, run.shapes,
                                      run.job)
        if run.shapes is not None:
            tasks = attach(tasks, run.shapes)
        for cache in caches.values():
            stack.callback(cache.close)
        todo = [t for t in tasks if (t.split, t.index) not in reused]
        log.info("%d shards planned, %d reused, %d to write, %d workers", len(tasks), len(reused), len(todo),
                 min(cfg.effective_workers(), max(len(todo), 1)))
        shards = _ShardWriting(run, tasks, reused, caches)
        shards.write(todo, {})
        rewritten = 0
        if run.job is None and (cfg.tiling is None or cfg.tiling.drop_ignored is None):  # tiled: by sources' hashes
            summary.duplicates, rewritten = _duplicates(cfg, found, tasks, reused, shards.pixels, run.spec, session,
                                                        shards.write)
        if shards.padded and run.table.ignore_index is None:
            log.warning("%d samples were smaller than %s and their labels were padded with class 0, which "
                        "losses will count as real pixels: pass --ignore-index ID to pad with an ignore id",
                        shards.padded, "the tile" if cfg.tiling is not None else "--size")
        for split, pairs in found.splits.items():
            _publish(run, summary, split, pairs, [reused[(t.split, t.index)] for t in tasks if t.split == split],
                     caches[split])
        if published is not None:
            _after_publish(summary, cfg.output, f"{summary.versions()} published" if summary.published
                           else "the published versions are unchanged", partial(published, summary),
                           "the next run takes the normal path, not the no-op check")
    summary.reused = len(tasks) - len(todo) - rewritten
    summary.seconds = time.perf_counter() - started
    _log_summary(summary)
    return summary


def _header_size(cfg: ConvertConfig, found: Discovery, session: StorageSession, embedded: dict[str, bytes],
                 spec: SampleSpec) -> Callable[[Path], tuple[int, int]]:
    """How the planner reads an input's size from its header (an embedded image's from its bytes); when tiling,
    each source's tiles are estimated from it now, before anything is written."""
    header_size = size_with_embedded(session.header_size, embedded)
    if cfg.tiling is not None:
        header_size = checked_tiling(cfg.tiling, (Path(p) for pairs in found.splits.values()
                                                  for i in range(len(pairs)) if (p := pairs.path(i, 0))),
                                     header_size, float(cfg.max_tile_ratio), spec.sample_nbytes(cfg.tiling.tile))
    return header_size


class _ShardWriting:
    """Runs shard tasks on the pool (:meth:`write`) and publishes each shard as a worker finishes it
    (:meth:`publish_shard`): its files renamed into place and recorded in ``reused``, its sources' cache entries
    moved to the split's cache, its padded samples counted and its pixel hashes kept for the duplicate check."""

    def __init__(self, run: _Run, tasks: list[ShardTask], reused: dict[tuple[str, int], ShardRecord],
                 caches: dict[str, SourceCache]) -> None:
        self.run, self.session, self.reused, self.caches = run, run.session, reused, caches
        self.starts = {(t.split, t.index): t.start for t in tasks}
        self.padded = 0
        self.pixels: dict[tuple[str, int], bytes] = {}  # each new shard's pixel hashes, for the duplicate check

    def publish_shard(self, result: ShardResult) -> None:
        self.padded += result.padded
        self.pixels[(result.split, result.index)] = result.pixels
        result.pixels = b""
        record = publish_files(result)
        self.session.sink.shard_published(result.directory, record)
        self.reused[(result.split, result.index)] = record
        if result.sources is not None:  # cache entries of the files the worker hashed: moved to the cache
            self.caches[result.split].put(self.starts[(result.split, result.index)], result.sources)
            self.caches[result.split].changed = True
            result.sources = None  # (run_tasks keeps every result until the end)
        log.info("%s shard %s: %d samples", result.split, result.index, record.num_samples,
                 extra={"event": "shard_done", "split": result.split, "shard": result.index,
                        "samples": record.num_samples, "bytes": sum(f.bytes for f in record.files),
                        "files": [f.name for f in record.files]})
        for s in record.skipped:
            log.warning("skipped %s: %s", s["key"], s["reason"],
                        extra={"event": "skipped", "split": result.split, "key": s["key"], "reason": s["reason"]})

    def write(self, shards: list[ShardTask], drop: Drops) -> None:
        cfg = self.run.cfg
        try:
            run_tasks(shards, dataclasses.replace(self.run.ctx, drop=tuple((s, k, *v) for (s, k), v in drop.items())),
                      workers=cfg.effective_workers(), quiet=cfg.quiet, on_result=self.publish_shard,
                      isolate=self.run.fmt.writer.needs_subprocess, backend=cfg.backend, scheduler=cfg.scheduler)
        except BaseException:
            for split in self.run.found.splits:
                remove_temps(cfg.output / split)
            raise


def _publish(run: _Run, summary: ConvertSummary, split: str, pairs: PairTable, records: list[ShardRecord],
             cache: SourceCache) -> None:
    """Publish ``split`` from its shard ``records`` (its manifest), save its fingerprint cache (a warning if that
    fails: the version is published), let the sink commit it, and add it to ``summary``."""
    cfg, session = run.cfg, run.session
    try:
        path, number, new = publish_split(cfg, split, pairs, records, run.found, run.table, run.spec, run.recorded,
                                          run.fmt, source_root=session.input_name, sink=session.sink,
                                          georef=run.georef)
    except OSError as exc:
        raise _not_published(exc, split, summary) from None
    if new:
        summary.published[split] = number
    save = partial(save_cache, cfg.output / split, pairs, cache)
    if isinstance(session.sink, LocalSink):  # committed by publish_split: its cache is for the next run only
        _after_publish(summary, cfg.output / split / CACHE_NAME, f"{split} version {number} is published",
                       save, "the next run hashes every input of the split again")
    else:  # object storage: committed by the sink below
        save()
    session.sink.committed(cfg.output / split, records, cfg.keep_versions)
    where = session.sink.location(split, path)  # the URL when the output is on object storage
    log.info("%s: %d samples in %d shards → %s", split, sum(r.num_samples for r in records), len(records), where)
    summary.manifests.append(where)
    summary.samples += sum(r.num_samples for r in records)
    summary.shards += len(records)
    summary.bytes += sum(f.bytes for r in records for f in r.files)
    summary.skipped += [s for r in records for s in r.skipped]


def _log_summary(summary: ConvertSummary) -> None:
    """The run's last line, with its numbers as structured fields."""
    log.info("%s", summary.line(), extra={
        "event": "summary", "samples": summary.samples, "shards": summary.shards, "reused_shards": summary.reused,
        "bytes": summary.bytes, "seconds": round(summary.seconds, 3),
        "samples_per_second": round(summary.samples_per_second, 2), "skipped": len(summary.skipped),
        "duplicates": summary.duplicates.extra_copies if summary.duplicates is not None else 0,
        "published": summary.published, "warnings": len(summary.warnings)})


def _after_publish(summary: ConvertSummary, what: Path, state: str, step: Callable[[], None], lost: str) -> None:
    """Run a step that follows a publish (writing the fingerprint cache, the no-op signature): the version is
    complete and readable whatever happens here, so an I/O failure (a full disk) is a warning naming the file that
    was not written and the version that was published (``state``) and what the missing file costs (``lost``),
    kept in the run's :attr:`ConvertSummary.warnings`."""
    try:
        step()
    except OSError as exc:
        name = exc.filename or what
        line = (f"{name}: not written ({exc.strerror or exc}); {state}, complete and readable: only this "
                f"file is missing, so {lost} — fix: free disk space (nothing to re-run)")
        log.warning("%s", line, extra={"event": "not_written", "path": str(name)})
        summary.warnings.append(line)


def _not_published(exc: OSError, split: str, summary: ConvertSummary) -> OutputError:
    """A split whose publish failed (a full disk writing its manifest): one line naming the file, and the splits
    this run did publish before it (those are complete and stay)."""
    name = exc.filename or f"{split}/manifest.json"
    done = f"; {summary.versions()} published before it (complete, kept)" if summary.published else ""
    return OutputError(f"{name}: {exc.strerror or exc}: split {split} not published{done}",
                       fix="free disk space (or choose another output folder) and re-run; finished shards are kept "
                           "and reused")


def _duplicates(cfg: ConvertConfig, found: Discovery, tasks: list[ShardTask],
                records: dict[tuple[str, int], ShardRecord], pixels: dict[tuple[str, int], bytes], spec: SampleSpec,
                session: StorageSession,
                write: Callable[[list[ShardTask], Drops], None]) -> tuple[DuplicateReport, int]:
    """Find identical images across every converted split (plan order) and apply ``--on-duplicate``; returns the
    report and how many shards were written again.

    The check covers every sample of the input: those in the shards, and those an earlier ``skip`` run left out
    (their hashes are kept in the manifest's ``skipped`` entries). A shard is written again only where what it
    should leave out differs from what it left out: with ``skip`` the later copies, otherwise nothing (a ``warn``
    run after a ``skip`` run puts the copies back). ``error`` raises before any manifest is written; the shards
    stay, reusable.
    """
    report = find_duplicates(_shard_hashes(cfg, found, tasks, records, pixels, spec, session))
    if report.groups:
        log_report(report)
        if cfg.on_duplicate == "error":
            g = report.groups[0]
            raise DuplicateError(f"{report.extra_copies} image(s) have identical pixels to an earlier one "
                                 f"({report.across_splits} group(s) across splits), e.g. {g}",
                                 fix="remove the copies from the input, or convert with --on-duplicate skip "
                                     "(keeps the first copy) or warn")
    want = drops(report) if cfg.on_duplicate == "skip" else {}
    redo = [t for t in tasks if {s["key"] for s in records[(t.split, t.index)].skipped if "duplicate_of" in s}
            != ({k for k in _keys(t) if (t.split, k) in want} if want else set())]
    if redo:
        write(redo, want)
    return report, len(redo)


def _keys(task: ShardTask) -> Sequence[str]:
    """A task's sample keys, from its pairs' key column (no pair objects built: a no-op re-run asks every task)."""
    samples = task.samples
    return samples.keys if isinstance(samples, PairTable) else [p.key for p in samples]


def _shard_hashes(cfg: ConvertConfig, found: Discovery, tasks: list[ShardTask],
                  records: dict[tuple[str, int], ShardRecord], pixels: dict[tuple[str, int], bytes],
                  spec: SampleSpec, session: StorageSession) -> list[ShardHashes]:
    """Every shard's pixel hashes in plan order: from the worker (shards written now) or the sidecar (reused),
    with the samples an earlier ``skip`` run left out as duplicates put back in their places."""
    out: list[ShardHashes] = []
    for split in found.splits:
        first = 0
        for t in (t for t in tasks if t.split == split):
            record = records[(split, t.index)]
            shard = ShardInfo(t.index, record.num_samples, first, record.files[:-1], record.files[-1])
            raw = pixels.get((split, t.index))
            if raw is not None:
                hashes: np.ndarray | None = np.frombuffer(raw, np.uint8).reshape(-1, PIXEL_HASH_BYTES)
                skipped = {s["key"] for s in record.skipped}
                keys = [k for k in _keys(t) if k not in skipped]
            else:
                rows = _reused_sidecar(cfg.output / split, shard, spec, session)
                hashes = np.asarray(rows["pixels"]) if "pixels" in (rows.dtype.names or ()) else None
                keys = row_keys(rows)
                if cfg.tiling is not None and hashes is not None:  # one hash per source, from its tiles'
                    keys, hashes = source_hashes(rows)
            left_out = {s["key"]: s["pixels"] for s in record.skipped if "duplicate_of" in s and "pixels" in s}
            if left_out and hashes is not None:  # merged back in plan order
                have = dict(zip(keys, hashes, strict=True))
                keys = [k for k in _keys(t) if k in have or k in left_out]
                hashes = np.stack([have[k] if k in have else np.frombuffer(bytes.fromhex(left_out[k]), np.uint8)
                                   for k in keys]).reshape(-1, PIXEL_HASH_BYTES)
            out.append(ShardHashes(split, first, hashes, partial(list, keys)))
            first += len(keys)
    return out


def _reused_sidecar(directory: Path, shard: ShardInfo, spec: SampleSpec, session: StorageSession) -> np.ndarray:
    """The checked sidecar rows of a reused shard: in the split folder, or fetched from the object store."""
    with session.sink.sidecar_folder(directory, shard) as folder:
        return read_sidecar(folder, shard, spec.num_classes, spec.size)


def class_table(cfg: ConvertConfig, found: Discovery, *, remote: bool = False,
                scans: list[ScanCache] | None = None) -> TableChoice:
    """The conversion's class table and where it came from (labels/policy.py has the rule); the label values
    are scanned only when nothing else gives the classes, and not on object storage (no local label files).
    A scan's cache (:class:`~shardkit.labels.idscan.ScanCache`) is appended to ``scans``, for the caller to save."""
    scans = [] if scans is None else scans
    values = cfg.value_map
    # the layout's format's own ignore id (VOC's 255 border), where neither the user nor a value map speaks
    convention = layout_ignore(found) if cfg.ignore_index is None and not values.active else None

    def with_convention(choice: TableChoice, scanned: bool = False) -> TableChoice:
        """``choice`` with the layout's ignore id when it has none (a scan was given it) and that id is no class
        of it, said in its reason."""
        if convention is None or convention[0] < choice.table.num_classes \
                or choice.table.ignore_index != (convention[0] if scanned else None):
            return choice
        return TableChoice(choice.table.with_ignore_index(convention[0]),
                           f"{choice.reason}; ignore id {convention[0]} from {convention[1]}: pass --ignore-index "
                           "to choose another")

    def scan(ignore_index: int | None) -> TableChoice:
        if remote:
            raise ConfigError(f"the {found.layout} layout does not identify the dataset, and label files on object "
                              "storage are not scanned for their ids", fix="pass --classes FILE or --num-classes N")
        paths = [name for pairs in found.splits.values() for i in range(len(pairs)) if (name := pairs.path(i, 1))]
        applied = ignore_index is None and convention is not None
        if convention is not None and applied:
            ignore_index = convention[0]
        if ignore_index is None and values.reduce_zero_label:
            ignore_index = REDUCE_ZERO_IGNORE  # what the map turns 0 into
        mapped = None if not values.active else partial(values.apply, ignore_index=ignore_index)
        identity = json.dumps([__version__, ignore_index, values.to_json(), cfg.max_pixels])
        cache = None if cfg.force or cfg.rehash else ScanCache.of(cfg.output / SCAN_CACHE, paths, identity)
        if cache is not None and not cfg.dry_run:
            scans.append(cache)  # saved once the output folder has been checked
        ids = scan_table(paths, ignore_index, max_pixels=cfg.max_pixels, threads=cfg.effective_workers(),
                         root=found.root, value_map=mapped, cache=cache)
        return with_convention(ids, scanned=True) if applied else ids

    default = layout_table(found, cityscapes_train_ids=cfg.cityscapes_train_ids)
    named = cfg.num_classes or cfg.classes or cfg.class_dict or cfg.palette or found.class_dict or default
    implied = None if named else values.implied_num_classes(cfg.ignore_index)
    choice = choose_class_table(
        found.label_kind, class_dict=cfg.class_dict or found.class_dict, palette=cfg.palette, classes=cfg.classes,
        num_classes=cfg.num_classes or implied, ignore_index=cfg.ignore_index, layout=found.layout, scan=scan,
        default=default,
    )
    if implied is not None:  # the value map states the classes (2 for a threshold): say so, not "--num-classes"
        choice = TableChoice(replace(choice.table, source=values.describe()),
                             f"{values.describe()} ({implied} classes, names class_0 … class_{implied - 1})")
    return with_convention(choice)


def _plan(
    cfg: ConvertConfig, found: Discovery, spec: SampleSpec, settings: dict[str, Any], digest: str,
    session: StorageSession, header_size: Callable[[Path], tuple[int, int]] | None = None,
    shapes: Shapes | None = None,
    volumes: VolumeJob | None = None,
) -> tuple[list[ShardTask], dict[tuple[str, int], ShardRecord], dict[str, SourceCache]]:
    """Fingerprint every split's samples, cut shards, and find the shards that can be reused (by split and
    shard index); each split's fingerprint cache, to be completed by the workers and saved.

    A volume run's (``volumes``) fingerprints fold in each case's other modality files
    (:func:`~shardkit.conversion.volumes.fold_case_files`): a changed file rewrites only its case's shard.
    Where no shard can be reused (``--force``, or a split folder with no shard records: a first conversion)
    the fingerprints are left to the workers, which hash each source file from the same read that
    decodes it, in parallel, instead of this process reading and hashing every file first. Their cache entries
    then wait in a spill file (:class:`~shardkit.conversion.fingerprint.SourceCache`), not in this process's memory.
    ``shapes``: an annotation source's, folded into each sample's fingerprint (:func:`.annotated.fold_fingerprints`).
    """
    tasks: list[ShardTask] = []
    reused: dict[tuple[str, int], ShardRecord] = {}
    caches: dict[str, SourceCache] = {}
    fmt = get(cfg.format)
    for split, pairs in found.splits.items():
        directory = cfg.output / split
        session.sink.open(directory)
        fingerprints: np.ndarray | None = None
        if session.source is not None or (not cfg.force and has_records(directory)):
            old_cache = (SourceCache(len(pairs), spill=True) if cfg.force or cfg.rehash
                         else load_cache(directory, pairs))
            fingerprints, caches[split] = session.fingerprints(pairs, digest, old_cache,
                                                               threads=2 * cfg.effective_workers(),
                                                               on_error=cfg.on_error)
            if shapes is not None:
                fingerprints = fold_fingerprints(fingerprints, pairs, shapes[split])
            if volumes is not None:
                fingerprints = fold_case_files(fingerprints, pairs, volumes, cfg.on_error,
                                               threads=2 * cfg.effective_workers())
        else:
            caches[split] = SourceCache(len(pairs), spill=True)
        # each input's identity now, for the workers to check after reading it (local inputs only)
        identities = None if session.source is not None else input_identities(
            pairs, caches[split] if fingerprints is not None else None, threads=2 * cfg.effective_workers())
        planned = plan_split(split, directory, pairs, fingerprints, cfg.shard_size, spec, cfg, settings,
                             header_size or session.header_size, identities,
                             None if volumes is None else slice_counts(pairs, volumes))
        for task in planned:
            if not cfg.force and task.key is not None:
                record = session.sink.reuse(directory, task.key, fmt.published_names(task.stem, spec),
                                            rehash=cfg.rehash)
                if record is not None:
                    reused[(split, task.index)] = record
                    log.info("%s shard %s reused", split, task.index, extra={
                        "event": "shard_reused", "split": split, "shard": task.index, "samples": record.num_samples})
        tasks += planned
    return tasks, reused, caches


def publish_files(result: ShardResult) -> ShardRecord:
    """Rename one finished shard's temporary files into place, then record it (crash-safe order)."""
    record = ShardRecord(result.key, tuple(f.info() for f in result.files), result.num_samples, result.fingerprint,
                         result.stats, tuple(result.skipped))
    return publish_shard(result.directory, [(f.tmp_name, f.final_name) for f in result.files], record,
                         synced=result.synced)


def publish_split(
    cfg: ConvertConfig,
    split: str,
    pairs: Any,
    records: list[ShardRecord],
    found: Discovery,
    table: ClassTable,
    spec: SampleSpec,
    options: dict[str, Any],
    fmt: Any,
    *,
    source_root: str | None = None,
    sink: SplitSink | None = None,
    georef: bool = False,
) -> tuple[Path, int, bool]:
    """Publish the split's manifest as its next version (the commit marker; nothing when nothing changed), then
    remove files that no kept version names any more (:meth:`~shardkit.store.splitdir.SplitSink.commit`: the path, the
    version number and whether it is new).

    Each record's last file is the shard's samples sidecar: the manifest names it, and holds no
    per-sample record itself (manifest version 2).
    """
    directory = cfg.output / split
    shards: list[ShardInfo] = []
    stats = Stats(table.num_classes, spec.image_channels, ranges=not spec.legacy_image)
    first = 0
    for index, r in enumerate(records):
        shards.append(ShardInfo(index, r.num_samples, first, r.files[:-1], r.files[-1]))
        first += r.num_samples
        stats.merge(Stats.from_wire(r.stats))
    warning = (ignore_warning(table, stats.class_pixels, stats.ignore_pixels)
               if cfg.ignore_index is not None and spec.depth is None else None)  # 3-D patches: padding is ignore
    if warning:  # e.g. --ignore-index 255 on 0/255 masks: every foreground pixel became ignore
        log.warning("split %s: %s", split, warning)
    nonfinite = stats.nonfinite_warning()
    if nonfinite:  # float images with NaN/inf "no data" values: stored exactly, left out of the statistics
        log.warning("split %s: %s", split, nonfinite)
    fingerprint = split_fingerprint([r.fingerprint for r in records])
    manifest = Manifest(
        version=1,
        format=cfg.format,
        format_version=fmt.version_for(cfg.compression, cfg.codecs, spec),
        manifest_version=manifest_version_for(spec, provenance=georef or cfg.tiling is not None),
        split=split,
        num_samples=first,
        sample=spec,
        classes=table,
        preprocessing=Preprocessing(options),
        source=Source(
            layout=found.layout,
            label_kind=found.label_kind,
            root=source_root or found.root.resolve().as_posix(),
            fingerprint=fingerprint,
            pairs=len(pairs),
            unmatched_images=tuple(found.unmatched_images.get(split, ())),
            unmatched_labels=tuple(found.unmatched_labels.get(split, ())),
            # "tiles": sources, written, dropped_ignored (with --tile only); "annotations": the rasterisation report
            extra={**_tile_counts(records), **split_report(records, found), **volume_report(r.stats for r in records),
                   **({"groups": {"group_by": cfg.group_by}} if cfg.group_by is not None else {})},
        ),
        shards=tuple(shards),
        samples=SampleTable(shards, table.num_classes, directory),
        stats=SplitStats.from_json(stats.to_manifest(), spec.image_channels),
        skipped=tuple(s for r in records for s in r.skipped),
        format_options=fmt.format_options(spec, cfg.compression, cfg.codecs),
        tool_version=__version__,
    )
    return (sink or LocalSink()).commit(directory, manifest, records, cfg.keep_versions)


def _tile_counts(records: list[ShardRecord]) -> dict[str, Any]:
    """``{"tiles": {...}}``: the split's tile counts summed from its shards' records; ``{}`` when not tiled."""
    if not any("tiles" in r.stats for r in records):
        return {}
    counts = TileCounts()
    for r in records:
        counts.merge(r.stats.get("tiles", {}))
    return {"tiles": counts.to_json()}
