"""Format name → (writer class, reader class). Format modules are imported only when asked for."""

from __future__ import annotations

import importlib

from ..errors import ConfigError
from .base import ShardReader, ShardWriter

_MODULES: dict[str, tuple[str, str, str]] = {
    "npy": ("shardkit.formats.npy", "NpyWriter", "NpyReader"),
    "lmdb": ("shardkit.formats.lmdb", "LmdbWriter", "LmdbReader"),
    "hdf5": ("shardkit.formats.hdf5", "Hdf5Writer", "Hdf5Reader"),
    "tfrecord": ("shardkit.formats.tfrecord", "TfrecordWriter", "TfrecordReader"),
}


def _load(name: str, which: int) -> type:
    try:
        module_name, *classes = _MODULES[name]
    except KeyError:
        raise ConfigError(f"unknown format {name!r}", fix=f"use one of {', '.join(_MODULES)}") from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"format {name!r} is not available ({exc})",
                          fix="install shardkit with its dependencies") from None
    return getattr(module, classes[which])


def writer_class(name: str) -> type[ShardWriter]:
    return _load(name, 0)


def reader_class(name: str) -> type[ShardReader]:
    return _load(name, 1)
