"""What a loader state costs per step (#39: "the state calls cost no measurable time per step"), side by side.

    python scripts/bench_state.py RAW_CAMVID [--split SPLIT] [--batch 8] [--epochs 5] [--rounds 3]

Data: the CamVid train pairs of RAW_CAMVID converted into a temporary npy split as stored (360x480), or ``--split``.
Each round reads ``--epochs`` epochs through ``make_loader(split, plan, num_workers=0)`` twice in turn: once plain,
once calling ``loader.state_dict()`` after every batch (what a checkpoint at every step would ask); and times
``state_dict()`` alone on the finished loader (10,000 calls). It prints the two rates, their ratio, and the cost of
one call against one step.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import shardkit
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
from shardkit.read.torch import make_loader


def epochs(split: Path, plan: shardkit.EpochPlan, n: int, with_state: bool) -> float:
    """Samples/s of ``n`` epochs of ``make_loader`` (a ``state_dict()`` after each batch when ``with_state``)."""
    loader = make_loader(split, plan, num_workers=0, pin_memory=False)
    count, t = 0, time.perf_counter()
    for e in range(n):
        loader.sampler.set_epoch(e)
        for images, _ in loader:
            count += len(images)
            if with_state:
                loader.state_dict()
    return count / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", type=Path)
    ap.add_argument("--split", type=Path)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = None
    split = args.split
    if split is None:
        tmp = Path(tempfile.mkdtemp(prefix="bench-state-"))
        convert(ConvertConfig(args.raw, tmp, format="npy", splits=("train",), quiet=True))
        split = tmp / "train"
    try:
        plan = shardkit.EpochPlan(args.batch, seed=0)
        epochs(split, plan, 1, False)  # warm-up
        for r in range(args.rounds):
            load = os.getloadavg()[0]
            plain = epochs(split, plan, args.epochs, False)
            stated = epochs(split, plan, args.epochs, True)
            loader = make_loader(split, plan, num_workers=0, pin_memory=False)
            for _ in loader:
                pass
            t = time.perf_counter()
            for _ in range(10_000):
                loader.state_dict()
            call = (time.perf_counter() - t) / 10_000
            step = args.batch / plain
            print(f"round {r + 1} (load {load:.2f}): plain {plain:.0f}/s, state_dict() every step {stated:.0f}/s "
                  f"({stated / plain:.3f}x); one call {call * 1e6:.1f} us = {call / step:.2%} of a "
                  f"{step * 1e3:.2f} ms step")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
