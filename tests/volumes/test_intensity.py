"""Convert-time intensity statistics (shardkit.volumes.intensity) against nnU-Net's rules, restated in
tests/reference/nnunet_normalization.py, on a real volume and its label (tests/data/nifti)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardkit.volumes import intensity
from tests.reference.nnunet_normalization import collect_foreground_intensities, pooled_properties

nib = pytest.importorskip("nibabel")

DATA = Path(__file__).resolve().parents[1] / "data" / "nifti"


@pytest.fixture(scope="module")
def case() -> tuple[np.ndarray, np.ndarray]:
    t1 = np.asanyarray(nib.load(str(DATA / "anatomical.nii")).dataobj)  # int16, Fortran-ordered as decoded
    label = np.asanyarray(nib.load(str(DATA / "anatomical_label.nii.gz")).dataobj).astype(np.uint8)
    images = np.stack([t1, (-t1).astype(np.int16)])
    return images, label


@pytest.mark.parametrize(("chunk", "block"), [(1 << 22, 1 << 16), (977, 1 << 16), (4099, 64)])  # cut mid-row
@pytest.mark.parametrize("order", ["C", "F"])
def test_foreground_draws_are_nnunets(case: tuple[np.ndarray, np.ndarray], chunk: int, block: int, order: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """C-ordered: nnU-Net's draws themselves; Fortran-ordered (nibabel's decode): its rule over Fortran order."""
    images, label = case
    monkeypatch.setattr(intensity, "_SLAB_VOXELS", chunk)
    monkeypatch.setattr(intensity, "_BLOCK", block)
    stacked = np.stack([np.asarray(images[0], order=order), np.asarray(images[1], order=order)])  # (M, …) C order
    n, drawn = intensity.foreground_sample(stacked, np.asarray(label, order=order))
    if order == "C":
        expected = collect_foreground_intensities(label[None], images)
    else:  # the same rule on the transposed arrays: Fortran order of (X, Y, Z) is C order of (Z, Y, X)
        expected = collect_foreground_intensities(label.T[None], np.stack([images[0].T, images[1].T]))
    assert n == int((label > 0).sum()) > 0
    for got, want in zip(drawn, expected, strict=True):
        assert got.shape == (10000,)
        np.testing.assert_array_equal(got, want)


def test_no_foreground_draws_nothing(case: tuple[np.ndarray, np.ndarray]) -> None:
    images, label = case
    n, drawn = intensity.foreground_sample(images, np.zeros_like(label))
    assert n == 0 and [d.size for d in drawn] == [0, 0]
    record = intensity.case_statistics(images, np.zeros_like(label))
    assert intensity.pooled_foreground([record], 2) == [None, None]


def test_moments_and_pooled_properties_are_nnunets(case: tuple[np.ndarray, np.ndarray],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    images, label = case
    monkeypatch.setattr(intensity, "_SLAB_VOXELS", 1000)
    images = np.ascontiguousarray(images)
    label = np.ascontiguousarray(label)
    other = label.copy()
    other[: other.shape[0] // 2] = 0  # a second case: half its foreground
    records = [intensity.case_statistics(images, lab) for lab in (label, other)]
    for m in range(2):
        vol = images[m].astype(np.float64)
        assert records[0]["mean"][m] == pytest.approx(vol.mean(), rel=1e-12)
        assert records[0]["std"][m] == pytest.approx(vol.std(), rel=1e-9)
    pooled = intensity.pooled_foreground(records, 2)
    for m in range(2):
        draws = [collect_foreground_intensities(lab[None], images)[m] for lab in (label, other)]
        want = pooled_properties(draws)
        got = pooled[m]
        assert got is not None and got["samples"] == 20000
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-9), key


def test_schemes_follow_nnunets_channel_names() -> None:
    assert [intensity.scheme_for(n) for n in ("CT", "ct", "noNorm", "T1", "FLAIR")] == [
        "ct", "ct", "none", "zscore", "zscore"]
