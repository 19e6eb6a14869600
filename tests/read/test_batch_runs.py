"""Batched npy reads gather row by row across many shards and with one np.take per long run: same bytes either way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.read.dataset import TAKE_RUN


@pytest.fixture(scope="module")
def split(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CamVid val (26 pairs) as npy in shards of up to 16 (cut by content): runs shorter and longer than TAKE_RUN."""
    out = tmp_path_factory.mktemp("runs")
    convert(ConvertConfig(camvid_root, out, size=(352, 480), splits=("val",), workers=1, quiet=True,
                          shard_size=ShardSize(samples=16)))
    return out / "val"


@pytest.mark.parametrize("labels", ["ids", "float_onehot"])
def test_batches_of_long_and_short_runs_equal_sample_reads(split: Path, labels: str) -> None:
    ds = shardkit.open(split, labels=labels)
    sizes = [s.num_samples for s in ds.manifest.shards]
    assert len(sizes) >= 2 and max(sizes) >= TAKE_RUN + 1, sizes
    images, lab = (np.stack(a) for a in zip(*(ds[i] for i in range(len(ds))), strict=True))
    rng = np.random.default_rng(3)
    orders = [np.arange(26),  # three long runs: np.take per shard
              np.sort(rng.choice(26, 12, replace=False)),  # short sorted runs: row copies
              rng.permutation(26)]
    first = int(np.argmax(sizes))
    start = sum(sizes[:first])  # a run of TAKE_RUN + 1 in the largest shard, then mixed and repeated indices
    orders.append(np.array([*range(start, start + TAKE_RUN + 1), 25, 0, 19, 9, 9, -1]))
    out = ds.empty_batch(26)
    for order in orders:
        got_images, got_labels = ds.batch(order, out=out)
        assert np.array_equal(got_images, images[order]) and np.array_equal(got_labels, lab[order])


def test_a_forked_or_unpickled_reader_maps_its_own_arrays(split: Path) -> None:
    import pickle

    ds = shardkit.open(split)
    first = ds.batch([0, 11, 21])
    clone = pickle.loads(pickle.dumps(ds))
    assert all(r._plain is None for r in clone.readers), "mapped arrays must not travel in a pickle"
    again = clone.batch([0, 11, 21])
    assert np.array_equal(first[0], again[0]) and np.array_equal(first[1], again[1])
