"""Reading small files safely: the text files a user names (class tables, palettes, list files, TOML configs)
and every file shardkit keeps in a split or output folder (manifests, caches, records, signatures).

Only regular files are read, and only up to a size cap: a path that is ``/dev/zero``, a FIFO, a folder or a
multi-gigabyte file is refused before a byte is read, never read until memory runs out or a writer appears.
JSON is parsed only after its nesting depth is counted (:func:`loads_bounded`): a deeply nested file is a
ValueError, never a RecursionError. Standard library only: the start-up paths that must not load numpy use it.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import mmap
import os
import re
import stat
from pathlib import Path
from typing import Any

#: Largest text file read whole (a list file of a few million samples still fits).
MAX_TEXT_BYTES = 256 << 20


def read_small_file(path: str | Path, what: str = "file") -> bytes:
    """The bytes of ``path``; OSError (with a readable ``strerror``) unless it is a regular file of at most
    :data:`MAX_TEXT_BYTES` (:func:`read_guarded`). FileNotFoundError passes through unchanged for the caller's
    own message."""
    return read_guarded(path, what, limit=MAX_TEXT_BYTES)


def read_small_text(path: str | Path, what: str = "file", *, errors: str = "strict") -> str:
    """:func:`read_small_file` decoded as UTF-8 (a leading BOM dropped)."""
    return read_small_file(path, what).decode("utf-8-sig", errors)


#: Bytes :func:`sha256_of` reads at a time from a file larger than this (smaller ones: one exactly sized read).
HASH_CHUNK = 8 * 1024 * 1024


def sha256_of(path: str | Path, *, mapped: bool = False) -> str:
    """sha256 (hex) of a whole file: the one file hash of shardkit. One exactly sized read up to ``HASH_CHUNK``
    bytes, else chunks (memory stays bounded whatever its size); standard library only, so the start-up paths that
    must not load numpy can use it. Regular files only (a FIFO or device: OSError, never a hang).

    ``mapped=True`` hashes straight from a read-only memory map (no copy; ~15 % faster), for files only this
    process writes: a file truncated while mapped would raise SIGBUS, so ``verify``, which reads files from
    anywhere, keeps the reads.
    """
    h = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        if mapped and size > 0:  # an empty file cannot be mapped
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as view:
                h.update(view)
        elif size <= HASH_CHUNK:  # no HASH_CHUNK buffer allocated and shrunk for a small file
            h.update(fh.read())
        else:
            while chunk := fh.read(HASH_CHUNK):
                h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------ files under a split folder
#: Deepest JSON nesting :func:`loads_bounded` parses: shardkit's own files nest a few levels; a file nested
#: deeper is not one of them (a 100,000-deep one would otherwise end ``json.loads`` in a RecursionError).
MAX_JSON_DEPTH = 64
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
#: Bytes the nesting scan deletes: all but quotes and brackets.
_NOT_STRUCTURAL = bytes(range(256)).translate(None, b'"[]{},')


def open_regular(path: str | Path, what: str = "file", *, inside: str | Path | None = None) -> int:
    """A read-only descriptor of ``path``, refused (OSError with a readable ``strerror``) unless it is a regular
    file — checked before it is opened, and again on the descriptor: a FIFO, device, folder or socket put in a
    file's place is never opened for reading (it is opened non-blocking, so a FIFO cannot hang the open).

    ``inside``: the folder the file belongs to; its real path (symlinks resolved) must stay in it.
    FileNotFoundError passes through unchanged for the caller's own message."""
    st = Path(path).stat()  # follows symlinks; FileNotFoundError / PermissionError / ELOOP as they are
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, f"{what} is not a regular file ({_kind(st.st_mode)})", str(path))
    if inside is not None:
        real, root = os.path.realpath(path), os.path.realpath(inside)
        if os.path.commonpath([real, root]) != root:
            raise OSError(errno.EXDEV, f"{what} resolves to {real}, outside {root}", str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between the stat and the open
            raise OSError(errno.EINVAL, f"{what} is not a regular file ({_kind(st.st_mode)})", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def read_guarded(path: str | Path, what: str = "file", *, limit: int = MAX_TEXT_BYTES,
                 inside: str | Path | None = None) -> bytes:
    """The bytes of a file shardkit keeps in a split or output folder (a manifest, a cache, a record), read
    through :func:`open_regular`: a regular file of at most ``limit`` bytes (its size checked before a byte is
    read, and the read itself bounded), else OSError naming the problem."""
    fd = open_regular(path, what, inside=inside)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        if size > limit:
            raise OSError(errno.EFBIG, f"{what} is {size} bytes, more than the {limit} allowed", str(path))
        data = fh.read(min(size, limit) + 1)  # exactly what is there (no ``limit`` buffer for a small file)
        if len(data) > size:  # grew since the stat
            data += fh.read(limit + 1 - len(data))
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"{what} is more than the {limit} bytes allowed", str(path))
    return data


def json_depth(raw: bytes | str) -> int:
    """The deepest nesting of objects and arrays in JSON text ``raw``, counted without parsing (brackets inside
    strings do not count); for valid JSON exact, for anything else a value ``json.loads`` reaches no deeper
    than before it fails."""
    return json_shape(raw)[0]


def json_shape(raw: bytes | str) -> tuple[int, int]:
    """(depth, values) of JSON text ``raw`` without parsing: its deepest nesting (:func:`json_depth`) and about how
    many values it holds (every ``[``, ``{`` and ``,`` outside strings), so that a file can be refused before
    ``json.loads`` builds a Python object for each of a million values."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if b'\\"' in data:  # an escaped quote (or an escaped backslash before a closing one): escapes dropped first
        data = _ESCAPE.sub(b"", data)
    marks = data.translate(None, _NOT_STRUCTURAL)
    # two adjacent quotes enclose no bracket (an empty string, or nothing between two strings): dropping them
    # changes no bracket's side; what quotes remain enclose the brackets and commas inside strings
    marks = marks.replace(b'""', b"")
    outside = b"".join(marks.split(b'"')[::2]) if b'"' in marks else marks  # marks between strings
    values = outside.count(b",") + outside.count(b"[") + outside.count(b"{")
    steps = outside.translate(_STEPS, b",")
    return max(itertools.accumulate(memoryview(steps).cast("b")), default=0), values


#: ``[`` and ``{`` one level down (+1), ``]`` and ``}`` one up (-1 as a signed byte).
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def loads_bounded(raw: bytes | str, what: str = "file", *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(raw)`` of a file shardkit reads, refused (ValueError naming the problem) when it nests
    deeper than ``max_depth`` (checked before parsing: no RecursionError), is not UTF-8 or is not JSON."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") > max_depth and json_depth(data) > max_depth:  # no deeper than openers
        raise ValueError(f"{what} nests more than {max_depth} levels deep (not a file shardkit wrote)")
    try:
        return json.loads(raw)
    except RecursionError:  # not reached after the scan; kept so that no parse ends in a traceback
        raise ValueError(f"{what} nests too deeply to parse") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the integer digit limit
        raise ValueError(f"{what} is not valid JSON ({' '.join(str(exc).split())[:120]})") from None


def read_json(path: str | Path, what: str = "file", *, limit: int = MAX_TEXT_BYTES,
              inside: str | Path | None = None, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """:func:`read_guarded` then :func:`loads_bounded`: OSError for the file, ValueError for its content."""
    return loads_bounded(read_guarded(path, what, limit=limit, inside=inside), what, max_depth=max_depth)


def checksum(payload: Any) -> str:
    """sha256 (hex) of ``payload``'s canonical JSON (sorted keys, no spaces): what a cache stores beside what it
    summarises, so that a cache edited or damaged into other valid JSON is noticed and rebuilt."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()
