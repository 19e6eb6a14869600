"""TFRecord shards: ``shard-<stem>.tfrecord`` of ``tf.train.Example`` records plus a ``.tfindex``.

Each record: uint64 LE length, masked CRC32C of the length, an Example (:data:`FEATURES`),
masked CRC32C of the Example. ``--compression gzip`` gzips the whole file (TensorFlow's
``compression_type="GZIP"``). The index has one ``"offset length"`` line per record (the
``tfrecord`` package's format; offsets into the uncompressed stream). Writing uses the
``tfrecord`` package inside pool worker processes only: its protobufs clash with TensorFlow's
in one process. Reading parses framing and protobuf wire format here, so it works next to
TensorFlow. Spec: ``formats/tfrecord.md``.
"""

from __future__ import annotations

import functools
import gzip
import mmap
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import crc32c
import numpy as np

from ..errors import WorkerError
from .base import SampleSpec, ShardReader, ShardWriter

FORMAT_VERSION = 1
GZIP_LEVEL = 6
_MASK_DELTA = 0xA282EAD8
#: feature key → protobuf list type; every feature holds exactly one value.
FEATURES: dict[str, str] = {
    "image/raw": "bytes", "image/height": "int64", "image/width": "int64", "image/channels": "int64",
    "label/raw": "bytes", "label/channels": "int64", "label/dtype": "bytes", "label/encoding": "bytes",
    "label/num_classes": "int64", "key": "bytes",
}


def masked_crc(data: Any) -> int:
    """TFRecord's masked CRC32C of a bytes-like object."""
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _label_channels(spec: SampleSpec) -> int:
    return spec.label_channels or 1


@functools.cache
def _record_writer() -> type:
    """``tfrecord``'s writer, deterministic (sorted feature keys) and optionally gzipped; imported lazily."""
    if "tensorflow" in sys.modules:
        raise WorkerError("the tfrecord writer cannot run in a process that imported TensorFlow",
                          fix="convert through shardkit.pipeline.convert, which writes in worker processes")
    from tfrecord import example_pb2
    from tfrecord.writer import TFRecordWriter

    def feature(value: Any, kind: str) -> Any:
        if kind == "bytes":
            return example_pb2.Feature(bytes_list=example_pb2.BytesList(value=[value]))
        return example_pb2.Feature(int64_list=example_pb2.Int64List(value=[value]))

    class Writer(TFRecordWriter):  # type: ignore[misc, valid-type]
        def __init__(self, path: Path, gzipped: bool) -> None:
            super().__init__(str(path))
            self.raw, self.position = self.file, 0
            if gzipped:
                self.file = gzip.GzipFile(filename="", mode="wb", fileobj=self.raw, compresslevel=GZIP_LEVEL, mtime=0)

        def write(self, datum: dict[str, tuple[Any, str]], sequence_datum: Any = None) -> None:
            """As the package's write, but map keys sorted (its upb order differs between processes)."""
            feats = example_pb2.Features(feature={k: feature(v, kind) for k, (v, kind) in datum.items()})
            record = example_pb2.Example(features=feats).SerializeToString(deterministic=True)
            length = struct.pack("<Q", len(record))
            for part in (length, self.masked_crc(length), record, self.masked_crc(record)):
                self.file.write(part)
            self.position += len(record) + 16

        def close(self) -> None:
            super().close()
            self.raw.close()

    return Writer


class TfrecordWriter(ShardWriter):
    format_name = "tfrecord"
    format_version = FORMAT_VERSION
    needs_subprocess = True

    def __init__(self, directory: Path, stem: str, spec: SampleSpec, planned: int, compression: str) -> None:
        super().__init__(directory, stem, spec, planned, compression)
        data_name, _ = self.file_names(stem, spec)
        self._out = _record_writer()(self.tmp_path(data_name), compression == "gzip")
        self._index: list[str] = []

    @classmethod
    def file_names(cls, stem: str, spec: SampleSpec) -> tuple[str, ...]:
        return (f"shard-{stem}.tfrecord", f"shard-{stem}.tfindex")

    @classmethod
    def format_options(cls, spec: SampleSpec, compression: str) -> dict[str, Any]:
        return {**super().format_options(spec, compression),
                "tf_compression_type": "GZIP" if compression == "gzip" else "",
                "index": "tfrecord-text", "label_dtype": spec.stored_label_dtype.name, "label_byte_order": "little",
                "features": {k: {"type": kind, "shape": []} for k, kind in FEATURES.items()}}

    def add(self, image: np.ndarray, label: np.ndarray, key: str) -> None:
        img, lab = self.stored(image, label)
        values = (img.tobytes(), img.shape[0], img.shape[1], 3, lab.tobytes(), _label_channels(self.spec), lab.dtype.name.encode(), self.spec.label_encoding.encode(),
                  self.spec.num_classes, key.encode())
        start = self._out.position
        self._out.write({k: (v, kind) for (k, kind), v in zip(FEATURES.items(), values, strict=True)})
        self._index.append(f"{start} {self._out.position - start}\n")
        self.count += 1

    def _finish(self) -> None:
        self._out.close()
        self.tmp_path(self.file_names(self.stem, self.spec)[1]).write_text("".join(self._index), encoding="ascii")


def _varint(buf: Any, pos: int) -> tuple[int, int]:
    result = shift = 0
    while shift < 70:
        byte = buf[pos]
        result |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return result, pos
    raise ValueError("varint longer than 10 bytes")


def _fields(buf: Any, start: int, end: int) -> Any:
    """(field number, wire type, int value or (start, end) of a length-delimited payload) of one message."""
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos)
        wire = tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield tag >> 3, wire, value
        elif wire == 2:
            n, pos = _varint(buf, pos)
            yield tag >> 3, wire, (pos, pos + n)
            pos += n
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if pos != end:
        raise ValueError("message runs past its end")


def parse_example(buf: Any, start: int, end: int) -> dict[str, list[Any]]:
    """Serialized tf.train.Example → {key: [byte spans (start, end)] or [int64 values]} (floats unsupported)."""
    out: dict[str, list[Any]] = {}
    for _, _, feats in (f for f in _fields(buf, start, end) if f[:2] == (1, 2)):  # Example.features
        for _, _, entry in (f for f in _fields(buf, *feats) if f[:2] == (1, 2)):  # map<string, Feature>
            parts = {num: v for num, wire, v in _fields(buf, *entry) if wire == 2}
            key = bytes(buf[parts[1][0]:parts[1][1]]).decode() if 1 in parts else ""
            values: list[Any] = []
            for kind, _, lst in _fields(buf, *parts.get(2, (0, 0))):  # Feature: 1 bytes, 3 int64 lists
                for _, wire, v in _fields(buf, *lst):
                    if kind == 1:
                        values.append(v)
                    elif kind == 3 and wire == 0:
                        values.append(v)
                    elif kind == 3:  # packed varints
                        pos = v[0]
                        while pos < v[1]:
                            x, pos = _varint(buf, pos)
                            values.append(x)
            out[key] = [x - (1 << 64) if isinstance(x, int) and x >= 1 << 63 else x for x in values]
    return out


class TfrecordReader(ShardReader):
    """Random access through the index: the file is memory-mapped, or (gzip) decompressed once per process."""

    _buf: Any = None
    _index: np.ndarray | None = None

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_buf", "_index")

    def _open(self) -> None:
        data, index = (self.path(f.name) for f in self.shard.files)
        try:
            if self.format_options.get("compression") == "gzip":
                self._buf = gzip.decompress(data.read_bytes())
            else:
                with open(data, "rb") as fh:
                    self._buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if data.stat().st_size else b""
            self._index = np.array([[int(x) for x in ln.split()] for ln in index.read_text("ascii").splitlines()],
                                   dtype=np.int64).reshape(-1, 2)
        except (OSError, EOFError, zlib.error, ValueError) as exc:
            raise self.corrupt(f"cannot read TFRecord shard ({exc})") from None
        starts, lengths = self._index[:, 0], self._index[:, 1]
        if (len(self._index) != len(self) or np.any(lengths < 16) or np.any(starts != np.cumsum(lengths) - lengths)
                or int(lengths.sum()) != len(self._buf)):
            raise self.corrupt(f"the index ({len(self._index)} records, {int(lengths.sum())} bytes) disagrees with "
                               f"the manifest ({len(self)} samples) or the data ({len(self._buf)} bytes)",
                               self.shard.files[1].name)

    def record(self, i: int) -> tuple[memoryview, int, int]:
        """(buffer, start, end) of local record ``i``'s Example bytes, framing and CRCs checked."""
        self.ensure_open()
        assert self._index is not None
        start, length = (int(v) for v in self._index[i])
        buf = memoryview(self._buf)
        (n,) = struct.unpack_from("<Q", buf, start)
        body = start + 12
        if n + 16 != length:
            raise self.corrupt(f"record {i} says {n} bytes, the index {length - 16}")
        if struct.unpack_from("<I", buf, start + 8)[0] != masked_crc(buf[start:start + 8]) or (
                struct.unpack_from("<I", buf, body + n)[0] != masked_crc(buf[body:body + n])):
            raise self.corrupt(f"record {i} fails its CRC32C check")
        return buf, body, body + n

    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        buf, start, end = self.record(i)
        try:
            f = parse_example(buf, start, end)
            h, w, c = (int(f[k][0]) for k in ("image/height", "image/width", "image/channels"))
            img, lab = (np.frombuffer(buf[a:b], np.uint8) for a, b in (f["image/raw"][0], f["label/raw"][0]))
            image = img.reshape(h, w, c)
            label = lab.view(self.spec.stored_label_dtype).reshape(self.spec.label_shape((h, w)))
            meta = (c, bytes(buf[slice(*f["label/encoding"][0])]).decode(), int(f["label/num_classes"][0]))
        except (ValueError, KeyError, IndexError) as exc:
            raise self.corrupt(f"record {i} is not a shardkit Example ({type(exc).__name__}: {exc})") from None
        if meta != (3, self.spec.label_encoding, self.spec.num_classes):
            raise self.corrupt(f"record {i} (channels, encoding, classes) {meta} disagree with the manifest")
        return image, label
