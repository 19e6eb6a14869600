"""Format name → its :class:`~shardkit.formats.base.ShardFormat` (facts, writer, reader).

Every module of this package other than ``base``, ``registry`` and ``mapping`` (shared helpers) is a format and exposes
``FORMAT``: the list is discovered, so a new format needs no line here. Modules are
imported when a format is first asked for.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from ..errors import ConfigError
from .base import ShardFormat, ShardReader, ShardWriter

_NOT_FORMATS = frozenset({"base", "mapping", "registry"})


@cache
def names() -> tuple[str, ...]:
    """Every format's name, in a fixed order (npy first: the default)."""
    found = sorted(m.name for m in pkgutil.iter_modules(_package_path())
                   if m.name not in _NOT_FORMATS and not m.name.startswith("_"))
    return tuple(sorted(found, key=lambda n: (n != "npy", n)))


def _package_path() -> list[str]:
    from . import __path__ as path

    return list(path)


def get(name: str) -> type[ShardFormat]:
    """The format called ``name``; ConfigError for an unknown or unavailable one."""
    if name not in names():
        raise ConfigError(f"unknown format {name!r}", fix=f"use one of {', '.join(names())}")
    try:
        module = importlib.import_module(f"{__package__}.{name}")
    except ModuleNotFoundError as exc:
        raise ConfigError(f"format {name!r} is not available ({exc})",
                          fix="install shardkit with its dependencies") from None
    fmt: type[ShardFormat] = module.FORMAT
    return fmt


def all_formats() -> tuple[type[ShardFormat], ...]:
    return tuple(get(n) for n in names())


def writer_class(name: str) -> type[ShardWriter]:
    return get(name).writer


def reader_class(name: str) -> type[ShardReader]:
    return get(name).reader
