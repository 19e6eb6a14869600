"""TensorFlow backend: apply drawn :class:`~shardkit.augment.ops.Params` to a batch in graph ops (tf.data ``.map``).

The parameters are drawn by the same numpy :meth:`Compose.params` as the other backends, inside one
``tf.numpy_function`` per batch (input: the batch's sample indices, the epoch, each sample's size),
so they depend on (seed, epoch, index) only and equal the CPU/GPU draws. Everything applied to the
pixels is TensorFlow ops over the whole batch:

- labels: source coordinates in float64, summed in the order of
  :func:`shardkit.augment.geometry.warp_labels_batch` and rounded the same way (``floor(c + 0.5)``), then one
  integer gather from the labels padded with a ring of ``ignore_index``, so outputs are identical to the
  CPU path; outside the source → ``ignore_index``; the dtype is kept (uint8, uint16, …).
- images: one batched bilinear gather in float32 (as OpenCV 5's ``warpAffine`` and the torch backend compute
  it), zero outside; brightness/contrast as one per-sample LUT (the CPU path's own
  :func:`~shardkit.augment.ops.colour_luts`), saturation with OpenCV's integer grey, hue through OpenCV's
  8-bit HSV round trip restated in TF ops (RGB2HSV bit-exact; HSV2RGB as its x86 vector code computes it).
  These image stages run XLA-compiled (``jit=True``, the default); the label gather never does.

A batch may hold samples of different sizes padded to one canvas (images with 0, labels with
``ignore_index`` past each sample's own size): give each sample's true ``(h, w)`` as ``hw``; the padding then
reads exactly as the outside of that sample does, so the result equals augmenting it alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from ..codecs.onehot import channel_lut, ignore_inside
from ..errors import ConfigError
from . import levels, packing
from .geometry import IMAGE_RANGES, INT16_SHIFT
from .intensity import VolumeNormalize
from .ops import (
    LEVELS,
    BatchSpec,
    ColorJitter,
    Cutout,
    Kind,
    Normalize,
    OneHot,
    RandomCrop,
    RandomGamma,
    RandomScale,
    band_fill,
)
from .packing import HSV_HDIV, HSV_SDIV

if TYPE_CHECKING:
    from .ops import Compose, Op

__all__ = ["apply_batch", "check_ops", "output_hw"]


def check_ops(aug: Compose, channels: int | None = None) -> list[tuple[int, Op, Any]]:
    """The pipeline's kernels here (:data:`OP_KERNELS`); a ConfigError naming an op this backend has none for, or
    one that cannot take ``channels``-channel images."""
    table = aug.kernels(OP_KERNELS, "TensorFlow")
    if channels is not None:
        aug.output_spec(BatchSpec(channels=channels))
    return table


def output_hw(aug: Compose, in_hw: tuple[int, int] | None) -> tuple[int, int] | None:
    """The output (h, w) every sample gets, fixed when the graph is built; None: the input's (unknown) size.

    A pipeline whose output follows a random scale (no crop after it) gives samples of different sizes,
    which a batch cannot hold: refused here, before TensorFlow runs anything."""
    if aug.out_hw is not None:
        last_crop = max(k for k, op in enumerate(aug.ops) if isinstance(op, RandomCrop))
        if not any(isinstance(op, RandomScale) for op in aug.ops[last_crop + 1:]):
            return aug.out_hw
    if any(isinstance(op, RandomScale) and op.lo != op.hi for op in aug.ops):
        raise ConfigError("augmented samples would differ in size (a random scale with no crop after it)",
                          fix="end the pipeline with a crop, e.g. '…,crop=352x480'")
    if in_hw is None:
        if any(isinstance(op, RandomScale) for op in aug.ops):
            raise ConfigError("a fixed scale of inputs of unknown size has no fixed output size",
                              fix="end the pipeline with a crop")
        return None
    return aug.params(0, hw=in_hw).out_hw


def _draw(aug: Compose, seed: int, ignore_index: int, out_hw: tuple[int, int] | None,
          with_labels: bool) -> Any:
    """The numpy function drawing one batch's parameters: (indices, epoch, hw[, labels]) → the arrays of
    :func:`shardkit.augment.packing.layout`, in its order."""

    def draw(indices: np.ndarray, epoch: np.ndarray, hw: np.ndarray,
             labels: np.ndarray | None = None) -> list[np.ndarray]:
        idx = [int(i) for i in np.asarray(indices).reshape(-1)]
        hws = [(int(hw[k][0]), int(hw[k][1])) for k in range(len(idx))]
        labs = None if labels is None else [labels[k, :h, :w] for k, (h, w) in enumerate(hws)]
        drawn = aug.params_batch(idx, seed=seed, epoch=int(epoch), hws=hws, labels=labs, ignore_index=ignore_index)
        for i, p in zip(idx, drawn, strict=True):
            if out_hw is not None and p.out_hw != out_hw:
                raise ConfigError(f"augmented sample {int(i)} is {p.out_hw}, the batch is {out_hw}",
                                  fix="end the pipeline with a crop")
        return list(packing.pack(aug, drawn).values())

    if with_labels:
        return draw
    return lambda indices, epoch, hw: draw(indices, epoch, hw)


def _grid(hw: tf.Tensor, dtype: tf.DType) -> tuple[tf.Tensor, tf.Tensor]:
    """Output pixel coordinates: x (1, W) and y (H, 1)."""
    return tf.range(hw[1], dtype=dtype)[None, :], tf.range(hw[0], dtype=dtype)[:, None]


def warp_labels(labels: tf.Tensor, mats: tf.Tensor, hw: tf.Tensor, ignore_index: int) -> tf.Tensor:
    """(B, H, W) labels gathered at ``floor(M @ [x, y, 1] + 0.5)`` (float64, the CPU path's order); outside →
    ``ignore_index``. The labels get a one-pixel ring of ``ignore_index`` and coordinates are clamped onto it."""
    shape = tf.shape(labels, out_type=tf.int64)
    b, h, w = shape[0], shape[1], shape[2]
    padded = tf.pad(labels, [[0, 0], [1, 1], [1, 1]], constant_values=tf.cast(ignore_index, labels.dtype))
    x, y = _grid(hw, tf.float64)
    m = mats[:, :, :, None, None]
    fx = tf.floor((m[:, 0, 0] * x + m[:, 0, 1] * y + m[:, 0, 2]) + 0.5)
    fy = tf.floor((m[:, 1, 0] * x + m[:, 1, 1] * y + m[:, 1, 2]) + 0.5)
    ix = tf.cast(tf.clip_by_value(fx, -1.0, tf.cast(w, tf.float64)), tf.int64)
    iy = tf.cast(tf.clip_by_value(fy, -1.0, tf.cast(h, tf.float64)), tf.int64)
    flat = ((tf.range(b)[:, None, None] * (h + 2) + iy + 1) * (w + 2)) + ix + 1
    return tf.gather(tf.reshape(padded, [-1]), flat)


def warp_images(images: tf.Tensor, mats: tf.Tensor, hw: tf.Tensor) -> tf.Tensor:
    """Bilinear warp of (B, H, W, C) images (uint8, uint16, int16, float32), zero outside, restating OpenCV 5's
    vector ``warpAffine`` (integers rounded and clamped to their dtype's range):
    float32 source coordinates by one fused multiply-add per pixel, two linear blends, rounded to nearest even.
    Measured against cv2 5.0: ~6e-5 of the pixel values differ, by one level (near-.5 ties)."""
    if images.dtype != tf.uint8:
        return _warp_rule(images, mats, hw)
    x, y = _grid(hw, tf.float64)
    m = mats[:, :, :, None, None]
    # OpenCV 5: the row term y*M1 + M2 in double, cast to float; then one fused multiply-add with float M0 and x
    # (emulated in float64: the float32 product is exact there), rounded once to float32
    row_x = tf.cast(tf.cast(m[:, 0, 1] * y + m[:, 0, 2], tf.float32), tf.float64)
    row_y = tf.cast(tf.cast(m[:, 1, 1] * y + m[:, 1, 2], tf.float32), tf.float64)
    m0 = tf.cast(tf.cast(m[:, 0, 0], tf.float32), tf.float64)
    m3 = tf.cast(tf.cast(m[:, 1, 0], tf.float32), tf.float64)
    sx = tf.cast(m0 * x + row_x, tf.float32)
    sy = tf.cast(m3 * x + row_y, tf.float32)
    x0f, y0f = tf.floor(sx), tf.floor(sy)
    fx, fy = (sx - x0f)[..., None], (sy - y0f)[..., None]
    at = _neighbours(images, x0f, y0f, tf.float32)
    # OpenCV 5's vector kernel: along x, then along y, each a + t * (b - a)
    top = _lerp(at(0, 0), at(0, 1), fx)
    bottom = _lerp(at(1, 0), at(1, 1), fx)
    v = _lerp(top, bottom, fy)
    limits = IMAGE_RANGES[images.dtype.name]
    return v if limits is None else tf.cast(tf.clip_by_value(tf.round(v), *limits), images.dtype)


def _f32(v: tf.Tensor) -> tf.Tensor:
    """``v`` (float64) rounded to float32, kept as float64: a float32 operation emulated exactly."""
    return tf.cast(tf.cast(v, tf.float32), tf.float64)


def _warp_rule(images: tf.Tensor, mats: tf.Tensor, hw: tf.Tensor) -> tf.Tensor:
    """Images other than uint8: :func:`shardkit.augment.geometry.warp_rule_numpy` operation for operation (float32
    operations and fused multiply-adds emulated in float64; int16 shifted into uint16's range)."""
    x, y = _grid(hw, tf.float64)
    m = _f32(mats)[:, :, :, None, None]
    sx = _f32(m[:, 0, 0] * x + _f32(_f32(y * m[:, 0, 1]) + m[:, 0, 2]))
    sy = _f32(m[:, 1, 0] * x + _f32(_f32(y * m[:, 1, 1]) + m[:, 1, 2]))
    x0f, y0f = tf.floor(sx), tf.floor(sy)
    fx, fy = (sx - x0f)[..., None], (sy - y0f)[..., None]
    shift = float(INT16_SHIFT) if images.dtype == tf.int16 else 0.0
    at = _neighbours(images, x0f, y0f, tf.float64)

    def lerp(a: tf.Tensor, b: tf.Tensor, t: tf.Tensor) -> tf.Tensor:
        return _f32(a + t * _f32(b - a))

    def shifted(dy: int, dx: int) -> tf.Tensor:
        return at(dy, dx) + shift  # exact: the zero ring becomes the shifted zero

    v = lerp(lerp(shifted(0, 0), shifted(0, 1), fx), lerp(shifted(1, 0), shifted(1, 1), fx), fy)
    limits = IMAGE_RANGES[images.dtype.name]
    if limits is None:
        return tf.cast(v, tf.float32)
    return tf.cast(tf.clip_by_value(tf.round(v), limits[0] + shift, limits[1] + shift) - shift, images.dtype)


def _neighbours(images: tf.Tensor, x0f: tf.Tensor, y0f: tf.Tensor, dtype: tf.DType) -> Callable[[int, int], tf.Tensor]:
    """``at(dy, dx)``: the (B, h, w, C) values, as ``dtype``, of each output pixel's source neighbour at
    (``y0f + dy``, ``x0f + dx``) (``x0f``/``y0f``: the floored source coordinates, in ``dtype``), 0 outside the
    image: the images padded with a zero ring two pixels wide and the coordinates clamped to [-2, W] / [-2, H],
    so far outside both neighbours fall in the ring."""
    shape = tf.shape(images, out_type=tf.int64)
    b, h, w, c = shape[0], shape[1], shape[2], shape[3]
    src = tf.reshape(tf.pad(tf.cast(images, dtype), [[0, 0], [2, 2], [2, 2], [0, 0]]), tf.stack([-1, c]))
    x0 = tf.cast(tf.clip_by_value(x0f, -2.0, tf.cast(w, dtype)), tf.int64) + 2
    y0 = tf.cast(tf.clip_by_value(y0f, -2.0, tf.cast(h, dtype)), tf.int64) + 2
    stride = w + 4
    base = tf.range(b)[:, None, None] * (h + 4) * stride

    def at(dy: int, dx: int) -> tf.Tensor:
        return tf.gather(src, base + (y0 + dy) * stride + (x0 + dx))

    return at


def _lerp(a: tf.Tensor, b: tf.Tensor, t: tf.Tensor) -> tf.Tensor:
    """``a + t * (b - a)`` in float32 (fusing it as OpenCV does changed no output pixel, measured)."""
    return a + t * (b - a)


def apply_luts(images: tf.Tensor, luts: tf.Tensor) -> tf.Tensor:
    """Per-sample 256-entry uint8 LUTs (B, 256) applied to (B, H, W, C) uint8 images."""
    shape = tf.shape(images)
    flat = tf.reshape(tf.cast(images, tf.int32), tf.stack([shape[0], -1]))
    return tf.reshape(tf.gather(luts, flat, batch_dims=1), shape)


def _grey(img: tf.Tensor) -> tf.Tensor:
    """OpenCV 5's RGB2GRAY for uint8, in integers: (R*9798 + G*19235 + B*3735 + 2**14) >> 15 (equal to cv2 5.0 on
    all 2**24 colours; the 14-bit 4899/9617/1868 form differs on 0.26% of them); (B, H, W, 1) float32."""
    i = tf.cast(img, tf.int32)
    g = tf.bitwise.right_shift(i[..., 0:1] * 9798 + i[..., 1:2] * 19235 + i[..., 2:3] * 3735 + 16384, 15)
    return tf.cast(g, tf.float32)


def saturate(images: tf.Tensor, sat: tf.Tensor) -> tf.Tensor:
    """Blend towards OpenCV's grey by per-sample factors as the CPU path: ``clip(g + (x - g) * s + 0.5)``,
    truncated."""
    grey = _grey(images)
    v = grey + (tf.cast(images, tf.float32) - grey) * sat[:, None, None, None] + 0.5
    return tf.cast(tf.clip_by_value(v, 0.0, 255.0), tf.uint8)


def _rgb2hsv(img: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """OpenCV's ``COLOR_RGB2HSV`` for uint8 in integer ops (bit-exact): h in [0, 180), s, v; int32 each."""
    x = tf.cast(img, tf.int32)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    v = tf.maximum(tf.maximum(r, g), b)
    diff = v - tf.minimum(tf.minimum(r, g), b)
    s = tf.bitwise.right_shift(diff * tf.gather(HSV_SDIV, v) + 2048, 12)
    h = tf.where(v == r, g - b, tf.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    h = tf.bitwise.right_shift(h * tf.gather(HSV_HDIV, diff) + 2048, 12)  # arithmetic shift, as OpenCV's
    return tf.where(h < 0, h + 180, h), s, v


def _one_minus(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """``1 - a * b`` rounded once to float32, as the fused multiply-add OpenCV's vector code compiles to."""
    return tf.cast(1.0 - tf.cast(a, tf.float64) * tf.cast(b, tf.float64), tf.float32)


def _hsv2rgb(h: tf.Tensor, s: tf.Tensor, v: tf.Tensor) -> tf.Tensor:
    """OpenCV's ``COLOR_HSV2RGB`` for uint8 (its vector path: float32 sectors, truncated to uint8) → (…, 3)."""
    hf = tf.cast(h, tf.float32) * np.float32(6.0 / 180)
    sf = tf.cast(s, tf.float32) * np.float32(1.0 / 255)
    vf = tf.cast(v, tf.float32) * np.float32(1.0 / 255)
    sector = tf.floor(hf)
    f = hf - sector
    sector = sector - tf.floor(sector * np.float32(1.0 / 6)) * 6.0
    t0, t1, t2, t3 = vf, vf * (1.0 - sf), vf * _one_minus(sf, f), vf * _one_minus(sf, 1.0 - f)
    r = tf.where(sector < 1, t0, tf.where(sector < 2, t2, tf.where(sector < 4, t1, tf.where(sector < 5, t3, t0))))
    g = tf.where(sector < 1, t3, tf.where(sector < 3, t0, tf.where(sector < 4, t2, t1)))
    b = tf.where(sector < 2, t1, tf.where(sector < 3, t3, tf.where(sector < 5, t0, t2)))
    return tf.cast(tf.clip_by_value(tf.floor(tf.stack([r, g, b], -1) * 255.0), 0.0, 255.0), tf.uint8)


def _shifted_hsv2rgb(h: tf.Tensor, s: tf.Tensor, v: tf.Tensor, shift: tf.Tensor) -> tf.Tensor:
    return _hsv2rgb(tf.math.floormod(h + tf.cast(shift, tf.int32)[:, None, None], 180), s, v)


def _xla(fn: Any) -> Any:
    return tf.function(fn, jit_compile=True, reduce_retracing=True)


#: The image stages compiled by XLA, each on its own (~4x less CPU than op by op; one cluster for the whole
#: HSV round trip recomputes its first half per output channel: 3x slower, measured). Outputs as close to
#: OpenCV's as op by op. Labels stay outside XLA: their float64 coordinate sums must not be fused.
_STAGES: dict[str, Any] = {"warp": warp_images, "lut": apply_luts, "sat": saturate, "rgb2hsv": _rgb2hsv,
                           "hsv2rgb": _shifted_hsv2rgb}
_STAGES_XLA: dict[str, Any] = {name: _xla(fn) for name, fn in _STAGES.items()}


def _jitter(op: ColorJitter, img: tf.Tensor, arrays: dict[str, tf.Tensor], run: dict[str, Any]) -> tf.Tensor:
    """Brightness/contrast LUT, saturation, hue: the stages this op's arrays switch on; 16-bit images:
    :func:`~shardkit.augment.levels.brightness_contrast` in float64."""
    if "bc" in arrays and img.dtype != tf.uint8:
        lo, mid, hi = LEVELS[img.dtype.name]
        bc = arrays["bc"][:, :, None, None, None]
        v = (tf.cast(img, tf.float64) * bc[:, 0] - mid) * bc[:, 1] + mid
        return tf.cast(tf.clip_by_value(tf.round(v), lo, hi), img.dtype)
    if "lut" in arrays:
        img = run["lut"](img, arrays["lut"])
    if "sat" in arrays:
        img = run["sat"](img, arrays["sat"])
    if "shift" in arrays:
        img = run["hsv2rgb"](*run["rgb2hsv"](img), arrays["shift"])
    return img


def _gamma(op: RandomGamma, img: tf.Tensor, arrays: dict[str, tf.Tensor], run: dict[str, Any]) -> tf.Tensor:
    """RandomGamma as the CPU path: uint8 through the host-computed table; 16-bit through the 65536-entry table of
    :func:`shardkit.augment.levels.gamma_table16`, computed here in float64 from the drawn gammas; float32 as
    ``x ** gamma`` in float32, values outside [0, 1] refused (an InvalidArgumentError naming the rule)."""
    if img.dtype == tf.uint8:
        return run["lut"](img, arrays["lut"])
    if img.dtype == tf.float32:
        inside = tf.reduce_all(((img >= 0.0) & (img <= 1.0)) | tf.math.is_nan(img))
        check = tf.debugging.Assert(inside, ["RandomGamma on float32 images takes values in [0, 1]; scale the images "
                                             "into [0, 1] before gamma (e.g. divide by their maximum), or drop gamma"])
        with tf.control_dependencies([check]):
            return tf.pow(img, tf.cast(arrays["gamma"], tf.float32)[:, None, None, None])
    lo = int(LEVELS[img.dtype.name][0])
    top = float(levels.LEVELS16 - 1)
    t = tf.range(levels.LEVELS16, dtype=tf.float64) / top
    table = tf.clip_by_value(tf.round(tf.pow(t[None, :], arrays["gamma"][:, None]) * top), 0.0, top)
    table = tf.cast(table, tf.int32) + lo
    shape = tf.shape(img)
    flat = tf.reshape(tf.cast(img, tf.int32) - lo, tf.stack([shape[0], -1]))
    return tf.cast(tf.reshape(tf.gather(table, flat, batch_dims=1), shape), img.dtype)


def _cutout(op: Cutout, img: tf.Tensor, lab: tf.Tensor, arrays: dict[str, tf.Tensor],
            ignore_index: int) -> tuple[tf.Tensor, tf.Tensor]:
    return cut_holes(img, lab, arrays["boxes"], op, ignore_index)


def _normalize(op: Normalize, img: tf.Tensor, lab: tf.Tensor, ignore_index: int,
               arrays: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
    return (tf.cast(img, tf.float32) - op.mean_f32) * op.inv_std_f32, lab


def _one_hot(op: OneHot, img: tf.Tensor, lab: tf.Tensor, ignore_index: int,
             arrays: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
    return img, one_hot(lab, op, ignore_index)


def _volume_normalize(op: VolumeNormalize, img: tf.Tensor, lab: tf.Tensor, ignore_index: int,
                      arrays: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
    """Each sample's (lower, upper, mean, std) rows ((B, 4, C) float32) on its float32 image, as the numpy path."""
    c = arrays["constants"][:, :, None, None, :]  # (B, 4, 1, 1, C) against (B, H, W, C)
    x = tf.clip_by_value(tf.cast(img, tf.float32), c[:, 0], c[:, 1])
    return (x - c[:, 2]) / c[:, 3], lab


#: This backend's kernels, by op class (:meth:`shardkit.augment.ops.Compose.kernels`), on (B, H, W, C) images:
#: photometric ``f(op, img, arrays, stages) -> img`` (``stages``: :data:`_STAGES` or their XLA-compiled form);
#: mask ``f(op, img, lab, arrays, ignore_index) -> (img, lab)``; output ``f(op, img, lab, ignore_index)``.
OP_KERNELS: dict[type, Any] = {ColorJitter: _jitter, Cutout: _cutout, Normalize: _normalize, OneHot: _one_hot,
                               VolumeNormalize: _volume_normalize,
                               RandomGamma: _gamma}


def apply_batch(aug: Compose, images: tf.Tensor, labels: tf.Tensor, indices: Any, *, seed: int = 0,
                epoch: Any = 0, ignore_index: int = 255, hw: Any = None,
                jit: bool = True) -> tuple[tf.Tensor, tf.Tensor]:
    """Augment a batch in TensorFlow ops: images (B, H, W, 3) uint8, labels (B, H, W) integer ids,
    ``indices`` (B,) the samples' global indices, ``epoch`` a Python int or a scalar tensor (so one traced
    ``.map`` serves every epoch). ``hw``: (B, 2) true sizes of samples padded to a common canvas (images
    with 0, labels with ``ignore_index``); None: every sample fills the batch. ``jit``: compile the image ops
    with XLA (labels never are). Returns the augmented (images, labels), labels in their own dtype."""
    table = check_ops(aug)
    images = tf.convert_to_tensor(images)
    labels = tf.convert_to_tensor(labels)
    if (images.dtype.name not in IMAGE_RANGES or images.shape.rank != 4 or labels.shape.rank != 3
            or not labels.dtype.is_integer):
        raise ConfigError(f"augment needs (B, H, W, C) uint8, uint16, int16 or float32 images and (B, H, W) integer "
                          f"id labels, got {images.shape} {images.dtype.name} and {labels.shape} {labels.dtype.name}",
                          fix="read the split with labels='ids'")
    if images.shape[3] is not None:
        aug.output_spec(BatchSpec(channels=int(images.shape[3]), image_dtype=images.dtype.name))
    static = tuple(images.shape[1:3])
    in_hw = (int(static[0]), int(static[1])) if hw is None and None not in static else None
    if hw is not None and aug.out_hw is None:
        raise ConfigError("samples of different sizes batch only through a pipeline ending in a crop",
                          fix="end the pipeline with a crop, e.g. '…,crop=352x480'")
    out_hw = output_hw(aug, in_hw)
    indices = tf.reshape(tf.cast(indices, tf.int64), [-1])
    if hw is None:
        shape = tf.shape(images)
        hw = tf.tile(shape[None, 1:3], tf.stack([shape[0], 1]))
    hw = tf.cast(hw, tf.int32)
    need_label = any(getattr(op, "cat_max_ratio", None) is not None for op in aug.ops)
    args = [indices, tf.cast(epoch, tf.int64), hw] + ([labels] if need_label else [])
    spec = packing.layout(aug)
    got = tf.numpy_function(_draw(aug, int(seed), int(ignore_index), out_hw, need_label), args,
                            [tf.as_dtype(dtype) for _, dtype, _ in spec], stateful=False)
    got = got if isinstance(got, (list, tuple)) else [got]  # one output comes back bare
    b = images.shape[0]
    arrays = {}
    for (name, _, shape), t in zip(spec, got, strict=True):
        t.set_shape([b if d == "B" else d for d in shape])
        arrays[name] = t
    out = tf.constant(out_hw, tf.int64) if out_hw is not None else tf.shape(images, out_type=tf.int64)[1:3]
    out_lab = warp_labels(labels, arrays["mats"], out, ignore_index)
    run = _STAGES_XLA if jit else _STAGES
    img = run["warp"](images, arrays["mats"], out)
    for k, op, kernel in table:
        if op.kind is Kind.PHOTOMETRIC:
            img = kernel(op, img, packing.of(arrays, k), run)
    oh, ow = out_hw if out_hw is not None else (None, None)
    img.set_shape((b, oh, ow, images.shape[3]))
    out_lab.set_shape((b, oh, ow))
    for k, op, kernel in table:  # after geometry and colour: the masks, then the output ops, in the CPU path's order
        if op.kind is Kind.MASK:
            img, out_lab = kernel(op, img, out_lab, packing.of(arrays, k), ignore_index)
    for k, op, kernel in table:
        if op.kind is Kind.OUTPUT:
            img, out_lab = kernel(op, img, out_lab, ignore_index, packing.of(arrays, k))
    return img, out_lab


def cut_holes(images: tf.Tensor, labels: tf.Tensor, boxes: tf.Tensor, op: Cutout,
              ignore_index: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Cutout: pixels inside any of a sample's ``boxes`` ((B, K, 4) ``(y0, x0, y1, x1)``, ends exclusive, padded
    with empty boxes) become the op's fill; their labels the ignore index with ``ignore_labels``."""
    shape = tf.shape(images)
    y, x = tf.range(shape[1]), tf.range(shape[2])
    rows = (y >= boxes[..., 0:1]) & (y < boxes[..., 2:3])  # (B, K, H)
    cols = (x >= boxes[..., 1:2]) & (x < boxes[..., 3:4])  # (B, K, W)
    inside = tf.reduce_any(rows[..., :, None] & cols[..., None, :], axis=1)  # (B, H, W)
    channels = images.shape[-1]
    fill = (band_fill(op.fill, int(channels), images.dtype.name) if channels is not None
            else op.fill[:1] if len(set(op.fill)) == 1 else op.fill)
    images = tf.where(inside[..., None], tf.constant(fill, images.dtype), images)
    if op.ignore_labels:
        labels = tf.where(inside, tf.cast(ignore_index, labels.dtype), labels)
    return images, labels


def one_hot(labels: tf.Tensor, op: OneHot, ignore_index: int | None = None) -> tf.Tensor:
    """Ids (B, H, W) → one-hot (B, H, W, C'), or (B, C', H, W) with ``channels_first``; the ignore id and ids
    ``>= C`` → all zero, C' = :meth:`OneHot.channels` (the ignore class has no channel; channels numbered by
    :func:`shardkit.codecs.onehot.channel_lut`)."""
    c = op.num_classes
    ids = tf.cast(labels, tf.int32)
    if ignore_inside(c, ignore_index):
        ids = tf.gather(tf.constant(channel_lut(c, ignore_index), tf.int32), tf.minimum(ids, c))
    hot = tf.one_hot(ids, op.channels(ignore_index), dtype=tf.as_dtype(op.dtype))
    return tf.transpose(hot, (0, 3, 1, 2)) if op.channels_first else hot
