"""Read-time augmentation on real CamVid: exact label mapping, determinism, string form, iter_batches."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardkit
from shardkit import augment as A
from shardkit.augment import cpu
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import ConfigError

IGNORE = 11
FULL = "scale=0.5:2,crop=256x384,hflip,rotate=10,jitter=0.2"


@pytest.fixture(scope="module")
def loose(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CamVid val (26 pairs, 360x480, ignore id 11) as npy shards converted without --size."""
    out = tmp_path_factory.mktemp("augment-loose")
    convert(ConvertConfig(camvid_root, out, format="npy", splits=("val",), workers=2, quiet=True,
                          shard_size=ShardSize(samples=13)))
    return out / "val"


@pytest.fixture(scope="module")
def split(camvid_val_npy: Path) -> Path:
    """The same pairs converted with --size 360x480 (fixed size: batched reads)."""
    return camvid_val_npy


@pytest.fixture(scope="module")
def data(loose: Path) -> tuple[np.ndarray, np.ndarray]:
    ds = shardkit.open(loose)
    assert ds.ignore_index == IGNORE
    images, labels = zip(*(ds[i] for i in range(len(ds))), strict=True)
    return np.stack(images), np.stack(labels)


def _independent_labels(label: np.ndarray, m: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """The label rule, computed apart from the backend: round(M @ [x, y, 1]) inside → source, else ignore."""
    h, w = label.shape
    want = np.full(hw, IGNORE, label.dtype)
    for y in range(hw[0]):
        pts = np.stack([np.arange(hw[1]), np.full(hw[1], y), np.ones(hw[1])]).astype(np.float64)
        sx, sy = np.floor(m @ pts + 0.5).astype(np.int64)
        ok = (sx >= 0) & (sx < w) & (sy >= 0) & (sy < h)
        want[y, ok] = label[sy[ok], sx[ok]]
    return want


def test_every_label_pixel_is_the_nearest_mapped_source_label(data: tuple) -> None:
    images, labels = data
    aug = A.parse(FULL)
    idx = np.array([0, 5, 17])
    out_img, out_lab = aug(images[idx], labels[idx], idx, seed=3, epoch=1, ignore_index=IGNORE)
    assert out_img.shape == (3, 256, 384, 3) and out_img.dtype == np.uint8
    assert out_lab.shape == (3, 256, 384) and out_lab.dtype == labels.dtype
    for k, i in enumerate(idx):
        p = aug.params(int(i), seed=3, epoch=1, hw=(360, 480))
        assert np.array_equal(out_lab[k], _independent_labels(labels[i], p.matrix, p.out_hw))
        assert set(np.unique(out_lab[k])) <= set(np.unique(labels[i])) | {IGNORE}  # no new ids


def test_params_are_frozen_and_describe_the_draw() -> None:
    aug = A.parse("scale=1:1,crop=100x200,hflip=1,jitter=0.5")
    p = aug.params(4, seed=1, epoch=2, hw=(360, 480))
    assert p == aug.params(4, seed=1, epoch=2, hw=(360, 480))
    assert p.flip and p.out_hw == (100, 200) and p.scale == 1.0 and 0.5 <= p.brightness <= 1.5
    y0, x0 = p.crop_offset
    assert np.allclose(p.matrix, [[-1, 0, 199 + x0], [0, 1, y0]])  # crop, then mirror inside the crop
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.flip = False  # type: ignore[misc]
    with pytest.raises(ValueError):
        p.matrix[0, 0] = 2


def test_crop_only_is_an_exact_window(data: tuple) -> None:
    images, labels = data
    aug = A.Compose([A.RandomCrop(200, 300)])
    out_img, out_lab = aug(images[:4], labels[:4], range(4), seed=0, epoch=0, ignore_index=IGNORE)
    for i in range(4):
        y0, x0 = aug.params(i, hw=(360, 480)).crop_offset
        assert np.array_equal(out_img[i], images[i, y0:y0 + 200, x0:x0 + 300])
        assert np.array_equal(out_lab[i], labels[i, y0:y0 + 200, x0:x0 + 300])


def test_flip_twice_is_identity_and_flip_once_mirrors(data: tuple) -> None:
    images, labels = data
    twice = A.Compose([A.RandomFlip(1.0), A.RandomFlip(1.0)])
    out_img, out_lab = twice(images[:2], labels[:2], [0, 1], ignore_index=IGNORE)
    assert np.array_equal(out_img, images[:2]) and np.array_equal(out_lab, labels[:2])
    once_img, once_lab = A.Compose([A.RandomFlip(1.0)])(images[:2], labels[:2], [0, 1], ignore_index=IGNORE)
    assert np.array_equal(once_img, images[:2, :, ::-1]) and np.array_equal(once_lab, labels[:2, :, ::-1])


def test_same_seed_epoch_index_gives_same_output_regardless_of_batch(data: tuple) -> None:
    images, labels = data
    aug = A.parse(FULL)
    alone = aug(images[[7]], labels[[7]], [7], seed=9, epoch=2, ignore_index=IGNORE)
    batch = aug(images[[3, 7, 20]], labels[[3, 7, 20]], [3, 7, 20], seed=9, epoch=2, ignore_index=IGNORE)
    listed = aug(list(images[[20, 7]]), list(labels[[20, 7]]), [20, 7], seed=9, epoch=2, ignore_index=IGNORE)
    for got in (batch[0][1], listed[0][1]):
        assert np.array_equal(got, alone[0][0])
    for got in (batch[1][1], listed[1][1]):
        assert np.array_equal(got, alone[1][0])
    other = aug(images[[7]], labels[[7]], [7], seed=9, epoch=3, ignore_index=IGNORE)
    assert not np.array_equal(other[0], alone[0])
    assert aug.params(7, seed=9, epoch=2, hw=(360, 480)) != aug.params(7, seed=9, epoch=3, hw=(360, 480))


def test_out_arrays_are_written_in_place_when_they_fit(data: tuple) -> None:
    """``out=`` (a ring slot): the batch is warped straight into it, the same values as fresh arrays; arrays that
    do not fit the batch, or a pipeline that ends in an output op, give fresh arrays and leave ``out`` alone."""
    images, labels = data
    aug = A.parse(FULL)
    idx = [3, 7, 20]
    fresh = aug(images[idx], labels[idx], idx, seed=9, epoch=2, ignore_index=IGNORE)
    slot = (np.full((3, 256, 384, 3), 7, np.uint8), np.full((3, 256, 384), 7, labels.dtype))
    got = aug(images[idx], labels[idx], idx, seed=9, epoch=2, ignore_index=IGNORE, out=slot)
    assert got[0] is slot[0] and got[1] is slot[1]
    assert np.array_equal(slot[0], fresh[0]) and np.array_equal(slot[1], fresh[1])
    for bad in ((np.zeros((4, 256, 384, 3), np.uint8), np.zeros((4, 256, 384), labels.dtype)),  # 4 samples
                (np.zeros((3, 256, 384, 3), np.uint8), np.zeros((3, 256, 384), np.uint16)),  # another label dtype
                (np.zeros((3, 256, 384, 3), np.uint8), np.zeros((3, 384, 256), labels.dtype).transpose(0, 2, 1))):
        got = aug(images[idx], labels[idx], idx, seed=9, epoch=2, ignore_index=IGNORE, out=bad)
        assert got[0] is not bad[0] and got[1] is not bad[1] and not bad[0].any() and not bad[1].any()
        assert np.array_equal(got[0], fresh[0]) and np.array_equal(got[1], fresh[1])
    normed = A.Compose([*aug.ops, A.Normalize([120.0] * 3, [60.0] * 3)])
    slot = (np.zeros((3, 256, 384, 3), np.float32), np.zeros((3, 256, 384), labels.dtype))
    got = normed(images[idx], labels[idx], idx, seed=9, epoch=2, ignore_index=IGNORE, out=slot)
    assert got[0] is not slot[0] and not slot[0].any() and np.array_equal(got[1], fresh[1])


def test_uint16_labels_are_kept(data: tuple) -> None:
    images, labels = data
    aug = A.parse("scale=0.8:1.2,crop=300x300,rotate=15")
    _, out8 = aug(images[:3], labels[:3], [0, 1, 2], ignore_index=IGNORE)
    _, out16 = aug(images[:3], labels[:3].astype(np.uint16), [0, 1, 2], ignore_index=IGNORE)
    assert out16.dtype == np.uint16 and np.array_equal(out16, out8)
    _, big = aug(images[:1], labels[:1].astype(np.uint16) + 1000, [0], ignore_index=65535)
    assert set(np.unique(big)) <= set(np.unique(labels[0]).astype(np.uint16) + 1000) | {65535}


def test_parse_equals_explicit_compose(data: tuple) -> None:
    images, labels = data
    explicit = A.Compose([A.RandomScale(0.5, 2), A.RandomCrop(256, 384), A.RandomFlip(horizontal=0.5),
                          A.RandomRotate(10), A.ColorJitter(0.2, 0.2)])
    parsed = A.parse(FULL)
    assert parsed == explicit
    a = parsed(images[:3], labels[:3], [0, 1, 2], seed=1, ignore_index=IGNORE)
    b = explicit(images[:3], labels[:3], [0, 1, 2], seed=1, ignore_index=IGNORE)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@pytest.mark.parametrize("bad", ["", "scale=2", "crop=512", "crop=axb", "warp=3", "rotate", "hflip=2",
                                 "scale=2:1", "jitter=0.1:0.1:0.1:0.9", "scale=0.5:2,,hflip"])
def test_bad_strings_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        A.parse(bad)
    assert "\n" not in str(err.value)


def test_cat_max_ratio_is_deterministic_and_limits_one_class(data: tuple) -> None:
    images, labels = data
    aug = A.Compose([A.RandomCrop(64, 64, cat_max_ratio=0.75)])
    first = aug(images[:6], labels[:6], range(6), seed=4, ignore_index=IGNORE)
    again = aug(images[:6], labels[:6], range(6), seed=4, ignore_index=IGNORE)
    assert np.array_equal(first[1], again[1]) and np.array_equal(first[0], again[0])
    plain = A.Compose([A.RandomCrop(64, 64)])(images[:6], labels[:6], range(6), seed=4, ignore_index=IGNORE)

    def worst(lab: np.ndarray) -> float:
        _, c = np.unique(lab[lab != IGNORE], return_counts=True)
        return c.max() / c.sum() if c.size else 0.0

    assert sum(worst(x) for x in first[1]) <= sum(worst(x) for x in plain[1])


def test_variable_sized_lists_batch_through_a_crop(data: tuple) -> None:
    images, labels = data
    imgs = [images[0, :300, :400], images[1], images[2, 50:, 100:]]
    labs = [labels[0, :300, :400], labels[1], labels[2, 50:, 100:]]
    out_img, out_lab = A.parse("scale=0.9:1.1,crop=128x160")(imgs, labs, [0, 1, 2], ignore_index=IGNORE)
    assert out_img.shape == (3, 128, 160, 3) and out_lab.shape == (3, 128, 160)
    with pytest.raises(ConfigError):
        A.parse("scale=0.5:2")(imgs, labs, [0, 1, 2], ignore_index=IGNORE)


def test_iter_batches_applies_augment_per_sample(split: Path, data: tuple) -> None:
    images, labels = data
    ds = shardkit.open(split)
    aug = A.parse(FULL)
    seen = 0
    for idx, img, lab in ds.iter_batches(4, seed=5, epoch=1, augment=aug, with_indices=True):
        assert img.shape == (len(idx), 256, 384, 3) and lab.shape == (len(idx), 256, 384)
        want = aug(images[idx], labels[idx], idx, seed=5, epoch=1, ignore_index=IGNORE)
        assert np.array_equal(img, want[0]) and np.array_equal(lab, want[1])
        seen += len(idx)
    assert seen >= len(ds)
    with pytest.raises(ConfigError):
        next(shardkit.open(split, labels="onehot").iter_batches(4, augment=aug))


def test_iter_batches_without_size_batches_through_a_crop(loose: Path, data: tuple) -> None:
    images, labels = data
    ds = shardkit.open(loose)
    aug = A.parse("scale=0.75:1.25,crop=224x224,hflip")
    batches = list(ds.iter_batches(8, seed=2, augment=aug, with_indices=True))
    assert sum(len(b[0]) for b in batches) >= len(ds)
    for idx, img, lab in batches:
        want = aug(images[idx], labels[idx], idx, seed=2, ignore_index=IGNORE)
        assert np.array_equal(img, want[0]) and np.array_equal(lab, want[1])
    # every CamVid sample is 360x480: a pipeline without a crop batches too (a split of mixed sizes refuses it)
    img, lab = next(ds.iter_batches(8, augment=A.parse("hflip")))
    assert img.shape == (8, 360, 480, 3) and lab.shape == (8, 360, 480)


def test_cv2_nearest_is_not_the_label_rule_but_nearly_agrees(data: tuple) -> None:
    """Why labels use a gather: cv2's INTER_NEAREST (fixed-point coordinates) is close to, not exactly, round()."""
    import cv2

    from shardkit.augment.cpu import warp_labels

    _, labels = data
    aug = A.parse("scale=0.5:2,crop=256x384,rotate=10")
    for i in range(4):
        p = aug.params(i, hw=(360, 480))
        for lab in (labels[i], labels[i].astype(np.uint16)):
            ours = warp_labels(lab, p.matrix, p.out_hw, IGNORE)
            theirs = cv2.warpAffine(lab, np.asarray(p.matrix), p.out_hw[::-1],
                                    flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP,
                                    borderMode=cv2.BORDER_CONSTANT, borderValue=IGNORE)
            assert theirs.dtype == lab.dtype and (ours != theirs).mean() < 1e-3
            assert np.array_equal(ours, _independent_labels(lab, p.matrix, p.out_hw))


def test_ranks_draw_what_a_single_process_draws(split: Path) -> None:
    """Each rank's augmented sample equals that sample augmented alone: rank never enters the draws."""
    ds = shardkit.open(split)
    aug = A.parse(FULL)
    for rank in (0, 1):
        for idx, images, labels in ds.iter_batches(4, seed=7, epoch=2, rank=rank, world_size=2, with_indices=True,
                                                   augment=aug):
            for k, i in enumerate(idx):
                img, lab = aug(*ds.batch([int(i)]), [int(i)], seed=7, epoch=2, ignore_index=IGNORE)
                assert np.array_equal(images[k], img[0]) and np.array_equal(labels[k], lab[0])


def test_float_gamma_is_a_power_within_1e_5_and_refuses_values_outside_0_1() -> None:
    x = np.linspace(0, 1, 1001, dtype=np.float32).reshape(7, 11, 13)
    x.reshape(-1)[5] = np.nan
    got = x.copy()
    cpu.float_gamma(got, 1.7)
    _close_to_power(got, x, 1.7)
    for bad in (-0.01, 1.5, np.inf):
        y = x.copy()
        y[3, 4, 5] = bad
        before = y.copy()
        with pytest.raises(ConfigError, match=r"takes values in \[0, 1\]") as err:
            cpu.float_gamma(y, 0.8)
        assert "\n" not in str(err.value)
        np.testing.assert_array_equal(y, before)  # nothing changed


def _close_to_power(got: np.ndarray, x: np.ndarray, g: float) -> None:
    """``got`` is ``x ** g`` (g rounded to float32) within 1e-5 relative of the exact power, NaN where x is NaN,
    0 and 1 exactly where x is 0 and 1."""
    exact = np.power(x.astype(np.float64), float(np.float32(g)))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x))
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=np.finfo(np.float32).tiny)
    assert (got[x == 0] == 0).all() and (got[x == 1] == 1).all()


def test_float_gamma_with_and_without_numba_is_the_power(monkeypatch: pytest.MonkeyPatch) -> None:
    """cv2.pow with the zeros left out: with and without numba (only the range check is compiled) the same values,
    within 1e-5 relative of the exact power, also over values log-uniform down to 1e-37 and in a non-contiguous
    view."""
    rng = np.random.default_rng(0)
    x = rng.random((64, 80, 4), dtype=np.float32)
    x[0, 0, 0], x[1, 1, 1], x[2, 2, 2] = 0.0, 1.0, np.nan
    x[3] = (10.0 ** rng.uniform(-37, 0, x[3].shape)).astype(np.float32)
    for g in (0.3, 0.8, 1.0, 1.2, 2.5):
        fast = x.copy()
        cpu.float_gamma(fast, g)
        with monkeypatch.context() as mp:
            mp.setenv("SHARDKIT_NO_NUMBA", "1")
            slow = x.copy()
            cpu.float_gamma(slow, g)
        np.testing.assert_array_equal(fast, slow)
        _close_to_power(fast, x, g)
        view = x[:, ::-1].copy()[:, ::-1]  # non-contiguous: copied, powered, written back
        cpu.float_gamma(view, g)
        np.testing.assert_array_equal(view, fast)


def _introspections(batch: int) -> int:
    """How many times numpy's Python-level dtype introspection (``dtype.name`` → ``_name_get``,
    ``np.issubdtype``) runs while :func:`cpu.apply_batch` checks and crops a batch of ``batch`` samples."""
    rng = np.random.default_rng(batch)
    images = [rng.integers(0, 256, (40, 48, 3), dtype=np.uint8) for _ in range(batch)]
    labels = [rng.integers(0, 12, (40, 48), dtype=np.uint8) for _ in range(batch)]
    calls = 0

    def count(frame: Any, event: str, _arg: Any) -> None:
        nonlocal calls
        if event == "call" and frame.f_code.co_name in ("_name_get", "issubdtype"):
            calls += 1

    aug = A.parse("crop=32x48,hflip")
    sys.setprofile(count)
    try:
        got = cpu.apply_batch(aug, images, labels, list(range(batch)), seed=0, epoch=0, ignore_index=255)
    finally:
        sys.setprofile(None)
    assert got[0].shape == (batch, 32, 48, 3)
    return calls


def test_batch_checks_do_not_introspect_every_samples_dtype() -> None:
    """numpy's ``dtype.name`` and ``issubdtype`` cost ~18 µs a call, a fifth of a crop's copy: the checks of a batch
    run them a fixed number of times, not once or twice per sample (2 samples or 64: the same count)."""
    assert _introspections(64) == _introspections(2)


def test_batch_checks_still_refuse_mixed_dtypes_and_non_integer_labels() -> None:
    """The per-batch checks refuse what the per-sample ones did: any image whose dtype differs from the first (byte
    order included), an unsupported first dtype, and labels that are not integers (bool included)."""
    img, lab = np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8), np.uint8)
    aug = A.parse("crop=8x8")

    def run(images: list[np.ndarray], labels: list[np.ndarray]) -> None:
        cpu.apply_batch(aug, images, labels, list(range(len(images))), seed=0, epoch=0, ignore_index=255)

    run([img, img], [lab, lab.astype(np.int16)])  # any integer labels
    for images in ([img, img.astype(np.float64)], [img.astype(np.float64), img.astype(np.float64)],
                   [img.astype("<u2"), img.astype(">u2")], [img, img, img.astype(np.int8)]):
        with pytest.raises(ConfigError, match="one dtype"):
            run(images, [lab] * len(images))
    for bad in (lab.astype(bool), lab.astype(np.float32)):
        with pytest.raises(ConfigError, match="integer id labels"):
            run([img, img], [lab, bad])
