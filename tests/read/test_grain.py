"""Grain adapter on real CamVid: shardkit's order and rank split through Grain's DataLoader, augmented from
(seed, epoch, index), checkpointed by Grain's iterator state, a JAX training loop of a few steps on CPU.

``import grain`` imports JAX, which warns (an error here) at every later ``os.fork`` in the process: the checks
run in a child process (:func:`_in_child`), so the rest of the suite (forked DataLoader workers) never meets
JAX. The checks are the module's ``check_*`` functions, each given the converted split's path; one child runs
them all in turn (one interpreter, one import of Grain and JAX, instead of one per check).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardkit
from shardkit import augment as A
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert

pytestmark = pytest.mark.skipif(importlib.util.find_spec("grain") is None, reason="grain is not installed")
ROOT = Path(__file__).resolve().parents[2]


#: The child's loop: a line ``[check, split, args]`` on stdin in, ``"ok"`` or the check's traceback out (as one
#: JSON line on the result pipe, so nothing a library prints can be taken for it).
CHILD = """
import json, os, sys, traceback
import tests.read.test_grain as t
results = os.fdopen(int(sys.argv[1]), "w")
for line in sys.stdin:
    check, split, args = json.loads(line)
    try:
        getattr(t, check)(split, *args)
        outcome = "ok"
    except BaseException:
        outcome = traceback.format_exc()
    results.write(json.dumps(outcome) + "\\n")
    results.flush()
"""


class _Child:
    """One Python process (with this checkout's shardkit) that runs this module's checks, one at a time."""

    def __init__(self, log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "TF_CPP_MIN_LOG_LEVEL": "2"}
        read, write = os.pipe()
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(write)], stdin=subprocess.PIPE,
                                         stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, pass_fds=(write,),
                                         text=True)
        os.close(write)
        self.results = os.fdopen(read)

    def run(self, check: str, split: Path, args: tuple[Any, ...]) -> str:
        assert self.proc.stdin is not None and self.proc.poll() is None, self.log.read_text(errors="replace")[-4000:]
        self.proc.stdin.write(json.dumps([check, str(split), list(args)]) + "\n")
        self.proc.stdin.flush()
        line = self.results.readline()
        assert line, f"the child died running {check}: " + self.log.read_text(errors="replace")[-4000:]
        return str(json.loads(line))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        finally:
            self.proc.kill()
            self.results.close()


_children: list[_Child] = []


@pytest.fixture(scope="module", autouse=True)
def _child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The module's child process, for the whole module."""
    _children.append(_Child(tmp_path_factory.mktemp("grain-child") / "log"))
    yield
    _children.pop().close()


def _in_child(check: str, split: Path, *args: Any) -> None:
    """Run ``check(split, *args)`` of this module in the module's child process."""
    outcome = _children[0].run(check, split, args)
    assert outcome == "ok", outcome[-4000:]

AUG = "scale=0.75:1.5,crop=48x64,hflip,rotate=10,jitter=0.2"


@pytest.fixture(scope="module")
def split(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CamVid val (26) as npy at 90x120, 7 samples per shard."""
    out = tmp_path_factory.mktemp("grain")
    convert(ConvertConfig(camvid_root, out, format="npy", size=(90, 120), splits=("val",), workers=1, quiet=True,
                          shard_size=ShardSize(samples=7)))
    return out / "val"


def _source(split: str, epochs: int = 2) -> Any:
    from shardkit.grain import ShardkitSource

    return ShardkitSource(split, augment=A.parse(AUG), seed=5, epochs=epochs)


def _records(batches: list[dict[str, Any]]) -> list[tuple[int, int, bytes]]:
    """(epoch, index, image + label bytes) of every record of ``batches``."""
    return [(int(b["epoch"][j]), int(b["index"][j]), b["image"][j].tobytes() + b["label"][j].tobytes())
            for b in batches for j in range(len(b["index"]))]


def test_grain_reads_shardkits_order_and_augmentation(split: Path) -> None:
    _in_child("check_order_and_augmentation", split)


def check_order_and_augmentation(split: str) -> None:
    """One process: Grain's records are shardkit's global order of epoch 0 then epoch 1 (Grain's Batch runs on
    across the epoch boundary), and every record is the numpy path's augmentation of (seed, epoch, index)."""
    from shardkit.grain import data_loader

    plan = shardkit.EpochPlan(4, seed=5)
    got = list(data_loader(_source(split), plan, num_epochs=2))
    ds = shardkit.open(split)
    want = [(e, i) for e in (0, 1) for i in ds.sampler(plan.replace(epoch=e)).indices().tolist()]
    assert [(e, i) for e, i, _ in _records(got)] == want and len(got) == 13
    for e, i, data in _records(got):
        images, labels = ds.augmented_batch(np.array([i]), A.parse(AUG), seed=5, epoch=e)
        assert data == images[0].tobytes() + labels[0].tobytes()


def test_grain_shard_options_split_like_shardkit_ranks(split: Path) -> None:
    _in_child("check_shard_options", split)


def check_shard_options(split: str) -> None:
    """Two processes (ShardOptions 0/2, 1/2): each reads shardkit's rank split, together every sample once."""
    import grain.python as grain

    from shardkit.grain import data_loader

    plan = shardkit.EpochPlan(3, seed=2)
    ds = shardkit.open(split)
    seen: Counter[int] = Counter()
    for r in (0, 1):
        got = list(data_loader(_source(split, 1), plan, shard_options=grain.ShardOptions(r, 2)))
        mine = [i for b in got for i in b["index"].tolist()]
        assert mine == ds.sampler(plan.replace(rank=r, world_size=2)).indices().tolist()
        seen.update(mine)
    assert sorted(seen) == list(range(len(ds))) and set(seen.values()) == {1}


@pytest.mark.parametrize("workers", [0, 2])
def test_grain_checkpoint_resumes_byte_for_byte(split: Path, workers: int) -> None:
    _in_child("check_checkpoint", split, workers)


def check_checkpoint(split: str, workers: int) -> None:
    """Grain's own iterator state after 4 batches, restored into a new loader: the rest of both epochs equals the
    uninterrupted run's bytes; a checkpoint of another augmentation is refused by Grain (the source's repr)."""
    from shardkit.grain import ShardkitSource, data_loader

    plan = shardkit.EpochPlan(4, seed=5)
    full = _records(list(data_loader(_source(split), plan, num_epochs=2, worker_count=workers)))
    it = iter(data_loader(_source(split), plan, num_epochs=2, worker_count=workers))
    first = [next(it) for _ in range(4)]
    state = it.get_state()
    again = iter(data_loader(_source(split), plan, num_epochs=2, worker_count=workers))
    again.set_state(state)
    assert _records(first) + _records(list(again)) == full
    other = ShardkitSource(split, augment=A.parse("hflip"), seed=5, epochs=2)
    with pytest.raises(ValueError, match="in checkpoint does not match") as err:
        iter(data_loader(other, plan, num_epochs=2, worker_count=workers)).set_state(state)
    assert f"augment={repr(_source(split)).split('augment=')[1].split(',')[0]}" in str(err.value)


def test_source_pickles_without_its_open_shards(split: Path) -> None:
    _in_child("check_pickle", split)


def check_pickle(split: str) -> None:
    src = _source(split)
    src[3]  # opens the split
    clone = pickle.loads(pickle.dumps(src))
    assert "_ds" not in clone.__dict__ and repr(clone) == repr(src)
    assert clone[30]["image"].tobytes() == src[30]["image"].tobytes() and int(clone[30]["epoch"]) == 1


def test_a_jax_training_loop_of_a_few_steps(split: Path) -> None:
    _in_child("check_jax_loop", split)


def check_jax_loop(split: str) -> None:
    """A per-pixel softmax classifier trained in JAX on CPU on Grain's batches (3 epochs of 26 in batches of 8 that run
    on across epochs: 10 steps): the loss falls."""
    import jax

    from shardkit.grain import ShardkitSource, data_loader

    jnp = jax.numpy
    src = ShardkitSource(split, augment=A.parse("crop=48x64,hflip"), seed=0, epochs=3)
    ds = shardkit.open(split)
    classes = ds.num_classes

    def loss(w: Any, x: Any, y: Any) -> Any:
        logits = x @ w  # (B, H, W, C)
        valid = y < classes - 1  # the ignore class (11) does not count
        logp = jax.nn.log_softmax(logits)
        picked = jnp.take_along_axis(logp, jnp.minimum(y, classes - 1)[..., None], axis=-1)[..., 0]
        return -(picked * valid).sum() / valid.sum()

    step = jax.jit(jax.value_and_grad(loss))
    w = jnp.zeros((3, classes))
    losses = []
    for batch in data_loader(src, shardkit.EpochPlan(8, seed=0), num_epochs=3):
        x = jnp.asarray(batch["image"], jnp.float32) / 255.0
        value, grad = step(w, x, jnp.asarray(batch["label"]).astype(jnp.int32))
        w = w - 0.5 * grad
        losses.append(float(value))
    assert len(losses) == 10 and np.all(np.isfinite(losses)) and np.mean(losses[-3:]) < losses[0]


def test_batch_records_are_shardkits_batches(split: Path) -> None:
    _in_child("check_batch_records", split)


def check_batch_records(split: str) -> None:
    """ShardkitBatchSource: each Grain record is one of shardkit's batches — Dataset.sampler(plan)'s batches of each
    epoch and, under ShardOptions i/2, of rank i — augmented like the numpy path; Grain's checkpoint resumes them."""
    import grain.python as grain

    from shardkit.grain import ShardkitBatchSource, batch_loader

    ds = shardkit.open(split)
    plan = shardkit.EpochPlan(4, seed=5)

    def source(world: int = 1) -> Any:
        return ShardkitBatchSource(split, plan, world_size=world, augment=A.parse(AUG), epochs=2)

    got = list(batch_loader(source(), num_epochs=2))
    want = [(e, b) for e in (0, 1) for b in ds.sampler(plan.replace(epoch=e)).batches()]
    assert [b["index"].tolist() for b in got] == [b.tolist() for _, b in want]
    for b, (e, idx) in zip(got, want, strict=True):
        images, labels = ds.augmented_batch(idx, A.parse(AUG), seed=5, epoch=e)
        assert b["image"].tobytes() == images.tobytes() and b["label"].tobytes() == labels.tobytes()
    for r in (0, 1):
        mine = [b["index"].tolist() for b in batch_loader(source(2), shard_options=grain.ShardOptions(r, 2))]
        assert mine == [b.tolist() for b in ds.sampler(plan.replace(rank=r, world_size=2)).batches()]
    it = iter(batch_loader(source(), num_epochs=2))
    first = [next(it)["index"].tolist() for _ in range(3)]
    again = iter(batch_loader(source(), num_epochs=2))
    again.set_state(it.get_state())
    assert first + [b["index"].tolist() for b in again] == [b["index"].tolist() for b in got]


@pytest.fixture(scope="module")
def train_split(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CamVid train (123, whose frames lack classes unevenly: class-balanced draws repeat) as npy at 90x120."""
    out = tmp_path_factory.mktemp("grain-train")
    convert(ConvertConfig(camvid_root, out, format="npy", size=(90, 120), splits=("train",), workers=1, quiet=True,
                          shard_size=ShardSize(samples=16)))
    return out / "train"


def test_grain_samples_class_balanced_like_shardkit(train_split: Path) -> None:
    _in_child("check_class_balanced", train_split)


def check_class_balanced(split: str) -> None:
    """A class-balanced plan through Grain: the per-record sampler's order under ShardOptions i/2 and the batch
    source's records are Dataset.sampler(plan)'s, repeats and all (no longer refused as non-uniform)."""
    import grain.python as grain

    from shardkit.grain import ShardkitBatchSource, batch_loader, data_loader

    ds = shardkit.open(split)
    plan = shardkit.EpochPlan(4, seed=3, sampling="class-balanced")
    uniform = ds.sampler(plan.replace(sampling="uniform")).indices().tolist()
    for r in (0, 1):
        want = ds.sampler(plan.replace(rank=r, world_size=2)).indices().tolist()
        got = [i for b in data_loader(_source(split, 1), plan, shard_options=grain.ShardOptions(r, 2))
               for i in b["index"].tolist()]
        assert got == want
    whole = ds.sampler(plan).indices().tolist()
    assert whole != uniform and len(set(whole)) < len(whole)  # the draw repeats rare-class samples
    batches = ShardkitBatchSource(split, plan, epochs=2)
    got_batches = [b["index"].tolist() for b in batch_loader(batches, num_epochs=2)]
    assert got_batches == [b.tolist() for e in (0, 1) for b in ds.sampler(plan.replace(epoch=e)).batches()]


def test_grain_reads_a_local_split_in_line(split: Path) -> None:
    _in_child("check_read_options", split)


def check_read_options(split: str) -> None:
    """Grain's 16 read threads cost a local split most of its speed on a small machine: the loaders read it in line
    unless told otherwise, and a caller's ReadOptions are kept."""
    import grain.python as grain

    from shardkit.grain import ShardkitBatchSource, batch_loader, data_loader

    batches = ShardkitBatchSource(split, shardkit.EpochPlan(4, seed=0))
    assert batch_loader(batches)._read_options.num_threads == 0
    assert data_loader(_source(split), 4)._read_options.num_threads == 0
    mine = grain.ReadOptions(num_threads=3, prefetch_buffer_size=6)
    assert batch_loader(batches, read_options=mine)._read_options == mine


def test_keras_on_jax_trains_through_grain(split: Path) -> None:
    _in_child("check_keras_on_jax", split)


def check_keras_on_jax(split: str) -> None:
    """Keras 3 on the JAX backend fits a small model on a Grain DataLoader of shardkit batches: XY gives exactly
    the Keras adapter's (x, y) for the same plan and augmentation, and a few steps of fit run with a finite loss."""
    os.environ["KERAS_BACKEND"] = "jax"
    import keras

    from shardkit.grain import XY, ShardkitBatchSource, batch_loader
    from shardkit.read.keras import ShardkitPyDataset

    assert keras.backend.backend() == "jax"
    aug = "crop=48x64,hflip"
    plan = shardkit.EpochPlan(8, seed=1)
    src = ShardkitBatchSource(split, plan, augment=A.parse(aug), epochs=2)
    first = next(iter(batch_loader(src, num_epochs=2, operations=(XY(src),))))
    x, y = ShardkitPyDataset(split, plan, augment=A.parse(aug))[0]
    assert first[0].dtype == np.float32 and first[0].tobytes() == x.tobytes() and first[1].tobytes() == y.tobytes()
    ds = shardkit.open(split)
    classes = ds.num_classes
    model = keras.Sequential([keras.Input((48, 64, 3)), keras.layers.Conv2D(classes, 1)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(batch_loader(src, num_epochs=2, operations=(XY(src),)), epochs=1, steps_per_epoch=4,
                        verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    normalising = A.Compose([*A.parse(aug).ops, A.Normalize(ds.mean, ds.std)])
    with pytest.raises(ValueError, match="normalise twice"):
        XY(ShardkitBatchSource(split, plan, augment=normalising))
