"""Batches read from storage are hinted sample by sample; batches from the page cache are not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit.formats.mapping import MappedArray
from shardkit.read import residency
from shardkit.read.residency import StorageReads


def test_a_batch_is_hinted_when_the_previous_one_read_from_storage(monkeypatch) -> None:
    blocks = iter([10, 10, 10, 18, 18, 18, 18])
    monkeypatch.setattr(residency, "blocks_read", lambda: next(blocks))
    reads = StorageReads()
    assert reads.begin() is True  # nothing known: the first batch is hinted
    reads.end()  # read nothing from storage (10 -> 10)
    assert reads.begin() is False
    reads.end()  # 10 -> 18: it did
    assert reads.begin() is True
    reads.end()
    assert reads.begin() is False


def test_the_real_counter_moves_only_with_storage_reads() -> None:
    before = residency.blocks_read()
    assert before >= 0 and residency.blocks_read() - before >= 0


@pytest.fixture()
def advice(monkeypatch) -> list[tuple[int, int, int]]:
    calls: list[tuple[int, int, int]] = []
    real = MappedArray._advise
    monkeypatch.setattr(MappedArray, "_advise", lambda self, *a: (calls.append(a), real(self, *a)))
    return calls


def test_cold_batches_ask_for_exactly_their_samples_and_warm_ones_for_nothing(
        camvid_val_npy: Path, advice: list, monkeypatch) -> None:
    import mmap

    counter = iter(range(0, 10**6, 7))  # every batch "reads from storage" until switched
    monkeypatch.setattr(residency, "blocks_read", lambda: next(counter))
    ds = shardkit.open(camvid_val_npy)
    starts = [r.shard.first_index for r in ds.readers]
    assert len(starts) >= 2 and starts[1] >= 4
    plain = [r.fixed_arrays() for r in ds.readers]
    idx = np.array([1, 2, 3, starts[1], starts[1] + 2])  # a run of three in shard 0, two apart in shard 1
    images, labels = ds.batch(idx)
    row_i, row_l = 360 * 480 * 3, 360 * 480
    willneed = [(s, n) for a, s, n in advice if a == mmap.MADV_WILLNEED]
    assert any(a == mmap.MADV_RANDOM for a, _, _ in advice)
    # one range per array for the run in shard 0, one per sample in shard 1; each range starts at the
    # page holding the sample's first byte
    want = sorted([3 * row_i, 3 * row_l, row_i, row_i, row_l, row_l])
    got = sorted(n for _, n in willneed)
    assert len(got) == 6 and all(w <= g < w + mmap.PAGESIZE for g, w in zip(got, want, strict=True))

    def row(i: int, k: int) -> np.ndarray:
        s = max(j for j, first in enumerate(starts) if first <= i)
        return plain[s][k][i - starts[s]]

    expect_i = np.stack([row(int(i), 0) for i in idx])
    expect_l = np.stack([row(int(i), 1) for i in idx])
    assert np.array_equal(images, expect_i) and np.array_equal(labels, expect_l)

    monkeypatch.setattr(residency, "blocks_read", lambda: 5)  # from now on everything is cached
    ds.batch(idx)  # the previous batch read from storage: still hinted, and it reads nothing
    advice.clear()
    images, labels = ds.batch(idx)
    assert not advice  # cached: no per-sample hints
    assert np.array_equal(images, expect_i) and np.array_equal(labels, expect_l)
