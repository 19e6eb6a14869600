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
         label_layout: str = "channels_last", cache_dir: str | _os.PathLike[str] | None = None,
         cache_limit: int | str | None = None, storage_options: dict[str, _Any] | None = None) -> Dataset:
    """Open a converted split folder (``out/train``) or URL (``s3://bucket/out/train``) as a :class:`Dataset`.

    ``labels``: ``"ids"``, ``"onehot"``, ``"float_onehot"`` or ``"stored"``; ``verify=True`` checks every
    shard's sha256 on open; ``label_layout``: ``"channels_last"`` or ``"channels_first"`` one-hot.
    For a URL, shards are cached whole in ``cache_dir`` (default ``$SHARDKIT_CACHE_DIR`` or
    ``~/.cache/shardkit``) up to ``cache_limit`` (e.g. ``"20GB"``); ``storage_options`` go to fsspec
    (docs/object-storage.md).
    """
    from .read.dataset import Dataset
    from .storage import is_url

    return Dataset(_os.fspath(path) if is_url(path) else _Path(path), labels=labels, verify=verify,
                   label_layout=label_layout, cache_dir=cache_dir, cache_limit=cache_limit,
                   storage_options=storage_options)
