"""``shardkit bench``: read throughput of converted data, side by side with the online pipeline it replaces.

Everything is measured in one run, on one machine, and reported as samples/s, MB/s and
ratios, because absolute figures drift ±15–35 % between runs here while ratios hold.
Each figure is the median of ``repeats`` timed passes after one untimed warm-up pass, so
the page cache is warm (labelled as such): this measures the CPU cost of reading, not
the disk. With ``cold=True`` a few rows are also measured from a cold page cache: before
each of those passes the files it reads are evicted (``posix_fadvise(DONTNEED)``) and the
pass runs in a fresh process, which has nothing mapped; each sample is read at most once
per pass. A virtual machine's host may still cache the disk, so "cold" means "not in this
machine's page cache".
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .codecs.onehot import kernel_name
from .errors import ConfigError, DecodeError, InputNotFoundError
from .support.extras import install_hint

log = logging.getLogger(__name__)


@dataclass
class Measurement:
    """One line of the table: a median rate over repeats."""

    name: str
    samples_per_s: float
    mb_per_s: float
    runs: list[float] = field(default_factory=list)
    note: str = ""


def shard_files(ds: Any, path: Path) -> list[Path]:
    """Every file of every shard of the split at ``path``."""
    return [Path(path) / f.name for s in ds.manifest.shards for f in s.files]


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
    """Copy sample-sized chunks out of the memory-mapped shard files in random order: the reader's floor.

    The files' bytes are cut into ``sample_bytes`` slots taken in a random permutation (repeated up to
    ``limit``), so a pass touches every byte of the data once per epoch, as a shuffled reader does —
    whatever the split's size or shard count. (Drawing a file first and then an offset in it would
    touch small files, e.g. the label arrays, far more often than large ones: at sizes where those fit
    in the CPU cache and the images do not, that "limit" ran faster than any reader could.)
    """
    maps = []
    for p in files:
        with open(p, "rb") as fh:
            if p.stat().st_size >= sample_bytes:
                maps.append(np.frombuffer(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), np.uint8))
    if not maps:
        raise ConfigError("shards are smaller than one sample; nothing to measure")
    slots = [(f, k * sample_bytes) for f, m in enumerate(maps) for k in range(len(m) // sample_bytes)]
    order = np.resize(np.random.default_rng(seed).permutation(len(slots)), max(limit, 1))
    offsets = [slots[int(i)] for i in order]
    dst = np.empty((batch_size, sample_bytes), np.uint8)

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


def torch_pass(path: Path, batch_size: int, limit: int, workers: int, seed: int,
               reuse_buffers: bool = False) -> Callable[[], int]:
    """Whole epochs of ``make_loader``: by default every batch is fresh memory (safe to keep);
    ``reuse_buffers=True`` times the opt-in ring of reused batch buffers."""
    from .read.options import EpochPlan
    from .read.torch import make_loader

    loader = make_loader(path, EpochPlan(batch_size, shuffle=True, seed=seed), num_workers=workers, pin_memory=False,
                         reuse_buffers=reuse_buffers)

    def run() -> int:  # whole epochs (breaking off mid-epoch would time the loader's reset, not its reads)
        n = 0
        while n < limit:
            for images, _labels in loader:
                n += int(images.shape[0])
        return n

    return run


def naive_pass(ds: Any, limit: int, onehot: bool, source: Path | None = None,
               order: np.ndarray | None = None) -> Callable[[], int]:
    """What a training script does online per sample: decode image and label, crop, (float, one-hot).

    Samples in index order, or in ``order`` (e.g. a shuffled permutation), repeated up to ``limit``.
    """
    import cv2

    from .labels import ClassTable

    root = Path(source) if source is not None else Path(ds.manifest.source.root or ".")
    first = ds.manifest.samples[0] if ds.manifest.samples else None
    if first is not None and not (root / first["key"]).is_file():
        raise InputNotFoundError(f"source image {first['key']} of the naive pipeline is not in {root}",
                                 path=root, fix="pass the raw dataset folder with --against RAW_DIR, or --no-against")
    table = ClassTable.from_json(ds.manifest.classes)
    colours = [c.colour for c in table.classes]
    colour_labels = ds.manifest.source.label_kind == "colour"
    size = ds.spec.size
    recs = ds.manifest.samples
    picks = np.resize(order if order is not None else np.arange(len(recs)), max(limit, 1))

    def crop(a: np.ndarray) -> np.ndarray:
        if size is None:
            return a
        top, left = max((a.shape[0] - size[0]) // 2, 0), max((a.shape[1] - size[1]) // 2, 0)
        return a[top : top + size[0], left : left + size[1]]

    def imread(path: Path, flag: int) -> np.ndarray:
        arr = cv2.imread(str(path), flag)
        if arr is None:
            raise DecodeError("cannot read the naive pipeline's source file", path=path,
                              fix="pass the raw dataset folder with --against RAW_DIR, or --no-against")
        return arr

    def run() -> int:
        for k in range(limit):
            rec = recs[int(picks[k])]
            image = crop(cv2.cvtColor(imread(root / rec["key"], cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB))
            raw = crop(imread(root / rec["label"], cv2.IMREAD_UNCHANGED))
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


def evict(files: Iterable[Path]) -> None:
    """Drop ``files`` from the page cache: fsync (dirty pages cannot be dropped), then ``POSIX_FADV_DONTNEED``.

    Pages that some process still has mapped stay cached, which is why cold passes run in a fresh process.
    """
    if not hasattr(os, "posix_fadvise"):
        raise ConfigError("cold-cache passes need posix_fadvise, which this system lacks", fix="run without --cold")
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            with contextlib.suppress(OSError):  # e.g. a read-only file system: nothing there is dirty anyway
                os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _cold_pass(kind: str, path: str, batch_size: int, limit: int, seed: int, source: str | None) -> float:
    """In a fresh process: one timed pass of ``kind`` (nothing warmed up first) → samples/s."""
    import shardkit

    ds = shardkit.open(path)
    sample_bytes = ds.spec.sample_nbytes(ds.require_fixed_size())
    files = shard_files(ds, Path(path))
    run = {
        "shuffled": lambda: reader_pass(ds, batch_size, limit, True, seed),
        "sequential": lambda: reader_pass(ds, batch_size, limit, False, seed),
        "mmap": lambda: mmap_copy_limit(files, sample_bytes, batch_size, limit, seed),
        "naive": lambda: naive_pass(ds, limit, False, Path(source) if source else None),
    }[kind]()
    t = time.perf_counter()
    n = run()
    return n / max(time.perf_counter() - t, 1e-9)


def cold_measurements(ds: Any, path: Path, *, against: bool, source: Path | None, batch_size: int,
                      repeats: int, seed: int) -> list[Measurement]:
    """The cold-cache rows: each pass evicts what it reads, then runs in a fresh (spawned) process."""
    shards = shard_files(ds, path)
    root = Path(source) if source is not None else Path(ds.manifest.source.root or ".")
    source_files = [root / r[k] for r in ds.manifest.samples for k in ("key", "label")]
    limit = len(ds)  # each sample at most once: a second read would come from the cache the first one filled
    sample_bytes = ds.spec.sample_nbytes(ds.require_fixed_size())
    kinds = [("limit: copy out of mmap'd shards, random", "mmap", shards),
             (f"shardkit {ds.format} batched, sequential", "sequential", shards),
             (f"shardkit {ds.format} batched, shuffled", "shuffled", shards)]
    if against:
        kinds.append(("naive online: decode + crop (uint8, ids)", "naive", source_files))
    out = []
    spawn = multiprocessing.get_context("spawn")
    for name, kind, files in kinds:
        rates = []
        for _ in range(repeats):
            evict(files)
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                rates.append(pool.submit(_cold_pass, kind, str(path), batch_size, limit, seed,
                                         str(source) if source is not None else None).result())
        med = statistics.median(rates)
        m = Measurement(f"cold: {name}", med, med * sample_bytes / 1e6, rates, "page cache evicted before each pass")
        log.info("%-44s %10.0f samples/s %9.0f MB/s", m.name, m.samples_per_s, m.mb_per_s)
        out.append(m)
    return out


def run_bench(path: Path, *, against: bool = True, source: Path | None = None, batch_size: int = 32,
              samples: int = 2048, repeats: int = 3, workers: tuple[int, ...] = (0, 2), naive_samples: int = 40,
              seed: int = 0, cold: bool = False) -> list[Measurement]:
    """All measurements for one split folder, in one run.

    ``source``: the raw dataset folder for the naive pipeline (default: the one the manifest names).
    ``cold``: also the cold-cache rows (:func:`cold_measurements`), measured first, before this
    process maps any shard.
    """
    import shardkit

    ds = shardkit.open(path)
    ds_onehot = shardkit.open(path, labels="float_onehot")
    ds_onehot_cf = shardkit.open(path, labels="float_onehot", label_layout="channels_first")
    if ds.spec.size is None:
        raise ConfigError("bench needs fixed-size samples", fix="convert with --size HxW")
    h, w = ds.spec.size
    sample_bytes = ds.spec.sample_nbytes((h, w))
    onehot_bytes = h * w * 3 + h * w * ds.onehot_channels * 4  # the one-hot output has no ignore channel
    limit = max(samples, batch_size)
    files = shard_files(ds, path)
    if against:
        naive_pass(ds, 0, False, source)  # a missing source folder fails now, before anything is timed
    cold_rows = (cold_measurements(ds, path, against=against, source=source, batch_size=batch_size,
                                   repeats=repeats, seed=seed) if cold else [])
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
        log.warning("torch is not installed: skipping the PyTorch loader (%s)", install_hint("torch"))
    else:
        for n in workers:
            for reuse in (False, True):
                out.append(_measure(
                    f"shardkit torch loader, {n} workers, " + ("reuse_buffers" if reuse else "batches kept"),
                    torch_pass(path, batch_size, limit, n, seed, reuse), repeats, sample_bytes,
                    note="steady state; worker start-up excluded"))
    if against:
        out.append(_measure("naive online: decode + crop (uint8, ids)", naive_pass(ds, naive_samples, False, source),
                            repeats, sample_bytes))
        out.append(_measure("naive online: + float image + float one-hot", naive_pass(ds, naive_samples, True, source),
                            repeats, onehot_bytes))
    return out + cold_rows


def table(results: list[Measurement]) -> str:
    """The printed table: rates and ratios against the naive pipeline and the mmap-copy limit."""
    by = {m.name: m for m in results}
    naive = by.get("naive online: + float image + float one-hot")
    naive_u8 = by.get("naive online: decode + crop (uint8, ids)")
    limit = by.get("limit: copy out of mmap'd shards, random")
    lines = [f"{'measurement (warm page cache unless cold:, median)':<50} {'samples/s':>10} {'MB/s':>8} "
             f"{'× naive':>9} {'× naive u8':>10} {'% mmap':>7}"]
    cold_naive_u8 = by.get("cold: naive online: decode + crop (uint8, ids)")
    cold_limit = by.get("cold: limit: copy out of mmap'd shards, random")
    for m in results:
        is_cold = m.name.startswith("cold: ")
        ref_naive, ref_u8, ref_limit = (None, cold_naive_u8, cold_limit) if is_cold else (naive, naive_u8, limit)
        x = f"{m.samples_per_s / ref_naive.samples_per_s:9.0f}" if ref_naive else f"{'':>9}"
        xu = f"{m.samples_per_s / ref_u8.samples_per_s:10.0f}" if ref_u8 else f"{'':>10}"
        pct = f"{100 * m.samples_per_s / ref_limit.samples_per_s:6.0f}%" if ref_limit else f"{'':>7}"
        lines.append(f"{m.name:<50} {m.samples_per_s:10.0f} {m.mb_per_s:8.0f} {x} {xu} {pct}")
    return "\n".join(lines)
