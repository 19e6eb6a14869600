"""shardkit: convert segmentation datasets once into training-ready shards, read them back nearly free.

``import shardkit`` imports no deep-learning framework, no image decoder and no ``tfrecord``;
adapters (``shardkit.read.torch`` …) import theirs lazily.
"""

import os as _os
from pathlib import Path as _Path
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._version import __version__

if _TYPE_CHECKING:
    from .conversion.config import ConvertConfig
    from .conversion.pipeline import ConvertSummary
    from .read.dataset import Dataset
    from .read.options import EpochPlan, OpenOptions

__all__ = ["ConvertConfig", "ConvertSummary", "Dataset", "EpochPlan", "OpenOptions", "__version__", "convert", "open"]

_LAZY = {"ConvertConfig": ".conversion.config", "ConvertSummary": ".conversion.pipeline", "Dataset": ".read.dataset",
         "EpochPlan": ".read.options", "OpenOptions": ".read.options"}


def __getattr__(name: str) -> _Any:
    """Classes and ``shardkit.tf`` (tf.data adapter) load on first use, so ``import shardkit`` stays light."""
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    if name == "tf":
        return importlib.import_module(".tf", __name__)
    raise AttributeError(f"module 'shardkit' has no attribute {name!r}")


def open(path: "str | _os.PathLike[str]", options: "OpenOptions | None" = None, *, labels: str = "ids",
         verify: bool = False, label_layout: "str | None" = None, cache_dir: "str | _os.PathLike[str] | None" = None,
         cache_limit: "int | str | None" = None, storage_options: "dict[str, _Any] | None" = None,
         version: "int | None" = None, remote_reads: str = "auto") -> "Dataset":
    """Open a converted split folder (``out/train``) or URL (``s3://bucket/out/train``) as a :class:`Dataset`.

    ``options``: a :class:`shardkit.OpenOptions` (what every adapter takes); or its fields as keywords (not both):
    ``labels``: ``"ids"``, ``"onehot"``, ``"float_onehot"`` or ``"stored"``; ``verify=True`` checks every
    shard's sha256 on open; ``label_layout``: ``"channels_last"`` (None: the default) or ``"channels_first"``
    one-hot. For a URL, shards are cached whole in ``cache_dir`` (default ``$SHARDKIT_CACHE_DIR`` or
    ``~/.cache/shardkit``) up to ``cache_limit`` (e.g. ``"20GB"``); ``storage_options`` go to fsspec
    (docs/object-storage.md). ``version=N`` opens the kept publish N of the split (its ``manifest-v<N>.json``)
    instead of the current one; either way the Dataset keeps reading the version it opened. ``remote_reads``:
    ``"shards"`` (whole shards through the cache), ``"ranges"`` (sample by sample with range requests) or
    ``"auto"`` (the default: ranges when the split is larger than ``cache_limit``; docs/object-storage.md).
    """
    from .files.storage import is_url
    from .read.dataset import Dataset
    from .read.options import OpenOptions

    given = {"labels": labels, "verify": verify, "label_layout": label_layout, "cache_dir": cache_dir,
             "cache_limit": cache_limit, "storage_options": storage_options, "version": version,
             "remote_reads": remote_reads}
    default = OpenOptions()
    fields = {k: v for k, v in given.items() if v != getattr(default, k)}
    return Dataset(_os.fspath(path) if is_url(path) else _Path(path), options, **fields)


def convert(config: "ConvertConfig | str | _os.PathLike[str]", output: "str | _os.PathLike[str] | None" = None,
            **options: _Any) -> "ConvertSummary":
    """Convert a raw dataset folder into shards, as ``shardkit convert INPUT OUTPUT [options]`` does.

    Either ``convert("raw/", "out/", size="352x480", format="lmdb", workers=4)`` — the options are
    :class:`ConvertConfig`'s fields (the CLI's long options with ``_`` for ``-``), given as values or
    as the CLI's strings — or ``convert(ConvertConfig(...))``. A bad option is a
    :class:`~shardkit.errors.ConfigError`; bad input is another ``ShardkitError``. Returns what was done.
    """
    from .conversion.config import ConvertConfig
    from .conversion.pipeline import convert as run
    from .errors import ConfigError

    if isinstance(config, ConvertConfig):
        if output is not None or options:
            raise ConfigError("convert(ConvertConfig) takes no other arguments",
                              fix="put every option into the ConvertConfig (config.replace(...))")
        return run(config)
    if output is None:
        raise ConfigError("convert needs an output folder", fix='call convert("raw/", "out/", ...)')
    try:
        cfg = ConvertConfig(_Path(config), _Path(output), **options)
    except TypeError as exc:  # an unknown keyword: name it the way every other bad option is named
        raise ConfigError(f"convert: {exc}", fix="see shardkit.ConvertConfig for the options") from None
    return run(cfg)
