"""The TensorFlow augmentation backend and ``shardkit.tf.dataset(augment=)`` against the CPU path, on real data.

Labels must be identical to the CPU path for the same (seed, epoch, index), dtype kept; images within one
level for geometry (both compute the bilinear warp in float32). TensorFlow is imported before anything
here converts (the ``tfrecord`` package must never share its process).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit import augment as A
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import ConfigError

IGNORE = 11
GEOMETRY = "scale=0.5:2,crop=256x384,hflip,rotate=10"
SMALL = "scale=0.4:0.8,crop=128x160,hflip,rotate=10"  # whole-dataset passes: a small crop keeps them fast


@pytest.fixture(scope="module")
def apply_batch(tf):
    from shardkit.augment.tf import apply_batch

    return apply_batch


@pytest.fixture(scope="module")
def tfdata(tf):
    import shardkit.tf

    return shardkit.tf.dataset


@pytest.fixture(scope="module")
def data(camvid_val_npy: Path) -> tuple[np.ndarray, np.ndarray]:
    """The 26 CamVid val pairs (360x480, ignore id 11) stacked."""
    ds = shardkit.open(camvid_val_npy)
    return ds.batch(np.arange(len(ds)))


@pytest.fixture(scope="module")
def tfrecord_split(tf, camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CamVid val as TFRecord converted without --size (its samples all 360x480), 7 samples per shard."""
    out = tmp_path_factory.mktemp("augment-tfrecord")
    convert(ConvertConfig(camvid_root, out, format="tfrecord", splits=("val",), workers=2,
                          quiet=True, shard_size=ShardSize(samples=7)))
    assert "tfrecord" not in sys.modules
    return out / "val"


@pytest.fixture(scope="module")
def rgb_loose(rgb_masks_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """rgb-masks-mini val (5 pairs of different sizes, ~194x250) as npy converted without --size."""
    out = tmp_path_factory.mktemp("augment-rgb-loose")
    convert(ConvertConfig(rgb_masks_root, out, format="npy", splits=("val",), workers=1, quiet=True,
                          unknown_as=255, ignore_index=255))
    return out / "val"


def _by_index(data, core) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """One pass over a (images, labels, keys) tf dataset → {sample index: (image, label)}."""
    index = {core.key(i): i for i in range(len(core))}
    out = {}
    for images, labels, keys in data:
        for img, lab, key in zip(images.numpy(), labels.numpy(), keys.numpy(), strict=True):
            out[index[key.decode()]] = (img, lab)
    return out


def _check_cpu(got: dict, core, aug: A.Compose, *, seed: int, epoch: int, ignore: int = IGNORE,
               tol: int = 1) -> None:
    """Every sample's TF output against the CPU path for the same (seed, epoch, index)."""
    idx = np.array(sorted(got))
    images, labels = zip(*(core[int(i)] for i in idx), strict=True)
    want_img, want_lab = aug(images, labels, idx, seed=seed, epoch=epoch, ignore_index=ignore)
    for k, i in enumerate(idx):
        img, lab = got[int(i)]
        assert lab.dtype == want_lab.dtype and np.array_equal(lab, want_lab[k]), f"sample {i}"
        assert np.abs(img.astype(np.int16) - want_img[k]).max() <= tol, f"sample {i}"


@pytest.mark.parametrize(("spec", "exact_colour"), [
    (GEOMETRY, True), ("hflip,rotate=30", True),
    ("crop=300x400:0.75,jitter=0.3:0.3:0.3:0.1", True),  # colour alone: LUT, grey and HSV as OpenCV's
    (GEOMETRY + ",jitter=0.2", False),
    ("scale=0.7:1.5,crop=352x480,rotate=15,jitter=0.2:0.2:0.2:0.05", False)])
def test_labels_identical_and_images_close_to_the_cpu_path(data: tuple, apply_batch, spec: str,
                                                          exact_colour: bool) -> None:
    images, labels = data[0][:8], data[1][:8]
    aug = A.parse(spec)
    idx = np.arange(3, 11)
    want_img, want_lab = aug(images, labels, idx, seed=5, epoch=2, ignore_index=IGNORE)
    got_img, got_lab = apply_batch(aug, images, labels, idx, seed=5, epoch=2, ignore_index=IGNORE)
    assert got_lab.dtype.name == "uint8" and got_img.shape == want_img.shape
    assert np.array_equal(got_lab.numpy(), want_lab)
    diff = np.abs(got_img.numpy().astype(np.int16) - want_img)
    if exact_colour:  # bilinear rounding only (colour ops restate OpenCV's: one level at most, e.g. on an HSV
        assert diff.max() <= 1  # row tail OpenCV rounds instead of truncating, or without FMA on another CPU)
    else:  # a one-level bilinear difference can be stretched by contrast, saturation and hue
        assert np.mean(diff > 1) < 1e-3 and diff.max() <= 8
    if "rotate" in spec:
        assert (want_lab == IGNORE).sum() > (labels == IGNORE).sum() * 0.5  # the corners really map outside


def test_uint16_labels_keep_their_dtype_and_ids(data: tuple, apply_batch) -> None:
    images, labels = data[0][:4], data[1][:4].astype(np.uint16) * 1000 + 7
    aug = A.parse(GEOMETRY)
    _, want = aug(images, labels, [0, 1, 2, 3], seed=1, epoch=0, ignore_index=65535)
    _, got = apply_batch(aug, images, labels, [0, 1, 2, 3], seed=1, epoch=0, ignore_index=65535)
    assert got.dtype.name == "uint16" and np.array_equal(got.numpy(), want)
    assert 65535 in want and set(np.unique(want)) <= set(np.unique(labels)) | {65535}


def test_samples_padded_to_one_canvas_augment_as_alone(data: tuple, apply_batch) -> None:
    """Different sizes padded (images 0, labels ignore) with their true hw = each augmented on its own."""
    sizes = [(360, 480), (300, 420), (200, 300)]
    images = [data[0][k, :h, :w] for k, (h, w) in enumerate(sizes)]
    labels = [data[1][k, :h, :w] for k, (h, w) in enumerate(sizes)]
    canvas_img = np.zeros((3, 360, 480, 3), np.uint8)
    canvas_lab = np.full((3, 360, 480), IGNORE, np.uint8)
    for k, (h, w) in enumerate(sizes):
        canvas_img[k, :h, :w], canvas_lab[k, :h, :w] = images[k], labels[k]
    aug = A.parse("scale=0.5:1.5,hflip,rotate=20,crop=192x256")
    want_img, want_lab = aug(images, labels, [4, 9, 2], seed=2, epoch=1, ignore_index=IGNORE)
    got_img, got_lab = apply_batch(aug, canvas_img, canvas_lab, [4, 9, 2], seed=2, epoch=1, ignore_index=IGNORE,
                                   hw=np.array(sizes))
    assert np.array_equal(got_lab.numpy(), want_lab)
    assert np.abs(got_img.numpy().astype(np.int16) - want_img).max() <= 1


def test_dataset_is_the_cpu_path_whatever_the_batch_size(camvid_val_npy: Path, tfdata) -> None:
    core = shardkit.open(camvid_val_npy)
    aug = A.parse(SMALL + ",jitter=0.2")
    outs = [_by_index(tfdata(camvid_val_npy, shardkit.EpochPlan(b, seed=7, epoch=3), augment=aug, with_keys=True), core)
            for b in (4, 7)]
    assert sorted(outs[0]) == list(range(len(core)))
    for i in outs[0]:
        assert all(np.array_equal(a, b) for a, b in zip(outs[0][i], outs[1][i], strict=True)), f"sample {i}"
    _check_cpu(outs[0], core, aug, seed=7, epoch=3, tol=2)


def test_each_pass_is_the_next_epoch_and_epochs_differ(camvid_val_npy: Path, tfdata) -> None:
    core = shardkit.open(camvid_val_npy)
    aug = A.parse(SMALL)
    data = tfdata(camvid_val_npy, shardkit.EpochPlan(8, seed=1, epoch=4), augment=SMALL, with_keys=True)
    first, second = _by_index(data, core), _by_index(data, core)
    _check_cpu(first, core, aug, seed=1, epoch=4)
    _check_cpu(second, core, aug, seed=1, epoch=5)
    assert sum(not np.array_equal(first[i][1], second[i][1]) for i in first) >= len(first) - 1
    later = _by_index(tfdata(camvid_val_npy, shardkit.EpochPlan(5, seed=1, epoch=5), augment=aug, with_keys=True), core)
    assert all(np.array_equal(later[i][1], second[i][1]) for i in later)  # epoch=5 is pass 1 of epoch=4


def test_tfrecord_read_by_tensorflow_augments_as_the_cpu_path(tfrecord_split: Path, tfdata) -> None:
    core = shardkit.open(tfrecord_split)
    assert core.spec.size is None  # one size all the same: batched as is, augmented or not
    images, labels = next(iter(tfdata(tfrecord_split, shardkit.EpochPlan(4, shuffle=False))))
    assert images.shape == (4, 360, 480, 3) and np.array_equal(labels.numpy(), core.batch([0, 1, 2, 3])[1])
    aug = A.parse(SMALL + ",jitter=0.2:0.2:0.2:0.05")
    data = tfdata(tfrecord_split, shardkit.EpochPlan(6, seed=3, epoch=2), augment=aug, with_keys=True)
    for epoch in (2, 3):  # pass k draws epoch 2 + k (the epoch comes from a per-iterator counter)
        got = _by_index(data, core)
        assert sorted(got) == list(range(len(core)))
        _check_cpu(got, core, aug, seed=3, epoch=epoch, tol=8)


def test_variable_size_split_batches_through_a_final_crop(rgb_loose: Path, tfdata) -> None:
    core = shardkit.open(rgb_loose)
    assert core.spec.size is None and len({core[i][0].shape for i in range(len(core))}) > 1
    aug = A.parse("scale=0.8:1.2,rotate=10,hflip,crop=160x224")
    data = tfdata(rgb_loose, shardkit.EpochPlan(3, seed=2, epoch=0, drop_last=False), augment=aug, with_keys=True)
    shapes = [tuple(b[0].shape) for b in data]
    assert shapes == [(3, 160, 224, 3), (2, 160, 224, 3)]
    _check_cpu(_by_index(data, core), core, aug, seed=2, epoch=1, ignore=255)  # the second pass: epoch 1
    with pytest.raises(ConfigError, match="one size"):
        tfdata(rgb_loose, 3, augment="hflip")


@pytest.mark.parametrize(("augment", "kwargs", "match"), [
    ("scale=2:1,crop=10x10", {}, "scale range"),
    ("crop=10x10,blur=3", {}, "unknown augment item"),
    (42, {}, "Compose or its string form"),
    ("scale=0.5:2,hflip", {}, "differ in size"),
    ("hflip", {"options": shardkit.OpenOptions(labels="onehot")}, "id labels"),
])
def test_bad_augment_is_a_config_error_before_tensorflow_runs(camvid_val_npy: Path, tfdata, augment, kwargs,
                                                              match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        tfdata(camvid_val_npy, 4, augment=augment, **kwargs)


def test_an_op_the_tf_backend_cannot_apply_is_refused_not_skipped(camvid_val_npy: Path, tfdata, data: tuple,
                                                                 apply_batch) -> None:
    class Posterize(A.ops.Op):  # an op only another backend would know
        def draw(self, rng: np.random.Generator, st: A.ops._State) -> None:
            st.values["brightness"] = 1.0

    aug = A.Compose([A.RandomCrop(64, 64), Posterize()])
    with pytest.raises(ConfigError, match="does not apply Posterize"):
        tfdata(camvid_val_npy, 4, augment=aug)
    with pytest.raises(ConfigError, match="does not apply Posterize"):
        apply_batch(aug, data[0][:2], data[1][:2], [0, 1])


@pytest.mark.parametrize("jit", [True, False])
def test_image_ops_with_and_without_xla_stay_within_one_level(data: tuple, apply_batch, jit: bool) -> None:
    images, labels = data[0][:4], data[1][:4]
    aug = A.parse("scale=0.5:2,crop=256x384,rotate=10,jitter=0:0:0.3:0.1")
    want_img, want_lab = aug(images, labels, [0, 1, 2, 3], seed=8, ignore_index=IGNORE)
    got_img, got_lab = apply_batch(aug, images, labels, [0, 1, 2, 3], seed=8, ignore_index=IGNORE, jit=jit)
    assert np.array_equal(got_lab.numpy(), want_lab)
    diff = np.abs(got_img.numpy().astype(np.int16) - want_img)
    assert np.mean(diff > 1) < 1e-3 and diff.max() <= 8


def test_normalize_applies_after_augmenting(rgb_loose: Path, tfdata) -> None:
    core = shardkit.open(rgb_loose)
    aug = A.parse("rotate=5,crop=128x128")
    got = {}
    index = {core.key(i): i for i in range(len(core))}
    for x, _, keys in tfdata(rgb_loose, shardkit.EpochPlan(2, seed=4), augment=aug, normalize=True, with_keys=True):
        assert x.dtype.name == "float32"
        got.update({index[k.decode()]: v for k, v in zip(keys.numpy(), x.numpy(), strict=True)})
    idx = np.array(sorted(got))
    images, labels = zip(*(core[int(i)] for i in idx), strict=True)
    want, _ = aug(images, labels, idx, seed=4, epoch=0, ignore_index=255)
    want = core.normalize(want)
    assert np.abs(np.stack([got[int(i)] for i in idx]) - want).max() <= 1.0 / core.std.min() + 1e-4


@pytest.mark.parametrize("cutout", ["cutout=0-3:40x56", "cutout=2:64x48:128:ignore"])
def test_cutout_holes_and_labels_identical_to_the_cpu_path(data: tuple, apply_batch, cutout: str) -> None:
    images, labels = data[0][:6], data[1][:6]
    aug = A.parse(f"{GEOMETRY},jitter=0.2,{cutout}")
    idx = np.arange(20, 26)
    want_img, want_lab = aug(images, labels, idx, seed=3, epoch=1, ignore_index=IGNORE)
    got_img, got_lab = apply_batch(aug, images, labels, idx, seed=3, epoch=1, ignore_index=IGNORE)
    assert np.array_equal(got_lab.numpy(), want_lab)
    got_img = got_img.numpy()
    holes = np.zeros(want_lab.shape, bool)
    for k, i in enumerate(idx):
        for y0, x0, y1, x1 in aug.params(int(i), seed=3, epoch=1, hw=(360, 480)).holes:
            holes[k, y0:y1, x0:x1] = True
    assert holes.any() and np.array_equal(got_img[holes], want_img[holes])  # hole pixels exactly the fill
    diff = np.abs(got_img.astype(np.int16) - want_img)
    assert np.mean(diff > 1) < 1e-3 and diff.max() <= 8


def test_normalize_and_onehot_ops_end_the_pipeline_as_on_the_cpu_path(camvid_val_npy: Path, tfdata) -> None:
    core = shardkit.open(camvid_val_npy)
    aug = A.Compose([*A.parse(SMALL).ops, A.Normalize(core.mean, core.std),
                     A.OneHot(core.num_classes, "float32", channels_first=True)])
    x, y, keys = next(iter(tfdata(camvid_val_npy, shardkit.EpochPlan(4, seed=2), augment=aug, with_keys=True)))
    assert x.dtype.name == "float32" and y.dtype.name == "float32" and y.shape == (4, core.onehot_channels, 128, 160)
    index = {core.key(i): i for i in range(len(core))}
    idx = np.array([index[k.decode()] for k in keys.numpy()])
    want_x, want_y = aug(*core.batch(idx), idx, seed=2, epoch=0, ignore_index=IGNORE)
    assert np.array_equal(y.numpy(), want_y)
    assert np.abs(x.numpy() - want_x).max() <= 1.0 / core.std.min() + 1e-4  # one level, normalised
    with pytest.raises(ConfigError, match="normalise twice"):
        tfdata(camvid_val_npy, 4, augment=aug, normalize=True)
