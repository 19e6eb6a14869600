"""Augmentation throughput, side by side in one run: shardkit's numpy/OpenCV batched path vs its torch path.

    python scripts/bench_augment.py RAW_CAMVID [--spec "scale=0.5:2,crop=352x480,hflip,rotate=10,jitter=0.2"]
        [--batch 16] [--batches 20] [--device cuda]

Converts nothing: it decodes the CamVid train pairs once, then times whole batches (parameters drawn and
applied) per path and prints samples/s and the ratio to the CPU path. On CUDA the torch path's time is
measured with the device synchronised after every batch. Numbers belong in the README as ratios (absolute
times only from a GPU machine).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import cv2
import numpy as np

from shardkit import augment as A


def load(raw: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    files = sorted((raw / "train").glob("*.png"))[:n]
    imgs = [cv2.cvtColor(cv2.imread(str(f)), cv2.COLOR_BGR2RGB) for f in files]
    labs = [cv2.imread(str(raw / "trainannot" / f.name), cv2.IMREAD_GRAYSCALE) for f in files]
    hw = min(i.shape[0] for i in imgs), min(i.shape[1] for i in imgs)
    return np.stack([i[: hw[0], : hw[1]] for i in imgs]), np.stack([la[: hw[0], : hw[1]] for la in labs])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", type=Path)
    ap.add_argument("--spec", default="scale=0.5:2,crop=352x480,hflip,rotate=10,jitter=0.2")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--device", default=None)
    args = ap.parse_args()
    aug = A.parse(args.spec)
    images, labels = load(args.raw, args.batch)
    rows: list[tuple[str, float]] = []

    def timed(name: str, fn, sync=lambda: None) -> None:  # type: ignore[no-untyped-def]
        fn(0)
        sync()
        t = time.perf_counter()
        for b in range(args.batches):
            fn(b)
        sync()
        rows.append((name, args.batch * args.batches / (time.perf_counter() - t)))

    idx = np.arange(args.batch)
    timed("shardkit numpy/OpenCV batched", lambda b: aug(images, labels, idx + b * args.batch, seed=0, epoch=0,
                                                          ignore_index=11))
    try:
        import torch

        from shardkit.augment.torch import apply_batch
    except ImportError:
        torch = None
    if torch is not None:
        dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        ti, tl = torch.from_numpy(images).to(dev), torch.from_numpy(labels).to(dev)
        sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
        timed(f"shardkit torch ({dev})", lambda b: apply_batch(aug, ti, tl, idx + b * args.batch, seed=0, epoch=0,
                                                              ignore_index=11), sync)
    base = rows[0][1]
    print(f"{'path':40s} {'samples/s':>10s} {'x cpu':>7s}   spec={args.spec} batch={args.batch} "
          f"input={images.shape[1]}x{images.shape[2]}")
    for name, rate in rows:
        print(f"{name:40s} {rate:10.1f} {rate / base:7.2f}")


if __name__ == "__main__":
    main()
