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
        a handful of NumPy passes and about 40 bytes per item, where ``sorted`` would make a ``str`` of each.
        """
        order = np.arange(len(self), dtype=np.int64)
        if self.is_sorted():  # the common case (keys, and most label columns): no NumPy passes at all
            return order
        data, off = self._arrays()
        starts, lengths = off[:-1], np.diff(off)
        # order positions [a, b) with equal prefixes so far form a run; ``run`` numbers them along ``order``
        run = np.zeros(len(order), np.int64)
        depth = 0
        while True:
            counts = np.bincount(run)
            need = np.zeros(len(counts), bool)  # runs of several items, one of them longer than ``depth``
            need[run[(counts[run] > 1) & (lengths[order] > depth)]] = True
            todo = np.flatnonzero(need[run])  # whole runs, each a contiguous block of positions
            if not len(todo):
                break
            items = order[todo]
            word = _words(data, starts[items] + depth, lengths[items] - depth)
            perm = np.lexsort((word, run[todo]))  # within each run, by the next word (past an item's end: 0)
            order[todo] = items[perm]
            word, sub = word[perm], run[todo]
            cut = np.zeros(len(order), bool)
            cut[1:] = run[1:] != run[:-1]
            cut[todo[1:]] |= (word[1:] != word[:-1]) | (sub[1:] != sub[:-1])
            run = np.cumsum(cut)
            depth += _WORD
        # equal up to the last byte of the longest: a shorter one (a prefix padded with zero bytes) first
        return order[np.lexsort((lengths[order], run))]

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
        """A new column of items ``order`` (an index array), copied."""
        builder = ColumnBuilder()
        for i in order.tolist():
            builder.append_bytes(self.raw(i))
        return builder.build()


def _words(data: np.ndarray, starts: np.ndarray, left: np.ndarray) -> np.ndarray:
    """The 8 bytes at each of ``starts`` as big-endian uint64 (bytes past the item's end, ``left``, read as 0)."""
    word = np.zeros(len(starts), np.uint64)
    last = len(data) - 1
    for k in range(_WORD):  # a byte at a time: a few arrays of one value per item, never (items, 8)
        byte = data[np.minimum(starts + k, last)]
        byte[left <= k] = 0
        word <<= np.uint64(8)
        word |= byte
    return word


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
