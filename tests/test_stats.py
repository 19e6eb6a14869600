"""Per-sample statistics: class counts agree with np.bincount whichever counting path is taken."""

from __future__ import annotations

import numpy as np
import pytest

from shardkit.stats import Stats, class_counts


@pytest.mark.parametrize(("dtype", "high", "num_classes"), [
    (np.uint8, 256, 12),   # OpenCV histogram path, ids past the classes (255 ignore) included
    (np.uint8, 12, 300),   # more classes than uint8 values: padded with zeros
    (np.uint16, 1000, 1000),
])
def test_class_counts_equal_bincount(dtype: type, high: int, num_classes: int) -> None:
    ids = np.random.default_rng(0).integers(0, high, (61, 77)).astype(dtype)
    got = class_counts(ids, num_classes)
    want = np.bincount(ids.ravel(), minlength=num_classes)
    assert got.dtype == np.int64
    assert np.array_equal(got[: len(want)], want) and not got[len(want):].any()


def test_stats_count_ignore_pixels_apart_from_classes() -> None:
    ids = np.full((4, 5), 255, np.uint8)
    ids[0] = [0, 1, 1, 2, 2]
    s = Stats(3)
    present = s.add(np.zeros((4, 5, 3), np.uint8), ids)
    assert present == [0, 1, 2]
    assert s.class_pixels.tolist() == [1, 2, 2] and s.ignore_pixels == 15 and s.pixels == 20


@pytest.mark.parametrize("histogram", [True, False])
def test_channel_sums_and_squares_are_exact(histogram: bool, monkeypatch) -> None:
    from shardkit import stats

    if not histogram:
        monkeypatch.setattr(stats, "_HIST_EXACT", 0)  # the np.bincount path of images of 2**24+ pixels
    rng = np.random.default_rng(3)
    s = Stats(4)
    images = [rng.integers(0, 256, (37, 53, 3), dtype=np.uint8) for _ in range(3)]
    images.append(np.full((20, 30, 3), 255, np.uint8)[:, ::2])  # a strided view
    for image in images:
        s.add(image, np.zeros(image.shape[:2], np.uint8))
    wide = [im.astype(np.int64) for im in images]
    assert s.channel_sum.tolist() == sum(w.sum(axis=(0, 1)) for w in wide).tolist()
    assert s.channel_sumsq.tolist() == sum((w * w).sum(axis=(0, 1)) for w in wide).tolist()
