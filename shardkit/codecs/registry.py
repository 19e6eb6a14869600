"""Per-array codecs: how one stored image or label becomes bytes and back (spec: ``formats/codecs.md``).

Each codec is a small self-describing unit in the style of zarr's codecs: a ``name``, a
``config`` (what :meth:`Codec.to_json` writes into the manifest and :func:`codec_from_json`
reads back), :meth:`Codec.encode` (array → bytes) and :meth:`Codec.decode_into` (bytes →
the caller's preallocated array of the size the manifest promises). Decoding never
allocates from a size the data claims: a frame whose header says anything but the expected
size is refused before it is decompressed, and output is written only into ``out``.

Formats do not call the codec libraries themselves: which codecs a format takes is a fact of
its format class (``shardkit.formats``), the bytes are made here. ``zstandard``, ``lz4``
(and ``hdf5plugin`` for HDF5) are the optional ``codecs`` extra: a missing one is a
:class:`ConfigError` naming it. Their (de)compressors release the GIL, so
:func:`run_parallel` decodes a batch on a small thread pool.
"""

from __future__ import annotations

import importlib
import os
import struct
import sys
import threading
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError
from ..images.headers import JPEG_SOI, PNG_CHANNELS, jpeg_frame, png_header
from ..support import jit
from ..support.extras import install_hint

IMAGE, LABEL = "image", "label"
EXTRA = "codecs"  # the extra that installs zstandard, lz4 and hdf5plugin


class CodecDataError(ValueError):
    """Encoded bytes that do not decode to exactly the expected array (readers turn it into ShardFormatError)."""


def require(module: str, codec: str) -> ModuleType:
    """Import a codec's library, or a ConfigError naming the extra that installs it."""
    found = sys.modules.get(module)  # the per-sample fast path: already imported
    if found is not None:
        return found
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        raise ConfigError(f"codec {codec!r} needs the Python package {module.split('.')[0]!r}, which is not "
                          "installed", fix=install_hint(EXTRA)) from None


def _bytes_of(out: np.ndarray) -> np.ndarray:
    """``out`` (C-contiguous) as a flat writable uint8 view."""
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("decode_into needs a writable C-contiguous output array")
    return out.reshape(-1).view(np.uint8)


class Codec(ABC):
    """One way of storing one array. Subclasses set ``name``/``kinds``/``lossless`` and implement the two ends."""

    name: ClassVar[str]
    #: which arrays it may store: "image" (H, W, 3) uint8 RGB, "label" (any stored label)
    kinds: ClassVar[frozenset[str]] = frozenset({IMAGE, LABEL})
    lossless: ClassVar[bool] = True

    @property
    def config(self) -> dict[str, Any]:
        """Parameters recorded in the manifest besides the name (e.g. the level)."""
        return {}

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **self.config}

    def __str__(self) -> str:
        """The command-line spelling: ``zstd``, ``jpeg:95``."""
        return self.name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(str(self.to_json()))

    def __repr__(self) -> str:
        return f"<codec {self}>"

    def check_available(self) -> None:  # noqa: B027 - most codecs need nothing
        """Raise ConfigError when the library this codec needs is missing."""

    def cannot_store(self, dtype: Any, channels: int) -> str | None:
        """Why this codec cannot store (H, W, ``channels``) images of ``dtype``, or None: byte codecs store any."""
        return None

    @abstractmethod
    def encode(self, arr: np.ndarray) -> bytes:
        """The stored bytes of ``arr`` (C order, little-endian elements)."""

    @abstractmethod
    def decode_into(self, data: Any, out: np.ndarray) -> None:
        """Decode ``data`` into ``out`` (exact shape and dtype expected); CodecDataError unless it fits exactly."""


class Raw(Codec):
    """The array's bytes as they are (format version 1 layout)."""

    name = "raw"

    def encode(self, arr: np.ndarray) -> bytes:
        return np.ascontiguousarray(arr).tobytes()

    def decode_into(self, data: Any, out: np.ndarray) -> None:
        dst = _bytes_of(out)
        if len(data) != dst.size:
            raise CodecDataError(f"raw data has {len(data)} bytes, expected {dst.size}")
        dst[:] = np.frombuffer(data, np.uint8)


class Zstd(Codec):
    """One Zstandard frame (RFC 8878) whose header records the decompressed size."""

    name = "zstd"
    DEFAULT_LEVEL = 3

    def __init__(self, level: int = DEFAULT_LEVEL) -> None:
        if not isinstance(level, int) or isinstance(level, bool) or not 1 <= level <= 22:
            raise ConfigError(f"zstd level {level!r} is not an integer in 1..22", fix="write e.g. zstd or zstd:3")
        self.level = level

    @property
    def config(self) -> dict[str, Any]:
        return {"level": self.level}

    def __str__(self) -> str:
        return "zstd" if self.level == self.DEFAULT_LEVEL else f"zstd:{self.level}"

    def check_available(self) -> None:
        require("zstandard", self.name)

    def encode(self, arr: np.ndarray) -> bytes:
        zstd = require("zstandard", self.name)
        return bytes(zstd.ZstdCompressor(level=self.level, write_content_size=True).compress(
            np.ascontiguousarray(arr).data))

    def decode_into(self, data: Any, out: np.ndarray) -> None:
        zstd = require("zstandard", self.name)
        dst = _bytes_of(out)
        try:
            claimed = zstd.frame_content_size(data)
        except zstd.ZstdError as exc:
            raise CodecDataError(f"not a zstd frame ({exc})") from None
        if claimed != dst.size:  # checked before anything is decompressed: never sized from the data
            raise CodecDataError(f"zstd frame says {claimed} bytes, expected {dst.size}")
        try:
            with _zstd_decompressor(zstd).stream_reader(data, read_across_frames=False) as reader:
                got = reader.readinto(dst)
                extra = reader.read(1)
        except zstd.ZstdError as exc:
            raise CodecDataError(f"zstd frame does not decode ({exc})") from None
        if got != dst.size or extra:
            raise CodecDataError(f"zstd frame decodes to {got}{'+' if extra else ''} bytes, expected {dst.size}")


_ZSTD_LOCAL = threading.local()


def _zstd_decompressor(zstd: ModuleType) -> Any:
    """One decompression context per thread (a context must not be shared by threads)."""
    d = getattr(_ZSTD_LOCAL, "d", None)
    if d is None:
        d = _ZSTD_LOCAL.d = zstd.ZstdDecompressor()
    return d


class Lz4(Codec):
    """One LZ4 frame (the LZ4 Frame Format 1.6.x, as the ``lz4`` tool writes) recording the content size."""

    name = "lz4"

    def check_available(self) -> None:
        require("lz4.frame", self.name)

    def encode(self, arr: np.ndarray) -> bytes:
        frame = require("lz4.frame", self.name)
        return bytes(frame.compress(np.ascontiguousarray(arr).data, store_size=True))

    def decode_into(self, data: Any, out: np.ndarray) -> None:
        frame = require("lz4.frame", self.name)
        dst = _bytes_of(out)
        try:
            info = frame.get_frame_info(data)
            if info.get("content_size") != dst.size:  # checked first: never sized from the data
                raise CodecDataError(f"lz4 frame says {info.get('content_size')} bytes, expected {dst.size}")
            d = frame.LZ4FrameDecompressor()
            got = d.decompress(data, max_length=dst.size + 1)  # a frame that holds more stops here
        except RuntimeError as exc:
            raise CodecDataError(f"lz4 frame does not decode ({exc})") from None
        if len(got) != dst.size or not d.eof or d.unused_data:
            more = "more than " if len(got) > dst.size else ""
            tail = (" (unfinished)" if not d.eof else "") + (" and has bytes after it" if d.unused_data else "")
            raise CodecDataError(f"lz4 frame decodes to {more}{len(got)} bytes{tail}, expected {dst.size} from "
                                 "one frame")
        dst[:] = np.frombuffer(got, np.uint8)


# --------------------------------------------------------------------------- bounded stream decoders
# For data whose decompressed size is known in advance (an HDF5 chunk, a TFRecord stream): each stops as soon
# as its output would pass that size, so a small input that claims gigabytes never allocates them.


def inflate_into(data: Any, dst: np.ndarray, wbits: int = 15) -> None:
    """Inflate one zlib (``wbits`` 15; 31: gzip) stream into ``dst`` (flat uint8), which it must fill exactly:
    never more than ``dst.size + 1`` bytes are produced, whatever the stream holds."""
    d = zlib.decompressobj(wbits)
    try:
        got = d.decompress(data, dst.size + 1)
    except zlib.error as exc:
        raise CodecDataError(f"deflate stream does not decode ({exc})") from None
    if len(got) != dst.size or not d.eof:
        more = "more than " if len(got) > dst.size or d.unconsumed_tail else ""
        raise CodecDataError(f"deflate stream decodes to {more}{len(got)} bytes, expected {dst.size}"
                             f"{'' if d.eof or more else ' (it is truncated)'}")
    dst[:] = np.frombuffer(got, np.uint8)


def _lzf_loop(src: np.ndarray, dst: np.ndarray) -> int:
    """LZF (liblzf's ``lzf_decompress``) from ``src`` into ``dst``: bytes written, -1 for malformed data, -2 when
    the output would not fit. Every index is checked here (numba compiles it without bounds checks)."""
    ip, op, n_in, n_out = 0, 0, src.size, dst.size
    while ip < n_in:
        ctrl = int(src[ip])
        ip += 1
        if ctrl < 32:  # a literal run of ctrl + 1 bytes
            run = ctrl + 1
            if op + run > n_out:
                return -2
            if ip + run > n_in:
                return -1
            for k in range(run):
                dst[op + k] = src[ip + k]
            ip += run
            op += run
        else:  # a back reference: length (ctrl >> 5) + 2, distance from the low bits and the next byte
            length = ctrl >> 5
            if ip >= n_in:
                return -1
            if length == 7:
                length += int(src[ip])
                ip += 1
                if ip >= n_in:
                    return -1
            ref = op - ((ctrl & 0x1F) << 8) - 1 - int(src[ip])
            ip += 1
            length += 2
            if op + length > n_out:
                return -2
            if ref < 0:
                return -1
            for k in range(length):  # byte by byte: the source may overlap what is being written
                dst[op + k] = dst[ref + k]
            op += length
    return op


def _lzf_python(src: bytes, dst: bytearray) -> int:
    """:func:`_lzf_loop` without numba: the same decoding and results, on bytes (slices instead of loops)."""
    ip, op, n_in, n_out = 0, 0, len(src), len(dst)
    while ip < n_in:
        ctrl = src[ip]
        ip += 1
        if ctrl < 32:
            run = ctrl + 1
            if op + run > n_out:
                return -2
            if ip + run > n_in:
                return -1
            dst[op : op + run] = src[ip : ip + run]
            ip += run
            op += run
        else:
            length = ctrl >> 5
            if ip >= n_in:
                return -1
            if length == 7:
                length += src[ip]
                ip += 1
                if ip >= n_in:
                    return -1
            ref = op - ((ctrl & 0x1F) << 8) - 1 - src[ip]
            ip += 1
            length += 2
            if op + length > n_out:
                return -2
            if ref < 0:
                return -1
            if ref + length <= op:
                dst[op : op + length] = dst[ref : ref + length]
            else:  # overlapping: the pattern of op - ref bytes repeats
                for k in range(length):
                    dst[op + k] = dst[ref + k]
            op += length
    return op


def _warm_lzf(kernels: tuple[Any, ...]) -> None:
    kernels[0](np.array([1, 65, 66, 32, 1], np.uint8), np.empty(5, np.uint8))


_LZF = jit.LazyKernels((_lzf_loop,), _warm_lzf, "lzf")


def lzf_decode_into(data: Any, dst: np.ndarray) -> None:
    """Decode one LZF block (HDF5's filter 32000, as h5py writes it) into ``dst`` (flat uint8), which it must
    fill exactly; the output never passes ``dst`` (h5py's own filter retries with ever larger buffers)."""
    kernels = _LZF.get()
    if kernels is not None:
        got = int(kernels[0](np.frombuffer(data, np.uint8), dst))
    else:
        buf = bytearray(dst.size)
        got = _lzf_python(bytes(data), buf)
        if got >= 0:
            dst[:got] = np.frombuffer(buf, np.uint8, got)
    if got != dst.size:
        raise CodecDataError("lzf block is malformed" if got == -1 else
                             f"lzf block decodes to more than {dst.size} bytes" if got == -2 else
                             f"lzf block decodes to {got} bytes, expected {dst.size}")


def _image_size(data: Any, depth_wanted: int = 8) -> tuple[str, int, int, int]:
    """(kind, height, width, components) from a PNG or JPEG header, without decoding pixels: the size the
    decoder will decode, or ``("?", 0, 0, 0)`` when the header is not read exactly as the decoder reads it
    (:mod:`shardkit.images.headers`, JPEG strictly: shardkit wrote the sample). A PNG of another bit depth than
    ``depth_wanted``, or a palette PNG, has 0 components."""
    png = png_header(data)
    if png is not None:
        return "png", png.height, png.width, PNG_CHANNELS.get(png.colour, 0) if png.depth == depth_wanted else 0
    if bytes(memoryview(data).cast("B")[:2]) != JPEG_SOI:
        return "?", 0, 0, 0
    try:
        frame = jpeg_frame(data, strict=True)
    except ValueError:
        return "?", 0, 0, 0
    return "jpeg", frame.height, frame.width, frame.components


#: Channel orders between shardkit's RGB(A) and OpenCV's BGR(A), by channel count (gray needs none).
_SWAP = {3: [2, 1, 0], 4: [2, 1, 0, 3]}


class _Picture(Codec):
    """An image file format (PNG, JPEG) for images; encoded and decoded with OpenCV (releases the GIL).

    (H, W, 3) uint8 RGB as always; besides, what the format and TensorFlow's in-graph decoder both take
    (:attr:`dtypes`, :attr:`channels`): channels 1 (gray), 3 (RGB) or 4 (RGBA order) are written as the file's
    own gray, RGB or RGBA, so ``tf.io.decode_png`` gives the stored bands in their order."""

    kinds = frozenset({IMAGE})
    kind: ClassVar[str]
    dtypes: ClassVar[tuple[str, ...]] = ("uint8",)
    channels: ClassVar[tuple[int, ...]] = (1, 3)

    def _params(self) -> list[int]:
        return []

    def cannot_store(self, dtype: Any, channels: int) -> str | None:
        name = np.dtype(dtype).name
        if name not in self.dtypes or channels not in self.channels:
            return (f"{self.name} stores {' or '.join(self.dtypes)} images of {', '.join(map(str, self.channels))} "
                    f"channels, not {name} with {channels}")
        return None

    def encode(self, arr: np.ndarray) -> bytes:
        import cv2

        if arr.ndim == 2:
            arr = arr[:, :, None]
        order = _SWAP.get(arr.shape[2])
        ok, buf = cv2.imencode(f".{self.kind.replace('jpeg', 'jpg')}",
                               np.ascontiguousarray(arr[..., ::-1] if arr.shape[2] == 3 else
                                                    arr[..., order] if order is not None else arr), self._params())
        if not ok:  # pragma: no cover - OpenCV encodes any uint8 (H, W, 3)
            raise ValueError(f"OpenCV could not encode a {self.kind}")
        return bytes(buf)

    def decode_into(self, data: Any, out: np.ndarray) -> None:
        import cv2

        if out.ndim != 3 or self.cannot_store(out.dtype, out.shape[2]):
            raise ValueError(f"{self.name} decodes (H, W, C) images of {self.dtypes} with {self.channels} channels")
        channels = out.shape[2]
        kind, h, w, comps = _image_size(data, 8 * out.dtype.itemsize)
        if (kind, h, w, comps) != (self.kind, out.shape[0], out.shape[1], channels):  # before any pixel is decoded
            raise CodecDataError(f"{self.name} header says {kind} {h}x{w}x{comps}, expected {self.kind} "
                                 f"{out.shape[0]}x{out.shape[1]}x{channels}")
        if self.kind == "jpeg":
            check_jpeg_end(data, self.name)
        if channels == 3 and out.dtype == np.uint8:  # the RGB path, as before
            bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
            if bgr is None or bgr.shape != out.shape:
                raise CodecDataError(f"{self.name} data does not decode to {out.shape[0]}x{out.shape[1]}x3")
            cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB, dst=out)
            return
        got = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        if got is not None and got.ndim == 2:
            got = got[:, :, None]
        if got is None or got.shape != out.shape or got.dtype != out.dtype:
            raise CodecDataError(f"{self.name} data does not decode to {out.shape} {out.dtype}")
        order = _SWAP.get(channels)
        out[...] = got[..., order] if order is not None else got


class Png(_Picture):
    """PNG (8- or 16-bit gray, RGB or RGBA, lossless); TensorFlow decodes it in-graph with ``tf.io.decode_png``."""

    name = "png"
    kind = "png"
    dtypes = ("uint8", "uint16")
    channels = (1, 3, 4)
    LEVEL = 1  # zlib level: fast to write; the filtering does most of the work

    def _params(self) -> list[int]:
        import cv2

        return [cv2.IMWRITE_PNG_COMPRESSION, self.LEVEL]


#: How ``jpeg`` groups an image's bands into JPEG streams, by channel count: 1 and 3 are one gray or RGB file;
#: 2 and 4 are a band frame (:data:`JPEG_FRAME_MAGIC`) of gray streams, or of an RGB stream then a gray one.
JPEG_GROUPS: dict[int, tuple[int, ...]] = {1: (1,), 3: (3,), 2: (1, 1), 4: (3, 1)}
#: The first bytes of a band frame; then the stream count and each stream's length, uint32 little-endian.
JPEG_FRAME_MAGIC = b"SKJP"


def jpeg_frame_header_size(channels: int) -> int:
    """Bytes before the first stream of a band frame of ``channels`` bands: magic, count, one length a stream."""
    return len(JPEG_FRAME_MAGIC) + 4 + 4 * len(JPEG_GROUPS[channels])


class Jpeg(_Picture):
    """Baseline JPEG, 4:2:0, quality Q: lossy, for uint8 images of 1..4 bands, and only when asked for.

    Gray and RGB images are one JPEG file. OpenCV's JPEG has no fourth band (and none has two), so 2 and 4 bands
    are a small frame of complete JPEG streams, each encoded as a 1- or 3-channel image is (``formats/codecs.md``):
    TensorFlow still decodes every stream in-graph, and each is checked against the expected size before any
    decoder sees it."""

    name = "jpeg"
    kind = "jpeg"
    lossless = False
    channels = (1, 2, 3, 4)
    DEFAULT_QUALITY = 95

    def __init__(self, quality: int = DEFAULT_QUALITY) -> None:
        if not isinstance(quality, int) or isinstance(quality, bool) or not 1 <= quality <= 100:
            raise ConfigError(f"jpeg quality {quality!r} is not an integer in 1..100", fix="write e.g. jpeg:95")
        self.quality = quality

    @property
    def config(self) -> dict[str, Any]:
        return {"quality": self.quality}

    def __str__(self) -> str:
        return f"jpeg:{self.quality}"

    def _params(self) -> list[int]:
        import cv2

        return [cv2.IMWRITE_JPEG_QUALITY, self.quality]

    def encode(self, arr: np.ndarray) -> bytes:
        if arr.ndim == 2 or len(JPEG_GROUPS.get(arr.shape[2], ())) <= 1:
            return super().encode(arr)  # gray or RGB: one JPEG file, as always
        streams, first = [], 0
        for size in JPEG_GROUPS[arr.shape[2]]:
            streams.append(super().encode(arr[:, :, first : first + size]))
            first += size
        return b"".join([JPEG_FRAME_MAGIC, struct.pack(f"<{1 + len(streams)}I", len(streams),
                                                        *map(len, streams)), *streams])

    def decode_into(self, data: Any, out: np.ndarray) -> None:
        if out.ndim != 3 or self.cannot_store(out.dtype, out.shape[2]) or len(JPEG_GROUPS[out.shape[2]]) == 1:
            super().decode_into(data, out)
            return
        import cv2

        h, w = out.shape[:2]
        view, first = memoryview(data).cast("B"), 0
        for (start, stop), size in zip(jpeg_frame_streams(data, h, w, out.shape[2]), JPEG_GROUPS[out.shape[2]],
                                       strict=True):  # every header checked before the first stream is decoded
            got = cv2.imdecode(np.frombuffer(view[start:stop], np.uint8),
                               cv2.IMREAD_COLOR if size == 3 else cv2.IMREAD_GRAYSCALE)
            if got is None or got.shape != ((h, w, 3) if size == 3 else (h, w)):
                raise CodecDataError(f"jpeg band frame stream of {size} bands does not decode to {h}x{w}x{size}")
            if size == 3:
                out[:, :, first : first + 3] = got[:, :, ::-1]  # BGR → the stored band order, as the RGB path
            else:
                out[:, :, first] = got
            first += size


#: The marker every JPEG file ends with (libjpeg writes it last).
JPEG_EOI = b"\xff\xd9"


def check_jpeg_end(data: Any, what: str) -> None:
    """A CodecDataError unless the JPEG file ``data`` ends with its end-of-image marker, checked before decoding:
    libjpeg itself only warns on a cut-off file and fills what is missing with gray (OpenCV 5.0 then returns no
    image, measured; other decoders may keep it), so the check names the problem and depends on no decoder."""
    if bytes(memoryview(data).cast("B")[-2:]) != JPEG_EOI:
        raise CodecDataError(f"{what} data does not end with the JPEG end-of-image marker (truncated)")


def jpeg_frame_streams(data: Any, height: int, width: int, channels: int) -> list[tuple[int, int]]:
    """The (start, stop) byte range of each JPEG stream of a band frame of ``channels`` (2 or 4) bands, after
    checking everything ``formats/codecs.md`` asks before a decoder sees them: the magic, the stream count, lengths
    that are positive and fill the payload exactly, each stream's JPEG header (height, width, components) and its
    end-of-image marker."""
    view = memoryview(data).cast("B")
    groups = JPEG_GROUPS[channels]
    head = jpeg_frame_header_size(channels)
    if len(view) < head or bytes(view[:4]) != JPEG_FRAME_MAGIC:
        raise CodecDataError(f"jpeg data of {channels} bands is not a band frame (it starts "
                             f"{bytes(view[:4])!r}, not {JPEG_FRAME_MAGIC!r}, or is shorter than its {head}-byte "
                             "header)")
    (count,) = struct.unpack_from("<I", view, 4)
    if count != len(groups):
        raise CodecDataError(f"jpeg band frame has {count} streams, {channels} bands need {len(groups)}")
    lengths = struct.unpack_from(f"<{count}I", view, 8)
    if min(lengths) < 1 or head + sum(lengths) != len(view):
        raise CodecDataError(f"jpeg band frame's stream lengths {list(lengths)} do not fill its {len(view) - head} "
                             "bytes after the header exactly")
    ranges, start = [], head
    for k, (length, size) in enumerate(zip(lengths, groups, strict=True)):
        kind, h, w, comps = _image_size(view[start : start + length])
        if (kind, h, w, comps) != ("jpeg", height, width, size):
            raise CodecDataError(f"jpeg band frame stream {k + 1} header says {kind} {h}x{w}x{comps}, expected jpeg "
                                 f"{height}x{width}x{size}")
        check_jpeg_end(view[start : start + length], f"jpeg band frame stream {k + 1}")
        ranges.append((start, start + length))
        start += length
    return ranges


#: Every codec by name: the one list the CLI help, config checks and manifests draw on.
CODECS: dict[str, type[Codec]] = {c.name: c for c in (Raw, Zstd, Lz4, Png, Jpeg)}
_PARAM = {"zstd": "level", "jpeg": "quality"}


def parse_codec(text: str | Codec, kind: str) -> Codec:
    """``"raw"``, ``"zstd"``, ``"zstd:9"``, ``"lz4"``, ``"png"``, ``"jpeg:95"`` → a codec for ``kind`` arrays.

    Labels are always stored losslessly: a lossy codec for labels is a ConfigError.
    """
    if isinstance(text, Codec):
        codec = text
    else:
        name, _, arg = str(text).strip().lower().partition(":")
        cls = CODECS.get(name)
        if cls is None:
            raise ConfigError(f"--{kind}-codec {text!r} is not a codec", fix=f"use one of {', '.join(CODECS)}")
        if arg:
            if name not in _PARAM or not arg.isdigit():
                raise ConfigError(f"--{kind}-codec {text!r}: {name} takes no {arg!r}",
                                  fix="write e.g. zstd, zstd:9 or jpeg:95")
            codec = cls(**{_PARAM[name]: int(arg)})
        else:
            codec = cls()
    if kind not in codec.kinds or (kind == LABEL and not codec.lossless):
        raise ConfigError(f"--{kind}-codec {text}: labels are always stored losslessly" if kind == LABEL
                          else f"--{kind}-codec {text} is for labels only",
                          fix="use a lossless codec for labels (raw, zstd, lz4)")
    return codec


def codec_from_json(d: Any) -> Codec:
    """The codec a manifest records (``{"name": "zstd", "level": 3}``); ValueError for anything else."""
    if not isinstance(d, dict) or d.get("name") not in CODECS:
        raise ValueError(f"unknown codec {d!r}")
    cls = CODECS[d["name"]]
    params = {k: v for k, v in d.items() if k != "name"}
    if set(params) - {_PARAM.get(d["name"], "")}:
        raise ValueError(f"codec {d!r} has unknown parameters")
    try:
        codec = cls(**params)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return codec


@dataclass(frozen=True)
class ArrayCodecs:
    """The codec of each stored array of a dataset."""

    image: Codec
    label: Codec

    @classmethod
    def parse(cls, image: str | Codec = "raw", label: str | Codec = "raw") -> ArrayCodecs:
        return cls(parse_codec(image, IMAGE), parse_codec(label, LABEL))

    @property
    def raw(self) -> bool:
        """True when both arrays are stored as they are (format version 1 datasets)."""
        return self.image.name == "raw" and self.label.name == "raw"

    def to_json(self) -> dict[str, Any]:
        return {IMAGE: self.image.to_json(), LABEL: self.label.to_json()}

    @classmethod
    def from_json(cls, d: Any) -> ArrayCodecs:
        """From ``format_options.codecs``; ValueError if absent, unknown or lossy for labels."""
        if not isinstance(d, dict):
            raise ValueError(f"codecs {d!r} is not an object")
        codecs = cls(codec_from_json(d.get(IMAGE)), codec_from_json(d.get(LABEL)))
        if IMAGE not in codecs.image.kinds or not codecs.label.lossless or LABEL not in codecs.label.kinds:
            raise ValueError(f"codecs {d!r} do not fit their arrays")
        return codecs

    def check_available(self) -> None:
        self.image.check_available()
        self.label.check_available()


RAW = ArrayCodecs(Raw(), Raw())


# --------------------------------------------------------------------------- parallel decoding

_POOL: tuple[int, ThreadPoolExecutor] | None = None
_POOL_LOCK = threading.Lock()


def decode_threads() -> int:
    """Threads that decode a batch: ``SHARDKIT_DECODE_THREADS``, else min(4, usable cores)."""
    env = os.environ.get("SHARDKIT_DECODE_THREADS", "")
    if env.strip().isdigit() and int(env) >= 1:
        return int(env)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def _forget_pool_after_fork() -> None:
    """In a forked child: the parent's threads (and possibly a held lock) did not come along."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def _pool(threads: int) -> ThreadPoolExecutor:
    """This process's decoding pool (a forked child builds its own: threads do not survive a fork)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid() or _POOL[1]._max_workers != threads:
            _POOL = (os.getpid(), ThreadPoolExecutor(threads, thread_name_prefix="shardkit-decode"))
        return _POOL[1]


def run_parallel(jobs: Sequence[Callable[[], None]]) -> None:
    """Run ``jobs`` (each decodes one sample into its slot) on the decoding pool; first error re-raised.

    The jobs are cut into one contiguous run per thread (few futures per batch); with one thread, or
    one job, they run here.
    """
    threads = min(decode_threads(), len(jobs))
    if threads <= 1:
        for job in jobs:
            job()
        return

    def run(part: Sequence[Callable[[], None]]) -> None:
        for job in part:
            job()

    step = -(-len(jobs) // threads)
    futures = [_pool(decode_threads()).submit(run, jobs[k : k + step]) for k in range(0, len(jobs), step)]
    errors = [f.exception() for f in futures]  # wait for all: no job may still write into out afterwards
    for exc in errors:
        if exc is not None:
            raise exc
