"""A.Normalize and A.OneHot: the pipeline ops every reader's normalising and one-hot expansion now go through.

Their outputs are checked against the formulas restated here, on real CamVid, through the numpy path, the
torch path (CPU device; CUDA where lent) and CudaPrefetcher. The one-hot rule (shardkit.codecs.onehot): the ignore
class is never a channel — CamVid's ignore id 11 lies inside its 12 classes, so one-hot outputs have 11
channels and ignore pixels (augmentation padding included) are all-zero vectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit import augment as A
from shardkit.errors import ConfigError

IGNORE = 11


@pytest.fixture(scope="module")
def ds(camvid_val_npy: Path) -> shardkit.Dataset:
    return shardkit.open(camvid_val_npy)


@pytest.fixture(scope="module")
def data(ds: shardkit.Dataset) -> tuple[np.ndarray, np.ndarray]:
    return ds.batch(np.arange(len(ds)))


def _old_normalize(images: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """What Dataset.normalize computed before the op: float32 subtract, then times float32 1/std."""
    out = np.empty(images.shape, np.float32)
    np.subtract(images, mean, out=out, dtype=np.float32)
    np.multiply(out, np.float32(1.0) / std, out=out)
    return out


def _old_onehot(ids: np.ndarray, c: int, dtype: type, channels_first: bool, ignore: int | None = IGNORE
                ) -> np.ndarray:
    """The rule restated: one channel per class other than the ignore class, in class order."""
    keep = np.array([k for k in range(c) if k != ignore])
    hot = (ids[..., None] == keep).astype(dtype)  # the ignore id and ids ≥ C → all zero
    return np.moveaxis(hot, -1, -3) if channels_first else hot


def test_normalize_op_equals_the_old_reader_formula(ds: shardkit.Dataset, data: tuple) -> None:
    images, _ = data
    want = _old_normalize(images, ds.mean, ds.std)
    assert np.array_equal(A.Normalize(ds.mean, ds.std).numpy(images), want)
    assert np.array_equal(ds.normalize(images), want)
    np.testing.assert_allclose(want, (images - ds.mean) / ds.std, rtol=1e-5, atol=1e-5)
    assert ds.normalizer == A.Normalize(ds.mean, ds.std)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("channels_first", [False, True])
def test_onehot_op_equals_the_reader_output(ds: shardkit.Dataset, data: tuple, dtype: type,
                                            channels_first: bool) -> None:
    _, labels = data
    labels = labels.copy()
    labels[:, :5] = 255  # ids past the classes → all-zero vectors
    op = A.OneHot(ds.num_classes, dtype, channels_first=channels_first)
    assert np.array_equal(op.numpy(labels, IGNORE), _old_onehot(labels, ds.num_classes, dtype, channels_first))
    assert np.array_equal(op.numpy(labels, 255), _old_onehot(labels, ds.num_classes, dtype, channels_first, None))
    layout = "channels_first" if channels_first else "channels_last"
    reader = shardkit.open(ds.path, labels="onehot" if dtype is np.uint8 else "float_onehot", label_layout=layout)
    assert reader.output == op.encoding(IGNORE) and reader.onehot_channels == op.channels(IGNORE) == 11
    assert np.array_equal(reader.batch([3, 4])[1], op.numpy(ds.batch([3, 4])[1], IGNORE))


def test_pipeline_ending_in_output_ops_normalises_and_expands(ds: shardkit.Dataset, data: tuple) -> None:
    images, labels = data
    geo = A.parse("scale=0.5:2,crop=256x384,hflip,rotate=10,cutout=1:30x30:ignore")
    full = A.Compose([*geo.ops, A.Normalize(ds.mean, ds.std), A.OneHot(ds.num_classes, np.float32)])
    assert full.normalizes and full.one_hot and not geo.normalizes
    idx = np.arange(6)
    img, lab = geo(images[:6], labels[:6], idx, seed=1, epoch=2, ignore_index=IGNORE)
    x, y = full(images[:6], labels[:6], idx, seed=1, epoch=2, ignore_index=IGNORE)
    assert x.dtype == np.float32 and np.array_equal(x, _old_normalize(img, ds.mean, ds.std))
    assert y.dtype == np.float32 and np.array_equal(y, _old_onehot(lab, ds.num_classes, np.float32, False))
    # the output ops draw nothing: every op's parameters are those of the pipeline without them
    assert full.params(3, seed=1, epoch=2, hw=(360, 480)) == geo.params(3, seed=1, epoch=2, hw=(360, 480))
    batches = list(ds.iter_batches(8, seed=1, augment=full))
    assert batches[0][0].dtype == np.float32 and batches[0][1].shape == (8, 256, 384, ds.num_classes - 1)


def test_output_ops_must_end_the_pipeline() -> None:
    with pytest.raises(ConfigError, match="end the pipeline"):
        A.Compose([A.Normalize((0, 0, 0), (1, 1, 1)), A.RandomFlip()])
    with pytest.raises(ConfigError, match="one Normalize"):
        A.Compose([A.Normalize((0, 0, 0), (1, 1, 1)), A.Normalize((0, 0, 0), (1, 1, 1))])
    for bad in ({"mean": (0, 0), "std": (1, 1, 1)}, {"mean": (0, 0, 0), "std": (1, 0, 1)},
                {"mean": (0, np.nan, 0), "std": (1, 1, 1)}):
        with pytest.raises(ConfigError):
            A.Normalize(**bad)
    for bad_onehot in ((0,), (4, np.int64), (2.5,)):
        with pytest.raises(ConfigError):
            A.OneHot(*bad_onehot)


torch = pytest.importorskip("torch")
from .devices import DEVICES  # noqa: E402


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_first", [False, True])
def test_torch_output_ops_equal_the_numpy_ones(ds: shardkit.Dataset, data: tuple, device: str,
                                               channels_first: bool) -> None:
    from shardkit.augment.torch import apply_batch

    images, labels = data
    aug = A.Compose([A.RandomCrop(300, 400), A.Normalize(ds.mean, ds.std),
                     A.OneHot(ds.num_classes, np.uint8, channels_first=channels_first)])
    idx = np.arange(8)
    want_x, want_y = aug(images[:8], labels[:8], idx, seed=3, ignore_index=IGNORE)
    nchw = torch.from_numpy(images[:8]).to(device)
    if channels_first:
        nchw = nchw.permute(0, 3, 1, 2)
    x, y = apply_batch(aug, nchw, torch.from_numpy(labels[:8]).to(device), idx, seed=3, ignore_index=IGNORE,
                       channels_first=channels_first, epoch=0)
    x = x.cpu().numpy()
    assert np.array_equal(np.moveaxis(x, 1, -1) if channels_first else x, want_x)  # crop only: exact pixels
    assert y.dtype == torch.uint8 and np.array_equal(y.cpu().numpy(), want_y)


@pytest.mark.parametrize("labels", ["onehot", "float_onehot"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_prefetcher_outputs_equal_the_old_formulas(ds: shardkit.Dataset, labels: str, layout: str) -> None:
    from shardkit.read.torch import CudaPrefetcher, make_loader

    loader = make_loader(ds.path, shardkit.EpochPlan(4, shuffle=False), layout=layout)
    x, y = next(iter(CudaPrefetcher(loader, "cpu", labels=labels)))
    images, ids = ds.batch(np.arange(4))
    want_x = _old_normalize(images, ds.mean, ds.std)
    dtype = np.float32 if labels == "float_onehot" else np.uint8
    want_y = _old_onehot(ids, ds.num_classes, dtype, layout == "NCHW")
    assert np.array_equal(x.numpy(), np.moveaxis(want_x, -1, 1) if layout == "NCHW" else want_x)
    assert np.array_equal(y.numpy(), want_y)


def test_prefetcher_refuses_to_normalise_or_expand_twice(ds: shardkit.Dataset) -> None:
    from shardkit.read.torch import CudaPrefetcher, make_loader

    loader = make_loader(ds.path, 4, with_indices=True)
    crop = A.RandomCrop(64, 64)
    with pytest.raises(ConfigError, match="normalise twice"):
        CudaPrefetcher(loader, "cpu", augment=A.Compose([crop, A.Normalize(ds.mean, ds.std)]))
    with pytest.raises(ConfigError, match="labels=None"):
        CudaPrefetcher(loader, "cpu", augment=A.Compose([crop, A.OneHot(ds.num_classes)]), normalize=False)
    aug = A.Compose([crop, A.Normalize(ds.mean, ds.std), A.OneHot(ds.num_classes)])
    x, y, idx = next(iter(CudaPrefetcher(loader, "cpu", augment=aug, normalize=False, labels=None)))
    want_x, want_y = aug(*ds.batch(idx.numpy()), idx.numpy(), seed=0, ignore_index=IGNORE)
    assert np.array_equal(x.numpy(), np.moveaxis(want_x, -1, 1)) and np.array_equal(y.numpy(), want_y)


@pytest.mark.parametrize("channels_first", [False, True])
def test_make_loader_keeps_the_layout_the_onehot_op_was_given(ds: shardkit.Dataset, channels_first: bool) -> None:
    from shardkit.read.torch import make_loader

    aug = A.Compose([A.RandomCrop(64, 96), A.RandomFlip(), A.Normalize(ds.mean, ds.std),
                     A.OneHot(ds.num_classes, np.float32, channels_first=channels_first)])
    loader = make_loader(ds.path, shardkit.EpochPlan(4, seed=3), augment=aug, layout="NCHW", with_indices=True)
    loader.sampler.set_epoch(1)
    x, y, idx = next(iter(loader))
    want_x, want_y = aug(*ds.batch(idx.numpy()), idx.numpy(), seed=3, epoch=1, ignore_index=IGNORE)
    assert np.array_equal(x.numpy(), np.moveaxis(want_x, -1, 1))  # images follow the loader's layout
    assert y.shape == want_y.shape and np.array_equal(y.numpy(), want_y)  # labels the op's


# ---------------------------------------------------------------- the ignore class is never a positive class
PADDING = "scale=0.3:0.6,crop=300x400,hflip,rotate=15,cutout=1:40x40:ignore"  # pads most of every sample


@pytest.fixture(scope="module")
def stored_splits(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """CamVid val (first 8 pairs' worth of shards are read) stored as one-hot (HDF5) and bit-packed (LMDB)."""
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert

    out: dict[str, Path] = {}
    for fmt, enc in (("hdf5", "onehot"), ("lmdb", "packed")):
        root = tmp_path_factory.mktemp(f"camvid-{enc}")
        convert(ConvertConfig(camvid_root, root, format=fmt, size=(360, 480), splits=("val",), workers=1,
                              quiet=True, label_encoding=enc, shard_size=ShardSize(samples=13)))
        out[enc] = root / "val"
    return out


def _check_rule(hot: np.ndarray, ids: np.ndarray, channels_first: bool = False) -> None:
    """``hot`` is the one-hot of ``ids`` under the rule: 11 channels, ignore pixels all zero, others one hot."""
    last = np.moveaxis(hot, -3, -1) if channels_first else hot
    assert last.shape == (*ids.shape, 11)
    sums = last.sum(axis=-1)
    assert not sums[ids == IGNORE].any(), "an ignore pixel has a hot channel"
    assert (sums[ids != IGNORE] == 1).all()
    assert np.array_equal(last, _old_onehot(ids, 12, last.dtype, False))


@pytest.mark.parametrize("stored", ["index", "onehot", "packed"])
@pytest.mark.parametrize("labels", ["onehot", "float_onehot"])
@pytest.mark.parametrize("layout", ["channels_last", "channels_first"])
def test_every_reader_output_gives_ignore_pixels_no_channel(ds: shardkit.Dataset, stored_splits: dict[str, Path],
                                                            stored: str, labels: str, layout: str) -> None:
    path = ds.path if stored == "index" else stored_splits[stored]
    reader = shardkit.open(path, labels=labels, label_layout=layout)
    ids = ds.batch(np.arange(8))[1]
    assert (ids == IGNORE).sum() > 10_000  # CamVid val really has ignore pixels
    hot = reader.batch(np.arange(8))[1]
    _check_rule(hot, ids, layout == "channels_first")
    _check_rule(np.stack([reader[i][1] for i in range(2)]), ids[:2], layout == "channels_first")
    # the stored one-hot keeps every class id (plane 11 included) and decodes back exactly
    assert np.array_equal(shardkit.open(path, labels="ids").batch(np.arange(8))[1], ids)


def test_augmentation_padding_is_all_zero_on_the_numpy_path(ds: shardkit.Dataset, data: tuple) -> None:
    images, labels = data
    geo = A.parse(PADDING)
    aug = A.Compose([*geo.ops, A.OneHot(ds.num_classes, np.float32)])
    idx = np.arange(8)
    _, ids = geo(images[:8], labels[:8], idx, seed=4, epoch=1, ignore_index=IGNORE)
    _, hot = aug(images[:8], labels[:8], idx, seed=4, epoch=1, ignore_index=IGNORE)
    assert (ids == IGNORE).mean() > 0.3  # padded and cut out: a third of the batch or more is ignore
    _check_rule(hot, ids)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_onehot_follows_the_rule(ds: shardkit.Dataset, data: tuple, device: str) -> None:
    from shardkit.augment.torch import apply_batch

    images, labels = data
    aug = A.Compose([*A.parse(PADDING).ops, A.OneHot(ds.num_classes, np.float32, channels_first=True)])
    idx = np.arange(8)
    want = aug(images[:8], labels[:8], idx, seed=4, epoch=1, ignore_index=IGNORE)[1]
    _, y = apply_batch(aug, torch.from_numpy(images[:8]).to(device), torch.from_numpy(labels[:8]).to(device),
                       idx, seed=4, epoch=1, ignore_index=IGNORE)
    ids = A.parse(PADDING)(images[:8], labels[:8], idx, seed=4, epoch=1, ignore_index=IGNORE)[1]
    _check_rule(y.cpu().numpy(), ids, channels_first=True)
    assert np.array_equal(y.cpu().numpy(), want)


@pytest.mark.parametrize("labels", ["onehot", "float_onehot"])
def test_prefetcher_and_loader_follow_the_rule(ds: shardkit.Dataset, labels: str) -> None:
    from shardkit.read.torch import CudaPrefetcher, ShardkitTorchDataset, make_loader

    ids = ds.batch(np.arange(4))[1]
    loader = make_loader(ds.path, shardkit.EpochPlan(4, shuffle=False), layout="NCHW")
    _, y = next(iter(CudaPrefetcher(loader, "cpu", labels=labels)))
    _check_rule(y.numpy(), ids, channels_first=True)
    tds = ShardkitTorchDataset(ds.path, options=shardkit.OpenOptions(labels=labels))
    _check_rule(np.stack([np.asarray(tds[i][1]) for i in range(4)]), ids, channels_first=True)


def test_an_ignore_id_in_the_middle_moves_the_classes_above_it_down_on_every_backend(tf) -> None:
    """Edge case (synthetic ids): ignore 2 of 5 classes → channels are classes 0, 1, 3, 4."""
    from shardkit.augment.tf import one_hot as tf_one_hot
    from shardkit.augment.torch import TorchOneHot

    ids = np.array([[[0, 1, 2, 3, 4, 2, 255]]], np.uint8)
    op = A.OneHot(5, np.uint8)
    want = np.array([[[[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0],
                       [0, 0, 0, 0]]]], np.uint8)
    assert op.channels(2) == 4 and op.channels(255) == 5 and op.channels(None) == 5
    assert np.array_equal(op.numpy(ids, 2), want)
    assert np.array_equal(TorchOneHot(op, "cpu", 2)(torch.from_numpy(ids)).numpy(), want)
    assert np.array_equal(tf_one_hot(tf.constant(ids), op, 2).numpy(), want)
    assert np.array_equal(op.encoding(2).decode(want, 2), [[[0, 1, 2, 3, 4, 2, 2]]])  # all-zero → the ignore id


def test_tensorflow_outputs_follow_the_rule(tf, ds: shardkit.Dataset, data: tuple,
                                            stored_splits: dict[str, Path]) -> None:
    import shardkit.tf
    from shardkit.augment.tf import apply_batch

    images, labels = data
    aug = A.Compose([*A.parse(PADDING).ops, A.OneHot(ds.num_classes, np.float32)])
    idx = np.arange(8)
    ids = A.parse(PADDING)(images[:8], labels[:8], idx, seed=4, epoch=1, ignore_index=IGNORE)[1]
    _, y = apply_batch(aug, tf.constant(images[:8]), tf.constant(labels[:8]), idx, seed=4, epoch=1,
                       ignore_index=IGNORE)
    _check_rule(y.numpy(), ids)
    for path in (ds.path, stored_splits["onehot"], stored_splits["packed"]):
        _, got = next(iter(shardkit.tf.dataset(path, shardkit.EpochPlan(8, shuffle=False),
                                               options=shardkit.OpenOptions(labels="float_onehot"))))
        _check_rule(got.numpy(), ds.batch(np.arange(8))[1])
