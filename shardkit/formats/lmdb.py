"""LMDB shards: one single-file environment per shard, one key per sample.

Key ``b"%08d" % i`` (local index) → value = 16-byte little-endian header
(:data:`RECORD_HEADER`: height, width, image bytes, label bytes) + image bytes + label
bytes. Key ``__shardkit__`` holds a JSON object with the format version and count.
Format version 2 stores each array through its codec (``shardkit.codecs.registry``: zstd, lz4,
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from ..codecs.registry import RAW, ArrayCodecs, run_parallel
from ..errors import ShardFormatError
from ._lmdb_pages import META_KEY, LmdbLayoutError, RecordTable, check_overflow, read_table
from .base import SampleSpec, ShardFormat, ShardReader, ShardWriter
from .mapping import MappedArray

FORMAT_ID = "shardkit-lmdb"
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
        img, lab = self.stored(image, label)
        if self.codecs.raw:
            parts: tuple[Any, Any] = (img.data.cast("B"), lab.data.cast("B"))  # byte views, no copy
        else:
            parts = (self.codecs.image.encode(img), self.codecs.label.encode(lab))
        header = np.array([(img.shape[0], img.shape[1], len(parts[0]), len(parts[1]))], dtype=RECORD_HEADER)
        self._put(sample_key(self.count), b"".join((header.tobytes(), *parts)))  # one copy
        self.count += 1

    def _finish(self) -> None:
        version = LmdbFormat.version_for("none", self.codecs, self.spec)
        meta: dict[str, Any] = {"format": FORMAT_ID, "format_version": version, "num_samples": self.count}
        if version >= 2:
            meta["codecs"] = self.codecs.to_json()
        self._put(META_KEY, json.dumps(meta, sort_keys=True).encode())
        self._env.close()  # every commit already wrote its pages; the caller fsyncs the file

    def abort(self) -> None:
        with contextlib.suppress(lmdb.Error, OSError):  # after a failed commit: nothing more to write
            self._env.close()
        super().abort()


class LmdbReader(ShardReader):
    """Reads records through its own checked walk of the file's B-tree (:mod:`._lmdb_pages`), never through
    the LMDB library, from a read-only memory map opened lazily in each process.

    LMDB trusts its file: it copies whatever size a leaf node states out of its map, so one flipped bit in a
    shard killed the process (SIGSEGV, or SIGBUS for an overflow page past the end of the file). The walk
    checks every page number, node and value range against its page and the file's size once per process,
    and each read checks its record's overflow page header, so a damaged shard is a one-line
    :class:`ShardFormatError` naming the shard and the sample. Records are zero-copy views of the map (version
    1) or decoded from it (version 2); the same table gives read-ahead hints (``MADV_WILLNEED``).
    """

    #: this process's read-only map of the file (``MappedArray``: also the read-ahead hints) and record table
    _mapping: MappedArray | None = None
    _table: RecordTable | None = None

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_mapping", "_table")

    def prefetch(self, local_indices: Sequence[int] | np.ndarray, cold: bool = True) -> None:
        """``MADV_WILLNEED`` on exactly the file bytes of records ``local_indices`` (sorted, touching ranges
        merged), so that a batch read from storage arrives in a few large requests instead of one 4 KB fault
        at a time; nothing when not ``cold``. Missing (damaged) records are left to the read to report."""
        idx = self.hint_indices(local_indices, cold)
        if idx is None or self._mapping is None or self._table is None:
            return
        picked = self._table.ranges[np.sort(idx)]
        picked = picked[picked[:, 0] >= 0]
        self._mapping.will_need(picked[:, 0], picked[:, 1])

    def _open(self) -> None:
        self._mapping = self._table = None
        path = self.path(self.shard.files[0].name)
        try:
            with open(path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size == 0:
                    raise LmdbLayoutError("the file is empty")
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            table = read_table(mm, len(self))
        except (OSError, LmdbLayoutError) as exc:
            raise self.corrupt(f"not a readable LMDB shard: {exc}") from None
        self.check_meta(bytes(mm[table.meta[0] : table.meta[1]]) if table.meta is not None else None, table,
                        path)
        self._mapping, self._table = MappedArray(mm, 0), table
        self._mapping.set_random()  # read-around off, as LMDB's readahead=False: reads are hinted range by range

    def check_meta(self, raw: bytes | None, table: RecordTable, where: Any) -> None:
        """Refuse a shard whose metadata record (``raw``; None when the walk found none) disagrees with the
        manifest (format version, sample count, codecs)."""
        meta: Any = None
        if raw is not None:
            try:
                meta = json.loads(raw)
            except (ValueError, RecursionError):
                meta = None
        want: dict[str, Any] = {"format_version": self.format_version, "num_samples": len(self)}
        if self.format_version >= 2:
            want["codecs"] = self.codecs.to_json()
        if not isinstance(meta, dict) or {k: meta.get(k) for k in want} != want:
            detail = f"{meta!r}"[:200] if raw is not None else f"missing ({table.problem or 'no record'})"
            raise ShardFormatError(f"LMDB shard metadata {detail} disagrees with the manifest ({want})",
                                   path=where, fix="re-convert this split")

    def record(self, i: int) -> memoryview:
        """Local record ``i``'s bytes, a read-only view of the map, checked to lie in the file."""
        self.ensure_open()
        table, mapping = self._table, self._mapping
        if table is None or mapping is None:  # pragma: no cover - _open sets both or raises
            raise self.corrupt("the shard is not open")
        if not 0 <= i < len(self):
            raise IndexError(f"local index {i} out of range for {len(self)} samples")
        begin, end = (int(v) for v in table.ranges[i])
        if begin < 0:
            raise self.corrupt(f"sample {i} cannot be found in the LMDB B-tree (the file is damaged: "
                               f"{table.problem or 'no such record'})")
        problem = check_overflow(mapping.mm, table, i)
        if problem is not None:
            raise self.corrupt(f"sample {i}: {problem}")
        return memoryview(mapping.mm)[begin:end]

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
                or (raw and (ni != self.spec.image_nbytes((h, w))
                             or nl != self.spec.sample_nbytes((h, w)) - self.spec.image_nbytes((h, w))))):
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
            img = np.frombuffer(image, self.spec.stored_image_dtype).reshape(self.spec.image_shape((h, w)))
            return img, np.frombuffer(label, self.spec.stored_label_dtype).reshape(lab_shape)
        img = np.empty(self.spec.image_shape((h, w)), self.spec.stored_image_dtype)
        lab = np.empty(lab_shape, self.spec.stored_label_dtype)
        self.decode_into("image", image, img, i)
        self.decode_into("label", label, lab, i)
        return img, lab

    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        buf = self.record(i)
        table, mapping = self._table, self._mapping  # set: record(i) succeeded
        if table is not None and mapping is not None:  # one request for the record, as npy's and HDF5's reads
            mapping.will_need_one(int(table.ranges[i, 0]), int(table.ranges[i, 1]))
        return self.decode_record(buf, i)

    def read_batch_into(self, local_indices: Sequence[int] | np.ndarray, out_images: np.ndarray,
                        out_labels: np.ndarray) -> None:
        """Each record viewed in place and copied (or decoded) once into ``out``.

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
        if self.spec.size is None:
            for k, i in enumerate(idx):
                out_images[k], out_labels[k] = self.decode_record(self.record(i), i)
            return
        if self.format_version >= 2:
            self._decode_batch(idx, out_images, out_labels)
            return
        images = out_images.reshape(len(out_images), -1)
        labels = out_labels.reshape(len(out_labels), -1).view(np.uint8)
        header, ni = self._fixed_header(), images.shape[1]
        start, total = len(header), len(header) + ni + labels.shape[1]
        for k, i in enumerate(idx):
            buf = self.record(i)
            if len(buf) != total or buf[:start] != header:
                self.decode_record(buf, i)  # raises with the details
                raise self.corrupt(f"sample {i} record does not match the fixed-size header")
            rec = np.frombuffer(buf, np.uint8)
            images[k] = rec[start : start + ni]
            labels[k] = rec[start + ni :]

    def _decode_batch(self, idx: list[int], out_images: np.ndarray, out_labels: np.ndarray) -> None:
        """Version 2, fixed size: every record's parts checked here, then decoded in parallel into ``out[k]``."""
        jobs = []
        for k, i in enumerate(idx):
            _, _, image, label = self._parts(self.record(i), i)
            jobs.append(functools.partial(self._decode_pair, image, label, out_images[k], out_labels[k], i))
        run_parallel(jobs)

    def _decode_pair(self, image: Any, label: Any, out_image: np.ndarray, out_label: np.ndarray, i: int) -> None:
        self.decode_into("image", image, out_image, i)
        self.decode_into("label", label, out_label, i)

    def _fixed_header(self) -> bytes:
        """The record header every sample of a fixed-size shard carries."""
        h, w = self.spec.size  # type: ignore[misc]
        ni = self.spec.image_nbytes((h, w))
        return np.array([(h, w, ni, self.spec.sample_nbytes((h, w)) - ni)], dtype=RECORD_HEADER).tobytes()


class LmdbFormat(ShardFormat):
    """``lmdb``: one single-file LMDB environment per shard; version 2 adds per-array codecs."""

    name = "lmdb"
    writer = LmdbWriter
    reader = LmdbReader
    versions = (1, 2, 3)
    image_codecs = ("raw", "zstd", "lz4", "png", "jpeg")
    label_codecs = ("raw", "zstd", "lz4")
    file_patterns = (("shard-", ".lmdb"),)


FORMAT = LmdbFormat
