"""ADE20K's full-release label encoding: ``<image>_seg.png`` is RGB where the object class is
``(R / 10) * 256 + G`` (R divided by 10 and truncated, as the release's ``utils_ade20k.loadAde20K`` computes it)
and B numbers the instances. Class 0 is unlabelled. The instances are not read: a segmentation label is the class.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import LabelError

#: The label file name ending the full release gives every image's class/instance mask.
SEG_SUFFIX = "_seg.png"


def ade20k_class_ids(raw: np.ndarray, path: Path) -> np.ndarray:
    """Class ids (uint16, (H, W)) of a ``_seg.png``'s pixels in OpenCV's BGR(A) order (as
    :func:`~shardkit.images.imageio.decode_label_pixels` gives them); a file that is not 8-bit RGB is refused."""
    if raw.ndim != 3 or raw.shape[2] < 3 or raw.dtype != np.uint8:
        shape = "x".join(map(str, raw.shape))
        raise LabelError(f"ADE20K _seg.png label is {shape} {raw.dtype}, not 8-bit RGB (class = R/10*256 + G)",
                         path=path, fix="point the input at the full release's *_seg.png files, or pass "
                                        "--layout to read the labels as another kind")
    red, green = raw[:, :, 2], raw[:, :, 1]
    return (red // 10).astype(np.uint16) * 256 + green
