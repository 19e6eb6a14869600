"""TensorFlow augmentation vs the numpy/OpenCV path, side by side in one run, on a converted split.

    python scripts/bench_augment_tf.py out/train [--spec "scale=0.5:2,crop=352x480,hflip,rotate=10,jitter=0.2"]
        [--batch 16] [--batches 10] [--json FILE]

Rows (samples/s, and the ratio to the first row):
- apply only, one in-memory batch of the split's first --batch samples: ``aug(images, labels, idx)`` (numpy/OpenCV)
  vs :func:`shardkit.augment.tf.apply_batch` traced once in a ``tf.function``;
- end to end, --batches batches read and augmented: ``Dataset.iter_batches(augment=)`` vs
  ``shardkit.tf.dataset(augment=)`` (tf.data, parallel map, prefetch).
Each row gets one warm-up batch first. The machine may be shared with other work: compare ratios from one run.
It also prints how the TF outputs of that batch agree with the numpy/OpenCV ones (labels identical or not; image
values differing, largest difference).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

import shardkit
import shardkit.tf
from shardkit import augment as A
from shardkit.augment.tf import apply_batch


def rate(batches, n_batches: int, batch: int) -> float:  # type: ignore[no-untyped-def]
    """Samples/s over ``n_batches`` batches of an iterator, after one warm-up batch."""
    it = iter(batches)
    next(it)
    t = time.perf_counter()
    for _ in itertools.islice(it, n_batches):
        pass
    return n_batches * batch / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("split", type=Path)
    ap.add_argument("--spec", default="scale=0.5:2,crop=352x480,hflip,rotate=10,jitter=0.2")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args()
    aug = A.parse(args.spec)
    ds = shardkit.open(args.split)
    ignore = 255 if ds.ignore_index is None else int(ds.ignore_index)
    b, nb = args.batch, args.batches
    images, labels = ds.batch(np.arange(b) % len(ds))
    idx = np.arange(b)

    def cpu_apply():  # type: ignore[no-untyped-def]
        for k in itertools.count():
            yield aug(images, labels, idx + k * b, seed=0, epoch=0, ignore_index=ignore)

    ti, tl = tf.constant(images), tf.constant(labels)
    traced = tf.function(lambda i: apply_batch(aug, ti, tl, i, seed=0, epoch=0, ignore_index=ignore))

    def tf_apply():  # type: ignore[no-untyped-def]
        for k in itertools.count():
            out = traced(tf.constant(idx + k * b))
            yield out[0].numpy(), out[1].numpy()

    def cpu_read():  # type: ignore[no-untyped-def]
        for epoch in itertools.count():
            yield from ds.iter_batches(b, seed=0, epoch=epoch, augment=aug, drop_last=True)

    data = shardkit.tf.dataset(args.split, shardkit.EpochPlan(b, seed=0, drop_last=True), augment=aug).repeat()
    rows = [("apply: numpy/OpenCV", rate(cpu_apply(), nb, b)),
            ("apply: TensorFlow ops (tf.function)", rate(tf_apply(), nb, b)),
            ("read+augment: iter_batches(augment=)", rate(cpu_read(), nb, b)),
            ("read+augment: shardkit.tf.dataset(augment=)", rate(data, nb, b))]
    want_img, want_lab = aug(images, labels, idx, seed=0, epoch=0, ignore_index=ignore)
    got_img, got_lab = (t.numpy() for t in traced(tf.constant(idx)))
    diff = np.abs(got_img.astype(np.int16) - want_img)
    agree = {"labels_identical": bool(np.array_equal(got_lab, want_lab)), "image_max_diff": int(diff.max()),
             "image_share_diff_gt0": float(np.mean(diff > 0)), "image_share_diff_gt1": float(np.mean(diff > 1))}
    print(f"{'path':46s} {'samples/s':>10s} {'x numpy':>8s}   spec={args.spec} batch={b} "
          f"input={images.shape[1]}x{images.shape[2]} cpus={os.cpu_count()}")
    for name, r in rows:
        base = rows[0][1] if name.startswith("apply") else rows[2][1]
        print(f"{name:46s} {r:10.1f} {r / base:8.2f}")
    print(f"TF vs numpy/OpenCV on the first batch: labels identical {agree['labels_identical']}; image values "
          f"differing {agree['image_share_diff_gt0']:.2e} (by more than 1: {agree['image_share_diff_gt1']:.2e}), "
          f"largest difference {agree['image_max_diff']}")
    if args.json is not None:
        args.json.write_text(json.dumps({"spec": args.spec, "batch": b, "batches": nb, "agreement": agree,
                                         "rows": [{"path": n, "samples_per_s": r} for n, r in rows]}, indent=1))


if __name__ == "__main__":
    main()
