"""LMDB shards: one single-file environment per shard, one key per sample.

Key ``b"%08d" % i`` (local index) → value = 16-byte little-endian header
(:data:`RECORD_HEADER`: height, width, image bytes, label bytes) + image bytes + label
bytes. Key ``__shardkit__`` holds a JSON object with the format version and count.
Format version 2 stores each array through its codec (``shardkit.codecs``: zstd, lz4,
png, jpeg); the header then counts encoded bytes, and batches are decoded on a thread pool
straight into the caller's arrays. The map size grows automatically while writing.
Spec: ``formats/lmdb.md``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import mmap
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from ..codecs import RAW, ArrayCodecs, run_parallel
from ..errors import ShardFormatError
from ._lmdb_pages import value_ranges
from .base import SampleSpec, ShardFormat, ShardReader, ShardWriter
from .mapping import MappedArray

FORMAT_ID = "shardkit-lmdb"
META_KEY = b"__shardkit__"
RECORD_HEADER = np.dtype([("height", "<u4"), ("width", "<u4"), ("image_nbytes", "<u4"), ("label_nbytes", "<u4")])
_MIN_MAP = 1 << 20


def sample_key(i: int) -> bytes:
    return b"%08d" % i


def _env(path: Path, *, write: bool, map_size: int = _MIN_MAP) -> lmdb.Environment:
    """Single-file, lock-free environment; writers never sync (shard files are fsynced before publishing)."""
    return lmdb.open(
        str(path), subdir=False, readonly=not write, lock=False, readahead=False,
        map_size=map_size, meminit=True, max_dbs=0, sync=False, metasync=False,
    )


#: Read-only environments of this process, one per shard file: (pid, file identity, environment).
_READ_ENVS: dict[str, tuple[int, tuple[int, int, int], lmdb.Environment]] = {}
_READ_ENVS_LOCK = threading.Lock()


def shared_read_env(path: Path, map_size: int) -> lmdb.Environment:
    """The one read-only environment of ``path`` in this process.

    py-lmdb refuses to open an environment twice in one process, and a forked child inherits
    the parent's open environments (and its registry of open paths), so it could never open
    its own: here every reader of a path shares one environment per process, and a child
    closes the inherited one (its own mapping only; the parent's stays open) before opening
    its own. A file replaced on disk (new inode or mtime) gets a new environment.
    """
    key = os.path.realpath(path)
    st = Path(key).stat()
    ident = (st.st_dev, st.st_ino, st.st_mtime_ns)
    pid = os.getpid()
    with _READ_ENVS_LOCK:
        entry = _READ_ENVS.get(key)
        if entry is not None:
            owner, old_ident, env = entry
            if owner == pid and old_ident == ident:
                return env
            env.close()
        env = _env(Path(key), write=False, map_size=map_size)
        _READ_ENVS[key] = (pid, ident, env)
        return env


class LmdbWriter(ShardWriter):
    write_errors = (OSError, lmdb.Error)  # a failed commit (disk full): "mdb_txn_commit: Input/output error"

    def __init__(self, directory: Path, stem: str, spec: SampleSpec, planned: int, compression: str,
                 codecs: ArrayCodecs = RAW) -> None:
        super().__init__(directory, stem, spec, planned, compression, codecs)
        (name,) = self.file_names(stem, spec)
        self._path = self.tmp_path(name)
        hw = spec.size or (512, 512)
        self._map_size = max(_MIN_MAP, int(planned * (spec.sample_nbytes(hw) + 4096) * 1.25))
        self._env = _env(self._path, write=True, map_size=self._map_size)

    @classmethod
    def file_names(cls, stem: str, spec: SampleSpec) -> tuple[str, ...]:
        return (f"shard-{stem}.lmdb",)

    def _put(self, key: bytes, value: bytes) -> None:
        """One put in its own transaction, doubling the map size whenever it is full."""
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    txn.put(key, value)
                return
            except lmdb.MapFullError:
                self._map_size *= 2
                self._env.set_mapsize(self._map_size)

    def add(self, image: np.ndarray, label: np.ndarray, key: str) -> None:
        img = np.ascontiguousarray(image, dtype=np.uint8)
        lab = np.ascontiguousarray(label, dtype=self.spec.stored_label_dtype)
        if self.codecs.raw:
            parts: tuple[Any, Any] = (img.data.cast("B"), lab.data.cast("B"))  # byte views, no copy
        else:
            parts = (self.codecs.image.encode(img), self.codecs.label.encode(lab))
        header = np.array([(img.shape[0], img.shape[1], len(parts[0]), len(parts[1]))], dtype=RECORD_HEADER)
        self._put(sample_key(self.count), b"".join((header.tobytes(), *parts)))  # one copy
        self.count += 1

    def _finish(self) -> None:
        meta: dict[str, Any] = {"format": FORMAT_ID, "format_version": LmdbFormat.version_for("none", self.codecs),
                                "num_samples": self.count}
        if not self.codecs.raw:
            meta["codecs"] = self.codecs.to_json()
        self._put(META_KEY, json.dumps(meta, sort_keys=True).encode())
        self._env.close()  # every commit already wrote its pages; the caller fsyncs the file

    def abort(self) -> None:
        with contextlib.suppress(lmdb.Error, OSError):  # after a failed commit: nothing more to write
            self._env.close()
        super().abort()


class LmdbReader(ShardReader):
    """One read-only environment per process, opened lazily (py-lmdb refuses a second open per process)."""

    _env: Any = None
    #: read-ahead hints: a read-only map of the file (for ``MADV_WILLNEED``) and each record's byte range in it,
    #: built on the first batch read from storage (``_hints_tried``); None when unavailable.
    _hints: tuple[MappedArray, np.ndarray] | None = None
    _hints_tried: bool | None = None

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_env", "_hints", "_hints_tried")

    def prefetch(self, local_indices: Sequence[int] | np.ndarray, cold: bool = True) -> None:
        """``MADV_WILLNEED`` on exactly the file bytes of records ``local_indices`` (sorted, touching ranges
        merged), so that a batch read from storage arrives in a few large requests instead of py-lmdb's
        one 4 KB fault at a time; nothing when not ``cold``. Where the records lie comes from the file's B-tree
        pages (:mod:`shardkit.formats._lmdb_pages`); without a table, no hints."""
        idx = self.hint_indices(local_indices, cold)
        hints = None if idx is None else self._value_hints()
        if idx is None or hints is None:
            return
        mapping, ranges = hints
        picked = ranges[np.sort(idx)]
        mapping.will_need(picked[:, 0], picked[:, 1])

    def _value_hints(self) -> tuple[MappedArray, np.ndarray] | None:
        """The hint table, built once per process: a read-only map of the shard file and the ``(n, 2)`` byte
        ranges of its records, kept only when two of them agree with what LMDB itself returns."""
        if not self._hints_tried:
            self._hints, self._hints_tried = self._build_hints(), True
        return self._hints

    def _build_hints(self) -> tuple[MappedArray, np.ndarray] | None:
        self.ensure_open()
        path, n = self.path(self.shard.files[0].name), len(self)
        try:
            with open(path, "rb") as fh:
                if n == 0 or os.fstat(fh.fileno()).st_size == 0:
                    return None
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            ranges = value_ranges(mm, n)
            if ranges is None or not self._agrees_with_lmdb(mm, ranges):
                mm.close()
                return None
        except (OSError, ValueError, lmdb.Error):
            return None
        mapping = MappedArray(mm, 0)
        mapping.set_random()  # this map is only ever hinted, never read
        return mapping, ranges

    def _agrees_with_lmdb(self, mm: mmap.mmap, ranges: np.ndarray) -> bool:
        """For the first and last record: the table's range is where LMDB's own map holds the value (the same
        distance apart), as long as it, and holds the same first and last bytes in the file."""
        n = len(ranges)
        with self._env.begin(buffers=True) as txn:
            found = [(j, txn.get(sample_key(j))) for j in sorted({0, n - 1})]
            if any(buf is None for _, buf in found):
                return False
            base = np.frombuffer(found[0][1], np.uint8).ctypes.data - int(ranges[found[0][0], 0])
            for j, buf in found:
                begin, end = (int(v) for v in ranges[j])
                k = min(64, end - begin)
                if (np.frombuffer(buf, np.uint8).ctypes.data - base != begin or len(buf) != end - begin
                        or mm[begin : begin + k] != bytes(buf[:k]) or mm[end - k : end] != bytes(buf[len(buf) - k :])):
                    return False
        return True

    def _open(self) -> None:
        path = self.path(self.shard.files[0].name)
        try:
            self._env = shared_read_env(path, max(_MIN_MAP, self.shard.files[0].bytes))
            with self._env.begin(buffers=False) as txn:
                raw = txn.get(META_KEY)
            meta = json.loads(raw) if raw is not None else None
        except (lmdb.Error, ValueError) as exc:
            raise ShardFormatError(f"cannot open LMDB shard ({exc})", path=path, fix="re-convert this split") from None
        want: dict[str, Any] = {"format_version": self.format_version, "num_samples": len(self)}
        if self.format_version >= 2:
            want["codecs"] = self.codecs.to_json()
        if not isinstance(meta, dict) or {k: meta.get(k) for k in want} != want:
            raise ShardFormatError(
                f"LMDB shard metadata {meta!r} disagrees with the manifest ({want})",
                path=path,
                fix="re-convert this split",
            )

    def _parts(self, buf: Any, i: int) -> tuple[int, int, Any, Any]:
        """(H, W, image bytes, label bytes) of one record, its header checked against its length and the spec.

        Version 1 (raw): the byte counts must be exactly the decoded sizes. Version 2: they count encoded
        bytes, which the codec then decodes into exactly the size H and W give (checked there).
        """
        hdr = RECORD_HEADER.itemsize
        if buf is None or len(buf) < hdr:
            raise self.corrupt(f"sample {i} is missing or truncated")
        h, w, ni, nl = (int(v) for v in np.frombuffer(buf, RECORD_HEADER, count=1)[0])
        raw = self.format_version == 1
        if (len(buf) != hdr + ni + nl or self.spec.size not in (None, (h, w)) or h < 1 or w < 1
                or (raw and (ni != h * w * 3 or nl != self.spec.sample_nbytes((h, w)) - h * w * 3))):
            raise self.corrupt(f"sample {i} record ({len(buf)} bytes, {h}x{w}, {ni}+{nl} bytes) disagrees "
                               f"with its header or the manifest")
        self.check_hw(i, h, w)  # a variable-size record's claim is bounded by the manifest's samples[i]
        view = memoryview(buf)
        return h, w, view[hdr : hdr + ni], view[hdr + ni :]

    def decode_record(self, buf: Any, i: int) -> tuple[np.ndarray, np.ndarray]:
        """One record as (image, label): zero-copy views (version 1), or decoded into new arrays (version 2)."""
        h, w, image, label = self._parts(buf, i)
        lab_shape = self.spec.label_shape((h, w))
        if self.format_version == 1:
            img = np.frombuffer(image, np.uint8).reshape(h, w, 3)
            return img, np.frombuffer(label, self.spec.stored_label_dtype).reshape(lab_shape)
        img, lab = np.empty((h, w, 3), np.uint8), np.empty(lab_shape, self.spec.stored_label_dtype)
        self.decode_into("image", image, img, i)
        self.decode_into("label", label, lab, i)
        return img, lab

    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        self.ensure_open()
        hints = self._value_hints() if 0 <= i < len(self) else None
        if hints is not None:  # one request for the record, as npy's and HDF5's single reads (variable-size
            hints[0].will_need_one(int(hints[1][i, 0]), int(hints[1][i, 1]))  # splits are augmented from them)
        try:
            with self._env.begin(buffers=False) as txn:
                return self.decode_record(txn.get(sample_key(i)), i)
        except lmdb.Error as exc:  # a damaged B-tree: MDB_PAGE_NOTFOUND, MDB_CORRUPTED
            raise self.corrupt(f"cannot read sample {i} ({exc})") from None

    def read_batch_into(self, local_indices: Sequence[int] | np.ndarray, out_images: np.ndarray,
                        out_labels: np.ndarray) -> None:
        """:meth:`_read_batch_into`, with LMDB's own errors (a damaged B-tree) as the shard's one-line error."""
        try:
            self._read_batch_into(local_indices, out_images, out_labels)
        except lmdb.Error as exc:
            raise self.corrupt(f"cannot read samples ({exc})") from None

    def _read_batch_into(self, local_indices: Sequence[int] | np.ndarray, out_images: np.ndarray,
                         out_labels: np.ndarray) -> None:
        """One read transaction per run; each record is viewed in place and copied once into ``out``.

        Fixed-size shards take a lean path: every record must be exactly the expected length and
        start with the expected header bytes (one comparison instead of parsing), else the full
        check of :meth:`decode_record` runs and reports what is wrong.
        """
        self.ensure_open()
        idx = [int(i) for i in local_indices]
        n = len(self)
        for i in idx:
            if not 0 <= i < n:
                raise IndexError(f"local index {i} out of range for {n} samples")
        with self._env.begin(buffers=True) as txn:
            if self.spec.size is None:
                for k, i in enumerate(idx):
                    out_images[k], out_labels[k] = self.decode_record(txn.get(sample_key(i)), i)
                return
            if self.format_version >= 2:
                self._decode_batch(txn, idx, out_images, out_labels)
                return
            images = out_images.reshape(len(out_images), -1)
            labels = out_labels.reshape(len(out_labels), -1).view(np.uint8)
            header, ni = self._fixed_header(), images.shape[1]
            start, total = len(header), len(header) + ni + labels.shape[1]
            for k, i in enumerate(idx):
                buf = txn.get(sample_key(i))
                if buf is None or len(buf) != total or buf[:start] != header:
                    self.decode_record(buf, i)  # raises with the details
                    raise self.corrupt(f"sample {i} record does not match the fixed-size header")
                rec = np.frombuffer(buf, np.uint8)
                images[k] = rec[start : start + ni]
                labels[k] = rec[start + ni :]

    def _decode_batch(self, txn: Any, idx: list[int], out_images: np.ndarray, out_labels: np.ndarray) -> None:
        """Version 2, fixed size: every record's parts checked here, then decoded in parallel into ``out[k]``.

        The buffers stay valid while ``txn`` is open (the caller's ``with``), which outlives the pool's work.
        """
        jobs = []
        for k, i in enumerate(idx):
            _, _, image, label = self._parts(txn.get(sample_key(i)), i)
            jobs.append(functools.partial(self._decode_pair, image, label, out_images[k], out_labels[k], i))
        run_parallel(jobs)

    def _decode_pair(self, image: Any, label: Any, out_image: np.ndarray, out_label: np.ndarray, i: int) -> None:
        self.decode_into("image", image, out_image, i)
        self.decode_into("label", label, out_label, i)

    def _fixed_header(self) -> bytes:
        """The record header every sample of a fixed-size shard carries."""
        h, w = self.spec.size  # type: ignore[misc]
        ni = h * w * 3
        return np.array([(h, w, ni, self.spec.sample_nbytes((h, w)) - ni)], dtype=RECORD_HEADER).tobytes()


class LmdbFormat(ShardFormat):
    """``lmdb``: one single-file LMDB environment per shard; version 2 adds per-array codecs."""

    name = "lmdb"
    writer = LmdbWriter
    reader = LmdbReader
    versions = (1, 2)
    image_codecs = ("raw", "zstd", "lz4", "png", "jpeg")
    label_codecs = ("raw", "zstd", "lz4")
    file_patterns = (("shard-", ".lmdb"),)


FORMAT = LmdbFormat
