"""Content fingerprints of source samples: what lets a re-run skip everything that did not change.

A sample's fingerprint is sha256(options digest, sha256(image bytes), sha256(label bytes)).
Hashing reads the sources but decodes nothing; a stat cache (size, mtime, ctime, inode) kept beside
the manifest lets an unchanged file skip even the read. The ctime and inode catch an edit that restored
size and mtime (``touch -r``) and a file replaced by another (rename over it).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .discover import SamplePair
from .errors import ShardkitError
from .formats.base import sha256_file
from .imageio import METADATA_SLACK, regular_stat
from .publish import atomic_write_bytes

log = logging.getLogger(__name__)
CACHE_NAME = ".fingerprints.json"


def _stat(path: Path) -> tuple[int, int, int, int]:
    """(size, mtime_ns, ctime_ns, inode): a file whose four values match its cache entry is unchanged."""
    st = regular_stat(path, "input")  # not a FIFO, broken link or loop: those are one-line errors
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def file_sha256(path: Path) -> str:
    """sha256 of a source file; an unreadable file is a one-line DecodeError."""
    try:
        return sha256_file(path)
    except PermissionError as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path: Path, exc: OSError) -> ShardkitError:
    from .errors import DecodeError

    return DecodeError(f"cannot read file ({exc.strerror})", path=path,
                       fix="check the file's permissions, or --on-error skip")


#: Largest source file :func:`source_digest` keeps in memory for the decoder (bigger ones are hashed in chunks
#: and read again by the decoder): the size any file passes :func:`shardkit.imageio.check_pixels` with.
KEEP_LIMIT = METADATA_SLACK


def source_digest(path: Path, cache: dict[str, Any], on_error: str, *,
                  keep: bool = False) -> tuple[list[Any], bool, np.ndarray | None]:
    """One source file's cache entry ``[size, mtime_ns, ctime_ns, inode, sha256]``, whether it may be cached,
    and (``keep``) the bytes that were hashed, for the worker to decode without reading the file again.

    A file that is not a regular file (FIFO, broken link, …) is an error, or with ``on_error="skip"``
    a placeholder digest that is never cached (its worker then skips the sample). A cache entry whose
    four stat values match is reused without reading the file. Kept bytes are only returned for files
    up to :data:`KEEP_LIMIT` bytes.
    """
    try:
        key = list(_stat(path))
    except ShardkitError as exc:
        if on_error != "skip":
            raise
        return [None, None, None, None, hashlib.sha256(f"unreadable: {exc}".encode()).hexdigest()], False, None
    hit = cache.get(str(path))
    if isinstance(hit, list) and len(hit) == 5 and hit[:4] == key:  # older 3-field caches: re-hash
        return hit, True, None
    if not keep or key[0] > KEEP_LIMIT:
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


def load_cache(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / CACHE_NAME).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def save_cache(directory: Path, cache: dict[str, Any]) -> None:
    atomic_write_bytes(directory / CACHE_NAME, cache_json(cache))


#: Entries encoded per piece of the cache file (~35 KB of JSON: larger pieces raised the peak RSS by MBs).
CACHE_CHUNK = 256


def cache_json(cache: dict[str, Any]) -> Iterator[bytes]:
    """``json.dumps(cache, sort_keys=True)``'s bytes in pieces of :data:`CACHE_CHUNK` entries, so that the
    cache of a large input is never one string in memory (it was the convert parent's largest peak: ~1 KB
    per sample pair at its end)."""
    keys = sorted(cache)
    yield b"{"
    for a in range(0, len(keys), CACHE_CHUNK):
        part = json.dumps({k: cache[k] for k in keys[a : a + CACHE_CHUNK]}, sort_keys=True)[1:-1]
        yield (", " + part if a else part).encode()
    yield b"}"


def fingerprint_samples(
    pairs: Sequence[SamplePair], options_digest: str, cache: dict[str, Any], *, threads: int = 4,
    on_error: str = "fail",
) -> tuple[list[str], dict[str, Any]]:
    """Fingerprints in pair order, and the refreshed cache {path: [size, mtime_ns, ctime_ns, inode, sha256]}.

    With ``on_error="skip"`` a file that cannot be read (not a regular file, broken link, …) gets a
    placeholder digest instead of an error and no cache entry; its worker then skips the sample.
    """
    paths = sorted({p for pair in pairs for p in (pair.image, pair.label) if p is not None})
    fresh: dict[str, Any] = {}  # readable files only: a placeholder digest is never cached
    known: dict[str, Any] = {}

    def digest(path: Path) -> tuple[str, list[Any]]:
        entry, cacheable, _ = source_digest(path, cache, on_error)
        if cacheable:
            fresh[str(path)] = entry
        return str(path), entry

    def digest_all(part: Sequence[Path]) -> list[tuple[str, list[Any]]]:
        return [digest(p) for p in part]

    # One contiguous run of paths per thread (sha256 and reads release the GIL): a future per file
    # would cost about a third of the hashing itself in scheduling.
    n = max(1, min(threads, len(paths)))
    parts = [paths[i * len(paths) // n : (i + 1) * len(paths) // n] for i in range(n)]
    with ThreadPoolExecutor(max_workers=n) as pool:
        for part in pool.map(digest_all, parts):
            known.update(part)
    return combine_fingerprints(pairs, options_digest, lambda p: str(known[str(p)][-1])), fresh


def combine_fingerprints(pairs: Sequence[SamplePair], options_digest: str,
                         file_digest: Callable[[Path], str]) -> list[str]:
    """sha256(options digest, digest of the image, digest of the label or "-") per pair, in pair order.

    ``file_digest`` is the file's sha256 for local inputs, the listing's content id (size + ETag) for
    object storage (:mod:`shardkit.staging`)."""
    out = []
    for pair in pairs:
        h = hashlib.sha256(options_digest.encode())
        h.update(file_digest(pair.image).encode())
        h.update(file_digest(pair.label).encode() if pair.label is not None else b"-")
        out.append(h.hexdigest())
    return out
