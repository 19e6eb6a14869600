"""RandomGamma (albumentations semantics) on the numpy/OpenCV, torch and TensorFlow backends, on real CamVid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit import augment as A
from shardkit.augment import ops as O
from shardkit.errors import ConfigError

IGNORE = 11
GEOMETRY = "scale=0.5:2,crop=256x384,hflip,rotate=10"


@pytest.fixture(scope="module")
def data(camvid_val_npy: Path) -> tuple[np.ndarray, np.ndarray]:
    ds = shardkit.open(camvid_val_npy)
    return ds.batch(np.arange(8))


def _albumentations_table(gamma: float) -> np.ndarray:
    """albumentations 2.0's uint8 ``gamma_transform`` table, as written there."""
    return ((np.arange(0, 256.0 / 255, 1.0 / 255) ** gamma) * 255).astype(np.uint8)


def test_the_table_is_albumentations_table() -> None:
    gammas = np.concatenate([np.linspace(0.05, 10, 400), [0.8, 1.0, 1.2]])
    got = O.gamma_luts(list(gammas))
    for g, row in zip(gammas, got, strict=True):
        np.testing.assert_array_equal(row, _albumentations_table(float(g)))
    # albumentations truncates: even gamma 1 takes some levels one down (33 -> 32), never more
    assert set(np.arange(256) - got[-2].astype(int)) == {0, 1} and got[-2][255] == 255


def test_the_table_equals_albumentations_own_function() -> None:
    functional = pytest.importorskip("albumentations.augmentations.pixel.functional")
    img = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, 2)
    for g in (0.5, 0.8, 0.93, 1.2, 2.5):
        np.testing.assert_array_equal(functional.gamma_transform(img, g)[..., 0].reshape(-1), O.gamma_luts([g])[0])


def test_gamma_is_drawn_per_sample_reproducibly_and_leaves_the_other_draws_alone() -> None:
    aug = A.parse(f"{GEOMETRY},gamma=0.7:1.5")
    draws = aug.params_batch(range(200), seed=3, epoch=1, hws=[(360, 480)] * 200)
    gammas = [p.get(O.GammaParams).gamma for p in draws]
    assert 0.7 <= min(gammas) < 0.75 and 1.45 < max(gammas) <= 1.5
    assert draws == aug.params_batch(range(200), seed=3, epoch=1, hws=[(360, 480)] * 200)
    assert aug.params(5, seed=3, epoch=2, hw=(360, 480)) != draws[5]  # another epoch, another gamma
    plain = A.parse(GEOMETRY).params_batch(range(200), seed=3, epoch=1, hws=[(360, 480)] * 200)
    assert [p.records[:-1] for p in draws] == [p.records for p in plain]
    assert all(np.array_equal(p.matrix, q.matrix) for p, q in zip(draws, plain, strict=True))


def test_numpy_gamma_is_the_table_on_the_warped_image_and_labels_are_untouched(data: tuple) -> None:
    images, labels = data
    idx = np.arange(20, 28)
    aug = A.parse(f"{GEOMETRY},gamma=0.5:2")
    geo_img, geo_lab = A.parse(GEOMETRY)(images, labels, idx, seed=4, epoch=1, ignore_index=IGNORE)
    got_img, got_lab = aug(images, labels, idx, seed=4, epoch=1, ignore_index=IGNORE)
    np.testing.assert_array_equal(got_lab, geo_lab)
    for k, i in enumerate(idx):
        g = aug.params(int(i), seed=4, epoch=1, hw=(360, 480)).get(O.GammaParams).gamma
        np.testing.assert_array_equal(got_img[k], _albumentations_table(g)[geo_img[k]])
    assert not np.array_equal(got_img, geo_img)
    # the same sample in another batch: the same output
    alone_img, alone_lab = aug(images[[3]], labels[[3]], idx[[3]], seed=4, epoch=1, ignore_index=IGNORE)
    assert np.array_equal(alone_img[0], got_img[3]) and np.array_equal(alone_lab[0], got_lab[3])


@pytest.mark.parametrize("spec", ["gamma=0.5:2", f"{GEOMETRY},jitter=0.2,gamma=0.6:1.6,cutout=0-2:32x48:ignore"])
def test_torch_and_tf_equal_the_numpy_path(tf, data: tuple, spec: str) -> None:
    import torch

    from shardkit.augment.tf import apply_batch as tf_apply
    from shardkit.augment.torch import apply_batch as torch_apply

    images, labels = data
    aug = A.parse(spec)
    idx = np.arange(10, 18)
    want_img, want_lab = aug(images, labels, idx, seed=6, epoch=2, ignore_index=IGNORE)
    t_img, t_lab = torch_apply(aug, torch.from_numpy(images), torch.from_numpy(labels), idx, seed=6, epoch=2,
                               ignore_index=IGNORE)
    f_img, f_lab = tf_apply(aug, images, labels, idx, seed=6, epoch=2, ignore_index=IGNORE)
    for img, lab in ((t_img.numpy(), t_lab.numpy()), (f_img.numpy(), f_lab.numpy())):
        np.testing.assert_array_equal(lab, want_lab)
        if spec.startswith("gamma"):  # no warp: the same table on the same pixels, identical
            np.testing.assert_array_equal(img, want_img)
        else:  # within the warp's tolerance, as the other colour ops
            diff = np.abs(img.astype(np.int16) - want_img)
            assert np.mean(diff > 1) < 1e-3 and diff.max() <= 8
    if spec.startswith("gamma"):
        np.testing.assert_array_equal(labels, want_lab)  # labels untouched


@pytest.mark.parametrize(("text", "match"), [
    ("gamma", "needs a value"), ("gamma=1.2", "expected LO:HI"), ("gamma=1.5:0.5", "0 < lo <= hi"),
    ("gamma=0:1", "0 < lo <= hi"), ("gamma=1:11", "gamma hi must be a finite number in"),
])
def test_bad_gamma_strings_are_one_line_config_errors(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        A.parse(text)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int16", "float32"])
def test_gamma_takes_every_image_dtype(dtype: str) -> None:
    # the rules per dtype: tests/augment/test_bands.py and test_levels.py
    spec = O.BatchSpec(channels=5, image_dtype=dtype)
    assert A.parse("gamma=0.8:1.2").output_spec(spec) == spec
