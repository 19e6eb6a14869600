"""Per-class pixel counts, class presence and image channel statistics, mergeable per shard.

Workers compute one :class:`Stats` per shard; the parent merges them in shard order,
so the floating-point sums (and hence the manifest) are the same for any worker count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

_HIST_EXACT = 1 << 24  # OpenCV's float32 histogram bins count exactly below this many pixels


def class_counts(ids: np.ndarray, num_classes: int) -> np.ndarray:
    """Pixels per id value (int64, at least ``num_classes`` long).

    uint8 ids go through OpenCV's histogram (~2x faster than ``np.bincount``, which first widens
    every pixel to int64); its float32 bins are exact below 2**24 pixels per image.
    """
    if ids.dtype == np.uint8 and ids.size < _HIST_EXACT:
        hist = cv2.calcHist([np.ascontiguousarray(ids)], [0], None, [256], [0, 256]).ravel().astype(np.int64)
        return hist if num_classes <= 256 else np.pad(hist, (0, num_classes - 256))
    return np.bincount(ids.ravel(), minlength=num_classes)


_LEVELS = np.arange(256, dtype=np.int64)
_SQUARES = _LEVELS * _LEVELS


def channel_histograms(image: np.ndarray) -> np.ndarray:
    """(3, 256) int64: pixels per level of each channel of a uint8 (H, W, 3) image.

    Channel sums and sums of squares follow exactly as integers (``hist @ levels``). OpenCV's histogram
    reads the interleaved image in place (no channel split), ~1.6x faster than summing split channels, and
    its float32 bins are exact below 2**24 pixels; larger images are counted with ``np.bincount``.
    """
    if image.shape[0] * image.shape[1] < _HIST_EXACT:
        image = np.ascontiguousarray(image)
        return np.stack([cv2.calcHist([image], [c], None, [256], [0, 256]).ravel() for c in range(3)]).astype(np.int64)
    return np.stack([np.bincount(image[..., c].ravel(), minlength=256) for c in range(3)]).astype(np.int64)


@dataclass
class Stats:
    """Running totals over stored samples (after preprocessing, before label encoding)."""

    num_classes: int
    class_pixels: np.ndarray = field(init=False)
    ignore_pixels: int = 0
    pixels: int = 0
    channel_sum: np.ndarray = field(init=False)
    channel_sumsq: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.class_pixels = np.zeros(self.num_classes, dtype=np.int64)
        self.channel_sum = np.zeros(3, dtype=np.float64)
        self.channel_sumsq = np.zeros(3, dtype=np.float64)

    def add(self, image: np.ndarray, ids: np.ndarray) -> list[int]:
        """Count one sample; returns the sorted class ids < num_classes present in it.

        An ignore id at or above ``num_classes`` (255) is counted in ``ignore_pixels`` only; an
        ignore id inside the class range (CamVid's 11) is counted like any class.
        """
        counts = class_counts(ids, self.num_classes)
        inside = counts[: self.num_classes]
        self.class_pixels += inside
        self.ignore_pixels += int(counts[self.num_classes :].sum())
        self.pixels += image.shape[0] * image.shape[1]
        hist = channel_histograms(image)  # exact integer sums, so totals do not depend on merge order
        self.channel_sum += (hist @ _LEVELS).astype(np.float64)
        self.channel_sumsq += (hist @ _SQUARES).astype(np.float64)
        return [int(c) for c in np.flatnonzero(inside)]

    def merge(self, other: Stats) -> None:
        self.class_pixels += other.class_pixels
        self.ignore_pixels += other.ignore_pixels
        self.pixels += other.pixels
        self.channel_sum += other.channel_sum
        self.channel_sumsq += other.channel_sumsq

    def to_wire(self) -> dict[str, Any]:
        """Plain lists for the trip from a worker to the parent (no pickled numpy needed)."""
        return {
            "num_classes": self.num_classes,
            "class_pixels": self.class_pixels.tolist(),
            "ignore_pixels": self.ignore_pixels,
            "pixels": self.pixels,
            "channel_sum": self.channel_sum.tolist(),
            "channel_sumsq": self.channel_sumsq.tolist(),
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Stats:
        s = cls(int(d["num_classes"]))
        s.class_pixels = np.asarray(d["class_pixels"], dtype=np.int64)
        s.ignore_pixels = int(d["ignore_pixels"])
        s.pixels = int(d["pixels"])
        s.channel_sum = np.asarray(d["channel_sum"], dtype=np.float64)
        s.channel_sumsq = np.asarray(d["channel_sumsq"], dtype=np.float64)
        return s

    def to_manifest(self) -> dict[str, Any]:
        """Totals plus the derived mean/std (0–255 scale) and per-class pixel share."""
        n = max(self.pixels, 1)
        mean = self.channel_sum / n
        var = np.maximum(self.channel_sumsq / n - mean * mean, 0.0)
        labelled = max(int(self.class_pixels.sum()), 1)
        return {
            "pixels": self.pixels,
            "class_pixels": self.class_pixels.tolist(),
            "ignore_pixels": self.ignore_pixels,
            "class_share": [round(float(c) / labelled, 8) for c in self.class_pixels],
            "image_mean": [round(float(v), 6) for v in mean],
            "image_std": [round(float(v), 6) for v in np.sqrt(var)],
        }


def ignore_share(stats: dict[str, Any], ignore_index: int | None, num_classes: int) -> float | None:
    """The share of all label pixels (padding included) that hold ``ignore_index``, from a manifest's ``stats``:
    an ignore id inside the class range (CamVid's 11) is one of ``class_pixels``; one above it (255) is
    ``ignore_pixels``. None without an ignore index or pixel counts."""
    pixels = int(stats.get("pixels", 0))
    if ignore_index is None or pixels <= 0:
        return None
    counts = stats.get("class_pixels", [])
    n = counts[ignore_index] if ignore_index < min(num_classes, len(counts)) else stats.get("ignore_pixels", 0)
    return int(n) / pixels
