"""Where each sample record lies in an LMDB data file, read from the file's own B-tree pages.

Only for read-ahead hints. py-lmdb touches every page of a value before ``get`` returns it, and shards are
opened with read-around off (``readahead=False``), so out of core a record arrives as one synchronous 4 KB
page fault after another (docs/scale.md: under 50 MB/s). Knowing each record's byte range in the file
before the batch is read lets the reader ask the kernel for a whole batch at once (``MADV_WILLNEED``), as
the npy and HDF5 readers do. py-lmdb does not say where a value lies without reading it, so this module
walks the main database's branch and leaf pages (a few pages per thousand records; never the values).

The layout is LMDB 0.9's (``mdb.c``), read little-endian on a 64-bit build: a 16-byte page header
(``pgno``, pad, ``flags``, ``lower``, ``upper``), node offsets after it, meta pages 0 and 1 (the one with the
larger ``txnid`` is current; the page size is the free database's ``md_pad``), branch nodes holding a child
page number, leaf nodes holding the key and either the value or (``F_BIGDATA``) the number of its first
overflow page. The file is not trusted: every offset is checked against the file, the walk visits each page
at most once, and anything unexpected gives no table. A wrong table could only make a hint useless — reads
still go through LMDB — and the reader also checks two ranges against what LMDB itself returns.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

_MAGIC = 0xBEEFC0DE
_HEADER = 16  # PAGEHDRSZ
_NODE = 8  # NODESIZE: mn_lo, mn_hi, mn_flags, mn_ksize
_P_BRANCH, _P_LEAF, _P_META = 0x01, 0x02, 0x08
_F_BIGDATA = 0x01
_P_KINDS = 0x01 | 0x02 | 0x20 | 0x40  # branch, leaf, LEAF2 (DUPFIXED), sub-page
_MAX_DEPTH = 64
_META_END = _HEADER + 24 + 96 + 16  # the meta record ends after mm_last_pg and mm_txnid


def value_ranges(data: Any, n: int) -> np.ndarray | None:
    """``(n, 2)`` int64 ``[begin, end)`` file offsets of the values of keys ``b"%08d" % j``, ``j < n``, in the
    LMDB data file ``data`` (bytes-like, e.g. a read-only ``mmap``); None unless every one is found."""
    try:
        return _walk(data, n)
    except struct.error:  # a page or record that runs past the end of the file
        return None


def _walk(data: Any, n: int) -> np.ndarray | None:
    size = len(data)
    if n > size // _NODE:  # every record needs a leaf node of at least 8 bytes: no table for a claim like that
        return None
    meta = _current_meta(data, size)
    if meta is None:
        return None
    psize, root = meta
    out = np.full((n, 2), -1, np.int64)
    if n == 0:
        return out
    pages = size // psize
    seen: set[int] = set()
    stack = [(root, 0)]
    while stack:
        pgno, depth = stack.pop()
        if not 2 <= pgno < pages or pgno in seen or depth > _MAX_DEPTH:
            return None
        seen.add(pgno)
        base = pgno * psize
        flags, lower, upper = struct.unpack_from("<HHH", data, base + 10)
        if not _HEADER <= lower <= upper <= psize or (lower - _HEADER) % 2:
            return None
        ptrs = struct.unpack_from(f"<{(lower - _HEADER) // 2}H", data, base + _HEADER)
        if any(not upper <= p <= psize - _NODE for p in ptrs):
            return None
        kind = flags & _P_KINDS
        if kind == _P_BRANCH:
            for p in ptrs:
                lo, hi, fl = struct.unpack_from("<HHH", data, base + p)
                stack.append((lo | hi << 16 | fl << 32, depth + 1))
        elif kind == _P_LEAF:
            for p in ptrs:
                if not _leaf_node(data, base, p, psize, size, n, out):
                    return None
        else:
            return None
    return out if (out[:, 0] >= 0).all() else None


def _current_meta(data: Any, size: int) -> tuple[int, int] | None:
    """(page size, main database root page) of the meta page with the larger transaction id, or None."""
    first = _meta(data, 0, size)
    if first is None:
        return None
    psize = first[0]
    second = _meta(data, psize, size)
    best = second if second is not None and second[0] == psize and second[2] > first[2] else first
    return best[0], best[1]


def _meta(data: Any, at: int, size: int) -> tuple[int, int, int] | None:
    """(page size, main root page, txnid) of the meta page at byte ``at``, or None when it is not one."""
    if at + _META_END > size:
        return None
    (flags,) = struct.unpack_from("<H", data, at + 10)
    magic, version = struct.unpack_from("<II", data, at + _HEADER)
    if not flags & _P_META or magic != _MAGIC or version != 1:
        return None
    (psize,) = struct.unpack_from("<I", data, at + _HEADER + 24)  # mm_dbs[FREE_DBI].md_pad
    (root,) = struct.unpack_from("<Q", data, at + _HEADER + 24 + 48 + 40)  # mm_dbs[MAIN_DBI].md_root
    (txnid,) = struct.unpack_from("<Q", data, at + _HEADER + 24 + 96 + 8)  # after mm_last_pg
    if psize < 512 or psize > 65536 or psize & (psize - 1) or psize > size:
        return None
    return psize, root, txnid


def _leaf_node(data: Any, base: int, p: int, psize: int, size: int, n: int, out: np.ndarray) -> bool:
    """Record the value range of the leaf node at ``base + p`` in ``out`` when its key is a sample's; False
    when the node is malformed."""
    lo, hi, fl, ksize = struct.unpack_from("<HHHH", data, base + p)
    dsize = lo | hi << 16
    kpos = base + p + _NODE
    if p + _NODE + ksize > psize:
        return False
    key = bytes(data[kpos : kpos + ksize])
    if ksize != 8 or not key.isdigit():
        return True  # the metadata record, or any other key: not a sample
    j = int(key)
    if j >= n:
        return True
    if fl & _F_BIGDATA:
        if p + _NODE + ksize + 8 > psize:
            return False
        (first,) = struct.unpack_from("<Q", data, kpos + ksize)
        begin = first * psize + _HEADER
    else:
        begin = kpos + ksize
    if not 0 <= begin <= size - dsize:
        return False
    out[j] = (begin, begin + dsize)
    return True
