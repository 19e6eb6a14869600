"""Offline preprocessing of decoded pixels: fit image/label pairs to a size, encode labels.

Everything here runs inside worker processes and is a pure function of its inputs.
Labels are never interpolated: they are resized with nearest neighbour only and
padded with an explicit id, so every class id survives bit-exactly. Decoding files
is :mod:`shardkit.imageio`'s job.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from .errors import ConfigError, LabelError, ShardFormatError
from .onehot import onehot_into

#: Nearest neighbour with pixel centres aligned the way INTER_LINEAR / INTER_AREA align
#: them (the same sampling as PIL's NEAREST). Plain ``cv2.INTER_NEAREST`` samples
#: ``floor(dst * scale)``, which shifts labels up to one source pixel against the image
#: (e.g. at a 3x shrink). Both only ever copy existing ids: neither interpolates.
LABEL_INTERPOLATION = cv2.INTER_NEAREST_EXACT

RESIZE_MODES = ("none", "exact", "shorter")
CROP_MODES = ("center", "none")
ENCODINGS = ("index", "onehot", "packed")


def resized_hw(hw: tuple[int, int], size: tuple[int, int] | None, resize: str) -> tuple[int, int]:
    """The (H, W) an image of size ``hw`` is scaled to before any crop."""
    if resize not in RESIZE_MODES:
        raise ConfigError(f"resize={resize!r} is not one of {', '.join(RESIZE_MODES)}")
    if resize == "none":
        return hw
    if size is None:
        raise ConfigError(f"--resize {resize} needs a target", fix="add --size HxW")
    th, tw = size
    if resize == "exact":
        return th, tw
    h, w = hw
    scale = max(th / h, tw / w)
    return max(th, round(h * scale)), max(tw, round(w * scale))


def stored_hw(hw: tuple[int, int], size: tuple[int, int] | None, resize: str, crop: str) -> tuple[int, int]:
    """The (H, W) a source of ``hw`` is stored at: resized, then centre-cropped or padded to ``size``.

    The one statement of the stored-shape rule: :func:`fit_pair` produces it, the planner sizes
    shards by it before decoding anything, and :func:`fixed_size` is its shape-independent case.
    """
    if size is not None and crop == "center":
        return size
    return resized_hw(hw, size, resize)


def pads(hw: tuple[int, int], size: tuple[int, int] | None, resize: str, crop: str) -> bool:
    """Whether :func:`fit_pair` pads a sample of height/width ``hw`` (it is smaller than ``size`` after resizing)."""
    if size is None or crop != "center":
        return False
    th, tw = resized_hw(hw, size, resize)
    return th < size[0] or tw < size[1]


def fixed_size(size: tuple[int, int] | None, resize: str, crop: str) -> tuple[int, int] | None:
    """The (H, W) every stored sample has whatever its source size, or None when it follows the source."""
    return size if size is not None and (crop == "center" or resize == "exact") else None


def _crop_or_pad(arr: np.ndarray, size: tuple[int, int], fill: int) -> np.ndarray:
    """Centre crop or pad to exactly ``size`` like ``tf.image.resize_with_crop_or_pad``.

    Per axis: larger → crop starting at ``(h - H) // 2``; smaller → pad with ``fill``,
    ``(H - h) // 2`` before and the rest after.
    """
    h, w = arr.shape[:2]
    th, tw = size
    if (h, w) == (th, tw):
        return arr
    src_y, dst_y = max((h - th) // 2, 0), max((th - h) // 2, 0)
    src_x, dst_x = max((w - tw) // 2, 0), max((tw - w) // 2, 0)
    ch, cw = min(h, th), min(w, tw)
    if h >= th and w >= tw:  # pure crop: a contiguous copy of the window
        return np.ascontiguousarray(arr[src_y : src_y + th, src_x : src_x + tw])
    out = np.full((th, tw, *arr.shape[2:]), fill, dtype=arr.dtype)
    out[dst_y : dst_y + ch, dst_x : dst_x + cw] = arr[src_y : src_y + ch, src_x : src_x + cw]
    return out


def fit_pair(
    image: np.ndarray,
    label: np.ndarray,
    *,
    size: tuple[int, int] | None,
    resize: str,
    crop: str,
    pad_label: int,
    label_path: Path | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Resize then centre crop-or-pad an image and its label identically.

    Images use INTER_AREA when shrinking (both axes no larger) and INTER_LINEAR
    otherwise; labels always use nearest neighbour (:data:`LABEL_INTERPOLATION`), so
    the output label holds only ids present in the input. Padding is 0 for the image
    and ``pad_label`` for the label.
    """
    if image.shape[:2] != label.shape[:2]:
        ih, iw = image.shape[:2]
        lh, lw = label.shape[:2]
        raise LabelError(
            f"label is {lh}x{lw} (HxW) but its image is {ih}x{iw}",
            path=label_path,
            fix="re-export the label at the image size",
        )
    if crop not in CROP_MODES:
        raise ConfigError(f"crop={crop!r} is not one of {', '.join(CROP_MODES)}")
    if np.issubdtype(label.dtype, np.integer):
        info = np.iinfo(label.dtype)
        if not info.min <= pad_label <= info.max:
            raise ConfigError(
                f"pad label {pad_label} does not fit labels of type {label.dtype}",
                fix="choose an --ignore-index that is a stored class id",
            )
    h, w = image.shape[:2]
    th, tw = resized_hw((h, w), size, resize)
    if (th, tw) != (h, w):
        shrinking = th <= h and tw <= w
        interp = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
        had_channel_axis = image.ndim == 3
        image = cv2.resize(image, (tw, th), interpolation=interp)
        if had_channel_axis and image.ndim == 2:  # cv2 drops a single channel axis
            image = image[:, :, None]
        label = cv2.resize(label, (tw, th), interpolation=LABEL_INTERPOLATION)
    if size is not None and crop == "center":
        image = _crop_or_pad(image, size, 0)
        label = _crop_or_pad(label, size, pad_label)
    return np.ascontiguousarray(image), np.ascontiguousarray(label)


def stored_label_shape(hw: tuple[int, int], encoding: str, num_classes: int) -> tuple[int, ...]:
    """Shape of one stored label of height/width ``hw`` under ``encoding``."""
    h, w = hw
    if encoding == "index":
        return (h, w)
    if encoding == "onehot":
        return (h, w, num_classes)
    if encoding == "packed":
        return (h, w, (num_classes + 7) // 8)
    raise ConfigError(f"label encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")


def encode_label(
    ids: np.ndarray, encoding: str, num_classes: int, out: np.ndarray | None = None
) -> np.ndarray:
    """Turn ``(H, W)`` class ids (or a batch ``(..., H, W)``) into the stored label encoding.

    ``index`` keeps ids; ``onehot`` is ``(H, W, C)`` uint8 0/1; ``packed`` is the
    one-hot packed to bits along the last axis (``np.packbits``, big bit order),
    ``(H, W, ceil(C / 8))``. Ids ``>= C`` (an ignore id like 255) give all-zero vectors.
    ``out``, if given, must have exactly the stored shape and dtype and is filled.
    """
    if ids.ndim < 2:
        raise LabelError(f"label ids must be (H, W) or (..., H, W), got shape {ids.shape}")
    shape = (*ids.shape[:-2], *stored_label_shape(ids.shape[-2:], encoding, num_classes))
    dtype = ids.dtype if encoding == "index" else np.dtype(np.uint8)
    if out is not None and (out.shape != shape or out.dtype != dtype):
        raise ConfigError(f"output buffer is {out.shape} {out.dtype}, expected {shape} {dtype}")
    if encoding == "index":
        if out is None:
            return ids
        np.copyto(out, ids)
        return out
    if out is None:
        out = np.empty(shape, dtype=np.uint8)
    if encoding == "onehot":
        onehot_into(ids, num_classes, out, allow_numba=False)  # runs in convert's workers
        return out
    # packed: at most one bit per pixel (bit 7 - id % 8 of byte id // 8), so compare against
    # the byte index and multiply by the bit instead of building and packing the one-hot.
    nbytes = shape[-1]
    bit = np.right_shift(np.uint8(0x80), (ids & 7).astype(np.uint8))
    bit[ids >= num_classes] = 0
    np.equal((ids >> 3)[..., None], np.arange(nbytes, dtype=np.min_scalar_type(nbytes - 1)), out=out)
    np.multiply(out, bit[..., None], out=out)
    return out


def decode_label_encoding(
    stored: np.ndarray, encoding: str, num_classes: int, ignore_index: int | None
) -> np.ndarray:
    """Inverse of :func:`encode_label`: back to class ids (any leading dims, e.g. a batch).

    All-zero one-hot vectors become ``ignore_index``; without one they are an error,
    as is a vector with more than one bit set.
    """
    if encoding == "index":
        return stored
    if encoding == "packed":
        stored = np.unpackbits(stored, axis=-1, count=num_classes)
    elif encoding != "onehot":
        raise ConfigError(f"label encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")
    if stored.shape[-1] != num_classes:
        raise ShardFormatError(
            f"stored one-hot label has {stored.shape[-1]} channels, expected {num_classes}"
        )
    top = max(num_classes - 1, ignore_index or 0)
    out_dtype = np.uint8 if top <= 255 else np.dtype("<u2")
    hot = stored.sum(axis=-1, dtype=np.uint32)
    if (hot > 1).any():
        raise ShardFormatError("stored one-hot label has pixels with more than one class set")
    ids = stored.argmax(axis=-1).astype(out_dtype)
    empty = hot == 0
    if empty.any():
        if ignore_index is None:
            raise ShardFormatError(
                f"stored one-hot label has {int(empty.sum())} pixels with no class and no ignore index"
            )
        ids[empty] = ignore_index
    return ids
