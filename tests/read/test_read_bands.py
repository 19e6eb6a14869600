"""Readers return the stored type and band count: Dataset, torch (NCHW), tf.data (raw and in-graph 16-bit PNG)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

import shardkit
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
from shardkit.read.dataset import Dataset

RNG = np.random.default_rng(7)


def split(tmp_path: Path, fmt: str, codec: str, channels: int = 4) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path / "in"
    (root / "img").mkdir(parents=True, exist_ok=True)
    (root / "lab").mkdir(exist_ok=True)
    images = {}
    for k in range(5):
        img = RNG.integers(0, 65536, (12, 10, channels)).astype(np.uint16)
        images[f"s{k}"] = img
        np.save(root / "img" / f"s{k}.npy", img)
        cv2.imwrite(str(root / "lab" / f"s{k}.png"), RNG.integers(0, 3, (12, 10)).astype(np.uint8))
    out = tmp_path / f"out-{fmt}-{codec}"
    convert(ConvertConfig(root, out, format=fmt, image_codec=codec, size="12x10", images="img/{name}.npy",
                          labels="lab/{name}.png", num_classes=3, workers=1, shard_size=2, quiet=True))
    return next(p for p in out.iterdir() if p.is_dir()), images


def test_torch_gives_the_stored_uint16_bands(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from shardkit.read.torch import make_loader

    folder, images = split(tmp_path, "npy", "raw")
    ds = Dataset(folder)
    seen = 0
    for batch, _labels in make_loader(folder, shardkit.EpochPlan(2, shuffle=False)):
        assert batch.dtype == torch.uint16 and tuple(batch.shape[1:]) == (4, 12, 10)
        for im in batch:
            key = Path(ds.key(seen)).stem
            assert np.array_equal(im.numpy().transpose(1, 2, 0), images[key])
            seen += 1
    assert seen == 5


@pytest.mark.parametrize("codec", ["raw", "png"])
def test_tf_data_decodes_uint16_in_graph(tmp_path: Path, codec: str) -> None:
    tf = pytest.importorskip("tensorflow")
    from shardkit.read import tf as stf

    folder, images = split(tmp_path, "tfrecord", codec)
    got = {}
    for batch, _labels, keys in stf.dataset(folder, shardkit.EpochPlan(2, shuffle=False), with_keys=True):
        assert batch.dtype == tf.uint16 and tuple(batch.shape[1:]) == (12, 10, 4)
        for im, key in zip(batch.numpy(), keys.numpy(), strict=True):
            got[Path(key.decode()).stem] = im
    assert got.keys() == images.keys()
    assert all(np.array_equal(got[k], images[k]) for k in images)
