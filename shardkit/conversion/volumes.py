"""Volume cases read once and cut into slice samples, with the records that rebuild each label volume.

A case's modality files are read header first (:func:`~shardkit.volumes.nifti.read_header`: every limit checked
before a voxel is decoded), checked to share one grid — the same shape and affines equal within
:data:`AFFINE_TOLERANCE` — and the same element type, then each decoded once and cut into all its slices
(:func:`~shardkit.volumes.slices.cut`). Label volumes become exact class ids
(:func:`~shardkit.volumes.nifti.label_ids`) and every id must be in the class table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DecodeError, LabelError
from ..support.limits import DEFAULT_MAX_VOXELS
from ..volumes.files import read_header, read_voxels
from ..volumes.patches import PatchedVolume, Patching, VolumePatch, cut_patches
from ..volumes.slices import CutVolume, SliceCounts, Slicing, VolumeSlice, cut
from ..volumes.volume import VolumeHeader, label_ids
from .layouts.volumes import Case, VolumeLayout

log = logging.getLogger(__name__)

#: Largest difference between two affines' entries (mm) for volumes still to be on one grid (nibabel's
#: ``allclose`` scale: headers written in float32 differ by ~1e-5).
AFFINE_TOLERANCE = 1e-3
#: Voxels counted at a time by :func:`check_classes` (their intp copy: 32 MiB).
_COUNT_CHUNK = 1 << 22


@dataclass
class ReadCase:
    """A case decoded: modalities stacked ``(M, X, Y, Z)``, its label ids ``(X, Y, Z)`` (None in a test split),
    and the checked headers."""

    case: Case
    images: np.ndarray
    label: np.ndarray | None
    image_header: VolumeHeader
    label_header: VolumeHeader | None


def _same_grid(first: VolumeHeader, other: VolumeHeader, what: str) -> None:
    if other.shape != first.shape:
        raise DecodeError(f"{what} is {'x'.join(map(str, other.shape))}, {first.path.name} is "
                          f"{'x'.join(map(str, first.shape))}: not one grid", path=other.path,
                          fix="resample the case's volumes onto one grid before converting")
    diff = float(np.abs(other.affine_array() - first.affine_array()).max())
    if diff > AFFINE_TOLERANCE:
        raise DecodeError(f"{what}'s affine differs from {first.path.name}'s by up to {diff:.4g} "
                          f"(more than {AFFINE_TOLERANCE}): not one grid", path=other.path,
                          fix="resample the case's volumes onto one grid (or fix the headers) before converting")


def read_case(case: Case, classes: dict[int, str] | None, max_voxels: int = DEFAULT_MAX_VOXELS) -> ReadCase:
    """Every header of ``case`` checked (limits, one grid, one element type) before any voxel is decoded; then the
    modalities and label decoded once each."""
    heads = [read_header(p, max_voxels) for p in case.images]
    first = heads[0]
    for head in heads[1:]:
        _same_grid(first, head, "modality")
        if head.dtype != first.dtype:
            raise DecodeError(f"holds {head.dtype} voxels, {first.path.name} {first.dtype}: bands of one sample "
                              "share one type", path=head.path,
                              fix="store the case's modalities in one type (e.g. all float32)")
    label_head = None
    if case.label is not None:
        label_head = read_header(case.label, max_voxels)
        _same_grid(first, label_head, "label volume")
    if len(heads) == 1:  # no stacking: the decoded array itself (one copy of the volume in memory, not two)
        images = read_voxels(first)[None]
    else:
        images = np.empty((len(heads), *first.shape), dtype=np.dtype(first.dtype))
        for band, head in enumerate(heads):
            images[band] = read_voxels(head)
    label = None
    if label_head is not None:
        label = label_ids(read_voxels(label_head), label_head.path)
        check_classes(label, classes, label_head.path)
    return ReadCase(case, images, label, first, label_head)


def check_classes(ids: np.ndarray, classes: dict[int, str] | None, path: Path) -> None:
    """LabelError naming the first id of ``ids`` not in ``classes`` and its voxel count (no table: any id >= 0)."""
    if ids.dtype.kind == "u" and ids.dtype.itemsize <= 2:  # uint8/uint16 (label_ids): a count per id, no sort
        flat = ids.reshape(-1, order="A")  # a view in the array's own order (NIfTI volumes decode Fortran-ordered)
        counts = np.zeros(1 << (8 * ids.dtype.itemsize), np.int64)
        for start in range(0, flat.size, _COUNT_CHUNK):  # bincount takes intp: 8 bytes a voxel, so by chunks
            counts += np.bincount(flat[start: start + _COUNT_CHUNK], minlength=counts.size)
        values = np.flatnonzero(counts)
        counts = counts[values]
    else:
        values, counts = np.unique(ids, return_counts=True)
    for value, count in zip(values.tolist(), counts.tolist(), strict=True):
        if value < 0 or (classes is not None and value not in classes):
            known = "ids >= 0" if classes is None else f"the classes {sorted(classes)} of dataset.json 'labels'"
            raise LabelError(f"label value {value} ({count} voxels) is not one of {known}", path=path,
                             fix="add the class to dataset.json 'labels', or correct the label volume")


@dataclass
class VolumeRun:
    """What cutting a layout's split gave besides its samples: how (slices or patches), counts and, per case, the
    record that rebuilds its label volume (the manifest's ``volumes``)."""

    slicing: Slicing | Patching
    counts: SliceCounts = field(default_factory=SliceCounts)
    volumes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        if isinstance(self.slicing, Patching):
            counts = self.counts.to_json()
            return {"patching": self.slicing.to_json(), "volumes": self.volumes,
                    "patches": {"volumes": counts["volumes"], "patches": counts["slices"],
                                "written": counts["written"], "dropped_empty": counts["dropped_empty"]}}
        return {"slicing": self.slicing.to_json(), "slices": self.counts.to_json(), "volumes": self.volumes}


def _volume_record(layout: VolumeLayout, read: ReadCase) -> dict[str, Any]:
    case = read.case
    return {"group": case.key, "images": [str(p.relative_to(layout.root)) for p in case.images],
            "label": None if case.label is None else str(case.label.relative_to(layout.root)),
            "image": read.image_header.to_json(),
            "label_volume": None if read.label_header is None else read.label_header.to_json()}


def cut_split(layout: VolumeLayout, split: str, slicing: Slicing | Patching, run: VolumeRun,
              max_voxels: int = DEFAULT_MAX_VOXELS) -> Iterator[VolumeSlice | VolumePatch]:
    """Every sample of ``split`` (slices, or 3-D patches with a :class:`~shardkit.volumes.patches.Patching`),
    case by case (each case decoded once), recording each case in ``run``."""
    for case in layout.splits[split]:
        read = read_case(case, layout.classes, max_voxels)
        if isinstance(slicing, Patching):
            log.info("%s: 3-D patches %s, stride %s, orientation as stored (%s per its affine), empty patches %s",
                     case.key, "x".join(map(str, slicing.size)), "x".join(map(str, slicing.step)),
                     _axcodes(read.image_header), slicing.empty)
            patched = PatchedVolume(case.key, read.image_header.shape)
            yield from cut_patches(case.key, read.images, read.label, slicing, read.image_header.affine_array(),
                                   patched, run.counts)
            run.volumes[case.key] = {**_volume_record(layout, read),
                                     "dropped_empty": [list(o) for o in patched.dropped]}
            continue
        axis, why = slicing.axis_for(read.image_header.spacing)
        log.info("%s: slices along %s; orientation as stored (%s per its affine), context %d each side (edge "
                 "replicate), empty slices %s", case.key, why, _axcodes(read.image_header), slicing.context,
                 slicing.empty)
        cutting = CutVolume(case.key, axis, read.image_header.shape[axis])
        yield from cut(case.key, read.images, read.label, read.image_header.spacing, slicing, run.counts, cutting,
                       read.image_header.affine_array())
        run.volumes[case.key] = {**_volume_record(layout, read), "axis": axis, "depth": cutting.depth,
                                 "dropped_empty": cutting.dropped}


def _axcodes(head: VolumeHeader) -> str:
    import nibabel

    return "".join(str(c) for c in nibabel.aff2axcodes(head.affine_array()))
