"""shardkit: convert segmentation datasets once into training-ready shards, read them back nearly free.

``import shardkit`` imports no deep-learning framework and no ``tfrecord``; adapters
(``shardkit.read.torch`` …) import theirs lazily.
"""

from __future__ import annotations

import os as _os
from pathlib import Path as _Path
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

__version__ = "0.1.0"

if _TYPE_CHECKING:
    from .read.dataset import Dataset

__all__ = ["Dataset", "__version__", "open"]


def __getattr__(name: str) -> _Any:
    """``shardkit.tf`` (tf.data adapter) is imported on first use, so ``import shardkit`` stays light."""
    if name == "Dataset":
        from .read.dataset import Dataset

        return Dataset
    if name == "tf":
        import importlib

        return importlib.import_module(".tf", __name__)
    raise AttributeError(f"module 'shardkit' has no attribute {name!r}")


def open(path: str | _os.PathLike[str], *, labels: str = "ids", verify: bool = False,
         label_layout: str = "channels_last") -> Dataset:
    """Open a converted split folder (``out/train``) as a random-access :class:`Dataset`.

    ``labels``: ``"ids"``, ``"onehot"``, ``"float_onehot"`` or ``"stored"``; ``verify=True`` checks every
    shard's sha256 on open; ``label_layout``: ``"channels_last"`` or ``"channels_first"`` one-hot.
    """
    from .read.dataset import Dataset

    return Dataset(_Path(path), labels=labels, verify=verify, label_layout=label_layout)
