"""Keras 3 (torch backend): a tiny model trains on converted real CamVid data through ShardkitPyDataset.

The backend is chosen before anything imports keras. If keras was already imported in this
process with another backend (TensorFlow imports keras too), the training check runs in a
fresh interpreter instead; the check itself is the same function either way.
"""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "torch"  # before any keras import, in this process and its children

import gc
import json
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardkit
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert

SIZE = (90, 120)


@pytest.fixture(scope="module")
def small(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CamVid val scaled to 90x120 (fast to train on), npy with index labels."""
    out = tmp_path_factory.mktemp("keras")
    convert(ConvertConfig(camvid_root, out, format="npy", size=SIZE, resize="exact", splits=("val",),
                          workers=2, quiet=True))
    return out / "val"


def keras_training_check(split: str) -> dict[str, Any]:
    """Fit a 1x1 conv + softmax for two epochs, then one more; record which samples each shardkit epoch gave
    out (epoch 0 also gives the batches Keras reads to build the model), and check labels."""
    import keras

    from shardkit.read.keras import ShardkitPyDataset

    core = shardkit.open(split, labels="float_onehot")
    seen: dict[int, list[int]] = {}
    lock = threading.Lock()

    class Recording(ShardkitPyDataset):
        def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
            x, y = super().__getitem__(index)
            idx = self.batch_indices(int(index))
            images, labels = core.batch(idx)
            assert np.array_equal(y, labels), "labels must be bit-exact"
            np.testing.assert_allclose(x, core.normalize(images), rtol=1e-6)
            with lock:
                seen.setdefault(self.epoch, []).extend(idx.tolist())
            return x, y

    data = Recording(split, shardkit.EpochPlan(4, seed=1), options=shardkit.OpenOptions(labels="float_onehot"),
                     workers=2, max_queue_size=3)
    model = keras.Sequential([keras.Input((*SIZE, 3)),
                              keras.layers.Conv2D(core.onehot_channels, 1, activation="softmax")])
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    history = model.fit(data, epochs=2, verbose=0)
    after_first_fit = data.epoch
    model.fit(data, epochs=1, verbose=0)
    return {"backend": keras.backend.backend(), "loss": [float(v) for v in history.history["loss"]],
            "epochs_seen": {str(k): sorted(set(v)) for k, v in seen.items()}, "after_first_fit": after_first_fit,
            "after_second_fit": data.epoch, "num_samples": len(core)}


def _in_keras_process(check: str, split: Path) -> dict[str, Any]:
    """Run the module function ``check`` here if keras can use the torch backend, else in a child."""
    keras = sys.modules.get("keras")
    if keras is None or keras.backend.backend() == "torch":
        return globals()[check](str(split))
    here = str(Path(__file__).parent)
    code = (f"import sys; sys.path.insert(0, {here!r}); import json, test_keras as t; "
            f"print(json.dumps(t.{check}({str(split)!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "KERAS_BACKEND": "torch", "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_keras_epochs_are_shardkit_epochs(small: Path) -> None:
    """fit(epochs=2) trains Keras epoch k on shardkit epoch k, every sample once each, and leaves the next epoch
    (2) ready: the next fit trains epoch 2. (Keras's set-up call to on_epoch_end before the first epoch used to
    move training one epoch ahead: epoch 1 and 2, leaving 3.)"""
    result = _in_keras_process("keras_training_check", small)
    assert result["backend"] == "torch"
    assert len(result["loss"]) == 2 and np.all(np.isfinite(result["loss"]))
    everything = list(range(result["num_samples"]))
    assert result["epochs_seen"] == {"0": everything, "1": everything, "2": everything}
    assert result["after_first_fit"] == 2 and result["after_second_fit"] == 3


def pydataset_options_check(split: str) -> dict[str, Any]:
    """Options reach PyDataset; uint8 / ids outputs; pickling; the epoch advances the order."""
    from shardkit.read.keras import ShardkitPyDataset

    data = ShardkitPyDataset(split, shardkit.EpochPlan(8, drop_last=True, rank=1, world_size=2), workers=3,
                             use_multiprocessing=True, max_queue_size=5, normalize=False)
    assert (data.workers, data.use_multiprocessing, data.max_queue_size) == (3, True, 5)
    assert len(data) == 1  # 13 samples per rank, one full batch of 8
    x, y = data[0]
    assert x.dtype == np.uint8 and x.shape == (8, *SIZE, 3) and y.shape == (8, *SIZE) and y.dtype == np.uint8
    core = shardkit.open(split)
    assert np.array_equal(y, core.batch(data.batch_indices(0))[1])
    clone = pickle.loads(pickle.dumps(data))  # what a spawned worker pool receives
    assert np.array_equal(clone[0][1], y)
    first = data.batch_indices(0).tolist()
    data.on_epoch_end()  # without on_epoch_begin (Keras's set-up call): no epoch has passed
    assert data.epoch == 0 and data.batch_indices(0).tolist() == first
    data.on_epoch_begin()
    data.on_epoch_end()
    assert data.epoch == 1 and data.batch_indices(0).tolist() != first
    with pytest.raises(IndexError):
        data[1]
    with pytest.warns(DeprecationWarning) as caught:
        old = ShardkitPyDataset(split, 8, drop_last=True, rank=1, world_size=2, labels="onehot", normalize=False)
    assert len(caught) == 2 and "drop_last=, rank=, world_size= are deprecated" in str(caught[0].message)
    assert old.sampler.batches()[0].tolist() == first and old.dataset.labels == "onehot"
    with pytest.raises(shardkit.errors.ConfigError, match="not a training target"):
        ShardkitPyDataset(split, 8, options=shardkit.OpenOptions(labels="stored"))
    return {"ok": True}


def test_pydataset_options_and_outputs(small: Path) -> None:
    assert _in_keras_process("pydataset_options_check", small) == {"ok": True}


def pydataset_augment_check(split: str) -> dict[str, Any]:
    """augment= gives each batch what the numpy/OpenCV path gives for (seed, epoch, index), epoch by epoch."""
    from shardkit import augment as A
    from shardkit.read.keras import ShardkitPyDataset

    aug = A.parse("scale=0.8:1.25,crop=64x96,hflip,rotate=5,jitter=0.2")
    data = ShardkitPyDataset(split, shardkit.EpochPlan(8, seed=2), normalize=False, augment=aug)
    core = shardkit.open(split)
    outputs = []
    for _ in range(2):
        idx = data.batch_indices(0)
        x, y = data[0]
        want = aug(*core.batch(idx), idx, seed=2, epoch=data.epoch, ignore_index=core.ignore_index)
        assert x.shape == (8, 64, 96, 3) and np.array_equal(x, want[0]) and np.array_equal(y, want[1])
        outputs.append(x)
        data.on_epoch_begin()
        data.on_epoch_end()
    assert not np.array_equal(*outputs)
    return {"ok": True}


def test_pydataset_augments_per_sample_and_epoch(small: Path) -> None:
    assert _in_keras_process("pydataset_augment_check", small) == {"ok": True}


def pydataset_resume_check(split: str) -> dict[str, Any]:
    """Stop after 3 batches, resume a new PyDataset from the state dict: ``len`` is the batches left, and they, then
    the next epoch, equal the uninterrupted run's bytes (augmented); ``model.fit`` on the resumed dataset trains on
    exactly those batches, then moves on to epoch 1 from its start."""
    import keras

    from shardkit import augment as A
    from shardkit.read.keras import ShardkitPyDataset

    def make(kind: type[ShardkitPyDataset] = ShardkitPyDataset) -> ShardkitPyDataset:
        return kind(split, shardkit.EpochPlan(4, seed=3), augment=A.parse("hflip,jitter=0.2"))

    def epoch(data: ShardkitPyDataset) -> list[bytes]:
        out = [b"".join(a.tobytes() for a in data[i]) for i in range(len(data))]
        data.on_epoch_begin()
        data.on_epoch_end()
        return out

    full = make()
    want = epoch(full) + epoch(full)
    first = make()
    got = [b"".join(a.tobytes() for a in first[i]) for i in range(3)]
    state = first.state_dict()
    assert (state["epoch"], state["consumed"]) == (0, 12), state
    again = make()
    again.load_state_dict(state)
    assert len(again) == len(full) - 3
    assert got + epoch(again) + epoch(again) == want

    read: set[tuple[int, int]] = set()

    class Recording(ShardkitPyDataset):
        def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
            read.add((self.epoch, *self.batch_indices(int(index))[:1].tolist()))
            return super().__getitem__(index)

    data = make(Recording)
    data.load_state_dict(state)
    model = keras.Sequential([keras.Input((*SIZE, 3)), keras.layers.Conv2D(1, 1), keras.layers.Reshape(SIZE)])
    model.compile(optimizer="adam", loss="mse")  # what is learnt does not matter here, which batches are read does
    model.fit(data, epochs=1, verbose=0)
    plain = make()
    expect = {(0, int(plain.batch_indices(i)[0])) for i in range(3, len(plain))}
    assert read == expect, (sorted(read), sorted(expect))
    after = data.state_dict()
    assert (after["epoch"], after["consumed"], len(data)) == (1, 0, len(plain)), after
    return {"ok": True}


def test_pydataset_resumes_from_its_state(small: Path) -> None:
    assert _in_keras_process("pydataset_resume_check", small) == {"ok": True}


def worker_batches_check(split: str) -> dict[str, Any]:
    """Every worker setting (in line, 2 threads, 2 processes handing batches over through /dev/shm slots), normalised
    or not, gives the same batches as the core reader, epoch by epoch; every batch is kept to the end and still holds
    what it held when it came (recycled memory never reused while a batch lives); the processes' slots are bounded
    (and reused by the second epoch's pool)."""
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    from shardkit.read import recycle
    from shardkit.read.keras import ShardkitPyDataset

    core = shardkit.open(split)
    plan = shardkit.EpochPlan(4, seed=3)
    order = ShardkitPyDataset(split, plan, workers=1)
    expected = []
    for epoch in (0, 1):
        order.set_epoch(epoch)
        expected.append([core.batch(order.batch_indices(i)) for i in range(len(order))])
    settings = 0
    for normalize in (True, False):
        for workers, processes in ((1, False), (2, False), (2, True)):
            data = ShardkitPyDataset(split, plan, workers=workers, use_multiprocessing=processes, normalize=normalize,
                                     max_queue_size=3)
            adapter = PyDatasetAdapter(data)
            kept, copies = [], []
            for _epoch in (0, 1):
                adapter.on_epoch_begin()
                for x, y in adapter.get_numpy_iterator():
                    kept.append((x, y))
                    copies.append((x.copy(), y.copy()))
                    if processes:  # at most max_queue_size + 2 x workers slots, each a reused file
                        slots = list(recycle.SHM.glob(f"shardkit-batch-{os.getpid()}-{data._slots.group}-slot*"))
                        assert 0 < len(slots) <= 3 + 2 * 2
                adapter.on_epoch_end()
            want = [b for epoch in expected for b in epoch]
            assert len(kept) == len(want)
            for (x, y), (cx, cy), (images, labels) in zip(kept, copies, want, strict=True):
                assert np.array_equal(x, cx) and np.array_equal(y, cy)  # unchanged while kept
                assert np.array_equal(y, labels)
                if normalize:
                    assert x.dtype == np.float32 and np.array_equal(x, core.normalize(images))
                else:
                    assert x.dtype == np.uint8 and np.array_equal(x, images)
            settings += 1
            if processes:  # the dataset gone, its slot files go with it
                group = data._slots.group
                del data, adapter, kept
                gc.collect()
                assert not list(recycle.SHM.glob(f"shardkit-batch-{os.getpid()}-{group}-*"))
    return {"settings": settings}


def test_worker_settings_give_the_same_batches_and_kept_ones_stay(small: Path) -> None:
    assert _in_keras_process("worker_batches_check", small) == {"settings": 6}
