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

**The ignore class is never a channel** (one rule for every reader output and every augmentation
backend): ignore pixels are all-zero vectors. When the ignore id lies outside ``0..C-1`` (255) the
output has ``C`` channels, channel ``k`` = class ``k``. When it lies inside (CamVid's Unlabelled, 11 of
12 classes) that class is dropped: ``C - 1`` channels, the classes below the ignore id keep their
number and those above it move down by one (:func:`hot_channels`, :func:`channel_ids`,
:func:`channel_classes`). The torch and TensorFlow kernels (:mod:`shardkit.augment`) apply the same
numbering.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..support import jit

#: Pixels per step of the channels-last kernel (~1.5 MB of float32 output: stays in L2).
CHUNK = 32768


def ignore_inside(num_classes: int, ignore_index: int | None) -> bool:
    """Whether the ignore id is one of the classes ``0..C-1`` (then it loses its one-hot channel)."""
    return ignore_index is not None and 0 <= int(ignore_index) < int(num_classes)


def hot_channels(num_classes: int, ignore_index: int | None) -> int:
    """Channels of a one-hot output: the classes, less the ignore class when it is one of them."""
    return int(num_classes) - 1 if ignore_inside(num_classes, ignore_index) else int(num_classes)


def channel_classes(num_classes: int, ignore_index: int | None) -> np.ndarray:
    """The class id of each one-hot channel, in channel order (``0..C-1`` without the ignore id)."""
    classes = np.arange(int(num_classes), dtype=np.int64)
    return classes[classes != ignore_index] if ignore_inside(num_classes, ignore_index) else classes


def channel_ids(ids: np.ndarray, num_classes: int, ignore_index: int | None) -> np.ndarray:
    """Class ids → channel numbers (``ids`` itself when the ignore id lies outside the classes).

    Ids below the ignore id keep their number, ids above it move down by one, the ignore id becomes
    ``C - 1`` (no channel: an all-zero vector), as do ids ``>= C``."""
    if not ignore_inside(num_classes, ignore_index):
        return ids
    ig = ids.dtype.type(ignore_index)
    out = np.subtract(ids, ids > ig, dtype=ids.dtype)
    np.putmask(out, ids == ig, ids.dtype.type(num_classes - 1))
    return out


def channel_lut(num_classes: int, ignore_index: int | None) -> np.ndarray:
    """:func:`channel_ids` as an int64 table of ``C + 1`` entries for the torch and TensorFlow kernels: the
    channel of id ``v`` is ``lut[min(v, C)]`` (entry ``C`` stands for every id ``>= C``: no channel)."""
    return channel_ids(np.arange(int(num_classes) + 1, dtype=np.int64), num_classes, ignore_index)


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
                allow_numba: bool = True, ignore_index: int | None = None) -> None:
    """Write the one-hot encoding of ``ids`` (…, H, W) into ``out`` (float32 or uint8, C-contiguous).

    ``ignore_index`` inside ``0..num_classes-1`` drops that class's channel (:func:`hot_channels`): ``out``
    then has ``num_classes - 1`` channels. ``allow_numba=False`` keeps to numpy: for convert's pool workers,
    where loading LLVM would add ~130 MB to every worker (and loky restarts workers whose memory grows by 300 MB).
    """
    if ignore_inside(num_classes, ignore_index):
        ids = channel_ids(ids, num_classes, ignore_index)
        num_classes -= 1
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
