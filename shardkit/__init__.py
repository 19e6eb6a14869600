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

    Give ``options`` (a :class:`shardkit.OpenOptions`, what every adapter takes) or its fields as keywords, not
    both. Either way the Dataset keeps reading the version it opened, whatever a later convert publishes.

    :param path: the split's folder (the one holding ``manifest.json``) or its fsspec URL.
    :param options: every setting below in one object.
    :param labels: ``"ids"`` (H, W) class ids, ``"onehot"`` (H, W, C) uint8, ``"float_onehot"`` float32, or
        ``"stored"`` (the stored encoding as is).
    :param verify: check every shard's sha256 against the manifest on open.
    :param label_layout: ``"channels_last"`` (None: the default) or ``"channels_first"`` one-hot.
    :param cache_dir: for a URL, where shards are cached whole (default ``$SHARDKIT_CACHE_DIR`` or
        ``~/.cache/shardkit``).
    :param cache_limit: the cache's size limit, e.g. ``"20GB"`` or a byte count.
    :param storage_options: passed to fsspec: endpoint, credentials (docs/object-storage.md).
    :param version: open the kept publish N of the split (its ``manifest-v<N>.json``) instead of the current one.
    :param remote_reads: ``"shards"`` (whole shards through the cache), ``"ranges"`` (sample by sample with
        range requests) or ``"auto"`` (for a split larger than ``cache_limit``: whole shards for a sequential pass,
        ranges for shuffled or sparse batches, chosen per batch).
    :returns: the open :class:`Dataset`.
    :raises InputNotFoundError: no split (no ``manifest.json``) at ``path``, or no such ``version``.
    :raises ConfigError: a bad option, or ``options`` and keywords both given.
    :raises ShardFormatError: a manifest or shard that is not what the format says (``verify``: a changed shard).
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

    ``convert("raw/", "out/", size="352x480", format="lmdb", workers=4)``, or ``convert(ConvertConfig(...))``.

    :param config: the input folder, or a whole :class:`ConvertConfig` (then nothing else is given).
    :param output: the output folder (one subfolder per split) or an object-storage URL.
    :param options: :class:`ConvertConfig`'s fields (the CLI's long options with ``_`` for ``-``; every one is
        listed in the API reference), given as values or as the CLI's strings (``size="352x480"``).
    :returns: a :class:`ConvertSummary`: samples, shards, bytes and seconds, the class table and where it came
        from, skipped and reused samples, the manifests written and the versions published.
    :raises ConfigError: a bad option.
    :raises ShardkitError: bad input (each subclass names the file, the problem and the fix: a
        ``LayoutError``, ``LabelError``, ``DecodeError``, …; docs/runs.md has their exit codes).
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
