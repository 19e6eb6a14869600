"""The Keras and tf.data adapters with workers, side by side in one run (#42): each default path against the best
single-process read, the core reader's ``ds.batch`` into one reused buffer (and ``ds.normalize`` into one reused
float32 buffer for normalised rows).

    python scripts/bench_adapters.py SPLIT [--batch 32] [--batches 40] [--rounds 3] [--workers 2] [--json out.json]

SPLIT: a converted split of one sample size (e.g. CamVid train+val x5 at 352x480, npy). Rows (samples/s; each round
runs every row once in turn, so the ratios within a round are side by side):

- ``reused read`` / ``reused read + normalize``: the reference, in this process (after one untimed pass).
- ``Keras in line`` (``workers=1``), ``Keras W threads`` (``workers=W``), ``Keras W processes`` (``workers=W,
  use_multiprocessing=True``): ``ShardkitPyDataset`` iterated through Keras's own ``PyDatasetAdapter`` (what
  ``model.fit`` does, epochs and worker pools included), normalised (the Keras default) and uint8
  (``normalize=False``).
- ``tf.data``: ``shardkit.tf.dataset(split, plan)`` (uint8, its default) and with ``normalize=True``.

Each row reads one epoch untimed (worker start, compilation, first page faults), then times ``--batches`` batches,
going on into the next epoch where one ends (Keras starts a new worker pool for each epoch: included). The summary
prints each round's ratio of every row to its reference (uint8 rows to the reused read, normalised rows to the reused
read + normalize) and their medians, with the load average at each round's start. Keras runs on the torch backend
(``KERAS_BACKEND`` unless set).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "torch")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

import shardkit


def reused(split: Path, batch: int, timed: int, normalize: bool) -> float:
    """Samples/s of ``ds.batch`` of shuffled batches into one reused buffer (and normalising into another)."""
    ds = shardkit.open(split)
    rng = np.random.default_rng(0)
    out = ds.batch(np.arange(batch))
    floats = np.empty(out[0].shape, np.float32)
    for start in range(0, len(ds) - batch + 1, batch):  # one pass untimed, as the adapters' first epoch
        ds.batch(np.arange(start, start + batch), out)
        ds.normalize(out[0], floats)
    t = time.perf_counter()
    for _ in range(timed):
        ds.batch(np.sort(rng.choice(len(ds), batch, replace=False)), out)
        if normalize:
            ds.normalize(out[0], floats)
    return batch * timed / (time.perf_counter() - t)


def keras_rate(split: Path, batch: int, timed: int, normalize: bool, workers: int, processes: bool) -> float:
    """Samples/s of ``ShardkitPyDataset`` through Keras's ``PyDatasetAdapter``, epoch after epoch."""
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    from shardkit.read.keras import ShardkitPyDataset

    data = ShardkitPyDataset(split, shardkit.EpochPlan(batch, seed=0), workers=workers,
                             use_multiprocessing=processes, normalize=normalize)
    adapter = PyDatasetAdapter(data)
    n, seen, t, end = 0, -len(data), time.perf_counter(), 0.0
    while seen < timed:
        adapter.on_epoch_begin()
        for x, _ in adapter.get_numpy_iterator():
            seen += 1
            if seen == 0:  # the first epoch done (untimed): worker start, compilation, first page faults
                t = time.perf_counter()
            elif seen > 0:
                n += len(x)
            if seen >= timed:
                end = time.perf_counter()  # not the pool's shutdown with batches still queued
                break
        adapter.on_epoch_end()
    return n / (end - t)


def tf_rate(split: Path, batch: int, timed: int, normalize: bool) -> float:
    """Samples/s of ``shardkit.tf.dataset`` repeated (each pass the next epoch)."""
    import shardkit.tf

    data = shardkit.tf.dataset(split, shardkit.EpochPlan(batch, seed=0), normalize=normalize)
    it = iter(data.repeat())
    for _ in range(-(-len(shardkit.open(split)) // batch)):  # the first epoch, untimed
        next(it)
    n, t = 0, time.perf_counter()
    for _ in range(timed):
        n += int(next(it)[0].shape[0])
    return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("split", type=Path)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    b, n, w = args.batch, args.batches, args.workers
    rows: dict[str, tuple[str, Callable[[], float]]] = {}
    for norm, tag in ((False, "uint8"), (True, "normalised")):
        ref = "reused read + normalize" if norm else "reused read"
        rows[ref] = (ref, lambda norm=norm: reused(args.split, b, n, norm))
        rows[f"Keras in line, {tag}"] = (ref, lambda norm=norm: keras_rate(args.split, b, n, norm, 1, False))
        rows[f"Keras {w} threads, {tag}"] = (ref, lambda norm=norm: keras_rate(args.split, b, n, norm, w, False))
        rows[f"Keras {w} processes, {tag}"] = (ref, lambda norm=norm: keras_rate(args.split, b, n, norm, w, True))
        rows[f"tf.data, {tag}"] = (ref, lambda norm=norm: tf_rate(args.split, b, n, norm))
    reused(args.split, b, 2, True)  # warm-up: page cache, compiled normalisation
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        load = os.getloadavg()[0]
        got = {name: fn() for name, (_, fn) in rows.items()}
        ratios = {name: got[name] / got[ref] for name, (ref, _) in rows.items() if name != ref}
        rounds.append({"load": load, "samples_per_s": got, "ratios": ratios})
        print(f"round {r + 1} (load {load:.2f})")
        for name, v in got.items():
            print(f"  {name:<32} {v:8.0f} samples/s" + (f"  {ratios[name]:5.2f}x" if name in ratios else ""))
    print(f"medians over {args.rounds} rounds ({len(shardkit.open(args.split))} samples, batch {b}, {n} timed "
          f"batches; load {min(x['load'] for x in rounds):.1f}-{max(x['load'] for x in rounds):.1f})")
    for name, (ref, _) in rows.items():
        med = statistics.median(x["samples_per_s"][name] for x in rounds)
        ratio = f"  {statistics.median(x['ratios'][name] for x in rounds):5.2f}x of {ref}" if name != ref else ""
        print(f"  {name:<32} {med:8.0f} samples/s{ratio}")
    if args.json:
        args.json.write_text(json.dumps(rounds, indent=1))


if __name__ == "__main__":
    main()
