"""One conversion end to end: discover → plan → pool → rename shards → manifest (last).

The parent never touches pixels. For each split, shards are renamed into place only
after every shard of the run succeeded, and the manifest — the commit marker — is
written after them, atomically.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__
from .config import ConvertConfig
from .discover import Discovery, discover
from .errors import OutputError
from .formats.base import TMP_MARK, SampleSpec
from .formats.registry import writer_class
from .labels import ClassTable, LabelDecoder, build_class_table
from .manifest import MANIFEST_NAME, Manifest, ShardInfo, dump_manifest, fsync_dir
from .plan import ShardTask, listing_fingerprint, plan_tasks, split_into_shards
from .pool import run_tasks
from .stats import Stats
from .transform import read_image_size
from .worker import ShardResult, WorkerContext

log = logging.getLogger(__name__)


@dataclass
class ConvertSummary:
    """What a run did, for the CLI's last line and for callers."""

    discovery: Discovery
    table: ClassTable
    dry_run: bool
    samples: int = 0
    shards: int = 0
    bytes: int = 0
    seconds: float = 0.0
    skipped: list[dict[str, str]] = field(default_factory=list)
    manifests: list[Path] = field(default_factory=list)

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        if self.dry_run:
            return f"dry run: {self.discovery.total()} pairs found, nothing written"
        return (
            f"converted {self.samples} samples into {self.shards} shards, {self.bytes / 1e6:.1f} MB, "
            f"in {self.seconds:.1f} s ({self.samples_per_second:.1f} samples/s)"
            + (f"; {len(self.skipped)} inputs skipped" if self.skipped else "")
        )


def sample_spec(cfg: ConvertConfig, table: ClassTable) -> SampleSpec:
    fixed = cfg.size is not None and (cfg.crop == "center" or cfg.resize == "exact")
    return SampleSpec(cfg.size if fixed else None, cfg.label_encoding, table.num_classes, table.label_dtype().str)


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


def remove_temps(directory: Path) -> None:
    """Delete temporary shard files left by an earlier, interrupted run."""
    if directory.is_dir():
        for p in directory.iterdir():
            if p.name.startswith(".") and TMP_MARK in p.name:
                p.unlink(missing_ok=True)


def convert(cfg: ConvertConfig) -> ConvertSummary:
    """Run one conversion as configured; raises a ShardkitError on anything a user must fix."""
    started = time.perf_counter()
    found = discover(cfg.input, layout=cfg.layout, label_suffix=cfg.label_suffix, splits=cfg.splits,
                     strict=cfg.strict)
    table = build_class_table(
        found.label_kind, class_dict=cfg.class_dict or found.class_dict, palette=cfg.palette, layout=found.layout,
        num_classes=cfg.num_classes, ignore_index=cfg.ignore_index, cityscapes_train_ids=cfg.cityscapes_train_ids,
    )
    decoder = LabelDecoder(found.label_kind, table, cfg.colour_tolerance, cfg.unknown_as)
    summary = ConvertSummary(found, table, cfg.dry_run)
    for line in found.report_lines():
        log.info("%s", line)
    if cfg.dry_run:
        return summary
    check_output(cfg)
    spec = sample_spec(cfg, table)
    options = cfg.preprocessing()
    ctx = WorkerContext(cfg.format, spec, decoder, found.root.resolve(), cfg.size, cfg.resize, cfg.crop,
                        cfg.compression, cfg.on_error, WorkerContext.digest(options))
    tasks: list[ShardTask] = []
    for split, pairs in found.splits.items():
        directory = cfg.output / split
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create the output folder ({exc.strerror})", path=directory,
                              fix="check the path and its permissions") from None
        remove_temps(directory)
        tasks += plan_tasks(split, directory, split_into_shards(pairs, cfg.shard_size, spec, cfg, read_image_size))
    log.info("planned %d shards over %d splits with %d workers", len(tasks), len(found.splits),
             min(cfg.effective_workers(), max(len(tasks), 1)))
    try:
        results = run_tasks(tasks, ctx, workers=cfg.effective_workers(), quiet=cfg.quiet)
    except BaseException:
        for split in found.splits:
            remove_temps(cfg.output / split)
        raise
    for split, pairs in found.splits.items():
        mine = [r for r in results if r.split == split]
        path = publish_split(cfg, split, pairs, mine, found, table, spec, options)
        summary.manifests.append(path)
        summary.samples += sum(len(r.samples) for r in mine)
        summary.shards += len(mine)
        summary.bytes += sum(f.bytes for r in mine for f in r.files)
        summary.skipped += [s for r in mine for s in r.skipped]
    summary.seconds = time.perf_counter() - started
    return summary


def publish_split(
    cfg: ConvertConfig,
    split: str,
    pairs: Any,
    results: list[ShardResult],
    found: Discovery,
    table: ClassTable,
    spec: SampleSpec,
    options: dict[str, Any],
) -> Path:
    """Rename the split's shards into place, write its manifest last, then drop stale files."""
    directory = cfg.output / split
    shards: list[ShardInfo] = []
    samples: list[dict[str, Any]] = []
    stats = Stats(table.num_classes)
    first = 0
    for r in results:
        for f in r.files:
            os.replace(directory / f.tmp_name, directory / f.final_name)
        shards.append(ShardInfo(r.index, len(r.samples), first, tuple(f.info() for f in r.files)))
        first += len(r.samples)
        samples += r.samples
        stats.merge(Stats.from_wire(r.stats))
    fsync_dir(directory)
    writer = writer_class(cfg.format)
    manifest = Manifest(
        format=cfg.format,
        format_version=writer.format_version,
        split=split,
        num_samples=first,
        sample=spec.to_manifest(),
        classes=table.to_json(),
        preprocessing=options,
        source={
            "layout": found.layout,
            "label_kind": found.label_kind,
            "root": found.root.resolve().as_posix(),
            "fingerprint": listing_fingerprint(pairs, found.root.resolve(), options),
            "pairs": len(pairs),
            "unmatched_images": list(found.unmatched_images.get(split, ())),
            "unmatched_labels": list(found.unmatched_labels.get(split, ())),
        },
        shards=tuple(shards),
        samples=tuple(samples),
        stats=stats.to_manifest(),
        skipped=tuple(s for r in results for s in r.skipped),
        format_options=writer.format_options(spec, cfg.compression),
        tool_version=__version__,
    )
    path = dump_manifest(manifest, directory)
    keep = {f.final_name for r in results for f in r.files} | {MANIFEST_NAME}
    for p in directory.iterdir():
        if p.is_file() and p.name not in keep and _is_shard_name(p.name):
            p.unlink()
    log.info("%s: %d samples in %d shards → %s", split, first, len(shards), path)
    return path


def _is_shard_name(name: str) -> bool:
    return not name.startswith(".") and name.split("-", 1)[0] in ("images", "labels", "shapes", "shard")
