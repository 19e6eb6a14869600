"""Class weights and the class-balanced sampler over the slices of a volume split (docs/volumes.md): computed from
the slices' sidecars as for any mask split, equal to the formulae written out from nibabel's reading of the label
volumes (tests/data/nifti: the brain label holds one slice of 25 per case, a rare class per slice)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.read import sampling

from ..conversion.test_volumes import nnunet_tree
from ..conversion.test_volumes_convert import INT16_CASES, volumes_of

nib = pytest.importorskip("nibabel")


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("volume-sampling")
    root = nnunet_tree(base / "Dataset001", cases=INT16_CASES)
    result = CliRunner().invoke(main, ["convert", str(root), str(base / "out"), "--workers", "1", "--context", "1"])
    assert result.exit_code == 0, result.output
    return root, base / "out" / "train"


def slice_labels(root: Path, ds: shardkit.Dataset) -> list[np.ndarray]:
    """Each stored sample's label slice, read from its case's label volume with nibabel (not from the shards)."""
    out = []
    for i in range(len(ds)):
        case, _, where = ds.key(i).partition("/")
        assert where[0] == "k"
        out.append(volumes_of(root, case)[2][:, :, int(where[1:])])
    return out


def test_class_weights_over_slices_follow_the_formulae(split: tuple[Path, Path]) -> None:
    root, path = split
    ds = shardkit.open(path)
    labels = slice_labels(root, ds)
    assert len(ds) == 50  # two cases of 25 slices, empty ones kept
    counts = np.stack([np.bincount(ids.ravel().astype(np.int64), minlength=2)[:2] for ids in labels])
    pixels = counts.sum(0)
    present = counts > 0
    assert present[:, 1].sum() == 2  # brain: one slice per case
    image_pixels = np.array([sum(ids.size for ids, has in zip(labels, present[:, c], strict=True) if has)
                             for c in range(2)])
    freq = pixels / image_pixels
    np.testing.assert_allclose(ds.class_weights("median_frequency"), np.median(freq) / freq, rtol=1e-6)
    p = pixels / pixels.sum()
    np.testing.assert_allclose(ds.class_weights("enet"), 1 / np.log(1.02 + p), rtol=1e-6)
    np.testing.assert_array_equal(ds.class_presence(), present)


def test_the_class_balanced_sampler_draws_the_rare_slices_by_the_formula(split: tuple[Path, Path]) -> None:
    root, path = split
    ds = shardkit.open(path)
    labels = slice_labels(root, ds)
    counts = np.stack([np.bincount(ids.ravel().astype(np.int64), minlength=2)[:2] for ids in labels])
    present = counts > 0
    temperature = 0.01
    f = counts.sum(0) / counts.sum()  # DAFormer's rare class sampling, written out
    p = np.exp((1 - f) / temperature - ((1 - f) / temperature).max())
    p /= p.sum()
    r = len(ds) * (present * (p / present.sum(0))).sum(1)
    np.testing.assert_allclose(ds.repeat_factors(f"class-balanced:{temperature}"), r, rtol=1e-9)
    length = sampling.epoch_length(r)
    want = r * length / r.sum()
    brain = np.flatnonzero(present[:, 1])
    for epoch in range(3):
        drawn = np.bincount(ds.sampler(4, sampling=f"class-balanced:{temperature}", seed=1, epoch=epoch).indices(),
                            minlength=len(ds))
        assert np.all((drawn == np.floor(want)) | (drawn == np.ceil(want)))
        assert drawn[brain].min() > 1 > drawn[np.flatnonzero(~present[:, 1])].mean()  # rare slices repeated
