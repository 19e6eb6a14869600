"""The reading contract: OpenOptions and EpochPlan validated once, taken by every PyTorch adapter, and the keywords
they replaced still working (with a DeprecationWarning) for one release. (TensorFlow and Keras: test_tf.py,
test_keras.py; a split on object storage through every adapter: tests/test_object_storage.py.)"""

from __future__ import annotations

import inspect
import pickle
from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit import EpochPlan, OpenOptions
from shardkit.errors import ConfigError

torch = pytest.importorskip("torch")

from shardkit.read.torch import BufferReuse, CudaPrefetcher, RingLoader, ShardkitTorchDataset, make_loader  # noqa: E402


@pytest.mark.parametrize(("fields", "match"), [
    ({"labels": "one-hot"}, "labels='one-hot'"),
    ({"label_layout": "NCHW"}, "channels_last or channels_first"),
    ({"cache_limit": "lots"}, "cache_limit"),
    ({"cache_limit": 0}, "positive"),
    ({"version": 0}, "publish number"),
    ({"storage_options": ["endpoint_url"]}, "mapping"),
])
def test_open_options_refuse_bad_values_on_construction(fields: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        OpenOptions(**fields)


@pytest.mark.parametrize(("fields", "match"), [
    ({"batch_size": 0}, "at least 1"),
    ({"batch_size": 2.5}, "not an integer"),
    ({"batch_size": 2, "rank": 2, "world_size": 2}, "rank 2"),
    ({"batch_size": 2, "seed": -1}, "non-negative"),
    ({"batch_size": 2, "shuffle_mode": "random"}, "shuffle_mode"),
    ({"batch_size": 2, "sampling": "balanced"}, "sampling"),
    ({"batch_size": 2, "buffer_size": 0}, "buffer_size"),
])
def test_epoch_plan_refuses_bad_values_on_construction(fields: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        EpochPlan(**fields)


def test_options_are_frozen_picklable_values_with_a_private_storage_options_copy() -> None:
    given = {"endpoint_url": "http://127.0.0.1:1"}
    opts = OpenOptions(labels="onehot", cache_limit="2GB", storage_options=given)
    given["endpoint_url"] = "changed"
    assert opts.storage_options == {"endpoint_url": "http://127.0.0.1:1"}
    with pytest.raises(AttributeError):
        opts.labels = "ids"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(opts)) == opts and hash(opts) == hash(opts.replace())
    plan = EpochPlan(8, seed=3)
    assert pickle.loads(pickle.dumps(plan)) == plan and plan.replace(epoch=2).epoch == 2
    assert EpochPlan.of(8) == EpochPlan(batch_size=8) and EpochPlan.of(plan) is plan
    assert EpochPlan.of(8, shuffle=False) == EpochPlan(8, shuffle=False)
    with pytest.raises(ConfigError, match="EpochPlan or a batch size"):
        EpochPlan.of("8")  # type: ignore[arg-type]


def test_make_loader_has_at_most_ten_parameters() -> None:
    assert len(inspect.signature(make_loader).parameters) <= 10


def _batches(loader) -> list[tuple[np.ndarray, ...]]:  # type: ignore[no-untyped-def]
    return [tuple(t.numpy().copy() for t in batch) for batch in loader]


def test_old_make_loader_keywords_warn_and_give_the_same_batches(camvid_val_npy: Path) -> None:
    new = make_loader(camvid_val_npy, EpochPlan(5, seed=3, drop_last=True, epoch=2),
                      options=OpenOptions(labels="onehot"), with_indices=True, pin_memory=False)
    with pytest.warns(DeprecationWarning) as caught:
        old = make_loader(camvid_val_npy, batch_size=5, seed=3, epoch=2, drop_last=True, labels="onehot",
                          with_indices=True, pin_memory=False)
    assert [str(w.message) for w in caught] == [
        "make_loader: batch_size=, seed=, epoch=, drop_last= are deprecated and will be removed in the next release; "
        "pass plan=shardkit.EpochPlan(…) instead",
        "make_loader: labels= is deprecated and will be removed in the next release; "
        "pass options=shardkit.OpenOptions(…) instead"]
    assert all(w.filename == __file__ for w in caught)  # the warning points at the caller's line
    got, want = _batches(old), _batches(new)
    assert len(got) == len(want) == 5 and got[0][1].shape == (5, 11, 360, 480)
    assert all(all(np.array_equal(a, b) for a, b in zip(g, w, strict=True)) for g, w in zip(got, want, strict=True))
    with pytest.warns(DeprecationWarning, match="shuffle="):  # the old third positional parameter
        ordered = make_loader(camvid_val_npy, 4, False, with_indices=True, pin_memory=False)  # type: ignore[arg-type]
    assert np.concatenate([b[2].numpy() for b in ordered]).tolist() == list(range(26))


def test_old_buffer_keywords_warn_and_still_set_the_ring(camvid_val_npy: Path) -> None:
    with pytest.warns(DeprecationWarning, match="keep="):
        old = make_loader(camvid_val_npy, 4, 1, reuse_buffers=True, keep=3, pin_memory=False,  # type: ignore[call-arg]
                          multiprocessing_context="fork")
    new = make_loader(camvid_val_npy, 4, 1, reuse_buffers=BufferReuse(keep=3), pin_memory=False,
                      multiprocessing_context="fork")
    assert isinstance(old, RingLoader) and isinstance(new, RingLoader) and old.keep == new.keep == 3
    assert len(old.ring.slots) == len(new.ring.slots)
    with pytest.warns(DeprecationWarning, match="shared_ring="):
        plain = make_loader(camvid_val_npy, 4, 1, reuse_buffers=True, shared_ring=False)  # type: ignore[call-arg]
    assert not isinstance(plain, RingLoader)


def test_unknown_keywords_and_a_missing_plan_are_type_errors(camvid_val_npy: Path) -> None:
    with pytest.raises(TypeError, match="'shufle'"):
        make_loader(camvid_val_npy, 4, shufle=False)
    with pytest.raises(TypeError, match="plan"):
        make_loader(camvid_val_npy)
    with pytest.raises(TypeError, match="two batch sizes"):
        make_loader(camvid_val_npy, 4, batch_size=8)
    with pytest.raises(TypeError, match="'label'"):
        ShardkitTorchDataset(camvid_val_npy, label="ids")
    with pytest.raises(TypeError, match="'sed'"):
        CudaPrefetcher([], "cpu", sed=1)


def test_torch_dataset_takes_open_options_and_its_old_keywords_warn(camvid_val_npy: Path) -> None:
    new = ShardkitTorchDataset(camvid_val_npy, options=OpenOptions(labels="float_onehot"), layout="NHWC")
    with pytest.warns(DeprecationWarning, match="labels="):
        old = ShardkitTorchDataset(camvid_val_npy, labels="float_onehot", layout="NHWC")
    assert torch.equal(old[[0, 3]][1], new[[0, 3]][1]) and new[[0, 3]][1].shape == (2, 360, 480, 11)
    nchw = ShardkitTorchDataset(camvid_val_npy, options=OpenOptions(labels="onehot"))
    assert nchw.dataset.channels_first and nchw[2][1].shape == (11, 360, 480)  # one-hot follows the layout
    for adapter in (ShardkitTorchDataset, lambda ds, options: make_loader(ds, 4, options=options)):
        with pytest.raises(ConfigError, match="open Dataset"):  # never silently ignored
            adapter(shardkit.open(camvid_val_npy), options=OpenOptions(labels="onehot"))
    with pytest.raises(ConfigError, match="not both"):
        shardkit.Dataset(camvid_val_npy, OpenOptions(), labels="onehot")


def test_prefetcher_takes_the_plan_seed_and_its_old_seed_keyword_warns(camvid_val_npy: Path) -> None:
    loader = make_loader(camvid_val_npy, EpochPlan(4, seed=5), pin_memory=False)
    assert CudaPrefetcher(loader, "cpu").seed == 5  # the loader's plan, by default
    assert CudaPrefetcher(loader, "cpu", plan=EpochPlan(4, seed=9)).seed == 9
    with pytest.warns(DeprecationWarning, match="seed="):
        assert CudaPrefetcher(loader, "cpu", seed=7).seed == 7
