"""``shardkit.tf.dataset("out/train", batch_size=8)``: the tf.data adapter under a short name.

Importing this module is cheap; TensorFlow is imported on the first call (see
:func:`shardkit.read.tf.dataset` for the options).
"""

from __future__ import annotations

from typing import Any

__all__ = ["dataset"]


def dataset(path: Any, plan: Any = None, **kwargs: Any) -> Any:
    """A ``tf.data.Dataset`` of the batches of ``plan`` (a :class:`shardkit.EpochPlan` or a batch size) of a converted
    split, opened with ``options=`` (a :class:`shardkit.OpenOptions`): uint8 images unless ``normalize=True``.
    The parameters are :func:`shardkit.read.tf.dataset`'s (this stub only defers the TensorFlow import)."""
    from .read.tf import dataset as _dataset

    return _dataset(path, plan, **kwargs)
