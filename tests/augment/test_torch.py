"""The PyTorch augmentation backend and CudaPrefetcher(augment=) against the numpy/OpenCV path, on real CamVid.

Labels must be identical to the CPU path for the same (seed, epoch, index); images within one level for
geometry (OpenCV 5 computes warpAffine in float32, as this backend does). On a CUDA machine the same
checks run on the GPU (``cuda`` parameter); without one those cases skip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit import augment as A
from shardkit.errors import ConfigError

torch = pytest.importorskip("torch")
from shardkit.augment.torch import apply_batch  # noqa: E402
from shardkit.read.torch import CudaPrefetcher, make_loader  # noqa: E402

IGNORE = 11
GEOMETRY = "scale=0.5:2,crop=256x384,hflip,rotate=10"
from .devices import DEVICES, cpu_and_torch  # noqa: E402


@pytest.fixture(scope="module")
def split(camvid_val_npy: Path) -> Path:
    """CamVid val (26 pairs) as npy shards at 360x480."""
    return camvid_val_npy


@pytest.fixture(scope="module")
def data(split: Path) -> tuple[np.ndarray, np.ndarray]:
    ds = shardkit.open(split)
    return ds.batch(np.arange(len(ds)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", [GEOMETRY, GEOMETRY + ",jitter=0.2", "crop=300x400,jitter=0.3:0.3:0.3",
                                  "scale=0.7:1.5,crop=352x480,rotate=15,jitter=0.2:0.2:0.2:0.05"])
def test_labels_identical_and_images_close_to_the_cpu_path(data: tuple, spec: str, device: str) -> None:
    images, labels = data
    want_img, want_lab, got_img, got_lab = cpu_and_torch(A.parse(spec), images, labels, device, seed=5, epoch=2,
                                                         ignore_index=IGNORE)
    assert got_lab.dtype == torch.uint8 and got_img.shape == want_img.shape
    assert np.array_equal(got_lab.cpu().numpy(), want_lab)
    diff = np.abs(got_img.cpu().numpy().astype(np.int16) - want_img)
    if "jitter" not in spec:
        assert diff.max() <= 1  # bilinear rounding only
    else:  # a one-level geometry difference can be stretched by contrast and moved by the HSV round trip
        assert np.mean(diff > 1) < 1e-3 and diff.max() <= 8


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", ["jitter=0.3:0.3:0.3", "jitter=0:0:0:0.1", "jitter=0.3:0.3:0.3:0.05"])
def test_colour_ops_alone_equal_the_cpu_path_exactly(data: tuple, device: str, spec: str) -> None:
    """No geometry: the same LUT, OpenCV 5's integer grey (15-bit) and its 8-bit HSV round trip (integer RGB2HSV,
    float32 HSV2RGB) give the same bytes as the CPU path."""
    images, labels = data
    aug = A.parse(spec)
    idx = np.arange(len(images))
    want, _ = aug(images, labels, idx, seed=1, epoch=0, ignore_index=IGNORE)
    got, _ = apply_batch(aug, torch.from_numpy(images).to(device), torch.from_numpy(labels).to(device), idx,
                         seed=1, epoch=0, ignore_index=IGNORE)
    assert np.array_equal(got.cpu().numpy(), want)


def test_uint16_labels_keep_their_dtype_and_ids(data: tuple) -> None:
    images, labels = data
    wide = labels.astype(np.uint16) * 1000
    aug = A.parse(GEOMETRY)
    idx = np.arange(4)
    _, want = aug(images[:4], wide[:4], idx, seed=1, epoch=0, ignore_index=65535)
    _, got = apply_batch(aug, torch.from_numpy(images[:4]), torch.from_numpy(wide[:4].astype(np.int32)), idx,
                         seed=1, epoch=0, ignore_index=65535)
    assert np.array_equal(got.numpy().astype(np.uint16), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_prefetcher_augments_as_iter_batches_does(split: Path, device: str, layout: str) -> None:
    aug = A.parse(GEOMETRY)
    loader = make_loader(split, shardkit.EpochPlan(8, shuffle=True, seed=4), layout=layout, with_indices=True)
    loader.sampler.set_epoch(3)
    pre = CudaPrefetcher(loader, device, augment=aug, normalize=False, labels="ids")
    ds = shardkit.open(split)
    for x, y, idx in pre:
        ids = idx.cpu().numpy()
        want_img, want_lab = aug(*ds.batch(ids), ids, seed=4, epoch=3, ignore_index=IGNORE)
        assert np.array_equal(y.cpu().numpy(), want_lab.astype(np.int64))
        got = x.cpu().numpy() if layout == "NHWC" else x.permute(0, 2, 3, 1).cpu().numpy()
        assert np.abs(got.astype(np.int16) - want_img).max() <= 1


def test_prefetcher_needs_indices_to_augment(split: Path) -> None:
    with pytest.raises(ConfigError, match="with_indices=True"):
        CudaPrefetcher(make_loader(split, 8), "cpu", augment=A.parse(GEOMETRY))


@pytest.mark.parametrize(("workers", "context"), [(0, None), (2, "fork"), (2, "spawn")])
def test_make_loader_augments_in_workers_the_same_for_any_worker_count(split: Path, workers: int,
                                                                       context: str | None) -> None:
    aug = A.parse(GEOMETRY + ",jitter=0.2")
    loader = make_loader(split, shardkit.EpochPlan(8, shuffle=True, seed=9), num_workers=workers,
                         multiprocessing_context=context, layout="NHWC", with_indices=True, augment=aug,
                         persistent_workers=False)
    ds = shardkit.open(split)
    for epoch in (0, 1):  # auto_epoch: the second pass draws epoch 1
        seen = 0
        for x, y, idx in loader:
            ids = idx.numpy()
            want_img, want_lab = aug(*ds.batch(ids), ids, seed=9, epoch=epoch, ignore_index=IGNORE)
            assert np.array_equal(x.numpy(), want_img) and np.array_equal(y.numpy(), want_lab)
            seen += len(ids)
        assert seen == len(ds)


def test_make_loader_refuses_augment_without_id_labels(split: Path) -> None:
    with pytest.raises(ConfigError, match="id labels"):
        make_loader(split, 8, options=shardkit.OpenOptions(labels="onehot"), augment=A.parse(GEOMETRY))


def test_upload_sends_every_array_through_one_buffer_unchanged() -> None:
    """A batch's parameters travel as one packed buffer (one copy, asynchronous on CUDA); each comes back with
    its dtype, shape and values, whatever the sizes and alignments around it."""
    from shardkit.augment.torch import upload

    rng = np.random.default_rng(3)
    arrays = [rng.random((5, 2, 3)), rng.integers(0, 256, (5, 256), dtype=np.uint8),
              np.array([True, False, True]), rng.random(7).astype(np.float32), np.zeros((0, 4), np.int64),
              rng.integers(-(2**40), 2**40, (5, 3, 4)), np.array([-3, 0, 179], np.int32)]
    got = upload(arrays, torch.device("cpu"))
    for a, t in zip(arrays, got, strict=True):
        assert t.dtype == torch.from_numpy(a).dtype and tuple(t.shape) == a.shape
        assert np.array_equal(t.numpy(), a)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", ["crop=256x384", "crop=256x384,hflip", "crop=400x520,hflip", "hflip=1",
                                  "crop=100x700,hflip"])
def test_crops_pads_and_flips_are_copied_with_the_warps_bytes(data: tuple, spec: str, device: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches whose every sample is only cropped, padded and/or flipped are copied slice by slice (no warp runs):
    for many seeds the same bytes as this backend's warp (uint8 RGB, uint16 and int16 bands; labels with the ignore
    index in the padding), and as the numpy/OpenCV backend's (its own fast path). A seed whose drawn parameters
    are an earlier seed's (``hflip=1`` draws the same flip for every seed) is not checked again: every output here
    is a function of the images and those parameters."""
    import shardkit.augment.torch as backend
    from shardkit.augment.packing import pack

    images, labels = data[0][:3], data[1][:3]
    bands = [images, (images.astype(np.uint16) * 257)[..., [0, 1, 2, 0]],
             (images.astype(np.int16) * 200 - 25000)[..., :1].copy()]
    calls: list[str] = []
    real = backend.warp_images
    monkeypatch.setattr(backend, "warp_images", lambda *a: calls.append("warp") or real(*a))
    checked: set[bytes] = set()
    for seed in range(6):
        aug = A.parse(spec)
        kw = {"seed": seed, "epoch": seed % 3, "ignore_index": IGNORE}
        drawn = aug.params_batch([0, 1, 2], seed=seed, epoch=seed % 3, hws=[images.shape[1:3]] * 3, labels=None,
                                 ignore_index=IGNORE)
        key = b"".join(k.encode() + a.tobytes() for k, a in pack(aug, drawn).items())
        if key in checked:
            continue
        checked.add(key)
        for imgs in bands:
            src, lab = torch.from_numpy(imgs).to(device), torch.from_numpy(labels).to(device)
            calls.clear()
            fast = apply_batch(aug, src, lab, np.arange(3), **kw)
            assert not calls
            with monkeypatch.context() as off:
                off.setattr(backend, "integer_shift", lambda m: None)
                slow = apply_batch(aug, src, lab, np.arange(3), **kw)
            assert calls == ["warp"]
            for a, b in zip(fast, slow, strict=True):
                assert a.dtype == b.dtype and a.cpu().numpy().tobytes() == b.cpu().numpy().tobytes(), (seed, imgs.dtype)
            want_img, want_lab = aug(imgs, labels, np.arange(3), **kw)
            assert fast[0].cpu().numpy().tobytes() == want_img.tobytes()
            assert fast[1].cpu().numpy().tobytes() == want_lab.tobytes()
