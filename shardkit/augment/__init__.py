"""Read-time augmentation for segmentation batches: ``from shardkit import augment as A``.

Parameters are drawn apart from their application: :meth:`Compose.params` draws, from a
generator seeded by (seed, epoch, sample index, op position) only, a frozen
:class:`Params` per sample (one fused 2x3 affine matrix, output pixel → source pixel,
plus flip and colour factors); a backend applies them. This slice has the numpy/OpenCV
CPU backend (:mod:`shardkit.augment.cpu`); GPU / TensorFlow backends would apply the same
:class:`Params`.
"""

from __future__ import annotations

from .config import from_toml
from .ops import (
    ColorJitter,
    Compose,
    Cutout,
    Normalize,
    OneHot,
    Params,
    RandomCrop,
    RandomFlip,
    RandomRotate,
    RandomScale,
    parse,
)

__all__ = ["ColorJitter", "Compose", "Cutout", "Normalize", "OneHot", "Params", "RandomCrop", "RandomFlip",
           "RandomRotate", "RandomScale", "from_toml", "parse"]
