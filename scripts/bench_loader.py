"""The PyTorch loader as users meet it (#42), side by side in one run: ``make_loader(split, B, num_workers=N)`` (the
default, batches safe to keep) against ``reuse_buffers=True``, with 0 and 2 workers; and a crop-only and a crop+flip
pipeline (``augment=``) against the plain read, with 0 and 2 workers.

    python scripts/bench_loader.py RAW_CAMVID [--split SPLIT] [--batch 32] [--batches 40] [--rounds 3]
        [--workers 2] [--crop 352x480] [--full-batches 10] [--json out.json]

Data: the CamVid train pairs of RAW_CAMVID (SegNet layout) converted by shardkit into a temporary npy split as stored
(360x480; deleted at the end), or an existing ``--split``. Every row reads shuffled batches of ``--batch`` samples
(a fixed random draw, the same for every row) from that split's memory maps (warm page cache): the loader's epoch
sampler's batches are replaced by a list of ``--batches`` + warm-up batches, so no epoch end (the small split's
epochs are a few batches long) stalls the workers. Each row builds its loader, discards one warm-up batch per worker
(worker start), then times ``--batches`` batches. ``pin_memory=False`` (no GPU here).

Rows (samples/s; each round runs every row once in turn, so ratios within a round are side by side):

- ``default W workers``: ``make_loader(split, B, num_workers=W)``.
- ``reuse_buffers W workers``: the same with ``reuse_buffers=True`` (batches valid until 2 more were yielded).
- ``crop W workers`` / ``crop+flip W workers``: the default with ``augment=parse("crop=HxW")`` /
  ``parse("crop=HxW,hflip")`` (the fast path: slices copied, not warped).
- ``full spec W workers``: ``parse("scale=0.5:2,crop=HxW,hflip,rotate=10,jitter=0.2")`` (warped; OpenCV's
  threads matter here), over ``--full-batches`` timed batches.

The summary prints each round's ratios (default / reuse_buffers; crop and crop+flip / plain read, the plain read
being the default row with the same workers) and their medians, with the load average at each round's start. On a
machine shared with other work the absolute numbers move from run to run; compare ratios within a round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader

import shardkit
from shardkit import augment as A
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
from shardkit.read.torch import RingLoader, make_loader


def rate(split: Path, batches: list[list[int]], batch: int, workers: int, timed: int, **kw: Any) -> float:
    """Samples/s of ``make_loader(split, batch, num_workers=workers, **kw)`` over ``timed`` batches of ``batches``."""
    loader: Any = make_loader(split, shardkit.EpochPlan(batch), num_workers=workers, pin_memory=False, **kw)
    if isinstance(loader, RingLoader):  # its DataLoader's sampler pairs the inner sampler's batches with ring slots
        loader.sampler.inner = batches
    else:
        loader = DataLoader(loader.dataset, batch_size=None, sampler=batches, num_workers=workers,
                            persistent_workers=workers > 0)
    it = iter(loader)
    for _ in range(max(workers, 1)):  # warm-up: worker start and each worker's first batch
        next(it)
    t = time.perf_counter()
    for _ in range(timed):
        got = next(it)
    del got
    return batch * timed / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", type=Path, nargs="?")
    ap.add_argument("--split", type=Path, help="an existing split to read instead of converting RAW")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--crop", default="352x480")
    ap.add_argument("--full-batches", type=int, default=10, help="timed batches of the full-spec rows (warped)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-loader-"))
    try:
        if args.split is None:
            if args.raw is None:
                ap.error("give RAW_CAMVID or --split")
            convert(ConvertConfig(args.raw, tmp / "split", format="npy", splits=("train",), workers=1, quiet=True))
            split = tmp / "split" / "train"
        else:
            split = args.split
        n = len(shardkit.open(split))
        rng = np.random.default_rng(0)
        batches = [rng.choice(n, args.batch, replace=n < args.batch).tolist()
                   for _ in range(args.batches + args.workers + 1)]
        rows: dict[str, tuple[int, dict[str, Any]]] = {}
        for w in (0, args.workers):
            rows[f"default {w} workers"] = (w, {})
            rows[f"reuse_buffers {w} workers"] = (w, {"reuse_buffers": True})
            rows[f"crop {w} workers"] = (w, {"augment": A.parse(f"crop={args.crop}")})
            rows[f"crop+flip {w} workers"] = (w, {"augment": A.parse(f"crop={args.crop},hflip")})
            rows[f"full spec {w} workers"] = (w, {"augment": A.parse(f"scale=0.5:2,crop={args.crop},hflip,"
                                                                      "rotate=10,jitter=0.2")})
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            load = os.getloadavg()[0]
            got = {name: rate(split, batches, args.batch, w, args.full_batches if name.startswith("full") else
                              args.batches, **kw) for name, (w, kw) in rows.items()}
            ratios = {}
            for w in (0, args.workers):
                plain = got[f"default {w} workers"]
                ratios[f"default / reuse_buffers, {w} workers"] = plain / got[f"reuse_buffers {w} workers"]
                ratios[f"crop / plain read, {w} workers"] = got[f"crop {w} workers"] / plain
                ratios[f"crop+flip / plain read, {w} workers"] = got[f"crop+flip {w} workers"] / plain
                ratios[f"full spec / plain read, {w} workers"] = got[f"full spec {w} workers"] / plain
            rounds.append({"load": load, "samples_per_s": got, "ratios": ratios})
            print(f"round {r + 1} (load {load:.2f})")
            for name, v in got.items():
                print(f"  {name:<28} {v:8.0f} samples/s")
            for name, v in ratios.items():
                print(f"  {name:<40} {v:5.2f}x")
        print(f"medians over {args.rounds} rounds ({n} samples, batch {args.batch}, {args.batches} timed batches)")
        for name in rows:
            print(f"  {name:<28} {statistics.median(x['samples_per_s'][name] for x in rounds):8.0f} samples/s")
        for name in rounds[0]["ratios"]:
            print(f"  {name:<40} {statistics.median(x['ratios'][name] for x in rounds):5.2f}x")
        if args.json:
            args.json.write_text(json.dumps(rounds, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
