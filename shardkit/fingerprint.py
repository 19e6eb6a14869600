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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .discover import SamplePair
from .errors import ShardkitError
from .formats.base import sha256_file
from .imageio import regular_stat
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
        from .errors import DecodeError

        raise DecodeError(f"cannot read file ({exc.strerror})", path=path,
                          fix="check the file's permissions, or --on-error skip") from None


def load_cache(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / CACHE_NAME).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def save_cache(directory: Path, cache: dict[str, Any]) -> None:
    atomic_write_bytes(directory / CACHE_NAME, json.dumps(cache, sort_keys=True).encode())


def fingerprint_samples(
    pairs: Sequence[SamplePair], options_digest: str, cache: dict[str, Any], *, threads: int = 4,
    on_error: str = "fail",
) -> tuple[list[str], dict[str, Any]]:
    """Fingerprints in pair order, and the refreshed cache {path: [size, mtime_ns, ctime_ns, inode, sha256]}.

    With ``on_error="skip"`` a file that cannot be read (not a regular file, broken link, …) gets a
    placeholder digest instead of an error and no cache entry; its worker then skips the sample.
    """
    paths = sorted({p for pair in pairs for p in (pair.image, pair.label) if p is not None})
    fresh: dict[str, Any] = {}
    unreadable: dict[str, Any] = {}

    def digest(path: Path) -> tuple[str, list[Any]]:
        try:
            key = list(_stat(path))
        except ShardkitError as exc:
            if on_error != "skip":
                raise
            unreadable[str(path)] = [None, None, None, None, hashlib.sha256(f"unreadable: {exc}".encode()).hexdigest()]
            return str(path), unreadable[str(path)]
        hit = cache.get(str(path))
        if isinstance(hit, list) and len(hit) == 5 and hit[:4] == key:  # older 3-field caches: re-hash
            return str(path), hit
        return str(path), [*key, file_sha256(path)]

    def digest_all(part: Sequence[Path]) -> list[tuple[str, list[Any]]]:
        return [digest(p) for p in part]

    # One contiguous run of paths per thread (sha256 and reads release the GIL): a future per file
    # would cost about a third of the hashing itself in scheduling.
    n = max(1, min(threads, len(paths)))
    parts = [paths[i * len(paths) // n : (i + 1) * len(paths) // n] for i in range(n)]
    with ThreadPoolExecutor(max_workers=n) as pool:
        for part in pool.map(digest_all, parts):
            fresh.update(part)
    known = {**fresh, **unreadable}
    for key in unreadable:
        fresh.pop(key, None)
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
