"""Many strings as one column: their UTF-8 bytes in one buffer and an offsets array, not a Python object each.

A conversion's parent keeps every sample's key and source paths from discovery to the end. As ``str`` and
``pathlib.Path`` objects that was ~0.5 KB per pair; a :class:`StringColumn` holds the bytes plus 8 per string.
Items are encoded with ``surrogatepass`` so that any ``str`` (also a file name with undecodable bytes, which
Python gives surrogates) round-trips, and byte order equals ``str`` order: :meth:`StringColumn.argsort` sorts
like ``sorted`` does, without a Python object per item. A slice is a view; pickling a view sends only its
own bytes (a shard task carries its slice of the split's columns to a worker).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np

ENCODING, ERRORS = "utf-8", "surrogatepass"
_WORD = 8  # bytes compared per round of :meth:`StringColumn.argsort`


class StringColumn(Sequence[str]):
    """An immutable sequence of ``str``: item ``i`` is ``data[offsets[i]:offsets[i + 1]]`` decoded."""

    __slots__ = ("_data", "_off")

    def __init__(self, data: bytes | bytearray | memoryview, offsets: Sequence[int] | np.ndarray | memoryview) -> None:
        self._data = memoryview(data).cast("B")
        off = offsets if isinstance(offsets, memoryview) else np.ascontiguousarray(offsets, np.int64).data
        self._off = off.cast("B").cast("q")
        if len(self._off) < 1:
            raise ValueError("a column needs at least one offset")

    @classmethod
    def from_strings(cls, items: Iterable[str]) -> StringColumn:
        builder = ColumnBuilder()
        for s in items:
            builder.append(s)
        return builder.build()

    def __len__(self) -> int:
        return len(self._off) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> StringColumn: ...
    def __getitem__(self, i: int | slice) -> str | StringColumn:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                raise ValueError("a column slice has step 1")
            return StringColumn(self._data, self._off[start : max(start, stop) + 1])
        return str(self.raw(i), ENCODING, ERRORS)

    def raw(self, i: int) -> memoryview:
        """Item ``i``'s UTF-8 bytes (a view)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError("column index out of range")
        i %= n
        return self._data[self._off[i] : self._off[i + 1]]

    def __iter__(self) -> Iterator[str]:
        data, off = self._data, self._off
        for i in range(len(self)):
            yield str(data[off[i] : off[i + 1]], ENCODING, ERRORS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StringColumn):
            return NotImplemented
        a, b = self._arrays(), other._arrays()
        return (len(self) == len(other) and np.array_equal(a[1] - a[1][0], b[1] - b[1][0])
                and a[0][a[1][0] : a[1][-1]].tobytes() == b[0][b[1][0] : b[1][-1]].tobytes())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StringColumn({len(self)} items, {self.nbytes} bytes)"

    @property
    def nbytes(self) -> int:
        """Bytes of this column's items (not counting the offsets)."""
        return int(self._off[-1] - self._off[0]) if len(self) else 0

    def __reduce__(self) -> tuple[type[StringColumn], tuple[bytes, np.ndarray]]:
        data, off = self._arrays()
        return StringColumn, (data[off[0] : off[-1]].tobytes(), off - off[0])

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.frombuffer(self._data, np.uint8), np.frombuffer(self._off, np.int64)

    def argsort(self) -> np.ndarray:
        """The permutation ``sorted(range(len(c)), key=c.__getitem__)`` gives (stable), as an int64 array.

        Radix sort by 8-byte words, most significant first, refining only the runs of items still equal so far:
        a handful of NumPy passes and at most ~50 bytes per item at a time (indices as int32), where ``sorted``
        would make a ``str`` of each.
        """
        n = len(self)
        if self.is_sorted():  # the common case (keys, and most label columns): no NumPy passes at all
            return np.arange(n, dtype=np.int64)
        index = np.int32 if n < 2**31 else np.int64
        data, off = self._arrays()
        starts, lengths = off[:-1], np.diff(off).astype(index)
        order = np.arange(n, dtype=index)
        # order positions [a, b) with equal prefixes so far form a run; ``run`` numbers them along ``order``
        run = np.zeros(n, index)
        depth = 0
        while True:
            counts = np.bincount(run)
            need = np.zeros(len(counts), bool)  # runs of several items, one of them longer than ``depth``
            need[run[(counts[run] > 1) & (lengths[order] > depth)]] = True
            del counts
            todo = np.flatnonzero(need[run]).astype(index)  # whole runs, each a contiguous block of positions
            del need
            if not len(todo):
                break
            items = order[todo]
            word = _words(data, starts[items], depth, lengths[items] - depth)
            perm = np.lexsort((word, run[todo])).astype(index)  # within each run, by the next word (0 past the end)
            order[todo] = items[perm]
            del items
            word, sub = word[perm], run[todo]
            del perm
            cut = np.zeros(n, bool)
            cut[1:] = run[1:] != run[:-1]
            cut[todo[1:]] |= (word[1:] != word[:-1]) | (sub[1:] != sub[:-1])
            del word, sub, todo
            run = np.cumsum(cut, dtype=index)
            depth += _WORD
        # equal up to the last byte of the longest: a shorter one (a prefix padded with zero bytes) first
        return order[np.lexsort((lengths[order], run))].astype(np.int64)

    def is_sorted(self) -> bool:
        """Whether the items are in ``sorted`` order (one pass, an item's bytes at a time)."""
        data, off = self._data, self._off
        previous = b""
        for i in range(len(self)):
            item = data[off[i] : off[i + 1]].tobytes()
            if item < previous:
                return False
            previous = item
        return True

    def take(self, order: np.ndarray) -> StringColumn:
        """A new column of items ``order`` (an index array), copied into buffers of their exact final size."""
        off = np.frombuffer(self._off, np.int64)
        new_off = np.zeros(len(order) + 1, np.int64)
        np.cumsum(np.diff(off)[order], out=new_off[1:])
        out = bytearray(int(new_off[-1]))
        src, at, to = self._data, self._off, new_off.data
        for a in range(0, len(order), 4096):  # not one Python int per item at once
            for j, i in enumerate(order[a : a + 4096].tolist(), a):
                out[to[j] : to[j + 1]] = src[at[i] : at[i + 1]]
        return StringColumn(out, to)


def _words(data: np.ndarray, starts: np.ndarray, depth: int, left: np.ndarray) -> np.ndarray:
    """The 8 bytes at ``starts + depth`` as big-endian uint64 (bytes past an item's end, ``left``, read as 0).

    A byte at a time and :data:`_CHUNK` items at a time: a few small arrays, never one (items, 8) array."""
    word = np.zeros(len(starts), np.uint64)
    last = len(data) - 1
    for a in range(0, len(starts), _CHUNK):
        at, end, out = starts[a : a + _CHUNK].astype(np.int64) + depth, left[a : a + _CHUNK], word[a : a + _CHUNK]
        for k in range(_WORD):
            byte = data[np.minimum(at + k, last)]
            byte[end <= k] = 0
            out <<= np.uint64(8)
            out |= byte
    return word


_CHUNK = 1 << 14


class ColumnBuilder:
    """Appends strings to a growing :class:`StringColumn` (a ``bytearray`` and an ``array`` of offsets)."""

    __slots__ = ("_data", "_off")

    def __init__(self) -> None:
        self._data = bytearray()
        self._off = array("q", [0])

    def __len__(self) -> int:
        return len(self._off) - 1

    def append(self, s: str) -> int:
        """Add ``s``; its index."""
        return self.append_bytes(s.encode(ENCODING, ERRORS))

    def append_bytes(self, b: bytes | memoryview) -> int:
        self._data += b
        self._off.append(len(self._data))
        return len(self._off) - 2

    def get(self, i: int) -> str:
        return str(memoryview(self._data)[self._off[i] : self._off[i + 1]], ENCODING, ERRORS)

    def build(self) -> StringColumn:
        """The column (the builder is left empty)."""
        data, off = self._data, self._off
        self._data, self._off = bytearray(), array("q", [0])
        return StringColumn(data, memoryview(off))
