"""``tomllib`` (Python 3.11+), or its backport ``tomli`` on Python 3.10: the one place that chooses."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["tomllib"]
