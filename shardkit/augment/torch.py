"""PyTorch backend (GPU or CPU tensors): apply drawn :class:`~shardkit.augment.ops.Params` to a whole batch.

The parameters are drawn on the host by the same :meth:`Compose.params` as the numpy/OpenCV
backend, so a sample's geometry and colour factors are identical on every backend. Labels: the
source coordinate of every output pixel is computed in float64 in the same order as
:func:`shardkit.augment.geometry.gather_labels_exact` and rounded the same way (``floor(c + 0.5)``), then
gathered as integers, so label outputs are bit-identical to the CPU path; outside the source →
``ignore_index``, dtype kept. Images: one batched bilinear gather over the same
coordinates (float32, as OpenCV 5's ``warpAffine`` computes them), zero outside (a batch whose every sample
is only cropped, padded and/or flipped: a slice copy per sample, the same bytes, :func:`copy_shifted`), then the
brightness/contrast LUT and saturation (OpenCV's integer grey) as batched tensor ops; hue through a
float HSV round trip. Geometry and brightness/contrast/saturation agree with the CPU path within one
level (OpenCV 4 rounded coordinates to 1/32 pixel: a few levels there, hence OpenCV >= 5); labels exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from ..codecs.onehot import channel_lut, ignore_inside
from ..errors import ConfigError
from . import levels, packing
from .geometry import IMAGE_RANGES, INT16_SHIFT, Shift, integer_shift, shift_window
from .intensity import VolumeNormalize
from .ops import LEVELS, BatchSpec, ColorJitter, Cutout, Kind, Normalize, OneHot, RandomGamma, band_fill
from .packing import HSV_HDIV, HSV_SDIV

if TYPE_CHECKING:
    from .ops import Compose, Op, Params


def _coords(mats: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Source (x, y) in float64 of every output pixel, per sample: (B, H, W) each."""
    dev = mats.device
    y = torch.arange(hw[0], dtype=torch.float64, device=dev).view(1, -1, 1).expand(1, hw[0], hw[1])
    x = torch.arange(hw[1], dtype=torch.float64, device=dev).view(1, 1, -1).expand(1, hw[0], hw[1])
    m = mats.view(-1, 6, 1, 1)
    sx = m[:, 0] * x + m[:, 1] * y + m[:, 2]
    sy = m[:, 3] * x + m[:, 4] * y + m[:, 5]
    return sx, sy


#: The image dtypes warped, with the range integers are rounded and clamped to (float32: kept as computed).
RANGES: dict[torch.dtype, tuple[float, float] | None] = {getattr(torch, k): v for k, v in IMAGE_RANGES.items()}


def warp_images(nchw: torch.Tensor, mats: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """Bilinear warp of a (B, C, H, W) batch (any C; uint8, uint16, int16 or float32), zero outside, rounded to
    nearest and clamped to the dtype's range for integers. uint8: float32 coordinates and weights, the four
    neighbours summed in order (within a level of OpenCV 5); other dtypes: :func:`_warp_rule`."""
    if nchw.dtype != torch.uint8:
        return _warp_rule(nchw, mats, hw)
    dev = nchw.device
    m = mats.to(torch.float32).view(-1, 6, 1, 1)
    y = torch.arange(hw[0], dtype=torch.float32, device=dev).view(1, -1, 1)
    x = torch.arange(hw[1], dtype=torch.float32, device=dev).view(1, 1, -1)
    sx = m[:, 0] * x + m[:, 1] * y + m[:, 2]
    sy = m[:, 3] * x + m[:, 4] * y + m[:, 5]
    x0f, y0f = torch.floor(sx), torch.floor(sy)
    fx, fy = sx - x0f, sy - y0f
    at = _neighbours(nchw, x0f, y0f, torch.float32)
    gx, gy = 1.0 - fx, 1.0 - fy
    v = (at(0, 0) * (gx * gy).unsqueeze(1) + at(0, 1) * (fx * gy).unsqueeze(1)
         + at(1, 0) * (gx * fy).unsqueeze(1) + at(1, 1) * (fx * fy).unsqueeze(1))
    return torch.clamp(torch.round(v), 0, 255).to(torch.uint8)


def _neighbours(nchw: torch.Tensor, x0f: torch.Tensor, y0f: torch.Tensor,
                dtype: torch.dtype) -> Callable[[int, int], torch.Tensor]:
    """``at(dy, dx)``: the (B, C, h, w) values, as ``dtype``, of each output pixel's source neighbour at
    (``y0f + dy``, ``x0f + dx``) (the floored source coordinates, (B, h, w)), 0 outside the image: the images
    padded with a zero ring two pixels wide and the coordinates clamped to [-2, W] / [-2, H], so far outside
    both neighbours fall in the ring."""
    b, c, h, w = nchw.shape
    src = F.pad(nchw.to(dtype), (2, 2, 2, 2)).reshape(b, c, -1)
    x0 = x0f.clamp(-2, w).long() + 2
    y0 = y0f.clamp(-2, h).long() + 2
    stride = w + 4
    out_hw = x0f.shape[1:]

    def at(dy: int, dx: int) -> torch.Tensor:
        flat = ((y0 + dy) * stride + (x0 + dx)).view(b, 1, -1).expand(b, c, -1)
        return torch.gather(src, 2, flat).view(b, c, *out_hw)

    return at


def _f32(v: torch.Tensor) -> torch.Tensor:
    """``v`` (float64) rounded to float32, kept as float64: a float32 operation emulated exactly."""
    return v.to(torch.float32).to(torch.float64)


def _warp_rule(nchw: torch.Tensor, mats: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """Images other than uint8: :func:`shardkit.augment.geometry.warp_rule_numpy` operation for operation (float32
    operations and fused multiply-adds emulated in float64; int16 shifted into uint16's range)."""
    dev = nchw.device
    m = _f32(mats.to(torch.float64)).view(-1, 6, 1, 1)
    y = torch.arange(hw[0], dtype=torch.float64, device=dev).view(1, -1, 1)
    x = torch.arange(hw[1], dtype=torch.float64, device=dev).view(1, 1, -1)
    sx = _f32(m[:, 0] * x + _f32(_f32(y * m[:, 1]) + m[:, 2]))
    sy = _f32(m[:, 3] * x + _f32(_f32(y * m[:, 4]) + m[:, 5]))
    x0f, y0f = torch.floor(sx), torch.floor(sy)
    fx, fy = (sx - x0f).unsqueeze(1), (sy - y0f).unsqueeze(1)
    shift = float(INT16_SHIFT) if nchw.dtype == torch.int16 else 0.0
    at = _neighbours(nchw, x0f, y0f, torch.float64)

    def lerp(a: torch.Tensor, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return _f32(a + t * _f32(b - a))

    def shifted(dy: int, dx: int) -> torch.Tensor:
        return at(dy, dx) + shift  # exact: the zero ring becomes the shifted zero

    v = lerp(lerp(shifted(0, 0), shifted(0, 1), fx), lerp(shifted(1, 0), shifted(1, 1), fx), fy)
    limits = RANGES[nchw.dtype]
    if limits is None:
        return v.to(torch.float32)
    return (torch.clamp(torch.round(v), limits[0] + shift, limits[1] + shift) - shift).to(nchw.dtype)


def warp_labels(labels: torch.Tensor, sx: torch.Tensor, sy: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """(B, h, w) labels gathered at the nearest integer source pixel; outside → ``ignore_index``."""
    b, h, w = labels.shape
    ix, iy = torch.floor(sx + 0.5).long(), torch.floor(sy + 0.5).long()
    inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
    flat = (iy.clamp(0, h - 1) * w + ix.clamp(0, w - 1)).view(b, -1)
    out = torch.gather(labels.reshape(b, -1), 1, flat).view(ix.shape)
    return out.masked_fill_(~inside, ignore_index)


def _grey(img: torch.Tensor) -> torch.Tensor:
    """OpenCV 5's RGB2GRAY for uint8, in integers: (R*9798 + G*19235 + B*3735 + 2**14) >> 15 (equal to cv2 5.0
    on all 2**24 colours, as the TF path; the 14-bit 4899/9617/1868 form differs on 0.26% of them); (B, 1, H, W)."""
    i = img.to(torch.int32)
    return ((i[:, 0:1] * 9798 + i[:, 1:2] * 19235 + i[:, 2:3] * 3735 + 16384) >> 15).to(torch.float32)


_TABLES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _hsv_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenCV's RGB2HSV division tables on ``device``, made once per device (not copied every batch)."""
    if device not in _TABLES:
        _TABLES[device] = (torch.from_numpy(HSV_SDIV).to(device), torch.from_numpy(HSV_HDIV).to(device))
    return _TABLES[device]


# float32 constants as OpenCV's vector HSV2RGB uses them (Python floats holding exactly the float32 values)
_SIX_180 = float(np.float32(6.0 / 180))
_INV_255 = float(np.float32(1.0 / 255))
_INV_6 = float(np.float32(1.0 / 6))


def _one_minus(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``1 - a * b`` rounded once to float32, as the fused multiply-add OpenCV's vector code compiles to."""
    return (1.0 - a.to(torch.float64) * b.to(torch.float64)).to(torch.float32)


def _hue(img: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate hue by ``shift`` (per sample, OpenCV's 8-bit hue units: 180 = the full circle) as the CPU path:
    OpenCV 5's 8-bit ``RGB2HSV`` in integers (bit-exact), the hue shifted modulo 180, then ``HSV2RGB`` as its
    vector path computes it (float32 sectors, truncated); (B, 3, H, W) uint8. The same rule as the TF path."""
    x = img.to(torch.int32)
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    v = torch.maximum(torch.maximum(r, g), b)
    diff = v - torch.minimum(torch.minimum(r, g), b)
    sdiv, hdiv = _hsv_tables(img.device)
    s = (diff * sdiv[v.long()] + 2048) >> 12
    h = torch.where(v == r, g - b, torch.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    h = (h * hdiv[diff.long()] + 2048) >> 12  # arithmetic shift, as OpenCV's
    h = torch.where(h < 0, h + 180, h)
    h = torch.remainder(h + shift.to(torch.int32).view(-1, 1, 1), 180)
    hf = h.to(torch.float32) * _SIX_180
    sf = s.to(torch.float32) * _INV_255
    vf = v.to(torch.float32) * _INV_255
    sector = torch.floor(hf)
    f = hf - sector
    sector = sector - torch.floor(sector * _INV_6) * 6.0
    t0, t1, t2, t3 = vf, vf * (1.0 - sf), vf * _one_minus(sf, f), vf * _one_minus(sf, 1.0 - f)
    rr = torch.where(sector < 1, t0, torch.where(sector < 2, t2, torch.where(sector < 4, t1,
                                                                          torch.where(sector < 5, t3, t0))))
    gg = torch.where(sector < 1, t3, torch.where(sector < 3, t0, torch.where(sector < 4, t2, t1)))
    bb = torch.where(sector < 2, t1, torch.where(sector < 3, t3, torch.where(sector < 5, t0, t2)))
    return torch.clamp(torch.floor(torch.stack([rr, gg, bb], 1) * 255.0), 0.0, 255.0).to(torch.uint8)


class TorchNormalize:
    """A :class:`~shardkit.augment.ops.Normalize` op's constants made once on ``device`` in ``dtype``;
    calling it normalises a batch ((B, …) 4-D) or one sample (3-D): ``(x - mean) * (1 / std)``."""

    def __init__(self, op: Normalize, device: torch.device | str, *, dtype: torch.dtype = torch.float32,
                 channels_first: bool = True, constants: torch.Tensor | None = None) -> None:
        shape = (1, -1, 1, 1) if channels_first else (1, 1, 1, -1)
        self.dtype = dtype
        if constants is not None:  # float32 (2, C) already on the device, from Normalize.pack
            self.mean, self.inv_std = (c.to(dtype).reshape(shape) for c in constants)
            return
        self.mean = torch.tensor(list(op.mean), dtype=dtype).reshape(shape).to(device)
        self.inv_std = (1.0 / torch.tensor(list(op.std), dtype=dtype)).reshape(shape).to(device)

    def __call__(self, x: torch.Tensor, memory_format: torch.memory_format | None = None) -> torch.Tensor:
        """``x`` as ``dtype`` (in ``memory_format`` when given), normalised in place of that copy."""
        x = x.to(dtype=self.dtype, memory_format=memory_format) if memory_format is not None else x.to(self.dtype)
        mean, inv_std = (self.mean, self.inv_std) if x.ndim == 4 else (self.mean[0], self.inv_std[0])
        return x.sub_(mean).mul_(inv_std)


class TorchOneHot:
    """A :class:`~shardkit.augment.ops.OneHot` op on ``device``: ids (B, H, W) or (H, W) → one-hot along
    the class axis (after the batch axis with ``channels_first``, else last); the ignore id and ids ``>= C``
    → all zero, and an ignore id inside ``0..C-1`` has no channel (:func:`shardkit.codecs.onehot.channel_ids`)."""

    def __init__(self, op: OneHot, device: torch.device | str, ignore_index: int | None = None) -> None:
        c = op.num_classes
        self.lut = (torch.from_numpy(channel_lut(c, ignore_index)).to(device) if ignore_inside(c, ignore_index)
                    else None)
        self.classes = torch.arange(op.channels(ignore_index), device=device)
        self.dtype = torch.float32 if op.dtype == "float32" else torch.uint8
        self.channels_first = op.channels_first

    def __call__(self, y: torch.Tensor, memory_format: torch.memory_format | None = None) -> torch.Tensor:
        axis = (1 if y.ndim == 3 else 0) if self.channels_first else y.ndim
        view = [1] * (y.ndim + 1)
        view[axis] = -1
        ids = y.long()
        if self.lut is not None:  # the ignore class has no channel: shardkit.codecs.onehot.channel_lut numbers them
            ids = self.lut[ids.clamp(max=len(self.lut) - 1)]
        hot = (ids.unsqueeze(axis) == self.classes.view(view)).to(self.dtype)
        return hot.contiguous(memory_format=memory_format) if memory_format is not None else hot


def hole_mask(boxes: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """(B, H, W) bool, True inside any of a sample's holes (``boxes``: (B, K, 4) ``(y0, x0, y1, x1)`` padded with
    empty boxes, :meth:`Cutout.pack <shardkit.augment.ops.Cutout.pack>`, on the device): one broadcast comparison
    of every pixel row/column against all holes."""
    y = torch.arange(hw[0], device=boxes.device)
    x = torch.arange(hw[1], device=boxes.device)
    rows = (y >= boxes[..., 0:1]) & (y < boxes[..., 2:3])  # (B, K, H)
    cols = (x >= boxes[..., 1:2]) & (x < boxes[..., 3:4])  # (B, K, W)
    return (rows.unsqueeze(-1) & cols.unsqueeze(-2)).any(1)


_ALIGN = 8  # every packed array starts on an 8-byte boundary, so its bytes view as any dtype


def upload(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """``arrays`` on ``device`` through one host buffer and one copy. On CUDA the buffer is pinned and the copy
    asynchronous: a blocking copy per array would wait for all queued GPU work each time, so the host could
    not draw the next batch's parameters while the GPU still works on this one. (The caching host allocator
    keeps a pinned block until the copies that read it are done.)"""
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += -(-a.nbytes // _ALIGN) * _ALIGN
    host = np.zeros(max(total, _ALIGN), np.uint8)
    for a, o in zip(arrays, offsets, strict=True):
        host[o : o + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    buf = torch.from_numpy(host)
    buf = buf.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else buf.to(device)
    return [buf[o : o + a.nbytes].view(torch.from_numpy(a[:0]).dtype).view(a.shape)
            for a, o in zip(arrays, offsets, strict=True)]


def _lut(img: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Per-sample 256-entry uint8 LUTs (B, 256) applied to a (B, C, H, W) uint8 batch."""
    b = img.shape[0]
    return torch.gather(lut.long(), 1, img.reshape(b, -1).long()).to(torch.uint8).view(img.shape)


def _jitter(op: ColorJitter, img: torch.Tensor, arrays: dict[str, torch.Tensor]) -> torch.Tensor:
    """Brightness/contrast LUT, saturation (OpenCV's integer grey), hue, as the CPU path; 16-bit images:
    :func:`~shardkit.augment.levels.brightness_contrast` in float64."""
    if "bc" in arrays and img.dtype != torch.uint8:
        lo, mid, hi = LEVELS[str(img.dtype).removeprefix("torch.")]
        bc = arrays["bc"].view(-1, 2, 1, 1, 1)
        v = (img.to(torch.float64) * bc[:, 0] - mid) * bc[:, 1] + mid
        return torch.clamp(torch.round(v), lo, hi).to(img.dtype)
    if "lut" in arrays:
        img = _lut(img, arrays["lut"])
    if "sat" in arrays:
        grey = _grey(img)
        img = torch.clamp(grey + (img.to(torch.float32) - grey) * arrays["sat"].view(-1, 1, 1, 1) + 0.5,
                          0, 255).to(torch.uint8)
    if "shift" in arrays:
        img = _hue(img, arrays["shift"])
    return img


def _name(dtype: torch.dtype) -> str:
    """``torch.uint16`` → ``"uint16"``."""
    return str(dtype).removeprefix("torch.")


def _gamma(op: RandomGamma, img: torch.Tensor, arrays: dict[str, torch.Tensor]) -> torch.Tensor:
    """RandomGamma as the CPU path: uint8 through the host-computed table; 16-bit through the 65536-entry table of
    :func:`shardkit.augment.levels.gamma_table16`, computed here in float64 from the drawn gammas; float32 as
    ``x ** gamma`` in float32, values outside [0, 1] refused (a host sync on CUDA, for that check)."""
    if img.dtype == torch.uint8:
        return _lut(img, arrays["lut"])
    b = img.shape[0]
    if img.dtype == torch.float32:
        if bool(((img < 0) | (img > 1)).any()):
            real = img[~img.isnan()]
            levels.check_unit_range(float(real.min()), float(real.max()))
        return img.pow(arrays["gamma"].to(torch.float32).view(-1, 1, 1, 1))
    lo = int(LEVELS[_name(img.dtype)][0])
    top = levels.LEVELS16 - 1
    t = torch.arange(levels.LEVELS16, dtype=torch.float64, device=img.device) / float(top)
    table = torch.clamp(torch.round(t.view(1, -1) ** arrays["gamma"].view(-1, 1) * float(top)), 0, top).long() + lo
    got = torch.gather(table, 1, (img.reshape(b, -1).to(torch.int64) - lo))
    return got.view(img.shape).to(img.dtype)


def _cutout(op: Cutout, img: torch.Tensor, lab: torch.Tensor, arrays: dict[str, torch.Tensor],
            ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    boxes = arrays["boxes"]
    if boxes.shape[1] == 0:  # no sample of the batch drew a hole
        return img, lab
    holes = hole_mask(boxes, (int(img.shape[2]), int(img.shape[3])))
    fill = band_fill(op.fill, int(img.shape[1]), _name(img.dtype))
    img = torch.where(holes.unsqueeze(1), torch.tensor(fill, dtype=img.dtype, device=img.device).view(1, -1, 1, 1),
                      img)
    if op.ignore_labels:
        lab.masked_fill_(holes, ignore_index)
    return img, lab


def _normalize(op: Normalize, img: torch.Tensor, lab: torch.Tensor, arrays: dict[str, torch.Tensor],
               ignore_index: int, channels_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return TorchNormalize(op, img.device, channels_first=channels_first, constants=arrays["constants"])(img), lab


def _one_hot(op: OneHot, img: torch.Tensor, lab: torch.Tensor, arrays: dict[str, torch.Tensor],
             ignore_index: int, channels_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return img, TorchOneHot(op, lab.device, ignore_index)(lab)


def _volume_normalize(op: VolumeNormalize, img: torch.Tensor, lab: torch.Tensor, arrays: dict[str, torch.Tensor],
                      ignore_index: int, channels_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's (lower, upper, mean, std) rows ((B, 4, C) float32) on its float32 image, as the numpy path."""
    c = arrays["constants"]
    c = c[:, :, :, None, None] if channels_first else c[:, :, None, None, :]
    x = torch.clamp(img.to(torch.float32), c[:, 0], c[:, 1])
    return x.sub_(c[:, 2]).div_(c[:, 3]), lab


#: This backend's kernels, by op class (:meth:`shardkit.augment.ops.Compose.kernels`). On (B, C, H, W) images:
#: photometric ``f(op, img, arrays) -> img``; mask ``f(op, img, lab, arrays, ignore_index) -> (img, lab)``;
#: output (after the layout is restored) ``f(op, img, lab, arrays, ignore_index, channels_first) -> (img, lab)``.
#: ``arrays``: the op's packed arrays on the device (:mod:`shardkit.augment.packing`).
OP_KERNELS: dict[type, Callable[..., Any]] = {ColorJitter: _jitter, Cutout: _cutout, Normalize: _normalize,
                                              OneHot: _one_hot,
                                              RandomGamma: _gamma, VolumeNormalize: _volume_normalize}


def copy_shifted(nchw: torch.Tensor, labels: torch.Tensor, shifts: Sequence[Shift], hw: tuple[int, int],
                 ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C, H, W) images and (B, H, W) labels moved by one :func:`~shardkit.augment.geometry.integer_shift` per
    sample into ``hw``: a slice copy per sample (mirrored by ``flip``), 0 / ``ignore_index`` where the source does
    not reach — the bytes :func:`warp_images` and :func:`warp_labels` give for those matrices."""
    b, c = int(nchw.shape[0]), int(nchw.shape[1])
    img = torch.zeros((b, c, *hw), dtype=nchw.dtype, device=nchw.device)
    lab = torch.full((b, *hw), ignore_index, dtype=labels.dtype, device=labels.device)
    for k, shift in enumerate(shifts):
        (y0, y1, r0, r1), (x0, x1, c0, c1) = shift_window(shift, hw, (int(nchw.shape[2]), int(nchw.shape[3])))
        if y1 <= y0 or x1 <= x0:
            continue
        dims = [d for d, (sign, _) in ((-1, shift[0]), (-2, shift[1])) if sign < 0]
        part, part_lab = nchw[k, :, r0:r1, c0:c1], labels[k, r0:r1, c0:c1]
        if dims:
            part, part_lab = _flip(part, dims), _flip(part_lab, dims)
        img[k, :, y0:y1, x0:x1] = part
        lab[k, y0:y1, x0:x1] = part_lab
    return img, lab


#: Unsigned dtypes torch's CPU flip lacks, flipped as their signed twin (the same bytes: a flip computes nothing).
_SIGNED_TWIN = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def _flip(t: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """``t.flip(dims)`` for every dtype (uint16 … through their signed twin)."""
    twin = _SIGNED_TWIN.get(t.dtype)
    return t.flip(dims) if twin is None else t.view(twin).flip(dims).view(t.dtype)


def check_ops(aug: Compose) -> list[tuple[int, Op, Callable[..., Any]]]:
    """The pipeline's kernels here; a ConfigError naming an op this backend has none for."""
    return aug.kernels(OP_KERNELS, "torch")


def apply_batch(aug: Compose, images: torch.Tensor, labels: torch.Tensor, indices: Sequence[int] | np.ndarray
                | torch.Tensor, *, seed: int, epoch: int, ignore_index: int, channels_first: bool = False,
                params: list[Params] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Augment a stacked batch on its device: images (B, H, W, 3) uint8 (or (B, 3, H, W) with
    ``channels_first``), labels (B, H, W) integer ids → augmented tensors in the same layout (float32
    normalised images and one-hot labels when the pipeline ends in :class:`~shardkit.augment.ops.Normalize`
    / ``OneHot``)."""
    table = check_ops(aug)
    if isinstance(indices, torch.Tensor):
        indices = indices.cpu().numpy()
    idx = [int(i) for i in np.asarray(indices).reshape(-1)]
    if images.dtype not in RANGES or images.ndim != 4 or labels.ndim != 3:
        raise ConfigError(f"augment needs uint8, uint16, int16 or float32 image batches and (B, H, W) id labels, "
                          f"got {tuple(images.shape)} {images.dtype} and {tuple(labels.shape)}",
                          fix="make the loader with labels='ids'")
    nchw = images if channels_first else images.permute(0, 3, 1, 2)
    aug.output_spec(BatchSpec(channels=int(nchw.shape[1]), image_dtype=str(images.dtype).removeprefix("torch.")))
    hw_in = (int(nchw.shape[2]), int(nchw.shape[3]))
    if params is None:
        need_label = any(getattr(op, "cat_max_ratio", None) is not None for op in aug.ops)
        host_labels = labels.cpu().numpy() if need_label else None
        params = aug.params_batch(idx, seed=seed, epoch=epoch, hws=[hw_in] * len(idx),
                                  labels=None if host_labels is None else list(host_labels),
                                  ignore_index=ignore_index)
    sizes = {p.out_hw for p in params}
    if len(sizes) != 1:
        raise ConfigError(f"augmented samples differ in size {sorted(sizes)}; end the pipeline with a crop")
    hw = sizes.pop()
    host = packing.pack(aug, params)
    on = dict(zip(host, upload(list(host.values()), images.device), strict=True))
    # crop, pad, flip (every sample an integer shift; integer images: see shardkit.augment.cpu): slices copied
    shifts = [integer_shift(p.matrix) for p in params] if nchw.dtype != torch.float32 else [None]
    if None not in shifts:
        img, out_lab = copy_shifted(nchw, labels, shifts, hw, ignore_index)  # type: ignore[arg-type]
    else:
        sx, sy = _coords(on["mats"], hw)
        out_lab = warp_labels(labels, sx, sy, ignore_index)
        img = warp_images(nchw, on["mats"], hw)
    for k, op, kernel in table:
        if op.kind is Kind.PHOTOMETRIC:
            img = kernel(op, img, packing.of(on, k))
    for k, op, kernel in table:
        if op.kind is Kind.MASK:
            img, out_lab = kernel(op, img, out_lab, packing.of(on, k), ignore_index)
    if not channels_first:
        img = img.permute(0, 2, 3, 1).contiguous()
    for k, op, kernel in table:
        if op.kind is Kind.OUTPUT:
            img, out_lab = kernel(op, img, out_lab, packing.of(on, k), ignore_index, channels_first)
    return img, out_lab
