"""Content fingerprints of source samples: what lets a re-run skip everything that did not change.

A sample's fingerprint is sha256(options digest, sha256(image bytes), sha256(label bytes)).
Hashing reads the sources but decodes nothing; a stat cache (size, mtime, ctime, inode) kept beside
the manifest lets an unchanged file skip even the read. The ctime and inode catch an edit that restored
size and mtime (``touch -r``) and a file replaced by another (rename over it).

The cache file is ``{path: [size, mtime_ns, ctime_ns, inode, sha256 hex]}`` sorted by path, then
:data:`CHECKSUM_KEY` with the sha256 of every byte before its value: a cache that is damaged, edited or written
without it (an older shardkit's) is not used (every file is hashed again). In the converting
parent it is a :class:`SourceCache`: 64 bytes per source file in a NumPy array aligned with the split's
:class:`~shardkit.conversion.pairs.PairTable` (a ``dict`` of lists was ~0.9 KB per pair), read from and written to the
file a piece at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ShardkitError
from ..formats.base import sha256_file
from ..images.imageio import METADATA_SLACK, regular_stat
from ..store.publish import atomic_write_bytes
from ..store.splitdir import CACHE_NAME
from ..support.smallfile import loads_bounded, open_regular, read_guarded
from ..volumes.dicom import series_files
from .pairs import PairTable, root_prefix

log = logging.getLogger(__name__)


def _stat(path: Path) -> tuple[int, int, int, int]:
    """(size, mtime_ns, ctime_ns, inode): a file whose four values match its cache entry is unchanged (a DICOM
    series folder: :func:`series_stat`)."""
    try:
        st = regular_stat(path, "input")
    except ShardkitError:  # a folder is not a regular file: one stat more only then
        if is_series(path):
            return series_stat(path)
        raise  # not a FIFO, broken link or loop: those are one-line errors
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def is_series(path: Path) -> bool:
    """Whether a source is a DICOM series folder (a volume case's modality; not a link to one)."""
    return Path(path).is_dir() and not Path(path).is_symlink()


def series_stat(folder: Path) -> tuple[int, int, int, int]:
    """A DICOM series folder's stand-in for a file's four stat values: its slice files' total size, latest
    mtime_ns and ctime_ns, and in place of the inode a 63-bit digest of the folder's inode and every slice file's
    name, size, mtime_ns, ctime_ns and inode (the files the reader reads: :func:`~shardkit.volumes.dicom.series_files`).
    A slice rewritten, touched, replaced, added, removed or renamed changes it; the folder's own stat would not
    change when a slice is rewritten in place."""
    h = hashlib.sha256(f"{Path(folder).stat().st_ino}\n".encode())
    size = mtime = ctime = 0
    for path in series_files(Path(folder)):
        st = regular_stat(path, "DICOM slice")
        size, mtime, ctime = size + st.st_size, max(mtime, st.st_mtime_ns), max(ctime, st.st_ctime_ns)
        h.update(f"{path.name}\0{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino}\n".encode(
            "utf-8", "surrogateescape"))
    return size, mtime, ctime, int.from_bytes(h.digest()[:8], "little") >> 1


def series_sha256(folder: Path) -> str:
    """A DICOM series folder's digest: sha256 over every slice file's name and sha256, in name order."""
    h = hashlib.sha256(b"DICOM series\0")
    for path in series_files(Path(folder)):
        h.update(f"{path.name}\0{file_sha256(path)}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a source file (a DICOM series folder: :func:`series_sha256`); an unreadable file is a one-line
    DecodeError."""
    if is_series(path):
        return series_sha256(path)
    try:
        return sha256_file(path)
    except PermissionError as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path: Path, exc: OSError) -> ShardkitError:
    from ..errors import DecodeError

    return DecodeError(f"cannot read file ({exc.strerror})", path=path,
                       fix="check the file's permissions, or --on-error skip")


#: Largest source file :func:`source_digest` keeps in memory for the decoder (bigger ones are hashed in chunks
#: and read again by the decoder): the size any file passes :func:`shardkit.images.imageio.check_pixels` with.
KEEP_LIMIT = METADATA_SLACK


def source_digest(path: Path, cached: list[Any] | None, on_error: str, *,
                  keep: bool = False) -> tuple[list[Any], bool, np.ndarray | None]:
    """One source file's cache entry ``[size, mtime_ns, ctime_ns, inode, sha256]``, whether it may be cached,
    and (``keep``) the bytes that were hashed, for the worker to decode without reading the file again.

    A file that is not a regular file (FIFO, broken link, …) is an error, or with ``on_error="skip"``
    a placeholder digest that is never cached (its worker then skips the sample). A ``cached`` entry whose
    four stat values match is reused without reading the file. Kept bytes are only returned for files
    up to :data:`KEEP_LIMIT` bytes.
    """
    try:
        key = list(_stat(path))
    except ShardkitError as exc:
        if on_error != "skip":
            raise
        return [None, None, None, None, hashlib.sha256(f"unreadable: {exc}".encode()).hexdigest()], False, None
    if cached is not None and cached[:4] == key:
        return cached, True, None
    if not keep or key[0] > KEEP_LIMIT or is_series(path):
        return [*key, file_sha256(path)], True, None
    try:
        with open(path, "rb", buffering=0) as fh:
            data = fh.read(key[0] + 1)  # one read of the size stat said; more means it grew meanwhile
            if len(data) > key[0]:
                data += fh.readall()
    except PermissionError as exc:
        raise _unreadable(path, exc) from None
    if len(data) > KEEP_LIMIT:
        return [*key, file_sha256(path)], True, None
    return [*key, hashlib.sha256(data).hexdigest()], True, np.frombuffer(data, dtype=np.uint8)


#: One cache entry, 64 bytes: (size, mtime_ns, ctime_ns, inode as int64 two's complement) and the sha256; an
#: all-zero digest (no file has it) marks "no entry"
ENTRY = np.dtype([("stat", "<i8", (4,)), ("sha256", "u1", (32,))])
_STRUCT = struct.Struct("<4q32s")
_INT64 = 1 << 63
_EMPTY = bytes(ENTRY.itemsize)


def _pack(entry: Any) -> bytes | None:
    """A cache file entry as an :data:`ENTRY` row's bytes; None unless it is ``[4 ints, 64 lowercase hex]``
    (an older 3-field cache, or anything else: the file is hashed again)."""
    if type(entry) is not list or len(entry) != 5:
        return None
    size, mtime, ctime, inode, digest = entry
    if not (type(size) is type(mtime) is type(ctime) is type(inode) is int and type(digest) is str):
        return None
    try:
        raw = bytes.fromhex(digest)
        if len(raw) != 32 or raw.hex() != digest:  # not 64 lowercase hex digits
            return None
        return _STRUCT.pack(size, mtime, ctime, inode - 2 * _INT64 if inode >= _INT64 else inode, raw)
    except (ValueError, struct.error):  # not hex; a number beyond 64 bits
        return None


def _unpack(buf: bytes | bytearray | memoryview, offset: int) -> list[Any] | None:
    size, mtime, ctime, inode, digest = _STRUCT.unpack_from(buf, offset)
    if not any(digest):
        return None
    return [size, mtime, ctime, inode + 2 * _INT64 if inode < 0 else inode, digest.hex()]


class SourceCache:
    """Cache entries of one split's source files, aligned with its pairs: entry (i, 0) is pair ``i``'s image,
    (i, 1) its label; 64 bytes each (:data:`ENTRY`).

    In memory by default (zeroed pages cost nothing until written). With ``spill``, in an unlinked temporary
    file (the system's temporary folder, ``TMPDIR``) instead, so that the parent's memory does not grow with
    the input: a first conversion's entries come back from the workers shard by shard (:meth:`put`); a re-run's
    are read from the cache file into it and refreshed a block of pairs at a time (:meth:`part`, :meth:`put`).
    Single entries (:meth:`get`, :meth:`set`) go through a few blocks kept in memory and written back.
    """

    BLOCK = 4096  # pairs per block
    ROW = 2 * ENTRY.itemsize  # bytes per pair
    KEEP = 4  # blocks of a spill file kept in memory (2 MiB)

    def __init__(self, n: int, *, spill: bool = False) -> None:
        self.n = n
        self._file = tempfile.TemporaryFile(prefix="shardkit-cache-") if spill else None  # noqa: SIM115 (close())
        self._mem = np.zeros(0 if self._file else n * self.ROW, np.uint8).data
        if self._file is not None:
            self._file.truncate(n * self.ROW)  # a hole: all zero, "no entry"
            self._closer = weakref.finalize(self, self._file.close)  # also when dropped unclosed
        self._blocks: OrderedDict[int, bytearray] = OrderedDict()  # spill file blocks in memory
        self._dirty: set[int] = set()
        self._lock = threading.Lock()  # threads put and read blocks (fingerprint_samples)
        #: whether the entries differ from the split's cache file (False only after a :func:`load_cache` that
        #: read every entry of the file into place, until an entry changes): :func:`save_cache` then writes nothing
        self.changed = True

    def put(self, start: int, rows: np.ndarray) -> None:
        """Entries of pairs ``start …`` (an (m, 2) :data:`ENTRY` array)."""
        data = np.ascontiguousarray(rows, ENTRY).reshape(-1).view(np.uint8).data  # no copy
        if self._file is None:
            self._mem[start * self.ROW : start * self.ROW + len(data)] = data
            return
        with self._lock:
            self._flush()
            for block in range(start // self.BLOCK, (start + len(rows) - 1) // self.BLOCK + 1):
                self._blocks.pop(block, None)
            os.pwrite(self._file.fileno(), data, start * self.ROW)

    def rows(self, start: int, count: int) -> np.ndarray:
        """Entries of pairs ``start … start + count`` (an (m, 2) :data:`ENTRY` array; read back when spilled)."""
        a, b = start * self.ROW, min(start + count, self.n) * self.ROW
        if self._file is None:
            return np.frombuffer(self._mem[a:b], ENTRY).reshape(-1, 2)
        with self._lock:
            self._flush()
            return np.frombuffer(os.pread(self._file.fileno(), b - a, a), ENTRY).reshape(-1, 2)

    def part(self, start: int, count: int) -> SourceCache:
        """Pairs ``start … start + count`` as an in-memory cache of their own (a copy; :meth:`put` it back)."""
        part = SourceCache(count)
        if self._file is None:
            part._mem[:] = self._mem[start * self.ROW : (start + count) * self.ROW]
            return part
        with self._lock:
            self._flush()
            os.preadv(self._file.fileno(), [part._mem], start * self.ROW)  # straight into its memory
        return part

    def get(self, i: int, side: int) -> list[Any] | None:
        """The entry of pair ``i``'s image (``side`` 0) or label (1) as the cache file writes it; None if none."""
        if self._file is None:
            return _unpack(self._mem, i * self.ROW + side * ENTRY.itemsize)
        with self._lock:
            return _unpack(self._block(i // self.BLOCK), (i % self.BLOCK) * self.ROW + side * ENTRY.itemsize)

    def set(self, i: int, side: int, entry: list[Any] | None) -> bool:
        """Set one entry (``[size, mtime_ns, ctime_ns, inode, sha256 hex]``) or clear it (None); False (nothing
        set) for an entry that is not one."""
        row = _EMPTY if entry is None else _pack(entry)
        if row is None:
            return False
        if self._file is None:
            offset = i * self.ROW + side * ENTRY.itemsize
            self._mem[offset : offset + ENTRY.itemsize] = row
            return True
        with self._lock:
            offset = (i % self.BLOCK) * self.ROW + side * ENTRY.itemsize
            self._block(i // self.BLOCK)[offset : offset + ENTRY.itemsize] = row
            self._dirty.add(i // self.BLOCK)
        return True

    def _block(self, block: int) -> bytearray:
        """Block ``block`` of the spill file, kept among the :data:`KEEP` last used (under the lock)."""
        if block in self._blocks:
            self._blocks.move_to_end(block)
            return self._blocks[block]
        if len(self._blocks) >= self.KEEP:
            old, data = self._blocks.popitem(last=False)
            if old in self._dirty:
                self._write(old, data)
        assert self._file is not None
        data = bytearray(os.pread(self._file.fileno(), self.BLOCK * self.ROW, block * self.BLOCK * self.ROW))
        self._blocks[block] = data
        return data

    def _write(self, block: int, data: bytearray) -> None:
        assert self._file is not None
        os.pwrite(self._file.fileno(), data, block * self.BLOCK * self.ROW)
        self._dirty.discard(block)

    def _flush(self) -> None:
        for block in list(self._dirty):
            self._write(block, self._blocks[block])

    def close(self) -> None:
        """Remove the spill file (if any)."""
        if self._file is not None:
            self._closer()


#: Bytes of the cache file parsed at a time.
READ_BLOCK = 1 << 18


#: The cache file's last key (a NUL: no path has it): its value is the sha256 of every byte of the file before
#: that value, so a cache damaged or edited into other valid JSON is noticed (and dropped).
CHECKSUM_KEY = "\x00checksum"
_CHECKSUM_HEAD = b'"\\u0000checksum": "'
#: What follows the checksum's hex digits: the end of the object.
_CHECKSUM_END = b'"}'
_HELD = 64 + len(_CHECKSUM_END)


class _Checked:
    """The running sha256 of a cache file read in pieces, all but its last :data:`_HELD` bytes (the checksum's
    digits and the closing ``"}``), and the check of those at the end."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.held = b""
        self.stated: Any = None

    def feed(self, block: bytes) -> None:
        data = self.held + block
        self.hash.update(data[:-_HELD])
        self.held = data[-_HELD:]

    def entries(self, items: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        for key, value in items:
            if key == CHECKSUM_KEY:
                self.stated = value
            else:
                yield key, value

    def check(self) -> None:
        if self.stated is None:
            raise _NoChecksum("it has no checksum (written by an older shardkit)")
        digest = self.hash.hexdigest()
        if self.stated != digest or self.held != digest.encode() + _CHECKSUM_END:
            raise ValueError("its checksum does not match its content")


class _NoChecksum(ValueError):
    """A cache without a checksum: an older shardkit's, not trusted either, but no damage to warn about."""


def _entries_streamed(path: Path) -> Iterator[tuple[str, Any]]:
    """The cache file's entries in file order, parsed a piece at a time: cut after an entry's closing ``]``
    before ``, "`` (no JSON string holds an unescaped ``"``; a value with a nested list fails the parse). A
    regular file only (:func:`~shardkit.support.smallfile.open_regular`), each piece's nesting bounded, and its checksum
    checked once the last entry is read (a ValueError then: the caller drops what it took)."""
    checked = _Checked()
    with os.fdopen(open_regular(path, "fingerprint cache"), "rb") as fh:
        first = fh.read(1)
        if first != b"{":
            raise ValueError("not a JSON object")
        checked.feed(first)
        rest = b""
        while block := fh.read(READ_BLOCK):
            checked.feed(block)
            rest += block
            cut = rest.rfind(b'], "')
            if cut >= 0:
                yield from checked.entries(_object(b"{" + rest[: cut + 1] + b"}").items())
                rest = rest[cut + 3 :]
            elif len(rest) > MAX_ENTRY_BYTES:  # no entry is this long: not a cache shardkit wrote
                raise ValueError(f"no entry ends within {MAX_ENTRY_BYTES} bytes")
        yield from checked.entries(_object(b"{" + rest).items())
    checked.check()


def _object(raw: bytes) -> dict[str, Any]:
    data = loads_bounded(raw, "fingerprint cache", max_depth=2)  # {path: [size, mtime, ctime, inode, sha256]}
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _entries_whole(path: Path) -> Iterator[tuple[str, Any]]:
    """The cache file's entries sorted by path, parsed whole (a file not laid out as :func:`cache_json` does;
    at most :data:`MAX_WHOLE_BYTES`: shardkit's own caches of any size are read streamed); checksum checked
    before any entry is taken."""
    raw = read_guarded(path, "fingerprint cache", limit=MAX_WHOLE_BYTES)
    checked = _Checked()
    checked.feed(raw)
    items = list(checked.entries(_object(raw).items()))
    checked.check()
    yield from sorted(items)


#: Longest cache entry (a path of 4096 bytes, escaped, and its five values).
MAX_ENTRY_BYTES = 64 << 10
#: Largest cache file parsed whole (when it is not laid out as shardkit writes it).
MAX_WHOLE_BYTES = 64 << 20


def load_cache(directory: Path, pairs: PairTable) -> SourceCache:
    """The entries of ``directory``'s cache file for the source files of ``pairs`` (spilled: see
    :class:`SourceCache`); empty if it is missing, or (with a warning) damaged: not a regular file, too large,
    not JSON, nested, or its checksum disagrees. Entries of other files are read and dropped, a piece of the file
    at a time; an entry that is not ``[4 integers, 64 hex digits]`` is dropped alone (its file is hashed again)."""
    path = directory / CACHE_NAME
    problem: Exception | None = None
    for entries in (_entries_streamed, _entries_whole):
        cache = SourceCache(len(pairs), spill=True)
        try:
            it = entries(path)
            _merge(cache, pairs, it)
            for _ in it:  # the rest, so that the checksum is checked before any entry is used
                pass
            return cache
        except FileNotFoundError:
            cache.close()
            return SourceCache(len(pairs), spill=True)
        except (ValueError, OSError) as exc:  # streamed: try the whole file; whole: damaged
            problem = problem if isinstance(problem, _NoChecksum) else exc
            cache.close()
            if isinstance(exc, OSError):
                break
    if isinstance(problem, _NoChecksum):
        log.info("%s: %s; every source file is hashed again once and the cache rewritten", path, problem)
    else:
        reason = problem.strerror if isinstance(problem, OSError) and problem.strerror else str(problem)
        log.warning("%s: damaged (%s), ignored: every source file is hashed again and the cache rewritten",
                    path, reason)
    return SourceCache(len(pairs), spill=True)


def _merge(cache: SourceCache, pairs: PairTable, entries: Iterable[tuple[str, Any]]) -> None:
    """Fill ``cache`` from entries sorted by path: a merge with the pairs' files in path order (a file out of
    order is missed: hashed again). ``cache.changed`` ends False when every entry of the file was taken, once
    (the file then holds exactly what :func:`save_cache` would write, as long as no entry changes)."""
    files = pairs.files_in_path_order()
    current = next(files, None)
    exact = True
    for path, value in entries:
        while current is not None and current[0] < path:
            current = next(files, None)
        taken = False
        while current is not None and current[0] == path:  # one file may be in two pairs
            taken = cache.set(current[1], current[2], value) or taken
            current = next(files, None)
        exact = exact and taken
        if current is None:
            cache.changed = not exact or next(iter(entries), None) is not None
            return
    cache.changed = not exact


def save_cache(directory: Path, pairs: PairTable, cache: SourceCache) -> None:
    """Write the split's cache file, unless it already holds exactly these entries (an unchanged re-run)."""
    if not cache.changed and (directory / CACHE_NAME).is_file():
        return
    atomic_write_bytes(directory / CACHE_NAME, cache_json(cache_items(pairs, cache)))


def cache_items(pairs: PairTable, cache: SourceCache) -> Iterator[tuple[str, list[Any]]]:
    """The cache file's (path, entry) items, sorted by path, each path once."""
    last = None
    for path, i, side in pairs.files_in_path_order():
        if path != last and (entry := cache.get(i, side)) is not None:
            last = path
            yield path, entry


#: Entries encoded per piece of the cache file (~35 KB of JSON: larger pieces raised the peak RSS by MBs).
CACHE_CHUNK = 256


def cache_json(items: Iterable[tuple[str, list[Any]]]) -> Iterator[bytes]:
    """``json.dumps(dict(items), sort_keys=True)``'s bytes for ``items`` sorted by path (each once), in pieces
    of :data:`CACHE_CHUNK` entries, so that the cache of a large input is never one string in memory; then
    :data:`CHECKSUM_KEY` with the sha256 of every byte before its value, and the closing brace."""
    h = hashlib.sha256()

    def said(piece: bytes) -> bytes:
        h.update(piece)
        return piece

    yield said(b"{")
    chunk: list[tuple[str, list[Any]]] = []
    first = True
    for item in items:
        chunk.append(item)
        if len(chunk) == CACHE_CHUNK:
            yield said(_piece(chunk, first))
            chunk, first = [], False
    if chunk:
        yield said(_piece(chunk, first))
        first = False
    yield said((b"" if first else b", ") + _CHECKSUM_HEAD)
    yield h.hexdigest().encode() + _CHECKSUM_END


def _piece(chunk: list[tuple[str, list[Any]]], first: bool) -> bytes:
    part = json.dumps(dict(chunk), sort_keys=True)[1:-1]
    return (part if first else ", " + part).encode()


def fingerprint_samples(
    pairs: PairTable, options_digest: str, cache: SourceCache, *, threads: int = 4, on_error: str = "fail",
) -> tuple[np.ndarray, SourceCache]:
    """Fingerprints in pair order (an (n, 32) uint8 array), and ``cache`` refreshed in place: every readable
    source file's current entry.

    With ``on_error="skip"`` a file that cannot be read (not a regular file, broken link, …) gets a
    placeholder digest instead of an error and no cache entry; its worker then skips the sample.
    """
    out = np.zeros((len(pairs), 32), np.uint8)
    prints = out.reshape(-1).data  # written 32 bytes at a time by the threads
    prefix = root_prefix(pairs.root)

    def digest(part: SourceCache, i: int, side: int, text: str) -> str | None:
        if not text:  # no label
            return None
        cached = part.get(i, side)
        entry, cacheable, _ = source_digest(Path(prefix + text), cached, on_error)
        if entry is not cached:  # a hit is already there
            part.set(i, side, entry if cacheable else None)
            cache.changed = True
        return str(entry[-1])

    def digest_all(run: range) -> None:
        for a in range(run.start, run.stop, PART):  # a piece of the cache at a time, put back
            b = min(a + PART, run.stop)
            part = cache.part(a, b - a)
            for i, image, label in zip(range(b - a), pairs.images[a:b], pairs.labels[a:b], strict=True):
                fingerprint = sample_fingerprint(options_digest, str(digest(part, i, 0, image)),
                                                 digest(part, i, 1, label))
                prints[32 * (a + i) : 32 * (a + i + 1)] = fingerprint
            cache.put(a, part.rows(0, b - a))

    # One contiguous run of pairs per thread (sha256 and reads release the GIL): a future per file
    # would cost about a third of the hashing itself in scheduling.
    n = max(1, min(threads, len(pairs)))
    parts = [range(k * len(pairs) // n, (k + 1) * len(pairs) // n) for k in range(n)]
    with ThreadPoolExecutor(max_workers=n) as pool:
        list(pool.map(digest_all, parts))
    return out, cache


#: Pairs whose cache entries a hashing thread holds at a time (128 KiB).
PART = 1024


_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def identity_digests(stats: np.ndarray) -> np.ndarray:
    """(..., 4) int64 stat values (size, mtime_ns, ctime_ns, inode) → (...) uint64 digests of them (splitmix64 over
    the four), 8 bytes per file where the stats take 32; all-zero stats (no entry) give 0, which means "unknown"."""
    s = np.ascontiguousarray(stats, np.int64).view(np.uint64)
    h = np.zeros(s.shape[:-1], np.uint64)
    with np.errstate(over="ignore"):
        for k in range(4):
            h = h ^ s[..., k]
            h = (h ^ (h >> np.uint64(30))) * _MIX[0]
            h = (h ^ (h >> np.uint64(27))) * _MIX[1]
            h = h ^ (h >> np.uint64(31))
    known = s.any(axis=-1)
    return np.where(known, h | (h == 0), np.uint64(0)).astype(np.uint64)  # a real file never gets the unknown 0


def file_identity(path: Path) -> int:
    """The identity digest of ``path`` as it is now (:func:`identity_digests` of its stat); 0 when it is no longer
    a regular file (removed, replaced by a folder or a FIFO …)."""
    try:
        return int(identity_digests(np.array(_stat(path), np.int64)))
    except ShardkitError:
        return 0


def input_identities(pairs: PairTable, cache: SourceCache | None, *, threads: int = 4) -> np.ndarray:
    """Each pair's image and label identity when the run planned it: an (n, 2) uint64 array, 0 for no label or a
    file that is not readable (its worker reports why). Taken from ``cache`` (entries that
    :func:`fingerprint_samples` just refreshed: their stats are the files' now), else by a stat of every file.

    A worker compares them with the files after it has read them (:func:`shardkit.conversion.worker.check_unchanged`):
    an
    input rewritten, replaced or touched since the plan is caught, so a version never mixes old and new inputs."""
    out = np.zeros((len(pairs), 2), np.uint64)
    if cache is not None:
        for a in range(0, len(pairs), PART):
            rows = cache.rows(a, PART)
            out[a : a + len(rows)] = identity_digests(rows["stat"]) * rows["sha256"].any(axis=-1)
        return out
    prefix = root_prefix(pairs.root)

    def stat_all(run: range) -> None:
        for a in range(run.start, run.stop, PART):  # stats of a block of pairs, then their digests at once
            b = min(a + PART, run.stop)
            stats = np.zeros((b - a, 2, 4), np.int64)
            for i, image, label in zip(range(b - a), pairs.images[a:b], pairs.labels[a:b], strict=True):
                for side, text in enumerate((image, label)):
                    if text:
                        with contextlib.suppress(ShardkitError):  # not a regular file: unknown (0)
                            stats[i, side] = _stat(Path(prefix + text))
            out[a:b] = identity_digests(stats)

    n = max(1, min(threads, len(pairs)))
    with ThreadPoolExecutor(max_workers=n) as pool:
        list(pool.map(stat_all, [range(k * len(pairs) // n, (k + 1) * len(pairs) // n) for k in range(n)]))
    return out


def sample_fingerprint(options_digest: str, image_digest: str, label_digest: str | None) -> bytes:
    """sha256(options digest, digest of the image, digest of the label or "-"): a sample's fingerprint.

    The file digests are sha256 hex for local inputs, the listing's content id (size + ETag) for object
    storage (:mod:`shardkit.conversion.staging`)."""
    h = hashlib.sha256(options_digest.encode())
    h.update(image_digest.encode())
    h.update(label_digest.encode() if label_digest is not None else b"-")
    return h.digest()
