"""Class ids → one-hot, vectorised (no per-class loop), written into the caller's buffer.

Channels first, ``(…, C, H, W)``: one broadcast comparison whose inner loop runs along H×W.
Channels last, ``(…, H, W, C)``: the same comparison would run its inner loop over only C
elements per pixel (~4x slower), so the output is instead zeroed and the ones are scattered
in (``np.put`` at ``pixel * C + id``), chunk by chunk so the zeroed rows are still in cache
when the ones land. With the optional ``numba`` (shardkit's ``fast`` extra) a compiled
loop writes each row once instead, ~2.5x faster again and close to the speed of a memset of
the output (and a compiled plane loop does channels first, ~1.3x numpy's comparison);
``SHARDKIT_NO_NUMBA=1`` turns them off. Ids outside ``0..C-1`` (an ignore id such
as 255) give all-zero vectors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import jit

#: Pixels per step of the channels-last kernel (~1.5 MB of float32 output: stays in L2).
CHUNK = 32768


def _rows_loop(ids: Any, out: Any) -> None:  # pragma: no cover - runs compiled
    """out[i] = one-hot(ids[i]) for a flat ids (n,) and out (n, C); written row by row, once."""
    n, c = out.shape
    for i in range(n):
        v = ids[i]
        for j in range(c):
            out[i, j] = 0
        if v < c:
            out[i, v] = 1


def _planes_loop(ids: Any, out: Any) -> None:  # pragma: no cover - runs compiled
    """out[k, j] = (ids[k] == j) for flat ids (B, P) and out (B, C, P): one plane at a time."""
    b, c, p = out.shape
    for k in range(b):
        for j in range(c):
            for i in range(p):
                out[k, j, i] = 1 if ids[k, i] == j else 0


def numba_kernels() -> tuple[Callable[..., None], Callable[..., None]] | None:
    """The compiled (channels-last, channels-first) kernels, or None without numba (or with
    ``SHARDKIT_NO_NUMBA=1``). Compiled on first use and cached on disk by numba."""
    return KERNELS.get()


def _warm(kernels: tuple[Any, ...]) -> None:
    """Compile (or load from numba's cache) the common case now, so a compiler or cache failure shows here."""
    ids = np.zeros((1, 1), np.uint8)
    kernels[0](ids[0], np.empty((1, 2), np.float32))
    kernels[1](ids, np.empty((1, 2, 1), np.float32))


#: The compiled one-hot loops (:func:`numba_kernels`).
KERNELS = jit.LazyKernels((_rows_loop, _planes_loop), _warm, "one-hot")


def kernel_name() -> str:
    """Which one-hot kernels run here: ``"numba"`` or ``"numpy"`` (benchmarks print it)."""
    return KERNELS.name()


def onehot_into(ids: np.ndarray, num_classes: int, out: np.ndarray, *, channels_first: bool = False,
                allow_numba: bool = True) -> None:
    """Write the one-hot encoding of ``ids`` (…, H, W) into ``out`` (float32 or uint8, C-contiguous).

    ``allow_numba=False`` keeps to numpy: for convert's pool workers, where loading LLVM would add
    ~130 MB to every worker (and loky restarts workers whose memory grows by 300 MB).
    """
    # class values in a dtype wide enough for both the ids and every class (uint8 ids, 300 classes)
    classes = np.arange(num_classes, dtype=np.promote_types(ids.dtype, np.min_scalar_type(max(num_classes - 1, 0))))
    want = (*ids.shape[:-2], num_classes, *ids.shape[-2:]) if channels_first else (*ids.shape, num_classes)
    fits = allow_numba and out.flags.c_contiguous and out.shape == want and ids.size
    compiled = numba_kernels() if fits else None
    if channels_first:
        if compiled is not None:
            hw = ids.shape[-2] * ids.shape[-1]
            compiled[1](np.ascontiguousarray(ids).reshape(-1, hw), out.reshape(-1, num_classes, hw))
        else:
            np.equal(np.expand_dims(ids, -3), classes[:, None, None], out=out)
        return
    if not out.flags.c_contiguous or out.shape != want:
        np.equal(ids[..., None], classes, out=out)
        return
    flat_ids = np.ascontiguousarray(ids).reshape(-1)
    n = flat_ids.size
    if n == 0:
        return
    if compiled is not None:
        compiled[0](flat_ids, out.reshape(n, num_classes))
        return
    flat_out = out.reshape(-1)
    in_range = int(flat_ids.max()) < num_classes
    if not in_range:  # out-of-range ids write a 0 into their own row's first slot (already 0)
        valid = flat_ids < num_classes
        flat_ids = np.where(valid, flat_ids, 0)
    step = min(CHUNK, n)
    base = np.arange(0, step * num_classes, num_classes, dtype=np.intp)
    where = np.empty(step, np.intp)
    for a in range(0, n, step):
        b = min(a + step, n)
        seg = flat_out[a * num_classes : b * num_classes]
        seg.fill(0)
        np.add(base[: b - a], flat_ids[a:b], out=where[: b - a])
        np.put(seg, where[: b - a], 1 if in_range else valid[a:b])
