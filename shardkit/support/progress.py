"""Convert's progress bar, moved once per sample even when the samples are decoded in other processes.

Workers of the local pool count their samples in a small shared file (one int64 slot per shard
task, memory-mapped by every process); a thread in the parent polls it and moves the bar. No extra
process, no pipe traffic per sample, nothing the worker waits for. A task run in the parent itself
(one worker) counts in the same slots. Dask workers may sit on other machines: their bar moves per shard.
"""

from __future__ import annotations

import mmap
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Seconds between two looks at the workers' counters.
POLL_SECONDS = 0.1


def progress_bar(total: int, quiet: bool) -> Any:
    """A tqdm bar in samples; silent with ``quiet`` or when stderr is not a terminal."""
    from tqdm import tqdm

    disable = quiet or not sys.stderr.isatty()
    return tqdm(total=total, unit="sample", desc="convert", disable=disable, dynamic_ncols=True, leave=False)


@dataclass(frozen=True)
class CounterRef:
    """Where a worker finds the counters: a path, and the file's identity to check once it is open
    (a ``/proc/PID/fd/N`` path could name another file of the parent once the counters are closed)."""

    path: str
    device: int
    inode: int


class _Slots:
    """``n`` int64 counters in a memory-mapped file (``/dev/shm`` where there is one); ``create`` sizes it."""

    def __init__(self, path: str, n: int, create: bool, identity: tuple[int, int] | None = None) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            st = os.fstat(fd)
            if identity is not None and (st.st_dev, st.st_ino) != identity:
                raise FileNotFoundError(path)  # not our counter file (any more)
            self.identity = (st.st_dev, st.st_ino)
            if create:
                os.ftruncate(fd, 8 * max(1, n))
            self._map = mmap.mmap(fd, 8 * max(1, n))
        finally:
            os.close(fd)
        self.counts = np.frombuffer(self._map, dtype=np.int64, count=n)

    def close(self) -> None:
        del self.counts
        self._map.close()


def worker_tick(ref: CounterRef | None, slot: int) -> Callable[[], None] | None:
    """In a worker: a function that adds one to counter ``slot`` of the counters at ``ref`` (None: no counter)."""
    if ref is None:
        return None
    try:
        slots = _Slots(ref.path, slot + 1, create=False, identity=(ref.device, ref.inode))
    except OSError:  # the parent already finished with it: count nothing
        return None
    return _ticker(slots.counts, slot)


def _ticker(counts: np.ndarray, slot: int) -> Callable[[], None]:
    """Add one to ``counts[slot]``: one writer per slot, so a torn read in the parent only shows an older count."""

    def tick() -> None:
        counts[slot] += 1

    return tick


class SampleCounter:
    """The parent's side: a counter file for ``n`` tasks and a thread that moves ``bar`` from it.

    ``settle(slot, n)`` records a finished task's final count (samples written or skipped), so the
    bar ends exactly at the total whatever the polling saw.
    """

    def __init__(self, n: int, bar: Any) -> None:
        shm = Path("/dev/shm")
        folder = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()
        fd, path = tempfile.mkstemp(prefix="shardkit-progress-", dir=folder)  # created 0600, exclusively
        self._fd = fd
        self._slots = _Slots(path, n, create=True)
        # Linux: unlink it now and let workers open it through this process's fd, so not even a SIGKILL
        # leaves it behind.
        proc = f"/proc/{os.getpid()}/fd/{fd}"
        if Path(proc).exists():
            Path(path).unlink()
            path = proc
        self.path = path
        #: what workers are given to find the counters
        self.ref = CounterRef(path, *self._slots.identity)
        self._shown = np.zeros(n, dtype=np.int64)
        self._done = np.zeros(n, dtype=bool)
        self._bar = bar
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="shardkit-progress", daemon=True)
        self._thread.start()

    def _move(self) -> None:
        with self._lock:
            seen = np.where(self._done, self._shown, np.maximum(self._slots.counts, self._shown))
            delta = int((seen - self._shown).sum())
            self._shown = seen
        if delta:
            self._bar.update(delta)

    def _poll(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self._move()

    def tick(self, slot: int) -> Callable[[], None]:
        """For a task run in this process: add one to ``slot``."""
        return _ticker(self._slots.counts, slot)

    def settle(self, slot: int, final: int) -> None:
        with self._lock:
            delta = final - int(self._shown[slot])
            self._shown[slot] = final
            self._done[slot] = True
        if delta:
            self._bar.update(delta)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._slots.close()
        if not self.path.startswith("/proc/"):
            Path(self.path).unlink(missing_ok=True)
        os.close(self._fd)

    def __enter__(self) -> SampleCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
