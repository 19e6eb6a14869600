"""TFRecord shards: ``shard-<stem>.tfrecord`` of ``tf.train.Example`` records plus ``shard-<stem>.tfindex``.

Record framing: uint64 LE length, masked CRC32C of the length, the Example, masked CRC32C
of the Example. ``--compression gzip`` gzips the whole file (TensorFlow's ``"GZIP"``). The
index is the ``tfrecord`` package's: one ``"offset length"`` line per record, offsets into
the uncompressed stream. Writing uses the ``tfrecord`` package, in pool worker processes
only (its protobufs clash with TensorFlow's in one process); reading parses framing and
protobuf wire format here, so it works next to TensorFlow. Spec: ``formats/tfrecord.md``.
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
#: feature key → protobuf list type; each feature holds exactly one value.
FEATURES: dict[str, str] = {
    "image/raw": "bytes", "image/height": "int64", "image/width": "int64", "image/channels": "int64",
    "label/raw": "bytes", "label/channels": "int64", "label/dtype": "bytes", "label/encoding": "bytes",
    "label/num_classes": "int64", "key": "bytes",
}


def masked_crc(data: Any) -> int:
    """TFRecord's masked CRC32C of a bytes-like object."""
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@functools.cache
def _record_writer() -> type:
    """The ``tfrecord`` package's writer, made deterministic and gzip-capable; imported on first use."""
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
            self.raw, self.position = self.file, 0  # position: offset in the uncompressed stream
            if gzipped:
                self.file = gzip.GzipFile("", "wb", GZIP_LEVEL, self.raw, mtime=0)

        def write(self, datum: dict[str, tuple[Any, str]], sequence_datum: Any = None) -> None:
            """The package's framing, but map keys sorted: upb's map order differs between processes."""
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
        self._out = _record_writer()(self.tmp_files[0], compression == "gzip")
        self._index: list[str] = []

    @classmethod
    def file_names(cls, stem: str, spec: SampleSpec) -> tuple[str, ...]:
        return (f"shard-{stem}.tfrecord", f"shard-{stem}.tfindex")

    @classmethod
    def format_options(cls, spec: SampleSpec, compression: str) -> dict[str, Any]:
        """The feature spec (enough for ``tf.io.parse_example``) and how to decode the raw bytes."""
        features: dict[str, Any] = {k: {"type": kind, "shape": []} for k, kind in FEATURES.items()}
        hw = ["image/height", "image/width"]
        features["image/raw"]["decode"] = {"dtype": "uint8", "shape": [*hw, "image/channels"]}
        features["label/raw"]["decode"] = {"dtype": spec.stored_label_dtype.name, "byte_order": "little",
                                           "shape": [*hw, "label/channels"]}
        return {**super().format_options(spec, compression), "features": features, "index": "tfindex",
                "tf_compression_type": "GZIP" if compression == "gzip" else ""}

    def add(self, image: np.ndarray, label: np.ndarray, key: str) -> None:
        img, lab = self.stored(image, label)
        spec = self.spec
        values = {"image/raw": img.tobytes(), "image/height": img.shape[0], "image/width": img.shape[1],
                  "image/channels": 3, "label/raw": lab.tobytes(), "label/channels": spec.label_channels or 1,
                  "label/dtype": lab.dtype.name.encode(), "label/encoding": spec.label_encoding.encode(),
                  "label/num_classes": spec.num_classes, "key": key.encode()}
        start = self._out.position
        self._out.write({k: (values[k], kind) for k, kind in FEATURES.items()})
        self._index.append(f"{start} {self._out.position - start}\n")
        self.count += 1

    def _finish(self) -> None:
        self._out.close()
        self.tmp_files[1].write_text("".join(self._index), encoding="ascii")


def _varint(buf: Any, pos: int) -> tuple[int, int]:
    result = shift = 0
    while shift < 70:
        byte = buf[pos]
        result, pos, shift = result | (byte & 0x7F) << shift, pos + 1, shift + 7
        if not byte & 0x80:
            return result, pos
    raise ValueError("varint longer than 10 bytes")


def _fields(buf: Any, start: int, end: int) -> Any:
    """(field number, wire type, varint value or (start, end) of a length-delimited payload) of a message."""
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos)
        if tag & 7 == 0:
            value, pos = _varint(buf, pos)
            yield tag >> 3, 0, value
        elif tag & 7 == 2:
            n, pos = _varint(buf, pos)
            yield tag >> 3, 2, (pos, pos + n)
            pos += n
        elif tag & 7 in (1, 5):
            pos += 8 if tag & 7 == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {tag & 7}")
    if pos != end:
        raise ValueError("message runs past its end")


def parse_example(buf: Any, start: int, end: int) -> dict[str, list[Any]]:
    """A serialized Example → {key: [(start, end) byte spans] or [int64 values]}; float lists are skipped."""
    out: dict[str, list[Any]] = {}
    for _, _, feats in (f for f in _fields(buf, start, end) if f[:2] == (1, 2)):  # Example.features
        for _, _, entry in (f for f in _fields(buf, *feats) if f[:2] == (1, 2)):  # map<string, Feature>
            parts = {num: v for num, wire, v in _fields(buf, *entry) if wire == 2}
            values: list[Any] = []
            for kind, _, lst in _fields(buf, *parts.get(2, (0, 0))):  # 1 BytesList, 3 Int64List
                for _, wire, v in _fields(buf, *lst):
                    if kind == 3 and wire == 2:  # packed varints
                        pos = v[0]
                        while pos < v[1]:
                            x, pos = _varint(buf, pos)
                            values.append(x - (1 << 64) if x >> 63 else x)
                    elif kind in (1, 3):
                        values.append(v - (1 << 64) if kind == 3 and v >> 63 else v)
            out[bytes(buf[slice(*parts.get(1, (0, 0)))]).decode()] = values
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
            elif data.stat().st_size:
                with open(data, "rb") as fh:
                    self._buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            else:
                self._buf = b""
            lines = index.read_text("ascii").splitlines()
            self._index = np.array([[int(x) for x in ln.split()] for ln in lines], np.int64).reshape(-1, 2)
        except (OSError, EOFError, zlib.error, ValueError) as exc:
            raise self.corrupt(f"cannot read TFRecord shard ({exc})") from None
        starts, lengths = self._index[:, 0], self._index[:, 1]
        total = int(lengths.sum())
        contiguous = np.array_equal(starts, np.cumsum(lengths) - lengths) and not np.any(lengths < 16)
        if len(lengths) != len(self) or not contiguous or total != len(self._buf):
            raise self.corrupt(f"the index ({len(lengths)} records, {total} bytes) disagrees with the "
                               f"manifest ({len(self)} samples) or the data ({len(self._buf)} bytes)",
                               self.shard.files[1].name)

    def record(self, i: int) -> tuple[memoryview, int, int]:
        """(buffer, start, end) of local record ``i``'s Example bytes; framing and both CRCs checked."""
        self.ensure_open()
        assert self._index is not None
        start, length = (int(v) for v in self._index[i])
        buf = memoryview(self._buf)
        n, length_crc = struct.unpack_from("<QI", buf, start)
        body = start + 12
        if n + 16 != length:
            raise self.corrupt(f"record {i} says {n} bytes, the index {length - 16}")
        if length_crc != masked_crc(buf[start : start + 8]) or (
                struct.unpack_from("<I", buf, body + n)[0] != masked_crc(buf[body : body + n])):
            raise self.corrupt(f"record {i} fails its CRC32C check")
        return buf, body, body + n

    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        buf, start, end = self.record(i)
        try:
            f = parse_example(buf, start, end)
            h, w, c = (int(f[k][0]) for k in ("image/height", "image/width", "image/channels"))
            image = np.frombuffer(buf[slice(*f["image/raw"][0])], np.uint8).reshape(h, w, c)
            label = np.frombuffer(buf[slice(*f["label/raw"][0])], self.spec.stored_label_dtype)
            label = label.reshape(self.spec.label_shape((h, w)))
            meta = (c, bytes(buf[slice(*f["label/encoding"][0])]).decode(), int(f["label/num_classes"][0]))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise self.corrupt(f"record {i} is not a shardkit Example ({type(exc).__name__} {exc})") from None
        if meta != (3, self.spec.label_encoding, self.spec.num_classes):
            raise self.corrupt(f"record {i}: (channels, encoding, classes) {meta} disagree with the manifest")
        return image, label
