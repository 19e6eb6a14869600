"""Loader state on real CamVid: exact resume (same layout: every batch byte for byte), elastic resume across 1, 2
and 4 simulated ranks (every sample of every epoch once, augmented bit-identically), no replay, refusals."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardkit
from shardkit import augment as A
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import ResumeError, ShardkitError
from shardkit.read import sampling
from shardkit.read.dataset import Dataset
from shardkit.read.state import LoaderState, Progress

torch = pytest.importorskip("torch")
from shardkit.read.torch import CudaPrefetcher, make_loader  # noqa: E402

AUG = "scale=0.75:1.5,crop=48x64,hflip,rotate=10,jitter=0.2"


@pytest.fixture(scope="module")
def splits(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """CamVid train (123) and val (26) as npy at 90x120, 7 samples per shard; val again with 5 per shard (another
    dataset version of the same split)."""
    out = tmp_path_factory.mktemp("state")
    convert(ConvertConfig(camvid_root, out / "a", format="npy", size=(90, 120), splits=("train", "val"), workers=2,
                          quiet=True, shard_size=ShardSize(samples=7)))
    convert(ConvertConfig(camvid_root, out / "b", format="npy", size=(90, 120), splits=("val",), workers=1,
                          quiet=True, shard_size=ShardSize(samples=5)))
    return {"val": out / "a" / "val", "train": out / "a" / "train", "val-other": out / "b" / "val"}


Batch = tuple[list[int], bytes, bytes]


def _batch(b: Any) -> Batch:
    images, labels, idx = b
    return idx.tolist(), images.numpy().tobytes(), labels.numpy().tobytes()


def _loader(path: Path, plan: shardkit.EpochPlan, aug: str | None = AUG, **kw: Any) -> Any:
    return make_loader(path, plan, with_indices=True, layout="NHWC", pin_memory=False,
                       augment=A.parse(aug) if aug else None, **kw)


def _take(loader: Any, n: int) -> list[Batch]:
    """The first ``n`` batches of the loader's next pass (left there; run to its end when ``n`` is all of it)."""
    out: list[Batch] = []
    if n == 0:
        return out
    for b in loader:
        out.append(_batch(b))
        if len(out) == n < len(loader):
            break
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_same_layout_gives_every_batch_byte_for_byte(splits: dict[str, Path], workers: int) -> None:
    """Stopped after k batches (mid-epoch, at the epoch boundary, into the second epoch) and resumed from the state
    dict in a new loader: the batches that follow equal the uninterrupted run's, indices, images and labels."""
    plan = shardkit.EpochPlan(4, seed=7)
    kw: dict[str, Any] = {"num_workers": workers}
    if workers:
        kw["multiprocessing_context"] = "fork"
    full = _take(_loader(splits["val"], plan, **kw), 7) + _take(_loader(splits["val"], plan.replace(epoch=1), **kw), 7)
    assert len(full) == 14  # 26 samples, batches of 4: 7 per epoch
    for k in ([3, 7, 9] if workers else [0, 1, 3, 6, 7, 8, 13]):
        first = _loader(splits["val"], plan, **kw)
        got = _take(first, min(k, 7))
        if k > 7:
            got += _take(first, k - 7)
        state = first.state_dict()
        assert state["epoch"] == k // 7 and state["consumed"] == 4 * (k % 7)
        resumed = _loader(splits["val"], plan, **kw)
        resumed.load_state_dict(state)
        rest = [_batch(b) for b in resumed]
        if state["epoch"] == 0:
            rest += [_batch(b) for b in resumed]  # auto_epoch: the next pass is epoch 1 from its start
        assert got + rest == full, k


def _per_sample(ds: Dataset, aug: str | None, seed: int, epoch: int, order: Any) -> dict[int, tuple[bytes, bytes]]:
    """Each sample's augmented image and label bytes in ``epoch``, read one at a time by the core reader."""
    out = {}
    for i in sorted(set(int(i) for i in order)):
        if aug:
            images, labels = ds.augmented_batch(np.array([i]), A.parse(aug), seed=seed, epoch=epoch)
        else:
            images, labels = ds.batch(np.array([i]))
        out[i] = (images.tobytes(), labels.tobytes())
    return out


def _run_ranks(path: Path, plan: shardkit.EpochPlan, world: int, steps: int | None, state: dict[str, Any] | None,
               aug: str | None = AUG) -> tuple[list[Batch], dict[str, Any]]:
    """``world`` simulated ranks (the plan's rank/world_size), each resumed at ``state`` and taking ``steps``
    batches in lockstep (None: to the end of the epoch); their batches and the state, which every rank agrees on."""
    loaders = [_loader(path, plan.replace(rank=r, world_size=world), aug) for r in range(world)]
    batches: list[Batch] = []
    for lo in loaders:
        if state is not None:
            lo.load_state_dict(state)
        batches += _take(lo, len(lo) if steps is None else steps)
    states = [lo.state_dict() for lo in loaders]
    assert all(s == states[0] for s in states)  # ranks in lockstep agree on the global position
    return batches, states[0]


def _split_batches(batches: list[Batch], ds: Dataset) -> list[tuple[int, bytes, bytes]]:
    """Batches → one (index, image bytes, label bytes) per sample."""
    out = []
    for idx, images, labels in batches:
        im = np.frombuffer(images, np.uint8).reshape(len(idx), -1)
        lab = np.frombuffer(labels, ds.label_dtype).reshape(len(idx), -1)
        out += [(i, im[j].tobytes(), lab[j].tobytes()) for j, i in enumerate(idx)]
    return out


@pytest.mark.parametrize("sampling_mode", ["uniform", "class-balanced"])
def test_elastic_resume_2_then_4_then_1_ranks(splits: dict[str, Path], sampling_mode: str) -> None:
    """2 ranks stop mid-epoch, 4 ranks resume and stop again, 1 rank finishes: the epoch's samples are exactly
    the uninterrupted run's (each once; class-balanced: the same multiset of draws), each augmented bit-identically;
    the next epoch then starts from its beginning, batch for batch as uninterrupted."""
    ds = shardkit.open(splits["train"])
    plan = shardkit.EpochPlan(3, seed=11, sampling=sampling_mode)
    whole, after = _run_ranks(splits["train"], plan, 1, None, None)
    assert (after["epoch"], after["consumed"]) == (1, 0)
    want = Counter(i for b in whole for i in b[0])
    a, s1 = _run_ranks(splits["train"], plan, 2, 5, None)  # 2 * 5 batches of 3 = 30 samples
    assert (s1["epoch"], s1["consumed"]) == (0, 30)
    b, s2 = _run_ranks(splits["train"], plan, 4, 4, s1)  # + 4 * 4 * 3 = 48
    assert (s2["epoch"], s2["consumed"]) == (0, 78)
    c, s3 = _run_ranks(splits["train"], plan, 1, None, s2)
    assert (s3["epoch"], s3["consumed"]) == (1, 0)
    seen = _split_batches(a + b + c, ds)
    assert Counter(i for i, _, _ in seen) == want
    if sampling_mode == "uniform":
        assert sorted(want) == list(range(len(ds))) and set(want.values()) == {1}
    ref = _per_sample(ds, AUG, 11, 0, want)
    assert all((im, lab) == ref[i] for i, im, lab in seen)
    nxt, _ = _run_ranks(splits["train"], plan, 1, None, s3)
    assert nxt == _run_ranks(splits["train"], plan.replace(epoch=1), 1, None, None)[0]


def test_drop_last_with_another_global_batch_follows_the_stated_rule(splits: dict[str, Path],
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """drop_last, resumed mid-epoch with another global batch size: nothing consumed is read again, no sample twice,
    the rest is cut at the new size (fewer than one new global batch dropped), and a warning says so."""
    ds = shardkit.open(splits["train"])
    plan = shardkit.EpochPlan(4, seed=2, drop_last=True)
    a, s1 = _run_ranks(splits["train"], plan, 2, 3, None)  # 24 samples
    with caplog.at_level(logging.WARNING, logger="shardkit.read.state"):
        b, s2 = _run_ranks(splits["train"], plan.replace(batch_size=5), 4, None, s1)
    assert "global batch of 20 (saved with 8)" in caplog.text and "drops the last 19 of the 99" in caplog.text
    assert (s2["epoch"], s2["consumed"]) == (1, 0)
    seen = Counter(i for i, _, _ in _split_batches(a + b, ds))
    assert set(seen.values()) == {1} and len(ds) - len(seen) == 19
    order = sampling.epoch_indices(ds.shard_sizes, shardkit.EpochPlan(1, seed=2, shuffle_mode="global"))
    assert sorted(seen) == sorted(order[:len(ds) - 19].tolist())  # the dropped ones are the last of the order


def test_audit_random_interrupts_across_1_2_4_ranks(splits: dict[str, Path]) -> None:
    """Random stops over two epochs, each resumed under a random world size of 1, 2 or 4: every sample of every
    epoch is seen exactly once (plus the wrap-around padding the last world size adds at the epoch's end), every
    sample's bytes equal the uninterrupted run's."""
    ds = shardkit.open(splits["val"])
    plan = shardkit.EpochPlan(2, seed=5)
    ref = {e: _per_sample(ds, AUG, 5, e, range(len(ds))) for e in (0, 1)}
    rng = np.random.default_rng(0)
    for _trial in range(3):
        state: dict[str, Any] | None = None
        seen: dict[int, list[tuple[int, bytes, bytes]]] = {0: [], 1: []}
        world = 1
        while state is None or state["epoch"] < 2:
            world = int(rng.choice([1, 2, 4]))
            epoch = 0 if state is None else state["epoch"]
            left = len(ds) - (0 if state is None else state["consumed"])
            per_rank = sampling.num_batches(sampling.per_rank(left, world, False), 2, False)
            steps = int(rng.integers(1, per_rank + 1))
            batches, state = _run_ranks(splits["val"], plan, world, steps, state)
            seen[epoch] += _split_batches(batches, ds)
        for e in (0, 1):
            counts = Counter(i for i, _, _ in seen[e])
            assert sorted(counts) == list(range(len(ds)))
            assert sum(counts.values()) - len(ds) < 4  # only the last world size's padding repeats
            assert all((im, lab) == ref[e][i] for i, im, lab in seen[e])


def test_restore_reads_nothing_consumed(splits: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """O(1) restore: a resumed loader reads only the samples left (counted at the reader), none consumed."""
    ds = shardkit.open(splits["train"])
    plan = shardkit.EpochPlan(8, seed=1)
    reads: list[int] = []
    real = Dataset.batch

    def counted(self: Dataset, indices: Any, out: Any = None) -> Any:
        reads.extend(int(i) for i in indices)
        return real(self, indices, out)

    monkeypatch.setattr(Dataset, "batch", counted)
    first = _loader(ds, plan, None)
    _take(first, 10)
    state = first.state_dict()
    consumed = set(reads)
    reads.clear()
    resumed = _loader(ds, plan, None)
    resumed.load_state_dict(state)
    assert reads == []  # restoring read nothing
    _take(resumed, len(resumed))
    assert len(reads) == len(ds) - 80 and not set(reads) & consumed


def test_restore_at_sample_900000_of_a_million_costs_no_pass() -> None:
    """A 1M-sample plan restored at 900,000: the sampler hands the reader exactly the 100,000 positions left, the
    tail of the uninterrupted order, and none of the 900,000 consumed (reads are what the sampler hands over)."""
    sizes = [1000] * 1000
    s = sampling.EpochBatchSampler(sizes, shardkit.EpochPlan(500, seed=3, shuffle_mode="global"))
    progress = Progress(s, split="train", version=1, dataset="x")
    state = dict(progress.state_dict(), consumed=900_000)
    progress.load_state_dict(state)
    handed = [i for b in s for i in b]
    order = sampling.epoch_indices(sizes, shardkit.EpochPlan(500, seed=3, shuffle_mode="global"))
    assert len(handed) == 100_000 and sorted(handed) == sorted(order[900_000:].tolist())
    assert s.start == 0 and len(s) == 2000  # the next pass reads a whole epoch


def test_prefetcher_state_counts_what_it_yielded(splits: dict[str, Path]) -> None:
    """The CudaPrefetcher passes the state through, counting the batches it yielded, not those it took ahead."""
    plan = shardkit.EpochPlan(4, seed=9)
    pre = CudaPrefetcher(_loader(splits["val"], plan, None), device="cpu", normalize=False)
    it = iter(pre)
    got = [next(it)[2].tolist() for _ in range(2)]
    state = pre.state_dict()
    assert (state["epoch"], state["consumed"]) == (0, 8)
    again = CudaPrefetcher(_loader(splits["val"], plan, None), device="cpu", normalize=False)
    again.load_state_dict(state)
    rest = [b[2].tolist() for b in again]
    assert got + rest == [b[0] for b in _take(_loader(splits["val"], plan, None), 7)]


# ------------------------------------------------------------------------------------------------ refusals
def _state(path: Path, plan: shardkit.EpochPlan, aug: str | None = None) -> dict[str, Any]:
    lo = _loader(path, plan, aug)
    _take(lo, 2)
    return dict(lo.state_dict())


@pytest.mark.parametrize(("case", "words"), [
    ("version", ["dataset version 1 (", "this loader reads dataset version 1 ("]),
    ("split", ["from split train", "reads split val"]),
    ("augment", ["from augmentation none", "reads augmentation "]),
    ("seed", ["(4, True, 'uniform', 'global')", "(3, True, 'uniform', 'global')"]),
])
def test_a_state_of_another_dataset_split_augmentation_or_order_is_refused(splits: dict[str, Path], case: str,
                                                                           words: list[str]) -> None:
    plan = shardkit.EpochPlan(4, seed=3)
    other = {"version": _state(splits["val-other"], plan), "split": _state(splits["train"], plan),
             "augment": _state(splits["val"], plan), "seed": _state(splits["val"], plan.replace(seed=4))}[case]
    lo = _loader(splits["val"], plan, AUG if case == "augment" else None)
    with pytest.raises(ResumeError) as err:
        lo.load_state_dict(other)
    msg = str(err.value)
    assert isinstance(err.value, ValueError) and "\n" not in msg and all(w in msg for w in words), msg
    if case == "version":  # both content hashes named
        ours = lo.state_dict()["dataset"]
        assert other["dataset"] in msg and ours in msg and other["dataset"] != ours
    assert lo.state_dict()["consumed"] == 0  # nothing moved


@pytest.mark.parametrize("bad", [{"kind": "other"}, {"consumed": -1}, {"epoch": "1"}, {"shuffle": 1}])
def test_a_malformed_state_is_one_line(splits: dict[str, Path], bad: dict[str, Any]) -> None:
    plan = shardkit.EpochPlan(4)
    state = {**_state(splits["val"], plan), **bad}
    with pytest.raises(ShardkitError) as err:
        _loader(splits["val"], plan, None).load_state_dict(state)
    assert "\n" not in str(err.value) and "fix:" in str(err.value)


def test_state_is_small_and_plain(splits: dict[str, Path]) -> None:
    """The state is a flat dict of ints, strings and bools (JSON-able), the same size for any position."""
    import json

    plan = shardkit.EpochPlan(4)
    a, b = _state(splits["train"], plan), _loader(splits["train"], plan, None).state_dict()
    assert set(a) == set(b) and len(json.dumps(a)) < 400
    assert LoaderState.from_dict(json.loads(json.dumps(a))).consumed == 8


def _audit_script() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "audit_resume.py"
    spec = importlib.util.spec_from_file_location("audit_resume", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gloo_ranks_in_separate_processes_resume_2_then_4_then_1(splits: dict[str, Path]) -> None:
    """Real torch.distributed (gloo, one process per rank; scripts/audit_resume.py): 2 ranks take 3 batches, 4
    ranks resume and take 1, 1 rank finishes the epoch; every sample seen once, with the uninterrupted bytes."""
    audit = _audit_script()
    assert audit.audit(splits["val"], batch=2, seed=4, epochs=1, schedule=[(2, 3), (4, 1), (1, None)]) == []
    # the check itself finds a resume that replays: a state moved back by one global batch
    got, state = audit.segment(splits["val"], {"batch_size": 2, "seed": 4}, AUG, 2, 3, None)
    assert state["consumed"] == 12
    again, _ = audit.segment(splits["val"], {"batch_size": 2, "seed": 4}, AUG, 1, None, dict(state, consumed=8))
    assert len(set(i for i, _ in got) & set(i for i, _ in again)) == 4


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata 0.11 on torch 2.13
@pytest.mark.parametrize("workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_through_the_sampler_state(splits: dict[str, Path],
                                                                         workers: int) -> None:
    """torchdata's StatefulDataLoader over ShardkitTorchDataset and its sampler: its state_dict (which snapshots the
    sampler's state as each batch goes to a worker) restores a new loader to the rest of the epoch, byte for byte,
    with no fast-forward; a state of another augmentation is refused by the sampler."""
    tdl = pytest.importorskip("torchdata.stateful_dataloader")
    from shardkit.read.torch import ShardkitTorchDataset

    plan = shardkit.EpochPlan(4, seed=8)

    def loader(aug: str | None = AUG) -> Any:
        ds = ShardkitTorchDataset(splits["val"], layout="NHWC", with_indices=True,
                                  augment=A.parse(aug) if aug else None, seed=plan.seed)
        kw: dict[str, Any] = {"multiprocessing_context": "fork"} if workers else {}
        return tdl.StatefulDataLoader(ds, batch_size=None, sampler=ds.sampler(plan), num_workers=workers, **kw)

    full = [_batch(b) for b in loader()]
    first = loader()
    got = []
    for b in first:
        got.append(_batch(b))
        if len(got) == 3:
            break
    state = first.state_dict()
    main = state["_snapshot"]["_main_snapshot"] if workers else state
    assert main["_index_sampler_state"]["consumed"] == 12  # the sampler's own state, not workers' read-ahead
    again = loader()
    again.load_state_dict(state)
    assert got + [_batch(b) for b in again] == full
    other = loader(None)
    other.load_state_dict(state)
    with pytest.raises(ResumeError, match="augmentation"):
        next(iter(other))


def test_shard_then_buffer_order_resumes_with_the_same_layout_only() -> None:
    """Shard-then-buffer order (each rank its own stream and buffer): resumed with the same world size and batch
    size, each rank reads exactly its uninterrupted batches that follow; another world size is refused in one line."""
    sizes = [7, 2, 3, 4, 4, 6, 9]

    def ranks(world: int, batch: int = 3) -> list[sampling.EpochBatchSampler]:
        out = []
        for r in range(world):
            s = sampling.EpochBatchSampler(sizes, shardkit.EpochPlan(batch, seed=5, rank=r, world_size=world,
                                                                     shuffle_mode="buffer", buffer_size=4))
            s.progress = Progress(s, split="train", version=1, dataset="x")
            out.append(s)
        return out

    full = [[b.tolist() for b in s.batches()] for s in ranks(2)]
    first = ranks(2)
    for s in first:
        next(iter(s))
        it = iter(s)
        next(it), next(it)
    state = first[0].state_dict()
    assert state["consumed"] == 2 * 3 * 2 and state == first[1].state_dict()
    resumed = ranks(2)
    for s, want in zip(resumed, full, strict=True):
        s.load_state_dict(state)
        assert [b.tolist() for b in s.batches()] == want[2:]
    for other in (ranks(4)[0], ranks(2, batch=4)[0]):
        with pytest.raises(ResumeError, match="resumes only with the same ones") as err:
            other.load_state_dict(state)
        assert "\n" not in str(err.value)
