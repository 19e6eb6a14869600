"""NIfTI volumes (``.nii``, ``.nii.gz``) through nibabel: the header checked before any voxel is decoded
(:func:`~shardkit.volumes.volume.checked_grid`), the voxels as nibabel decodes them.

Everything a hostile header can say is refused in one line before the decode: a shape that is not 3-D (a 4-D
file of one volume is taken as 3-D), a side of 0, more voxels than the limit (so a ``.nii.gz`` whose gzip stream
would inflate past the header's shape is never read past it: nibabel reads exactly the header's bytes), a spacing
that is zero, negative or not finite, an affine that is not finite or is singular. Orientation is kept **as
stored**: the array axes are the file's, and the affine that maps them to the scanner's space is recorded, so a
label volume rebuilt from its slices is the stored one voxel for voxel (:mod:`shardkit.volumes.slices`).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import io
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DecodeError, LabelError
from ..support.limits import DEFAULT_MAX_VOXELS
from .volume import VolumeHeader, checked_grid, volume_library

log = logging.getLogger(__name__)

#: File names read as NIfTI volumes.
NIFTI_SUFFIXES = (".nii.gz", ".nii")


def _nibabel() -> Any:
    return volume_library("nibabel", "nibabel", "NIfTI volumes")


def _problem(exc: Exception) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"


def read_header(path: Path, max_voxels: int = DEFAULT_MAX_VOXELS, channels: int = 1) -> VolumeHeader:
    """The checked header of NIfTI file ``path`` (nothing but the header is read); one-line DecodeError for a
    file nibabel cannot parse or a header that says something no volume can be. ``channels`` > 1: the file is
    4-D with that many modalities on its 4th axis (MSD); the voxel limit then counts them all."""
    nib = _nibabel()
    path = Path(path)
    if not path.is_file():
        raise DecodeError("is not a regular file", path=path, fix="point at the .nii or .nii.gz file itself")
    try:
        img = nib.load(str(path), mmap=False)
        header = img.header
        dims = [int(d) for d in header["dim"][1: 1 + int(header["dim"][0])]] if 0 < header["dim"][0] <= 7 else None
    except Exception as exc:  # nibabel raises many kinds for a damaged header: each is the one line below
        raise DecodeError(f"is not a NIfTI file nibabel can read ({_problem(exc)})", path=path,
                          fix="check the file (a truncated download?) or leave it out") from None
    if dims is None:
        raise DecodeError(f"header dim[0] is {int(header['dim'][0])}, not 1..7", path=path,
                          fix="the header is damaged: re-export the volume")
    if channels > 1:
        if len(dims) != 4 or dims[3] != channels:
            raise DecodeError(f"is {'x'.join(map(str, dims))}: dataset.json names {channels} modalities, so MSD "
                              f"stores them on a 4th axis of {channels}", path=path,
                              fix="check dataset.json's 'modality' against the images")
        dims = dims[:3]
        if min(dims) >= 1 and int(np.prod(dims, dtype=object)) * channels > max_voxels:
            raise DecodeError(f"volume is {'x'.join(map(str, dims))}x{channels} = "
                              f"{int(np.prod(dims, dtype=object)) * channels} voxels, more than the voxel limit "
                              f"{max_voxels}", path=path, fix="raise max_voxels (--max-voxels) if the machine has "
                              "the memory, or crop the volume")
    if len(dims) == 4 and dims[3] == 1:
        dims = dims[:3]  # one volume stored as 4-D
    if len(dims) == 3 and min(dims) >= 1:  # the voxel limit before anything else of the header is read
        checked_grid(path, dims, (1.0, 1.0, 1.0), np.eye(4), np.dtype(np.uint8), max_voxels)
    try:
        zooms = _stored_spacing(img, path)
        affine = np.asarray(img.affine, dtype=np.float64)
        dtype = _decoded_dtype(img)
    except Exception as exc:
        raise DecodeError(f"header cannot be read ({_problem(exc)})", path=path,
                          fix="the header is damaged: re-export the volume") from None
    checked_grid(path, dims, zooms, affine, dtype, max_voxels)
    version = "nifti2" if int(header.sizeof_hdr) == 540 else "nifti1"
    return VolumeHeader(path, (dims[0], dims[1], dims[2]), (zooms[0], zooms[1], zooms[2]),
                        tuple(tuple(float(v) for v in row) for row in affine),
                        dtype.newbyteorder("=").name, base64.b64encode(header.binaryblock).decode("ascii"),
                        version, channels)


def _stored_spacing(img: Any, path: Path) -> tuple[float, ...]:
    """pixdim[1..3] as the file holds them: nibabel's load repairs a negative one to its absolute value (and
    says so on stderr), which would hide a damaged header."""
    from nibabel.openers import ImageOpener

    with ImageOpener(str(path)) as fh:
        raw = type(img.header).from_fileobj(fh, check=False)
    return tuple(float(z) for z in raw["pixdim"][1:4])


def _decoded_dtype(img: Any) -> np.dtype[Any]:
    """The element type nibabel decodes to: the stored one, or its scaled type where the header has a
    slope/intercept (nibabel's own rule, applied to one zero). The slope is the array proxy's: nibabel's load
    moves it there and blanks the image header's."""
    stored = np.dtype(img.get_data_dtype())
    slope, inter = getattr(img.dataobj, "slope", 1.0), getattr(img.dataobj, "inter", 0.0)
    if slope == 1 and inter == 0:
        return stored
    from nibabel.volumeutils import apply_read_scaling

    return np.dtype(apply_read_scaling(np.zeros(1, stored), slope, inter).dtype)


#: Inflate ``.nii.gz`` files with python-isal's gzip reader when it is installed (``pip install isal``): the same
#: bytes about twice as fast (a 300 MB CT stream: 2.7 s with Python's gzip, 1.2-1.5 s with isal, measured).
FAST_GZIP = True


def _open_voxels(nib: Any, head: VolumeHeader, stack: contextlib.ExitStack, raw: np.ndarray | None = None) -> Any:
    """nibabel's image of ``head``'s file for decoding: a ``.nii.gz`` read through ``isal.igzip`` when installed
    (nibabel still reads exactly the header's bytes from it: the gzip-bomb bound holds), else ``nib.load``.
    ``raw``: the file's bytes in memory (read once by the caller), decoded the same way without opening it."""
    igzip: Any = None
    gz = head.path.name.endswith(".gz")
    if FAST_GZIP and gz:
        try:
            import isal.igzip as igzip
        except ImportError:
            igzip = None
    klass = nib.Nifti2Image if head.version == "nifti2" else nib.Nifti1Image
    if raw is not None:
        # the bytes object the caller's array views (np.frombuffer), shared rather than copied
        source = io.BytesIO(raw.base if isinstance(raw.base, bytes) else raw.tobytes())
        fileobj: Any = source if not gz else (igzip.IGzipFile if igzip is not None else gzip.GzipFile)(
            fileobj=source, mode="rb")
        stack.enter_context(fileobj)
        return klass.from_file_map({"image": nib.FileHolder(filename=str(head.path), fileobj=fileobj)}, mmap=False)
    if igzip is None:
        return nib.load(str(head.path), mmap=False)
    fileobj = stack.enter_context(igzip.open(str(head.path), "rb"))
    return klass.from_file_map({"image": nib.FileHolder(filename=str(head.path), fileobj=fileobj)}, mmap=False)


def read_voxels(head: VolumeHeader, raw: np.ndarray | None = None) -> np.ndarray:
    """The volume's voxels as nibabel decodes them (stored type; slope/intercept applied when the header has
    them), in native byte order, shape ``head.shape``: decoded once, whole (a ``.nii.gz`` is one gzip stream).
    ``raw``: the file's bytes (uint8), when the caller has read them already (to hash them): decoded from memory,
    so the file is read once and the voxels are those of the bytes hashed."""
    nib = _nibabel()
    try:
        with contextlib.ExitStack() as stack:
            img = _open_voxels(nib, head, stack, raw)
            data = np.asanyarray(img.dataobj)
    except Exception as exc:
        raise DecodeError(f"voxels cannot be decoded ({_problem(exc)})", path=head.path,
                          fix="check the file (a truncated download?) or leave it out") from None
    shape = head.shape if head.channels == 1 else (*head.shape, head.channels)
    data = np.asarray(data).reshape(shape, order="A")  # a 4-D file of one volume
    if not data.dtype.isnative:
        data = data.astype(data.dtype.newbyteorder("="))
    if data.dtype != np.dtype(head.dtype):
        raise DecodeError(f"decoded as {data.dtype}, its header says {head.dtype}", path=head.path,
                          fix="re-export the volume")
    return data


def to_nifti(data: np.ndarray, volume: Mapping[str, Any]) -> Any:
    """A nibabel image of ``data`` carrying the recorded header (``volume``: a label volume's
    :meth:`~shardkit.volumes.volume.VolumeHeader.to_json`): same type, shape, spacing, affine and header fields as
    the file it was cut from."""
    nib = _nibabel()
    raw = base64.b64decode(volume["header"])
    klass = nib.Nifti2Image if volume["format"] == "nifti2" else nib.Nifti1Image
    header = klass.header_class(raw)
    dtype = np.dtype(volume["dtype"])
    if tuple(data.shape) != tuple(volume["shape"]):
        raise LabelError(f"stitched volume is {data.shape}, the recorded one {tuple(volume['shape'])}")
    values = data.astype(dtype)
    if not np.array_equal(values, data):
        raise LabelError(f"stitched labels do not fit the recorded type {dtype}")
    return klass(values, None, header=header)
