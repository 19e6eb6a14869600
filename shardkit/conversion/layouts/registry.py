"""Layout name → its :class:`~shardkit.conversion.layouts.base.Layout` class.

Every module of this package other than the shared ones below exposes ``LAYOUT``: the list is discovered, as the
formats are (:mod:`shardkit.formats.registry`), so a new layout is one new module and no line here.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from pathlib import Path

from ...errors import ConfigError
from .base import Layout

_NOT_LAYOUTS = frozenset({"base", "diagnose", "discover", "registry", "scan", "splitlist", "volumes"})


@cache
def all_layouts() -> tuple[type[Layout], ...]:
    """Every layout class, in the order ``--layout auto`` tries them (then by name)."""
    found = []
    for m in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if m.name not in _NOT_LAYOUTS and not m.name.startswith("_"):
            found.append(importlib.import_module(f"{__package__}.{m.name}").LAYOUT)
    return tuple(sorted(found, key=lambda cls: (cls.order, cls.name)))


def names(auto_only: bool = False) -> tuple[str, ...]:
    """Layout names in trial order (``auto_only``: only those ``--layout auto`` tries)."""
    return tuple(cls.name for cls in all_layouts() if cls.auto or not auto_only)


def get(name: str) -> type[Layout]:
    """The layout called ``name``; ConfigError for an unknown one."""
    for cls in all_layouts():
        if cls.name == name:
            return cls
    raise ConfigError(f"layout {name!r} is not one of auto, {', '.join(names(auto_only=True))}",
                      fix="pass --layout auto (or one of those), or --images/--labels")
