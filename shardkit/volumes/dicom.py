"""DICOM series (a folder of single-frame slices of one series) as one volume, through pydicom.

pydicom, not SimpleITK: it is pure Python (one small wheel, no compiled ITK of ~100 MB), reads a file's header
without its pixels (``stop_before_pixels``, ``defer_size``), so every check below runs before a pixel is decoded,
and its own :func:`pydicom.pixels.apply_modality_lut` is the rule the voxels are scaled by.

Bounded and checked, in order: at most :data:`MAX_FILES` regular, non-hidden files (``DICOMDIR`` left out), each
at most :data:`MAX_FILE_BYTES`; a header-only pass over every file (large elements deferred, never read); the voxel
limit checked from Rows × Columns × files after the first header; one ``SeriesInstanceUID`` (two: refused naming
both), single-frame, one sample per pixel, the same Rows, Columns, PixelSpacing, ImageOrientationPatient, bits and
transfer syntax in every file; transfer syntax uncompressed (little or big endian) or RLE Lossless (pydicom decodes
it itself; JPEG, JPEG-LS, JPEG 2000 and deflate need plugins and are refused).

Geometry: slices are sorted along the slice normal (row direction × column direction of ImageOrientationPatient) by
ImagePositionPatient · normal; the slice spacing is the step between positions, refused when a position is missing or
repeated, the steps are uneven (more than :data:`SPACING_TOLERANCE` of the step) or the positions leave the normal
(gantry tilt: more than :data:`TILT_TOLERANCE` sideways per mm). Array axes: (column index, row index, slice
in position order); the affine maps them to **RAS** (DICOM is LPS: x and y negated), as :mod:`.nrrd`'s.

Voxels: the stored integers through pydicom's ``apply_modality_lut`` (RescaleSlope/Intercept; a Modality LUT
Sequence is refused). Without a rescale the stored type is kept (``uint16`` MR stays ``uint16``). With one, the
volume is ``int16`` when every slope and intercept is integral and the stored range maps inside int16 (CT in HU),
``int32`` when it maps inside int32, else ``float32`` (pydicom's float64 result rounded to float32). The type is
decided from the headers, before decoding, and logged.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DecodeError
from ..support.limits import DEFAULT_MAX_VOXELS
from .volume import VolumeHeader, checked_grid, volume_library

log = logging.getLogger(__name__)

#: Most files a series folder may hold (one slice each).
MAX_FILES = 4096
#: Largest slice file read (a 4096 x 4096 32-bit slice is 64 MiB, plus its header).
MAX_FILE_BYTES = 80 << 20
#: Elements longer than this are left unread in the header pass (pydicom ``defer_size``).
DEFER_BYTES = 4096
#: Largest allowed difference between slice steps, as a fraction of the mean step.
SPACING_TOLERANCE = 1e-3
#: Largest sideways drift of a slice's position off the slice normal, per mm along it (0.01: about 0.6 degrees).
TILT_TOLERANCE = 0.01
#: Transfer syntaxes read: uncompressed (implicit/explicit little, explicit big endian) and RLE Lossless.
_SYNTAXES = {"1.2.840.10008.1.2": "implicit VR little endian", "1.2.840.10008.1.2.1": "explicit VR little endian",
             "1.2.840.10008.1.2.2": "explicit VR big endian", "1.2.840.10008.1.2.5": "RLE lossless"}
_FIX_SERIES = "put one DICOM series (one SeriesInstanceUID, its slices only) in each folder"


def _pydicom() -> Any:
    return volume_library("pydicom", "pydicom", "DICOM series")


@dataclass(frozen=True)
class _Slice:
    path: Path
    position: float
    origin: tuple[float, ...]
    slope: float | None
    intercept: float | None


def series_files(folder: Path) -> list[Path]:
    """The folder's slice files, sorted by name (what the reader reads and a run fingerprints): regular,
    non-hidden, not ``DICOMDIR``, at most :data:`MAX_FILES`."""
    if not folder.is_dir():
        raise DecodeError("is not a folder", path=folder, fix="point at the folder holding the series' slices")
    out = []
    with os.scandir(folder) as entries:
        for e in entries:
            if e.name.startswith(".") or e.name.upper() == "DICOMDIR":
                continue
            if not e.is_file(follow_symlinks=False):
                raise DecodeError(f"holds {e.name!r}, which is not a regular file", path=folder, fix=_FIX_SERIES)
            out.append(Path(e.path))
            if len(out) > MAX_FILES:
                raise DecodeError(f"holds more than {MAX_FILES} files", path=folder, fix=_FIX_SERIES)
    if not out:
        raise DecodeError("holds no DICOM files", path=folder, fix=_FIX_SERIES)
    return sorted(out)


def _header(path: Path) -> Any:
    """One file's header, pixels not read, long elements deferred."""
    pydicom = _pydicom()
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise DecodeError(f"is {size} bytes, more than {MAX_FILE_BYTES} for one slice", path=path,
                          fix="store one slice per file (multi-frame files are not read)")
    try:
        return pydicom.dcmread(path, stop_before_pixels=True, defer_size=DEFER_BYTES)
    except Exception as exc:
        raise DecodeError(f"is not a readable DICOM file ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})",
                          path=path, fix=_FIX_SERIES) from None


def _get(ds: Any, name: str, path: Path) -> Any:
    value = ds.get(name)
    if value is None or value == "":
        raise DecodeError(f"has no {name}", path=path, fix="only DICOM series with full image geometry are read "
                          "(CT, MR, PET slices); re-export the series")
    return value


def _floats(ds: Any, name: str, count: int, path: Path) -> tuple[float, ...]:
    value = _get(ds, name, path)
    try:
        out = (float(value),) if isinstance(value, (str, bytes, int, float)) else tuple(float(v) for v in value)
    except (TypeError, ValueError):
        out = ()
    if len(out) != count or not all(np.isfinite(out)):
        raise DecodeError(f"{name} {value!r} is not {count} finite numbers", path=path,
                          fix="the header is damaged: re-export the series")
    return out


def _rescale(ds: Any, path: Path) -> tuple[float | None, float | None]:
    if "ModalityLUTSequence" in ds:
        raise DecodeError("has a Modality LUT Sequence: only RescaleSlope/Intercept scaling is read", path=path,
                          fix="convert the series to NIfTI (e.g. dcm2niix) and convert that")
    if "RescaleSlope" in ds and "RescaleIntercept" in ds:
        return _floats(ds, "RescaleSlope", 1, path)[0], _floats(ds, "RescaleIntercept", 1, path)[0]
    return None, None


#: The last series' header passes, by folder and every slice file's (name, size, mtime, ctime, inode): a run reads
#: a case's series for its slice count, its checks and its decode, each header parsed once per process.
_PASSES: OrderedDict[tuple[Any, ...], tuple[VolumeHeader, list[_Slice], np.dtype[Any]]] = OrderedDict()
_PASSES_KEPT = 8
_PASSES_LOCK = threading.Lock()


def _series(folder: Path, max_voxels: int) -> tuple[VolumeHeader, list[_Slice], np.dtype[Any]]:
    """The checked header pass: the volume's header, its slices in order and the stored pixel type. Kept for the
    next call while no slice file's stat changes (any write changes its ctime): the same result, the headers not
    parsed again."""
    files = series_files(folder)
    try:
        key = (str(folder), *((p.name, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino)
                              for p in files for s in (p.stat(),)))
    except OSError:  # reported by the pass itself
        return _parse_series(folder, files, max_voxels)
    with _PASSES_LOCK:
        kept = _PASSES.get(key)
        if kept is not None and kept[0].voxels <= max_voxels:  # over the limit: the pass says so
            _PASSES.move_to_end(key)
            return kept
    got = _parse_series(folder, files, max_voxels)
    with _PASSES_LOCK:
        _PASSES[key] = got
        while len(_PASSES) > _PASSES_KEPT:
            _PASSES.popitem(last=False)
    return got


def _parse_series(folder: Path, files: list[Path], max_voxels: int) -> tuple[VolumeHeader, list[_Slice],
                                                                             np.dtype[Any]]:
    """:func:`_series` itself: every slice file's header read and checked."""
    first: dict[str, Any] = {}
    slices: list[_Slice] = []
    normal = np.zeros(3)
    for path in files:
        ds = _header(path)
        syntax = str(getattr(ds, "file_meta", {}).get("TransferSyntaxUID", ""))
        fields: dict[str, Any] = {"SeriesInstanceUID": str(_get(ds, "SeriesInstanceUID", path)),
                  "Rows": int(_get(ds, "Rows", path)), "Columns": int(_get(ds, "Columns", path)),
                  "TransferSyntaxUID": syntax,
                  "BitsAllocated": int(_get(ds, "BitsAllocated", path)),
                  "BitsStored": int(ds.get("BitsStored") or _get(ds, "BitsAllocated", path)),
                  "PixelRepresentation": int(_get(ds, "PixelRepresentation", path)),
                  "SamplesPerPixel": int(ds.get("SamplesPerPixel") or 1),
                  "NumberOfFrames": int(ds.get("NumberOfFrames") or 1),
                  "PixelSpacing": _floats(ds, "PixelSpacing", 2, path),
                  "ImageOrientationPatient": _floats(ds, "ImageOrientationPatient", 6, path)}
        if not first:
            first = dict(fields, Modality=str(ds.get("Modality", "")), file=path.name)
            if syntax not in _SYNTAXES:
                raise DecodeError(f"transfer syntax {syntax or '(none)'} is compressed (or unknown): only "
                                  "uncompressed and RLE lossless series are read", path=path,
                                  fix="decompress the series (e.g. gdcmconv --raw, dcmdjpeg) or convert it to NIfTI "
                                      "(dcm2niix)")
            dims: list[int] = [fields["Columns"], fields["Rows"], len(files)]
            if min(dims) >= 1:  # the voxel limit before any other file is opened
                checked_grid(folder, dims, (1.0, 1.0, 1.0), np.eye(4), np.dtype(np.uint8), max_voxels)
            if fields["SamplesPerPixel"] != 1 or fields["NumberOfFrames"] != 1:
                raise DecodeError(f"has {fields['SamplesPerPixel']} samples per pixel and {fields['NumberOfFrames']}"
                                  " frames: only single-frame greyscale slices are read", path=path,
                                  fix="convert the series to NIfTI (e.g. dcm2niix) and convert that")
            if fields["BitsAllocated"] not in (8, 16, 32):
                raise DecodeError(f"has {fields['BitsAllocated']} bits allocated: 8, 16 or 32 are read", path=path,
                                  fix="convert the series to NIfTI (e.g. dcm2niix) and convert that")
            iop = np.array(fields["ImageOrientationPatient"])
            normal = np.cross(iop[:3], iop[3:])
            if abs(np.linalg.norm(normal) - 1) > 1e-3 or abs(float(iop[:3] @ iop[3:])) > 1e-3:
                raise DecodeError(f"ImageOrientationPatient {list(iop)} is not two orthogonal unit vectors",
                                  path=path, fix="the header is damaged: re-export the series")
        else:
            for name, value in fields.items():
                if value != first[name]:
                    what = "series" if name == "SeriesInstanceUID" else name
                    raise DecodeError(f"mixes {what}: {path.name} has {value}, {first['file']} has {first[name]}",
                                      path=folder, fix=_FIX_SERIES)
        ipp = _floats(ds, "ImagePositionPatient", 3, path)
        slices.append(_Slice(path, float(np.array(ipp) @ normal), ipp, *_rescale(ds, path)))
    slices.sort(key=lambda s: s.position)
    step = _step(folder, slices, normal, ds)
    iop = np.array(first["ImageOrientationPatient"])
    row_step, col_step = first["PixelSpacing"]  # DICOM: between rows, between columns
    affine = np.eye(4)
    affine[:3, 0] = iop[:3] * col_step
    affine[:3, 1] = iop[3:] * row_step
    affine[:3, 2] = normal * step
    affine[:3, 3] = slices[0].origin
    affine[:2] *= -1  # LPS -> RAS
    stored = np.dtype(f"{'iu'[first['PixelRepresentation'] == 0]}{first['BitsAllocated'] // 8}")
    dtype = _voxel_type(stored, first["BitsStored"], slices, folder)
    dims = [first["Columns"], first["Rows"], len(slices)]
    spacing = (float(col_step), float(row_step), step)
    checked_grid(folder, dims, spacing, affine, dtype, max_voxels)
    record = {k: first[k] for k in ("SeriesInstanceUID", "Modality", "TransferSyntaxUID", "BitsStored")}
    record.update(files=len(slices), stored=stored.name)
    head = VolumeHeader(folder, (dims[0], dims[1], dims[2]), spacing,
                        tuple(tuple(float(v) for v in row) for row in affine), dtype.name,
                        base64.b64encode(json.dumps(record).encode()).decode("ascii"), "dicom")
    return head, slices, stored


def _step(folder: Path, slices: list[_Slice], normal: np.ndarray, ds: Any) -> float:
    """The slice spacing from the sorted positions (module docstring); one slice: SpacingBetweenSlices or
    SliceThickness, else 1 (logged)."""
    if len(slices) == 1:
        for name in ("SpacingBetweenSlices", "SliceThickness"):
            value = ds.get(name)
            if value and float(value) > 0:
                return float(value)
        log.info("%s: one slice without SpacingBetweenSlices or SliceThickness: slice spacing 1", folder)
        return 1.0
    pos = np.array([s.position for s in slices])
    steps = np.diff(pos)
    for a, b, d in zip(slices, slices[1:], steps, strict=False):
        if d <= 1e-4:
            raise DecodeError(f"{a.path.name} and {b.path.name} lie at the same position {a.position:g} mm along "
                              "the slice normal", path=folder, fix=_FIX_SERIES + " (no repeated slices)")
    mean = float(steps.mean())
    worst = int(np.argmax(np.abs(steps - mean)))
    if abs(steps[worst] - mean) > SPACING_TOLERANCE * mean:
        a, b = slices[worst], slices[worst + 1]
        raise DecodeError(f"has uneven slice spacing: {a.path.name} → {b.path.name} is {steps[worst]:g} mm, the mean "
                          f"step {mean:g} mm (steps {steps.min():g}..{steps.max():g})", path=folder,
                          fix="a series with missing slices or varying spacing: resample it (e.g. dcm2niix, "
                              "SimpleITK) and convert the NIfTI")
    origin = np.array(slices[0].origin)
    for s in slices[1:]:
        off = np.array(s.origin) - origin
        if np.linalg.norm(off - (off @ normal) * normal) > TILT_TOLERANCE * abs(off @ normal) + 1e-3:
            raise DecodeError(f"{s.path.name}'s position leaves the slice normal (a tilted gantry?)", path=folder,
                              fix="resample the series (e.g. dcm2niix corrects gantry tilt) and convert the NIfTI")
    return mean


def _voxel_type(stored: np.dtype[Any], bits: int, slices: list[_Slice], folder: Path) -> np.dtype[Any]:
    """The volume's element type (module docstring), decided from the headers."""
    scaled = [s for s in slices if s.slope is not None]
    if not scaled:
        return stored
    if len(scaled) != len(slices):
        raise DecodeError(f"{scaled[0].path.name} has RescaleSlope/Intercept, "
                          f"{next(s for s in slices if s.slope is None).path.name} has not", path=folder,
                          fix=_FIX_SERIES)
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if stored.kind == "i" else (0, (1 << bits) - 1)
    ends = [v * s.slope + s.intercept for s in scaled for v in (lo, hi)]  # type: ignore[operator]
    integral = all(float(s.slope or 0).is_integer() and float(s.intercept or 0).is_integer() for s in scaled)
    for kind in (np.int16, np.int32):
        info = np.iinfo(kind)
        if integral and info.min <= min(ends) and max(ends) <= info.max:
            return np.dtype(kind)
    log.info("%s: rescaled values are not integers within int32: float32 voxels", folder)
    return np.dtype(np.float32)


def is_series(path: Path) -> bool:
    """Whether ``path`` is a folder (read as one DICOM series)."""
    return Path(path).is_dir()


def read_header(folder: Path, max_voxels: int = DEFAULT_MAX_VOXELS) -> VolumeHeader:
    """The checked header of the DICOM series in ``folder``: only the slices' headers are read."""
    head, _, _ = _series(Path(folder), max_voxels)
    log.debug("%s: DICOM series of %d slices, %s voxels", folder, head.shape[2], head.dtype)
    return head


def read_voxels(head: VolumeHeader, max_voxels: int = DEFAULT_MAX_VOXELS) -> np.ndarray:
    """The series' voxels, shape ``head.shape``, each slice through pydicom's ``apply_modality_lut`` (module
    docstring). The header pass runs again, so a folder changed since :func:`read_header` is refused."""
    pydicom = _pydicom()
    from pydicom.pixels import apply_modality_lut

    again, slices, stored = _series(head.path, max(max_voxels, head.voxels))
    if (again.shape, again.dtype, again.affine) != (head.shape, head.dtype, head.affine):
        raise DecodeError("changed since its header was read", path=head.path, fix="run again")
    out = np.empty(head.shape, dtype=np.dtype(head.dtype))
    for k, s in enumerate(slices):
        try:
            ds = pydicom.dcmread(s.path)
            pixels = ds.pixel_array
        except Exception as exc:
            raise DecodeError(f"pixels cannot be decoded ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:120]})", path=s.path,
                              fix="check the file (a truncated copy?) or leave it out") from None
        if pixels.shape != (head.shape[1], head.shape[0]) or pixels.dtype.itemsize != stored.itemsize:
            raise DecodeError(f"pixels are {pixels.shape} {pixels.dtype}, its header says "
                              f"{(head.shape[1], head.shape[0])} {stored}", path=s.path,
                              fix="the file is damaged: re-export the series")
        out[:, :, k] = np.asarray(apply_modality_lut(pixels, ds)).T  # rows x columns -> (column, row)
    return out
