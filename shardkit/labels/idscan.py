"""A class table from the ids found in the label files, for datasets nothing else describes.

Every label file is read once (threads; each file's header checked against ``--max-pixels`` first) and only
its distinct values are kept, so memory stays bounded. The ids found become classes ``0..max``; the ignore id
is one only when the user gives it. Values that cannot be class ids of one table — 0 and 255 of a binary
mask, or 255 far above ids 0..20 — are refused with the flags that say what they mean, never guessed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import LabelError
from ..images.imageio import check_pixels, decode_palette_label, is_jpeg_data, read_bytes
from ..support.smallfile import checksum, read_json
from .classes import MAX_CLASSES, ClassInfo, ClassTable
from .hints import JPEG_PROBLEM, jpeg_fix, luma, read_values
from .policy import TableChoice

SOURCE = "scan:label-values"
#: The last scan's result, in the output folder beside its splits: reused while the options and every label
#: file's (size, mtime_ns, ctime_ns, inode) are unchanged — the trust the fingerprint cache gives a file — so an
#: unchanged re-run reads no label file (``--rehash`` and ``--force`` scan again).
SCAN_CACHE = ".label-scan.json"
log = logging.getLogger(__name__)


ValueMap = Callable[[np.ndarray], np.ndarray]
#: Label files queued for the scan's threads at a time: each queued file is a future (~1.5 KB with its lock and
#: condition), so queueing all 200,000 files of a split at once held ~300 MB in the converting process (#42).
WINDOW = 4096


def _file_counts(path: Path, max_pixels: int, value_map: ValueMap | None = None) -> np.ndarray:
    """Pixel count per value (index = value) of one label file, read as stored ids (palette indices too), after
    ``value_map`` (the user's label value mapping, if any)."""
    check_pixels(path, max_pixels, "label")
    data = read_bytes(path, "label")
    mode, arr = decode_palette_label(path, data)
    if value_map is None and is_jpeg_data(data) and arr.dtype == np.uint8:
        gray = luma(arr[..., 0], arr[..., 1], arr[..., 2]) if arr.ndim == 3 and arr.shape[2] >= 3 else arr
        raise LabelError(JPEG_PROBLEM, path=path, fix=jpeg_fix(np.bincount(gray.ravel(), minlength=256)))
    if arr.ndim == 3:
        if arr.shape[2] >= 3 and not (np.array_equal(arr[..., 0], arr[..., 1])
                                      and np.array_equal(arr[..., 1], arr[..., 2])):
            raise LabelError("label has colours, not class ids, and no class table says what they mean",
                             path=path, fix="pass --palette FILE (name,r,g,b lines, or CVAT's labelmap.txt), "
                                                      "or --class-dict FILE / a class_dict.csv at the root")
        arr = arr[..., 0]
    if arr.dtype == bool:
        arr = arr.astype(np.uint8)
    if value_map is not None:
        try:
            arr = value_map(arr)
        except LabelError as exc:  # the map refused a value of this file (ValueMap.check_merges): name the file
            raise LabelError(exc.problem, path=path, fix=exc.fix) from None
    if arr.dtype.kind not in "ui" or (arr.size and (int(arr.min()) < 0 or int(arr.max()) >= MAX_CLASSES)):
        raise LabelError(f"label pixels are {arr.dtype} (mode {mode}), not 8- or 16-bit class ids", path=path,
                         fix="re-export the label as an 8- or 16-bit grayscale or palette PNG")
    return np.bincount(arr.ravel().astype(np.intp, copy=False), minlength=1)


def scan_label_values(paths: Sequence[Path | str], *, max_pixels: int, threads: int = 4,
                      value_map: ValueMap | None = None) -> tuple[np.ndarray, dict[int, Path]]:
    """Pixels per value over every file of ``paths``, and the first file (in ``paths`` order) holding each value.
    The files are read :data:`WINDOW` at a time, so memory does not grow with their number."""
    total = np.zeros(1, dtype=np.int64)
    first: dict[int, Path] = {}
    with ThreadPoolExecutor(max(1, threads)) as pool:
        for start in range(0, len(paths), WINDOW):
            window = [Path(p) for p in paths[start:start + WINDOW]]
            for path, counts in zip(window, pool.map(lambda p: _file_counts(p, max_pixels, value_map), window),
                                    strict=True):
                if counts.size > total.size:
                    total = np.pad(total, (0, counts.size - total.size))
                total[: counts.size] += counts
                for v in np.flatnonzero(counts).tolist():
                    first.setdefault(v, path)
    return total, first


def _px(n: int) -> str:
    return f"{n / 1e6:.1f}M px" if n >= 1_000_000 else f"{n / 1e3:.0f}k px" if n >= 10_000 else f"{n} px"


def table_from_values(counts: np.ndarray, first: dict[int, Path], files: int, ignore_index: int | None,
                      root: Path | None = None) -> TableChoice:
    """Classes ``0..max`` of the values found (the ignore id excluded when given); a LabelError when the values
    cannot be ids of one table."""
    values = [v for v in np.flatnonzero(counts).tolist() if v != ignore_index]

    def where(v: int) -> str:
        path = first[v]
        return path.relative_to(root).as_posix() if root is not None and path.is_relative_to(root) else str(path)

    if not values:
        raise LabelError(f"the {files} label files hold no value but the ignore id {ignore_index}",
                         fix="check --ignore-index, or pass --classes FILE / --num-classes N")
    top = max(values)
    reading = read_values(counts, ignore_index=ignore_index)
    if reading is not None:
        what, fix = reading
        shown = ", ".join(f"{v} ({_px(int(counts[v]))})" for v in values[:6]) + (", …" if len(values) > 6 else "")
        raise LabelError(f"label values {shown} found in {files} label files (e.g. {top} in {where(top)}): {what}",
                         fix=fix)
    names = tuple(ClassInfo(i, f"class_{i}") for i in range(top + 1))
    table = ClassTable(names, ignore_index, source=SOURCE)
    missing = top + 1 - len(values)
    gaps = f", {missing} of them absent" if missing else ""
    return TableChoice(table, f"the label values found in all {files} label files (ids 0..{top}{gaps}; the layout "
                              "does not identify the dataset: pass --classes FILE to name them)")


def scan_table(paths: Sequence[Path | str], ignore_index: int | None, *, max_pixels: int, threads: int = 4,
               root: Path | None = None, value_map: ValueMap | None = None,
               cache: ScanCache | None = None) -> TableChoice:
    """:func:`scan_label_values` then :func:`table_from_values`; with ``cache``, the last scan's result when its
    key matches, and this scan's remembered for :meth:`ScanCache.save`."""
    found = cache.load() if cache is not None else None
    if found is None:
        found = scan_label_values(paths, max_pixels=max_pixels, threads=threads, value_map=value_map)
        if cache is not None:
            cache.remember(*found)
    else:
        log.debug("label ids from the last scan (no label file changed)")
    return table_from_values(found[0], found[1], len(paths), ignore_index, root)


#: Largest scan cache read (a few hundred values, or 65,536 at most: ~10 MB with long paths).
MAX_SCAN_CACHE_BYTES = 16 << 20


def _scan_from_json(data: Any) -> tuple[np.ndarray, dict[int, Path]]:
    """The (counts, first files) a parsed scan cache holds, each field checked for type and range before it is
    used (a ValueError naming the problem): ``size`` a class count, each value once, in ``0..size-1``, a
    positive pixel count and a path; the checksum of the rest equal to ``checksum``."""
    if not isinstance(data, dict) or set(data) != {"key", "size", "values", "checksum"}:
        raise ValueError("not an object of key, size, values and checksum")
    if data["checksum"] != checksum({k: v for k, v in data.items() if k != "checksum"}):
        raise ValueError("its checksum does not match its content")
    size, values = data["size"], data["values"]
    if not _is_int(size) or not 1 <= size <= MAX_CLASSES:
        raise ValueError(f"size {str(size)[:20]} is not a value count in 1..{MAX_CLASSES}")
    if not isinstance(values, list) or len(values) > size:
        raise ValueError("values is not a list of at most size entries")
    counts = np.zeros(size, np.int64)
    first: dict[int, Path] = {}
    for entry in values:
        if not (isinstance(entry, list) and len(entry) == 3 and _is_int(entry[0]) and _is_int(entry[1])
                and isinstance(entry[2], str)):
            raise ValueError(f"entry {str(entry)[:40]} is not [value, pixels, path]")
        v, n, where = entry
        if not 0 <= v < size or v in first or not 0 < n < 1 << 62 or not where or "\0" in where:
            raise ValueError(f"entry {str(entry)[:40]}: a value outside 0..{size - 1}, repeated, or without pixels")
        counts[v] = n
        first[v] = Path(where)
    if size != (max(first) + 1 if first else 1):
        raise ValueError(f"size {size} is not one more than the largest value")
    return counts, first


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class ScanCache:
    """The scan cache of one conversion: where it lives, the key of this run's label files, and (after a scan)
    the result still to be saved — by the caller, once the output folder is known to be a good place for it."""

    path: Path
    key: str
    pending: dict[str, Any] | None = None

    @classmethod
    def of(cls, path: Path, labels: Sequence[str], identity: str) -> ScanCache | None:
        """The cache at ``path`` for the label files ``labels`` (absolute paths, in scan order) under the options
        ``identity`` (ignore id, value map); None when a label cannot be stat-ed (the scan reports it)."""
        h = hashlib.sha256(identity.encode())
        stat = os.stat
        try:
            for name in labels:
                st = stat(name)
                h.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\n".encode())
        except OSError:
            return None
        return cls(path, h.hexdigest())

    def load(self) -> tuple[np.ndarray, dict[int, Path]] | None:
        """(counts, first file of each value) of the last scan if its key is this one, else None. A damaged cache
        (not a regular file, not JSON, a checksum that disagrees, a field of the wrong type or range) is dropped
        with a warning and the labels are scanned again: it is never trusted, and never a traceback."""
        try:
            data = read_json(self.path, "label scan cache", limit=MAX_SCAN_CACHE_BYTES)
            if isinstance(data, dict) and data.get("key") != self.key:
                return None  # another run's scan (other labels or options): scanned again, silently
            if isinstance(data, dict) and "checksum" not in data and set(data) == {"key", "size", "values"}:
                log.info("%s: written by an older shardkit (no checksum): the labels are scanned again", self.path)
                return None
            return _scan_from_json(data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("%s: damaged (%s), ignored: the labels are scanned again and the cache rewritten",
                        self.path, exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
            return None

    def remember(self, counts: np.ndarray, first: dict[int, Path]) -> None:
        body = {"key": self.key, "size": int(counts.size),
                "values": [[v, int(counts[v]), str(first[v])] for v in sorted(first)]}
        self.pending = {**body, "checksum": checksum(body)}

    def save(self) -> None:
        """Write a scan made this run (temp name, rename); a failure only costs the next run a scan."""
        if self.pending is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.unlink(missing_ok=True)  # a file left by a killed run of this pid; anything else fails the unlink
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)  # never into a FIFO
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(self.pending))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.debug("label scan cache not written: %s", exc)
            with contextlib.suppress(OSError):  # a folder in its place stays (it failed the unlink above)
                tmp.unlink(missing_ok=True)
        self.pending = None
