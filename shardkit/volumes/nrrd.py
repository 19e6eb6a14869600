"""NRRD volumes (``.nrrd``, header and data in one file) through pynrrd's header parser and a bounded reader of
shardkit's own.

pynrrd parses the header (fields, types, vectors); the voxels are read here, because pynrrd's own reader reads a
gzip stream to its end whatever the header says (a gzip bomb would fill memory) and follows a ``data file`` path
anywhere. Here the data is read up to exactly the bytes the checked header declares, from the same file: raw and
gzip encodings (the ones 3D Slicer, ITK and MITK write), ``line skip`` and ``byte skip`` (-1 with raw only).

Geometry: the affine maps array indices to the world in **RAS** (NIfTI's convention, so one case may mix NIfTI and
NRRD files on one grid): ``space directions`` are the columns, ``space origin`` the translation, and a
``left-posterior-superior`` (LPS, ITK's and Slicer's usual) or ``left-anterior-superior`` space has its x (and y)
negated. Other spaces (``scanner-xyz``, …) are taken as they are (logged). A file without ``space directions``
uses ``spacings``; one with neither has spacing 1 and an identity affine (logged).
"""

from __future__ import annotations

import base64
import logging
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DecodeError
from ..support.limits import DEFAULT_MAX_VOXELS
from .volume import VolumeHeader, checked_grid, volume_library

log = logging.getLogger(__name__)

NRRD_SUFFIXES = (".nrrd",)
#: Longest NRRD header read (its text up to the blank line that ends it).
MAX_HEADER_BYTES = 1 << 20
_CHUNK = 1 << 20
#: NRRD type names → numpy kinds (the NRRD0005 specification's list).
_TYPES: dict[str, str] = {
    **dict.fromkeys(("signed char", "int8", "int8_t"), "i1"),
    **dict.fromkeys(("uchar", "unsigned char", "uint8", "uint8_t"), "u1"),
    **dict.fromkeys(("short", "short int", "signed short", "signed short int", "int16", "int16_t"), "i2"),
    **dict.fromkeys(("ushort", "unsigned short", "unsigned short int", "uint16", "uint16_t"), "u2"),
    **dict.fromkeys(("int", "signed int", "int32", "int32_t"), "i4"),
    **dict.fromkeys(("uint", "unsigned int", "uint32", "uint32_t"), "u4"),
    **dict.fromkeys(("longlong", "long long", "long long int", "signed long long", "signed long long int", "int64",
                     "int64_t"), "i8"),
    **dict.fromkeys(("ulonglong", "unsigned long long", "unsigned long long int", "uint64", "uint64_t"), "u8"),
    "float": "f4", "double": "f8",
}
#: NRRD spaces → the signs that take their x, y, z to RAS.
_TO_RAS: dict[str, tuple[float, float, float]] = {
    **dict.fromkeys(("left-posterior-superior", "lps"), (-1.0, -1.0, 1.0)),
    **dict.fromkeys(("left-anterior-superior", "las"), (-1.0, 1.0, 1.0)),
    **dict.fromkeys(("right-anterior-superior", "ras"), (1.0, 1.0, 1.0)),
}


def _pynrrd() -> Any:
    return volume_library("nrrd", "pynrrd", "NRRD volumes")


def _header_text(path: Path) -> tuple[str, int]:
    """The header's text (up to and without the blank line) and the offset of the first byte after it."""
    with open(path, "rb") as fh:
        head = fh.read(MAX_HEADER_BYTES + 2)
    if not head.startswith(b"NRRD"):
        raise DecodeError("is not an NRRD file (no NRRD magic)", path=path, fix="check the file or leave it out")
    end = head.find(b"\n\n")
    crlf = head.find(b"\r\n\r\n")
    if crlf >= 0 and (end < 0 or crlf < end):
        end, gap = crlf, 4
    else:
        gap = 2
    if end < 0:
        raise DecodeError(f"has no blank line ending its header in the first {MAX_HEADER_BYTES} bytes (a detached "
                          "header, .nhdr, or a damaged file)", path=path,
                          fix="store header and data in one .nrrd file (e.g. 3D Slicer: Save as .nrrd)")
    try:
        return head[:end].decode("ascii"), end + gap
    except UnicodeDecodeError:
        raise DecodeError("header is not ASCII text", path=path, fix="check the file or leave it out") from None


def _field(header: dict[str, Any], *names: str) -> Any:
    for name in names:
        if name in header:
            return header[name]
    return None


def read_header(path: Path, max_voxels: int = DEFAULT_MAX_VOXELS) -> VolumeHeader:
    """The checked header of NRRD file ``path`` (only its header is read); one-line DecodeError for a header pynrrd
    cannot parse or that says something no volume shardkit reads can be."""
    nrrd = _pynrrd()
    path = Path(path)
    if not path.is_file():
        raise DecodeError("is not a regular file", path=path, fix="point at the .nrrd file itself")
    text, _ = _header_text(path)
    try:
        header = nrrd.read_header(text.splitlines())
        dims = [int(s) for s in header["sizes"]]
    except Exception as exc:
        raise DecodeError(f"header cannot be parsed ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})",
                          path=path, fix="check the file or leave it out") from None
    if len(dims) == 3 and min(dims) >= 1:  # the voxel limit before anything else of the header
        checked_grid(path, dims, (1.0, 1.0, 1.0), np.eye(4), np.dtype(np.uint8), max_voxels)
    if _field(header, "data file", "datafile") is not None:
        raise DecodeError("names a separate data file: only .nrrd files holding their data are read", path=path,
                          fix="store header and data in one .nrrd file (e.g. 3D Slicer: Save as .nrrd)")
    encoding = str(header.get("encoding", "")).lower()
    if encoding not in ("raw", "gzip", "gz"):
        raise DecodeError(f"encoding {encoding!r}: only raw and gzip NRRD data is read", path=path,
                          fix="re-save it raw or gzip-compressed (e.g. 3D Slicer, SimpleITK WriteImage)")
    kind = _TYPES.get(str(header.get("type", "")).lower())
    if kind is None:
        raise DecodeError(f"type {header.get('type')!r} is not an integer or real NRRD type", path=path,
                          fix="store the volume as integers or float32")
    dtype = np.dtype(kind)
    if dtype.itemsize > 1:
        endian = str(header.get("endian", "")).lower()
        if endian not in ("little", "big"):
            raise DecodeError(f"endian {header.get('endian')!r} is not little or big", path=path,
                              fix="the header is damaged: re-save the volume")
        dtype = dtype.newbyteorder("<" if endian == "little" else ">")
    affine, spacing = _geometry(header, len(dims), path)
    checked_grid(path, dims, spacing, affine, dtype, max_voxels)
    return VolumeHeader(path, (dims[0], dims[1], dims[2]), (spacing[0], spacing[1], spacing[2]),
                        tuple(tuple(float(v) for v in row) for row in affine), dtype.newbyteorder("=").name,
                        base64.b64encode(text.encode("ascii")).decode("ascii"), "nrrd")


def _geometry(header: dict[str, Any], ndim: int, path: Path) -> tuple[np.ndarray, tuple[float, ...]]:
    """The voxel-to-RAS affine and spacing of a parsed header (module docstring)."""
    affine = np.eye(4)
    directions = header.get("space directions")
    if directions is not None:
        d = np.asarray(directions, dtype=np.float64)
        if d.shape != (ndim, 3):
            raise DecodeError(f"space directions {d.shape} are not one 3-vector per axis", path=path,
                              fix="the header is damaged: re-save the volume")
        affine[:3, :3] = d.T
        affine[:3, 3] = np.asarray(header.get("space origin", np.zeros(3)), dtype=np.float64).reshape(-1)[:3]
        spacing = tuple(float(v) for v in np.linalg.norm(d, axis=1)) if np.isfinite(d).all() else (float("nan"),) * 3
    elif header.get("spacings") is not None:
        spacing = tuple(float(v) for v in header["spacings"])
        affine[:3, :3] = np.diag(spacing) if len(spacing) == 3 else affine[:3, :3]
    else:
        log.info("%s: no space directions or spacings: spacing 1 and an identity affine", path)
        spacing = (1.0, 1.0, 1.0)
    space = str(header.get("space", "")).lower()
    signs = _TO_RAS.get(space)
    if signs is None:
        if space:
            log.info("%s: space %r is taken as it is (not converted to RAS)", path, space)
    else:
        affine[:3] = np.diag(signs) @ affine[:3]
    return affine, spacing


def regridded_header(head: VolumeHeader, shape: tuple[int, int, int], scale: np.ndarray, dtype: str) -> str:
    """The NRRD header text (base64) of ``head`` on a resampled grid (:mod:`~shardkit.volumes.resample`):
    ``sizes`` the new shape, each axis's ``space directions`` (or ``spacings``) times ``scale`` (new / old spacing),
    ``type`` ``dtype``, the origin and every other field kept (pynrrd formats it, without its dated comment lines,
    so one resampling gives one header)."""
    import io

    nrrd = _pynrrd()
    from nrrd.writer import _TYPEMAP_NUMPY2NRRD, _write_header

    header = nrrd.read_header(base64.b64decode(head.header).decode("ascii").splitlines())
    header["sizes"] = np.array(shape)
    if header.get("space directions") is not None:
        header["space directions"] = np.asarray(header["space directions"], np.float64) * np.asarray(scale)[:, None]
    elif header.get("spacings") is not None:
        header["spacings"] = np.asarray(header["spacings"], np.float64) * np.asarray(scale)
    header["type"] = _TYPEMAP_NUMPY2NRRD[np.dtype(dtype).str[1:]]
    out = io.BytesIO()
    _write_header(out, header)
    text = "".join(line + "\n" for line in out.getvalue().decode("ascii").splitlines() if not line.startswith("#"))
    return base64.b64encode(text.encode("ascii")).decode("ascii")


def read_voxels(head: VolumeHeader) -> np.ndarray:
    """The volume's voxels, exactly the bytes its checked header declares and no more (a longer gzip stream is not
    read past them), native byte order, shape ``head.shape`` (NRRD's first axis fastest, as nibabel's)."""
    nrrd = _pynrrd()
    text, offset = _header_text(head.path)
    header = nrrd.read_header(text.splitlines())
    dtype = np.dtype(_TYPES[str(header["type"]).lower()])
    if dtype.itemsize > 1:
        dtype = dtype.newbyteorder("<" if str(header["endian"]).lower() == "little" else ">")
    count = head.voxels
    nbytes = count * dtype.itemsize
    skip_lines = int(_field(header, "line skip", "lineskip") or 0)
    skip_bytes = int(_field(header, "byte skip", "byteskip") or 0)
    gzip = str(header["encoding"]).lower() in ("gzip", "gz")
    if skip_lines < 0 or skip_bytes < -1 or (skip_bytes == -1 and gzip):
        raise DecodeError(f"line skip {skip_lines} / byte skip {skip_bytes} cannot be read (byte skip -1 only with "
                          "raw data)", path=head.path, fix="re-save the volume without skips")
    with open(head.path, "rb") as fh:
        fh.seek(offset)
        for _ in range(skip_lines):
            if not fh.readline(MAX_HEADER_BYTES).endswith(b"\n"):
                raise DecodeError("ends inside its skipped lines", path=head.path, fix="re-save the volume")
        if gzip:
            raw = _inflate(fh, skip_bytes + nbytes, head.path)[skip_bytes:]
        else:
            start = os.fstat(fh.fileno()).st_size - nbytes if skip_bytes == -1 else fh.tell() + skip_bytes
            fh.seek(max(start, 0))
            raw = fh.read(nbytes)
    if len(raw) != nbytes:
        raise DecodeError(f"holds {len(raw)} bytes of data, its header declares {nbytes}", path=head.path,
                          fix="check the file (a truncated download?) or leave it out")
    data = np.frombuffer(raw, dtype).reshape(head.shape, order="F")
    return data.astype(dtype.newbyteorder("="), copy=not dtype.isnative)


def _inflate(fh: Any, nbytes: int, path: Path) -> bytes:
    """Exactly ``nbytes`` decompressed from the gzip (or zlib) stream at ``fh``'s position; fewer if it ends
    first. Never more: the rest of a longer stream is not decompressed."""
    z = zlib.decompressobj(zlib.MAX_WBITS | 32)
    out = bytearray()
    pending = b""
    while len(out) < nbytes:
        if not pending:
            pending = fh.read(_CHUNK)
            if not pending:
                break
        try:
            out += z.decompress(pending, nbytes - len(out))
        except zlib.error as exc:
            raise DecodeError(f"gzip data cannot be decompressed ({exc})", path=path,
                              fix="check the file (a truncated download?) or leave it out") from None
        pending = z.unconsumed_tail
        if z.eof:
            break
    return bytes(out)


def to_nrrd(data: np.ndarray, volume: dict[str, Any], path: Path) -> None:
    """Write ``data`` as an NRRD file carrying the recorded header's fields (``volume``: a label volume's
    :meth:`~shardkit.volumes.volume.VolumeHeader.to_json`), in its recorded type and encoding."""
    nrrd = _pynrrd()
    header = nrrd.read_header(base64.b64decode(volume["header"]).decode("ascii").splitlines())
    for name in ("data file", "datafile", "line skip", "lineskip", "byte skip", "byteskip"):
        header.pop(name, None)
    nrrd.write(str(path), np.asarray(data, dtype=np.dtype(volume["dtype"])), header, index_order="F")
