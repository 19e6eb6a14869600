"""numpy / OpenCV backend: apply drawn :class:`~shardkit.augment.ops.Params` to images and labels.

Images: one ``cv2.warpAffine`` per sample (bilinear, ``WARP_INVERSE_MAP``, border 0), then
the colour LUT; a sample whose drawn geometry is only a crop, pad and/or flip (an integer shift,
:func:`~shardkit.augment.geometry.integer_shift`) is sliced and copied instead, the same bytes (integer images;
labels likewise). Labels: an exact integer gather, not cv2's nearest (which floors fixed-point
coordinates): output pixel (x, y) takes the source label at ``floor(M @ [x, y, 1] + 0.5)``
when that lies inside the source, else ``ignore_index``; the dtype is kept. (cv2's INTER_NEAREST
with the same matrix disagrees on ~3 pixels in 10^5 under scale + rotation, measured on 360x480.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from ..errors import ConfigError
from ..support import jit
from . import backends, levels
from .geometry import INT16_SHIFT, WARP_WIDTH_MULTIPLE, copy_shifted, integer_shift, warp_labels
from .intensity import VolumeNormalize
from .ops import (
    IMAGE_DTYPES,
    MAX_BANDS,
    BatchSpec,
    ColorJitter,
    Cutout,
    CutoutParams,
    JitterParams,
    Kind,
    Normalize,
    OneHot,
    RandomGamma,
    band_fill,
    colour_luts,
)
from .packing import HSV_HDIV, HSV_SDIV

if TYPE_CHECKING:
    from .ops import Compose, Op, Params

__all__ = ["HSV_HDIV", "HSV_SDIV", "KERNELS", "apply_batch", "apply_lut", "colour_lut", "colour_luts", "cut_holes",
           "jitter_colour", "warp_image"]

logger = logging.getLogger(__name__)


def opencv_mismatch(version: str) -> str | None:
    """Why images warped by this OpenCV would not agree with the torch and TF paths (None from OpenCV 5 on).

    OpenCV 4's ``warpAffine`` rounds bilinear source coordinates to 1/32 pixel: up to ~3 levels from the exact
    bilinear value where OpenCV 5 (float32 coordinates, as the other backends) is within 0.5. pyproject asks for
    OpenCV 5; this catches a 4.x ``cv2`` that another package (e.g. ``opencv-python``) put first on the path.
    Labels never go through it (exact integer gather), so they stay identical either way."""
    major = version.split(".", 1)[0]
    if major.isdigit() and int(major) >= 5:
        return None
    return (f"OpenCV {version}: augmented images will differ from the torch/TF paths by up to ~3 levels "
            "(8-bit; 16-bit and float images proportionally more: warpAffine rounds coordinates to 1/32 pixel "
            "before OpenCV 5; labels are unaffected) — "
            "install opencv-python-headless>=5")


if (_MISMATCH := opencv_mismatch(cv2.__version__)) is not None:
    logger.warning(_MISMATCH)


def _lut_loop(pairs: Any, lut: Any, table: Any) -> None:  # pragma: no cover - runs compiled
    """A 256-entry uint8 ``lut`` applied in place to bytes viewed as uint16 ``pairs``, two bytes per lookup:
    ``table`` (65536 uint16) is filled with every byte pair's two looked-up bytes first. The high byte maps
    to the high byte and the low to the low, so the byte order does not matter."""
    for hi in range(256):
        for lo in range(256):
            table[hi * 256 + lo] = (lut[hi] << 8) | lut[lo]
    for i in range(pairs.size):
        pairs[i] = table[pairs[i]]


def _lut_kernels() -> tuple[Any, ...] | None:
    """The compiled pair LUT, or None without numba (or with ``SHARDKIT_NO_NUMBA=1``)."""
    return KERNELS.get()


def _warm(kernels: tuple[Any, ...]) -> None:
    """Compile (or load from numba's cache) the pair LUT now, so a failure shows here."""
    kernels[0](np.zeros(2, np.uint16), np.arange(256, dtype=np.uint16), np.empty(65536, np.uint16))


#: The compiled pair LUT (:func:`_lut_kernels`).
KERNELS = jit.LazyKernels((_lut_loop,), _warm, "colour LUT")


def apply_lut(image: np.ndarray, lut: np.ndarray) -> None:
    """``image[...] = lut[image]`` in place for a uint8 ``image``: the compiled two-bytes-per-lookup loop
    (numba) on C-contiguous images, ~3x faster than ``cv2.LUT``; else ``cv2.LUT``. The same values."""
    kernels = _lut_kernels()
    flat = image.reshape(-1) if image.flags.c_contiguous else None
    if kernels is None or flat is None:
        image[...] = cv2.LUT(image, lut)
        return
    even = flat.size & ~1
    kernels[0](flat[:even].view(np.uint16), lut.astype(np.uint16), np.empty(65536, np.uint16))
    if even < flat.size:
        flat[-1] = lut[flat[-1]]


def colour_lut(p: Params | JitterParams) -> np.ndarray:
    """Brightness then contrast (about 128) as one uint8 LUT of 256 entries (:func:`~.ops.colour_luts`)."""
    return colour_luts([p])[0]


#: Source pixels of margin around the box the warp's float32 coordinates can reach (they err by < 0.01).
_BOX_MARGIN = 2


def source_box(m: np.ndarray, out_hw: tuple[int, int], in_hw: tuple[int, int]) -> tuple[int, int, int, int]:
    """``(y0, y1, x0, x1)``: the source pixels a bilinear warp by ``m`` (output → source) into ``out_hw`` can read,
    plus a margin, clipped to the source (empty when the output maps entirely outside it). The map is affine,
    so its extremes over the output rectangle are at the corners; bilinear reads ``floor(c)`` and the next pixel."""
    oh, ow = out_hw
    xs = [m[0, 0] * x + m[0, 1] * y + m[0, 2] for x in (0, ow - 1) for y in (0, oh - 1)]
    ys = [m[1, 0] * x + m[1, 1] * y + m[1, 2] for x in (0, ow - 1) for y in (0, oh - 1)]
    h, w = in_hw
    y0, y1 = max(0, math.floor(min(ys)) - _BOX_MARGIN), min(h, math.floor(max(ys)) + 1 + _BOX_MARGIN)
    x0, x1 = max(0, math.floor(min(xs)) - _BOX_MARGIN), min(w, math.floor(max(xs)) + 1 + _BOX_MARGIN)
    return y0, max(y0, y1), x0, max(x0, x1)


def warp_image(image: np.ndarray, p: Params, out: np.ndarray | None = None,
               scratch: np.ndarray | None = None, rgba: np.ndarray | None = None,
               lut: np.ndarray | None = None) -> np.ndarray:
    """One (H, W, 3) uint8 image warped (bilinear, border 0) and colour-jittered, into ``out`` when given.

    OpenCV 5's ``warpAffine`` is ~2.5x faster on 4-channel images than on 3-channel ones and computes each
    channel the same way (the same float32 coordinates and weights), so the part of the source the warp can
    read (:func:`source_box`) is copied to RGBA, at its own place in an (H, W, 4) ``scratch`` buffer (reused
    across a batch; the rest of it is never read), warped there, and converted back to RGB: the same pixels
    as warping the 3-channel image, for a fraction of the time (tested equal, pixel for pixel). ``rgba``: an
    (h, w, 4) buffer for the warped RGBA image (reused across a batch: no fresh pages per sample); ``lut``:
    this sample's :func:`colour_lut` when already computed."""
    img = _warp(image, np.asarray(p.matrix), p.out_hw, out, scratch, rgba)
    jitter_colour(img, p, lut)
    return img


def _warp(image: np.ndarray, m: np.ndarray, out_hw: tuple[int, int], out: np.ndarray | None = None,
          scratch: np.ndarray | None = None, rgba: np.ndarray | None = None) -> np.ndarray:
    """The warp of :func:`warp_image` alone (no colour ops)."""
    h, w = out_hw
    if out is None:
        out = np.empty((h, w, 3), np.uint8)
    if scratch is None or scratch.shape != (*image.shape[:2], 4):
        scratch = np.empty((*image.shape[:2], 4), np.uint8)
    y0, y1, x0, x1 = source_box(m, (h, w), image.shape[:2])
    if y1 > y0 and x1 > x0:
        roi = scratch[y0:y1, x0:x1]
        got = cv2.cvtColor(image[y0:y1, x0:x1], cv2.COLOR_RGB2RGBA, dst=roi)
        if not np.shares_memory(got, scratch):  # pragma: no cover - cv2 reallocated dst
            roi[...] = got
    if rgba is None or rgba.shape != (h, w, 4):
        rgba = np.empty((h, w, 4), np.uint8)
    rgba = cv2.warpAffine(scratch, m, (w, h), dst=rgba,
                          flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_CONSTANT,
                          borderValue=(0, 0, 0, 0))
    return cv2.cvtColor(rgba, cv2.COLOR_RGBA2RGB, dst=out)


#: dtypes ``cv2.flip`` copies (by bytes; any of them: it moves pixels, computes nothing).
_FLIP_DTYPES = frozenset(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16, np.int32, np.float32))


def flip_copy(src: np.ndarray, dst: np.ndarray, horizontal: bool, vertical: bool) -> bool:
    """``src`` mirrored into ``dst`` by ``cv2.flip`` (a :data:`~shardkit.augment.geometry.FlipCopy`); False (nothing
    written) for a dtype or channel count OpenCV does not take, or when it did not write ``dst`` in place."""
    if src.dtype not in _FLIP_DTYPES or (src.ndim == 3 and src.shape[2] > 4) or src.ndim > 3:
        return False
    got = cv2.flip(src, -1 if horizontal and vertical else (1 if horizontal else 0), dst=dst)
    return bool(np.shares_memory(got, dst))


def warp_bands(image: np.ndarray, m: np.ndarray, out_hw: tuple[int, int], out: np.ndarray,
               scratch: dict[tuple[Any, ...], np.ndarray] | None = None) -> None:
    """An (H, W, C) image of any channel count and dtype (uint8, uint16, int16, float32) warped into ``out``
    (bilinear, border 0) by ``cv2.warpAffine``, computed as :func:`~shardkit.augment.geometry.warp_rule_numpy`
    states it (tested equal): channels in groups of 4, 3 or 1 (OpenCV 5's vector kernels; 2 channels would take
    its older 1/32-pixel path), into a width rounded up to :data:`~shardkit.augment.geometry.WARP_WIDTH_MULTIPLE`
    (no scalar tail; uint8 excepted, as :func:`warp_image`), int16 shifted into uint16 (its 16S path is wrong by
    hundreds of levels on negative values, measured on OpenCV 5.0). ``scratch``: where to keep the buffers
    OpenCV warps into, reused across a batch (fresh pages for every sample cost more than the warp)."""
    h, w = out_hw
    c = image.shape[2]
    # uint8 as the RGB path warps it (its tail is within a level: torch and TF restate it within one)
    wide = w if image.dtype == np.uint8 else -(-w // WARP_WIDTH_MULTIPLE) * WARP_WIDTH_MULTIPLE
    signed = image.dtype == np.int16
    src = np.bitwise_xor(image.view(np.uint16), np.uint16(INT16_SHIFT)) if signed else image
    border = (float(INT16_SHIFT) if signed else 0.0,) * 4
    buffers = {} if scratch is None else scratch
    g = 0
    while g < c:
        n = 4 if c - g >= 4 else (3 if c - g == 3 else 1)
        part = np.ascontiguousarray(src[..., g:g + n])
        key = ("bands", h, wide, n, src.dtype.str)
        dst = buffers.get(key)
        if dst is None:
            dst = buffers[key] = np.empty((h, wide, n) if n > 1 else (h, wide), src.dtype)
        got = cv2.warpAffine(part, m, (wide, h), dst=dst, flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                             borderMode=cv2.BORDER_CONSTANT, borderValue=border)
        got = np.asarray(got, src.dtype).reshape(h, wide, n)[:, :w]
        if signed:
            np.bitwise_xor(got, np.uint16(INT16_SHIFT), out=out[..., g:g + n].view(np.uint16))
        else:
            out[..., g:g + n] = got
        g += n


def jitter_colour(img: np.ndarray, p: Params | JitterParams, lut: np.ndarray | None = None) -> None:
    """A colour jitter (a :class:`~.ops.JitterParams`, or a sample's last one in its ``Params``) on a warped
    (h, w, 3) uint8 image, in place: brightness and contrast as one lookup table (``lut``: :func:`colour_lut`
    when already computed), then saturation, then hue."""
    if p.brightness != 1.0 or p.contrast != 1.0:
        apply_lut(img, colour_lut(p) if lut is None else lut)
    if p.saturation != 1.0:
        grey = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)[..., None].astype(np.float32)
        img[...] = np.clip(grey + (img.astype(np.float32) - grey) * p.saturation + 0.5, 0, 255)
    if p.hue != 0.0:
        hsv = cv2.cvtColor(img, cv2.COLOR_RGB2HSV)
        hsv[..., 0] = ((hsv[..., 0].astype(np.int16) + round(p.hue * 180)) % 180).astype(np.uint8)
        cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB, dst=img)


def cut_holes(image: np.ndarray, label: np.ndarray, p: CutoutParams, ignore_index: int) -> None:
    """Cutout, in place: ``p.holes`` of the (H, W, C) image set to ``p.fill`` (one value per band,
    :func:`~.ops.band_fill`); of the label set to ``ignore_index`` when ``p.ignore``, else left as they are."""
    fill = band_fill(p.fill, image.shape[2], image.dtype.name) if p.holes else ()
    for y0, x0, y1, x1 in p.holes:
        image[y0:y1, x0:x1] = fill
        if p.ignore:
            label[y0:y1, x0:x1] = ignore_index


# ---------------------------------------------------------------------- kernels
# A photometric kernel: (op, its records of the batch) → f(k, image) applied to sample k's warped image in place.
# A mask kernel: (op, records, ignore_index) → f(k, image, label) in place, after the labels are warped.
# An output kernel: (op, images, labels, ignore_index, records) → (images, labels) for the whole batch (records:
# the op's per-sample ones, for a samplewise op; else empty).
PhotometricKernel = Callable[["Op", Sequence[Any]], Callable[[int, np.ndarray], None]]
MaskKernel = Callable[["Op", Sequence[Any], int], Callable[[int, np.ndarray, np.ndarray], None]]
OutputKernel = Callable[["Op", Any, Any, int], tuple[Any, Any]]


def _jitter(op: ColorJitter, records: Sequence[JitterParams]) -> Callable[[int, np.ndarray], None]:
    luts = colour_luts(records)

    def apply(k: int, img: np.ndarray) -> None:
        if img.dtype == np.uint8:
            jitter_colour(img, records[k], luts[k])
        else:  # 16-bit: the same rule without a table (saturation and hue are refused there)
            levels.brightness_contrast(img, records[k].brightness, records[k].contrast)

    return apply


def _gamma(op: RandomGamma, records: Sequence[Any]) -> Callable[[int, np.ndarray], None]:
    luts = op.pack(records)["lut"]

    def apply(k: int, img: np.ndarray) -> None:
        if img.dtype == np.uint8:
            apply_lut(img, luts[k])
        elif img.dtype == np.float32:
            float_gamma(img, records[k].gamma)
        else:  # 16-bit over the dtype's range (shardkit.augment.levels)
            levels.gamma(img, records[k].gamma)

    return apply


def float_gamma(image: np.ndarray, gamma: float) -> None:
    """``x ** gamma`` in place, for a float32 image whose values lie in [0, 1] (NaN stays NaN; other values: a
    ConfigError, nothing changed), by ``cv2.pow`` (the rule: :mod:`shardkit.augment.levels`) on every value but the
    zeros, which stay 0: OpenCV's power takes a slow path on 0 (a seventh of zeros, e.g. the border a rotation
    brings in, doubled its time, measured)."""
    flat = np.ascontiguousarray(image).reshape(-1)
    zeros = levels.zeros_to_ones(flat)
    row = flat.reshape(1, -1)
    cv2.pow(row, float(np.float32(gamma)), dst=row)
    flat[zeros] = 0.0
    if not np.shares_memory(flat, image):
        image[...] = flat.reshape(image.shape)


def _cutout(op: Cutout, records: Sequence[CutoutParams], ignore_index: int) -> Callable[..., None]:
    return lambda k, img, lab: cut_holes(img, lab, records[k], ignore_index)


def _normalize(op: Normalize, images: np.ndarray, labels: Any, ignore_index: int,
               records: Sequence[Any] = ()) -> tuple[Any, Any]:
    return op.numpy(images), labels


def _one_hot(op: OneHot, images: Any, labels: np.ndarray, ignore_index: int,
             records: Sequence[Any] = ()) -> tuple[Any, Any]:
    return images, op.numpy(labels, ignore_index)


def _volume_normalize(op: VolumeNormalize, images: np.ndarray, labels: Any, ignore_index: int,
                      records: Sequence[Any] = ()) -> tuple[Any, Any]:
    return op.numpy(images, op.pack(records)["constants"]), labels


#: This backend's kernels, by op class (:meth:`shardkit.augment.ops.Compose.kernels`); the kind decides the call.
OP_KERNELS: dict[type, Callable[..., Any]] = {ColorJitter: _jitter, Cutout: _cutout, Normalize: _normalize,
                                              OneHot: _one_hot, RandomGamma: _gamma,
                                              VolumeNormalize: _volume_normalize}


def _samples(arr: Any, what: str, n: int) -> list[np.ndarray]:
    items = list(arr) if not isinstance(arr, np.ndarray) else [arr[i] for i in range(len(arr))]
    if len(items) != n:
        raise ConfigError(f"augment got {len(items)} {what} for {n} indices")
    return [np.asarray(a) for a in items]


def apply_batch(aug: Compose, images: Any, labels: Any, indices: Sequence[int] | np.ndarray, *, seed: int,
                epoch: int, ignore_index: int,
                out: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Augment a batch (stacked arrays or lists of per-sample arrays) → stacked (images, labels): uint8 images
    and id labels, or float32 normalised images / one-hot labels when the pipeline ends in those ops.

    ``out``: (images, labels) arrays to warp straight into (e.g. a shared-memory ring slot: no fresh pages, no
    copy afterwards); they are used, and returned, when the pipeline has no output op and they are C-contiguous
    with exactly the batch's shapes and dtypes; otherwise fresh arrays are returned as without ``out``."""
    table = aug.kernels(OP_KERNELS, "numpy/OpenCV")
    idx = [int(i) for i in np.asarray(indices).reshape(-1)]
    imgs, labs = _samples(images, "images", len(idx)), _samples(labels, "labels", len(idx))
    # numpy's dtype.name and issubdtype cost ~18 µs a call (a fifth of a crop's copy): the first image's name is
    # checked once, every other dtype by equality with it; labels by kind ("iu" is exactly np.integer)
    named = not imgs or imgs[0].dtype.name in IMAGE_DTYPES
    for img, lab in zip(imgs, labs, strict=True):
        if (img.ndim != 3 or not 1 <= img.shape[2] <= MAX_BANDS or not named
                or img.shape[2:] != imgs[0].shape[2:] or img.dtype != imgs[0].dtype):
            raise ConfigError(f"augment needs (H, W, C) images of one dtype ({', '.join(IMAGE_DTYPES)}) and one "
                              f"channel count (1 to {MAX_BANDS}), got {img.shape} {img.dtype}")
        if lab.shape != img.shape[:2] or lab.dtype.kind not in "iu":
            raise ConfigError(f"augment needs (H, W) integer id labels matching the image, got {lab.shape} "
                              f"{lab.dtype}", fix="open the split with labels='ids'")
    channels, image_dtype = (imgs[0].shape[2], imgs[0].dtype) if imgs else (3, np.dtype(np.uint8))
    aug.output_spec(BatchSpec(channels=channels, image_dtype=image_dtype.name))
    params = aug.params_batch(idx, seed=seed, epoch=epoch, hws=[img.shape[:2] for img in imgs], labels=labs,
                              ignore_index=ignore_index)
    sizes = {p.out_hw for p in params}
    if len(sizes) > 1:
        raise ConfigError(f"augmented samples differ in size {sorted(sizes)}; end the pipeline with a crop")
    hw = sizes.pop() if sizes else (aug.out_hw or (0, 0))
    dtype = labs[0].dtype if labs else np.dtype(np.uint8)
    shapes = ((len(idx), *hw, channels), image_dtype), ((len(idx), *hw), dtype)
    if out is None or any(op.output for op in aug.ops) or not all(
            a.shape == shape and a.dtype == dt and a.flags.c_contiguous for a, (shape, dt) in zip(out, shapes,
                                                                                                    strict=True)):
        out = (np.empty(*shapes[0]), np.empty(*shapes[1]))
    out_img, out_lab = out
    rgb8 = channels == 3 and image_dtype == np.uint8  # the RGBA fast path below; else cv2 on <= 4 channels at once
    scratch: dict[tuple[Any, ...], np.ndarray] = {}  # RGBA buffers per source size, and warp_bands' buffers
    rgba = np.empty((*hw, 4), np.uint8) if rgb8 else None
    colour = [kernel(op, aug.records(params, k)) for k, op, kernel in table if op.kind is Kind.PHOTOMETRIC]
    masks = [kernel(op, aug.records(params, k), ignore_index) for k, op, kernel in table if op.kind is Kind.MASK]
    for k, (img, p) in enumerate(zip(imgs, params, strict=True)):
        # integer images only: the float32 warp's blend a + 0 * (b - a) turns -0.0 into 0.0 and NaN/inf into NaN
        shift = integer_shift(p.matrix) if image_dtype != np.float32 else None
        buf = scratch.get(img.shape[:2])
        if buf is None and rgb8 and shift is None:
            buf = scratch[img.shape[:2]] = np.empty((*img.shape[:2], 4), np.uint8)
        if shift is not None:  # crop, pad, flip: the warp's bytes by a slice copy
            copy_shifted(img, shift, out_img[k], 0, flip_copy)
        elif rgb8:
            got = _warp(img, np.asarray(p.matrix), hw, out=out_img[k], scratch=buf, rgba=rgba)
            if not np.shares_memory(got, out_img):  # cv2 reallocated dst
                out_img[k] = got
        else:
            warp_bands(img, np.asarray(p.matrix), hw, out_img[k], scratch)
        for apply in colour:  # right after the warp, while the sample is in cache
            apply(k, out_img[k])
    for k, (lab, p) in enumerate(zip(labs, params, strict=True)):
        warp_labels(lab, p.matrix, hw, ignore_index, out=out_lab[k], flip=flip_copy)
    for cut in masks:
        for k in range(len(params)):
            cut(k, out_img[k], out_lab[k])
    result: tuple[Any, Any] = (out_img, out_lab)
    for k, op, kernel in table:
        if op.output:  # a per-sample output op gets its records: f(op, images, labels, ignore_index, records)
            result = kernel(op, *result, ignore_index, aug.records(params, k) if op.draws else [])
    return result


backends.register("numpy", apply_batch)
