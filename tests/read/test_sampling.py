"""Index order for training: pure functions, no data needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from shardkit.errors import ConfigError
from shardkit.read import sampling

SHARDS = [7, 2, 3, 4, 4, 6]  # 26 samples, uneven shards (like CamVid val at 7 per shard)


def test_same_seed_and_epoch_same_order_new_epoch_new_order() -> None:
    a = sampling.epoch_indices([100], shuffle=True, seed=3, epoch=1)
    assert np.array_equal(a, sampling.epoch_indices([100], shuffle=True, seed=3, epoch=1))
    assert not np.array_equal(a, sampling.epoch_indices([100], shuffle=True, seed=3, epoch=2))
    assert not np.array_equal(a, sampling.epoch_indices([100], shuffle=True, seed=4, epoch=1))
    assert sorted(a.tolist()) == list(range(100))
    assert np.array_equal(sampling.epoch_indices([5], shuffle=False, seed=3, epoch=1), np.arange(5))


def test_order_does_not_depend_on_the_process() -> None:
    """Another interpreter (other hash seed) computes the same orders: nothing but (seed, epoch) matters."""
    code = ("import json; from shardkit.read import sampling as s; "
            f"print(json.dumps([s.epoch_indices({SHARDS!r}, seed=9, epoch=4, rank=r, world_size=2, mode=m)"
            ".tolist() for m in ('global', 'buffer') for r in (0, 1)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "123"}).stdout
    here = [sampling.epoch_indices(SHARDS, seed=9, epoch=4, rank=r, world_size=2, mode=m).tolist()
            for m in ("global", "buffer") for r in (0, 1)]
    assert json.loads(out) == here


@pytest.mark.parametrize("mode", ["global", "buffer"])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 27, 30])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_get_equal_disjoint_shares(mode: str, world: int, drop_last: bool) -> None:
    n = sum(SHARDS)
    parts = [sampling.epoch_indices(SHARDS, seed=1, epoch=0, rank=r, world_size=world, drop_last=drop_last,
                                    mode=mode, buffer_size=5) for r in range(world)]
    sizes = {len(p) for p in parts}
    assert sizes == {sampling.per_rank(n, world, drop_last)}
    everything = np.concatenate(parts)
    if drop_last:
        assert len(set(everything.tolist())) == len(everything) == (n // world) * world  # disjoint
    else:
        assert set(everything.tolist()) == set(range(n))  # every sample, padding repeats only
        assert len(everything) - len(set(everything.tolist())) == len(everything) - n


def test_padding_wraps_around_like_distributed_sampler() -> None:
    order = np.arange(10)
    assert sampling.even_out(order, 4, drop_last=False).tolist() == [*range(10), 0, 1]
    assert sampling.even_out(order, 4, drop_last=True).tolist() == list(range(8))
    assert sampling.even_out(np.arange(2), 5, drop_last=False).tolist() == [0, 1, 0, 1, 0]
    r0 = sampling.epoch_indices([10], shuffle=False, rank=0, world_size=4)
    assert r0.tolist() == [0, 4, 8]  # interleaved, like torch's DistributedSampler


def test_buffer_mode_reads_whole_shards_in_a_contiguous_part_of_the_stream() -> None:
    for rank in range(2):
        idx = sampling.epoch_indices(SHARDS, seed=2, epoch=5, rank=rank, world_size=2, mode="buffer",
                                     buffer_size=4)
        ranges = sampling.stream_ranges(SHARDS, seed=2, epoch=5, rank=rank, world_size=2)
        starts = np.cumsum([0, *SHARDS])
        expanded = [int(starts[s]) + a + k for s, a, n in ranges for k in range(n)]
        assert sorted(idx.tolist()) == sorted(expanded)
        assert sum(n for _, _, n in ranges) == 13
        # whole shards, plus at most one partial shard at each end of the part
        partial = [r for r in ranges if r[2] != SHARDS[r[0]]]
        assert len(partial) <= 2
    plain = sampling.epoch_indices(SHARDS, shuffle=False, mode="buffer")
    assert plain.tolist() == list(range(26))


def test_buffer_shuffle_is_a_bounded_permutation() -> None:
    rng = np.random.default_rng(0)
    stream = np.arange(1000)
    out = sampling.buffer_shuffle(stream, 10, rng)
    assert sorted(out.tolist()) == stream.tolist() and not np.array_equal(out, stream)
    # an item can only leave the buffer after it entered: position >= index - buffer_size + 1
    pos = np.empty_like(out)
    pos[out] = np.arange(len(out))
    assert np.all(pos >= np.maximum(0, stream - 10 + 1))
    assert np.array_equal(sampling.buffer_shuffle(stream, 1, rng), stream)
    with pytest.raises(ConfigError):
        sampling.buffer_shuffle(stream, 0, rng)


def test_split_batches_sorted_and_drop_last() -> None:
    idx = np.array([9, 3, 7, 1, 8, 2, 0])
    assert [b.tolist() for b in sampling.split_batches(idx, 3)] == [[3, 7, 9], [1, 2, 8], [0]]
    assert [b.tolist() for b in sampling.split_batches(idx, 3, drop_last=True)] == [[3, 7, 9], [1, 2, 8]]
    assert sampling.split_batches(idx, 3, sort=False)[0].tolist() == [9, 3, 7]
    assert sampling.num_batches(7, 3, False) == 3 and sampling.num_batches(7, 3, True) == 2


def test_epoch_batch_sampler() -> None:
    s = sampling.EpochBatchSampler(SHARDS, 4, seed=0, rank=1, world_size=2)
    batches = list(s)
    assert len(batches) == len(s) == 4 and all(isinstance(i, int) for b in batches for i in b)
    assert batches == list(s)  # no auto epoch: same order again
    s.set_epoch(1)
    assert list(s) != batches
    auto = sampling.EpochBatchSampler(SHARDS, 4, auto_epoch=True)
    first, second = list(auto), list(auto)
    assert first != second and auto.epoch == 2
    other = sampling.EpochBatchSampler(SHARDS, 4, seed=0, rank=0, world_size=2)
    assert len(other) == len(s)


@pytest.mark.parametrize("kwargs", [{"rank": 2, "world_size": 2}, {"rank": -1}, {"world_size": 0},
                                    {"seed": -1}, {"mode": "random"}])
def test_bad_options_are_config_errors(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        sampling.epoch_indices(SHARDS, **kwargs)
    with pytest.raises(ConfigError):
        sampling.split_batches(np.arange(3), 0)
