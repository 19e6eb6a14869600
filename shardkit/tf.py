"""``shardkit.tf.dataset("out/train", batch_size=8)``: the tf.data adapter under a short name.

Importing this module is cheap; TensorFlow is imported on the first call (see
:func:`shardkit.read.tf.dataset` for the options).
"""

from __future__ import annotations

from typing import Any

__all__ = ["dataset"]


def dataset(path: Any, batch_size: int, **kwargs: Any) -> Any:
    """A ``tf.data.Dataset`` of batches of a converted split; see :func:`shardkit.read.tf.dataset`."""
    from .read.tf import dataset as _dataset

    return _dataset(path, batch_size, **kwargs)
