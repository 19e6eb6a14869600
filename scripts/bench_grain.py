"""The Grain path against shardkit's numpy batched read (#39's bar: ≥ 0.9×), side by side in one run.

    python scripts/bench_grain.py RAW_CAMVID [--split SPLIT] [--batch 8] [--epochs 5] [--rounds 3]
        [--augment SPEC] [--json out.json]

Data: the CamVid train pairs of RAW_CAMVID (SegNet layout) converted into a temporary npy split as stored (360x480;
deleted at the end), or an existing ``--split``. Every row reads ``--epochs`` shuffled epochs of batches of
``--batch`` in one process (0 Grain workers; the split's memory maps warm), optionally augmented (``--augment``):

- ``numpy``: ``Dataset.iter_batches(plan)`` per epoch (the baseline).
- ``grain batches``: ``batch_loader(ShardkitBatchSource(...))`` with its default read options (a local split is
  read in line).
- ``grain batches, 16 threads``: the same with Grain's default ``ReadOptions()`` (16 read threads).
- ``grain records``: ``data_loader(ShardkitSource(...), plan)`` (one sample per Grain record, Grain's ``Batch``).

A warm-up pass of ``numpy`` runs first. Each round runs every row once in turn; the summary prints each round's
ratios against ``numpy`` and their medians, with the load average at each round's start.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import grain.python as grain

import shardkit
from shardkit import augment as A
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
from shardkit.grain import ShardkitBatchSource, ShardkitSource, batch_loader, data_loader


def rate(batches: Callable[[], Iterable[Any]]) -> float:
    """Samples/s of one pass over ``batches()`` (the first batch's set-up counted, as a user meets it)."""
    n, t = 0, time.perf_counter()
    for b in batches():
        n += len(b["image"] if isinstance(b, dict) else b[0])
    return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", type=Path, help="CamVid in SegNet layout (e.g. ../shared/data/camvid-segnet)")
    ap.add_argument("--split", type=Path, help="an existing converted split instead of converting train")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--augment", default=None, help="an augmentation spec, e.g. crop=352x480,hflip")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    tmp = None
    split = args.split
    if split is None:
        tmp = Path(tempfile.mkdtemp(prefix="bench-grain-"))
        convert(ConvertConfig(args.raw, tmp, format="npy", splits=("train",), quiet=True))
        split = tmp / "train"
    try:
        aug = A.parse(args.augment) if args.augment else None
        plan = shardkit.EpochPlan(args.batch, seed=0)
        ds = shardkit.open(split)
        epochs = args.epochs

        def numpy_rows() -> Iterable[Any]:
            for e in range(epochs):
                yield from ds.iter_batches(plan.replace(epoch=e), augment=aug)

        def batch_rows(read_options: grain.ReadOptions | None = None) -> Callable[[], Iterable[Any]]:
            src = ShardkitBatchSource(split, plan, augment=aug, epochs=epochs)
            return lambda: batch_loader(src, num_epochs=epochs, read_options=read_options)

        def record_rows() -> Iterable[Any]:
            src = ShardkitSource(split, augment=aug, seed=plan.seed, epochs=epochs)
            return data_loader(src, plan, num_epochs=epochs)

        rows: dict[str, Callable[[], Iterable[Any]]] = {
            "numpy": numpy_rows, "grain batches": batch_rows(), "grain batches, 16 threads": batch_rows(
                grain.ReadOptions()), "grain records": record_rows}
        rate(numpy_rows)  # warm-up: the page cache and the first-read set-up of every shard
        rounds = []
        for r in range(args.rounds):
            load = os.getloadavg()
            got = {name: rate(make) for name, make in rows.items()}
            rounds.append({"load": load, "samples_per_s": got})
            ratios = {k: v / got["numpy"] for k, v in got.items() if k != "numpy"}
            print(f"round {r + 1} (load {load[0]:.2f}): " + ", ".join(f"{k} {v:.0f}/s" for k, v in got.items())
                  + " | " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
        names = [k for k in rows if k != "numpy"]
        med = {k: statistics.median(x["samples_per_s"][k] / x["samples_per_s"]["numpy"] for x in rounds)
               for k in names}
        print("median ratio to numpy: " + ", ".join(f"{k} {v:.2f}x" for k, v in med.items()))
        print(f"(grain {version('grain')}, split {split}, {len(ds)} samples, batch {args.batch}, "
              f"{epochs} epochs, augment {args.augment or 'none'})")
        if args.json:
            args.json.write_text(json.dumps({"rounds": rounds, "median_ratio": med, "batch": args.batch,
                                             "epochs": epochs, "augment": args.augment}, indent=1))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
