"""The volume normalisation presets as an output op: clip, then z-score, per band, with per-sample statistics.

nnU-Net's two rules (``default_normalization_schemes``): **CT** ``(clip(x, p0.5, p99.5) - mean) / std`` with the
foreground statistics of the whole training set, **z-score** ``(x - mean) / std`` with each volume's own mean and
std. Both are ``(clip(float32(x), lower, upper) - mean) / max(std, 1e-8)`` in float32 (z-score: no bounds), so one
op applies them: a table of (lower, upper, mean, std) rows of one value per band, and each sample's row (its case
for z-score; one row for CT) looked up by its global sample index and drawn as its record. The statistics come from
convert time (:mod:`shardkit.volumes.intensity`); :func:`shardkit.read.volumes.normalizer` builds the op for a split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from .ops import MAX_BANDS, BatchSpec, Kind, Op, OpParams, _State

#: nnU-Net's floor under a std (``max(std, 1e-8)``).
STD_FLOOR = 1e-8


@dataclass(frozen=True)
class RowParams(OpParams):
    """The statistics row a sample is normalised with."""

    row: int = 0


class VolumeNormalize(Op):
    """Images → float32 ``(clip(x, lower, upper) - mean) / max(std, 1e-8)`` per band (any band count), each
    sample with its own row of the tables: ``lower``, ``upper``, ``mean``, ``std`` are (rows, bands) (±inf bounds:
    no clipping), ``rows[i]`` sample ``i``'s row (None: row 0 for every sample). ``schemes``: the rule of each band,
    for the record (``"ct"``, ``"zscore"``, ``"none"``)."""

    kind = Kind.OUTPUT
    samplewise = True
    normalizes_images = True

    def __init__(self, lower: Any, upper: Any, mean: Any, std: Any, rows: Any = None,
                 schemes: Sequence[str] = ()) -> None:
        tables = [np.asarray(t, np.float64) for t in (lower, upper, mean, std)]
        shape = tables[2].shape
        if (len(shape) != 2 or not 0 < shape[1] <= MAX_BANDS or shape[0] < 1
                or any(t.shape != shape for t in tables) or np.isnan(np.stack(tables)).any()
                or not np.isfinite(tables[2]).all() or not np.isfinite(tables[3]).all() or (tables[3] < 0).any()
                or (tables[0] > tables[1]).any()):
            raise ConfigError(f"VolumeNormalize needs four (rows, bands) tables of one shape (1 to {MAX_BANDS} "
                              "bands), finite means and stds >= 0, lower <= upper")
        floor = np.maximum(tables[3], STD_FLOOR)
        self.table = np.stack([tables[0], tables[1], tables[2], floor], axis=1).astype(np.float32)  # (R, 4, C)
        self.rows = None if rows is None else np.asarray(rows, np.int64).reshape(-1)
        if self.rows is not None and self.rows.size and not (self.rows.min() >= 0 and self.rows.max() < shape[0]):
            raise ConfigError("VolumeNormalize rows must index its tables")
        self.schemes = tuple(schemes)

    @property
    def bands(self) -> int:
        return int(self.table.shape[2])

    def __eq__(self, other: object) -> bool:
        return (type(self) is type(other) and np.array_equal(self.table, other.table)
                and np.array_equal(self.rows if self.rows is not None else -1,
                                   other.rows if other.rows is not None else -1)
                and self.schemes == other.schemes)

    def __repr__(self) -> str:
        return (f"VolumeNormalize(schemes={self.schemes!r}, rows={self.table.shape[0]}, bands={self.bands}, "
                f"samples={'all' if self.rows is None else self.rows.size})")

    def draw(self, rng: np.random.Generator, st: _State) -> None:
        if self.rows is None:
            st.record(RowParams(0))
            return
        if not 0 <= st.index < self.rows.size:
            raise ConfigError(f"VolumeNormalize knows {self.rows.size} samples, not sample {st.index}",
                              fix="build it for the split it reads (shardkit.read.volumes.normalizer(ds))")
        st.record(RowParams(int(self.rows[st.index])))

    def output_spec(self, spec: BatchSpec) -> BatchSpec:
        if spec.channels != self.bands:
            raise ConfigError(f"VolumeNormalize has statistics for {self.bands} bands, the images {spec.channels}",
                              fix="build it for the split it reads (shardkit.read.volumes.normalizer(ds))")
        return dataclasses.replace(spec, image_dtype="float32")

    def layout(self) -> dict[str, tuple[str, tuple[int | str | None, ...]]]:
        return {"constants": ("float32", ("B", 4, self.bands))}

    def pack(self, records: Sequence[Any]) -> dict[str, np.ndarray]:
        """Each sample's (lower, upper, mean, std) rows, float32 (B, 4, C): what every backend applies."""
        rows = np.asarray([r.row for r in records], np.int64)
        return {"constants": self.table[rows].reshape(len(rows), 4, self.bands)}

    def apply(self, images: np.ndarray, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The rule on a channels-last numpy batch of samples ``indices``, outside a pipeline: any sample rank, so
        also 3-D patches ``(B, D, H, W, C)``, which the (2-D) augmentation pipeline refuses."""
        idx = np.asarray(indices, np.int64).reshape(-1)
        if images.ndim < 2 or images.shape[0] != idx.size or images.shape[-1] != self.bands:
            raise ConfigError(f"VolumeNormalize.apply takes (B, …, {self.bands}) images for {idx.size} indices, got "
                              f"{images.shape}", fix="pass the batch and its sample indices (ds.batch(idx), idx)")
        if self.rows is not None and idx.size and not (idx.min() >= 0 and idx.max() < self.rows.size):
            raise ConfigError(f"VolumeNormalize knows {self.rows.size} samples, not sample {int(idx.max())}",
                              fix="build it for the split it reads (shardkit.read.volumes.normalizer(ds))")
        rows = np.zeros(idx.size, np.int64) if self.rows is None else self.rows[idx]
        return self.numpy(images, self.table[rows])

    @staticmethod
    def numpy(images: np.ndarray, constants: np.ndarray) -> np.ndarray:
        """The rule on channels-last ``images`` (B, …, C) with :meth:`pack`'s ``constants``, in float32."""
        shape = (constants.shape[0],) + (1,) * (images.ndim - 2) + (constants.shape[2],)
        lo, hi, mean, std = (constants[:, j].reshape(shape) for j in range(4))
        out = images.astype(np.float32)
        np.clip(out, lo, hi, out=out)
        out -= mean
        out /= std
        return out
