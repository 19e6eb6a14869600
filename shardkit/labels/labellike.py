"""Whether a folder's files look like labels, judged by what they are, not by the folder's name: the guard on
every pairing suggestion (a folder of photos, overlays or visualisations is never suggested as labels).

A label-like file is one channel or a palette (PNG, TIFF, GIF, BMP …) with few distinct values, or colour with
few distinct colours (colour masks; JPEG masks are near-gray with a few noise levels). A photo has thousands
of colours, an overlay blends one into a photo. Cheap: a few files per folder, each header checked against the
pixel limit before decoding, and the values counted on a sample of at most :data:`_SAMPLE` pixels.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import ShardkitError
from ..images.imageio import check_pixels

#: Most distinct values (or colours) a label file may have on the sampled pixels: more than any image's classes
#: in the usual sets (ADE20K images hold ~10-40 of 150 classes), far fewer than a photo's colours.
MAX_LABEL_VALUES = 64
FILES = 3  # files judged per folder: every one must be label-like
_SAMPLE = 1 << 16  # pixels counted per file (an evenly strided sample)
_MAX_PIXELS = 1 << 24  # files larger than this are not decoded here (a suggestion is not worth a big decode)


def _distinct(path: Path) -> int | None:
    """Distinct values (one channel or palette) or colours on a sample of ``path``'s pixels; None when the file
    cannot be read within the limits."""
    try:
        check_pixels(path, _MAX_PIXELS, "label")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                mode = im.mode
                arr = np.asarray(im.convert("RGB") if mode in ("CMYK", "YCbCr", "LAB", "HSV") else im)
    except (ShardkitError, OSError, ValueError, SyntaxError, UnidentifiedImageError, Image.DecompressionBombError):
        return None
    if arr.ndim == 3:  # colours (alpha dropped) as one key each
        chans = arr[..., :3].reshape(-1, min(arr.shape[2], 3)).astype(np.uint64)
        flat = np.zeros(chans.shape[0], np.uint64)
        for k in range(chans.shape[1]):
            flat |= chans[:, k] << np.uint64(16 * k)
    else:
        flat = arr.reshape(-1)
    step = max(1, flat.size // _SAMPLE)
    return int(np.unique(flat[::step]).size)


def label_like(files: list[Path]) -> bool:
    """Whether every one of ``files`` (a folder's first few images) looks like a label: readable, with at most
    :data:`MAX_LABEL_VALUES` distinct values or colours. No files: False."""
    if not files:
        return False
    for path in files[:FILES]:
        n = _distinct(path)
        if n is None or n > MAX_LABEL_VALUES:
            return False
    return True
