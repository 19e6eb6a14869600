"""NIfTI volumes (``.nii``, ``.nii.gz``) through nibabel: the header checked before any voxel is decoded, the
voxels as nibabel decodes them, labels taken as exact integers.

Everything a hostile header can say is refused in one line before the decode: a shape that is not 3-D (a 4-D
file of one volume is taken as 3-D), a side of 0, more voxels than the limit (so a ``.nii.gz`` whose gzip stream
would inflate past the header's shape is never read past it: nibabel reads exactly the header's bytes), a spacing
that is zero, negative or not finite, an affine that is not finite or is singular. Orientation is kept **as
stored**: the array axes are the file's, and the affine that maps them to the scanner's space is recorded, so a
label volume rebuilt from its slices is the stored one voxel for voxel (:mod:`shardkit.volumes.slices`).
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DecodeError, LabelError
from ..support.extras import install_hint
from ..support.limits import DEFAULT_MAX_VOXELS

log = logging.getLogger(__name__)

#: File names read as NIfTI volumes.
NIFTI_SUFFIXES = (".nii.gz", ".nii")
#: Element types a volume may hold (nibabel's decode of them; complex and RGB types are refused).
_KINDS = "biuf"


def is_nifti(name: str) -> bool:
    """Whether a file name is a NIfTI volume's (``.nii`` or ``.nii.gz``, any case)."""
    return name.lower().endswith(NIFTI_SUFFIXES)


def stem(name: str) -> str:
    """A NIfTI file name without its suffix (``case_0000.nii.gz`` → ``case_0000``)."""
    for suffix in NIFTI_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


@dataclass(frozen=True)
class VolumeHeader:
    """What a volume's header says, checked: its grid (shape, spacing, affine), element type and the header
    itself (its bytes, so that a label volume rebuilt from slices carries the same header)."""

    path: Path
    shape: tuple[int, int, int]
    #: voxel spacing along each array axis (the header's zooms), all finite and > 0
    spacing: tuple[float, float, float]
    #: 4x4 voxel-to-world matrix (nibabel's ``affine``: sform, else qform), finite and invertible
    affine: tuple[tuple[float, ...], ...]
    #: the element type nibabel decodes to (scaling applied when the header has a slope/intercept)
    dtype: str
    #: the header's own bytes (NIfTI-1: 348, NIfTI-2: 540), base64
    header: str
    #: ``"nifti1"`` or ``"nifti2"``
    version: str

    @property
    def voxels(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def affine_array(self) -> np.ndarray:
        return np.array(self.affine, dtype=np.float64)

    def to_json(self) -> dict[str, Any]:
        """The volume's record in a manifest (formats/manifest.md ``volumes``)."""
        return {"shape": list(self.shape), "spacing": list(self.spacing), "affine": [list(r) for r in self.affine],
                "dtype": self.dtype, "nifti": self.version, "header": self.header}


def _nibabel() -> Any:
    """nibabel, or a one-line ConfigError saying how to install it (the ``volumes`` extra)."""
    try:
        import nibabel
    except ImportError:
        raise ConfigError("reading NIfTI volumes needs nibabel, which is not installed",
                          fix=install_hint("volumes")) from None
    return nibabel


def read_header(path: Path, max_voxels: int = DEFAULT_MAX_VOXELS) -> VolumeHeader:
    """The checked header of NIfTI file ``path`` (nothing but the header is read); one-line DecodeError for a
    file nibabel cannot parse or a header that says something no volume can be."""
    nib = _nibabel()
    path = Path(path)
    if not path.is_file():
        raise DecodeError("is not a regular file", path=path, fix="point at the .nii or .nii.gz file itself")
    try:
        img = nib.load(str(path), mmap=False)
        header = img.header
        dims = [int(d) for d in header["dim"][1: 1 + int(header["dim"][0])]] if 0 < header["dim"][0] <= 7 else None
    except Exception as exc:  # nibabel raises many kinds for a damaged header: each is the one line below
        raise DecodeError(f"is not a NIfTI file nibabel can read ({type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:160]})", path=path,
                          fix="check the file (a truncated download?) or leave it out") from None
    if dims is None:
        raise DecodeError(f"header dim[0] is {int(header['dim'][0])}, not 1..7", path=path,
                          fix="the header is damaged: re-export the volume")
    if len(dims) == 4 and dims[3] == 1:
        dims = dims[:3]  # one volume stored as 4-D
    if len(dims) != 3:
        raise DecodeError(f"is {len(dims)}-D ({'x'.join(map(str, dims))}): only 3-D volumes are read",
                          path=path, fix="store each 3-D volume (each modality, each time point) as its own file")
    if min(dims) < 1:
        raise DecodeError(f"header shape {'x'.join(map(str, dims))} has a side below 1", path=path,
                          fix="the header is damaged: re-export the volume")
    voxels = int(np.prod(dims, dtype=object))
    if voxels > max_voxels:
        raise DecodeError(f"volume is {'x'.join(map(str, dims))} = {voxels} voxels, more than the voxel limit "
                          f"{max_voxels}", path=path, fix="raise max_voxels (--max-voxels) if the machine has the "
                          "memory, or crop the volume")
    try:
        zooms = _stored_spacing(nib, img, path)
        affine = np.asarray(img.affine, dtype=np.float64)
        dtype = np.dtype(img.dataobj.dtype) if not _scaled(header) else _scaled_dtype(img)
    except Exception as exc:
        raise DecodeError(f"header cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})",
                          path=path, fix="the header is damaged: re-export the volume") from None
    if not all(np.isfinite(z) and z > 0 for z in zooms):
        raise DecodeError(f"header spacing {zooms} is not all finite and > 0", path=path,
                          fix="fix pixdim[1..3] in the header (e.g. nibabel header.set_zooms) or re-export it")
    if affine.shape != (4, 4) or not np.isfinite(affine).all() or abs(np.linalg.det(affine[:3, :3])) <= 0:
        raise DecodeError("header affine (sform/qform) is not finite or is singular", path=path,
                          fix="fix the header's sform/qform (nibabel img.set_sform) or re-export it")
    if dtype.kind not in _KINDS or dtype.fields is not None:
        raise DecodeError(f"holds {dtype} voxels: only integer and real volumes are read", path=path,
                          fix="store the volume as integers or float32")
    version = "nifti2" if int(header.sizeof_hdr) == 540 else "nifti1"
    return VolumeHeader(path, (dims[0], dims[1], dims[2]), (zooms[0], zooms[1], zooms[2]),
                        tuple(tuple(float(v) for v in row) for row in affine),
                        dtype.newbyteorder("=").name, base64.b64encode(header.binaryblock).decode("ascii"),
                        version)


def _stored_spacing(nib: Any, img: Any, path: Path) -> tuple[float, ...]:
    """pixdim[1..3] as the file holds them: nibabel's load repairs a negative one to its absolute value (and
    says so on stderr), which would hide a damaged header."""
    from nibabel.openers import ImageOpener

    with ImageOpener(str(path)) as fh:
        raw = type(img.header).from_fileobj(fh, check=False)
    return tuple(float(z) for z in raw["pixdim"][1:4])


def _scaled(header: Any) -> bool:
    slope, inter = header.get_slope_inter()
    return slope is not None and (slope != 1 or (inter is not None and inter != 0))


def _scaled_dtype(img: Any) -> np.dtype[Any]:
    return np.dtype(img.dataobj.get_scaled(np.empty((1,), img.dataobj.dtype)).dtype) if hasattr(
        img.dataobj, "get_scaled") else np.dtype(np.float64)


def read_voxels(head: VolumeHeader) -> np.ndarray:
    """The volume's voxels as nibabel decodes them (stored type; slope/intercept applied when the header has
    them), in native byte order, shape ``head.shape``: decoded once, whole (a ``.nii.gz`` is one gzip stream)."""
    nib = _nibabel()
    try:
        img = nib.load(str(head.path), mmap=False)
        data = np.asanyarray(img.dataobj)
    except Exception as exc:
        raise DecodeError(f"voxels cannot be decoded ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})",
                          path=head.path, fix="check the file (a truncated download?) or leave it out") from None
    data = np.asarray(data).reshape(head.shape)  # a 4-D file of one volume
    if not data.dtype.isnative:
        data = data.astype(data.dtype.newbyteorder("="))
    return data


#: Voxels of a float label volume checked at a time (their temporaries: ~6 bytes a voxel).
_CHECK_CHUNK = 1 << 22


def label_ids(data: np.ndarray, path: Path) -> np.ndarray:
    """A label volume's voxels as exact integer class ids in the smallest type that holds them (uint8, uint16,
    else int64): integers as they are, floats only when every voxel holds an integer (checked 4 Mi voxels at a
    time, so the check adds ~25 MB whatever the volume); else LabelError naming the first bad value and how many
    voxels hold it."""
    if data.dtype.kind not in "iub":
        flat = data.reshape(-1, order="A")  # a view in the array's own order
        for start in range(0, flat.size, _CHECK_CHUNK):
            part = flat[start: start + _CHECK_CHUNK]
            whole = np.isfinite(part)
            whole[whole] = part[whole] == np.floor(part[whole])
            if not whole.all():
                value = part[~whole][0]
                bad = int(flat.size - np.count_nonzero(np.isfinite(flat) & (flat == np.floor(flat))))
                count = int(np.count_nonzero(np.isnan(flat) if np.isnan(value) else flat == value))
                raise LabelError(f"label voxel value {value!r} is not an integer ({count} voxels hold it; "
                                 f"{bad} non-integer voxels in all)", path=path,
                                 fix="labels must be class ids: re-export the label volume with integer values")
    if data.size == 0:
        return data.astype(np.uint8)
    low, high = data.min(), data.max()
    if low < -(2**63) or high >= 2**63:
        raise LabelError(f"label values {low!r}..{high!r} are not class ids", path=path,
                         fix="re-export the label volume with class ids")
    kind = np.uint8 if low >= 0 and high < 256 else np.uint16 if low >= 0 and high < 65536 else np.int64
    return data.astype(kind, copy=False)
