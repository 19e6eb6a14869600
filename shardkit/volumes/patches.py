"""A volume cut into 3-D patches, each patch's provenance, and the label volume stitched back from them.

``--patch DxHxW --stride …`` (here :class:`Patching`): patches of D x H x W voxels along the array axes i, j, k as
stored, on the grid the 2-D tiles use (:func:`~shardkit.images.tiles.grid_starts`: starts ``0, s, 2s, …`` and the
last patch aligned to the volume's edge, so every voxel is covered and none is padding). Along an axis where the
volume is shorter than the patch, the patch is the volume's extent there, or — with ``pad_label`` (a conversion into
shards, whose samples share one size: the split's ignore index, never a class a loss counts) — padded at the far
end to the patch size: label voxels with ``pad_label``, image voxels with 0 in the stored type. A patch's
image is ``(D, H, W, modalities)`` in the decoded type, its label ``(D, H, W)`` class ids;
``empty="drop"`` leaves out patches whose label is all background (id 0), recorded so stitching still covers every
voxel. Patches are 3-D samples: nothing here flattens them into 2-D ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError, LabelError
from ..images.tiles import grid_starts
from .slices import EMPTY_CHOICES, SliceCounts

_TRIPLE = re.compile(r"^\s*(\d+)\s*[xX×,]\s*(\d+)\s*[xX×,]\s*(\d+)\s*$")
#: Most patches one volume may give (a stride of 1 on a large volume would store it thousands of times over).
MAX_PATCHES_PER_VOLUME = 1 << 20


def parse_triple(text: str | tuple[int, int, int] | None, flag: str) -> tuple[int, int, int] | None:
    """``"64x128x128"`` → (64, 128, 128) (D x H x W, each >= 1); None stays None."""
    if text is None or text == "":
        return None
    if isinstance(text, str):
        m = _TRIPLE.match(text)
        if not m:
            raise ConfigError(f"{flag} {text!r} is not DxHxW", fix=f"write it like {flag} 64x128x128")
        values = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    else:
        values = (int(text[0]), int(text[1]), int(text[2]))
    if min(values) < 1:
        raise ConfigError(f"{flag} {'x'.join(map(str, values))} must be at least 1x1x1",
                          fix=f"write it like {flag} 64x128x128")
    return values


@dataclass(frozen=True)
class Patching:
    """3-D patch options: size and stride (D, H, W; stride defaults to the size) and the empty-patch rule."""

    size: tuple[int, int, int]
    stride: tuple[int, int, int] | None = None
    empty: str = "keep"

    def __post_init__(self) -> None:
        if min(self.size) < 1:
            raise ConfigError(f"--patch {self.size} must be at least 1x1x1")
        step = self.step
        if not all(1 <= s <= p for s, p in zip(step, self.size, strict=True)):
            raise ConfigError(f"--stride {'x'.join(map(str, step))} must be 1..the patch size "
                              f"{'x'.join(map(str, self.size))} per axis (a larger stride would leave voxels out)",
                              fix="choose a smaller --stride")
        if self.empty not in EMPTY_CHOICES:
            raise ConfigError(f"--empty-patches {self.empty!r} is not one of {', '.join(EMPTY_CHOICES)}",
                              fix="write keep or drop")

    @classmethod
    def parse(cls, size: str, stride: str | None = None, empty: str = "keep") -> Patching:
        """The patching of ``--patch DxHxW [--stride DxHxW] [--empty-patches keep|drop]``."""
        parsed = parse_triple(size, "--patch")
        if parsed is None:
            raise ConfigError("--patch needs a size", fix="write it like --patch 64x128x128")
        return cls(parsed, parse_triple(stride, "--stride"), empty)

    @property
    def step(self) -> tuple[int, int, int]:
        return self.stride or self.size

    def origins(self, shape: tuple[int, int, int]) -> list[tuple[int, int, int]]:
        """The (i, j, k) corners of a volume of ``shape``'s patches, in C order; refused above
        :data:`MAX_PATCHES_PER_VOLUME` before any is cut."""
        axes = [grid_starts(n, p, s) for n, p, s in zip(shape, self.size, self.step, strict=True)]
        total = len(axes[0]) * len(axes[1]) * len(axes[2])
        if total > MAX_PATCHES_PER_VOLUME:
            raise ConfigError(f"--patch {'x'.join(map(str, self.size))} --stride {'x'.join(map(str, self.step))} "
                              f"gives {total} patches of a {'x'.join(map(str, shape))} volume, more than "
                              f"{MAX_PATCHES_PER_VOLUME}", fix="choose a larger --stride or --patch")
        return [(a, b, c) for a in axes[0] for b in axes[1] for c in axes[2]]

    def extent(self, shape: tuple[int, int, int]) -> tuple[int, int, int]:
        """A patch's size in a volume of ``shape``: the patch size, clipped to the volume per axis."""
        return (min(self.size[0], shape[0]), min(self.size[1], shape[1]), min(self.size[2], shape[2]))

    def to_json(self) -> dict[str, Any]:
        return {"patch": list(self.size), "stride": list(self.step), "empty": self.empty, "orientation": "as stored",
                "padding": "none: clipped to the volume"}


@dataclass(frozen=True)
class VolumePatch:
    """One 3-D sample: image ``(D, H, W, modalities)``, label ids ``(D, H, W)`` (None without a label), its
    corner in the volume and its own voxel-to-world affine (None when the volume's was not given)."""

    case: str
    origin: tuple[int, int, int]
    image: np.ndarray
    label: np.ndarray | None
    affine: tuple[tuple[float, ...], ...] | None = None
    #: the voxels of the volume the patch holds (D, H, W) from its corner; the rest of ``image`` is padding
    extent: tuple[int, int, int] | None = None
    #: spacing along i, j, k (the volume's)
    spacing: tuple[float, float, float] | None = None

    @property
    def key(self) -> str:
        """``<case>/p<i>_<j>_<k>``."""
        return f"{self.case}/p{self.origin[0]}_{self.origin[1]}_{self.origin[2]}"

    def record(self) -> dict[str, Any]:
        return {"key": self.key, "group": self.case, "volume": self.case, "origin": list(self.origin),
                "size": list(self.extent or self.image.shape[:3]), "shape": list(self.image.shape[:3]),
                "spacing": None if self.spacing is None else list(self.spacing),
                "affine": None if self.affine is None else [list(r) for r in self.affine]}


@dataclass
class PatchedVolume:
    """A case's patches left out as empty (their corners), for :func:`stitch_patches`."""

    case: str
    shape: tuple[int, int, int]
    dropped: list[tuple[int, int, int]] = field(default_factory=list)


def cut_patches(case: str, images: np.ndarray, label: np.ndarray | None, patching: Patching,
                affine: np.ndarray | None = None, cutting: PatchedVolume | None = None,
                counts: SliceCounts | None = None, pad_label: int | None = None,
                spacing: tuple[float, float, float] | None = None) -> Iterator[VolumePatch]:
    """Every patch of one case in C order of their corners. ``images``: ``(M, X, Y, Z)``, ``label``:
    ``(X, Y, Z)`` ids or None, ``affine``: the volume's 4x4 (each patch then carries its own, translated);
    ``counts``: patches found, written and dropped (its ``slices`` field counts patches here); ``pad_label``:
    pad patches of a volume shorter than the patch to the patch size (labels with it, images with 0)."""
    if counts is not None:
        counts.volumes += 1
    if images.ndim != 4 or (label is not None and label.shape != images.shape[1:]):
        raise ValueError(f"images {images.shape} and label {None if label is None else label.shape} do not match")
    shape = (int(images.shape[1]), int(images.shape[2]), int(images.shape[3]))
    d, h, w = patching.extent(shape)
    for o in patching.origins(shape):
        region = (slice(o[0], o[0] + d), slice(o[1], o[1] + h), slice(o[2], o[2] + w))
        ids = None if label is None else label[region]
        if counts is not None:
            counts.slices += 1
        if patching.empty == "drop" and ids is not None and not ids.any():
            if cutting is not None:
                cutting.dropped.append(o)
            if counts is not None:
                counts.dropped_empty += 1
            continue
        if counts is not None:
            counts.written += 1
        image = np.ascontiguousarray(np.moveaxis(images[(slice(None), *region)], 0, -1))
        if pad_label is not None and (d, h, w) != patching.size:
            image, ids = _padded(image, ids, patching.size, pad_label)
        own = None
        if affine is not None:
            moved = np.array(affine, dtype=np.float64)
            moved[:3, 3] = affine[:3, :3] @ np.array(o, dtype=np.float64) + affine[:3, 3]
            own = tuple(tuple(float(v) for v in row) for row in moved)
        yield VolumePatch(case, o, image, None if ids is None else np.ascontiguousarray(ids), own, (d, h, w), spacing)


def _padded(image: np.ndarray, ids: np.ndarray | None, size: tuple[int, int, int],
            pad_label: int) -> tuple[np.ndarray, np.ndarray | None]:
    """A patch of a volume shorter than ``size`` padded at the far end: image voxels 0, label voxels ``pad_label``."""
    d, h, w = image.shape[:3]
    full = np.zeros((*size, image.shape[3]), image.dtype)
    full[:d, :h, :w] = image
    if ids is None:
        return full, None
    labels = np.full(size, pad_label, ids.dtype)
    labels[:d, :h, :w] = ids
    return full, labels


def stitch_patches(shape: tuple[int, int, int], patches: Iterable[tuple[tuple[int, int, int], np.ndarray]],
                   patching: Patching, dropped: Iterable[tuple[int, int, int]] = (),
                   dtype: Any = np.int64) -> np.ndarray:
    """The label volume of ``shape`` from its patches (``(origin, ids (D, H, W))``, any order) and the corners
    dropped as empty (a patch padded to the patch size is cropped to the volume). Every voxel must be covered, and
    where patches overlap they must agree — they are cut from one label volume, so any disagreement means a patch of
    another volume or a damaged shard: LabelError, never a vote."""
    out = np.zeros(shape, dtype=dtype)
    seen = np.zeros(shape, dtype=bool)
    size = patching.extent(shape)
    expected = set(patching.origins(shape))
    done: set[tuple[int, int, int]] = set()
    for origin in dropped:
        origin = tuple(int(v) for v in origin)  # type: ignore[assignment]
        if origin not in expected or origin in done:
            raise LabelError(f"dropped patch at {origin} is not on the grid or is recorded twice")
        done.add(origin)
        seen[tuple(slice(a, a + n) for a, n in zip(origin, size, strict=True))] = True
    for origin, ids in patches:
        origin = tuple(int(v) for v in origin)  # type: ignore[assignment]
        if origin not in expected or origin in done:
            raise LabelError(f"patch at {origin} is not on the grid of {'x'.join(map(str, shape))} or repeated")
        if tuple(ids.shape) == patching.size and size != patching.size:  # padded: the volume's part
            ids = ids[:size[0], :size[1], :size[2]]
        if tuple(ids.shape) != size:
            raise LabelError(f"patch at {origin} is {'x'.join(map(str, ids.shape))}, not "
                             f"{'x'.join(map(str, size))}")
        region = tuple(slice(a, a + n) for a, n in zip(origin, size, strict=True))
        overlap = seen[region]
        if (out[region][overlap] != ids[overlap]).any():
            raise LabelError(f"patch at {origin} disagrees with an overlapping patch")
        out[region] = ids
        seen[region] = True
        done.add(origin)
    if len(done) != len(expected):
        missing = sorted(expected - done)
        raise LabelError(f"patch at {missing[0]} is missing ({len(missing)} of {len(expected)} missing)",
                         fix="stitch every stored patch of the volume (all shards of the split)")
    if not seen.all():  # cannot happen on this grid; kept so that a wrong grid never passes as a volume
        raise LabelError("the patches leave voxels uncovered")
    return out
