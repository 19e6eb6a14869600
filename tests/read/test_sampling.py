"""Index order for training: pure functions, no data needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardkit.errors import ConfigError
from shardkit.read import sampling
from shardkit.read.sampling import EpochPlan

SHARDS = [7, 2, 3, 4, 4, 6]  # 26 samples, uneven shards (like CamVid val at 7 per shard)


def plan(batch_size: int = 1, mode: str = "global", **fields: Any) -> EpochPlan:
    """An epoch plan with its shuffle mode resolved, as a sampler holds it."""
    return EpochPlan(batch_size, shuffle_mode=mode, **fields)


def test_same_seed_and_epoch_same_order_new_epoch_new_order() -> None:
    a = sampling.epoch_indices([100], plan(shuffle=True, seed=3, epoch=1))
    assert np.array_equal(a, sampling.epoch_indices([100], plan(shuffle=True, seed=3, epoch=1)))
    assert not np.array_equal(a, sampling.epoch_indices([100], plan(shuffle=True, seed=3, epoch=2)))
    assert not np.array_equal(a, sampling.epoch_indices([100], plan(shuffle=True, seed=4, epoch=1)))
    assert sorted(a.tolist()) == list(range(100))
    assert np.array_equal(sampling.epoch_indices([5], plan(shuffle=False, seed=3, epoch=1)), np.arange(5))


def test_order_does_not_depend_on_the_process() -> None:
    """Another interpreter (other hash seed) computes the same orders: nothing but (seed, epoch) matters."""
    code = ("import json; from shardkit.read import sampling as s; "
            f"print(json.dumps([s.epoch_indices({SHARDS!r}, s.EpochPlan(1, seed=9, epoch=4, rank=r, world_size=2, "
            "shuffle_mode=m)).tolist() for m in ('global', 'buffer') for r in (0, 1)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "123"}).stdout
    here = [sampling.epoch_indices(SHARDS, plan(seed=9, epoch=4, rank=r, world_size=2, mode=m)).tolist()
            for m in ("global", "buffer") for r in (0, 1)]
    assert json.loads(out) == here


@pytest.mark.parametrize("mode", ["global", "buffer"])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 27, 30])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_get_equal_disjoint_shares(mode: str, world: int, drop_last: bool) -> None:
    n = sum(SHARDS)
    parts = [sampling.epoch_indices(SHARDS, plan(seed=1, epoch=0, rank=r, world_size=world, drop_last=drop_last,
                                                 mode=mode, buffer_size=5)) for r in range(world)]
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
    r0 = sampling.epoch_indices([10], plan(shuffle=False, rank=0, world_size=4))
    assert r0.tolist() == [0, 4, 8]  # interleaved, like torch's DistributedSampler


def test_buffer_mode_reads_whole_shards_in_a_contiguous_part_of_the_stream() -> None:
    for rank in range(2):
        idx = sampling.epoch_indices(SHARDS, plan(seed=2, epoch=5, rank=rank, world_size=2, mode="buffer",
                                                  buffer_size=4))
        ranges = sampling.stream_ranges(SHARDS, plan(seed=2, epoch=5, rank=rank, world_size=2))
        starts = np.cumsum([0, *SHARDS])
        expanded = [int(starts[s]) + a + k for s, a, n in ranges for k in range(n)]
        assert sorted(idx.tolist()) == sorted(expanded)
        assert sum(n for _, _, n in ranges) == 13
        # whole shards, plus at most one partial shard at each end of the part
        partial = [r for r in ranges if r[2] != SHARDS[r[0]]]
        assert len(partial) <= 2
    plain = sampling.epoch_indices(SHARDS, plan(shuffle=False, mode="buffer"))
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
    s = sampling.EpochBatchSampler(SHARDS, plan(4, seed=0, rank=1, world_size=2))
    batches = list(s)
    assert len(batches) == len(s) == 4 and all(isinstance(i, int) for b in batches for i in b)
    assert batches == list(s)  # no auto epoch: same order again
    s.set_epoch(1)
    assert list(s) != batches
    auto = sampling.EpochBatchSampler(SHARDS, plan(4), auto_epoch=True)
    first, second = list(auto), list(auto)
    assert first != second and auto.epoch == 2
    other = sampling.EpochBatchSampler(SHARDS, plan(4, seed=0, rank=0, world_size=2))
    assert len(other) == len(s)
    assert auto.plan.epoch == 2 and s.plan == plan(4, seed=0, rank=1, world_size=2, epoch=1)  # the one plan it holds


def test_a_sampler_takes_a_resolved_plan_and_names_its_old_fields_as_deprecated() -> None:
    """The sampler reads its plan's fields; ``auto`` (resolved by the format in Dataset.sampler) is refused, and
    the fields it had before it held the plan still read, with a DeprecationWarning naming ``sampler.plan``."""
    with pytest.raises(ConfigError, match="shuffle mode 'auto' is not one of global, buffer"):
        sampling.EpochBatchSampler(SHARDS, EpochPlan(4))
    s = sampling.EpochBatchSampler(SHARDS, plan(4, seed=7, mode="buffer"))
    with pytest.warns(DeprecationWarning, match=r"sampler\.plan\.shuffle_mode"):
        assert s.mode == "buffer"
    with pytest.warns(DeprecationWarning, match=r"sampler\.plan\.seed"):
        assert s.seed == 7
    with pytest.raises(AttributeError):
        _ = s.nothing


@pytest.mark.parametrize("kwargs", [{"rank": 2, "world_size": 2}, {"rank": -1}, {"world_size": 0},
                                    {"seed": -1}, {"mode": "random"}, {"mode": "auto"}])
def test_bad_options_are_config_errors(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        sampling.epoch_indices(SHARDS, plan(**kwargs))
    with pytest.raises(ConfigError):
        sampling.split_batches(np.arange(3), 0)


# --------------------------------------------------------------------------- rare-class sampling


def test_repeated_indices_round_each_factor_up_or_down_and_keep_the_length() -> None:
    r = np.array([1.0, 2.5, 0.2, 1.3, 4.0, 0.0])
    length = sampling.epoch_length(r)
    assert length == 9
    want = r * length / r.sum()
    for epoch in range(50):
        drawn = sampling.repeated_indices(r, sampling.epoch_rng(0, epoch))
        counts = np.bincount(drawn, minlength=len(r))
        assert len(drawn) == length
        assert ((counts == np.floor(want)) | (counts == np.ceil(want))).all(), counts


def test_rare_class_factors_follow_daformer() -> None:
    """P(c) = softmax((1 - f(c)) / T); r(i) = n * sum over its classes of P(c) / N(c); sum r = n."""
    presence = np.array([[1, 1, 0], [1, 0, 0], [1, 0, 1], [1, 1, 1]], bool)
    pixels = np.array([900, 90, 10])
    per_class = sampling.rare_class_factors(pixels, presence.sum(0), len(presence), 0.1)
    f = pixels / pixels.sum()
    p = np.exp((1 - f) / 0.1) / np.exp((1 - f) / 0.1).sum()
    np.testing.assert_allclose(per_class, 4 * p / presence.sum(0))
    r = sampling.sample_repeat_factors(presence, per_class, "sum")
    assert r.sum() == pytest.approx(4.0)
    assert r[3] > r[2] > r[0] > r[1]  # the sample holding both rarer classes most, the common-only one least


def test_lvis_factors() -> None:
    per_class = sampling.class_repeat_factors(np.array([10, 1, 0]), 10, 0.4)
    np.testing.assert_allclose(per_class, [1.0, 2.0, 1.0])  # sqrt(0.4 / 0.1) = 2; absent: 1
    presence = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 0]], bool)
    np.testing.assert_allclose(sampling.sample_repeat_factors(presence, per_class, "max"), [1, 2, 1])


@pytest.mark.parametrize("text", ["balanced", "uniform:1", "class-balanced:x", "class-balanced:0",
                                  "repeat-factor:2"])
def test_bad_sampling_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError):
        sampling.parse_sampling(text)


@pytest.fixture(scope="module")
def camvid_train_npy(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CamVid train (123 pairs; Fence in 58 of them, Bicyclist in 66: rare per image, unlike val where every
    image holds every class) as npy shards at its own 360x480."""
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert

    out = tmp_path_factory.mktemp("camvid-train-npy")
    convert(ConvertConfig(camvid_root, out, format="npy", splits=("train",), workers=2, quiet=True,
                          shard_size=ShardSize(samples=50)))
    return out / "train"


def _rcs_factors_from_label_files(root: Path, keys: list[str], temperature: float) -> np.ndarray:
    """DAFormer's rare class sampling written out from the CamVid label PNGs (PIL), not from shardkit."""
    from PIL import Image

    labels = [np.asarray(Image.open(root / k.replace("train/", "trainannot/", 1))) for k in keys]
    counts = np.stack([np.bincount(ids.ravel(), minlength=12)[:12] for ids in labels])
    counts[:, 11] = 0  # the ignore class (11) never counts
    present = counts > 0
    f = counts.sum(0) / counts.sum()
    held = present.sum(0)
    ok = held > 0
    p = np.zeros(12)
    p[ok] = np.exp((1 - f[ok]) / temperature) / np.exp((1 - f[ok]) / temperature).sum()
    per_sample = np.zeros(12)
    per_sample[ok] = p[ok] / held[ok]
    return len(keys) * (present * per_sample).sum(1)


@pytest.mark.parametrize("temperature", [0.01, 0.1])
def test_class_balanced_frequencies_follow_the_formula_over_epochs_and_ranks(camvid_root: Path,
                                                                            camvid_train_npy: Path,
                                                                            temperature: float) -> None:
    """Over 300 epochs, 3 ranks: every rank gets the same count each epoch, and each sample's mean count per epoch
    converges to r(i) L / sum r computed from the label files."""
    import shardkit

    ds = shardkit.open(camvid_train_npy)
    keys = [ds.key(i) for i in range(len(ds))]
    r = _rcs_factors_from_label_files(camvid_root, keys, temperature)
    spec = f"class-balanced:{temperature}"
    np.testing.assert_allclose(ds.repeat_factors(spec), r, rtol=1e-9)
    length = sampling.epoch_length(r)
    want = r * length / r.sum()
    world, epochs = 3, 300
    counts = np.zeros(len(ds))
    for epoch in range(epochs):
        parts = [ds.sampler(4, sampling=spec, seed=5, epoch=epoch, rank=k, world_size=world).indices()
                 for k in range(world)]
        assert len({len(p) for p in parts}) == 1 and len(parts[0]) == -(-length // world)
        drawn = np.concatenate(parts)
        counts += np.bincount(drawn, minlength=len(ds))
    padding = world * len(parts[0]) - length  # wrap-around padding: at most world - 1 extra per epoch
    assert 0 <= padding < world
    mean = counts / epochs
    # systematic sampling: each count is floor or ceil of want, so the mean is within the padding of want
    np.testing.assert_allclose(mean, want, atol=0.1)
    assert mean[np.argmax(r)] > 1.5 * mean[np.argmin(r)]


def test_class_balanced_is_deterministic_per_seed_and_epoch(camvid_val_npy: Path) -> None:
    import shardkit

    ds = shardkit.open(camvid_val_npy)

    def order(seed: int, epoch: int) -> list[int]:
        return ds.sampler(4, sampling="class-balanced", seed=seed, epoch=epoch).indices().tolist()

    assert order(1, 2) == order(1, 2) and order(1, 2) != order(1, 3) and order(1, 2) != order(2, 2)
    assert len(order(1, 2)) == len(order(1, 3))


def test_without_a_bitmap_class_balanced_sampling_is_one_clear_error(camvid_val_npy: Path) -> None:
    import shardkit
    from shardkit.store.stats import ClassFrequencies

    ds = shardkit.open(camvid_val_npy)
    ds._freqs = ClassFrequencies(np.ones(300, np.int64), len(ds))  # what a split of 300 classes keeps
    with pytest.raises(ConfigError, match="needs the per-sample class bitmap") as err:
        next(ds.iter_batches(4, sampling="class-balanced"))
    assert "\n" not in str(err.value)


def test_every_adapter_takes_the_class_balanced_sampler(camvid_train_npy: Path) -> None:
    """iter_batches, make_loader, the Keras PyDataset and tf.data read the sampler's indices."""
    import shardkit
    from shardkit.read.torch import make_loader

    ds = shardkit.open(camvid_train_npy)
    want = ds.sampler(4, sampling="class-balanced", seed=3, epoch=1).indices()
    assert sorted(want.tolist()) != list(range(len(ds))), "rare-class sampling repeats some samples, drops others"
    got = np.concatenate([idx for idx, _, _ in ds.iter_batches(4, seed=3, epoch=1, sampling="class-balanced",
                                                                with_indices=True)])
    assert sorted(got.tolist()) == sorted(want.tolist())
    loader = make_loader(ds, shardkit.EpochPlan(4, seed=3, epoch=1, sampling="class-balanced"), with_indices=True,
                         auto_epoch=False)
    assert sorted(np.concatenate([b[-1].numpy() for b in loader]).tolist()) == sorted(want.tolist())
    assert len(loader) == -(-len(want) // 4)


def test_keras_and_tf_take_the_class_balanced_sampler(camvid_train_npy: Path) -> None:
    import shardkit
    import shardkit.tf
    from shardkit.read.keras import ShardkitPyDataset

    ds = shardkit.open(camvid_train_npy)
    want = ds.sampler(4, sampling="class-balanced", seed=3, epoch=0).indices()
    seq = ShardkitPyDataset(ds, shardkit.EpochPlan(4, seed=3, sampling="class-balanced"))
    assert sorted(np.concatenate([seq.batch_indices(i) for i in range(len(seq))]).tolist()) == sorted(want.tolist())
    tfds = shardkit.tf.dataset(ds, shardkit.EpochPlan(4, seed=3, sampling="class-balanced"), with_keys=True)
    got = [k.decode() for _, _, keys in tfds.take(1000) for k in keys.numpy().tolist()]
    assert sorted(got) == sorted(ds.key(int(i)) for i in want)


# ------------------------------------------------------------------ bitmaps that contradict the data (issue 36)
@pytest.fixture
def camvid_val_copy(camvid_val_npy: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(camvid_val_npy, tmp_path / "val"))


@pytest.mark.parametrize("spec", ["class-balanced", "repeat-factor"])
def test_zeroed_class_bitmaps_are_refused_not_an_empty_epoch(camvid_val_copy: Path, spec: str) -> None:
    """Every bitmap zeroed, the sidecars' hashes refreshed: the split opens (every sha256 agrees), but the sampler
    refuses in one line, naming the classes whose pixels no bitmap holds, instead of 0 samples per epoch."""
    import shardkit
    from shardkit.errors import IntegrityError
    from tests.tamper import rewrite_sidecars, zero_class_bitmaps

    rewrite_sidecars(camvid_val_copy, zero_class_bitmaps)
    ds = shardkit.open(camvid_val_copy, verify=True)
    with pytest.raises(IntegrityError, match="have pixels but no sample's bitmap holds them") as err:
        ds.sampler(4, sampling=spec)
    msg = str(err.value)
    assert "\n" not in msg and "class(es) 0, 1, 2" in msg and "manifest.json" in msg and "shardkit verify" in msg
    assert len(list(ds.iter_batches(4, sampling="uniform"))) == 7  # uniform sampling needs no bitmap


def test_bitmaps_and_class_counts_both_zeroed_are_refused_as_an_empty_epoch(camvid_val_copy: Path) -> None:
    """Zeroed bitmaps with zeroed class pixel counts agree with each other, but no sample holds a class: the
    class-balanced sampler says it would draw 0 samples per epoch instead of yielding none on every rank."""
    import shardkit
    from shardkit.errors import IntegrityError
    from shardkit.store.manifest import MANIFEST_NAME
    from tests.tamper import rewrite_sidecars, zero_class_bitmaps

    rewrite_sidecars(camvid_val_copy, zero_class_bitmaps)
    m = json.loads((camvid_val_copy / MANIFEST_NAME).read_text())
    m["stats"]["class_pixels"] = [0] * len(m["stats"]["class_pixels"])
    for target in (MANIFEST_NAME, f"manifest-v{m['version']}.json"):
        (camvid_val_copy / target).write_text(json.dumps(m))
    with pytest.raises(IntegrityError, match="would draw 0 samples per epoch") as err:
        shardkit.open(camvid_val_copy).sampler(4, sampling="class-balanced", world_size=2, rank=1)
    assert "\n" not in str(err.value)


def test_the_bitmap_check_passes_every_real_split(camvid_val_npy: Path) -> None:
    """On intact CamVid val the check finds nothing (every class there has pixels and samples)."""
    import shardkit
    from shardkit.store.stats import presence_contradiction

    ds = shardkit.open(camvid_val_npy)
    assert presence_contradiction(ds.class_frequencies()) is None
    assert ds.sampler(4, sampling="class-balanced").samples_per_rank > 0


def test_resume_order_same_world_is_the_uninterrupted_rest_any_world_the_unconsumed_rest() -> None:
    """Random sizes, world sizes, batch sizes, drop_last and class-balanced repeats: resumed after k batches on
    every rank, the same world size reads exactly the uninterrupted batches that follow; another world size reads
    every position from k*B*W on once (the unconsumed samples in the global order), evened out for itself."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        sizes = rng.integers(1, 30, rng.integers(1, 5)).tolist()
        n = sum(sizes)
        world, batch, drop = int(rng.integers(1, 5)), int(rng.integers(1, 6)), bool(rng.integers(2))
        repeats = rng.uniform(0.5, 3.0, n) if rng.integers(2) else None
        seed, epoch = int(rng.integers(100)), int(rng.integers(3))

        common = plan(batch, seed=seed, epoch=epoch, drop_last=drop)

        def ranks(w: int, start: int, common: EpochPlan = common, repeats: Any = repeats,
                  sizes: list = sizes) -> list[sampling.EpochBatchSampler]:
            return [sampling.EpochBatchSampler(sizes, common.replace(rank=r, world_size=w), repeats=repeats,
                                               start=start) for r in range(w)]

        full = [s.batches() for s in ranks(world, 0)]
        if not full[0]:
            continue
        k = int(rng.integers(0, len(full[0])))
        consumed = k * batch * world
        resumed = [s.batches() for s in ranks(world, consumed)]
        assert all([b.tolist() for b in f[k:]] == [b.tolist() for b in r] for f, r in zip(full, resumed, strict=True))
        order = sampling.epoch_indices(sizes, common, repeats=repeats)  # the global order, one rank
        other = int(rng.integers(1, 5))
        rest = sorted(np.concatenate([s.indices() for s in ranks(other, consumed)]).tolist())
        left = order[consumed:]
        if drop:  # the tail that does not fill the new ranks evenly is dropped
            left = left[:len(left) // other * other]
        else:  # padded by wrapping around to the order's start
            left = np.concatenate([left, order[np.arange((-len(left)) % other) % len(order)]])
        assert rest == sorted(left.tolist())
