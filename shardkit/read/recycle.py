"""Batch arrays whose memory comes back when they are freed: a batch stays valid however long it is kept, yet a
loader that drops its batches reuses the same (already mapped) pages instead of faulting in fresh ones for every
batch (a fresh float32 batch of 32 CamVid images, 66 MB, cost ~3x normalising into a reused one).

Also the shared-memory hand-over of a batch from a worker process to its consumer through a ``/dev/shm`` file
(:func:`to_consumer`): what Keras's ``use_multiprocessing=True`` pool would otherwise pickle through a pipe.
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import operator
import os
import secrets
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..augment.ops import Normalize

#: where worker processes put the batches they hand over (Linux's shared-memory file system)
SHM = Path("/dev/shm")
_PREFIX = "shardkit-batch-"


class Lease:
    """One handed-out batch's hold on its memory: released when the last array viewing it is gone."""


class Held:
    """An array's memory (exposed as ``__array_interface__``) that keeps ``lease`` alive: ``np.asarray`` of it is
    an array whose base is this object, so the lease lives while that array or any view of it (or a torch tensor
    made from it) does."""

    def __init__(self, view: np.ndarray, lease: Any) -> None:
        self.view, self.lease = view, lease
        self.__array_interface__ = view.__array_interface__


def leased(view: np.ndarray, on_release: Callable[[], None]) -> np.ndarray:
    """``view`` as a new array that calls ``on_release`` once it and every view of it are gone."""
    return leased_together([view], on_release)[0]


class BufferPool:
    """Arrays of a shape and dtype, each returned to the pool when the caller's last view of it is freed; at most
    ``keep`` free ones per shape are kept (the rest are freed). Deque appends and pops are atomic: any thread may
    take and release without a lock."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self.free: dict[tuple[tuple[int, ...], str], deque[np.ndarray]] = {}

    def take(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` (contents undefined) that comes back here when freed."""
        key = (tuple(int(s) for s in shape), np.dtype(dtype).str)
        free = self.free.setdefault(key, deque())
        try:
            buf = free.pop()
        except IndexError:
            buf = np.empty(key[0], key[1])

        def release() -> None:
            if len(free) < self.keep:
                free.append(buf)

        return leased(buf, release)

    def __getstate__(self) -> dict[str, Any]:  # a copy in another process starts empty
        return {"keep": self.keep, "free": {}}


#: this process's batch arrays for the Keras and tf.data adapters, recycled when freed: e.g. float32 images
#: normalised into pages mapped once instead of a fresh 66 MB per CamVid batch of 32 (3x the cost of normalising)
POOL = BufferPool()


def normalized(op: Normalize, images: np.ndarray) -> np.ndarray:
    """``images`` normalised by ``op`` (one compiled pass for uint8) into a float32 array of :data:`POOL`."""
    return op.numpy(images, POOL.take(images.shape, np.float32))


# ------------------------------------------------------------------ worker process → consumer, through /dev/shm


def shm_available() -> bool:
    """Whether batches can be handed over through ``/dev/shm`` files (Linux)."""
    return sys.platform.startswith("linux") and SHM.is_dir() and os.access(SHM, os.W_OK)


def _map(fd: int, nbytes: int) -> mmap.mmap:
    return mmap.mmap(fd, nbytes, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))


def _new_file(path: Path, nbytes: int) -> mmap.mmap:
    """A new ``/dev/shm`` file of ``nbytes``, mapped (pages populated once, here)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        return _map(fd, nbytes)
    except BaseException:
        path.unlink()
        raise
    finally:
        os.close(fd)


Layout = tuple[tuple[tuple[int, ...], str], ...]


def _views(mem: mmap.mmap, layout: Layout) -> list[np.ndarray]:
    """Arrays of ``layout`` ((shape, dtype) each) laid out one after the other in ``mem``, each 64-byte aligned."""
    out, offset = [], 0
    for shape, dtype in layout:
        n = int(np.prod(shape))
        out.append(np.frombuffer(mem, np.dtype(dtype), n, offset).reshape(shape))
        offset += -(-n * np.dtype(dtype).itemsize // 64) * 64
    return out


def _nbytes(layout: Layout) -> int:
    return max(64, sum(-(-int(np.prod(shape)) * np.dtype(dt).itemsize // 64) * 64 for shape, dt in layout))


class ShmBatch:
    """A batch's arrays written by a worker process into a ``/dev/shm`` file: one of the worker's reused slots
    (:class:`WorkerSlots`), or a file of its own when every slot is held. Pickled, it is only the file's name and
    the layout; unpickled in the consumer (:func:`attach`) it is the list of arrays over that file's memory (no
    copy), with ``finish`` applied to the first (e.g. normalised into a pooled buffer). A slot is free for the
    worker again once the consumer's last array over it is gone; a file of its own is removed as it is attached."""

    def __init__(self, path: Path, mem: mmap.mmap, layout: Layout, slot: tuple[str, int] | None) -> None:
        self.path, self.layout, self.slot = path, layout, slot
        self.arrays = _views(mem, layout)
        self.finish: Callable[[np.ndarray], np.ndarray] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return attach, (str(self.path), self.layout, self.slot, self.finish)


class Part:
    """Item ``index`` of a :class:`ShmBatch` (a pickle of several parts of one batch pickles the batch once)."""

    def __init__(self, batch: ShmBatch, index: int) -> None:
        self.batch, self.index = batch, index

    def __reduce__(self) -> tuple[Any, ...]:
        return operator.getitem, (self.batch, self.index)


class WorkerSlots:
    """A worker process's ``/dev/shm`` slots, created as needed (at most ``cap``) and reused: their pages are
    allocated and mapped once, not for every batch (a fresh 27 MB file cost ~10x reading the batch into it). One
    state byte per slot in a file beside them: the worker sets it as it fills the slot, the consumer clears it when
    the batch's arrays are freed; each side writes only its own transition, so no lock is needed."""

    def __init__(self, owner: int, cap: int) -> None:
        self.owner, self.cap = owner, cap
        self._pid: int | None = None
        self._slots: list[tuple[Path, mmap.mmap, int]] = []
        self._state: mmap.mmap | None = None

    def _name(self, what: str) -> Path:
        return SHM / f"{_PREFIX}{self.owner}-{os.getpid()}-{what}"

    def batch(self, layout: Layout) -> ShmBatch:
        """A free slot with room for ``layout`` (marked held), or a file of its own when none is free."""
        state = self._state
        if state is None or self._pid != os.getpid():  # a new worker process (forked or unpickled): its own slots
            self._pid, self._slots = os.getpid(), []
            state = self._state = _new_file(self._name("state"), max(1, self.cap))
        need = _nbytes(layout)
        for k, (path, mem, size) in enumerate(self._slots):
            if state[k] == 0 and size >= need:
                state[k] = 1
                return ShmBatch(path, mem, layout, (str(self._name("state")), k))
        if len(self._slots) < self.cap:
            k = len(self._slots)
            path = self._name(f"slot{k}")
            self._slots.append((path, _new_file(path, need), need))
            state[k] = 1
            return ShmBatch(path, self._slots[k][1], layout, (str(self._name("state")), k))
        path = self._name(secrets.token_hex(8))
        return ShmBatch(path, _new_file(path, need), layout, None)

    def __getstate__(self) -> dict[str, Any]:  # a copy in another process makes slots of its own
        return {"owner": self.owner, "cap": self.cap, "_pid": None, "_slots": [], "_state": None}


#: the consumer's mappings of its workers' slot and state files, by path (a slot's pages are mapped once)
_MAPPED: dict[str, mmap.mmap] = {}


def _mapped(path: str) -> mmap.mmap:
    mem = _MAPPED.get(path)
    if mem is None:
        fd = os.open(path, os.O_RDWR)
        try:
            mem = _MAPPED[path] = _map(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
    return mem


def attach(path: str, layout: Layout, slot: tuple[str, int] | None,
           finish: Callable[[np.ndarray], np.ndarray] | None) -> list[np.ndarray | None]:
    """The consumer's side of :class:`ShmBatch`: arrays over the file's memory that free the slot when the last of
    them is gone (a file of its own is removed at once). Runs inside the unpickling of a worker's result (a pool's
    result thread): it never raises an ``OSError`` there, which would stop that thread; a file already removed
    (a stopped pool's leftover batch, :func:`sweep`) gives Nones."""
    try:
        if slot is None:
            fd = os.open(path, os.O_RDWR)
            try:
                Path(path).unlink()
                mem = _map(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
        else:
            mem, state = _mapped(path), _mapped(slot[0])
    except OSError:
        return [None] * len(layout)
    arrays = _views(mem, layout)
    if slot is not None:
        k = slot[1]

        def release() -> None:
            state[k] = 0

        arrays = leased_together(arrays, release)
    if finish is not None:
        arrays[0] = finish(arrays[0])
    return list(arrays)


def leased_together(views: list[np.ndarray], on_release: Callable[[], None]) -> list[np.ndarray]:
    """``views`` as new arrays that call ``on_release`` once all of them and every view of them are gone."""
    lease = Lease()
    weakref.finalize(lease, on_release).atexit = False
    return [np.asarray(Held(v, lease)) for v in views]


def sweep(owner: int, keep_alive: bool = True) -> None:
    """Remove the hand-over files of ``owner``'s worker processes that are gone (``keep_alive=False``: of every
    worker), and this process's mappings of them: batches a stopped pool wrote and nobody took, and its slots."""
    for path in SHM.glob(f"{_PREFIX}{owner}-*"):
        worker = path.name[len(_PREFIX):].split("-")[1]
        if keep_alive and worker.isdigit() and Path(f"/proc/{worker}").exists():
            continue
        _MAPPED.pop(str(path), None)  # arrays still viewing it keep their mapping
        with contextlib.suppress(OSError):
            path.unlink()


_SWEEP_AT_EXIT = threading.Lock()
_registered: set[int] = set()


def sweep_at_exit() -> None:
    """Remove this process's workers' hand-over files when it exits (registered once per process)."""
    with _SWEEP_AT_EXIT:
        pid = os.getpid()
        if pid not in _registered:
            _registered.add(pid)
            atexit.register(sweep, pid, False)
