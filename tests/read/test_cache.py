"""The shard cache as a byte source's store: holds that pin, read-through slots that close their holds (a
``file://`` URL stands in for object storage: the same fsspec path as ``s3://``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit.read.cache import _remove_unpinned


def test_a_dropped_read_through_slot_closes_its_hold_and_the_shard_is_fetched_again(
        camvid_val_npy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDKIT_READ_THROUGH", "1")  # one read-through slot: the next shard drops the last one
    ds = shardkit.open(f"file://{camvid_val_npy}", cache_dir=tmp_path / "c", cache_limit=1, remote_reads="shards")
    ref = shardkit.open(camvid_val_npy)
    assert ds.cache is not None and len(ds.shard_sizes) > 1
    first = ds.source._shards[0]  # type: ignore[attr-defined]
    assert np.array_equal(ds[0][0], ref[0][0])
    held = first._held
    assert held is not None and held.open and first.resident() and ds.cache.downloads == 1
    last = len(ds) - 1
    assert np.array_equal(ds[last][1], ref[last][1])  # the last shard read through: shard 0's slot is dropped
    assert not held.open and held.kept is None and not first.resident()  # the cache closed the hold it gave
    assert not held.folder.exists()
    assert np.array_equal(ds[0][0], ref[0][0]) and ds.cache.downloads == 3  # fetched again on its next read
    ds.close()
    assert not [p for p in ds.cache.directory.iterdir() if p.name.startswith(".transient-")]


def test_a_cached_shard_stays_pinned_while_its_reader_holds_it(camvid_val_npy: Path, tmp_path: Path) -> None:
    ds = shardkit.open(f"file://{camvid_val_npy}", cache_dir=tmp_path / "c", remote_reads="shards")
    assert ds.cache is not None
    ds[0]
    name = ds.manifest.shards[0].files[0].name
    assert not _remove_unpinned(ds.cache.directory / name)  # another job's eviction cannot take it
    ds.close()  # the pins go with the reader's hold
    assert _remove_unpinned(ds.cache.directory / name)
