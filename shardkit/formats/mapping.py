"""Read-ahead hints for memory-mapped shard arrays: read exactly what a batch needs when it is not cached.

A page fault in a file mapping makes the kernel read a whole read-ahead window around the page
(``/sys/block/<dev>/queue/read_ahead_kb``: 128 KB by default, megabytes on some virtual disks).
When the data does not fit in memory that window is mostly evicted before it is used: out of core,
a memory-mapped reader read 17x the bytes it needed (docs/scale.md). For a batch that is read from
storage, the reader instead turns read-around off for the mapping (``MADV_RANDOM``) and asks for
exactly each sample's byte range (``MADV_WILLNEED``): the kernel queues those reads at once, in large
requests, and the copy then waits only for them. For data already in the page cache the hints are
skipped (they cost a page-cache walk per sample); ``MADV_RANDOM`` stays (it changes nothing for cached
pages). Hints never change what is read, only when; where ``madvise`` is missing or refused they are no-ops.
"""

from __future__ import annotations

import contextlib
import mmap

import numpy as np

_MADV_RANDOM: int | None = getattr(mmap, "MADV_RANDOM", None)
_MADV_WILLNEED: int | None = getattr(mmap, "MADV_WILLNEED", None)
_PAGE = mmap.PAGESIZE


class MappedArray:
    """The ``mmap`` under an array from ``np.load(mmap_mode="r")``, and the array's offset in it."""

    __slots__ = ("mm", "random", "start")

    def __init__(self, mm: mmap.mmap, start: int) -> None:
        self.mm, self.start = mm, start
        self.random = False  # MADV_RANDOM given

    @classmethod
    def of(cls, arr: np.ndarray) -> MappedArray | None:
        """The mapping under ``arr`` (numpy maps from the file offset rounded down to the allocation
        granularity), or None when ``arr`` is not exactly such a mapping."""
        mm, offset = arr.base, getattr(arr, "offset", None)
        if not isinstance(mm, mmap.mmap) or not isinstance(offset, int):
            return None
        start = offset % mmap.ALLOCATIONGRANULARITY
        return cls(mm, start) if len(mm) == start + arr.nbytes else None

    def set_random(self) -> None:
        """Read-around off: reads of this mapping are hinted range by range from now on."""
        if not self.random and _MADV_RANDOM is not None:
            self.random = True
            self._advise(_MADV_RANDOM, 0, len(self.mm))

    def will_need(self, begin: np.ndarray, end: np.ndarray) -> None:
        """Start reading the array's byte ranges ``[begin[k], end[k])`` (sorted; touching ranges merged)."""
        if _MADV_WILLNEED is None or not len(begin):
            return
        keep = np.ones(len(begin), bool)
        keep[1:] = begin[1:] != end[:-1]  # a range that starts where the previous one ends continues it
        last = np.append(keep[1:], True)
        for a, b in zip((begin[keep] + self.start).tolist(), (end[last] + self.start).tolist(), strict=True):
            self._will_need(a, b)

    def will_need_one(self, begin: int, end: int) -> None:
        """:meth:`will_need` of one range, without array set-up."""
        if _MADV_WILLNEED is not None:
            self._will_need(begin + self.start, end + self.start)

    def _will_need(self, a: int, b: int) -> None:
        if b > a:
            assert _MADV_WILLNEED is not None
            self._advise(_MADV_WILLNEED, a - a % _PAGE, b - a + a % _PAGE)

    def _advise(self, advice: int, start: int, length: int) -> None:
        with contextlib.suppress(OSError, ValueError):  # a hint: a kernel that refuses it reads as before
            self.mm.madvise(advice, start, length)
