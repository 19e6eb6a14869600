"""Offline preprocessing of decoded pixels: fit image/label pairs to a size (label encodings:
:mod:`shardkit.codecs.encoding`).

Everything here runs inside worker processes and is a pure function of its inputs.
Labels are never interpolated: they are resized with nearest neighbour only and
padded with an explicit id, so every class id survives bit-exactly. Decoding files
is :mod:`shardkit.images.imageio`'s job.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

# label encodings live in shardkit.codecs.encoding; these names stay importable from here
from ..codecs.encoding import decode_label_encoding, encode_label, stored_label_shape  # noqa: F401
from ..errors import ConfigError, LabelError

#: Nearest neighbour with pixel centres aligned the way INTER_LINEAR / INTER_AREA align
#: them (the same sampling as PIL's NEAREST). Plain ``cv2.INTER_NEAREST`` samples
#: ``floor(dst * scale)``, which shifts labels up to one source pixel against the image
#: (e.g. at a 3x shrink). Both only ever copy existing ids: neither interpolates.
LABEL_INTERPOLATION = cv2.INTER_NEAREST_EXACT

RESIZE_MODES = ("none", "exact", "shorter")
CROP_MODES = ("center", "none")


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


def content_box(hw: tuple[int, int], size: tuple[int, int] | None, resize: str,
                crop: str) -> tuple[int, int, int, int]:
    """(y0, y1, x0, x1): where a source of ``hw`` lands in its stored sample (:func:`fit_pair`); outside it is
    padding (image 0, label the pad id), which image statistics leave out."""
    th, tw = resized_hw(hw, size, resize)
    if size is None or crop != "center":
        return 0, th, 0, tw
    dy, dx = max((size[0] - th) // 2, 0), max((size[1] - tw) // 2, 0)
    return dy, dy + min(th, size[0]), dx, dx + min(tw, size[1])


def stored_to_source(hw: tuple[int, int], size: tuple[int, int] | None, resize: str,
                     crop: str) -> tuple[float, float, float, float]:
    """(sy, sx, oy, ox): stored pixel corner (r, c) of a source of ``hw`` lies at source pixel corner
    (sy·(r + oy), sx·(c + ox)) (:func:`fit_pair`'s resize then centre crop or pad): what moves a georeference
    from the source's grid to the stored one."""
    h, w = hw
    th, tw = resized_hw(hw, size, resize)
    oy = ox = 0
    if size is not None and crop == "center":
        oy = max((th - size[0]) // 2, 0) - max((size[0] - th) // 2, 0)
        ox = max((tw - size[1]) // 2, 0) - max((size[1] - tw) // 2, 0)
    return h / th, w / tw, float(oy), float(ox)


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
