"""Which function applies a :class:`~shardkit.augment.ops.Compose` to a batch, by backend name.

A backend module registers its ``apply_batch`` when imported; a backend asked for by name before that is
imported here, on first use, as the format registry imports formats. So the ops never import a backend (they sit
below every backend in the import graph) and ``import shardkit.augment`` loads no OpenCV, torch or TensorFlow.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .ops import Compose, Op

from ..errors import ConfigError

#: The module that registers each backend.
MODULES = {"numpy": "shardkit.augment.cpu"}
_APPLY: dict[str, Callable[..., Any]] = {}
K = TypeVar("K")


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


def kernels(aug: Compose, table: Mapping[type, K], backend: str) -> list[tuple[int, Op, K]]:
    """``(position, op, kernel)`` of every non-geometric op of ``aug``, in pipeline order, from a backend's kernel
    ``table`` (keyed by op class; a subclass takes its base's kernel). Geometric ops need none: they are folded
    into the one matrix every backend applies. An op with no kernel here is one ConfigError before anything runs,
    never skipped."""
    out = []
    for k, op in enumerate(aug.ops):
        if op.geometric:
            continue
        kernel = next((table[c] for c in type(op).__mro__ if c in table), None)
        if kernel is None:
            raise ConfigError(f"the {backend} augmentation backend does not apply {type(op).__name__} "
                              f"({op.kind.value} op): it has no kernel for it",
                              fix="drop it from the pipeline, or augment on a backend that has one")
        out.append((k, op, kernel))
    return out
