"""Read-time augmentation for segmentation batches: ``from shardkit import augment as A``.

Parameters are drawn apart from their application: :meth:`Compose.params` draws, from a
generator seeded by (seed, epoch, sample index, op position) only, a frozen
:class:`Params` per sample (one fused 2x3 affine matrix, output pixel → source pixel,
plus each op's own :class:`OpParams` record); a backend applies them. Each op declares its
:class:`Kind` (geometric ops join the matrix; photometric, mask and output ops are applied by
each backend's kernel table, which refuses an op it has no kernel for). Backends: numpy/OpenCV
(:mod:`shardkit.augment.cpu`), PyTorch (:mod:`shardkit.augment.torch`), TensorFlow
(:mod:`shardkit.augment.tf`); the device ones share the host-side packing of
:mod:`shardkit.augment.packing`.
"""

from __future__ import annotations

from .config import from_toml
from .intensity import VolumeNormalize
from .ops import (
    BatchSpec,
    ColorJitter,
    Compose,
    Cutout,
    Kind,
    Normalize,
    OneHot,
    Op,
    OpParams,
    Params,
    RandomCrop,
    RandomFlip,
    RandomGamma,
    RandomRotate,
    RandomScale,
    parse,
)

__all__ = ["BatchSpec", "ColorJitter", "Compose", "Cutout", "Kind", "Normalize", "OneHot", "Op", "OpParams", "Params",
           "RandomCrop", "RandomFlip", "RandomGamma", "RandomRotate", "RandomScale", "VolumeNormalize", "from_toml",
           "parse"]
