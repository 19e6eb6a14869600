"""``shardkit bench``: read throughput of converted data, side by side with the online pipeline it replaces.

Everything is measured in one run, on one machine, and reported as samples/s, MB/s and
ratios, because absolute figures drift ±15–35 % between runs here while ratios hold.
Each figure is the median of ``repeats`` timed passes after one untimed warm-up pass, so
the page cache is warm (labelled as such): this measures the CPU cost of reading, not
the disk.
"""

from __future__ import annotations

import logging
import mmap
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError, InputNotFoundError
from .onehot import kernel_name

log = logging.getLogger(__name__)


@dataclass
class Measurement:
    """One line of the table: a median rate over repeats."""

    name: str
    samples_per_s: float
    mb_per_s: float
    runs: list[float] = field(default_factory=list)
    note: str = ""


def _time_rate(fn: Callable[[], int], repeats: int) -> list[float]:
    """Call ``fn`` (returns samples processed) once to warm up, then ``repeats`` times timed → rates."""
    fn()
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        n = fn()
        rates.append(n / max(time.perf_counter() - t, 1e-9))
    return rates


def _measure(name: str, fn: Callable[[], int], repeats: int, sample_bytes: int, note: str = "") -> Measurement:
    rates = _time_rate(fn, repeats)
    med = statistics.median(rates)
    m = Measurement(name, med, med * sample_bytes / 1e6, rates, note)
    log.info("%-44s %10.0f samples/s %9.0f MB/s", name, m.samples_per_s, m.mb_per_s)
    return m


def _batches(n: int, batch_size: int, limit: int, rng: np.random.Generator | None) -> list[np.ndarray]:
    order = rng.permutation(n) if rng is not None else np.arange(n)
    order = np.resize(order, max(limit, 1))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def memcpy_limit(sample_bytes: int, batch_size: int, limit: int) -> Callable[[], int]:
    src = np.ones(sample_bytes * batch_size, np.uint8)
    dst = np.empty_like(src)

    def run() -> int:
        for _ in range(0, limit, batch_size):
            np.copyto(dst, src)
        return limit

    return run


def mmap_copy_limit(files: list[Path], sample_bytes: int, batch_size: int, limit: int,
                    seed: int) -> Callable[[], int]:
    """Copy sample-sized chunks at random offsets out of the memory-mapped shard files: the reader's floor."""
    maps = []
    for p in files:
        with open(p, "rb") as fh:
            if p.stat().st_size >= sample_bytes:
                maps.append(np.frombuffer(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), np.uint8))
    if not maps:
        raise ConfigError("shards are smaller than one sample; nothing to measure")
    dst = np.empty((batch_size, sample_bytes), np.uint8)
    rng = np.random.default_rng(seed)
    picks = [(int(rng.integers(len(maps))), 0) for _ in range(limit)]
    offsets = [(f, int(rng.integers(0, len(maps[f]) - sample_bytes + 1))) for f, _ in picks]

    def run() -> int:
        for k, (f, off) in enumerate(offsets):
            dst[k % batch_size] = maps[f][off : off + sample_bytes]
        return limit

    return run


def reader_pass(ds: Any, batch_size: int, limit: int, shuffle: bool, seed: int) -> Callable[[], int]:
    out = ds.empty_batch(batch_size)
    batches = _batches(len(ds), batch_size, limit, np.random.default_rng(seed) if shuffle else None)

    def run() -> int:
        n = 0
        for idx in batches:
            if shuffle:
                idx = np.sort(idx)
            ds.batch(idx, out=out)
            n += len(idx)
        return n

    return run


def torch_pass(path: Path, batch_size: int, limit: int, workers: int, seed: int) -> Callable[[], int]:
    from .read.torch import make_loader

    loader = make_loader(path, batch_size, shuffle=True, num_workers=workers, seed=seed, pin_memory=False)

    def run() -> int:  # whole epochs (breaking off mid-epoch would time the loader's reset, not its reads)
        n = 0
        while n < limit:
            for images, _labels in loader:
                n += int(images.shape[0])
        return n

    return run


def naive_pass(ds: Any, limit: int, onehot: bool, source: Path | None = None) -> Callable[[], int]:
    """What a training script does online per sample: decode image and label, crop, (float, one-hot)."""
    import cv2

    from .labels import ClassTable

    root = Path(source) if source is not None else Path(ds.manifest.source["root"])
    first = ds.manifest.samples[0] if ds.manifest.samples else None
    if first is not None and not (root / first["key"]).is_file():
        raise InputNotFoundError(f"source image {first['key']} of the naive pipeline is not in {root}",
                                 path=root, fix="pass the raw dataset folder with --against RAW_DIR, or --no-against")
    table = ClassTable.from_json(ds.manifest.classes)
    colours = [c.colour for c in table.classes]
    colour_labels = ds.manifest.source.get("label_kind") == "colour"
    size = ds.spec.size
    recs = ds.manifest.samples

    def crop(a: np.ndarray) -> np.ndarray:
        if size is None:
            return a
        top, left = max((a.shape[0] - size[0]) // 2, 0), max((a.shape[1] - size[1]) // 2, 0)
        return a[top : top + size[0], left : left + size[1]]

    def run() -> int:
        for k in range(limit):
            rec = recs[k % len(recs)]
            image = crop(cv2.cvtColor(cv2.imread(str(root / rec["key"]), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB))
            raw = crop(cv2.imread(str(root / rec["label"]), cv2.IMREAD_UNCHANGED))
            if colour_labels:
                rgb = raw[..., ::-1]
                label = np.zeros(rgb.shape[:2], np.uint8)
                for cid, colour in enumerate(colours):
                    label[(rgb == colour).all(axis=-1)] = cid
            else:
                label = raw
            if onehot:
                image.astype(np.float32) / 255.0
                np.stack([(label == c) for c in range(table.num_classes)], axis=-1).astype(np.float32)
        return limit

    return run


def run_bench(path: Path, *, against: bool = True, source: Path | None = None, batch_size: int = 32,
              samples: int = 2048, repeats: int = 3, workers: tuple[int, ...] = (0, 2), naive_samples: int = 40,
              seed: int = 0) -> list[Measurement]:
    """All measurements for one split folder, in one process, in one run.

    ``source``: the raw dataset folder for the naive pipeline (default: the one the manifest names).
    """
    import shardkit

    ds = shardkit.open(path)
    ds_onehot = shardkit.open(path, labels="float_onehot")
    ds_onehot_cf = shardkit.open(path, labels="float_onehot", label_layout="channels_first")
    if ds.spec.size is None:
        raise ConfigError("bench needs fixed-size samples", fix="convert with --size HxW")
    h, w = ds.spec.size
    sample_bytes = ds.spec.sample_nbytes((h, w))
    onehot_bytes = h * w * 3 + h * w * ds.num_classes * 4
    limit = max(samples, batch_size)
    files = [path / f.name for s in ds.manifest.shards for f in s.files]
    out = [
        _measure("limit: memcpy (RAM → RAM)", memcpy_limit(sample_bytes, batch_size, limit), repeats, sample_bytes),
        _measure("limit: copy out of mmap'd shards, random", mmap_copy_limit(files, sample_bytes, batch_size, limit,
                                                                              seed), repeats, sample_bytes),
        _measure(f"shardkit {ds.format} batched, sequential", reader_pass(ds, batch_size, limit, False, seed),
                 repeats, sample_bytes),
        _measure(f"shardkit {ds.format} batched, shuffled", reader_pass(ds, batch_size, limit, True, seed),
                 repeats, sample_bytes),
        _measure(f"shardkit {ds.format} float one-hot NHWC, shuffled, {kernel_name()}",
                 reader_pass(ds_onehot, batch_size, limit, True, seed), repeats, onehot_bytes),
        _measure(f"shardkit {ds.format} float one-hot NCHW, shuffled, {kernel_name()}",
                 reader_pass(ds_onehot_cf, batch_size, limit, True, seed), repeats, onehot_bytes),
    ]
    try:
        import torch  # noqa: F401
    except ImportError:
        log.warning("torch is not installed: skipping the PyTorch loader (pip install 'shardkit[torch]')")
    else:
        for n in workers:
            out.append(_measure(f"shardkit torch DataLoader, {n} workers, shuffled",
                                torch_pass(path, batch_size, limit, n, seed), repeats, sample_bytes,
                                note="steady state; worker start-up excluded"))
    if against:
        out.append(_measure("naive online: decode + crop (uint8, ids)", naive_pass(ds, naive_samples, False, source),
                            repeats, sample_bytes))
        out.append(_measure("naive online: + float image + float one-hot", naive_pass(ds, naive_samples, True, source),
                            repeats, onehot_bytes))
    return out


def table(results: list[Measurement]) -> str:
    """The printed table: rates and ratios against the naive pipeline and the mmap-copy limit."""
    by = {m.name: m for m in results}
    naive = by.get("naive online: + float image + float one-hot")
    naive_u8 = by.get("naive online: decode + crop (uint8, ids)")
    limit = by.get("limit: copy out of mmap'd shards, random")
    lines = [f"{'measurement (warm page cache, median of repeats)':<50} {'samples/s':>10} {'MB/s':>8} "
             f"{'× naive':>9} {'× naive u8':>10} {'% mmap':>7}"]
    for m in results:
        x = f"{m.samples_per_s / naive.samples_per_s:9.0f}" if naive else f"{'':>9}"
        xu = f"{m.samples_per_s / naive_u8.samples_per_s:10.0f}" if naive_u8 else f"{'':>10}"
        pct = f"{100 * m.samples_per_s / limit.samples_per_s:6.0f}%" if limit else f"{'':>7}"
        lines.append(f"{m.name:<50} {m.samples_per_s:10.0f} {m.mb_per_s:8.0f} {x} {xu} {pct}")
    return "\n".join(lines)
