"""Which function applies a :class:`~shardkit.augment.ops.Compose` to a batch, by backend name.

A backend module registers its ``apply_batch`` when imported; a backend asked for by name before that is
imported here, on first use, as the format registry imports formats. So the ops never import a backend (they sit
below every backend in the import graph) and ``import shardkit.augment`` loads no OpenCV, torch or TensorFlow.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError

#: The module that registers each backend.
MODULES = {"numpy": "shardkit.augment.cpu"}
_APPLY: dict[str, Callable[..., Any]] = {}


def register(name: str, apply_batch: Callable[..., Any]) -> None:
    """Make ``apply_batch(compose, images, labels, indices, *, seed, epoch, ignore_index)`` the ``name`` backend."""
    _APPLY[name] = apply_batch


def apply_batch(name: str) -> Callable[..., Any]:
    """The ``name`` backend's batch function, its module imported on first use; a ConfigError for no such name."""
    if name not in _APPLY and name in MODULES:
        importlib.import_module(MODULES[name])
    try:
        return _APPLY[name]
    except KeyError:
        raise ConfigError(f"no augmentation backend {name!r}", fix=f"use one of {', '.join(MODULES)}") from None
