"""The host side shared by the device backends (torch, TensorFlow): drawn parameters packed into arrays.

:func:`pack` turns a batch's :class:`~shardkit.augment.ops.Params` into named numpy arrays — the fused matrices
(``"mats"``) and each non-geometric op's own arrays (:meth:`Op.pack <shardkit.augment.ops.Op.pack>`, keyed
``"<position>.<name>"``) — which the torch backend uploads in one copy and the TensorFlow backend returns from
its one ``tf.numpy_function``; :func:`layout` states their names, dtypes and shapes before any draw (TensorFlow
needs them to build its graph). Also OpenCV's HSV division tables, which both device backends' hue kernels use.
numpy only: no backend is imported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from ..errors import ConfigError

if TYPE_CHECKING:
    from .ops import Compose, Params

T = TypeVar("T")

#: OpenCV's 8-bit ``RGB2HSV`` division tables (hsv_shift 12): ``round(255 * 4096 / v)``, ``round(180 * 4096 /
#: (6 * d))``; the torch and TF backends compute OpenCV's hue and saturation with them, bit-exact.
HSV_SDIV = np.concatenate([[0], np.rint((255 << 12) / np.arange(1.0, 256))]).astype(np.int32)
HSV_HDIV = np.concatenate([[0], np.rint((180 << 12) / (6.0 * np.arange(1.0, 256)))]).astype(np.int32)


def layout(aug: Compose) -> list[tuple[str, str, tuple[int | str | None, ...]]]:
    """``(name, dtype, shape)`` of every array :func:`pack` gives for ``aug``, in its order; in a shape, ``"B"``
    is the batch size and None a size that varies per batch."""
    out: list[tuple[str, str, tuple[int | str | None, ...]]] = [("mats", "float64", ("B", 2, 3))]
    for k, op in enumerate(aug.ops):
        if not op.geometric:
            out += [(f"{k}.{name}", dtype, shape) for name, (dtype, shape) in op.layout().items()]
    return out


def pack(aug: Compose, params: Sequence[Params]) -> dict[str, np.ndarray]:
    """A batch's drawn ``params`` as the host arrays of :func:`layout`, in its order (checked against it: an op
    whose :meth:`pack` breaks its own layout is a ConfigError, not a wrong batch)."""
    out = {"mats": np.stack([np.asarray(p.matrix, np.float64) for p in params]).reshape(len(params), 2, 3)}
    for k, op in enumerate(aug.ops):
        if op.geometric:
            continue
        got = op.pack(aug.records(params, k) if op.draws else [])
        want = op.layout()
        for name, arr in got.items():
            if name not in want or arr.dtype != np.dtype(want[name][0]) or arr.ndim != len(want[name][1]):
                raise ConfigError(f"{type(op).__name__}.pack gave {name!r} {arr.dtype} {arr.shape}, which its "
                                  f"layout() does not state")
        if set(got) != set(want):
            raise ConfigError(f"{type(op).__name__}.pack gave {sorted(got)}, its layout() states {sorted(want)}")
        out.update({f"{k}.{name}": got[name] for name in want})
    return out


def of(arrays: Mapping[str, T], position: int) -> dict[str, T]:
    """The op at ``position``'s own arrays out of a packed batch (host or device), by their short names."""
    head = f"{position}."
    return {name[len(head):]: a for name, a in arrays.items() if name.startswith(head)}
