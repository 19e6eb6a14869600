"""What every volume format gives: a checked header (:class:`VolumeHeader`: grid, element type, the header's own
bytes), the checks every header passes before a voxel is decoded (:func:`checked_grid`), and label volumes as exact
class ids (:func:`label_ids`). The formats: :mod:`~shardkit.volumes.nifti`, :mod:`~shardkit.volumes.nrrd`,
:mod:`~shardkit.volumes.dicom`;
:mod:`~shardkit.volumes.files` picks one by file name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DecodeError, LabelError
from ..support.extras import install_hint

#: Element types a volume may hold (complex and structured types are refused).
_KINDS = "biuf"


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
    #: the header's own bytes (NIfTI-1: 348, NIfTI-2: 540; NRRD: its text up to the blank line), base64
    header: str
    #: ``"nifti1"``, ``"nifti2"``, ``"nrrd"`` or ``"dicom"`` (a series folder; ``header``: a small JSON record of it)
    version: str
    #: modalities on a 4th axis (MSD's 4-D images; the voxels are then ``shape + (channels,)``); 1: a 3-D volume
    channels: int = 1

    @property
    def voxels(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def affine_array(self) -> np.ndarray:
        return np.array(self.affine, dtype=np.float64)

    def to_json(self) -> dict[str, Any]:
        """The volume's record in a manifest (formats/manifest.md ``volumes``)."""
        return {"shape": list(self.shape), "spacing": list(self.spacing), "affine": [list(r) for r in self.affine],
                "dtype": self.dtype, "format": self.version, "header": self.header,
                **({"channels": self.channels} if self.channels > 1 else {})}


def checked_grid(path: Path, dims: list[int], spacing: tuple[float, ...], affine: np.ndarray, dtype: np.dtype[Any],
                 max_voxels: int) -> None:
    """The refusals every volume header gets before a voxel is decoded (one line each): not 3-D, a side below 1,
    more voxels than ``max_voxels``, a spacing that is not finite and > 0, an affine that is not finite or is
    singular, an element type that is not integer or real."""
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
    if len(spacing) != 3 or not all(np.isfinite(z) and z > 0 for z in spacing):
        raise DecodeError(f"header spacing {spacing} is not all finite and > 0", path=path,
                          fix="fix the header's spacing (NIfTI pixdim[1..3], NRRD space directions) or re-export it")
    if affine.shape != (4, 4) or not np.isfinite(affine).all() or abs(np.linalg.det(affine[:3, :3])) <= 0:
        raise DecodeError("header affine (sform/qform, space directions) is not finite or is singular", path=path,
                          fix="fix the header's orientation (NIfTI sform/qform, NRRD space directions) or re-export")
    if dtype.kind not in _KINDS or dtype.fields is not None:
        raise DecodeError(f"holds {dtype} voxels: only integer and real volumes are read", path=path,
                          fix="store the volume as integers or float32")


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


def volume_library(module: str, package: str, what: str) -> Any:
    """The reader library ``module`` (imported on first use: ``import shardkit`` loads none), or a one-line
    ConfigError saying that reading ``what`` needs ``package`` and how to install it (the ``volumes`` extra)."""
    try:
        return __import__(module)  # a top-level package; through builtins.__import__ as an import statement goes
    except ImportError:
        raise ConfigError(f"reading {what} needs {package}, which is not installed",
                          fix=install_hint("volumes")) from None
