"""What normalising costs the Keras adapter's default batches (``normalize=True``), side by side in one run: the
compiled one-pass uint8 loop (``shardkit[fast]``) against numpy's two passes (``SHARDKIT_NO_NUMBA=1``, checked on
every call), through ``ShardkitPyDataset`` as Keras reads it (0 workers).

    python scripts/bench_normalize.py SPLIT [--batch 32] [--epochs 3] [--rounds 3]

SPLIT: a converted split of one sample size (e.g. CamVid train as stored, 360x480). Also prints the raw
``Normalize.numpy`` time per batch into a reused buffer and into a fresh one (page faults included).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")

import numpy as np

import shardkit
from shardkit.read.keras import ShardkitPyDataset


def keras_rate(split: Path, batch: int, epochs: int) -> float:
    """Samples/s of ``epochs`` passes over a normalising ``ShardkitPyDataset`` read batch by batch."""
    seq = ShardkitPyDataset(split, shardkit.EpochPlan(batch, seed=0))
    n, t = 0, time.perf_counter()
    for _ in range(epochs):
        for i in range(len(seq)):
            n += len(seq[i][0])
        seq.on_epoch_end()
    return n / (time.perf_counter() - t)


def op_ms(images: np.ndarray, op: shardkit.augment.Normalize, reuse: bool) -> float:
    out = np.empty(images.shape, np.float32) if reuse else None
    op.numpy(images, out)
    t = time.perf_counter()
    for _ in range(5):
        op.numpy(images, out)
    return (time.perf_counter() - t) / 5 * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("split", type=Path)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    ds = shardkit.open(args.split)
    images = ds.batch(np.arange(min(args.batch, len(ds))))[0]
    keras_rate(args.split, args.batch, 1)  # warm-up: page cache, compile
    for r in range(args.rounds):
        load = os.getloadavg()[0]
        row = {}
        for name, env in (("compiled", "0"), ("numpy", "1")):
            os.environ["SHARDKIT_NO_NUMBA"] = env
            row[name] = (keras_rate(args.split, args.batch, args.epochs),
                         op_ms(images, ds.normalizer, True), op_ms(images, ds.normalizer, False))
        os.environ["SHARDKIT_NO_NUMBA"] = "0"
        (kc, rc, fc), (kn, rn, fn) = row["compiled"], row["numpy"]
        print(f"round {r + 1} (load {load:.2f}): ShardkitPyDataset {kc:.0f} vs {kn:.0f} samples/s ({kc / kn:.2f}x); "
              f"Normalize per batch of {len(images)}: reused buffer {rc:.1f} vs {rn:.1f} ms ({rn / rc:.2f}x), "
              f"fresh {fc:.1f} vs {fn:.1f} ms ({fn / fc:.2f}x)")


if __name__ == "__main__":
    main()
