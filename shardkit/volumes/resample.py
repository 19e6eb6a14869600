"""Resampling a case onto another voxel spacing once, at convert (``--spacing``): the grid MONAI's ``Spacing``
gives (its default ``scale_extent=False``, ``padding_mode="border"``), images by linear interpolation or cubic
B-spline (MONAI's ``mode=3``: scipy's ``map_coordinates(order=3, mode="nearest")``), labels by nearest neighbour or by
linear interpolation of each class's one-hot mask then argmax (nnU-Net's one-hot idea; it thresholds each
class's mask at 0.5 in id order on its own grid instead).

The grid: each axis keeps its direction; its step becomes the new spacing, voxel (0, 0, 0) stays where it was
(the affine's origin is kept), and an axis of ``n`` voxels at spacing ``s`` gets ``round((n - 1) * s / t) + 1``
voxels at spacing ``t`` (the distance from the first to the last voxel centre kept, rounded half to even as
``numpy.round``). New voxel ``j`` samples the old grid at ``j * t / s`` (past the last voxel: border padding).
Nearest takes the voxel at ``rint`` of it (half to even, as torch's ``grid_sample``); linear weights the two
neighbours along each axis (separable: trilinear), in float32 as MONAI computes it. Cubic pads each axis
with 12 copies of its edge voxel, turns the values into cubic B-spline coefficients (the recursive filter with
mirror boundaries, pole sqrt(3) - 2) and weights the four neighbours along each axis by the cubic B-spline — scipy's
own steps, in float32 (it holds the padded copy and the output).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import ConfigError, DecodeError
from .nrrd import regridded_header
from .volume import VolumeHeader

#: How label volumes may be resampled.
LABEL_METHODS = ("nearest", "onehot-linear")
#: How images may be resampled.
IMAGE_METHODS = ("linear", "cubic")


@dataclass(frozen=True)
class Resampling:
    """``--spacing X,Y,Z`` (along array axes i, j, k, in the header's units) and how labels are resampled."""

    spacing: tuple[float, float, float]
    label: str = "nearest"
    image: str = "linear"

    @classmethod
    def parse(cls, text: str, label: str = "nearest", image: str = "linear") -> Resampling:
        """``"1,1,2.5"`` → a Resampling; ConfigError for anything but three finite numbers > 0."""
        parts = [p.strip() for p in str(text).replace("x", ",").split(",")]
        try:
            values = tuple(float(p) for p in parts)
        except ValueError:
            values = ()
        if len(values) != 3 or not all(np.isfinite(v) and v > 0 for v in values):
            raise ConfigError(f"--spacing {text!r} is not three spacings > 0 (along array axes i, j, k)",
                              fix="write it like --spacing 1,1,2.5 (in the headers' units, mm)")
        if label not in LABEL_METHODS:
            raise ConfigError(f"--label-interp {label!r} is not one of {', '.join(LABEL_METHODS)}",
                              fix="use --label-interp nearest (or onehot-linear)")
        if image not in IMAGE_METHODS:
            raise ConfigError(f"--image-interp {image!r} is not one of {', '.join(IMAGE_METHODS)}",
                              fix="use --image-interp linear (or cubic)")
        return cls((values[0], values[1], values[2]), label, image)

    def to_json(self) -> dict[str, Any]:
        return {"spacing": list(self.spacing), "image": self.image, "label": self.label}

    def describe(self) -> str:
        """One line for the log: the spacing and both methods."""
        return (f"resampled once to spacing {'x'.join(f'{v:g}' for v in self.spacing)} (array axes i, j, k; "
                f"MONAI Spacing's grid): images {self.image} (stored float32), labels {self.label}")

    def grid(self, head: VolumeHeader) -> tuple[tuple[int, int, int], np.ndarray]:
        """The resampled (shape, affine) of ``head``'s grid (module docstring), from its header alone."""
        old = np.array(head.spacing, np.float64)
        new = np.array(self.spacing, np.float64)
        shape = np.maximum(np.round((np.array(head.shape) - 1) * old / new) + 1, 1).astype(np.int64)
        affine = head.affine_array().copy()
        affine[:3, :3] = affine[:3, :3] * (new / old)  # each column: its direction, the new step
        return (int(shape[0]), int(shape[1]), int(shape[2])), affine

    def header(self, head: VolumeHeader, max_voxels: int, dtype: str | None = None) -> VolumeHeader:
        """``head`` on the resampled grid (its record's shape, spacing and affine, and ``dtype`` when given: an
        image's float32; a NIfTI or NRRD header rewritten so a stitched label file carries them); DecodeError when
        the grid exceeds ``max_voxels``. Nothing is decoded."""
        shape, affine = self.grid(head)
        voxels = int(np.prod(shape, dtype=object)) * head.channels
        if voxels > max_voxels:
            raise DecodeError(f"resampled to spacing {list(self.spacing)} the volume would be "
                              f"{'x'.join(map(str, shape))} = {voxels} voxels, more than the voxel limit {max_voxels}",
                              path=head.path, fix="choose a coarser --spacing, or raise --max-voxels if the "
                              "machine has the memory")
        dtype = dtype or head.dtype
        raw = head.header
        if head.version in ("nifti1", "nifti2"):
            raw = _nifti_header(head, shape, affine, dtype)
        elif head.version == "nrrd":
            raw = regridded_header(head, shape, np.array(self.spacing) / np.array(head.spacing), dtype)
        return replace(head, shape=shape, spacing=self.spacing, dtype=dtype,
                       affine=tuple(tuple(float(v) for v in row) for row in affine), header=raw)

    def positions(self, head: VolumeHeader) -> list[np.ndarray]:
        """Per axis, where each new voxel samples the old grid (an old voxel index; the last new voxel may lie up
        to half a new step past the last old one: linear and nearest clamp it, cubic extends the edge)."""
        shape, _ = self.grid(head)
        return [np.arange(n) * (t / s) for n, t, s in zip(shape, self.spacing, head.spacing, strict=True)]


def _nifti_header(head: VolumeHeader, shape: tuple[int, int, int], affine: np.ndarray, dtype: str) -> str:
    """The NIfTI header's bytes (base64) for the resampled grid: dim, pixdim, datatype, qform and sform (codes
    kept); an MSD image's 4th (modality) axis kept."""
    from .nifti import _nibabel

    nib = _nibabel()
    klass = nib.Nifti2Image if head.version == "nifti2" else nib.Nifti1Image
    header = klass.header_class(base64.b64decode(head.header))
    zooms = tuple(float(np.linalg.norm(affine[:3, k])) for k in range(3))
    if head.channels > 1:
        header.set_data_shape((*shape, head.channels))
        header.set_zooms((*zooms, float(header.get_zooms()[3])))
    else:
        header.set_data_shape(shape)
        header.set_zooms(zooms)
    header.set_data_dtype(np.dtype(dtype))
    header.set_qform(affine, int(header["qform_code"]))
    header.set_sform(affine, int(header["sform_code"]))
    return base64.b64encode(header.binaryblock).decode("ascii")


def _shrinking_first(data: np.ndarray, positions: list[np.ndarray]) -> list[int]:
    """The axes in the order that keeps the intermediate arrays smallest: those that shrink most first."""
    return sorted(range(len(positions)), key=lambda a: len(positions[a]) / data.shape[a])


def linear(data: np.ndarray, positions: list[np.ndarray]) -> np.ndarray:
    """``data`` (X, Y, Z) sampled at ``positions`` by linear interpolation along each axis in turn (the most
    shrinking first; two temporaries of the result's size at most), float32."""
    out = np.asarray(data, np.float32)
    for axis in _shrinking_first(data, positions):
        x = np.minimum(positions[axis], out.shape[axis] - 1)  # border padding
        low = np.floor(x).astype(np.intp)
        high = np.minimum(low + 1, out.shape[axis] - 1)
        w = (x - low).astype(np.float32).reshape([-1 if a == axis else 1 for a in range(out.ndim)])
        result = np.take(out, low, axis=axis)
        result *= 1 - w
        upper = np.take(out, high, axis=axis)
        upper *= w
        result += upper
        del upper
        out = result
    return out


#: The cubic B-spline's pole, and the edge copies padded on each side (scipy's ``npad`` for ``mode="nearest"``).
_POLE = float(np.sqrt(3.0) - 2.0)
_PAD = 12


def _spline_coefficients(values: np.ndarray, axis: int) -> None:
    """Turn ``values`` into cubic B-spline coefficients along ``axis``, in place (mirror boundaries, as scipy's
    ``spline_filter1d`` initialises the causal and anticausal passes)."""
    c = np.moveaxis(values, axis, 0)  # a view: written in place
    n, z = c.shape[0], _POLE
    c *= (1 - z) * (1 - 1 / z)
    if n == 1:
        return
    zn1 = z ** (n - 1)
    first = c[0] + zn1 * c[n - 1]
    zi = z
    for i in range(1, n - 1):
        if abs(zi) < 1e-30:  # the rest adds nothing in float32
            break
        first += zi * (c[i] + zn1 * c[n - 1 - i])
        zi *= z
    c[0] = first / (1 - zn1 * zn1)
    for i in range(1, n):
        c[i] += z * c[i - 1]
    c[n - 1] = (z * c[n - 2] + c[n - 1]) * (z / (z * z - 1))
    for i in range(n - 2, -1, -1):
        c[i] = z * (c[i + 1] - c[i])


def _bspline3(t: np.ndarray) -> np.ndarray:
    t = np.abs(t)
    return np.where(t < 1, 2 / 3 - t**2 + t**3 / 2, np.where(t < 2, (2 - t) ** 3 / 6, 0.0))


def cubic(data: np.ndarray, positions: list[np.ndarray]) -> np.ndarray:
    """``data`` (X, Y, Z) sampled at ``positions`` by cubic B-spline interpolation (module docstring), float32."""
    coeffs = np.pad(np.asarray(data, np.float32), _PAD, mode="edge")
    for axis in range(coeffs.ndim):
        _spline_coefficients(coeffs, axis)
    out = coeffs
    for axis in _shrinking_first(data, positions):
        x = positions[axis] + _PAD
        base = np.floor(x).astype(np.intp)
        shape = [-1 if a == axis else 1 for a in range(out.ndim)]
        acc = np.zeros([len(x) if a == axis else n for a, n in enumerate(out.shape)], np.float32)
        for k in range(-1, 3):
            weight = _bspline3(x - (base + k)).astype(np.float32).reshape(shape)
            tap = np.take(out, np.clip(base + k, 0, out.shape[axis] - 1), axis=axis)
            tap *= weight
            acc += tap
            del tap
        out = acc
    return out


def nearest(data: np.ndarray, positions: list[np.ndarray]) -> np.ndarray:
    """``data`` sampled at the nearest voxel of ``positions`` (half to even), its type and values kept."""
    out = data
    for axis, x in enumerate(positions):
        out = np.take(out, np.minimum(np.rint(x).astype(np.intp), data.shape[axis] - 1), axis=axis)
    return np.ascontiguousarray(out)


def onehot_linear(ids: np.ndarray, positions: list[np.ndarray]) -> np.ndarray:
    """Label ids resampled one-hot, as nnU-Net does (it thresholds at 0.5; here argmax): each class's 0/1 mask
    interpolated linearly, then per voxel the class of the largest value (a tie to the lower id). Only ids present
    in ``ids`` come out; the type is kept."""
    best: np.ndarray | None = None
    out: np.ndarray | None = None
    for value in np.unique(ids).tolist():
        share = linear(ids == value, positions)
        if best is None or out is None:
            best, out = share, np.full(share.shape, value, ids.dtype)
            continue
        wins = share > best
        best[wins] = share[wins]
        out[wins] = value
    if out is None:  # an empty volume
        return ids.copy()
    return out


def resample_case(images: np.ndarray, label: np.ndarray | None, head: VolumeHeader, resampling: Resampling
                  ) -> tuple[np.ndarray, np.ndarray | None]:
    """A case's modalities ``(M, X, Y, Z)`` and label ids resampled onto ``resampling``'s grid of ``head``."""
    at = resampling.positions(head)
    shape, _ = resampling.grid(head)
    method = linear if resampling.image == "linear" else cubic
    if images.shape[0] == 1:  # one modality: the result itself, not a stacked copy
        out = method(images[0], at)[None]
    else:
        out = np.empty((images.shape[0], *shape), np.float32)
        for band in range(images.shape[0]):
            out[band] = method(images[band], at)
    if label is None:
        return out, None
    return out, (nearest(label, at) if resampling.label == "nearest" else onehot_linear(label, at))
