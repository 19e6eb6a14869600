"""Training-loop data wait on a GPU: shardkit's loader + CudaPrefetcher vs the naive online pipeline.

Trains the same segmentation model on the same CamVid samples three ways, in one run:

* ``naive``: a torch ``DataLoader`` whose workers do, per sample, what a training script does
  online — ``cv2.imread`` image and label, centre crop, float image normalised with the same
  mean/std, float one-hot by per-class comparison — collated by the default collate, pinned,
  copied to the GPU.
* ``shardkit``: ``make_loader`` over the converted LMDB split (whole batches per worker task,
  shared-memory ring, pinned) and ``CudaPrefetcher(labels="float_onehot")``, which copies the
  next uint8 batch on a side stream and normalises and expands one-hot on the GPU.
* ``resident``: one batch already on the GPU, reused every step: the model's own step time,
  the ceiling for any loader.

Every step ends with ``torch.cuda.synchronize()`` (as a loop that logs ``loss.item()`` would).
Data wait is the host time spent getting the next batch onto the GPU (``next()`` plus, for the
naive loader, the ``.to(device)`` calls); its share is total wait over total step time.
Figures are medians/sums over the timed steps after ``--warmup`` untimed ones, warm page
cache. Needs CUDA, torch and torchvision (for the model); run it on a GPU machine::

    python scripts/bench_train.py --data ../shared/data/camvid-segnet --model deeplabv3_resnet50 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from bench_peers import replicated_source, source_pairs  # scripts/ is on sys.path when run as a script
from torch.utils.data import DataLoader, Dataset

import shardkit
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
from shardkit.read.torch import CudaPrefetcher, make_loader

CROP = (352, 480)


class NaiveCamVid(Dataset):
    """Per sample: decode image and label PNGs, centre crop, normalise, float one-hot (per-class loop)."""

    def __init__(self, root: Path, samples: list[dict[str, Any]], mean: np.ndarray, std: np.ndarray,
                 num_classes: int) -> None:
        self.root, self.samples, self.num_classes = root, samples, num_classes
        self.mean, self.std = mean.astype(np.float32), std.astype(np.float32)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        rec = self.samples[i]
        image = cv2.cvtColor(cv2.imread(str(self.root / rec["key"]), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        label = cv2.imread(str(self.root / rec["label"]), cv2.IMREAD_UNCHANGED)
        top, left = (image.shape[0] - CROP[0]) // 2, (image.shape[1] - CROP[1]) // 2
        image = image[top : top + CROP[0], left : left + CROP[1]]
        label = label[top : top + CROP[0], left : left + CROP[1]]
        x = ((image.astype(np.float32) - self.mean) / self.std).transpose(2, 0, 1)
        y = np.stack([label == c for c in range(self.num_classes)]).astype(np.float32)
        return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y)


class Tiny(torch.nn.Module):
    """A small fully convolutional net (``--model tiny``): a light model, where data loading matters most."""

    def __init__(self, num_classes: int, width: int = 32) -> None:
        super().__init__()
        c = torch.nn
        self.body = c.Sequential(
            c.Conv2d(3, width, 3, stride=2, padding=1), c.ReLU(),
            c.Conv2d(width, 2 * width, 3, stride=2, padding=1), c.ReLU(),
            c.Conv2d(2 * width, 2 * width, 3, padding=1), c.ReLU(),
            c.Conv2d(2 * width, num_classes, 1), c.Upsample(scale_factor=4, mode="bilinear"))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": self.body(x)}


def repeated(data: Path, raw: Path, times: int) -> Path:
    """A SegNet-layout ``train`` split that links every train pair of ``data`` ``times`` times under new names.

    Both loaders then read epochs of ``times`` × the subset, so that epoch starts (which
    restart the DataLoader's prefetching) weigh as little as in a real dataset.
    """
    shutil.rmtree(raw, ignore_errors=True)  # links only: remade each run, so --repeat always holds
    replicated_source([(i, lab) for i, lab in source_pairs(data) if i.parent.name == "train"], raw, times)
    return raw


def build_model(name: str, num_classes: int, device: torch.device) -> torch.nn.Module | None:
    if name == "none":
        return None
    if name == "tiny":
        model = Tiny(num_classes)
    else:
        import torchvision.models.segmentation as seg

        model = getattr(seg, name)(weights=None, weights_backbone=None, num_classes=num_classes)
    return model.to(device).to(memory_format=torch.channels_last)


def train_steps(model: torch.nn.Module | None, batches: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]],
                steps: int, warmup: int) -> dict[str, float]:
    """Run ``warmup + steps`` training steps; time the data wait and the whole step of the last ``steps``.

    Without a model (``--model none``) a step only waits for the batch to be ready on the device:
    the rate is what the loader alone delivers.
    """
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9) if model is not None else None
    waits, totals, samples = [], [], 0
    it = batches()
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:  # next epoch: starting it counts as waiting for data
            it = batches()
            x, y = next(it)
        t1 = time.perf_counter()
        if model is not None and opt is not None:
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                out = model(x.contiguous(memory_format=torch.channels_last))["out"]
            loss = F.cross_entropy(out.float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if x.is_cuda:
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        if step >= warmup:
            waits.append(t1 - t0)
            totals.append(t2 - t0)
            samples += int(x.shape[0])
    return {"samples_per_s": samples / sum(totals), "step_ms": 1e3 * statistics.median(totals),
            "wait_ms": 1e3 * statistics.median(waits), "wait_share": sum(waits) / sum(totals)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_data = Path(os.environ.get("SHARDKIT_TEST_DATA", Path(__file__).parents[2] / "shared" / "data"))
    ap.add_argument("--data", type=Path, default=default_data / "camvid-segnet", help="raw CamVid (SegNet layout)")
    ap.add_argument("--work", type=Path, default=None, help="where to convert (default: a temporary folder)")
    ap.add_argument("--model", default="deeplabv3_resnet50",
                    help="a torchvision.models.segmentation builder, tiny (a 4-layer net), or none (the loader alone)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers, the same for both loaders")
    ap.add_argument("--repeat", type=int, default=8,
                    help="epochs of the small subset are a few steps long: list each pair this many times")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--device", default="cuda", help="cuda (the measurement), or cpu for a smoke test")
    ap.add_argument("--augment", default=None,
                    help="a shardkit.augment string (e.g. scale=0.5:2,crop=352x480,hflip,rotate=10,jitter=0.2): "
                         "adds rows with it applied on the GPU (CudaPrefetcher) and in the workers (CPU)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_train needs a CUDA GPU (or --device cpu for a smoke test)")
    torch.backends.cudnn.benchmark = True
    work = args.work or Path(tempfile.mkdtemp(prefix="shardkit-train-"))
    raw = repeated(args.data, work / "raw", args.repeat)
    convert(ConvertConfig(raw, work / "out", format="lmdb", size=CROP, splits=("train",),
                          workers=os.cpu_count() or 1, quiet=True))
    split = work / "out" / "train"
    core = shardkit.open(split)
    print(f"{len(core)} samples {CROP[0]}x{CROP[1]}, {core.num_classes} classes; model {args.model}, "
          f"batch {args.batch_size}, {args.workers} workers, "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}, torch {torch.__version__}")

    naive_loader = DataLoader(NaiveCamVid(raw, core.manifest.samples, core.mean, core.std, core.num_classes),
                              batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                              pin_memory=device.type == "cuda",
                              drop_last=True, persistent_workers=args.workers > 0)

    def naive() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y in naive_loader:
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    shard_loader = make_loader(split, shardkit.EpochPlan(args.batch_size, shuffle=True, drop_last=True),
                               num_workers=args.workers, reuse_buffers=True)
    prefetcher = CudaPrefetcher(shard_loader, device, labels="float_onehot")

    fixed = next(iter(prefetcher))

    def resident() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield fixed

    extra: list[tuple[str, Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]]] = []
    if args.augment:
        from shardkit import augment as A

        aug = A.parse(args.augment)
        plan = shardkit.EpochPlan(args.batch_size, shuffle=True, drop_last=True)
        gpu_aug = CudaPrefetcher(make_loader(split, plan, num_workers=args.workers, with_indices=True),
                                 device, labels="float_onehot", augment=aug)
        cpu_aug = CudaPrefetcher(make_loader(split, plan, num_workers=args.workers, augment=aug),
                                 device, labels="float_onehot")

        def pairs(pre: CudaPrefetcher) -> Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]:
            return lambda: ((b[0], b[1]) for b in pre)

        extra = [("shardkit + GPU augment", pairs(gpu_aug)), ("shardkit + worker (CPU) augment", pairs(cpu_aug))]

    model = build_model(args.model, core.num_classes, device)
    rows = {}
    variants = [("resident batch (model only)", resident)] if model is not None else []
    variants += [("shardkit + CudaPrefetcher", lambda: iter(prefetcher)), *extra, ("naive online DataLoader", naive)]
    for name, batches in variants:
        rows[name] = train_steps(model, batches, args.steps, args.warmup)
    naive_rate = rows["naive online DataLoader"]["samples_per_s"]
    print(f"{'loader':<30} {'samples/s':>10} {'step ms':>8} {'wait ms':>8} {'wait share':>10} {'x naive':>8}")
    for name, r in rows.items():
        print(f"{name:<30} {r['samples_per_s']:10.1f} {r['step_ms']:8.1f} {r['wait_ms']:8.2f} "
              f"{100 * r['wait_share']:9.1f}% {r['samples_per_s'] / naive_rate:8.2f}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
