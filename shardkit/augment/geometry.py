"""Label geometry shared by every backend: the exact nearest-neighbour label warp and its fast paths.

Output pixel (x, y) takes the source label at ``floor(M @ [x, y, 1] + 0.5)`` when that lies inside the source,
else the ignore index; the dtype is kept. Ops (RandomCrop's class-ratio check) and the numpy backend use it; the
torch and TF backends reproduce :func:`gather_labels_exact` in their own ops and are tested equal to it. Nothing
here needs a backend: numpy, plus numba when ``shardkit[fast]`` is installed.

Images that are not uint8 follow one rule on every backend, stated here in numpy (:func:`warp_rule_numpy`):
OpenCV 5's vector ``warpAffine``, which the numpy backend runs and torch and TF restate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..support import jit


def warp_labels(label: np.ndarray, m: np.ndarray, hw: tuple[int, int], ignore_index: int,
                out: np.ndarray | None = None, flip: FlipCopy | None = None) -> np.ndarray:
    """One (H, W) label warped by ``m`` (output → source) into ``hw``; outside → ``ignore_index``.

    The rule of :func:`gather_labels_exact`, computed the fastest exact way available: for a matrix
    without rotation or shear, one row and one column index vector; else the compiled per-pixel loop
    (numba, ``shardkit[fast]``; its vectorised int32 form below 2**31 source pixels); else the float64 rule
    itself in blocks of rows. A crop, pad or flip (:func:`integer_shift`) is a slice copy (mirrored by ``flip``, a
    backend's faster mirror copy, when given)."""
    label = np.asarray(label)
    m = np.asarray(m, np.float64)
    if out is None:
        out = np.empty(hw, label.dtype)
    fill = label.dtype.type(ignore_index)  # OverflowError when the id does not fit, as np.full
    shift = integer_shift(m)
    if shift is not None:  # crop, pad, flip: floor(±x + t + 0.5) is ±x + t, the rule is a slice
        return copy_shifted(label, shift, out, fill, flip)
    kernels = _gather_kernels() if label.dtype in _COMPILED_DTYPES else None
    if m[0, 1] == 0 and m[1, 0] == 0:
        _gather_separable(label, m, out, fill)
    elif kernels is not None:
        dst = out if out.flags.c_contiguous else np.empty(hw, label.dtype)
        kernels[1 if label.size <= _INT32_PIXELS else 0](np.ascontiguousarray(label), m, dst, fill)
        if dst is not out:
            out[...] = dst
    else:
        gather_labels_exact(label[None], m[None], hw, ignore_index, out=out[None], block_rows=_BLOCK_ROWS)
    return out


#: Largest integer offset :func:`integer_shift` takes: below 2**23 every coordinate ±x + t of a warp (x < 2**23, the
#: output side cap is far lower) is an integer held exactly in float32, the precision the image warps compute in.
_EXACT_OFFSET = 2**23

#: An integer shift per axis: (sign, offset) for columns, then rows; source index = sign * output index + offset.
Shift = tuple[tuple[int, int], tuple[int, int]]


def integer_shift(m: np.ndarray) -> Shift | None:
    """``((sx, tx), (sy, ty))`` when the (2, 3) output → source matrix ``m`` is a flip and/or an integer translation
    (crop, pad, flip; no scale, rotation or shear): source column ``sx * x + tx``, row ``sy * y + ty``, with
    ``sx, sy`` in {1, -1}; None otherwise. Such a warp reads every output pixel at an integer source position,
    where bilinear weights are 0 and 1 and the label rule's ``floor(c + 0.5)`` is ``c``: the warp is a slice copy
    (:func:`copy_shifted`), byte for byte."""
    m = np.asarray(m, np.float64)
    if m[0, 1] != 0 or m[1, 0] != 0 or abs(m[0, 0]) != 1 or abs(m[1, 1]) != 1:
        return None
    tx, ty = float(m[0, 2]), float(m[1, 2])
    if not (tx.is_integer() and ty.is_integer() and abs(tx) < _EXACT_OFFSET and abs(ty) < _EXACT_OFFSET):
        return None
    return (int(m[0, 0]), int(tx)), (int(m[1, 1]), int(ty))


def shift_window(shift: Shift, out_hw: tuple[int, int], src_hw: tuple[int, int]) -> tuple[tuple[int, int, int, int],
                                                                                           tuple[int, int, int, int]]:
    """Where an :func:`integer_shift` copies: per axis (rows, then columns) ``(o0, o1, s0, s1)``, the output range
    the source reaches and the source range it reads (mirrored when that axis's sign is -1); ``o0 == o1`` when
    nothing of the source lands in the output. Every backend's slice copy uses it."""
    (sx, tx), (sy, ty) = shift
    return _axis(sy, ty, out_hw[0], src_hw[0]), _axis(sx, tx, out_hw[1], src_hw[1])


def _axis(sign: int, offset: int, n_out: int, n_src: int) -> tuple[int, int, int, int]:
    """``(o0, o1, s0, s1)``: the output range ``[o0, o1)`` whose source index ``sign * o + offset`` lies in
    ``[0, n_src)``, and the source range ``[s0, s1)`` those outputs read (in reverse order when ``sign`` is -1)."""
    if sign == 1:
        o0, o1 = max(0, -offset), min(n_out, n_src - offset)
    else:
        o0, o1 = max(0, offset - n_src + 1), min(n_out, offset + 1)
    if o1 <= o0:
        return 0, 0, 0, 0
    first, last = sign * o0 + offset, sign * (o1 - 1) + offset
    return o0, o1, min(first, last), max(first, last) + 1


#: Copies ``src`` into ``dst`` (same shape) mirrored: left-right when the first flag is set, top-bottom when the
#: second is (a backend's faster mirror copy, e.g. ``cv2.flip``; it returns False where it does not apply).
FlipCopy = Callable[[np.ndarray, np.ndarray, bool, bool], bool]


def copy_shifted(src: np.ndarray, shift: Shift, out: np.ndarray, fill: Any, flip: FlipCopy | None = None) -> np.ndarray:
    """``src`` (H, W, …) moved by an :func:`integer_shift` into ``out`` (h, w, …): output pixel (x, y) is
    ``src[sy * y + ty, sx * x + tx]`` where that lies inside ``src``, else ``fill`` (the image warp's 0, the label
    rule's ignore index) — one slice copy (mirrored by ``flip`` when given and it applies; numpy's reversed-slice
    copy of 3-byte pixels is ~40x slower than ``cv2.flip``), and the fill written only where the source does not
    reach."""
    (sx, _), (sy, _) = shift
    (y0, y1, r0, r1), (x0, x1, c0, c1) = shift_window(shift, out.shape[:2], src.shape[:2])
    if y1 > y0 and x1 > x0:
        part, dst = src[r0:r1, c0:c1], out[y0:y1, x0:x1]
        if sx > 0 and sy > 0:
            dst[...] = part
        elif flip is None or not flip(part, dst, sx < 0, sy < 0):
            dst[...] = part[::sy, ::sx]
    else:
        y0 = y1 = 0
    out[:y0] = fill
    out[y1:] = fill
    out[y0:y1, :x0] = fill
    out[y0:y1, x1:] = fill
    return out


def warp_labels_batch(labels: np.ndarray, matrices: np.ndarray, hw: tuple[int, int], ignore_index: int,
                      out: np.ndarray | None = None) -> np.ndarray:
    """Stacked (B, H, W) labels, one (2, 3) matrix each → (B, *hw), each by :func:`warp_labels`."""
    if out is None:
        out = np.empty((len(labels), *hw), labels.dtype)
    for k in range(len(labels)):
        warp_labels(labels[k], matrices[k], hw, ignore_index, out=out[k])
    return out


def gather_labels_exact(labels: np.ndarray, matrices: np.ndarray, hw: tuple[int, int], ignore_index: int,
                        out: np.ndarray | None = None, block_rows: int | None = None) -> np.ndarray:
    """The label rule, in plain float64 numpy: stacked (B, H, W) labels, one (2, 3) matrix each → (B, *hw).

    Output pixel (x, y) takes the source label at ``floor(M @ [x, y, 1] + 0.5)`` when that lies inside
    the source, else ``ignore_index``; the dtype is kept. Coordinates are summed as
    ``((m00*x + m01*y) + m02) + 0.5`` in float64 (the torch backend and the compiled loop use the same
    order). The labels get a one-pixel ring of ``ignore_index`` and coordinates are clamped onto it, so
    pixels that map outside read the ring: no mask pass. ``block_rows``: that many output rows at a time
    (the same values; smaller temporaries). Every faster path is tested equal to this one."""
    b, h, w = labels.shape
    padded = np.full((b, h + 2, w + 2), ignore_index, labels.dtype)
    padded[:, 1:-1, 1:-1] = labels
    flat = padded.reshape(-1)
    if out is None:
        out = np.empty((b, *hw), labels.dtype)
    m = np.asarray(matrices, np.float64)[:, :, :, None, None]
    x = np.arange(hw[1], dtype=np.float64)[None, :]
    base = 1 + (np.arange(b, dtype=np.float64) * (h + 2))[:, None, None]
    step = max(1, block_rows or hw[0])
    for r in range(0, hw[0], step):
        y = np.arange(r, min(r + step, hw[0]), dtype=np.float64)[:, None]
        fx = m[:, 0, 0] * x + m[:, 0, 1] * y
        fx += m[:, 0, 2]
        fx += 0.5
        np.floor(fx, out=fx)
        np.clip(fx, -1, w, out=fx)
        fy = m[:, 1, 0] * x + m[:, 1, 1] * y
        fy += m[:, 1, 2]
        fy += 0.5
        np.floor(fy, out=fy)
        np.clip(fy, -1, h, out=fy)
        fy += base
        fy *= w + 2
        fy += fx
        fy += 1
        np.take(flat, fy.astype(np.intp), out=out[:, r : r + len(y)])
    return out


#: The range integer images are rounded and clamped to (float32: kept as computed).
IMAGE_RANGES: dict[str, tuple[float, float] | None] = {"uint8": (0.0, 255.0), "uint16": (0.0, 65535.0),
                                                       "int16": (-32768.0, 32767.0), "float32": None}
#: int16 images are warped as uint16 shifted by this much (OpenCV 5 has no vector int16 warp): the zero outside
#: is then 32768, and the result is shifted back.
INT16_SHIFT = 32768
#: Output widths are warped rounded up to a multiple of this (then cut): OpenCV 5's vector ``warpAffine``
#: handles 8, 16 or 32 columns per step (SSE, AVX2, AVX-512) and computes the last, partial step's
#: coordinates another way (in float32 without the fused multiply-add); so every pixel takes the formula below.
WARP_WIDTH_MULTIPLE = 64


def _f32(v: np.ndarray) -> np.ndarray:
    """``v`` (float64) rounded to float32, kept as float64 (a float32 operation emulated exactly)."""
    return np.asarray(v, np.float64).astype(np.float32).astype(np.float64)


def warp_rule_numpy(image: np.ndarray, m: np.ndarray, hw: tuple[int, int], out: np.ndarray) -> np.ndarray:
    """The image warp rule for every dtype, in plain numpy: an (H, W, C) image warped by ``m`` (output → source)
    into ``out`` (``hw``), bilinear, 0 outside: OpenCV 5's vector ``warpAffine`` restated, operation for
    operation (the numpy backend runs OpenCV itself; torch and TF restate this and are tested against it).

    In float32: ``M`` rounded to float32; per output row ``rx = y*M01 + M02`` (two roundings); per pixel
    ``sx = fma(M00, x, rx)`` (one rounding), the same for y; ``x0 = floor(sx)``, ``fx = sx - x0``; the four
    neighbours (0 outside) blended along x, then along y, each ``fma(t, b - a, a)``; integers rounded half to
    even and clamped to their range. A float32 fused multiply-add is emulated in float64 (the product is exact
    there; one rounding to float64, one to float32). int16 is warped as uint16 shifted by :data:`INT16_SHIFT`,
    as the numpy backend does."""
    h, w, c = image.shape
    shift = float(INT16_SHIFT) if image.dtype == np.int16 else 0.0
    mf = _f32(np.asarray(m, np.float64))
    y = np.arange(hw[0], dtype=np.float64)[:, None]
    x = np.arange(hw[1], dtype=np.float64)[None, :]
    sx = _f32(mf[0, 0] * x + _f32(_f32(y * mf[0, 1]) + mf[0, 2]))
    sy = _f32(mf[1, 0] * x + _f32(_f32(y * mf[1, 1]) + mf[1, 2]))
    x0f, y0f = np.floor(sx), np.floor(sy)
    fx, fy = (sx - x0f)[..., None], (sy - y0f)[..., None]
    padded = np.full((h + 4, w + 4, c), shift, np.float64)  # a ring two pixels wide: far outside reads 0
    padded[2:-2, 2:-2] = image.astype(np.float64) + shift
    x0 = np.clip(x0f, -2, w).astype(np.intp) + 2
    y0 = np.clip(y0f, -2, h).astype(np.intp) + 2

    def lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
        return _f32(a + t * _f32(b - a))

    top = lerp(padded[y0, x0], padded[y0, x0 + 1], fx)
    v = lerp(top, lerp(padded[y0 + 1, x0], padded[y0 + 1, x0 + 1], fx), fy)
    limits = IMAGE_RANGES[image.dtype.name]
    if limits is not None:
        v = np.clip(np.rint(v), limits[0] + shift, limits[1] + shift) - shift
    out[...] = v
    return out


#: Output rows per step of the numpy rule for rotated matrices (float64 temporaries stay in cache).
_BLOCK_ROWS = 32
#: Label dtypes the compiled loop is used for (others: numpy).
_COMPILED_DTYPES = tuple(np.dtype(t) for t in (np.uint8, np.uint16, np.int8, np.int16, np.int32, np.uint32,
                                              np.int64))


def _gather_separable(label: np.ndarray, m: np.ndarray, out: np.ndarray, fill: Any) -> None:
    """The rule for a matrix with ``m01 == m10 == 0`` (scale, flip, crop): the source column depends on the
    output column only and the row on the row, so two index vectors and one gather. Exact: ``m01 * y`` is
    then ±0, and adding ±0 to ``m00 * x`` changes no value, so the coordinates are the rule's own."""
    h, w = label.shape
    oh, ow = out.shape
    fx = m[0, 0] * np.arange(ow, dtype=np.float64) + m[0, 2]
    fy = m[1, 1] * np.arange(oh, dtype=np.float64) + m[1, 2]
    fx += 0.5
    fy += 0.5
    np.floor(fx, out=fx)
    np.floor(fy, out=fy)
    ok_x, ok_y = (fx >= 0) & (fx < w), (fy >= 0) & (fy < h)
    ix = np.clip(fx, 0, w - 1).astype(np.intp)
    iy = np.clip(fy, 0, h - 1).astype(np.intp)
    np.take(np.take(label, iy, axis=0), ix, axis=1, out=out)
    out[~ok_y] = fill
    out[:, ~ok_x] = fill


def _gather_loop(label: Any, m: Any, out: Any, fill: Any) -> None:  # pragma: no cover - runs compiled
    """The rule pixel by pixel (compiled by numba), for C-contiguous ``label`` and ``out``: the same float64
    operations in the same order; ``floor(c) in [0, n)`` is tested as ``0 <= c < n`` (the same for an
    integer n), so truncating ``c`` is its floor. Per output row, one loop computes the flat source
    indices (-1 outside; it vectorises) and a second gathers them."""
    h, w = label.shape
    oh, ow = out.shape
    m00, m01, m02, m10, m11, m12 = m[0, 0], m[0, 1], m[0, 2], m[1, 0], m[1, 1], m[1, 2]
    fw, fh = float(w), float(h)
    src = label.ravel()
    dst = out.ravel()
    idx = np.empty(ow, np.int64)
    for y in range(oh):
        yf = float(y)
        ay = m01 * yf
        by = m11 * yf
        for x in range(ow):
            xf = float(x)
            fx = ((m00 * xf + ay) + m02) + 0.5
            fy = ((m10 * xf + by) + m12) + 0.5
            inside = (fx >= 0.0) & (fx < fw) & (fy >= 0.0) & (fy < fh)
            idx[x] = np.int64(fy) * w + np.int64(fx) if inside else -1
        row = y * ow
        for x in range(ow):
            i = idx[x]
            dst[row + x] = src[i] if i >= 0 else fill


#: Most source pixels the int32 loop (:func:`_gather_loop32`) takes: its flat indices must fit an int32.
_INT32_PIXELS = 2**31 - 1


def _gather_loop32(label: Any, m: Any, out: Any, fill: Any) -> None:  # pragma: no cover - runs compiled
    """:func:`_gather_loop` in a form the compiler vectorises (about 2.5x faster), for sources of at most
    ``_INT32_PIXELS`` pixels: the same float64 operations in the same order. ``m00 * x`` and ``m10 * x`` are
    computed once per column (the same products, not recomputed per row); indices are int32 (AVX2 converts
    four float64 to int32 at once, not to int64); coordinates are clamped into the source before the
    conversion (no out-of-range conversion) and the inside test picks -1 without a branch. The ``fill`` of
    pixels outside is chosen after an in-range load, also without a branch."""
    h, w = label.shape
    oh, ow = out.shape
    m00, m01, m02, m10, m11, m12 = m[0, 0], m[0, 1], m[0, 2], m[1, 0], m[1, 1], m[1, 2]
    fw, fh = float(w), float(h)
    xmax, ymax = fw - 1.0, fh - 1.0
    src = label.ravel()
    dst = out.ravel()
    ax = np.empty(ow, np.float64)
    bx = np.empty(ow, np.float64)
    for x in range(ow):
        ax[x] = m00 * float(x)
        bx[x] = m10 * float(x)
    idx = np.empty(ow, np.int32)
    wi = np.int32(w)
    for y in range(oh):
        yf = float(y)
        ay = m01 * yf
        by = m11 * yf
        for x in range(ow):
            fx = ((ax[x] + ay) + m02) + 0.5
            fy = ((bx[x] + by) + m12) + 0.5
            inside = (fx >= 0.0) & (fx < fw) & (fy >= 0.0) & (fy < fh)
            i = np.int32(min(max(fy, 0.0), ymax)) * wi + np.int32(min(max(fx, 0.0), xmax))
            idx[x] = i if inside else np.int32(-1)
        row = y * ow
        for x in range(ow):
            i = idx[x]
            v = src[max(i, 0)]
            dst[row + x] = v if i >= 0 else fill


def _warm(kernels: tuple[Any, ...]) -> None:
    """Compile (or load from numba's cache) the uint8 case now, so a failure shows here."""
    for kernel in kernels:
        kernel(np.zeros((2, 2), np.uint8), np.eye(2, 3), np.empty((1, 1), np.uint8), np.uint8(0))


#: The compiled label gathers (:func:`_gather_loop`, :func:`_gather_loop32`), or numpy without numba.
KERNELS = jit.LazyKernels((_gather_loop, _gather_loop32), _warm, "label gather")


def _gather_kernels() -> tuple[Any, ...] | None:
    """The compiled label gather, or None without numba (or with ``SHARDKIT_NO_NUMBA=1``)."""
    return KERNELS.get()


def kernel_name() -> str:
    """Which label gather runs here: ``"numba"`` or ``"numpy"`` (benchmarks print it)."""
    return KERNELS.name()
