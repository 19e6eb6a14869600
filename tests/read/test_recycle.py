"""Recycled batch memory (shardkit.read.recycle): buffers come back only when freed; worker slots hand batches over
through /dev/shm and are reused once the consumer drops them."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle

import numpy as np
import pytest

from shardkit.read import recycle


def test_a_buffer_comes_back_only_when_its_last_view_is_freed() -> None:
    pool = recycle.BufferPool(keep=2)
    a = pool.take((4, 5), np.float32)
    a[:] = 1
    view = a[1:3]
    del a
    b = pool.take((4, 5), np.float32)  # the first is still viewed: a new buffer
    b[:] = 2
    assert np.all(view == 1)
    first = view.__array_interface__["data"][0] - 5 * 4
    assert not pool.free[((4, 5), "<f4")]  # nothing came back while viewed
    del view
    gc.collect()
    c = pool.take((4, 5), np.float32)  # the first buffer, back once its view went
    assert c.__array_interface__["data"][0] == first
    del b, c
    gc.collect()
    assert len(pool.free[((4, 5), "<f4")]) == 2
    pool.take((4, 5), np.float32), pool.take((4, 5), np.float32), pool.take((4, 5), np.float32)
    gc.collect()
    assert len(pool.free[((4, 5), "<f4")]) == 2  # at most keep free ones
    assert pickle.loads(pickle.dumps(pool)).free == {}


_SLOTS: list[recycle.SharedSlots] = []


def _keep(slots: recycle.SharedSlots) -> None:  # the pool's initializer: the worker's copy (as Keras's dataset's)
    _SLOTS.append(slots)


def _fill(value: int) -> recycle.Part:
    batch = _SLOTS[0].batch((((2, 3), "|u1"),))
    batch.arrays[0][:] = value
    return recycle.Part(batch, 0)


needs_shm = pytest.mark.skipif(not recycle.shm_available(), reason="no /dev/shm")


def _names(owner: int) -> list[str]:
    return sorted(p.name.split("-", 4)[4] for p in recycle.SHM.glob(f"shardkit-batch-{owner}-*"))


@needs_shm
def test_slots_are_reused_once_the_consumer_drops_their_batch_also_by_the_next_pool() -> None:
    owner = os.getpid()
    slots = recycle.SharedSlots(owner, cap=2)
    try:
        with multiprocessing.get_context("spawn").Pool(1, _keep, (slots,)) as pool:
            first = pool.apply(_fill, (1,))  # unpickled here: an array over slot 0
            second = pool.apply(_fill, (2,))  # slot 0 is held: slot 1
            third = pool.apply(_fill, (3,))  # both held: a file of its own, removed as it is attached
            assert [int(a[0, 0]) for a in (first, second, third)] == [1, 2, 3]
            assert _names(owner) == ["slot0-64", "slot1-64", "state"]
            del second
            gc.collect()
            fourth = pool.apply(_fill, (4,))  # slot 1 is free again
            assert [int(a[0, 0]) for a in (first, third, fourth)] == [1, 3, 4]
            del fourth
            gc.collect()
            pool.apply(_fill, (5,))  # the next batch claims slot 1, but the consumer never takes it:
            pool.apply_async(_fill, (6,))  # (a result dropped, as a stopped pool's)
        with multiprocessing.get_context("spawn").Pool(1, _keep, (slots,)) as pool:  # the next epoch's pool
            slots.reclaim()  # the first worker is gone: its slot that never reached us is free again
            seventh = pool.apply(_fill, (7,))
            assert int(seventh[0, 0]) == 7 and int(first[0, 0]) == 1  # slot 1 reused; slot 0 still held
            assert _names(owner) == ["slot0-64", "slot1-64", "state"]  # no new files
    finally:
        recycle.sweep(owner)
    assert not _names(owner)


@needs_shm
def test_a_removed_hand_over_file_attaches_as_nothing() -> None:
    batch = recycle.SharedSlots(os.getpid(), cap=0).batch((((3,), "<f4"),))  # no slots: a file of its own
    data = pickle.dumps(batch)
    batch.path.unlink()
    assert pickle.loads(data) == [None]
    recycle.sweep(os.getpid())
