"""tf.data on converted real data: TFRecord parsed by TensorFlow (batched before parsing), other formats
through the core reader. TensorFlow is imported before anything here converts (the ``tfrecord``
package must never share its process)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert

CROP = (352, 480)


@pytest.fixture(scope="module")
def splits(tf, camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """CamVid val: TFRecord (index labels), gzipped TFRecord (packed labels), npy; 7 samples per shard."""
    out = tmp_path_factory.mktemp("tfdata")
    variants = {"tfrecord": ("tfrecord", "index", "none", "raw"), "tfrecord-gz": ("tfrecord", "packed", "gzip", "raw"),
                "npy": ("npy", "index", "none", "raw"), "tfrecord-png": ("tfrecord", "onehot", "gzip", "png")}
    for name, (fmt, enc, comp, image_codec) in variants.items():
        convert(ConvertConfig(camvid_root, out / name, format=fmt, size=CROP, splits=("val",), workers=2,
                              quiet=True, label_encoding=enc, compression=comp, image_codec=image_codec,
                              shard_size=ShardSize(samples=7)))
    assert "tfrecord" not in sys.modules
    return {name: out / name / "val" for name in variants}


def _check_epochs(data, core, epochs: int = 2) -> list[list[int]]:
    """Iterate ``epochs`` times; every sample once per pass, bit-exact against the core reader."""
    index = {core.key(i): i for i in range(len(core))}
    orders = []
    for _ in range(epochs):
        order = []
        for images, labels, keys in data:
            idx = np.array([index[k.decode()] for k in keys.numpy()])
            want_images, want_labels = core.batch(idx)
            assert images.dtype.name == "uint8" and np.array_equal(images.numpy(), want_images)
            assert labels.dtype.as_numpy_dtype == want_labels.dtype
            assert np.array_equal(labels.numpy(), want_labels)
            order.extend(idx.tolist())
        assert sorted(order) == list(range(len(core))), "every sample exactly once per pass"
        orders.append(order)
    return orders


@pytest.mark.parametrize("name", ["tfrecord", "tfrecord-gz"])
@pytest.mark.parametrize("labels", ["ids", "onehot", "float_onehot"])
def test_tfrecord_pipeline_every_sample_once_bit_exact(tf, splits: dict[str, Path], name: str,
                                                       labels: str) -> None:
    import shardkit.tf

    core = shardkit.open(splits["npy"], labels=labels)
    data = shardkit.tf.dataset(splits[name], shardkit.EpochPlan(4, seed=2), options=shardkit.OpenOptions(labels=labels),
                               with_keys=True)
    spec = data.element_spec
    assert spec[0].shape.as_list() == [None, *CROP, 3]
    assert spec[1].shape.as_list()[1:] == ([*CROP] if labels == "ids" else [*CROP, 11])  # no ignore channel
    orders = _check_epochs(data, core)
    assert orders[0] != orders[1]  # reshuffled each pass
    assert "tfrecord" not in sys.modules


def test_tfrecord_parses_whole_batches(tf, splits: dict[str, Path]) -> None:
    """The parse runs once per batch: the graph maps batched serialized strings, not single records."""
    from shardkit.read.tf import dataset

    data = dataset(splits["tfrecord"], shardkit.EpochPlan(8, shuffle=False, drop_last=True))
    assert data.element_spec[0].shape.as_list() == [8, *CROP, 3]
    core = shardkit.open(splits["tfrecord"])
    images, labels = next(iter(data))
    want_images, want_labels = core.batch(range(8))
    assert np.array_equal(images.numpy(), want_images) and np.array_equal(labels.numpy(), want_labels)
    assert sum(1 for _ in data) == 3  # 26 // 8, tail dropped


def test_other_formats_go_through_the_core_reader(tf, splits: dict[str, Path]) -> None:
    import shardkit.tf

    core = shardkit.open(splits["npy"])
    data = shardkit.tf.dataset(splits["npy"], shardkit.EpochPlan(5, seed=4), with_keys=True)
    orders = _check_epochs(data, core)
    assert orders[0] != orders[1]  # each pass is the next epoch
    first = [i for idx, _, _ in core.iter_batches(5, seed=4, epoch=0, with_indices=True) for i in idx]
    assert orders[0] == first  # the same order as the core reader's epoch 0


@pytest.mark.parametrize("name", ["tfrecord", "npy"])
def test_two_ranks_get_equal_disjoint_shares(tf, splits: dict[str, Path], name: str) -> None:
    import shardkit.tf

    core = shardkit.open(splits["npy"])
    index = {core.key(i): i for i in range(len(core))}
    shares = []
    for rank in range(2):
        data = shardkit.tf.dataset(splits[name], shardkit.EpochPlan(4, seed=8, epoch=3, rank=rank, world_size=2),
                                   with_keys=True)
        shares.append([index[k.decode()] for _, _, keys in data for k in keys.numpy()])
    assert len(shares[0]) == len(shares[1]) == 13
    assert not set(shares[0]) & set(shares[1]) and set(shares[0]) | set(shares[1]) == set(range(26))


def test_normalize(tf, splits: dict[str, Path]) -> None:
    import shardkit.tf

    core = shardkit.open(splits["tfrecord"])
    plan = shardkit.EpochPlan(3, shuffle=False)
    images, _ = next(iter(shardkit.tf.dataset(splits["tfrecord"], plan, normalize=True)))
    assert images.dtype == tf.float32
    np.testing.assert_allclose(images.numpy(), core.normalize(core.batch([0, 1, 2])[0]), rtol=1e-5, atol=1e-5)


def test_png_tfrecord_is_decoded_in_graph(tf, splits: dict[str, Path]) -> None:
    """Format version 2: tf.io.decode_png inside the pipeline gives the core reader's images, bit-exact."""
    from shardkit.tf import dataset

    core = shardkit.open(splits["tfrecord-png"], labels="ids")
    assert core.manifest.format_version == 2
    data = dataset(splits["tfrecord-png"], shardkit.EpochPlan(4, shuffle=True, seed=3),
                   options=shardkit.OpenOptions(labels="ids"), with_keys=True)
    _check_epochs(data, core, epochs=1)


def test_old_keywords_warn_and_give_the_same_batches(tf, splits: dict[str, Path]) -> None:
    import shardkit.tf

    core = shardkit.open(splits["npy"], labels="onehot")
    new = shardkit.tf.dataset(splits["npy"], shardkit.EpochPlan(4, seed=2, epoch=1),
                              options=shardkit.OpenOptions(labels="onehot"), with_keys=True)
    with pytest.warns(DeprecationWarning) as caught:
        old = shardkit.tf.dataset(splits["npy"], 4, seed=2, epoch=1, labels="onehot", with_keys=True)
    assert [str(w.message).split(" are ")[0].split(" is ")[0] for w in caught] == ["dataset: seed=, epoch=",
                                                                                  "dataset: labels="]
    first = _check_epochs(new, core, 1)  # (a second pass over new would be the next epoch)
    assert _check_epochs(old, core, 1) == first
    with pytest.warns(DeprecationWarning, match="batch_size="):
        sized = shardkit.tf.dataset(splits["npy"], batch_size=4, seed=2, epoch=1, with_keys=True)
    assert _check_epochs(sized, shardkit.open(splits["npy"]), 1) == first


def test_a_global_shuffle_plan_reads_a_tfrecord_split_in_the_samplers_order(tf, splits: dict[str, Path]) -> None:
    """shuffle_mode='global' (not tf.data's shard-then-buffer shuffle): the core sampler's one global order."""
    import shardkit.tf

    core = shardkit.open(splits["tfrecord"])
    plan = shardkit.EpochPlan(5, seed=6, shuffle_mode="global")
    order = _check_epochs(shardkit.tf.dataset(splits["tfrecord"], plan, with_keys=True), core, 1)[0]
    assert order == np.concatenate(core.sampler(plan).batches()).tolist()


def test_tf_dataset_resumes_from_its_state(tf, splits: dict[str, Path]) -> None:
    """shardkit.tf.dataset stopped after 3 batches (the steps a training loop took; tf.data read ahead) and a new
    one resumed from the state: the rest of the epoch and the next epoch equal the uninterrupted run's bytes,
    augmented in TensorFlow ops. A TFRecord split that tf.data reads itself keeps no state: one line saying so."""
    from shardkit.errors import ConfigError

    plan = shardkit.EpochPlan(4, seed=6)
    aug = "hflip,jitter=0.2"

    def passes(data, n: int) -> list[bytes]:
        return [b"".join(t.numpy().tobytes() for t in batch) for _ in range(n) for batch in data]

    want = passes(shardkit.tf.dataset(splits["npy"], plan, augment=aug), 2)
    first = shardkit.tf.dataset(splits["npy"], plan, augment=aug)
    got = []
    for batch in first:
        got.append(b"".join(t.numpy().tobytes() for t in batch))
        if len(got) == 3:
            break
    state = first.state_dict(batches=3)
    assert (state["epoch"], state["consumed"]) == (0, 12)
    again = shardkit.tf.dataset(splits["npy"], plan, augment=aug)
    again.load_state_dict(state)
    assert got + passes(again, 2) == want
    assert again.state_dict()["epoch"] == 2
    tfr = shardkit.tf.dataset(splits["tfrecord"], plan)
    with pytest.raises(ConfigError, match="keeps no loader state") as err:
        tfr.load_state_dict(state)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("normalize", [False, True])
def test_parallel_reads_keep_the_order_and_kept_batches_stay(tf, splits: dict[str, Path], normalize: bool) -> None:
    """A random-access split is read by tf.data's parallel map into recycled memory: the batches come in the
    sampler's order, equal to the core reader's (normalised by the same float32 operations as
    ``Dataset.normalize``), and every tensor kept over two passes still holds what it held when it came."""
    import shardkit.tf

    core = shardkit.open(splits["npy"])
    plan = shardkit.EpochPlan(3, seed=6)
    data = shardkit.tf.dataset(splits["npy"], plan, normalize=normalize)
    kept, copies = [], []
    for _ in range(2):
        for images, labels in data:
            kept.append((images, labels))
            copies.append((images.numpy().copy(), labels.numpy().copy()))
    want = [core.batch(idx) for epoch in (0, 1) for idx, _, _ in
            core.iter_batches(3, seed=6, epoch=epoch, with_indices=True)]
    assert len(kept) == len(want) == 2 * 9
    for (images, labels), (ci, cl), (wi, wl) in zip(kept, copies, want, strict=True):
        assert np.array_equal(images.numpy(), ci) and np.array_equal(labels.numpy(), cl)
        assert np.array_equal(cl, wl)
        assert np.array_equal(ci, core.normalize(wi) if normalize else wi)
        assert images.dtype == (tf.float32 if normalize else tf.uint8)


def test_random_access_batches_are_read_concurrently(tf, splits: dict[str, Path]) -> None:
    """tf.data's threads read several batches at once (each read copies out of memory maps without the GIL);
    the generator only hands out each batch's indices."""
    import threading
    import time

    import shardkit.tf

    ds = shardkit.open(splits["npy"])
    lock, running, most = threading.Lock(), [0], [0]
    read = ds.batch

    def slow_batch(*args, **kwargs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)  # a slow disk: overlapping reads show
        try:
            return read(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    ds.batch = slow_batch
    batches = list(shardkit.tf.dataset(ds, shardkit.EpochPlan(2, seed=1)))
    assert len(batches) == 13 and most[0] >= 2
