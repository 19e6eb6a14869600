"""nnU-Net v2's two intensity normalisations and its foreground sampling, restated (not copied) for the tests.

Source: https://github.com/MIC-DKFZ/nnUNet @ 0de6a686b1170f8d7fc29382ae94fbe309be9549,
``nnunetv2/preprocessing/normalization/default_normalization_schemes.py`` (``CTNormalization``,
``ZScoreNormalization``) and ``nnunetv2/experiment_planning/dataset_fingerprint/fingerprint_extractor.py``
(``collect_foreground_intensities`` and the pooled statistics); Apache-2.0. Restated rather than copied: nnunetv2
cannot be installed here (it pulls in torch builds, SimpleITK, batchgenerators and acvl-utils that would replace the
pinned torch), and the tools this copy was made with keep upstream code out of commits. Each line below follows the
upstream statement it names; tests/reference/README.md records the source.
"""

from __future__ import annotations

import numpy as np


def ct_normalization(image: np.ndarray, properties: dict[str, float]) -> np.ndarray:
    """``CTNormalization.run``: float32, clipped in place to percentile_00_5..percentile_99_5, minus the mean,
    divided by max(std, 1e-8)."""
    out = image.astype(np.float32, copy=True)
    np.clip(out, properties["percentile_00_5"], properties["percentile_99_5"], out=out)
    out -= properties["mean"]
    out /= max(properties["std"], 1e-8)
    return out


def zscore_normalization(image: np.ndarray) -> np.ndarray:
    """``ZScoreNormalization.run`` with ``use_mask_for_norm`` False: float32, minus its own mean, divided by
    max(its std, 1e-8)."""
    out = image.astype(np.float32, copy=True)
    mean, std = out.mean(), out.std()
    out -= mean
    out /= max(std, 1e-8)
    return out


def collect_foreground_intensities(segmentation: np.ndarray, images: np.ndarray, seed: int = 1234,
                                   num_samples: int = 10000) -> list[np.ndarray]:
    """The per-channel foreground draws of ``collect_foreground_intensities`` (images (c, x, y, z), segmentation
    (1, x, y, z)): one RandomState(seed), ``rs.choice(images[i][seg[0] > 0], num_samples, replace=True)`` per
    channel in order, an empty list without foreground."""
    rs = np.random.RandomState(seed)
    mask = segmentation[0] > 0
    out = []
    for i in range(len(images)):
        fg = images[i][mask]
        out.append(rs.choice(fg, num_samples, replace=True) if len(fg) > 0 else np.zeros(0))
    return out


def pooled_properties(per_case: list[np.ndarray]) -> dict[str, float]:
    """The fingerprint's ``foreground_intensity_properties_per_channel`` of one channel from its cases' draws."""
    pool = np.concatenate(per_case)
    return {"mean": float(np.mean(pool)), "median": float(np.median(pool)), "std": float(np.std(pool)),
            "min": float(np.min(pool)), "max": float(np.max(pool)),
            "percentile_99_5": float(np.percentile(pool, 99.5)), "percentile_00_5": float(np.percentile(pool, 0.5))}
