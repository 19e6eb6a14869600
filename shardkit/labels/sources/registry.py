"""Source name → its :class:`~shardkit.labels.sources.base.AnnotationSource` class, discovered like the layouts:
every module of this package other than the shared ones exposes ``SOURCE``."""

from __future__ import annotations

import importlib
import logging
import pkgutil
from functools import cache
from pathlib import Path

from ...errors import ConfigError
from .base import AnnotationSource

log = logging.getLogger(__name__)
_NOT_SOURCES = frozenset({"base", "registry"})


@cache
def all_sources() -> tuple[type[AnnotationSource], ...]:
    """Every source class, by name."""
    found = [importlib.import_module(f"{__package__}.{m.name}").SOURCE
             for m in pkgutil.iter_modules([str(Path(__file__).parent)])
             if m.name not in _NOT_SOURCES and not m.name.startswith("_")]
    return tuple(sorted(found, key=lambda cls: cls.name))


def names() -> tuple[str, ...]:
    return tuple(cls.name for cls in all_sources())


def get(name: str) -> type[AnnotationSource]:
    """The source called ``name``; ConfigError for an unknown one."""
    for cls in all_sources():
        if cls.name == name:
            return cls
    raise ConfigError(f"annotation source {name!r} is not one of {', '.join(names())}",
                      fix=f"pass --annotations with one of {', '.join(names())} (NAME or NAME:PATH)")


def parse(text: str) -> tuple[type[AnnotationSource], Path | None]:
    """``--annotations NAME[:PATH]`` → the source class and the path given (None: detect it)."""
    name, sep, path = text.partition(":")
    return get(name.strip().lower()), (Path(path).expanduser() if sep and path else None)


def detect(root: Path) -> list[tuple[type[AnnotationSource], Path]]:
    """Every source that finds its files under ``root``, with what it found."""
    out = []
    for cls in all_sources():
        try:
            where = cls().detect(root)
        except OSError as exc:  # an unreadable folder: this source is not found there
            log.debug("%s: %s not detected (%s)", root, cls.name, exc)
            continue
        if where is not None:
            out.append((cls, where))
    return out
