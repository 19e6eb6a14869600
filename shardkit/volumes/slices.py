"""A volume cut into 2-D slices or 2.5-D stacks, each slice's provenance, and the label volume stitched back.

- **Axis**: slices are taken along one array axis of the volume *as stored* (``i``, ``j``, ``k`` = axes 0, 1, 2;
  no reorientation: the affine maps them to the world). By default the axis with the largest spacing (the
  acquisition axis of an anisotropic scan); among equal spacings the last of them (``k``, the slice axis NIfTI
  writers use). The choice and its reason are logged on every run.
- **Image of a slice**: ``(H, W, bands)``, H and W the two remaining axes in stored order. ``context`` K adds the K
  slices on each side: bands are modality-major, ``band = m * (2K + 1) + (K + offset)`` for offset ``-K..K``; beyond
  the volume's first or last slice the edge slice is repeated (edge replicate). Voxels keep their decoded type.
- **Label of a slice**: the centre slice's class ids only. ``empty="drop"`` leaves out slices whose label is all
  background (id 0); their indices are recorded, so :func:`stitch_labels` still rebuilds every voxel.
- **Provenance**: each slice records its case (its group), volume key, axis, index, in-plane spacing, and the
  volume's affine; :func:`slice_affine` gives the slice's own voxel-to-world matrix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError, LabelError

log = logging.getLogger(__name__)

#: The names of the array axes 0, 1, 2 (as stored).
AXES = "ijk"
#: What ``empty`` may be: keep every slice, or drop those whose label is all background (id 0).
EMPTY_CHOICES = ("keep", "drop")
#: Background class id: a slice whose label holds only this is "empty".
BACKGROUND = 0
#: Largest ``context`` (slices each side).
MAX_CONTEXT = 32


def parse_axis(text: str | int | None) -> int | None:
    """``--slices AXIS``: ``i``/``j``/``k`` or 0/1/2 → the array axis; ``auto`` or None → None (largest spacing)."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "auto")):
        return None
    name = str(text).strip().lower()
    if name in AXES:
        return AXES.index(name)
    if name in ("0", "1", "2"):
        return int(name)
    raise ConfigError(f"--slices {text!r} is not an array axis", fix="write --slices auto, i, j or k (or 0, 1, 2)")


def default_axis(spacing: tuple[float, float, float]) -> tuple[int, str]:
    """The axis of largest spacing (the last of equal ones) and the sentence saying why."""
    top = max(spacing)
    axis = max(a for a in range(3) if spacing[a] == top)
    tie = sum(1 for s in spacing if s == top) > 1
    why = (f"axis {AXES[axis]} ({axis}): the largest spacing {top:g} of {tuple(round(s, 6) for s in spacing)}"
           + (", the last of equal ones" if tie else ""))
    return axis, why


@dataclass(frozen=True)
class Slicing:
    """How volumes become samples: the axis (None: largest spacing), the context K and the empty-slice rule."""

    axis: int | None = None
    context: int = 0
    empty: str = "keep"

    def __post_init__(self) -> None:
        if self.axis is not None and self.axis not in (0, 1, 2):
            raise ConfigError(f"slice axis {self.axis} is not 0, 1 or 2", fix="write --slices auto, i, j or k")
        if not 0 <= self.context <= MAX_CONTEXT:
            raise ConfigError(f"--context {self.context} must be 0..{MAX_CONTEXT} slices each side",
                              fix="write --context 1 for 3 slices per sample")
        if self.empty not in EMPTY_CHOICES:
            raise ConfigError(f"--empty-slices {self.empty!r} is not one of {', '.join(EMPTY_CHOICES)}",
                              fix="write --empty-slices keep or --empty-slices drop")

    def axis_for(self, spacing: tuple[float, float, float]) -> tuple[int, str]:
        """The axis a volume of this spacing is cut along, and why (logged)."""
        if self.axis is not None:
            return self.axis, f"axis {AXES[self.axis]} ({self.axis}): asked for"
        return default_axis(spacing)

    def to_json(self) -> dict[str, Any]:
        return {"axis": None if self.axis is None else AXES[self.axis], "context": self.context,
                "context_padding": "edge", "empty": self.empty, "orientation": "as stored"}


@dataclass(frozen=True)
class VolumeSlice:
    """One sample cut from a case: its image ``(H, W, bands)``, label ids ``(H, W)`` (None without a label), and
    where it came from."""

    case: str
    axis: int
    index: int
    image: np.ndarray
    label: np.ndarray | None
    #: spacing of the slice's rows and columns (the two remaining axes), and of the slice axis
    spacing: tuple[float, float, float]
    #: the slice's own 4x4 voxel-to-world matrix (:func:`slice_affine`); None when the volume's was not given
    affine: tuple[tuple[float, ...], ...] | None = None

    @property
    def key(self) -> str:
        """``<case>/<axis><index>``, e.g. ``BRATS_001/k0042``."""
        return f"{self.case}/{AXES[self.axis]}{self.index:04d}"

    def record(self) -> dict[str, Any]:
        """The slice's provenance row: its group (the case), volume key, axis, index and spacing."""
        return {"key": self.key, "group": self.case, "volume": self.case, "axis": AXES[self.axis],
                "index": self.index, "spacing": list(self.spacing),
                "affine": None if self.affine is None else [list(row) for row in self.affine]}


@dataclass
class SliceCounts:
    """Slices of a run: found in the volumes, written, dropped as empty (the manifest's ``slices`` counts)."""

    volumes: int = 0
    slices: int = 0
    written: int = 0
    dropped_empty: int = 0

    def to_json(self) -> dict[str, int]:
        return {"volumes": self.volumes, "slices": self.slices, "written": self.written,
                "dropped_empty": self.dropped_empty}


@dataclass
class CutVolume:
    """A case's cut: the axis and the indices left out as empty (what :func:`stitch_labels` needs besides the
    stored slices)."""

    case: str
    axis: int
    depth: int
    dropped: list[int] = field(default_factory=list)


def cut(case: str, images: np.ndarray, label: np.ndarray | None, spacing: tuple[float, float, float],
        slicing: Slicing, counts: SliceCounts | None = None, cutting: CutVolume | None = None,
        affine: np.ndarray | None = None) -> Iterator[VolumeSlice]:
    """Every slice of one case along ``slicing``'s axis, in index order. ``images``: ``(M, X, Y, Z)`` (modalities
    first, one grid), ``label``: ``(X, Y, Z)`` class ids or None, ``affine``: the volume's (each slice then
    carries its own). Views, not copies, until a slice is stacked."""
    if images.ndim != 4 or (label is not None and label.shape != images.shape[1:]):
        raise ValueError(f"images {images.shape} and label {None if label is None else label.shape} do not match")
    axis = cutting.axis if cutting is not None else slicing.axis_for(spacing)[0]
    stack = np.moveaxis(images, axis + 1, 1)  # (M, depth, H, W)
    labels = None if label is None else np.moveaxis(label, axis, 0)
    depth, k = stack.shape[1], slicing.context
    rest = tuple(s for a, s in enumerate(spacing) if a != axis)
    plane = (rest[0], rest[1], spacing[axis])
    if counts is not None:
        counts.volumes += 1
    for index in range(depth):
        if counts is not None:
            counts.slices += 1
        ids = None if labels is None else labels[index]
        if slicing.empty == "drop" and ids is not None and not ids.any():
            if counts is not None:
                counts.dropped_empty += 1
            if cutting is not None:
                cutting.dropped.append(index)
            continue
        picks = np.clip(np.arange(index - k, index + k + 1), 0, depth - 1)  # edge replicate
        image = np.ascontiguousarray(np.moveaxis(stack[:, picks], (0, 1), (2, 3)).reshape(
            stack.shape[2], stack.shape[3], -1))
        if counts is not None:
            counts.written += 1
        own = None if affine is None else tuple(tuple(float(v) for v in row)
                                                for row in slice_affine(affine, axis, index))
        yield VolumeSlice(case, axis, index, image, None if ids is None else np.ascontiguousarray(ids), plane, own)


def slice_affine(affine: np.ndarray, axis: int, index: int) -> np.ndarray:
    """The 4x4 voxel-to-world matrix of slice ``index`` along ``axis``: maps (row, column, 0) of the slice's
    image to the world point of the volume voxel it came from."""
    order = [a for a in range(3) if a != axis] + [axis]
    out = np.eye(4)
    out[:3, :3] = affine[:3, order]
    out[:3, 3] = affine[:3, 3] + affine[:3, axis] * index
    return out


def stitch_labels(shape: tuple[int, int, int], axis: int, slices: Iterable[tuple[int, np.ndarray]],
                  dropped: Iterable[int] = (), dtype: Any = np.int64) -> np.ndarray:
    """The label volume of ``shape`` rebuilt from its slices (``(index, ids (H, W))``, any order) and the indices
    dropped as empty (background). Every index must come exactly once, from one or the other: LabelError names
    the first missing or repeated one."""
    out = np.zeros(shape, dtype=dtype)
    view = np.moveaxis(out, axis, 0)
    seen = np.zeros(shape[axis], dtype=bool)
    for index in dropped:
        if seen[index]:
            raise LabelError(f"slice {index} along axis {AXES[axis]} is recorded twice")
        seen[index] = True
    for index, ids in slices:
        if not 0 <= index < shape[axis] or seen[index]:
            raise LabelError(f"slice {index} along axis {AXES[axis]} is outside 0..{shape[axis] - 1} or repeated")
        if ids.shape != view.shape[1:]:
            raise LabelError(f"slice {index} is {ids.shape}, not the volume's {view.shape[1:]}")
        view[index] = ids
        seen[index] = True
    if not seen.all():
        raise LabelError(f"slice {int(np.flatnonzero(~seen)[0])} along axis {AXES[axis]} is missing "
                         f"({int((~seen).sum())} of {shape[axis]} missing)",
                         fix="stitch every stored slice of the volume (all shards of the split)")
    return out
