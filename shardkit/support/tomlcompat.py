"""``tomllib`` (Python 3.11+), or its backport ``tomli`` on Python 3.10: the one place that chooses."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["load_small_toml", "loads", "tomllib"]


def loads(text: str) -> dict[str, Any]:
    """``tomllib.loads``; a document nested deeper than the parser can recurse (``a=[[[[…``, 100k deep) is a
    ValueError like any other bad TOML, not a RecursionError."""
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise ValueError("arrays or tables nested too deeply for the TOML parser") from None


def load_small_toml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A TOML file read as ``--config`` reads it: a regular file of at most
    :data:`~shardkit.support.smallfile.MAX_TEXT_BYTES` (a FIFO or ``/dev/zero`` refused before a byte is read), UTF-8,
    parsed by :func:`loads`. OSError, UnicodeDecodeError or ValueError (``tomllib.TOMLDecodeError`` is one)."""
    from .smallfile import read_small_text

    return loads(read_small_text(path, what))
