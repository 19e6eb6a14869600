"""One compiled pass over a stored uint8 image for what convert keeps of its pixels besides their hash: each band's
histogram (the split's channel statistics, :mod:`shardkit.store.stats`) and the row-block column sums of its look
hash (:mod:`shardkit.images.looks`). Separately they read the image four times (a histogram per band, then the
block sums in int64); the results are the same integers either way, so the manifest and sidecars are unchanged.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..support import jit
from .looks import ROWS, row_starts


class PixelPass(NamedTuple):
    histograms: np.ndarray  # (C, 256) int64: pixels per level of each band
    bands: np.ndarray  # (ROWS, W) int64: per row block of the look hash, each column's sum over rows and bands


def _pass_loop(plane: np.ndarray, channels: int, block: np.ndarray, hist: np.ndarray,
               bands: np.ndarray) -> None:  # numba
    """``hist[c, v]`` += 1 for every value ``v`` of band ``c``; ``bands[block[y], x]`` += the band sum at (y, x)."""
    width = plane.shape[1] // channels
    for y in range(plane.shape[0]):
        r = block[y]
        for x in range(width):
            s = 0
            for c in range(channels):
                v = plane[y, x * channels + c]
                hist[c, v] += 1
                s += v
            bands[r, x] += s


def _warm(kernels: tuple[Any, ...]) -> None:
    kernels[0](np.zeros((2, 6), np.uint8), 3, np.zeros(2, np.int64), np.zeros((3, 256), np.int64),
               np.zeros((ROWS, 2), np.int64))


KERNELS = jit.LazyKernels((_pass_loop,), _warm, "image statistics")


def image_pass(image: np.ndarray) -> PixelPass | None:
    """The band histograms and look-hash block sums of a uint8 (H, W, C) image (C ≤ 4, H ≥ ROWS, so that the look
    hash's row blocks cut the rows without overlap) in one compiled pass; None for other images or without numba
    (the callers then compute each their own way)."""
    if image.dtype != np.uint8 or image.ndim != 3 or not 1 <= image.shape[2] <= 4 or image.shape[0] < ROWS:
        return None
    kernels = KERNELS.get()
    if kernels is None:
        return None
    h, w, c = (int(s) for s in image.shape)
    block = np.repeat(np.arange(ROWS, dtype=np.int64), np.diff(np.append(row_starts(h), h)))
    hist, bands = np.zeros((c, 256), np.int64), np.zeros((ROWS, w), np.int64)
    kernels[0](np.ascontiguousarray(image).reshape(h, w * c), c, block, hist, bands)
    return PixelPass(hist, bands)
