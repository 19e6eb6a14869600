"""The convert progress bar moves once per sample, in this process and from worker processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardkit.conversion import pool
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.support.progress import SampleCounter, worker_tick


class Bar:
    """A stand-in for tqdm that records every update."""

    disable = False

    def __init__(self) -> None:
        self.updates: list[int] = []

    def update(self, n: int) -> None:
        self.updates.append(n)

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_counter_slots_are_shared_between_opened_copies_and_settle_ends_at_the_total() -> None:
    bar = Bar()
    with SampleCounter(3, bar) as counter:
        tick = worker_tick(counter.ref, 1)  # what a worker process opens
        assert tick is not None
        for _ in range(5):
            tick()
        counter._move()
        assert sum(bar.updates) == 5
        counter.settle(1, 7)  # the task ended with 7 samples (e.g. 2 ticks not yet seen)
        counter.settle(0, 2)
        for _ in range(3):
            tick()  # late ticks of a settled slot never count twice
        counter._move()
        assert sum(bar.updates) == 9
    assert not Path(counter.path).exists()
    assert not list(Path("/dev/shm").glob("shardkit-progress-*"))  # unlinked from the start (Linux)


def test_a_finished_counter_file_gives_workers_no_tick() -> None:
    with SampleCounter(1, Bar()) as counter:
        ref = counter.ref
    with open(__file__, "rb") as other:  # the freed fd number now names another file: never written to
        assert worker_tick(ref, 0) is None
        assert other.fileno() >= 0
    assert worker_tick(None, 0) is None


@pytest.mark.parametrize("workers", [1, 2])
def test_convert_moves_the_bar_per_sample(camvid_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          workers: int) -> None:
    bar = Bar()
    monkeypatch.setattr(pool, "progress_bar", lambda total, quiet: bar)
    ticks: list[int] = []
    real = SampleCounter.settle

    def settle(self: SampleCounter, slot: int, final: int) -> None:
        ticks.append(int(self._slots.counts[slot]))  # what the worker counted itself, before settling
        real(self, slot, final)

    monkeypatch.setattr(SampleCounter, "settle", settle)
    cfg = ConvertConfig(camvid_root, tmp_path / "out", size=(96, 128), splits=("val",), workers=workers,
                        shard_size=ShardSize(samples=8))
    convert(cfg)
    assert sum(bar.updates) == 26  # the shared CamVid val split, every sample once
    assert sum(ticks) == 26  # each counted, one tick per sample, by the process that wrote it
    assert len(ticks) >= 2  # several shards, each settled
