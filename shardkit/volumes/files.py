"""Which reader a volume file takes (by its name: NIfTI ``.nii``/``.nii.gz``, NRRD ``.nrrd``; a folder is a DICOM
series), and writing a rebuilt label volume back in its own format with its own header."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..support.limits import DEFAULT_MAX_VOXELS
from . import dicom, nifti, nrrd
from .volume import VolumeHeader

#: Every file name ending read as a volume, longest first (``.nii.gz`` before ``.nii``).
VOLUME_SUFFIXES = (*nifti.NIFTI_SUFFIXES, *nrrd.NRRD_SUFFIXES)


def is_volume(name: str) -> bool:
    """Whether a file name is a volume's (any case)."""
    return name.lower().endswith(VOLUME_SUFFIXES)


def volume_stem(name: str) -> str:
    """A volume file name without its suffix (``case_0000.nii.gz`` → ``case_0000``)."""
    for suffix in VOLUME_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def _module(path: Path) -> Any:
    if dicom.is_series(path):
        return dicom
    return nrrd if path.name.lower().endswith(nrrd.NRRD_SUFFIXES) else nifti


def read_header(path: Path, max_voxels: int = DEFAULT_MAX_VOXELS, channels: int = 1) -> VolumeHeader:
    """The checked header of a volume file (:func:`shardkit.volumes.nifti.read_header`,
    :func:`shardkit.volumes.nrrd.read_header`; a folder: :func:`shardkit.volumes.dicom.read_header`): nothing but
    the header is read. ``channels`` > 1: a 4-D NIfTI
    whose 4th axis holds that many modalities (MSD)."""
    if channels > 1:
        return nifti.read_header(Path(path), max_voxels, channels)
    return _module(Path(path)).read_header(Path(path), max_voxels)


def read_voxels(head: VolumeHeader, raw: np.ndarray | None = None) -> np.ndarray:
    """The voxels of a checked volume, decoded once, in their stored type and native byte order. ``raw``: the
    file's bytes, already read (and hashed) by the caller: a NIfTI file is then decoded from them, not read again
    (other formats read their files)."""
    if raw is not None and _module(head.path) is nifti:
        return nifti.read_voxels(head, raw)
    return _module(head.path).read_voxels(head)


def write_volume(data: np.ndarray, volume: Mapping[str, Any], path: Path) -> None:
    """Write a rebuilt volume (labels, or per-voxel predictions of the label's type) to ``path`` in the recorded
    volume's format with its header (``volume``: :meth:`~shardkit.volumes.volume.VolumeHeader.to_json`)."""
    if volume["format"] == "nrrd":
        nrrd.to_nrrd(data, dict(volume), path)
    else:
        nifti._nibabel().save(nifti.to_nifti(data, volume), str(path))
