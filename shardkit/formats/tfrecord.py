"""TFRecord shards: ``shard-<stem>.tfrecord`` of ``tf.train.Example`` records plus ``shard-<stem>.tfindex``.

Record framing: uint64 LE length, masked CRC32C of the length, the Example, masked CRC32C
of the Example. ``--compression gzip`` gzips the whole file (TensorFlow's ``"GZIP"``). The
index is the ``tfrecord`` package's: one ``"offset length"`` line per record, offsets into
the uncompressed stream. Format version 2 (``--image-codec png`` or ``jpeg:Q``) stores the image as a
PNG/JPEG file in ``image/encoded`` (with ``image/format``), which TensorFlow decodes in-graph with
``tf.io.decode_png``/``decode_jpeg``; labels stay raw. Writing uses the ``tfrecord`` package, in pool worker processes
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

from ..codecs.registry import RAW, ArrayCodecs, run_parallel
from ..errors import ShardFormatError, WorkerError
from ..support.limits import MAX_PIXELS, MAX_SIDE
from .base import SampleSpec, ShardFormat, ShardReader, ShardWriter, TfRecordLayout

GZIP_LEVEL = 6
#: Longest index line ("offset length\n", two int64s) and the most Example/framing bytes a record adds to its pixels.
INDEX_LINE_BYTES = 42
RECORD_OVERHEAD = 1 << 16
#: feature key → protobuf list type; each feature holds exactly one value (format version 1).
FEATURES: dict[str, str] = {
    "image/raw": "bytes", "image/height": "int64", "image/width": "int64", "image/channels": "int64",
    "label/raw": "bytes", "label/channels": "int64", "label/dtype": "bytes", "label/encoding": "bytes",
    "label/num_classes": "int64", "key": "bytes",
}
#: format version 2: the image is a PNG or JPEG file in ``image/encoded``, its kind in ``image/format``.
FEATURES_V2: dict[str, str] = {
    **{k: v for k, v in FEATURES.items() if k != "image/raw"}, "image/encoded": "bytes", "image/format": "bytes",
}


def features_of(codecs: ArrayCodecs) -> dict[str, str]:
    return FEATURES if codecs.raw else FEATURES_V2


def mask(crc: int) -> int:
    """TFRecord's masking of a CRC32C value."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc(data: Any) -> int:
    """TFRecord's masked CRC32C of a bytes-like object."""
    return mask(crc32c.crc32c(data))


def _import_package() -> None:
    """Import the ``tfrecord`` package without the ``tfrecord.torch`` its ``__init__`` tries to import (PyTorch:
    2-6 s in every conversion worker, which never reads through it). A ``None`` entry in ``sys.modules`` makes
    that import fail, which the package catches; it is removed at once, so a later ``import tfrecord.torch``
    works as usual."""
    blocked = "tfrecord" not in sys.modules and "tfrecord.torch" not in sys.modules
    if blocked:
        sys.modules["tfrecord.torch"] = None  # type: ignore[assignment]
    try:
        import tfrecord  # noqa: F401
    finally:
        if blocked:
            del sys.modules["tfrecord.torch"]


@functools.cache
def _record_writer() -> type:
    """The ``tfrecord`` package's writer, made deterministic and gzip-capable; imported on first use."""
    if "tensorflow" in sys.modules:
        raise WorkerError("the tfrecord writer cannot run in a process that imported TensorFlow",
                          fix="convert through shardkit.conversion.pipeline.convert, which writes in worker processes")
    _import_package()
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
    needs_subprocess = True

    def __init__(self, directory: Path, stem: str, spec: SampleSpec, planned: int, compression: str,
                 codecs: ArrayCodecs = RAW) -> None:
        super().__init__(directory, stem, spec, planned, compression, codecs)
        self._out = _record_writer()(self.tmp_files[0], compression == "gzip")
        self._index: list[str] = []

    @classmethod
    def file_names(cls, stem: str, spec: SampleSpec) -> tuple[str, ...]:
        return (f"shard-{stem}.tfrecord", f"shard-{stem}.tfindex")

    @classmethod
    def format_options(cls, spec: SampleSpec, compression: str, codecs: ArrayCodecs = RAW) -> dict[str, Any]:
        """The feature spec (enough for ``tf.io.parse_example``) and how to decode the image and label bytes."""
        features: dict[str, Any] = {k: {"type": kind, "shape": []} for k, kind in features_of(codecs).items()}
        hw = ["image/height", "image/width"]
        image_dtype = spec.stored_image_dtype
        if codecs.raw:
            features["image/raw"]["decode"] = {"dtype": image_dtype.name, "shape": [*hw, "image/channels"],
                                               **({} if spec.legacy_image else {"byte_order": "little"})}
        else:
            features["image/encoded"]["decode"] = {"codec": codecs.image.name, "dtype": image_dtype.name,
                                                   "shape": [*hw, "image/channels"]}
        features["label/raw"]["decode"] = {"dtype": spec.stored_label_dtype.name, "byte_order": "little",
                                           "shape": [*hw, "label/channels"]}
        return {**super().format_options(spec, compression, codecs), "features": features, "index": "tfindex",
                "tf_compression_type": "GZIP" if compression == "gzip" else ""}

    def add(self, image: np.ndarray, label: np.ndarray, key: str) -> None:
        img, lab = self.stored(image, label)
        spec = self.spec
        values = {"image/height": img.shape[0], "image/width": img.shape[1],
                  "image/channels": spec.image_channels, "label/raw": lab.tobytes(),
                  "label/channels": spec.label_channels or 1,
                  "label/dtype": lab.dtype.name.encode(), "label/encoding": spec.label_encoding.encode(),
                  "label/num_classes": spec.num_classes, "key": key.encode()}
        if self.codecs.raw:
            values["image/raw"] = img.tobytes()
        else:
            values["image/encoded"] = self.codecs.image.encode(img)
            values["image/format"] = self.codecs.image.name.encode()
        start = self._out.position
        self._out.write({k: (values[k], kind) for k, kind in features_of(self.codecs).items()})
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

    file_counts = (2, 2)

    # Set by _open (ensure_open runs it before any read) and dropped when pickled.
    _buf: Any
    _view: memoryview
    _index: np.ndarray
    _layouts: dict[int, tuple[int, int, int, int, int]]
    _encoded_ends: dict[int, int]  # version 2: end of each parsed record's encoded image

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_buf", "_view", "_index", "_layouts", "_encoded_ends")

    def _open(self) -> None:
        data, index = (self.path(f.name) for f in self.shard.files)
        try:
            if index.stat().st_size > INDEX_LINE_BYTES * len(self):
                raise self.corrupt(f"the index is larger than {len(self)} records need", self.shard.files[1].name)
            if self.format_options.get("compression") == "gzip":
                self._buf = self._gunzip(data)
            elif data.stat().st_size:
                with open(data, "rb") as fh:
                    self._buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            else:
                self._buf = b""
            lines = index.read_text("ascii").splitlines()
            self._index = np.array([[int(x) for x in ln.split()] for ln in lines], np.int64).reshape(-1, 2)
        except (OSError, EOFError, zlib.error, ValueError) as exc:
            raise self.corrupt(f"cannot read TFRecord shard ({exc})") from None
        self._view, self._layouts, self._encoded_ends = memoryview(self._buf), {}, {}
        starts, lengths = self._index[:, 0], self._index[:, 1]
        total = int(lengths.sum())
        contiguous = np.array_equal(starts, np.cumsum(lengths) - lengths) and not np.any(lengths < 16)
        if len(lengths) != len(self) or not contiguous or total != len(self._buf):
            raise self.corrupt(f"the index ({len(lengths)} records, {total} bytes) disagrees with the "
                               f"manifest ({len(self)} samples) or the data ({len(self._buf)} bytes)",
                               self.shard.files[1].name)
        self._starts = starts.tolist()  # Python ints: no per-read NumPy scalar conversions
        self._lengths = lengths.tolist()

    def max_stream_bytes(self) -> int:
        """Most bytes this shard's records may take uncompressed: its samples at the sizes the manifest states
        (fixed size, or each sample's size from the samples sidecar) plus framing and Example overhead, or where
        the sidecar is unknown, the largest size a manifest may state. Bounds gzip decompression."""
        if self.spec.size is not None:
            return len(self) * (self.spec.sample_nbytes(self.spec.size) + RECORD_OVERHEAD)
        hw = self.expected_hw
        if hw is None or len(hw) != len(self):
            return len(self) * (self.spec.sample_nbytes((MAX_SIDE, MAX_PIXELS // MAX_SIDE)) + RECORD_OVERHEAD)
        px = hw.astype(np.int64).prod(axis=1)
        per_px = self.spec.sample_nbytes((1, 1))
        return int(px.sum()) * per_px + len(self) * RECORD_OVERHEAD

    def _gunzip(self, data: Path) -> bytearray:
        """The decompressed stream of a gzip shard, refused as soon as it outgrows :meth:`max_stream_bytes`
        (a small file that claims gigabytes is a decompression bomb, not a shard)."""
        limit, out = self.max_stream_bytes(), bytearray()
        d, fed = zlib.decompressobj(31), False
        with open(data, "rb") as fh:
            buf = b""
            while True:
                if not buf:
                    buf = fh.read(1 << 20)
                    if not buf:
                        break
                out += d.decompress(buf, limit + 1 - len(out))
                fed = True
                if len(out) > limit:
                    raise self.corrupt(f"decompresses to more than the {limit} bytes its {len(self)} samples need")
                buf = d.unconsumed_tail
                if d.eof:  # a following gzip member is a new stream (as gzip.decompress reads them all)
                    buf, d, fed = d.unused_data + buf, zlib.decompressobj(31), False
        if fed and not d.eof:
            raise EOFError("compressed file ended before the end-of-stream marker was reached")
        return out

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
            image_key = "image/raw" if self.codecs.raw else "image/encoded"
            (img_start, img_end), (lab_start, lab_end) = f[image_key][0], f["label/raw"][0]
            meta = (c, int(f["label/channels"][0]), bytes(buf[slice(*f["label/dtype"][0])]).decode(),
                    bytes(buf[slice(*f["label/encoding"][0])]).decode(), int(f["label/num_classes"][0]))
            if not self.codecs.raw:
                kind = bytes(buf[slice(*f["image/format"][0])]).decode()
                if kind != self.codecs.image.name:
                    raise ValueError(f"image/format {kind!r} is not the manifest's {self.codecs.image.name!r}")
                self._encoded_ends[i] = img_end
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise self.corrupt(f"record {i} is not a shardkit Example ({type(exc).__name__} {exc})") from None
        want = (spec.image_channels, spec.label_channels or 1, spec.stored_label_dtype.name, spec.label_encoding,
                spec.num_classes)
        if meta != want:
            raise self.corrupt(f"record {i}: (channels, label channels, dtype, encoding, classes) {meta} "
                               f"disagree with the manifest {want}")
        lab_bytes = int(np.prod(spec.label_shape((h, w)))) * spec.stored_label_dtype.itemsize
        img_ok = img_end - img_start == spec.image_nbytes((h, w)) if self.codecs.raw else h * w <= MAX_PIXELS
        if h <= 0 or w <= 0 or not img_ok or lab_end - lab_start != lab_bytes:
            raise self.corrupt(f"record {i}: image/label bytes ({img_end - img_start}, {lab_end - lab_start}) "
                               f"do not fit its height and width {h}x{w}")
        if spec.size not in (None, (h, w)):
            raise self.corrupt(f"record {i} is {h}x{w}, the manifest says {spec.size[0]}x{spec.size[1]}")
        self.check_hw(i, h, w)  # variable size: the manifest's samples[i], before an encoded image is decoded
        return img_start, lab_start, h, w

    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        self.ensure_open()
        _, img, lab, h, w = self._layout(i)
        spec = self.spec
        if self.codecs.raw:
            shape_i = spec.image_shape((h, w))
            image = np.frombuffer(self._buf, spec.stored_image_dtype, int(np.prod(shape_i)), img).reshape(shape_i)
        else:
            image = np.empty(spec.image_shape((h, w)), spec.stored_image_dtype)
            self._decode_image(i, img, image)
        shape = spec.label_shape((h, w))
        label = np.frombuffer(self._buf, spec.stored_label_dtype, int(np.prod(shape)), lab).reshape(shape)
        return image, label

    def _decode_image(self, i: int, start: int, out: np.ndarray) -> None:
        """Version 2: decode record ``i``'s PNG/JPEG (at ``start``, its layout known) into ``out``."""
        assert self._view is not None and self._encoded_ends is not None
        self.decode_into("image", self._view[start : self._encoded_ends[i]], out, i)

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
        if not self.codecs.raw:  # version 2: records checked here, images decoded on the thread pool
            jobs = []
            for k, i in enumerate(idx.tolist()):
                _, img, lab, _, _ = self._layout(i)
                out_labels[k] = np.frombuffer(buf, spec.stored_label_dtype, out_labels[k].size,
                                              lab).reshape(out_labels[k].shape)
                jobs.append(functools.partial(self._decode_image, i, img, out_images[k]))
            run_parallel(jobs)
            return True
        shape, dtype = spec.label_shape((h, w)), spec.stored_label_dtype
        ishape, idtype = spec.image_shape((h, w)), spec.stored_image_dtype
        n_img, n_lab = int(np.prod(ishape)), int(np.prod(shape))
        img_bytes, lab_bytes = n_img * idtype.itemsize, n_lab * dtype.itemsize
        if not (out_images.dtype == idtype and out_labels.dtype == dtype and out_images.flags.c_contiguous
                and out_labels.flags.c_contiguous):
            for k, i in enumerate(idx.tolist()):
                _, img, lab, _, _ = self._layout(i)  # CRCs checked in the buffer; H, W equal the spec's
                out_images[k] = np.frombuffer(buf, idtype, n_img, img).reshape(ishape)
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
                (img, img_bytes, out_images[k], idtype, n_img, ishape),
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


class TfrecordFormat(ShardFormat):
    """``tfrecord``: tf.train.Example records read front to back; version 2 stores images as PNG/JPEG."""

    name = "tfrecord"
    writer = TfrecordWriter
    reader = TfrecordReader
    versions = (1, 2, 3)
    random_access = False
    compressions = ("none", "gzip")
    image_codecs = ("raw", "png", "jpeg")
    label_codecs = ("raw",)  # TensorFlow cannot decode zstd/lz4 in-graph; labels stay raw here
    file_patterns = (("shard-", ".tfrecord"), ("shard-", ".tfindex"))

    @classmethod
    def tf_records(cls, format_options: dict[str, Any], version: int) -> TfRecordLayout | None:
        features = format_options.get("features", {})
        codecs = ArrayCodecs.from_json(format_options.get("codecs")) if version >= 2 else RAW
        kinds = {k: str(v.get("type")) for k, v in features.items() if isinstance(v, dict)}
        compression = str(format_options.get("tf_compression_type",
                                              "GZIP" if format_options.get("compression") == "gzip" else ""))
        return TfRecordLayout(compression, kinds, "image/raw" if codecs.raw else "image/encoded",
                              codecs.image.name, "label/raw")


FORMAT = TfrecordFormat
