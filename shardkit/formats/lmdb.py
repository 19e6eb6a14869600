"""LMDB shards: one single-file environment per shard, one key per sample.

Key ``b"%08d" % i`` (local index) → value = 16-byte little-endian header
(:data:`RECORD_HEADER`: height, width, image bytes, label bytes) + image bytes + label
bytes. Key ``__shardkit__`` holds a JSON object with the format version and count.
The map size grows automatically while writing. Spec: ``formats/lmdb.md``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from ..errors import ShardFormatError
from .base import SampleSpec, ShardReader, ShardWriter

FORMAT_VERSION = 1
META_KEY = b"__shardkit__"
RECORD_HEADER = np.dtype([("height", "<u4"), ("width", "<u4"), ("image_nbytes", "<u4"), ("label_nbytes", "<u4")])
_MIN_MAP = 1 << 20


def sample_key(i: int) -> bytes:
    return b"%08d" % i


def _env(path: Path, *, write: bool, map_size: int = _MIN_MAP) -> lmdb.Environment:
    """Single-file, lock-free environment; writers sync once at the end (the base class fsyncs too)."""
    return lmdb.open(
        str(path), subdir=False, readonly=not write, lock=False, readahead=False,
        map_size=map_size, meminit=False, max_dbs=0, sync=False, metasync=False,
    )


class LmdbWriter(ShardWriter):
    format_name = "lmdb"
    format_version = FORMAT_VERSION

    def __init__(self, directory: Path, stem: str, spec: SampleSpec, planned: int, compression: str) -> None:
        super().__init__(directory, stem, spec, planned, compression)
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
        header = np.array([(img.shape[0], img.shape[1], img.nbytes, lab.nbytes)], dtype=RECORD_HEADER)
        self._put(sample_key(self.count), header.tobytes() + img.tobytes() + lab.tobytes())
        self.count += 1

    def _finish(self) -> None:
        meta = {"format": "shardkit-lmdb", "format_version": FORMAT_VERSION, "num_samples": self.count}
        self._put(META_KEY, json.dumps(meta, sort_keys=True).encode())
        self._env.sync(True)
        self._env.close()


class LmdbReader(ShardReader):
    """One read-only environment per process, opened lazily (py-lmdb refuses a second open per process)."""

    _env: Any = None

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_env",)

    def _open(self) -> None:
        path = self.path(self.shard.files[0].name)
        try:
            self._env = _env(path, write=False, map_size=max(_MIN_MAP, self.shard.files[0].bytes))
            with self._env.begin(buffers=False) as txn:
                raw = txn.get(META_KEY)
            meta = json.loads(raw) if raw is not None else None
        except (lmdb.Error, ValueError) as exc:
            raise ShardFormatError(f"cannot open LMDB shard ({exc})", path=path, fix="re-convert this split") from None
        if not meta or meta.get("format_version") != FORMAT_VERSION or meta.get("num_samples") != len(self):
            raise ShardFormatError(
                f"LMDB shard metadata {meta!r} disagrees with the manifest (format version {FORMAT_VERSION}, "
                f"{len(self)} samples)",
                path=path,
                fix="re-convert this split",
            )

    def decode_record(self, buf: Any, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Zero-copy views over one record buffer."""
        if buf is None or len(buf) < RECORD_HEADER.itemsize:
            raise ShardFormatError(f"sample {i} is missing or truncated", path=self.path(self.shard.files[0].name),
                                   fix="re-convert this split")
        h, w, ni, nl = (int(v) for v in np.frombuffer(buf, RECORD_HEADER, count=1)[0])
        img = np.frombuffer(buf, np.uint8, count=ni, offset=RECORD_HEADER.itemsize).reshape(h, w, 3)
        lab = np.frombuffer(buf, self.spec.stored_label_dtype, offset=RECORD_HEADER.itemsize + ni)
        return img, lab.reshape(self.spec.label_shape((h, w)))

    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        self.ensure_open()
        with self._env.begin(buffers=False) as txn:
            return self.decode_record(txn.get(sample_key(i)), i)
