"""PyTorch adapters on converted real data: DataLoader workers (fork, spawn), layouts, the prefetcher."""

from __future__ import annotations

import itertools
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardkit
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import ConfigError
from shardkit.read.dataset import Dataset
from tests.camvid_bands import camvid_bands

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from shardkit.read.torch import BufferReuse, CudaPrefetcher, ShardkitTorchDataset, make_loader  # noqa: E402

CROP = (352, 480)


@pytest.fixture(scope="module")
def splits(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """CamVid val as LMDB (ids) and HDF5 (packed one-hot), 7 samples per shard."""
    out = tmp_path_factory.mktemp("torch")
    for fmt, enc in (("lmdb", "index"), ("hdf5", "packed")):
        convert(ConvertConfig(camvid_root, out / fmt, format=fmt, size=CROP, splits=("val",), workers=2,
                              quiet=True, label_encoding=enc, shard_size=ShardSize(samples=7)))
    return {"lmdb": out / "lmdb" / "val", "hdf5": out / "hdf5" / "val"}


def _epochs(loader: DataLoader, core: Dataset, epochs: int, layout: str) -> list[list[int]]:
    """Run ``epochs`` passes; check each sample against the core reader; return the order of each pass."""
    orders = []
    for _ in range(epochs):
        order: list[int] = []
        for images, labels, idx in loader:
            want_images, want_labels = core.batch(idx.numpy())
            got = images.permute(0, 2, 3, 1) if layout == "NCHW" else images
            assert got.dtype == torch.uint8 and np.array_equal(got.numpy(), want_images)
            assert np.array_equal(labels.numpy(), want_labels)  # bit-exact
            order.extend(idx.tolist())
        assert sorted(order) == list(range(len(core))), "every sample exactly once per epoch"
        orders.append(order)
    return orders


def test_batch_loader_fork_two_persistent_workers(splits: dict[str, Path]) -> None:
    core = shardkit.open(splits["lmdb"])
    core.batch(range(len(core)))  # the parent holds the LMDB environments open before forking
    loader = make_loader(splits["lmdb"], 4, num_workers=2, multiprocessing_context="fork", with_indices=True)
    assert loader.persistent_workers and loader.batch_size is None
    first, second = _epochs(loader, core, 1, "NCHW")[0], None
    pids = [w.pid for w in loader._iterator._workers]
    second = _epochs(loader, core, 1, "NCHW")[0]
    assert [w.pid for w in loader._iterator._workers] == pids  # the same workers served both epochs
    assert first != second  # the epoch advanced by itself


def test_batch_loader_spawn_two_workers(splits: dict[str, Path]) -> None:
    core = shardkit.open(splits["hdf5"])
    loader = make_loader(splits["hdf5"], shardkit.EpochPlan(5, seed=11), num_workers=2, multiprocessing_context="spawn",
                         with_indices=True, layout="NHWC")
    orders = _epochs(loader, core, 2, "NHWC")
    assert orders[0] != orders[1]


def test_map_style_dataset_with_default_collate(splits: dict[str, Path]) -> None:
    core = shardkit.open(splits["lmdb"])
    ds = ShardkitTorchDataset(splits["lmdb"], layout="NHWC", with_indices=True)
    loader = DataLoader(ds, batch_size=5, shuffle=True, num_workers=2, multiprocessing_context="fork",
                        persistent_workers=True)
    _epochs(loader, core, 2, "NHWC")


def test_layouts_and_label_outputs(splits: dict[str, Path]) -> None:
    core = shardkit.open(splits["hdf5"], labels="onehot")
    nchw = ShardkitTorchDataset(splits["hdf5"], options=shardkit.OpenOptions(labels="onehot"))
    nhwc = ShardkitTorchDataset(splits["hdf5"], options=shardkit.OpenOptions(labels="onehot"), layout="NHWC")
    image, label = nchw[3]
    assert image.shape == (3, *CROP) and label.shape == (11, *CROP)  # the ignore class 11 has no channel
    assert np.array_equal(image.permute(1, 2, 0).numpy(), core[3][0])
    assert np.array_equal(label.permute(1, 2, 0).numpy(), core[3][1])
    images, labels = nchw[[1, 2, 9]]
    assert images.shape == (3, 3, *CROP) and labels.shape == (3, 11, *CROP)
    assert images.is_contiguous(memory_format=torch.channels_last)  # a zero-copy view of HWC storage
    images, labels = nhwc[torch.tensor([1, 2, 9])]
    assert images.shape == (3, *CROP, 3) and labels.shape == (3, *CROP, 11)
    assert np.array_equal(labels.numpy(), core.batch([1, 2, 9])[1])
    with pytest.raises(ConfigError):
        ShardkitTorchDataset(splits["hdf5"], layout="CHW")
    clone = pickle.loads(pickle.dumps(nchw))  # what spawn does: no open handle travels
    assert not clone.dataset.readers[0].is_open and torch.equal(clone[3][1], label)


def test_two_ranks_get_equal_disjoint_batches(splits: dict[str, Path]) -> None:
    loaders = [make_loader(splits["lmdb"], shardkit.EpochPlan(4, rank=r, world_size=2), with_indices=True,
                           pin_memory=False) for r in range(2)]
    assert len(loaders[0]) == len(loaders[1]) == 4
    shares = [[i for _, _, idx in loader for i in idx.tolist()] for loader in loaders]
    assert len(shares[0]) == len(shares[1]) == 13 and not set(shares[0]) & set(shares[1])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_prefetcher_cpu_path_normalises_and_expands_like_numpy(splits: dict[str, Path], layout: str) -> None:
    core = shardkit.open(splits["lmdb"])
    loader = make_loader(splits["lmdb"], shardkit.EpochPlan(4, shuffle=False), layout=layout, with_indices=True,
                         pin_memory=False)
    mean, std = core.mean, core.std
    for labels in ("float_onehot", "ids", "onehot"):
        prefetcher = CudaPrefetcher(loader, device="cpu", labels=labels)
        if not torch.cuda.is_available():
            assert CudaPrefetcher(loader).device.type == "cpu"
        assert len(prefetcher) == len(loader) == 7
        seen = 0
        for x, y, idx in itertools.islice(prefetcher, None if labels == "ids" else 2):
            images, ids = core.batch(idx.numpy())
            want_x = (images.astype(np.float32) - mean) / std
            if labels == "ids":
                want_y = ids.astype(np.int64)
            else:
                dtype = np.float32 if labels == "float_onehot" else np.uint8
                want_y = (ids[..., None] == np.arange(11)).astype(dtype)  # ignore 11: no channel
            if layout == "NCHW":
                want_x = want_x.transpose(0, 3, 1, 2)
                want_y = want_y.transpose(0, 3, 1, 2) if want_y.ndim == 4 else want_y
                assert x.is_contiguous()
            assert x.dtype == torch.float32 and x.shape == want_x.shape
            np.testing.assert_allclose(x.numpy(), want_x, rtol=1e-5, atol=1e-5)
            assert y.dtype == torch.from_numpy(want_y).dtype and np.array_equal(y.numpy(), want_y)
            seen += len(idx)
        assert seen == (26 if labels == "ids" else 8)


def test_prefetcher_refuses_what_it_cannot_do(splits: dict[str, Path]) -> None:
    loader = make_loader(splits["hdf5"], 4, options=shardkit.OpenOptions(labels="onehot"), pin_memory=False)
    with pytest.raises(ConfigError, match="labels='ids'"):
        CudaPrefetcher(loader, device="cpu", labels="onehot")
    with pytest.raises(ConfigError, match="mean"):
        CudaPrefetcher([], device="cpu")
    raw = CudaPrefetcher(loader, device="cpu", labels=None, normalize=False)
    x, y = next(iter(raw))
    assert x.dtype == torch.uint8 and y.shape == (4, 11, *CROP)


def test_shared_ring_batches_stay_valid_for_keep_more_batches(splits: dict[str, Path]) -> None:
    core = shardkit.open(splits["lmdb"])
    loader = make_loader(splits["lmdb"], 3, num_workers=2, multiprocessing_context="fork", with_indices=True,
                         layout="NHWC", pin_memory=False, reuse_buffers=BufferReuse(keep=2))
    held: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    seen = 0
    for _epoch in range(2):  # the slot counter runs on across epochs
        for images, labels, idx in loader:
            held = [*held[-2:], (images, labels, idx)]
            for im, lab, ix in held:  # the current batch and the `keep` before it are intact
                want_images, want_labels = core.batch(ix.numpy())
                assert np.array_equal(im.numpy(), want_images) and np.array_equal(lab.numpy(), want_labels)
            seen += len(idx)
    assert seen == 2 * len(core)
    plain = make_loader(splits["lmdb"], 3, num_workers=2, multiprocessing_context="fork",
                        reuse_buffers=BufferReuse(shared_ring=False))
    assert isinstance(plain, DataLoader)


# -------------------------------------------------------------- default worker batches: ring slots held while alive
def _reference(path: Path, plan: shardkit.EpochPlan, epochs: int) -> list[tuple[np.ndarray, np.ndarray, list[int]]]:
    """``epochs`` passes of the 0-worker loader (every batch its own fresh memory), copied out."""
    loader = make_loader(path, plan, with_indices=True, layout="NHWC", pin_memory=False)
    return [(im.numpy().copy(), lab.numpy().copy(), idx.tolist()) for _ in range(epochs) for im, lab, idx in loader]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_default_worker_batches_kept_are_never_overwritten(splits: dict[str, Path], context: str) -> None:
    """The default 2-worker loader yields views of shared-memory ring slots (no fresh segment per batch), yet 100
    batches kept to the end (far more than slots) are byte for byte those of a 0-worker run: a slot is never
    written again while a batch viewing it lives; once every slot is held, batches come in their own memory."""
    from shardkit.read.torch import RingLoader

    plan = shardkit.EpochPlan(1, seed=3)  # 26 batches an epoch
    epochs = 4 if context == "fork" else 2
    want = _reference(splits["lmdb"], plan, epochs)
    loader = make_loader(splits["lmdb"], plan, num_workers=2, multiprocessing_context=context, with_indices=True,
                         layout="NHWC", pin_memory=False)
    assert isinstance(loader, RingLoader) and loader.pool is not None
    kept = [batch for _ in range(epochs) for batch in loader]
    assert len(kept) == len(want) == 26 * epochs
    slots = [_slot_of(images, loader.ring) for images, _, _ in kept]
    assert [_slot_of(labels, loader.ring) for _, labels, _ in kept] == slots
    held = [k for k in slots if k is not None]
    assert len(held) == len(set(held)) == len(loader.ring.slots)  # each slot held by one kept batch, never reused
    for (images, labels, idx), (want_images, want_labels, want_idx) in zip(kept, want, strict=True):
        assert idx.tolist() == want_idx
        assert images.numpy().tobytes() == want_images.tobytes() and labels.numpy().tobytes() == want_labels.tobytes()


def test_default_worker_batches_recycle_their_slots(splits: dict[str, Path]) -> None:
    """Batches dropped by the loop give their slot back: over 104 batches, one kept at a time for a while (as a view),
    every batch is a view of one of the ring's slots (bounded shared memory, no segment per batch), the kept ones stay
    intact, and once they are gone every slot is free again."""
    plan = shardkit.EpochPlan(1, seed=5)
    want = _reference(splits["lmdb"], plan, 4)
    loader = make_loader(splits["lmdb"], plan, num_workers=2, multiprocessing_context="fork", with_indices=True,
                         layout="NHWC", pin_memory=False)
    kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    used: list[int | None] = []
    n = 0
    for _ in range(4):
        for images, labels, idx in loader:
            used.append(_slot_of(images, loader.ring))
            assert images.numpy().tobytes() == want[n][0].tobytes() and labels.numpy().tobytes() == want[n][1].tobytes()
            assert idx.tolist() == want[n][2]
            if n in (7, 60):  # one batch kept at a time (the ring's spare slot): 7 until 50, then 60 to the end
                kept[n] = (images[:, ::2], labels)  # a view is enough to hold the slot
            elif n == 50:
                k7 = kept.pop(7)
                assert k7[0].numpy().tobytes() == want[7][0][:, ::2].tobytes()
                assert k7[1].numpy().tobytes() == want[7][1].tobytes()
                del k7
            n += 1
    assert n == 104
    assert used.count(None) == 0 and len(set(used)) <= len(loader.ring.slots)
    for k, (images, labels) in kept.items():
        assert images.numpy().tobytes() == want[k][0][:, ::2].tobytes()
        assert labels.numpy().tobytes() == want[k][1].tobytes()
    del kept, images, labels
    loader.pool.reclaim()
    assert sorted(loader.pool.free) == list(range(len(loader.ring.slots)))


# ---------------------------------------------------------------- augmented batches through the shared-memory ring
AUG = "scale=0.5:2,crop=64x96,hflip,rotate=10,jitter=0.2"


def _augmented(core: Dataset, aug: object, idx: np.ndarray, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    ignore = 255 if core.ignore_index is None else int(core.ignore_index)
    return aug(*core.batch(idx), idx, seed=seed, epoch=epoch, ignore_index=ignore)  # type: ignore[operator]


def _slot_of(t: torch.Tensor, ring: Any) -> int | None:
    """The ring slot whose memory tensor ``t`` views, or None (memory of its own)."""
    ptr = t.data_ptr()
    for k, pair in enumerate(ring.slots):
        for s in pair:
            if s.data_ptr() <= ptr < s.data_ptr() + s.untyped_storage().nbytes():
                return k
    return None


def test_augmented_worker_batches_hold_their_ring_slot_and_stay_valid(splits: dict[str, Path]) -> None:
    """Workers augment into ring slots and each batch is yielded as views of its slot, which no later batch reuses
    while the batch (or a view of it) lives: all batches of an epoch, kept to the end (more than slots), still
    hold exactly what the numpy path gives for their indices; the first ones are slot views, the rest (every slot
    held) arrive in their own memory."""
    from shardkit import augment as A
    from shardkit.read.torch import RingLoader

    aug = A.parse(AUG)
    core = shardkit.open(splits["lmdb"])
    loader = make_loader(splits["lmdb"], shardkit.EpochPlan(2, seed=4), num_workers=2, multiprocessing_context="fork",
                         with_indices=True, layout="NHWC", pin_memory=False, augment=aug)
    assert isinstance(loader, RingLoader) and loader.copy and len(loader.ring.slots) == 2 * 2 + 3
    loader.sampler.set_epoch(1)
    kept = [(im[:, ::2], lab, idx) for im, lab, idx in loader]  # a view of each image batch is enough to hold it
    assert len(kept) > len(loader.ring.slots) + 2
    slots = [_slot_of(images, loader.ring) for images, _, _ in kept]
    assert [_slot_of(labels, loader.ring) for _, labels, _ in kept] == slots
    held = [k for k in slots if k is not None]
    assert len(held) == len(set(held)) == len(loader.ring.slots) and slots[-1] is None
    for images, labels, idx in kept:
        want_images, want_labels = _augmented(core, aug, idx.numpy(), 4, 1)
        assert np.array_equal(images.numpy(), want_images[:, ::2]) and np.array_equal(labels.numpy(), want_labels)
    assert sorted(int(i) for _, _, idx in kept for i in idx) == list(range(len(core)))
    del kept, images, labels  # every slot free again: the next epoch's batches are all slot views, none held
    seen, used = 0, set()
    for images, labels, idx in loader:
        used.add(_slot_of(images, loader.ring))
        want_images, want_labels = _augmented(core, aug, idx.numpy(), 4, 2)
        assert np.array_equal(images.numpy(), want_images) and np.array_equal(labels.numpy(), want_labels)
        seen += len(idx)
    assert seen == len(core) and None not in used
    for _ in range(3):  # passes left early: the batches in flight are dropped, and their slots come back
        partial = iter(loader)
        next(partial)
        del partial
    used = {_slot_of(images, loader.ring) for images, _, _ in loader}
    assert None not in used
    plain = make_loader(splits["lmdb"], 2, num_workers=2, multiprocessing_context="fork", augment=aug,
                        reuse_buffers=BufferReuse(shared_ring=False))
    assert isinstance(plain, DataLoader)


def test_augmented_ring_views_with_reuse_buffers_stay_valid_for_keep_more(splits: dict[str, Path]) -> None:
    from shardkit import augment as A

    aug = A.parse(AUG)
    core = shardkit.open(splits["lmdb"])
    loader = make_loader(splits["lmdb"], shardkit.EpochPlan(3, seed=2), num_workers=2, multiprocessing_context="fork",
                         with_indices=True, layout="NCHW", pin_memory=False, augment=aug,
                         reuse_buffers=BufferReuse(keep=1))
    assert not loader.copy
    held: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for images, labels, idx in loader:
        held = [*held[-1:], (images, labels, idx)]
        for im, lab, ix in held:  # the current batch and the `keep` before it are intact
            want_images, want_labels = _augmented(core, aug, ix.numpy(), 2, 0)
            assert np.array_equal(im.permute(0, 2, 3, 1).numpy(), want_images)
            assert np.array_equal(lab.numpy(), want_labels)


def test_augmented_batches_the_slots_cannot_hold_arrive_whole(splits: dict[str, Path]) -> None:
    """Without a crop the ring is sized for the split's samples; a pipeline that doubles them (scale=2:2) gives
    batches of another shape, which the worker hands over in their own memory: the same values."""
    from shardkit import augment as A

    aug = A.parse("scale=2:2,hflip,jitter=0.1")
    core = shardkit.open(splits["lmdb"])
    loader = make_loader(splits["lmdb"], shardkit.EpochPlan(4, seed=1, shuffle=False), num_workers=2,
                         multiprocessing_context="fork", with_indices=True, layout="NHWC", pin_memory=False,
                         augment=aug)
    assert loader.ring.slots[0][0].shape[1:3] == CROP
    seen = 0
    for images, labels, idx in loader:
        want_images, want_labels = _augmented(core, aug, idx.numpy(), 1, 0)
        assert images.shape[1:3] == (2 * CROP[0], 2 * CROP[1])
        assert np.array_equal(images.numpy(), want_images) and np.array_equal(labels.numpy(), want_labels)
        seen += len(idx)
    assert seen == len(core)


@pytest.fixture(scope="module")
def bands_split(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight real CamVid val pairs made 4-band uint16 (R, G, B and grey, x257; ``scripts/multiband_camvid.py``'s
    rule), converted to npy."""
    raw = tmp_path_factory.mktemp("bands-raw")
    camvid_bands(camvid_root, raw, 4, 8, np.uint16)
    out = tmp_path_factory.mktemp("bands")
    convert(ConvertConfig(raw, out, format="npy", splits=("val",), workers=1, quiet=True, num_classes=12,
                          ignore_index=11))
    return out / "val"


@pytest.mark.parametrize("normalize", [False, True], ids=["uint16", "normalized"])
def test_augmented_multiband_batches_are_warped_into_their_ring_slots(bands_split: Path, normalize: bool) -> None:
    """4-band uint16 batches (float32 after normalize) fit the ring: its slots take the pipeline's output bands and
    dtype, so every batch is a view of a slot (before, the slots were sized for 3-band uint8 and every batch came
    back through a fresh shared-memory copy), holding exactly what the numpy path gives."""
    from shardkit import augment as A

    core = shardkit.open(bands_split)
    aug = A.parse("scale=0.5:2,crop=64x96,hflip,rotate=10,jitter=0.2:0.2")
    if normalize:
        aug = A.Compose([*aug.ops, A.Normalize(core.mean, core.std)])
    loader = make_loader(bands_split, shardkit.EpochPlan(2, seed=3), num_workers=2, multiprocessing_context="fork",
                         with_indices=True, layout="NHWC", pin_memory=False, augment=aug)
    image_slot = loader.ring.slots[0][0]
    assert image_slot.shape[1:] == (64, 96, 4)
    assert image_slot.dtype == (torch.float32 if normalize else torch.uint16)
    seen = 0
    for images, labels, idx in loader:
        assert _slot_of(images, loader.ring) is not None
        want_images, want_labels = _augmented(core, aug, idx.numpy(), 3, 0)
        assert np.array_equal(images.numpy(), want_images) and np.array_equal(labels.numpy(), want_labels)
        seen += len(idx)
    assert seen == len(core)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE and /proc are Linux's")
def test_ring_pages_are_mapped_in_one_call_keeping_their_values() -> None:
    """A worker maps a ring slot's pages at once (_populate): the slot keeps its values, and writing it all afterwards
    takes almost no page faults in that process, where without it every 4 KB page faults once."""
    from shardkit.read.torch import _empty, _populate

    slot = _empty((64, 64, 1024), np.dtype(np.uint8), True)  # 4 MB: 1024 pages
    slot.numpy()[...] = 7

    def faults_writing_it(populate: bool) -> int:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child maps the shared pages lazily, as a DataLoader worker does
            if populate:
                _populate(slot)
            before = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[7])
            slot.numpy()[:32] = 9  # the first half written...
            after = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[7])
            kept = bool((slot.numpy()[32:] == 7).all())  # ...the rest as it was
            os.write(write, f"{after - before if kept else -1}".encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read) as f:
            return int(f.read())

    plain, populated = faults_writing_it(False), faults_writing_it(True)
    assert populated >= 0 and plain >= 0  # values kept
    assert plain > 100 and populated < plain / 4
    _populate(_empty((0, 4), np.dtype(np.uint8), True))  # nothing to map: a no-op


@pytest.mark.parametrize("ring", [True, False])
def test_forked_workers_run_opencv_single_threaded(splits: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                   ring: bool) -> None:
    """Workers forked from a process whose OpenCV pool runs 2 threads (warmed by a warp) flip with OpenCV at one
    thread (the parent is set to one around the fork: a worker must not reconfigure the inherited pool), on the
    ring and the plain DataLoader path, for a first and a second loader (where a worker-side call hung); the
    parent's own count is back after each."""
    import cv2

    from shardkit import augment as A
    from shardkit.augment import cpu
    from shardkit.read.torch import RingLoader

    flip = cpu.flip_copy

    def single_threaded_flip(*args: Any) -> bool:
        if cv2.getNumThreads() != 1:
            raise RuntimeError(f"OpenCV at {cv2.getNumThreads()} threads in worker {os.getpid()}")
        return flip(*args)

    before = cv2.getNumThreads()
    cv2.setNumThreads(2)
    try:
        cv2.warpAffine(np.zeros((512, 512, 4), np.uint8), np.eye(2, 3) * 0.5, (512, 512))  # the pool's threads run
        monkeypatch.setattr(cpu, "flip_copy", single_threaded_flip)
        memory = None if ring else BufferReuse(shared_ring=False)
        for epochs in (2, 1):  # a second loader forks from the parent whose pool ran again in between
            loader = make_loader(splits["lmdb"], shardkit.EpochPlan(4, seed=1), num_workers=2, pin_memory=False,
                                 multiprocessing_context="fork", augment=A.parse("crop=200x200,hflip"),
                                 reuse_buffers=memory or False)
            assert isinstance(loader, RingLoader) is ring
            assert sum(len(images) for _ in range(epochs) for images, _ in loader) == epochs * 26
            assert cv2.getNumThreads() == 2
            cv2.warpAffine(np.zeros((512, 512, 4), np.uint8), np.eye(2, 3) * 0.5, (512, 512))
    finally:
        cv2.setNumThreads(before)


def test_spawned_workers_set_opencv_to_one_thread(splits: dict[str, Path]) -> None:
    """make_loader's workers run ``one_opencv_thread`` first: in a fresh (spawned) process it sets OpenCV's pool,
    not started yet, to one thread."""
    import multiprocessing

    from shardkit.read.torch import one_opencv_thread

    for memory in (False, BufferReuse(shared_ring=False)):
        loader = make_loader(splits["lmdb"], 4, num_workers=2, pin_memory=False, reuse_buffers=memory)
        assert loader.worker_init_fn is one_opencv_thread
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(one_opencv_thread, (0,)) == 1
