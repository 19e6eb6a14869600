"""Hostile inputs to the readers: kept loader batches, HDF5 external storage and links, symlinked shards,
oversized or malformed manifest numbers, and CLI output on all of them (one line, no traceback)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit.config import ConvertConfig, ShardSize
from shardkit.pipeline import convert

CROP = (64, 96)


@pytest.fixture(scope="module")
def camvid_splits(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A few CamVid val samples as npy and hdf5 splits, 3 samples per shard."""
    out = tmp_path_factory.mktemp("hostile")
    splits = {}
    for fmt in ("npy", "hdf5"):
        convert(ConvertConfig(camvid_root, out / fmt, format=fmt, size=CROP, splits=("val",), workers=1,
                              quiet=True, shard_size=ShardSize(samples=3)))
        splits[fmt] = out / fmt / "val"
    return splits


@pytest.mark.parametrize("workers", [0, 2])
def test_kept_loader_batches_stay_valid(camvid_splits: dict[str, Path], workers: int) -> None:
    torch = pytest.importorskip("torch")
    from shardkit.read.torch import make_loader

    core = shardkit.open(camvid_splits["npy"])
    loader = make_loader(camvid_splits["npy"], 2, shuffle=True, num_workers=workers, layout="NHWC",
                         with_indices=True, pin_memory=False, multiprocessing_context="fork" if workers else None)
    batches = list(loader)
    assert sum(len(ix) for _, _, ix in batches) == len(core)
    for images, labels, idx in batches:
        want_images, want_labels = core.batch(idx.numpy())
        assert isinstance(images, torch.Tensor)
        assert np.array_equal(images.numpy(), want_images)
        assert np.array_equal(labels.numpy(), want_labels)
