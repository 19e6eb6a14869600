"""Cutout on real CamVid: holes exactly where ``aug.params`` says, fill in the image, labels untouched
or the ignore index, the rest of the sample as without Cutout, the same on the numpy and PyTorch paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit import augment as A
from shardkit.errors import ConfigError

IGNORE = 11
GEOMETRY = "scale=0.5:2,crop=256x384,hflip,rotate=10"


@pytest.fixture(scope="module")
def data(camvid_val_npy: Path) -> tuple[np.ndarray, np.ndarray]:
    ds = shardkit.open(camvid_val_npy)
    assert ds.ignore_index == IGNORE
    return ds.batch(np.arange(len(ds)))


def _hole_mask(p: A.Params, hw: tuple[int, int]) -> np.ndarray:
    mask = np.zeros(hw, bool)
    for y0, x0, y1, x1 in p.holes:
        mask[y0:y1, x0:x1] = True
    return mask


def test_params_draw_holes_per_sample_inside_the_output() -> None:
    aug = A.parse(GEOMETRY + ",cutout=1-3:40x60")
    counts = set()
    for i in range(40):
        p = aug.params(i, seed=2, epoch=0, hw=(360, 480))
        assert p == aug.params(i, seed=2, epoch=0, hw=(360, 480))  # reproducible
        assert 1 <= len(p.holes) <= 3
        counts.add(len(p.holes))
        for y0, x0, y1, x1 in p.holes:
            assert 0 <= y0 < y1 <= 256 and 0 <= x0 < x1 <= 384
            assert y1 == min(y0 + 40, 256) and x1 == min(x0 + 60, 384)  # clipped at the border only
        assert p.cutout_fill == (0, 0, 0) and not p.cutout_ignore
    assert counts == {1, 2, 3}
    assert aug.params(0, seed=2, epoch=0, hw=(360, 480)).holes != aug.params(0, seed=2, epoch=1, hw=(360, 480)).holes
    # Cutout draws from its own stream: the geometry is what the pipeline without it draws
    plain = A.parse(GEOMETRY).params(7, seed=2, epoch=0, hw=(360, 480))
    cut = aug.params(7, seed=2, epoch=0, hw=(360, 480))
    assert np.array_equal(plain.matrix, cut.matrix) and plain.crop_offset == cut.crop_offset


@pytest.mark.parametrize("ignore", [False, True])
def test_holes_filled_where_params_say_and_the_rest_unchanged(data: tuple, ignore: bool) -> None:
    images, labels = data
    idx = np.arange(0, 26, 3)
    plain = A.parse(GEOMETRY + ",jitter=0.2")
    aug = A.Compose([*plain.ops, A.Cutout((1, 3), 48, 64, fill=(10, 200, 30), ignore_labels=ignore)])
    want_img, want_lab = plain(images[idx], labels[idx], idx, seed=4, epoch=1, ignore_index=IGNORE)
    got_img, got_lab = aug(images[idx], labels[idx], idx, seed=4, epoch=1, ignore_index=IGNORE)
    assert got_lab.dtype == labels.dtype
    for k, i in enumerate(idx):
        p = aug.params(int(i), seed=4, epoch=1, hw=images.shape[1:3], label=labels[i], ignore_index=IGNORE)
        mask = _hole_mask(p, (256, 384))
        assert mask.any()
        assert (got_img[k][mask] == (10, 200, 30)).all()
        assert np.array_equal(got_img[k][~mask], want_img[k][~mask])
        assert np.array_equal(got_lab[k][~mask], want_lab[k][~mask])
        if ignore:
            assert (got_lab[k][mask] == IGNORE).all()
        else:
            assert np.array_equal(got_lab[k][mask], want_lab[k][mask])
    if not ignore:
        assert np.array_equal(got_lab, want_lab)  # labels untouched by default


def test_uint16_labels_get_the_ignore_index_in_holes(data: tuple) -> None:
    images, labels = data
    wide = labels[:4].astype(np.uint16) * 1000
    aug = A.parse("crop=300x400,cutout=2:50x50:ignore")
    _, out = aug(images[:4], wide, np.arange(4), seed=0, ignore_index=65535)
    assert out.dtype == np.uint16
    for k in range(4):
        mask = _hole_mask(aug.params(k, seed=0, hw=(360, 480)), (300, 400))
        assert (out[k][mask] == 65535).all()
        assert set(np.unique(out[k][~mask])) <= set(np.unique(wide[k]))


torch = pytest.importorskip("torch")
from .devices import DEVICES, cpu_and_torch  # noqa: E402


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", [GEOMETRY + ",cutout=0-4:64x96", GEOMETRY + ",jitter=0.2,cutout=2:32x64:128:ignore",
                                  "crop=352x480,cutout=3:100x20:ignore"])
def test_torch_labels_identical_and_holes_equal_to_the_cpu_path(data: tuple, spec: str, device: str) -> None:
    images, labels = data
    aug = A.parse(spec)
    idx = np.arange(len(images))
    want_img, want_lab, got_img, got_lab = cpu_and_torch(aug, images, labels, device, seed=5, epoch=2,
                                                         ignore_index=IGNORE)
    assert np.array_equal(got_lab.cpu().numpy(), want_lab)
    got = got_img.cpu().numpy()
    hw = want_lab.shape[1:]
    for k, i in enumerate(idx):
        mask = _hole_mask(aug.params(int(i), seed=5, epoch=2, hw=(360, 480)), hw)
        assert np.array_equal(got[k][mask], want_img[k][mask])  # the fill, exactly
    diff = np.abs(got.astype(np.int16) - want_img)
    assert (diff.max() <= 1) if "jitter" not in spec else (np.mean(diff > 1) < 1e-3)


def test_string_form_equals_the_explicit_op() -> None:
    assert A.parse("cutout=2:32x64") == A.Compose([A.Cutout(2, 32, 64)])
    assert A.parse("crop=64x64,cutout=0-3:8x16:128:ignore") == A.Compose(
        [A.RandomCrop(64, 64), A.Cutout((0, 3), 8, 16, fill=128, ignore_labels=True)])
    assert A.parse("cutout=1:8X8:ignore:7") == A.Compose([A.Cutout(1, 8, 8, fill=7, ignore_labels=True)])


@pytest.mark.parametrize("bad", ["cutout=2", "cutout=2:32", "cutout=a:32x32", "cutout=3-1:8x8", "cutout=1:0x8",
                                 "cutout=1:8x8:fill", "cutout=1:8x8:1e3", "cutout=1:8x8:ignore:ignore",
                                 "cutout=1:8x8:1:2", "cutout=1:8x8,hflip", "cutout=1:8x8,cutout=1:4x4"])
def test_bad_cutout_strings_are_one_line_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        A.parse(bad)
    assert "\n" not in str(err.value)


def test_bad_cutout_arguments_are_config_errors() -> None:
    for kwargs in ({"holes": -1, "h": 8, "w": 8}, {"holes": 1, "h": 8.5, "w": 8}, {"holes": (2, 1), "h": 8, "w": 8},
                   {"holes": 1, "h": 8, "w": 8, "fill": ()}, {"holes": 1, "h": 8, "w": 8, "fill": float("nan")},
                   {"holes": 2.5, "h": 8, "w": 8}, {"holes": (1, 2, 3), "h": 8, "w": 8}, {"holes": "x", "h": 8, "w": 8},
                   {"holes": 1, "h": 8, "w": 8, "fill": "ab"}, {"holes": 1, "h": True, "w": 8}):
        with pytest.raises(ConfigError):
            A.Cutout(**kwargs)
    with pytest.raises(ConfigError, match="after the geometry"):
        A.Compose([A.Cutout(1, 8, 8), A.RandomCrop(16, 16)])
