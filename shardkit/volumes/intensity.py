"""Per-modality intensity statistics of volumes, computed at convert time for the normalisation presets.

Two rules, nnU-Net's (``nnunetv2`` ``DatasetFingerprintExtractor`` and ``default_normalization_schemes``):

- **CT** (:func:`pooled_foreground`): over the training cases' *foreground* voxels (label > 0), pooled: mean, std,
  the 0.5 and 99.5 percentiles (and median, min, max). Memory stays bounded as nnU-Net bounds it: each case gives a
  fixed sample of its foreground voxels, drawn with replacement by ``np.random.RandomState(1234)``, modality after
  modality (``rs.choice(foreground, 10000, replace=True)``, nnU-Net's ``collect_foreground_intensities`` with
  ``num_samples=10000``; nnU-Net itself takes 10^8 / cases per case). The foreground voxels are taken in the
  label's memory order (a C-ordered label: nnU-Net's very draws; a Fortran-ordered one, as nibabel decodes NIfTI:
  the same rule over Fortran order), found chunk by chunk, so no foreground copy of the volume is made. A case's
  sample is kept as its distinct values and their counts.
- **MR** (per-volume z-score, nnU-Net's ``ZScoreNormalization`` with ``use_mask_for_norm`` False): each case's
  mean and std over the *whole* volume per modality (not a nonzero mask), one pass (8/16-bit integers exactly).

Intensities stay as decoded in the shards; these numbers are only recorded (the manifest's ``volumes``), and the
reader op :class:`shardkit.augment.intensity.VolumeNormalize` applies them.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

#: Foreground voxels drawn per case and modality, and the seed of their draw (nnU-Net's defaults).
FOREGROUND_SAMPLES = 10000
#: nnU-Net's choice of scheme by channel name (``channel_names`` in dataset.json): CT by name, ``noNorm`` none,
#: anything else z-score; its 0..1 rescalings are not offered here.
SCHEMES = ("ct", "zscore", "none")
FOREGROUND_SEED = 1234
#: Voxels a pass reads at once (as float64: 32 MiB).
_SLAB_VOXELS = 1 << 22


def _memory_order(volume: np.ndarray) -> Literal["C", "F"]:
    """``"F"`` for a Fortran-ordered volume (as nibabel decodes NIfTI), else ``"C"``: the order voxels are visited."""
    return "F" if volume.flags.f_contiguous and not volume.flags.c_contiguous else "C"


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(a, min(a + _SLAB_VOXELS, n)) for a in range(0, n, _SLAB_VOXELS)]


def volume_moments(volume: np.ndarray) -> tuple[float, float]:
    """Mean and (population) std of every voxel, in one pass without a float copy of the volume: 8- and 16-bit
    integers summed exactly in int64 (sum and sum of squares: ``einsum`` casts chunk by chunk), other types in
    float64."""
    flat = np.ravel(volume, order=_memory_order(volume))  # a view of a C- or Fortran-contiguous volume
    n = max(1, flat.size)
    if flat.dtype.kind in "iu" and flat.dtype.itemsize <= 2:  # |x| < 2^16, n < 2^31: x^2 sums stay below 2^63
        total = int(flat.sum(dtype=np.int64))
        square = int(np.einsum("i,i->", flat, flat, dtype=np.int64, casting="unsafe"))
        mean = total / n
        return mean, (max(0, n * square - total * total) / (n * n)) ** 0.5
    total_f = float(flat.sum(dtype=np.float64))
    square_f = float(np.einsum("i,i->", flat, flat, dtype=np.float64))
    mean = total_f / n
    return mean, max(0.0, square_f / n - mean * mean) ** 0.5


def foreground_sample(images: np.ndarray, label: np.ndarray, samples: int = FOREGROUND_SAMPLES,
                      seed: int = FOREGROUND_SEED) -> tuple[int, list[np.ndarray]]:
    """The number of foreground voxels (label > 0; ids are never negative) and, per modality of ``images``
    (M, X, Y, Z), ``samples`` of their values drawn with replacement (empty without foreground):
    ``rs.choice(foreground, samples, replace=True)`` for each modality in order from one ``RandomState(seed)``,
    the foreground voxels in the label's memory order (C order for a C-ordered label, as nnU-Net's
    ``images[i][seg > 0]``; Fortran order for a label as nibabel decodes it), found chunk by chunk."""
    order = _memory_order(label)
    flat = np.ravel(label, order=order)
    chunks = _chunks(flat.size)
    per_chunk = [int(np.count_nonzero(flat[a:b])) for a, b in chunks]
    n = sum(per_chunk)
    if n == 0:
        return 0, [np.zeros(0, images.dtype) for _ in range(images.shape[0])]
    rs = np.random.RandomState(seed)
    ranks = np.concatenate([rs.randint(0, n, samples) for _ in range(images.shape[0])])  # rs.choice's draws
    slots = np.argsort(ranks, kind="stable")  # where each drawn value goes: modality * samples + draw
    ranked = ranks[slots]
    picked = np.empty(images.shape[0] * samples, images.dtype)
    base = 0
    for (a, b), count in zip(chunks, per_chunk, strict=True):
        lo, hi = np.searchsorted(ranked, [base, base + count])
        if hi > lo:
            positions = _rank_positions(flat[a:b], ranked[lo:hi] - base) + a
            index = np.unravel_index(positions, label.shape, order=order)
            mods = slots[lo:hi] // samples
            for m in np.unique(mods):
                sel = mods == m
                picked[slots[lo:hi][sel]] = images[int(m)][tuple(i[sel] for i in index)]
        base += count
    return n, [picked[m * samples:(m + 1) * samples] for m in range(images.shape[0])]


#: Voxels per block when finding the drawn foreground voxels of a chunk: each block's nonzero voxels are counted
#: (``count_nonzero``: fast), and only the blocks holding a drawn voxel are searched.
_BLOCK = 1 << 16


def _rank_positions(chunk: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Where in ``chunk`` its ``ranks``-th (sorted, 0-based) nonzero voxels are: ``np.flatnonzero(chunk)[ranks]``,
    searching only the blocks of :data:`_BLOCK` voxels drawn from (a ``flatnonzero`` of a whole CT label cost more
    than the rest of the statistics)."""
    starts = range(0, chunk.size, _BLOCK)
    before = np.zeros(len(starts) + 1, np.int64)
    np.cumsum([np.count_nonzero(chunk[a:a + _BLOCK]) for a in starts], out=before[1:])
    blocks = np.searchsorted(before, ranks, side="right") - 1  # the block holding each rank
    out = np.empty(ranks.size, np.int64)
    for block in np.unique(blocks):
        sel = blocks == block
        start = int(block) * _BLOCK
        out[sel] = np.flatnonzero(chunk[start:start + _BLOCK])[ranks[sel] - before[block]] + start
    return out


def case_statistics(images: np.ndarray, label: np.ndarray | None) -> dict[str, Any]:
    """A case's record of its intensities (the manifest keeps it with the case): per modality its whole-volume
    mean and std (the z-score preset), the foreground voxel count and the drawn foreground sample as distinct
    ``values`` with their ``counts`` (the CT preset, pooled over cases by :func:`pooled_foreground`)."""
    moments = [volume_moments(images[m]) for m in range(images.shape[0])]
    n, drawn = (0, [np.zeros(0)] * images.shape[0]) if label is None else foreground_sample(images, label)
    fg = []
    for sample in drawn:
        values, counts = np.unique(sample, return_counts=True)
        fg.append({"values": values.tolist(), "counts": counts.tolist()})
    return {"mean": [m for m, _ in moments], "std": [s for _, s in moments], "foreground_voxels": n,
            "foreground": fg}


def pooled_foreground(cases: list[dict[str, Any]], modalities: int) -> list[dict[str, float] | None]:
    """Per modality, nnU-Net's foreground intensity properties of the pooled samples of ``cases`` (their
    :func:`case_statistics`): ``mean``, ``std``, ``median``, ``min``, ``max``, ``percentile_00_5``,
    ``percentile_99_5`` and how many ``samples``; None for a modality without foreground in any case."""
    out: list[dict[str, float] | None] = []
    for m in range(modalities):
        parts = [np.repeat(np.asarray(c["foreground"][m]["values"], np.float64),
                           np.asarray(c["foreground"][m]["counts"], np.int64)) for c in cases]
        pool = np.concatenate(parts) if parts else np.zeros(0)
        if pool.size == 0:
            out.append(None)
            continue
        out.append({"mean": float(np.mean(pool)), "std": float(np.std(pool)), "median": float(np.median(pool)),
                    "min": float(np.min(pool)), "max": float(np.max(pool)),
                    "percentile_00_5": float(np.percentile(pool, 0.5)),
                    "percentile_99_5": float(np.percentile(pool, 99.5)), "samples": int(pool.size)})
    return out


def scheme_for(name: str) -> str:
    """nnU-Net's scheme for a channel named ``name``: ``ct`` for CT, ``none`` for noNorm, else ``zscore``."""
    key = name.casefold()
    return "ct" if key == "ct" else "none" if key == "nonorm" else "zscore"


def intensity_report(cases: dict[str, dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """The manifest's ``volumes.intensity``: the rules, and per modality (``names``, band order) its name, the
    scheme nnU-Net picks for it and the pooled foreground statistics of every case that has its record."""
    recorded = [c["intensity"] for c in cases.values() if isinstance(c.get("intensity"), dict)]
    pooled = pooled_foreground(recorded, len(names))
    return {"foreground": f"label > 0; {FOREGROUND_SAMPLES} voxels drawn per case and modality with replacement, "
                          f"np.random.RandomState({FOREGROUND_SEED}), pooled over {len(recorded)} cases",
            "zscore": "per case, over the whole volume",
            "modalities": [{"name": n, "scheme": scheme_for(n), "foreground": f}
                           for n, f in zip(names, pooled, strict=True)]}
