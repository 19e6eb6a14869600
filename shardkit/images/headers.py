"""PNG and JPEG headers read as libpng and libjpeg read them: the one parser of each, pure Python on bytes.

Two callers need a file's size before any decoder sees it: convert (:func:`shardkit.images.imageio.read_header`,
the ``--max-pixels`` check on inputs from anywhere) and the shard readers (``codecs.registry``'s ``png`` and
``jpeg`` codecs, each stored sample checked against the manifest's size). They differ in one stated way, the
``strict`` switch of :func:`jpeg_frame`: convert is lenient where libjpeg is (an input that libjpeg decodes with a
warning is sized as libjpeg sizes it), a reader is strict (shardkit wrote the sample, so whatever libjpeg would
skip with a warning or stop on is refused: the answer is libjpeg's exactly, or none). A PNG's header has one
reading (the IHDR chunk first, as libpng requires) for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: Start of image: every JPEG file begins with it.
JPEG_SOI = b"\xff\xd8"
#: Samples per pixel of a PNG colour type as stored (gray, RGB, gray + alpha, RGBA); palette (3) is an index.
PNG_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}
#: Bytes of a PNG from its signature to the end of IHDR's data (the CRC not counted).
PNG_HEADER_BYTES = 29

_JPEG_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RST0-7: markers without a length
#: JPEG start-of-frame markers libjpeg takes the image size from (every SOFn but DHT, JPG and DAC).
JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_PROGRESSIVE = frozenset({0xC2, 0xC6, 0xCA, 0xCE})


@dataclass(frozen=True)
class PngHeader:
    """A PNG's IHDR: size, bit depth and colour type (:data:`PNG_CHANNELS`; 3 is a palette)."""

    height: int
    width: int
    depth: int
    colour: int


@dataclass(frozen=True)
class JpegFrame:
    """A JPEG's first frame header (SOFn): size, colour components, sample precision and whether it is
    progressive (a progressive decode keeps every coefficient until the end)."""

    height: int
    width: int
    components: int
    precision: int
    progressive: bool


def png_header(head: Any) -> PngHeader | None:
    """The IHDR of the PNG whose first bytes are ``head`` (any buffer: bytes, a memoryview, a uint8 array), or
    None: not a PNG, cut before IHDR's data ends, or its first chunk is not IHDR (libpng refuses such a file)."""
    view = memoryview(head).cast("B")
    if len(view) < PNG_HEADER_BYTES or bytes(view[:8]) != PNG_SIGNATURE or bytes(view[12:16]) != b"IHDR":
        return None
    return PngHeader(height=int.from_bytes(view[20:24], "big"), width=int.from_bytes(view[16:20], "big"),
                     depth=view[24], colour=view[25])


def jpeg_frame(head: Any, *, strict: bool) -> JpegFrame:
    """The first frame header of the JPEG whose first bytes are ``head`` (it starts with :data:`JPEG_SOI`), found
    as libjpeg's marker reader (``jdmarker.c``) finds it; a ValueError naming why there is none.

    Both readings swallow any number of ``FF`` fill bytes before a marker (``FF FF C0`` is a SOF0 marker, not a
    marker 0xFF: a decoy frame inside a segment is not taken for the size) and take the first SOFn before the
    first scan. Lenient (``strict=False``, convert's inputs) skips, as libjpeg does with a warning, bytes that
    are not a marker, a stuffed zero, and a segment length below 2. ``strict`` (the shard readers) refuses
    each of those, a second SOI, a frame header shorter than 8 bytes and samples of other than 8 bits.
    """
    view = memoryview(head).cast("B")
    pos, n = 2, len(view)
    while True:
        if strict and pos < n and view[pos] != 0xFF:
            raise ValueError("bytes that are not a marker between segments")
        while pos < n and view[pos] != 0xFF:  # garbage before a marker: libjpeg warns and skips it
            pos += 1
        while pos < n and view[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            raise ValueError("no frame header in its first bytes")
        marker = view[pos]
        pos += 1
        if marker in _JPEG_NO_LENGTH or (marker == 0 and not strict):
            continue
        if marker in (0xD9, 0xDA):
            raise ValueError("a scan or the end before the frame header")
        if strict and marker in (0x00, 0xD8):
            raise ValueError("a stuffed zero where a marker belongs" if marker == 0 else "a second start of image")
        if pos + 2 > n:
            raise ValueError("cut inside a marker")
        length = int.from_bytes(view[pos : pos + 2], "big")
        if strict and length < 2:
            raise ValueError(f"a segment of length {length}")
        if marker in JPEG_SOF:
            if pos + 8 > n or (strict and (length < 8 or view[pos + 2] != 8)):
                raise ValueError("cut inside the frame header" if pos + 8 > n else "not a frame of 8-bit samples")
            return JpegFrame(height=int.from_bytes(view[pos + 3 : pos + 5], "big"),
                             width=int.from_bytes(view[pos + 5 : pos + 7], "big"), components=view[pos + 7],
                             precision=view[pos + 2], progressive=marker in _JPEG_PROGRESSIVE)
        pos += max(length, 2)
