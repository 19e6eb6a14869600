"""npy shards: plain ``np.load``-able arrays (fixed size) or flat arrays plus a shapes table (variable)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardkit.errors import ShardFormatError
from shardkit.files.splitfiles import ShardInfo
from shardkit.formats.base import SampleSpec
from shardkit.formats.npy import NpyReader

from .shards import STEM, samples, write_shard


def test_fixed_size_shards_are_the_arrays_np_save_writes(tmp_path: Path) -> None:
    spec = SampleSpec((4, 6), "index", 12, "<u2")
    data = samples(spec)
    write_shard("npy", tmp_path, spec, data)
    images = np.load(tmp_path / f"images-{STEM}.npy", allow_pickle=False)
    labels = np.load(tmp_path / f"labels-{STEM}.npy", allow_pickle=False)
    assert np.array_equal(images, np.stack([d[0] for d in data]))
    assert np.array_equal(labels, np.stack([d[1] for d in data])) and labels.dtype == np.dtype("<u2")


def test_fewer_samples_than_planned_rewrite_the_true_shape(tmp_path: Path) -> None:
    spec = SampleSpec((4, 6), "index", 12, "|u1")
    data = samples(spec, 3)
    reader = write_shard("npy", tmp_path, spec, data, planned=5)  # two were skipped
    assert np.load(tmp_path / f"images-{STEM}.npy").shape == (3, 4, 6, 3)
    assert all(np.array_equal(reader.read(k)[0], data[k][0]) for k in range(3))
    reader.verify_hashes()  # the manifest's sha256 is that of the rewritten file


def test_variable_size_shards_keep_a_shapes_table(tmp_path: Path) -> None:
    spec = SampleSpec(None, "onehot", 3, "|u1")
    data = samples(spec)
    write_shard("npy", tmp_path, spec, data)
    shapes = np.load(tmp_path / f"shapes-{STEM}.npy")
    assert shapes.dtype == np.dtype("<i8") and shapes.tolist() == [list(d[0].shape[:2]) for d in data]
    flat = np.load(tmp_path / f"images-{STEM}.npy")
    assert flat.ndim == 1 and flat.size == sum(d[0].size for d in data)


def test_a_shapes_table_that_disagrees_is_a_format_error(tmp_path: Path) -> None:
    spec = SampleSpec(None, "index", 12, "|u1")
    reader = write_shard("npy", tmp_path, spec, samples(spec))
    shapes = tmp_path / f"shapes-{STEM}.npy"
    table = np.load(shapes)
    table[0] = (9, 9)
    np.save(shapes, table)
    info = reader.shard
    files = tuple(f if f.name != shapes.name else type(f)(f.name, shapes.stat().st_size, f.sha256)
                  for f in info.files)
    with pytest.raises(ShardFormatError, match="disagree"):
        NpyReader(tmp_path, ShardInfo(0, info.num_samples, 0, files), spec, {}).read(0)
