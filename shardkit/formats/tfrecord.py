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

from ..errors import ShardFormatError, WorkerError
from .base import SampleSpec, ShardReader, ShardWriter

FORMAT_VERSION = 1
GZIP_LEVEL = 6
#: feature key → protobuf list type; each feature holds exactly one value.
FEATURES: dict[str, str] = {
    "image/raw": "bytes", "image/height": "int64", "image/width": "int64", "image/channels": "int64",
    "label/raw": "bytes", "label/channels": "int64", "label/dtype": "bytes", "label/encoding": "bytes",
    "label/num_classes": "int64", "key": "bytes",
}


def mask(crc: int) -> int:
    """TFRecord's masking of a CRC32C value."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc(data: Any) -> int:
    """TFRecord's masked CRC32C of a bytes-like object."""
    return mask(crc32c.crc32c(data))


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

    class Writer(TFRecordWriter):
        file: Any  # the package's output stream; a GzipFile over it when gzipped

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
    byte = buf[pos]
    if byte < 0x80:  # one-byte varints (tags, short lengths, small ints) are nearly all of them
        return byte, pos + 1
    result, shift, pos = byte & 0x7F, 7, pos + 1
    while shift < 70:
        byte = buf[pos]
        result, pos = result | (byte & 0x7F) << shift, pos + 1
        if byte < 0x80:
            return result, pos
        shift += 7
    raise ValueError("varint longer than 10 bytes")


def _fields(buf: Any, start: int, end: int) -> list[tuple[int, int, Any]]:
    """(field number, wire type, varint value or (start, end) of a length-delimited payload) of a message."""
    out: list[tuple[int, int, Any]] = []
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos)
        wire = tag & 7
        if wire == 2:
            n, pos = _varint(buf, pos)
            out.append((tag >> 3, 2, (pos, pos + n)))
            pos += n
        elif wire == 0:
            value, pos = _varint(buf, pos)
            out.append((tag >> 3, 0, value))
        elif wire == 1 or wire == 5:
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if pos != end:
        raise ValueError("message runs past its end")
    return out


def _int64(x: int) -> int:
    return x - (1 << 64) if x >> 63 else x


def parse_example(buf: Any, start: int, end: int) -> dict[str, list[Any]]:
    """A serialized Example → {key: [(start, end) byte spans] or [int64 values]}; float lists are skipped."""
    out: dict[str, list[Any]] = {}
    for num, wire, feats in _fields(buf, start, end):
        if num != 1 or wire != 2:  # Example.features
            continue
        for num, wire, entry in _fields(buf, *feats):
            if num != 1 or wire != 2:  # map<string, Feature>
                continue
            key, feature = (0, 0), (0, 0)
            for num, wire, v in _fields(buf, *entry):
                if wire == 2:
                    if num == 1:
                        key = v
                    elif num == 2:
                        feature = v
            values: list[Any] = []
            for kind, _, lst in _fields(buf, *feature):  # 1 BytesList, 3 Int64List
                if kind != 1 and kind != 3:
                    continue
                for _, wire, v in _fields(buf, *lst):
                    if kind == 3 and wire == 2:  # packed varints
                        pos, stop = v
                        while pos < stop:
                            x, pos = _varint(buf, pos)
                            values.append(_int64(x))
                    else:
                        values.append(_int64(v) if kind == 3 else v)
            out[bytes(buf[key[0] : key[1]]).decode()] = values
    return out


class TfrecordReader(ShardReader):
    """Random access through the index: the file is memory-mapped, or (gzip) decompressed once per process.

    Every read checks the record's framing and both CRC32Cs. The Example is parsed and checked against the
    manifest on a record's first read in a process; what that parse found (where the image and label bytes
    lie, H and W) is kept with the data CRC it was found under, and reused only while a later read's data
    CRC, verified against the bytes again, is that same value — i.e. only for the same bytes (up to a CRC32C
    collision, which the per-read check could not catch either). Any other CRC means a fresh parse.
    """

    # Set by _open (ensure_open runs it before any read) and dropped when pickled.
    _buf: Any
    _view: memoryview
    _index: np.ndarray
    _layouts: dict[int, tuple[int, int, int, int, int]]

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_buf", "_view", "_index", "_layouts")

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
        self._view, self._layouts = memoryview(self._buf), {}
        starts, lengths = self._index[:, 0], self._index[:, 1]
        total = int(lengths.sum())
        contiguous = np.array_equal(starts, np.cumsum(lengths) - lengths) and not np.any(lengths < 16)
        if len(lengths) != len(self) or not contiguous or total != len(self._buf):
            raise self.corrupt(f"the index ({len(lengths)} records, {total} bytes) disagrees with the "
                               f"manifest ({len(self)} samples) or the data ({len(self._buf)} bytes)",
                               self.shard.files[1].name)
        self._starts = starts.tolist()  # Python ints: no per-read NumPy scalar conversions
        self._lengths = lengths.tolist()

    def _framed(self, i: int) -> tuple[int, int, int]:
        """(start, end, stored data CRC) of local record ``i``'s Example bytes; length field and its CRC checked."""
        start, length = self._starts[i], self._lengths[i]
        buf = self._view
        n, length_crc = struct.unpack_from("<QI", buf, start)
        body = start + 12
        if n + 16 != length:
            raise self.corrupt(f"record {i} says {n} bytes, the index {length - 16}")
        if length_crc != masked_crc(buf[start : start + 8]):
            raise self.corrupt(f"record {i} fails its CRC32C check")
        return body, body + n, struct.unpack_from("<I", buf, body + n)[0]

    def _checked(self, i: int) -> tuple[int, int, int]:
        """(start, end, stored data CRC) of local record ``i``'s Example bytes; framing and both CRCs checked."""
        body, end, data_crc = self._framed(i)
        if data_crc != masked_crc(self._view[body:end]):
            raise self.corrupt(f"record {i} fails its CRC32C check")
        return body, end, data_crc

    def _layout(self, i: int) -> tuple[int, int, int, int, int]:
        """(data CRC, image offset, label offset, H, W) of record ``i`` (open), CRCs checked on this read."""
        start, end, crc = self._checked(i)
        known = self._layouts.get(i)
        if known is None or known[0] != crc:
            known = self._layouts[i] = (crc, *self._parse(i, start, end))
        return known

    def _parse(self, i: int, start: int, end: int) -> tuple[int, int, int, int]:
        """(image offset, label offset, H, W) of the Example at ``start:end``, checked against the manifest."""
        buf, spec = self._view, self.spec
        try:
            f = parse_example(buf, start, end)
            h, w, c = (int(f[k][0]) for k in ("image/height", "image/width", "image/channels"))
            (img_start, img_end), (lab_start, lab_end) = f["image/raw"][0], f["label/raw"][0]
            meta = (c, int(f["label/channels"][0]), bytes(buf[slice(*f["label/dtype"][0])]).decode(),
                    bytes(buf[slice(*f["label/encoding"][0])]).decode(), int(f["label/num_classes"][0]))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise self.corrupt(f"record {i} is not a shardkit Example ({type(exc).__name__} {exc})") from None
        want = (3, spec.label_channels or 1, spec.stored_label_dtype.name, spec.label_encoding, spec.num_classes)
        if meta != want:
            raise self.corrupt(f"record {i}: (channels, label channels, dtype, encoding, classes) {meta} "
                               f"disagree with the manifest {want}")
        lab_bytes = int(np.prod(spec.label_shape((h, w)))) * spec.stored_label_dtype.itemsize
        if h <= 0 or w <= 0 or img_end - img_start != h * w * 3 or lab_end - lab_start != lab_bytes:
            raise self.corrupt(f"record {i}: image/label bytes ({img_end - img_start}, {lab_end - lab_start}) "
                               f"do not fit its height and width {h}x{w}")
        if spec.size not in (None, (h, w)):
            raise self.corrupt(f"record {i} is {h}x{w}, the manifest says {spec.size[0]}x{spec.size[1]}")
        return img_start, lab_start, h, w

    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        self.ensure_open()
        _, img, lab, h, w = self._layout(i)
        spec = self.spec
        image = np.frombuffer(self._buf, np.uint8, h * w * 3, img).reshape(h, w, 3)
        shape = spec.label_shape((h, w))
        label = np.frombuffer(self._buf, spec.stored_label_dtype, int(np.prod(shape)), lab).reshape(shape)
        return image, label

    def _read_fixed_batch(self, idx: np.ndarray, out_images: np.ndarray, out_labels: np.ndarray) -> bool:
        """One checked record per sample, copied once from the buffer into ``out_*``.

        The length field and its CRC are checked first. The image and label are then copied and the data
        CRC computed over the Example bytes around them plus the copies themselves, each just after it was
        made (still in cache): one pass over the shard's memory instead of two, and the CRC vouches for
        exactly the bytes delivered. A record's first read in the process parses its (not yet verified)
        Example to find the image and label; the layout is kept only once the CRC has passed, and a parse
        or manifest failure reports a CRC failure instead when the data CRC is wrong. An ``out`` that cannot
        take the bytes as they are (another dtype, not C-contiguous) gets the check-then-copy path.
        """
        assert self.spec.size is not None
        h, w = self.spec.size
        spec, buf, view, layouts = self.spec, self._buf, self._view, self._layouts
        shape, dtype = spec.label_shape((h, w)), spec.stored_label_dtype
        n_img, n_lab = h * w * 3, int(np.prod(shape))
        img_bytes, lab_bytes = n_img, n_lab * dtype.itemsize
        if not (out_images.dtype == np.uint8 and out_labels.dtype == dtype and out_images.flags.c_contiguous
                and out_labels.flags.c_contiguous):
            for k, i in enumerate(idx.tolist()):
                _, img, lab, _, _ = self._layout(i)  # CRCs checked in the buffer; H, W equal the spec's
                out_images[k] = np.frombuffer(buf, np.uint8, n_img, img).reshape(h, w, 3)
                out_labels[k] = np.frombuffer(buf, dtype, n_lab, lab).reshape(shape)
            return True
        crc32 = crc32c.crc32c
        for k, i in enumerate(idx.tolist()):
            body, end, crc = self._framed(i)
            cached = layouts.get(i)
            fresh = cached is None or cached[0] != crc
            if cached is None or fresh:
                try:
                    known = (crc, *self._parse(i, body, end))
                except ShardFormatError:
                    self._checked(i)  # a damaged record: say so if its CRC fails
                    raise
            else:
                known = cached
            img, lab = known[1], known[2]
            pieces: tuple[tuple[int, int, np.ndarray, Any, int, tuple[int, ...]], ...] = (
                (img, img_bytes, out_images[k], np.uint8, n_img, (h, w, 3)),
                (lab, lab_bytes, out_labels[k], dtype, n_lab, shape))
            value, pos = 0, body
            for off, nbytes, dst, kind, count, dst_shape in sorted(pieces, key=lambda p: p[0]):
                value = crc32(view[pos:off], value)
                dst[...] = np.frombuffer(buf, kind, count, off).reshape(dst_shape)
                value = crc32(dst.data, value)
                pos = off + nbytes
            value = crc32(view[pos:end], value)
            if mask(value) != crc:
                raise self.corrupt(f"record {i} fails its CRC32C check")
            if fresh:
                layouts[i] = known
        return True
