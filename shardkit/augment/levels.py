"""Level maps on images that are not 8-bit (brightness/contrast, gamma): their rules in numpy, and the compiled
loops (numba, ``shardkit[fast]``) that compute the same values several times faster.

uint8 images take 256-entry tables (:func:`shardkit.augment.ops.colour_luts`, :func:`~shardkit.augment.ops.gamma_luts`).
For 16-bit and float32 images the rules are stated here once; the torch and TF backends restate them:

- brightness then contrast (uint16, int16): ``clip(rint((x * b - mid) * c + mid), lo, hi)`` in float64 with the
  dtype's (lo, mid, hi) of :data:`LEVELS`;
- gamma (uint16, int16): over the dtype's whole range, ``lo + rint(((x - lo) / (hi - lo)) ** g * (hi - lo))`` in
  float64 (a 65536-entry table per sample, :func:`gamma_table16`); float32: ``x ** g`` (``g`` rounded to float32)
  within 1e-5 relative for values in [0, 1] (NaN stays NaN, 0 stays 0, 1 stays 1), and a
  :class:`~shardkit.errors.ConfigError` for any other value (no range to map). On the CPU this power is OpenCV's
  vectorised ``cv2.pow`` (its float32 log and exp: at most 8e-6 from the exact power over [1e-37, 1], measured,
  where ``np.power``'s ``powf`` is within 6e-8 but ~4x slower), run by :mod:`shardkit.augment.cpu` (this module
  loads no image library: the readers import it); torch and TF take their own ``pow``.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..support import jit

#: The integer image dtypes the level maps apply to: (lowest, mid, highest) level. Contrast pivots about the mid.
LEVELS: dict[str, tuple[float, float, float]] = {"uint8": (0.0, 128.0, 255.0), "uint16": (0.0, 32768.0, 65535.0),
                                                 "int16": (-32768.0, 0.0, 32767.0)}
#: Levels of a 16-bit dtype: the length of its gamma table.
LEVELS16 = 65536


def brightness_contrast(image: np.ndarray, brightness: float, contrast: float) -> None:
    """Brightness then contrast on an integer image of any band count, in place, in float64:
    ``clip(rint((x * b - mid) * c + mid), lo, hi)`` with :data:`LEVELS` of its dtype — for uint8 exactly the values
    of :func:`~shardkit.augment.ops.colour_luts`; the torch and TF backends compute the same operations. The
    compiled loop when there is one (the same operations per element, so the same values), else numpy."""
    lo, mid, hi = LEVELS[image.dtype.name]
    kernels = KERNELS.get()
    if kernels is not None and image.flags.c_contiguous:
        kernels[0](image.reshape(-1), float(brightness), float(contrast), lo, mid, hi)
        return
    v = image.astype(np.float64) * brightness
    v -= mid
    v *= contrast
    v += mid
    image[...] = np.clip(np.rint(v), lo, hi)


def gamma_table16(gamma: float, dtype: str) -> np.ndarray:
    """The 65536-entry gamma table of a 16-bit ``dtype`` (uint16 or int16), in that dtype: entry ``i`` is the level
    ``lo + i`` mapped to ``lo + rint((i / 65535) ** gamma * 65535)`` (float64; ``lo`` 0 or -32768)."""
    lo = LEVELS[dtype][0]
    t = np.arange(LEVELS16, dtype=np.float64) / float(LEVELS16 - 1)
    t **= gamma
    t *= float(LEVELS16 - 1)
    return (np.clip(np.rint(t), 0, LEVELS16 - 1) + lo).astype(dtype)


def gamma(image: np.ndarray, gamma: float) -> None:
    """Gamma on a 16-bit image of any band count, in place, through :func:`gamma_table16` (float32 images: the
    numpy backend's ``float_gamma``, with :func:`zeros_to_ones`)."""
    table = gamma_table16(gamma, image.dtype.name)
    lo = int(LEVELS[image.dtype.name][0])
    kernels = KERNELS.get()
    if kernels is not None and image.flags.c_contiguous:
        kernels[1](image.reshape(-1), table, lo)
    else:
        image[...] = table[image.astype(np.int32) - lo]


def check_unit_range(lowest: float, highest: float) -> None:
    """A ConfigError when a float32 image's values (``lowest``..``highest``, NaN left out) are not within [0, 1]."""
    if lowest < 0.0 or highest > 1.0:
        raise ConfigError(f"RandomGamma on float32 images takes values in [0, 1], got values from {lowest:g} to "
                          f"{highest:g} in an augmented sample",
                          fix="scale the images into [0, 1] before gamma (e.g. divide by their maximum), or drop gamma")


def zeros_to_ones(flat: np.ndarray) -> np.ndarray:
    """For float32 gamma: check that a contiguous float32 array's values lie in [0, 1] (NaN does not count; a
    ConfigError otherwise, with nothing changed), set each 0 (or -0) to 1 and return their indices, so that a power
    can skip them (``0 ** g`` is 0: the caller puts them back). One compiled pass when numba is there."""
    kernels = KERNELS.get()
    if kernels is not None:
        zeros = np.empty(flat.size, np.int64)
        found = kernels[2](flat, zeros)  # zeros set to 1 (an exact power) and listed; < 0: values outside [0, 1]
        zeros = zeros[:found if found >= 0 else -1 - found]
        if found < 0:
            flat[zeros] = 0.0  # nothing changed
    else:
        found = 0 if not ((flat < 0) | (flat > 1)).any() else -1
        zeros = np.flatnonzero(flat == 0)
        if found >= 0:
            flat[zeros] = 1.0
    if found < 0:
        check_unit_range(float(np.nanmin(flat)), float(np.nanmax(flat)))
    return zeros


def _bc_loop(flat: Any, b: float, c: float, lo: float, mid: float, hi: float) -> None:  # pragma: no cover - compiled
    """:func:`brightness_contrast` element by element (compiled): the same float64 operations in the same order."""
    for i in range(flat.size):
        v = float(flat[i]) * b
        v -= mid
        v *= c
        v += mid
        flat[i] = min(max(np.rint(v), lo), hi)


def _table_loop(flat: Any, table: Any, lo: int) -> None:  # pragma: no cover - compiled
    """``flat[i] = table[flat[i] - lo]`` in place (compiled): a 16-bit image through its 65536-entry table."""
    for i in range(flat.size):
        flat[i] = table[np.int64(flat[i]) - lo]


def _unit_loop(flat: Any, zeros: Any) -> int:  # pragma: no cover - compiled
    """One pass over ``flat``: each 0 (or -0) set to 1 and its index written to ``zeros``; the number of zeros
    ``n``, or ``-1 - n`` at the first value outside [0, 1] (NaN does not count), with the ``n`` zeros found up to
    there listed, so the caller can put them back."""
    n = 0
    for i in range(flat.size):
        v = flat[i]
        if v == 0:
            zeros[n] = i
            n += 1
            flat[i] = 1.0
        elif (v < 0) | (v > 1):
            return -1 - n
    return n


def _warm(kernels: tuple[Any, ...]) -> None:
    """Compile (or load from numba's cache) the loops for uint16, int16 and float32 now, so a failure shows here."""
    for dt, lo in (("uint16", 0), ("int16", -32768)):
        kernels[0](np.zeros(2, dt), 1.0, 1.0, *LEVELS[dt])
        kernels[1](np.zeros(2, dt), np.zeros(LEVELS16, dt), lo)
    kernels[2](np.zeros(2, np.float32), np.zeros(2, np.int64))


#: The compiled level maps (:func:`_bc_loop`, :func:`_table_loop`, :func:`_unit_loop`), or numpy without numba.
KERNELS = jit.LazyKernels((_bc_loop, _table_loop, _unit_loop), _warm, "level maps")

#: Rows (pixels) of a uint8 batch normalised per thread of :func:`normalize_uint8` at least
_NORMALIZE_ROWS = 1 << 18


def _normalize_loop(src: np.ndarray, mean: np.ndarray, inv_std: np.ndarray, out: np.ndarray) -> None:  # numba
    """``out[i, c] = (float32(src[i, c]) - mean[c]) * inv_std[c]`` in float32, one pass (numpy makes two)."""
    channels = mean.shape[0]
    for i in range(src.shape[0]):
        for c in range(channels):
            out[i, c] = (np.float32(src[i, c]) - mean[c]) * inv_std[c]


def _warm_normalize(kernels: tuple[Any, ...]) -> None:
    kernels[0](np.zeros((2, 3), np.uint8), np.zeros(3, np.float32), np.ones(3, np.float32), np.zeros((2, 3),
                                                                                                   np.float32))


NORMALIZE_KERNELS = jit.LazyKernels((_normalize_loop,), _warm_normalize, "normalisation")


def normalize_uint8(images: np.ndarray, mean: np.ndarray, inv_std: np.ndarray, out: np.ndarray) -> bool:
    """``out = (images - mean) * inv_std`` (float32, per band) for a C-contiguous uint8 batch by the compiled loop,
    split over threads (it releases the GIL): the values numpy's ``subtract(dtype=float32)`` then ``multiply``
    give, each element's two float32 operations in the same order. False (nothing done) without numba or for
    other inputs: the caller runs numpy."""
    kernels = NORMALIZE_KERNELS.get()
    if (kernels is None or images.dtype != np.uint8 or not images.flags.c_contiguous
            or not out.flags.c_contiguous or out.dtype != np.float32 or out.shape != images.shape):
        return False
    channels = int(mean.shape[0])
    src, dst = images.reshape(-1, channels), out.reshape(-1, channels)
    rows = src.shape[0]
    parts = min(os.cpu_count() or 1, max(1, rows // _NORMALIZE_ROWS))
    if parts == 1:
        kernels[0](src, mean, inv_std, dst)
        return True
    bounds = [rows * k // parts for k in range(parts + 1)]
    threads = [threading.Thread(target=kernels[0], args=(src[a:b], mean, inv_std, dst[a:b]))
               for a, b in itertools.pairwise(bounds)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return True
