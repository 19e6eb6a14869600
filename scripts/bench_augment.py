"""Augmentation throughput, side by side in one run: shardkit's numpy/OpenCV batched path vs its torch path,
plus (with --workers > 0) shardkit's numpy path and a per-sample albumentations.Compose, each in a torch
DataLoader with that many workers.

    python scripts/bench_augment.py RAW_CAMVID [--spec "scale=0.5:2,crop=352x480,hflip,rotate=10,jitter=0.2"]
        [--batch 16] [--batches 20] [--device cuda] [--workers 2]

Converts nothing: it decodes the CamVid train pairs once, then times whole batches (parameters drawn and
applied) per path and prints samples/s and the ratio to the CPU path. On CUDA the torch path's time is
measured with the device synchronised after every batch. Numbers belong in the README as ratios (absolute
times only from a GPU machine).

The DataLoader rows compare like with like: shardkit's numpy path gets one list of indices per
``__getitem__`` (batch_size=None, a sampler of index lists); albumentations gets one sample per
``__getitem__`` (batch_size=--batch, default collate). Both are timed over --batches batches after a first
(warm-up, worker start) batch. albumentations is optional (``pip install albumentations``, e.g. with the
``bench`` extra); without it its row is skipped with a note. Its pipeline is the nearest equivalent of the
spec: RandomScale, Rotate (constant border, mask fill = ignore index), PadIfNeeded + RandomCrop,
HorizontalFlip, ColorJitter(brightness, contrast, 0, 0); masks use nearest interpolation.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import cv2
import numpy as np

from shardkit import augment as A
from shardkit.augment import ops as O

IGNORE = 11


def albu_compose(aug: O.Compose):  # type: ignore[no-untyped-def]
    """The nearest albumentations.Compose to ``aug`` (imported lazily; ImportError when not installed)."""
    import albumentations as al

    ts = []
    for op in aug.ops:
        if isinstance(op, O.RandomScale):
            ts.append(al.RandomScale(scale_limit=(op.lo - 1, op.hi - 1), interpolation=cv2.INTER_LINEAR,
                                     mask_interpolation=cv2.INTER_NEAREST, p=1.0))
        elif isinstance(op, O.RandomRotate):
            ts.append(al.Rotate(limit=(-op.degrees, op.degrees), interpolation=cv2.INTER_LINEAR,
                                mask_interpolation=cv2.INTER_NEAREST, border_mode=cv2.BORDER_CONSTANT, fill=0,
                                fill_mask=IGNORE, p=1.0))
        elif isinstance(op, O.RandomCrop):
            ts.append(al.PadIfNeeded(op.h, op.w, position="top_left", border_mode=cv2.BORDER_CONSTANT, fill=0,
                                     fill_mask=IGNORE))
            ts.append(al.RandomCrop(op.h, op.w))
        elif isinstance(op, O.RandomFlip):
            ts.append(al.HorizontalFlip(p=op.horizontal))
        elif isinstance(op, O.ColorJitter):
            ts.append(al.ColorJitter(brightness=op.brightness, contrast=op.contrast, saturation=0, hue=0, p=1.0))
        else:
            raise ValueError(f"no albumentations equivalent for {type(op).__name__}")
    return al.Compose(ts)


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
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers for the loader rows (0: skip them)")
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
    if torch is not None and args.workers > 0:
        loader_rows(args, aug, images, labels, rows)
    base = rows[0][1]
    print(f"{'path':40s} {'samples/s':>10s} {'x cpu':>7s}   spec={args.spec} batch={args.batch} "
          f"input={images.shape[1]}x{images.shape[2]}")
    for name, rate in rows:
        print(f"{name:40s} {rate:10.1f} {rate / base:7.2f}")
    loaders = dict(rows)
    sk, al = (loaders.get(f"{k} DataLoader({args.workers} workers)") for k in ("shardkit numpy", "albumentations"))
    if sk and al:
        print(f"shardkit numpy / albumentations, both in DataLoader({args.workers} workers): {sk / al:.2f}x")


def loader_rows(args: argparse.Namespace, aug: O.Compose, images: np.ndarray, labels: np.ndarray,
                rows: list[tuple[str, float]]) -> None:
    """shardkit's numpy path and (if installed) albumentations, each in a torch DataLoader."""
    from torch.utils.data import DataLoader, Dataset

    n, B, nb = len(images), args.batch, args.batches

    def rate(loader) -> float:  # type: ignore[no-untyped-def]
        it = iter(loader)
        next(it)  # warm-up: worker start and first batch
        t = time.perf_counter()
        k = sum(1 for _ in it)
        assert k == nb, k
        return B * nb / (time.perf_counter() - t)

    class ShardkitBatches(Dataset):
        def __getitem__(self, idx):  # type: ignore[no-untyped-def]
            idx = np.asarray(idx)
            return aug(images[idx % n], labels[idx % n], idx, seed=0, epoch=0, ignore_index=IGNORE)

    batches = [list(range(b * B, (b + 1) * B)) for b in range(nb + 1)]
    name = f"DataLoader({args.workers} workers)"
    rows.append((f"shardkit numpy {name}", rate(DataLoader(ShardkitBatches(), batch_size=None, sampler=batches,
                                                           num_workers=args.workers))))
    try:
        tf = albu_compose(aug)
    except ImportError:
        print("note: albumentations is not installed; its row is skipped (pip install albumentations)")
        return

    class AlbuSamples(Dataset):
        def __len__(self) -> int:
            return B * (nb + 1)

        def __getitem__(self, i):  # type: ignore[no-untyped-def]
            out = tf(image=images[i % n], mask=labels[i % n])
            return out["image"], out["mask"]

    rows.append((f"albumentations {name}", rate(DataLoader(AlbuSamples(), batch_size=B, num_workers=args.workers))))


if __name__ == "__main__":
    main()
