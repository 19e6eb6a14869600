"""Batch arrays whose memory comes back when they are freed: a batch stays valid however long it is kept, yet a
loader that drops its batches reuses the same (already mapped) pages instead of faulting in fresh ones for every
batch (a fresh float32 batch of 32 CamVid images, 66 MB, cost ~3x normalising into a reused one).

Also the shared-memory hand-over of a batch from a worker process to its consumer through a ``/dev/shm`` file
(:func:`to_consumer`): what Keras's ``use_multiprocessing=True`` pool would otherwise pickle through a pipe.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
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

from ..files.lock import pid_alive

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
    """A batch's arrays written by a worker process into a ``/dev/shm`` file: one of the consumer's reused slots
    (:class:`SharedSlots`), or a file of its own when every slot is held. Pickled, it is only the file's name, the
    layout and the slot's claim; unpickled in the consumer (:func:`attach`) it is the list of arrays over that file's
    memory (no copy). A slot is free for the workers again once the consumer's last array over it is gone; a file of
    its own is removed as it is attached."""

    def __init__(self, path: Path, mem: mmap.mmap, layout: Layout, claim: tuple[str, int, int] | None) -> None:
        self.path, self.layout, self.claim = path, layout, claim
        self.arrays = _views(mem, layout)

    def __reduce__(self) -> tuple[Any, ...]:
        return attach, (str(self.path), self.layout, self.claim)


class Part:
    """Item ``index`` of a :class:`ShmBatch` (a pickle of several parts of one batch pickles the batch once)."""

    def __init__(self, batch: ShmBatch, index: int) -> None:
        self.batch, self.index = batch, index

    def __reduce__(self) -> tuple[Any, ...]:
        return operator.getitem, (self.batch, self.index)


#: a slot's record in the state file: held (0/1), claim number, the claiming process, the slot file's size
_RECORD = np.dtype([("held", "u1"), ("pad", "u1", 3), ("claim", "<u4"), ("pid", "<i4"), ("pad2", "u1", 4),
                    ("size", "<u8")])


class SharedSlots:
    """The ``/dev/shm`` slots through which worker processes hand batches to the consumer ``owner``: created as
    needed (at most ``cap``) and reused by every worker, also by the next epoch's pool, so their pages are allocated
    and mapped once rather than for every batch (a fresh 27 MB file cost ~10x reading the batch into it).

    A state file holds one record per slot (:data:`_RECORD`). A worker claims a free slot under an ``flock`` of that
    file (held, a new claim number, its pid); the consumer frees it, without the lock, by clearing ``held`` when the
    last array over the slot is gone and the claim is still the one it attached (only the consumer clears, only a
    worker under the lock sets). Slots claimed by workers that are gone and never reached the consumer (a stopped
    pool's batches) are freed by :meth:`reclaim`."""

    def __init__(self, owner: int, cap: int) -> None:
        self.owner, self.cap = owner, cap
        self.group = f"g{secrets.token_hex(4)}"  # this set's files, apart from another dataset's of the same owner
        if os.getpid() == owner:  # its files go with it (the consumer's set: not a worker's copy)
            weakref.finalize(self, _remove, owner, f"{owner}-{self.group}-")
        self._pid: int | None = None
        self._fd = -1
        self._records: np.ndarray | None = None
        self._maps: dict[str, mmap.mmap] = {}

    def _open(self) -> np.ndarray:
        """This process's view of the state file (created by the first worker that needs it)."""
        if self._records is None or self._pid != os.getpid():
            self._pid, self._maps = os.getpid(), {}
            self._fd = os.open(self.state_path, os.O_RDWR | os.O_CREAT, 0o600)
            size = max(1, self.cap) * _RECORD.itemsize
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                if os.fstat(self._fd).st_size < size:
                    os.ftruncate(self._fd, size)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._records = _records(_map(self._fd, size), self.cap)
        return self._records

    def batch(self, layout: Layout) -> ShmBatch:
        """A free slot with room for ``layout`` (claimed), or a file of its own when none is free."""
        records, need = self._open(), _nbytes(layout)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            free = np.flatnonzero((records["held"] == 0) & ((records["size"] == 0) | (records["size"] >= need)))
            k = int(free[0]) if len(free) else -1
            if k >= 0:
                rec = records[k]
                rec["held"], rec["claim"], rec["pid"] = 1, (int(rec["claim"]) + 1) % 2**32, os.getpid()
                if rec["size"] == 0:
                    rec["size"] = need
                claim, size = int(rec["claim"]), int(rec["size"])
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        if k < 0:
            path = SHM / f"{_PREFIX}{self.owner}-{os.getpid()}-{secrets.token_hex(8)}"
            return ShmBatch(path, _new_file(path, need), layout, None)
        path = SHM / f"{_PREFIX}{self.owner}-{self.group}-slot{k}-{size}"
        mem = self._maps.get(str(path))
        if mem is None:
            try:
                mem = _mapped(str(path), self._maps)
            except FileNotFoundError:  # the slot's first use: this worker makes its file
                mem = self._maps[str(path)] = _new_file(path, size)
        return ShmBatch(path, mem, layout, (str(self.state_path), k, claim))

    @property
    def state_path(self) -> Path:
        return SHM / f"{_PREFIX}{self.owner}-{self.group}-state"

    def reclaim(self) -> None:
        """Free the slots that a worker process claimed, that never reached the consumer (not held here) and
        whose worker is gone: a stopped pool's batches. Also removes that pool's files of their own."""
        try:
            fd = os.open(self.state_path, os.O_RDWR)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size >= _RECORD.itemsize:
                with _map(fd, size) as mem:
                    records = _records(mem, size // _RECORD.itemsize)
                    held = {k for p, k, _ in list(_HELD) if p == str(self.state_path)}
                    for k in np.flatnonzero(records["held"] == 1):
                        if int(k) not in held and not pid_alive(int(records["pid"][k])):
                            records["held"][k] = 0
                    del records
        finally:
            os.close(fd)  # releases the lock
        for leftover in SHM.glob(f"{_PREFIX}{self.owner}-*-*"):
            worker = leftover.name[len(_PREFIX):].split("-")[1]
            if worker.isdigit() and not pid_alive(int(worker)):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def __getstate__(self) -> dict[str, Any]:  # a copy in another process opens the files itself
        return {"owner": self.owner, "cap": self.cap, "group": self.group, "_pid": None, "_fd": -1,
                "_records": None, "_maps": {}}


def _records(mem: mmap.mmap, cap: int) -> np.ndarray:
    return np.frombuffer(mem, _RECORD, cap)


#: the consumer's mappings of its workers' slot and state files, by path (a slot's pages are mapped once)
_MAPPED: dict[str, mmap.mmap] = {}
#: the slot claims (state file, slot, claim) the consumer's arrays hold
_HELD: set[tuple[str, int, int]] = set()


def _mapped(path: str, cache: dict[str, mmap.mmap] = _MAPPED) -> mmap.mmap:
    mem = cache.get(path)
    if mem is None:
        fd = os.open(path, os.O_RDWR)
        try:
            mem = cache[path] = _map(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
    return mem


def attach(path: str, layout: Layout, claim: tuple[str, int, int] | None) -> list[np.ndarray | None]:
    """The consumer's side of :class:`ShmBatch`: arrays over the file's memory that free the slot when the last of
    them is gone (a file of its own is removed at once). Runs inside the unpickling of a worker's result (a pool's
    result thread): it never raises an ``OSError`` there, which would stop that thread. A file already removed, or a
    slot claimed again since (a stopped pool's leftover batch, :meth:`SharedSlots.reclaim`), gives Nones."""
    try:
        if claim is None:
            fd = os.open(path, os.O_RDWR)
            try:
                Path(path).unlink()
                mem = _map(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
        else:
            mem, state = _mapped(path), _mapped(claim[0])
    except OSError:
        return [None] * len(layout)
    arrays = _views(mem, layout)
    if claim is None:
        return list(arrays)
    _, k, number = claim
    rec = np.frombuffer(state, _RECORD)[k:k + 1]
    if rec["held"][0] != 1 or int(rec["claim"][0]) != number:
        return [None] * len(layout)
    _HELD.add(claim)

    def release() -> None:
        _HELD.discard(claim)
        if int(rec["claim"][0]) == number:
            rec["held"] = 0

    return list(leased_together(arrays, release))


def leased_together(views: list[np.ndarray], on_release: Callable[[], None]) -> list[np.ndarray]:
    """``views`` as new arrays that call ``on_release`` once all of them and every view of them are gone."""
    lease = Lease()
    weakref.finalize(lease, on_release).atexit = False
    return [np.asarray(Held(v, lease)) for v in views]


def _remove(owner: int, prefix: str) -> None:
    """A set of slots is gone in its consumer: remove its files (arrays still viewing one keep their mapping)."""
    if os.getpid() == owner:
        for path in SHM.glob(f"{_PREFIX}{prefix}*"):
            _MAPPED.pop(str(path), None)
            with contextlib.suppress(OSError):
                path.unlink()


def sweep(owner: int) -> None:
    """Remove every hand-over file of ``owner`` (slots, state, files of their own) and this process's mappings of
    them (arrays still viewing one keep their mapping): the consumer is exiting."""
    for path in SHM.glob(f"{_PREFIX}{owner}-*"):
        _MAPPED.pop(str(path), None)
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
            atexit.register(sweep, pid)
