"""CudaPrefetcher's CUDA path on converted real data: same results as the CPU path, no torn batches.

These need a CUDA GPU, so they skip in CI (which has none) and are run on a GPU machine:
``python -m pytest tests/read/test_torch_cuda.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert

torch = pytest.importorskip("torch")
from shardkit.read.torch import CudaPrefetcher, make_loader  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CROP = (352, 480)


@pytest.fixture(scope="module")
def split(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CamVid train as LMDB: 123 samples, 16 per shard."""
    out = tmp_path_factory.mktemp("cuda")
    convert(ConvertConfig(camvid_root, out, format="lmdb", size=CROP, splits=("train",), workers=2, quiet=True,
                          shard_size=ShardSize(samples=16)))
    return out / "train"


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("labels", ["ids", "onehot", "float_onehot"])
def test_cuda_path_gives_what_the_cpu_path_gives(split: Path, layout: str, labels: str) -> None:
    loader = make_loader(split, shardkit.EpochPlan(8, shuffle=False), layout=layout, with_indices=True)
    cpu = list(CudaPrefetcher(loader, device="cpu", labels=labels))
    gpu = [tuple(t.cpu() for t in batch) for batch in CudaPrefetcher(loader, device="cuda", labels=labels)]
    assert len(gpu) == len(cpu) == len(loader)
    for (gx, gy, gi), (cx, cy, ci) in zip(gpu, cpu, strict=True):
        assert torch.equal(gi, ci)
        assert gx.dtype == cx.dtype == torch.float32 and gx.shape == cx.shape
        torch.testing.assert_close(gx, cx, rtol=1e-6, atol=1e-5)
        assert gy.dtype == cy.dtype and torch.equal(gy, cy)  # labels bit-exact


@pytest.mark.parametrize("reuse_buffers", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_batches_stay_whole_while_the_gpu_lags_behind_the_host(split: Path, workers: int,
                                                               reuse_buffers: bool) -> None:
    """The loaders refill a few pinned buffers; copies queued behind GPU work must still read their own batch.

    A ~0.5 s sleep kernel on the current stream holds back the side stream (it waits for the current
    stream when iteration starts), so without the prefetcher's wait the host would refill the pinned
    buffers several times before the first copy runs.
    """
    core = shardkit.open(split)
    loader = make_loader(split, shardkit.EpochPlan(8, shuffle=True), num_workers=workers, with_indices=True,
                         layout="NHWC", pin_memory=True,
                         reuse_buffers=reuse_buffers)  # the reused (pinned) buffers matter most
    prefetcher = CudaPrefetcher(loader, device="cuda", labels="ids", normalize=False)
    torch.cuda._sleep(int(1e9))
    got = [(x.clone(), y.clone(), idx.clone()) for x, y, idx in prefetcher]  # nothing here waits for the GPU
    torch.cuda.synchronize()
    assert sum(len(idx) for _, _, idx in got) == len(core)
    for x, y, idx in got:
        images, ids = core.batch(idx.cpu().numpy())
        assert np.array_equal(x.cpu().numpy(), images), "image batch torn: its pinned buffer was refilled"
        assert np.array_equal(y.cpu().numpy(), ids.astype(np.int64))


def test_every_sample_once_per_epoch_with_workers_forked_each_epoch(split: Path) -> None:
    core = shardkit.open(split)
    loader = make_loader(split, shardkit.EpochPlan(8, shuffle=True), num_workers=2, persistent_workers=False,
                         with_indices=True, multiprocessing_context="fork")
    prefetcher = CudaPrefetcher(loader, device="cuda", labels="onehot")
    orders = []
    for _ in range(2):
        order = []
        for _x, y, idx in prefetcher:
            assert y.is_cuda and y.dtype == torch.uint8
            order.extend(idx.tolist())
        assert sorted(order) == list(range(len(core)))
        orders.append(order)
    assert orders[0] != orders[1], "the epoch advanced between passes"


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shardkit-prefetch"]


def test_a_loader_error_reaches_the_caller_and_the_thread_ends(split: Path) -> None:
    core = shardkit.open(split)

    def failing() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for start in (0, 8):
            images, ids = core.batch(np.arange(start, start + 8))
            yield torch.from_numpy(images), torch.from_numpy(ids)
        raise OSError("shard vanished")

    seen = 0
    with pytest.raises(OSError, match="shard vanished"):
        for _ in CudaPrefetcher(failing(), device="cuda", normalize=False):
            seen += 1
    assert seen == 2
    assert not _prefetch_threads()


def test_leaving_the_loop_early_stops_the_thread(split: Path) -> None:
    loader = make_loader(split, shardkit.EpochPlan(8, shuffle=False))
    prefetcher = CudaPrefetcher(loader, device="cuda")
    for step, _batch in enumerate(prefetcher):
        if step == 1:
            break
    assert not _prefetch_threads()
    assert sum(1 for _ in prefetcher) == len(loader), "a new pass starts from the first batch"
