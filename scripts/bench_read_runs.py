#!/usr/bin/env python
"""The npy batched reader against the mmap-copy limit, in CPU time, on splits of any size and shard count.

An optional benchmark (not part of the tests or CI). For each split (a fixed-size npy split folder) it
times, interleaved, 7 passes of 2,048 samples in sorted random batches of 32 of: the limit
(``shardkit.bench.mmap_copy_limit``), the reader (``ds.batch``), and — for comparison — the limit and the
batch gather as they were before they changed (one file drawn at random, then an offset; one
``read_batch_into`` per shard run). Rates are samples per second of this thread's CPU time
(``time.thread_time``), because on a shared, overloaded machine wall-clock rates of a memory copy swing
by 2× between passes.

    python scripts/bench_read_runs.py out/train out-many-shards/train
"""

from __future__ import annotations

import mmap
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import shardkit
from shardkit.bench import mmap_copy_limit, reader_pass, shard_files


def old_limit(files, sample_bytes, batch_size, limit, seed):
    maps = []
    for p in files:
        with open(p, "rb") as fh:
            if p.stat().st_size >= sample_bytes:
                maps.append(np.frombuffer(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), np.uint8))
    dst = np.empty((batch_size, sample_bytes), np.uint8)
    rng = np.random.default_rng(seed)
    picks = [(int(rng.integers(len(maps))), 0) for _ in range(limit)]
    offsets = [(f, int(rng.integers(0, len(maps[f]) - sample_bytes + 1))) for f, _ in picks]
    def run():
        for k, (f, off) in enumerate(offsets):
            dst[k % batch_size] = maps[f][off : off + sample_bytes]
        return limit
    return run

def old_reader(ds, batch_size, limit, seed):
    out = ds.empty_batch(batch_size)
    order = np.resize(np.random.default_rng(seed).permutation(len(ds)), limit)
    batches = [np.sort(order[i:i + batch_size]) for i in range(0, limit, batch_size)]
    def run():
        for idx in batches:
            images, stored = out
            shard = np.searchsorted(ds._starts, idx, side="right") - 1
            local = idx - ds._starts[shard]
            cuts = (np.flatnonzero(shard[1:] != shard[:-1]) + 1).tolist()
            for a, b in zip([0, *cuts], [*cuts, len(idx)], strict=True):
                ds.readers[int(shard[a])].read_batch_into(local[a:b], images[a:b], stored[a:b])
        return limit
    return run

splits = [Path(x) for x in sys.argv[1:]]
for path in splits:
    ds = shardkit.open(path)
    if ds.spec.size is None:
        raise SystemExit(f"{path}: needs a fixed-size npy split (convert with --size HxW)")
    sb = ds.spec.sample_nbytes(ds.spec.size)
    files = shard_files(ds, Path(path))
    limit = 2048
    fns = {"old limit": old_limit(files, sb, 32, limit, 0), "new limit": mmap_copy_limit(files, sb, 32, limit, 0),
           "old reader": old_reader(ds, 32, limit, 0), "new reader": reader_pass(ds, 32, limit, True, 0)}
    rates: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        f()
    for _ in range(7):
        for k, f in fns.items():
            t = time.thread_time()
            n = f()
            rates[k].append(n / (time.thread_time() - t))
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratio = {"old reader/old limit": med["old reader"] / med["old limit"],
             "new reader/new limit": med["new reader"] / med["new limit"],
             "new/old reader": med["new reader"] / med["old reader"]}
    print(f"n={len(ds):5d} shards={len(ds.manifest.shards):3d} "
          + "  ".join(f"{k} {v:.0f}/s" for k, v in med.items())
          + " | " + "  ".join(f"{k} {v:.2f}" for k, v in ratio.items()), flush=True)
