"""Per-class pixel counts, class presence and image channel statistics, mergeable per shard; class weights.

Workers compute one :class:`Stats` per shard; the parent merges them in shard order,
so the floating-point sums (and hence the manifest) are the same for any worker count.

:func:`class_weights` turns what a split already keeps — its per-class pixel counts (manifest
``stats.class_pixels``) and, per sample, its size and class-presence bitmap (the samples sidecars) —
into loss weights, without reading a label (formulae: ``docs/class-imbalance.md``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError, IntegrityError
from ..files.samples import MAX_BITMAP_CLASSES

if TYPE_CHECKING:
    from ..files.splitfiles import ShardInfo
    from .manifest import Manifest

log = logging.getLogger(__name__)

_HIST_EXACT = 1 << 24  # OpenCV's float32 histogram bins count exactly below this many pixels


def class_counts(ids: np.ndarray, num_classes: int) -> np.ndarray:
    """Pixels per id value (int64, at least ``num_classes`` long).

    uint8 ids go through OpenCV's histogram (~2x faster than ``np.bincount``, which first widens
    every pixel to int64); its float32 bins are exact below 2**24 pixels per image.
    """
    if ids.dtype == np.uint8 and ids.size < _HIST_EXACT:
        import cv2  # here, not at import: `shardkit info` reads class weights without loading OpenCV

        hist = cv2.calcHist([np.ascontiguousarray(ids)], [0], None, [256], [0, 256]).ravel().astype(np.int64)
        return hist if num_classes <= 256 else np.pad(hist, (0, num_classes - 256))
    return np.bincount(ids.ravel(), minlength=num_classes)


_LEVELS = np.arange(256, dtype=np.int64)
_SQUARES = _LEVELS * _LEVELS


def channel_histograms(image: np.ndarray) -> np.ndarray:
    """(C, 256) int64: pixels per level of each channel of a uint8 (H, W, C) image.

    Channel sums and sums of squares follow exactly as integers (``hist @ levels``). OpenCV's histogram
    reads the interleaved image in place (no channel split), ~1.6x faster than summing split channels, and
    its float32 bins are exact below 2**24 pixels; larger images are counted with ``np.bincount``.
    """
    channels = image.shape[2]
    if image.shape[0] * image.shape[1] < _HIST_EXACT and channels <= 4:
        import cv2

        image = np.ascontiguousarray(image)
        return np.stack([cv2.calcHist([image], [c], None, [256], [0, 256]).ravel()
                         for c in range(channels)]).astype(np.int64)
    return np.stack([np.bincount(image[..., c].ravel(), minlength=256) for c in range(channels)]).astype(np.int64)


def channel_sums(image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sum, sum of squares) of each band of an (H, W, C) image, float64; exact integers for integer images
    (uint8 by histogram, 16-bit in int64), so totals do not depend on how samples are grouped into shards."""
    if image.dtype == np.uint8:
        hist = channel_histograms(image)
        return (hist @ _LEVELS).astype(np.float64), (hist @ _SQUARES).astype(np.float64)
    flat = image.reshape(-1, image.shape[2])
    if image.dtype.kind in "iu":
        wide = flat.astype(np.int64)
        return wide.sum(axis=0).astype(np.float64), np.einsum("ij,ij->j", wide, wide).astype(np.float64)
    wide64 = flat.astype(np.float64)
    return wide64.sum(axis=0), np.einsum("ij,ij->j", wide64, wide64)


@dataclass
class Stats:
    """Running totals over stored samples (after preprocessing, before label encoding)."""

    num_classes: int
    channels: int = 3
    #: also track each band's smallest and largest value (splits of other images than RGB uint8: manifest 4)
    ranges: bool = False
    class_pixels: np.ndarray = field(init=False)
    ignore_pixels: int = 0
    pixels: int = 0
    #: pixels the image statistics count: the source's, not the padding (``pixels`` counts every label pixel)
    image_pixels: int = 0
    channel_sum: np.ndarray = field(init=False)
    channel_sumsq: np.ndarray = field(init=False)
    #: smallest and largest value of each band (finite values; +inf/-inf before any pixel)
    channel_min: np.ndarray = field(init=False)
    channel_max: np.ndarray = field(init=False)
    #: NaN and ±inf values of each band (float images): the band statistics leave them out, like padding
    channel_nonfinite: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.channel_nonfinite = np.zeros(self.channels, dtype=np.int64)
        self.class_pixels = np.zeros(self.num_classes, dtype=np.int64)
        self.channel_sum = np.zeros(self.channels, dtype=np.float64)
        self.channel_sumsq = np.zeros(self.channels, dtype=np.float64)
        self.channel_min = np.full(self.channels, np.inf)
        self.channel_max = np.full(self.channels, -np.inf)

    def add(self, image: np.ndarray, ids: np.ndarray, box: tuple[int, int, int, int] | None = None) -> list[int]:
        """Count one sample; returns the sorted class ids < num_classes present in it.

        An ignore id at or above ``num_classes`` (255) is counted in ``ignore_pixels`` only; an
        ignore id inside the class range (CamVid's 11) is counted like any class. ``box``: (y0, y1, x0, x1), the
        part of ``image`` that holds source pixels (the rest is padding, which the band statistics leave out).
        """
        counts = class_counts(ids, self.num_classes)
        self.add_label_counts(counts)
        self.add_image(image, box)
        return [int(c) for c in np.flatnonzero(counts[: self.num_classes])]

    def add_label_counts(self, counts: np.ndarray) -> None:
        """Count one label's pixels per id value (at least ``num_classes`` long; values past the class range are
        the ignore id above it). ``verify`` counts a label block by block and adds the totals here."""
        self.class_pixels += counts[: self.num_classes]
        self.ignore_pixels += int(counts[self.num_classes :].sum())

    def add_image(self, image: np.ndarray, box: tuple[int, int, int, int] | None = None) -> None:
        """Count one stored image: its pixels, and the band statistics over ``box`` (see :meth:`add`)."""
        self.pixels += image.shape[0] * image.shape[1]
        if image.ndim == 2:
            image = image[:, :, None]
        if box is not None:
            image = image[box[0] : box[1], box[2] : box[3]]
        self.image_pixels += image.shape[0] * image.shape[1]
        if image.dtype.kind == "f":
            bad = ~np.isfinite(image)
            if bad.any():  # NaN/inf (a float image's "no data"): counted, then left out of the sums
                self.channel_nonfinite += bad.reshape(-1, image.shape[2]).sum(axis=0)
                image = np.where(bad, np.zeros((), image.dtype), image)
        total, squares = channel_sums(image)
        self.channel_sum += total
        self.channel_sumsq += squares
        if self.ranges and image.size:
            flat = image.reshape(-1, image.shape[2])
            if flat.dtype.kind == "f":
                lo, hi = np.nanmin(np.where(np.isfinite(flat), flat, np.nan), axis=0), \
                    np.nanmax(np.where(np.isfinite(flat), flat, np.nan), axis=0)
            else:
                lo, hi = flat.min(axis=0), flat.max(axis=0)
            self.channel_min = np.fmin(self.channel_min, lo.astype(np.float64))
            self.channel_max = np.fmax(self.channel_max, hi.astype(np.float64))

    def merge(self, other: Stats) -> None:
        self.class_pixels += other.class_pixels
        self.ignore_pixels += other.ignore_pixels
        self.pixels += other.pixels
        self.image_pixels += other.image_pixels
        self.channel_sum += other.channel_sum
        self.channel_sumsq += other.channel_sumsq
        self.channel_min = np.fmin(self.channel_min, other.channel_min)
        self.channel_max = np.fmax(self.channel_max, other.channel_max)
        self.channel_nonfinite += other.channel_nonfinite

    def to_wire(self) -> dict[str, Any]:
        """Plain lists for the trip from a worker to the parent (no pickled numpy needed)."""
        return {
            "num_classes": self.num_classes,
            "class_pixels": self.class_pixels.tolist(),
            "ignore_pixels": self.ignore_pixels,
            "pixels": self.pixels,
            # only when padding was left out: shard records of unpadded splits stay as they were
            **({"image_pixels": self.image_pixels} if self.image_pixels != self.pixels else {}),
            "channel_sum": self.channel_sum.tolist(),
            "channel_sumsq": self.channel_sumsq.tolist(),
            **({"channel_min": [float(v) if np.isfinite(v) else None for v in self.channel_min],
                "channel_max": [float(v) if np.isfinite(v) else None for v in self.channel_max]}
               if self.ranges else {}),
            **({"channel_nonfinite": self.channel_nonfinite.tolist()} if self.channel_nonfinite.any() else {}),
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Stats:
        s = cls(int(d["num_classes"]), len(d["channel_sum"]))
        s.class_pixels = np.asarray(d["class_pixels"], dtype=np.int64)
        s.ignore_pixels = int(d["ignore_pixels"])
        s.pixels = int(d["pixels"])
        s.image_pixels = int(d.get("image_pixels", d["pixels"]))
        s.channel_sum = np.asarray(d["channel_sum"], dtype=np.float64)
        s.channel_sumsq = np.asarray(d["channel_sumsq"], dtype=np.float64)
        if "channel_min" in d:  # only splits that keep ranges (and not shard records written before them)
            s.ranges = True
            s.channel_min = np.array([np.inf if v is None else v for v in d["channel_min"]], np.float64)
            s.channel_max = np.array([-np.inf if v is None else v for v in d["channel_max"]], np.float64)
        if "channel_nonfinite" in d:
            s.channel_nonfinite = np.asarray(d["channel_nonfinite"], dtype=np.int64)
        return s

    def nonfinite_warning(self) -> str | None:
        """One line saying how many NaN/inf image values each band had, or None when there were none."""
        if not self.channel_nonfinite.any():
            return None
        bands = ", ".join(f"band {b + 1}: {int(n)}" for b, n in enumerate(self.channel_nonfinite) if n)
        return (f"{int(self.channel_nonfinite.sum())} NaN/inf image values ({bands}) are stored as they are; the "
                "band statistics (mean, std, range) leave them out — mask them in training (e.g. torch.nan_to_num)")

    def to_manifest(self) -> dict[str, Any]:
        """Totals plus the derived mean/std of each band (the stored values' own scale, over source pixels: padding
        left out) and per-class pixel share."""
        n = np.maximum(self.image_pixels - self.channel_nonfinite, 1)  # finite source pixels of each band
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
            # ranges: each band's smallest and largest stored value (manifest version 4 splits; RGB uint8 ones keep
            # their version 3 stats byte for byte)
            **({"image_min": [float(v) if np.isfinite(v) else None for v in self.channel_min],
                "image_max": [float(v) if np.isfinite(v) else None for v in self.channel_max]} if self.ranges else {}),
            # NaN/inf values of each band, which the mean, std and range leave out (only when a band has any)
            **({"image_nonfinite": self.channel_nonfinite.tolist()} if self.channel_nonfinite.any() else {}),
        }


#: Class weighting methods of :func:`class_weights` (docs/class-imbalance.md).
WEIGHT_METHODS = ("median_frequency", "inverse", "inverse_sqrt", "enet")
#: ENet's k in ``1 / ln(k + p(c))`` (Paszke et al. 2016): bounds the largest weight at 1 / ln(1.02) ~ 50.5.
ENET_K = 1.02


@dataclass(frozen=True)
class ClassFrequencies:
    """What class weights are computed from, for one split (all int64 counts, one entry per class).

    ``class_pixels``: pixels of each class (manifest ``stats.class_pixels``). ``image_pixels``: for each class,
    the height x width summed over the samples that contain it, and ``images``: how many samples contain it —
    both from the samples' sizes and class bitmaps; None where the split keeps no bitmap (more than 256
    classes). ``ignore_index``: a class id that gets weight 0 and whose pixels no frequency counts.
    """

    class_pixels: np.ndarray
    num_images: int
    image_pixels: np.ndarray | None = None
    images: np.ndarray | None = None
    ignore_index: int | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_pixels)

    def valid(self) -> np.ndarray:
        """bool per class: not the ignore class (the classes that get a weight)."""
        ok = np.ones(self.num_classes, bool)
        if self.ignore_index is not None and 0 <= self.ignore_index < self.num_classes:
            ok[self.ignore_index] = False
        return ok


def presence_totals(shards: Iterable[tuple[np.ndarray, np.ndarray | None]],
                    num_classes: int) -> tuple[int, np.ndarray | None, np.ndarray | None]:
    """(samples, image pixels per class, images per class) from each shard's ((n, 2) sizes, (n, C) presence).

    ``image_pixels[c]`` = sum of height x width over the samples whose bitmap has class ``c``; both
    per-class arrays are None when any shard has no bitmap. Exact int64 sums.
    """
    total = 0
    image_pixels: np.ndarray | None = np.zeros(num_classes, np.int64)
    images: np.ndarray | None = np.zeros(num_classes, np.int64)
    for hw, present in shards:
        total += len(hw)
        if present is None or image_pixels is None or images is None:
            image_pixels = images = None
            continue
        area = hw[:, 0].astype(np.int64) * hw[:, 1].astype(np.int64)
        image_pixels += area @ present.astype(np.int64)
        images += present.sum(axis=0, dtype=np.int64)
    return total, image_pixels, images


def presence_contradiction(freqs: ClassFrequencies) -> str | None:
    """Why the samples' class bitmaps cannot be those of the split's labels, or None: a cheap check (no label is
    read) that the class-balanced sampler makes before trusting them. The bitmaps and ``class_pixels`` come from
    the same counts, so a class has pixels exactly when some sample's bitmap holds it, and its pixels fit in the
    samples that hold it; ``shardkit verify`` recomputes every bitmap (a swap between samples passes this)."""
    if freqs.images is None or freqs.image_pixels is None:
        return None
    pixels, images = np.asarray(freqs.class_pixels, np.int64), np.asarray(freqs.images, np.int64)
    area = np.asarray(freqs.image_pixels, np.int64)
    for bad, what in (((pixels > 0) & (images == 0), "have pixels but no sample's bitmap holds them"),
                      ((pixels == 0) & (images > 0), "have no pixels but sample bitmaps hold them"),
                      (pixels > area, "have more pixels than the samples whose bitmaps hold them")):
        ids = np.flatnonzero(bad).tolist()
        if ids:
            shown = ", ".join(map(str, ids[:8])) + (", …" if len(ids) > 8 else "")
            return f"class(es) {shown} {what} (manifest stats.class_pixels vs the samples sidecars' classes)"
    return None


def split_frequencies(manifest: Manifest,
                      folder: Callable[[ShardInfo], Path] | None = None) -> ClassFrequencies:
    """The split's :class:`ClassFrequencies` from its manifest and its samples sidecars (no label is read).

    ``folder`` maps a shard to the folder holding its sidecar (a remote split's downloaded copy); by default
    the manifest's own. Splits of more than 256 classes keep no bitmap: no sidecar is read for them.
    """
    num_classes = int(manifest.sample["label"]["num_classes"])
    counts = np.zeros(num_classes, np.int64)
    stored = np.asarray(manifest.stats.get("class_pixels", []), np.int64)[:num_classes]
    counts[: len(stored)] = stored
    ignore = manifest.classes.get("ignore_index")
    if num_classes > MAX_BITMAP_CLASSES:
        return ClassFrequencies(counts, manifest.num_samples, ignore_index=ignore)
    table = manifest.samples

    def shards() -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        for pos, shard in enumerate(manifest.shards):
            where = folder(shard) if folder is not None and table.inline is None else None
            yield table.hw(pos, where), table.presence(pos, where)

    n, image_pixels, images = presence_totals(shards(), num_classes)
    return ClassFrequencies(counts, n, image_pixels, images, ignore)


def class_weights(method: str, freqs: ClassFrequencies, *, k: float = ENET_K) -> np.ndarray:
    """Loss weights per class (float32, ``num_classes`` long); docs/class-imbalance.md gives the formulae.

    * ``median_frequency`` (Eigen & Fergus 2015, SegNet): ``freq(c) = pixels of c / pixels of the images
      containing c``, ``w(c) = median(freq) / freq(c)``, the median over the classes that get a weight.
    * ``inverse``: ``w(c) = 1 / (K p(c))``, ``p(c) = pixels of c / non-ignore pixels``, K the classes with pixels
      (the pixel-weighted mean weight is 1; scikit-learn's "balanced").
    * ``inverse_sqrt``: ``w(c) = p(c)^-1/2 / sum_c' p(c')^1/2`` (again a pixel-weighted mean of 1).
    * ``enet`` (Paszke et al. 2016): ``w(c) = 1 / ln(k + p(c))``, k = 1.02.

    The ignore class gets 0; a class without pixels gets 0 and a warning.
    """
    if method not in WEIGHT_METHODS:
        raise ConfigError(f"class weight method {method!r} is not one of {', '.join(WEIGHT_METHODS)}")
    if method == "enet" and not k > 1.0:
        raise ConfigError(f"enet's k must be greater than 1 (got {k}): 1 / ln(k + p) is infinite or negative below")
    counts = np.asarray(freqs.class_pixels, np.int64)
    valid = freqs.valid()
    has = valid & (counts > 0)
    empty = np.flatnonzero(valid & (counts == 0)).tolist()
    if empty:
        log.warning("class weights: class(es) %s have no pixels in this split; their weight is 0",
                    ", ".join(map(str, empty)))
    w = np.zeros(freqs.num_classes, np.float64)
    if not has.any():
        return w.astype(np.float32)
    p = counts[has] / counts[valid].sum()
    if method == "median_frequency":
        if freqs.image_pixels is None:
            raise ConfigError("median_frequency needs the per-sample class bitmap, which splits of more than 256 "
                              "classes do not keep", fix="use 'inverse', 'inverse_sqrt' or 'enet'")
        why = presence_contradiction(freqs)
        if why is not None:  # a zeroed bitmap would divide by 0 image pixels: an infinite weight, said as nothing
            raise IntegrityError(f"median_frequency cannot trust this split's class bitmaps: {why}",
                                 fix="run shardkit verify on this split, then re-convert it with --force; or use "
                                     "'inverse', 'inverse_sqrt' or 'enet', which need no bitmap")
        freq = counts[has] / np.asarray(freqs.image_pixels, np.int64)[has]
        w[has] = np.median(freq) / freq
    elif method == "inverse":
        w[has] = 1.0 / (int(has.sum()) * p)
    elif method == "inverse_sqrt":
        w[has] = 1.0 / (np.sqrt(p) * np.sqrt(p).sum())
    else:
        w[has] = 1.0 / np.log(k + p)
    return w.astype(np.float32)


def weight_table(weights: Sequence[float], freqs: ClassFrequencies, names: Sequence[str]) -> list[dict[str, Any]]:
    """One row per class (id, name, weight, pixels, pixel share, images containing it): for ``shardkit info``."""
    counts = np.asarray(freqs.class_pixels, np.int64)
    total = max(int(counts[freqs.valid()].sum()), 1)
    rows = []
    for c in range(freqs.num_classes):
        rows.append({"id": c, "name": names[c] if c < len(names) else str(c), "weight": float(weights[c]),
                     "pixels": int(counts[c]), "share": float(counts[c]) / total if freqs.valid()[c] else None,
                     "images": int(freqs.images[c]) if freqs.images is not None else None})
    return rows


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
