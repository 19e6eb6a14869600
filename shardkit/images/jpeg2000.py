"""JPEG 2000 images (``.jp2`` boxes or a raw ``.j2k`` codestream): their size from the codestream's SIZ marker
before anything is decoded, and their pixels exactly as stored.

Decoded with imagecodecs' OpenJPEG (``jpeg2k_decode``, a dependency already, through tifffile), not Pillow's
JPEG 2000 plugin: imagecodecs gives every component in its stored type (16-bit, signed, any number of bands),
Pillow only L, I;16, RGB and RGBA (at most 4 components; a signed codestream read as unsigned gray).
Only numpy is imported at module level.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DecodeError

#: The JP2 signature box and a raw codestream's SOC + SIZ markers.
JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  \r\n\x87\n"
J2K_SIGNATURE = b"\xff\x4f\xff\x51"
#: How far into a file its codestream (and SIZ marker) is looked for: the bytes read for any image header.
SIZ_SEARCH_BYTES = 4 << 20
_FIX = "re-export it (PNG, TIFF or a JPEG 2000 file OpenJPEG reads), or --on-error skip"


@dataclass(frozen=True)
class Jp2Size:
    """What a codestream's SIZ marker says: the image area, its components and their bit depth and sign."""

    height: int
    width: int
    components: int
    bits: int
    signed: bool
    subsampled: bool

    @property
    def bytes_per_pixel(self) -> int:
        return self.components * (1 if self.bits <= 8 else 2 if self.bits <= 16 else 4)


def is_jpeg2000(head: bytes) -> bool:
    return head.startswith((JP2_SIGNATURE, J2K_SIGNATURE))


def _codestream_offset(head: bytes, path: Path, what: str) -> int:
    """Where the codestream starts: 0 for a raw one, else the body of the JP2's ``jp2c`` box (boxes walked by their
    lengths within ``head``)."""
    if head.startswith(J2K_SIGNATURE):
        return 0
    pos = 0
    while pos + 8 <= len(head):
        length, box = struct.unpack(">I4s", head[pos:pos + 8])
        body = pos + 8
        if length == 1:  # XLBox: a 64-bit length follows
            if pos + 16 > len(head):
                break
            length = struct.unpack(">Q", head[pos + 8:pos + 16])[0]
            body = pos + 16
        if box == b"jp2c":
            return body
        if length == 0 or length < body - pos:  # 0: the box runs to the end of the file, and it is not jp2c
            break
        pos += length
    raise DecodeError(f"cannot decode {what}: JPEG 2000 file has no codestream (jp2c box) in its first {len(head)} "
                      "bytes", path=path, fix=_FIX)


def read_siz(head: bytes, path: Path, what: str = "image") -> Jp2Size:
    """The SIZ marker of a ``.jp2``/``.j2k`` file from its first bytes ``head``; a DecodeError (one line) when it
    is missing, truncated or says something impossible."""
    start = _codestream_offset(head, path, what)
    siz = head[start:start + 4 + 38]
    if siz[:4] != J2K_SIGNATURE or len(siz) < 42:
        raise DecodeError(f"cannot decode {what}: JPEG 2000 codestream does not start with SOC + SIZ", path=path,
                          fix=_FIX)
    lsiz, _, xsiz, ysiz, xo, yo = struct.unpack(">HHIIII", siz[4:24])
    (csiz,) = struct.unpack(">H", siz[40:42])
    comps = head[start + 42:start + 42 + 3 * csiz]
    if csiz == 0 or len(comps) < 3 * csiz or lsiz != 38 + 3 * csiz or xsiz <= xo or ysiz <= yo:
        raise DecodeError(f"cannot decode {what}: JPEG 2000 SIZ marker is damaged ({csiz} components, area "
                          f"{xo}..{xsiz} x {yo}..{ysiz})", path=path, fix=_FIX)
    ssiz = [comps[3 * i] for i in range(csiz)]
    sub = any(comps[3 * i + 1] != 1 or comps[3 * i + 2] != 1 for i in range(csiz))
    bits = max((s & 0x7F) + 1 for s in ssiz)
    return Jp2Size(ysiz - yo, xsiz - xo, csiz, bits, any(s & 0x80 for s in ssiz), sub)


def decode_jpeg2000(path: Path, data: np.ndarray, what: str = "image") -> np.ndarray:
    """A JPEG 2000 file as (H, W, C): every component, in the type OpenJPEG stores it (uint8, uint16, int16 …),
    never rescaled. Subsampled components (YCbCr 4:2:0 …) are refused: they are not bands of one grid."""
    size = read_siz(data[:SIZ_SEARCH_BYTES].tobytes(), path, what)
    if size.subsampled:
        raise DecodeError(f"{what} is a JPEG 2000 file with subsampled components: they are not bands of one "
                          "pixel grid", path=path, fix=_FIX)
    import imagecodecs

    try:
        arr = np.asarray(imagecodecs.jpeg2k_decode(data.tobytes()))
    except Exception as exc:  # imagecodecs raises its own error types for damaged codestreams
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise DecodeError(f"cannot decode {what}: JPEG 2000 does not decode ({reason})", path=path,
                          fix=_FIX) from None
    arr = arr[:, :, None] if arr.ndim == 2 else arr
    if arr.shape != (size.height, size.width, size.components):
        raise DecodeError(f"cannot decode {what}: JPEG 2000 decoded to {arr.shape}, its SIZ marker says "
                          f"{size.height}x{size.width}x{size.components}", path=path, fix=_FIX)
    return np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("="), copy=False))
