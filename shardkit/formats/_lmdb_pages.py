"""Where each record lies in an LMDB data file, read from the file's own B-tree pages, every offset checked.

The LMDB reader reads records through this table, never through the LMDB library: LMDB trusts its file
and copies whatever size a leaf node states out of its map, so one flipped bit in a shard killed the
process (SIGSEGV; an overflow page past the end of the file, SIGBUS). Here every page number, node
offset, key and value range is checked against its page and the file's size before it is used, so a
damaged file gives a :class:`LmdbLayoutError` (the file cannot be walked at all) or a table in which the
damaged records are marked missing (:data:`MISSING`), each then a one-line error when it is read.

The layout is LMDB 0.9's (``mdb.c``), read little-endian on a 64-bit build: a 16-byte page header
(``pgno``, pad, ``flags``, ``lower``, ``upper``; an overflow page keeps its page count where ``lower`` and
``upper`` would be), node offsets after it, meta pages 0 and 1 (the one with the larger ``txnid`` is
current; the page size is the free database's ``md_pad``), branch nodes holding a child page number, leaf
nodes holding the key and either the value or (``F_BIGDATA``) the number of its first overflow page.

Bounded whatever the file or the manifest claim: a sample count the file could not hold is refused before
the table (16 bytes per sample) is allocated; each page is visited at most once (a bitmap, one bit per
page); the walk stops at the first key that is not a sample's or the metadata's (a shard holds nothing
else, formats/lmdb.md) and never reads values, so its work is one step per page and per record.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

_MAGIC = 0xBEEFC0DE
_HEADER = 16  # PAGEHDRSZ
_NODE = 8  # NODESIZE: mn_lo, mn_hi, mn_flags, mn_ksize
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META = 0x01, 0x02, 0x04, 0x08
_F_BIGDATA = 0x01
_P_KINDS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40  # branch, leaf, overflow, meta, LEAF2 (DUPFIXED), sub-page
_MAX_DEPTH = 64
_META_END = _HEADER + 24 + 96 + 16  # the meta record ends after mm_last_pg and mm_txnid
#: The fewest file bytes one sample record takes: its leaf node (8) and key (8), its slot in the page's offset
#: array (2) and a value of at least a record header (16) and one byte of image and of label.
MIN_RECORD_BYTES = 8 + 8 + 2 + 16 + 2
META_KEY = b"__shardkit__"
MISSING = -1
#: The metadata record is a short JSON object; a larger one is not a shardkit shard's.
MAX_META_BYTES = 1 << 16


class LmdbLayoutError(ValueError):
    """The file is not an LMDB data file whose B-tree can be walked (no valid meta page, a damaged root)."""


@dataclass(frozen=True)
class RecordTable:
    """Each sample record's ``[begin, end)`` byte range in the file (``(n, 2)`` int64; :data:`MISSING` where
    the record was not found or its node is damaged), the metadata record's range, the page size, and the
    first problem the walk met (for messages), if any."""

    ranges: np.ndarray
    meta: tuple[int, int] | None
    page_size: int
    problem: str | None

    def overflow_page(self, i: int) -> int | None:
        """The first overflow page of record ``i`` when its value lies on overflow pages (values inside a leaf
        page never start right after a page header), else None."""
        begin = int(self.ranges[i, 0])
        return (begin - _HEADER) // self.page_size if begin % self.page_size == _HEADER else None


def check_overflow(data: Any, table: RecordTable, i: int) -> str | None:
    """What is wrong with the overflow page header in front of record ``i``'s value, or None (also for inline
    values): it must name its own page, be an overflow page, and span the value inside the file."""
    first = table.overflow_page(i)
    if first is None:
        return None
    at = first * table.page_size
    return overflow_problem(memoryview(data)[at : at + _HEADER], table, i, len(data))


def overflow_problem(header: Any, table: RecordTable, i: int, size: int) -> str | None:
    """:func:`check_overflow` on the 16 bytes in front of record ``i``'s value (its overflow page's header, as
    fetched by a range read) in a file of ``size`` bytes; None for an inline value."""
    first = table.overflow_page(i)
    if first is None:
        return None
    psize, at = table.page_size, first * table.page_size
    if len(header) < _HEADER:
        return f"its overflow page {first} is damaged"
    pgno, flags, pages = struct.unpack_from("<QxxHI", header, 0)
    end = int(table.ranges[i, 1])
    if pgno != first or not flags & _P_OVERFLOW or at + pages * psize < end or at + pages * psize > size:
        return f"its overflow page {first} is damaged"
    return None


def value_ranges(data: Any, n: int) -> np.ndarray | None:
    """``(n, 2)`` int64 ``[begin, end)`` file offsets of the values of keys ``b"%08d" % j``, ``j < n``, in the
    LMDB data file ``data`` (bytes-like, e.g. a read-only ``mmap``); None unless every one is found."""
    try:
        table = read_table(data, n)
    except LmdbLayoutError:
        return None
    return table.ranges if (table.ranges[:, 0] >= 0).all() else None


#: ``read(at, length)``: ``length`` bytes of the file from byte ``at`` (a buffer; the caller keeps it in the file).
Read = Callable[[int, int], Any]
#: ``need(spans)``: the walk will read these ``(at, length)`` byte spans (pages) next (a range reader fetches them
#: in one go; locally nothing is done).
Need = Callable[[list[tuple[int, int]]], None]


def read_table(data: Any, n: int) -> RecordTable:
    """The :class:`RecordTable` of ``n`` sample records in ``data``; LmdbLayoutError when there is none."""
    view = memoryview(data)
    return read_table_from(lambda at, length: view[at : at + length], len(data), n)


def read_table_from(read: Read, size: int, n: int, need: Need | None = None) -> RecordTable:
    """:func:`read_table` of a file of ``size`` bytes read page by page through ``read`` (e.g. by range
    requests; ``need`` is told each branch page's children before they are read)."""
    try:
        return _walk(read, size, n, need)
    except struct.error as exc:  # unreachable with the checks below; kept as a one-line error, not a crash
        raise LmdbLayoutError(f"a page runs past the end of the file ({exc})") from None


def _walk(read: Read, size: int, n: int, need: Need | None) -> RecordTable:
    psize, root = _current_meta_from(read, size)
    if n < 0 or n > max(0, size - 2 * psize) // MIN_RECORD_BYTES:
        raise LmdbLayoutError(f"a file of {size} bytes cannot hold {n} sample records")
    out = np.full((n, 2), MISSING, np.int64)
    walk = _Walk(read, size, psize, n, out, need)
    if root != 0xFFFFFFFFFFFFFFFF:  # P_INVALID: an empty database
        walk.run(root)
    return RecordTable(out, walk.meta, psize, walk.problem)


class _Walk:
    """One in-order walk of the main database's B-tree (keys come out sorted: samples, then the metadata)."""

    def __init__(self, read: Read, size: int, psize: int, n: int, out: np.ndarray, need: Need | None) -> None:
        self.read, self.size, self.psize, self.n, self.out, self.need = read, size, psize, n, out, need
        self.pages = size // psize
        self.seen = bytearray((self.pages + 7) // 8)
        self.meta: tuple[int, int] | None = None
        self.problem: str | None = None
        self.stop = False
        self.last = -1  # the last sample key met: keys come out of an in-order walk strictly increasing

    def damaged(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem

    def run(self, root: int) -> None:
        stack = [(root, 0)]
        while stack and not self.stop:
            pgno, depth = stack.pop()
            page = self._page(pgno, depth)
            if page is None:
                continue
            flags, ptrs, buf = page
            if flags == _P_BRANCH:
                children = []
                for p in ptrs:
                    lo, hi, fl, ksize = struct.unpack_from("<HHHH", buf, p)
                    if p + _NODE + ksize > self.psize:
                        self.damaged(f"branch page {pgno} has a node running past the page")
                        continue
                    children.append((lo | hi << 16 | fl << 32, depth + 1))
                stack.extend(reversed(children))  # popped left to right: keys in order
                if self.need is not None:
                    self.need([(c * self.psize, self.psize) for c, _ in children if 2 <= c < self.pages])
            else:
                for p in ptrs:
                    self._leaf_node(pgno, buf, p)
                    if self.stop:
                        break

    def _page(self, pgno: int, depth: int) -> tuple[int, tuple[int, ...], Any] | None:
        """(kind, node offsets, the page's bytes) of branch or leaf page ``pgno``, all checked; None (noted) when
        damaged."""
        if not 2 <= pgno < self.pages or depth > _MAX_DEPTH:
            self.damaged(f"page {pgno} is outside the file" if depth <= _MAX_DEPTH else "the tree is too deep")
            return None
        if self.seen[pgno >> 3] & (1 << (pgno & 7)):
            self.damaged(f"page {pgno} is reached twice")
            return None
        self.seen[pgno >> 3] |= 1 << (pgno & 7)
        buf = self.read(pgno * self.psize, self.psize)
        own, flags, lower, upper = struct.unpack_from("<QxxHHH", buf, 0)
        kind = flags & _P_KINDS
        if own != pgno or kind not in (_P_BRANCH, _P_LEAF):
            self.damaged(f"page {pgno} is not a branch or leaf page")
            return None
        if not _HEADER <= lower <= upper <= self.psize or (lower - _HEADER) % 2:
            self.damaged(f"page {pgno} has a damaged header")
            return None
        ptrs = struct.unpack_from(f"<{(lower - _HEADER) // 2}H", buf, _HEADER)
        if any(not upper <= p <= self.psize - _NODE for p in ptrs):
            self.damaged(f"page {pgno} has a node outside the page")
            return None
        return kind, ptrs, buf

    def _leaf_node(self, pgno: int, data: Any, p: int) -> None:
        """Record the value range of the leaf node at byte ``p`` of leaf page ``pgno`` (its bytes: ``data``) when
        its key is a sample's or the metadata's."""
        psize = self.psize
        lo, hi, fl, ksize = struct.unpack_from("<HHHH", data, p)
        dsize = lo | hi << 16
        kpos = p + _NODE
        if p + _NODE + ksize > psize:
            self.damaged(f"leaf page {pgno} has a key running past the page")
            return
        key = bytes(data[kpos : kpos + ksize])
        if fl & ~_F_BIGDATA:
            begin = -1  # a sub-database or duplicate-data node: never a shardkit record
        elif fl & _F_BIGDATA:
            if p + _NODE + ksize + 8 > psize:
                begin = -1
            else:
                (first,) = struct.unpack_from("<Q", data, kpos + ksize)
                begin = first * psize + _HEADER if 2 <= first < self.pages else -1
        else:
            begin = pgno * psize + kpos + ksize if p + _NODE + ksize + dsize <= psize else -1
        ok = 0 <= begin <= self.size - dsize
        if key == META_KEY:
            if ok and dsize <= MAX_META_BYTES:
                self.meta = (begin, begin + dsize)
            else:
                self.damaged("the metadata record's node is damaged")
            return
        j = int(key) if ksize == 8 and key.isdigit() and key.isascii() else -1
        if not 0 <= j < self.n:
            self.damaged(f"leaf page {pgno} holds a key {key[:16]!r} that is not one of the {self.n} samples'")
            self.stop = True  # a shard holds nothing else: the rest of this walk would be garbage too
            return
        if not ok:
            self.damaged(f"sample {j}'s node on leaf page {pgno} is damaged")
            return
        if self.out[j, 0] != MISSING or j <= self.last:  # keys out of order or seen twice (bits flipped in a
            for k in {j, self.last} - {-1}:  # key): which record is whose cannot be told, so neither is served
                self.out[k] = (-2, -2)
            self.damaged(f"sample {j}'s key is out of order in the tree")
            self.last = max(self.last, j)
            return
        self.out[j] = (begin, begin + dsize)
        self.last = j


def _current_meta(data: Any, size: int) -> tuple[int, int]:
    """(page size, main database root page) of the meta page with the larger transaction id."""
    view = memoryview(data)
    return _current_meta_from(lambda at, length: view[at : at + length], size)


def _current_meta_from(read: Read, size: int) -> tuple[int, int]:
    """:func:`_current_meta` through ``read`` (see :func:`read_table_from`)."""
    first = _meta(read, 0, size)
    if first is None:
        raise LmdbLayoutError("its first meta page is damaged (not an LMDB file)")
    psize = first[0]
    second = _meta(read, psize, size)
    best = second if second is not None and second[0] == psize and second[2] > first[2] else first
    return best[0], best[1]


def _meta(read: Read, at: int, size: int) -> tuple[int, int, int] | None:
    """(page size, main root page, txnid) of the meta page at byte ``at``, or None when it is not one."""
    if at + _META_END > size:
        return None
    page = read(at, _META_END)
    (flags,) = struct.unpack_from("<H", page, 10)
    magic, version = struct.unpack_from("<II", page, _HEADER)
    if not flags & _P_META or magic != _MAGIC or version != 1:
        return None
    (psize,) = struct.unpack_from("<I", page, _HEADER + 24)  # mm_dbs[FREE_DBI].md_pad
    (root,) = struct.unpack_from("<Q", page, _HEADER + 24 + 48 + 40)  # mm_dbs[MAIN_DBI].md_root
    (txnid,) = struct.unpack_from("<Q", page, _HEADER + 24 + 96 + 8)  # after mm_last_pg
    if psize < 512 or psize > 65536 or psize & (psize - 1) or 2 * psize > size:
        return None
    return psize, root, txnid
