"""shardkit: convert segmentation datasets once into training-ready shards, read them back nearly free.

``import shardkit`` imports no deep-learning framework and no ``tfrecord``; adapters
(``shardkit.read.torch`` …) import theirs lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .read.dataset import Dataset

__all__ = ["__version__", "open"]


def __getattr__(name: str) -> Any:
    """``shardkit.tf`` (tf.data adapter) is imported on first use, so ``import shardkit`` stays light."""
    if name == "tf":
        import importlib

        return importlib.import_module(".tf", __name__)
    raise AttributeError(f"module 'shardkit' has no attribute {name!r}")


def open(path: Any, **kwargs: Any) -> Dataset:
    """Open a converted split folder (``out/train``) as a random-access :class:`Dataset`."""
    from .read.dataset import Dataset

    return Dataset(path, **kwargs)
