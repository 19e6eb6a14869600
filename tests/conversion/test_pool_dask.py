"""The Dask backend: same shard tasks on a real Dask cluster, byte-identical to the local pool.

Every cluster here is real and listens on loopback only: a ``distributed.LocalCluster`` of
worker processes, and a scheduler + workers started as separate ``dask`` processes.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import distributed  # the dask extra is part of the dev extra: CI runs these tests, never skips them
import pytest
from click.testing import CliRunner

import shardkit.conversion.pipeline as pipeline
from shardkit.cli import main
from shardkit.conversion import pool
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import DecodeError, WorkerError
from shardkit.files.splitfiles import TMP_MARK
from shardkit.store.records import content_digest
from tests.sample_records import records

SIZE = (352, 480)
SHARD = 5
SPLIT = "val"
BOOT_TIMEOUT = 60.0

# Loaded into each worker process of the kill test (a Dask preload, so no hook in shardkit itself):
# every sample takes 0.2 s longer, and each shard attempt's start and end are logged with the worker's pid.
SLOW_PRELOAD = """
import os, time
import shardkit.conversion.pool as p
import shardkit.conversion.worker as w

LOG = {log!r}
if not hasattr(w, "_unslowed"):  # a preload may run more than once in a process: patch once
    w._unslowed = (w.process_sample, p.convert_shard)

def _note(what, task):
    with open(LOG, "a") as fh:
        fh.write(f"{{what}} {{os.getpid()}} {{task.stem}}\\n")

def process_sample(pair, ctx, *rest):
    time.sleep(0.2)
    return w._unslowed[0](pair, ctx, *rest)

def convert_shard(task, ctx):
    _note("start", task)
    result = w._unslowed[1](task, ctx)
    _note("end", task)
    return result

w.process_sample, p.convert_shard = process_sample, convert_shard
"""


def config(root: Path, out: Path, **kw: Any) -> ConvertConfig:
    return ConvertConfig(root, out, size=SIZE, splits=(SPLIT,), shard_size=ShardSize(samples=SHARD),
                         quiet=True, **kw)


def split_digests(out: Path) -> dict[str, str]:
    """sha256 of every file of the split: shards, manifest, per-shard records (without their files' stats),
    fingerprint cache."""
    files = sorted(p for p in (out / SPLIT).iterdir() if p.is_file())
    return {p.name: content_digest(p) for p in files}


def assert_same_as_local(out: Path, local: Path) -> None:
    got, want = split_digests(out), split_digests(local)
    assert not [n for n in got if TMP_MARK in n], "temporary files left behind"
    assert sorted(got) == sorted(want)
    assert got == want, [n for n in want if got.get(n) != want[n]]
    manifest = json.loads((out / SPLIT / "manifest.json").read_text(encoding="utf-8"))
    assert manifest == json.loads((local / SPLIT / "manifest.json").read_text(encoding="utf-8"))


def assert_every_sample_once(out: Path, root: Path) -> None:
    manifest = json.loads((out / SPLIT / "manifest.json").read_text(encoding="utf-8"))
    keys = [s["key"] for s in records(out / SPLIT, manifest)]
    expected = sorted(p.relative_to(root).as_posix() for p in (root / SPLIT).iterdir() if p.suffix == ".png")
    assert len(keys) == len(set(keys)) == manifest["num_samples"] == len(expected)
    assert sorted(keys) == expected
    assert sum(s["num_samples"] for s in manifest["shards"]) == len(keys)


@pytest.fixture(scope="module")
def local_out(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the same conversion on the local process pool."""
    out = tmp_path_factory.mktemp("local") / "out"
    summary = convert(config(camvid_root, out, workers=2))
    assert summary.shards >= 5 and summary.samples == 26
    return out


def test_local_cluster_is_byte_identical_to_local_pool(
    camvid_root: Path, local_out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, int]] = []
    original = pipeline.publish_files

    def spy(result: Any) -> Any:  # the on_result path: what the progress bar counts
        seen.append((result.index, result.num_samples))
        return original(result)

    monkeypatch.setattr(pipeline, "publish_files", spy)
    out = tmp_path / "out"
    summary = convert(config(camvid_root, out, workers=2, backend="dask"))  # starts a 2-process LocalCluster
    assert summary.samples == 26 and summary.samples_per_second > 0
    assert sorted(i for i, _ in seen) == list(range(summary.shards))  # each shard reported exactly once
    assert sum(n for _, n in seen) == 26
    assert_same_as_local(out, local_out)
    assert_every_sample_once(out, camvid_root)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate one process we started; kill it if it does not go within a bound."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def dask_cli(*args: str) -> list[str]:
    """The ``dask`` command of this interpreter's environment."""
    return [sys.executable, "-m", "dask", *args]


def read_address(sched_file: Path, scheduler: subprocess.Popen[bytes]) -> str:
    """The scheduler's address from its scheduler file, once that is complete (bounded wait)."""
    deadline = time.monotonic() + BOOT_TIMEOUT
    while True:
        assert scheduler.poll() is None, "dask scheduler exited"
        assert time.monotonic() < deadline, "dask scheduler did not start"
        try:
            return str(json.loads(sched_file.read_text(encoding="utf-8"))["address"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)


def test_cli_on_separately_started_scheduler_and_workers(
    camvid_root: Path, local_out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sched_file = tmp_path / "scheduler.json"
    elsewhere = tmp_path / "worker-cwd"  # the workers' working folder is not the client's
    elsewhere.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    logs = [(tmp_path / f"{name}.log").open("wb") for name in ("scheduler", "workers")]
    try:
        procs.append(subprocess.Popen(
            dask_cli("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                     "--scheduler-file", str(sched_file)),
            cwd=elsewhere, stdout=logs[0], stderr=subprocess.STDOUT))
        address = read_address(sched_file, procs[0])
        assert address.startswith("tcp://127.0.0.1:")
        with monkeypatch.context() as mp:  # a scheduler without workers: a one-line error, not a hang
            mp.setattr(pool, "CONNECT_TIMEOUT", 1.0)
            with pytest.raises(WorkerError, match="no workers"):
                convert(config(camvid_root, tmp_path / "no-workers", backend="dask", scheduler=address))
        procs.append(subprocess.Popen(
            dask_cli("worker", "--scheduler-file", str(sched_file), "--nworkers", "2", "--nthreads", "1",
                     "--no-dashboard", "--host", "127.0.0.1"),
            cwd=elsewhere, stdout=logs[1], stderr=subprocess.STDOUT))
        with distributed.Client(address, timeout=BOOT_TIMEOUT, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=BOOT_TIMEOUT)

        monkeypatch.chdir(tmp_path)  # a relative output path: workers must still write to the client's folder
        result = CliRunner().invoke(main, [
            "convert", str(camvid_root), "out", "--size", "352x480", "--split", SPLIT,
            "--shard-size", str(SHARD), "--backend", "dask", "--scheduler", address, "--quiet",
        ])
        assert result.exit_code == 0, result.output
        assert_same_as_local(tmp_path / "out", local_out)
        assert_every_sample_once(tmp_path / "out", camvid_root)
        assert not (elsewhere / "out").exists()
    finally:
        for proc in reversed(procs):
            stop(proc)
        for fh in logs:
            fh.close()


def attempts_in_flight(log: Path) -> list[tuple[str, str]]:
    """(pid, shard stem) of every worker process in the middle of a shard, the latest to start last."""
    running: dict[str, str] = {}
    for what, pid, stem in (line.split() for line in log.read_text(encoding="utf-8").splitlines()):
        running.pop(pid, None)
        if what == "start":
            running[pid] = stem
    return list(running.items())


def test_worker_killed_mid_run_loses_and_duplicates_nothing(
    camvid_root: Path, local_out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts = tmp_path / "attempts.log"
    preload = tmp_path / "slow_preload.py"
    preload.write_text(SLOW_PRELOAD.format(log=str(attempts)), encoding="utf-8")
    killed: list[tuple[str, str]] = []
    original = pipeline.publish_files

    def kill_once(result: Any) -> Any:
        """After the first finished shard: SIGKILL a worker process in the middle of another shard."""
        if not killed:
            deadline = time.monotonic() + 10
            while not (running := attempts_in_flight(attempts)):
                assert time.monotonic() < deadline, "no worker busy: too short a run to kill a worker mid-run"
                time.sleep(0.02)
            pid, stem = running[-1]  # the latest started: furthest from finishing before the signal lands
            os.kill(int(pid), signal.SIGKILL)
            killed.append((pid, stem))
        return original(result)

    monkeypatch.setattr(pipeline, "publish_files", kill_once)
    out = tmp_path / "out"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0", preload=[str(preload)]) as cluster:
        summary = convert(config(camvid_root, out, backend="dask", scheduler=cluster.scheduler_address))

    assert killed and summary.samples == 26
    assert_same_as_local(out, local_out)  # same bytes, same manifest; lost attempts' temp files removed
    assert_every_sample_once(out, camvid_root)
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 0, result.output
    pid, stem = killed[0]
    lines = [line.split() for line in attempts.read_text(encoding="utf-8").splitlines()]
    assert ["end", pid, stem] not in lines  # the killed attempt never finished ...
    assert any(what == "end" and p != pid and s == stem for what, p, s in lines)  # ... another one redid it


def test_unreachable_scheduler_is_one_line_worker_error(
    camvid_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool, "CONNECT_TIMEOUT", 1.0)
    address = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(WorkerError) as err:
        convert(config(camvid_root, tmp_path / "out", backend="dask", scheduler=address))
    message = str(err.value)
    assert "\n" not in message and address in message and "fix:" in message
    assert not [p for p in (tmp_path / "out" / SPLIT).iterdir() if p.suffix == ".npy"]


class FakeClient:
    """Just enough of ``distributed.Client`` for the pre-flight check."""

    def __init__(self, answers: dict[str, tuple[bool, str]]) -> None:
        self.answers = answers

    def wait_for_workers(self, n: int, timeout: float) -> None:
        return None

    def run(self, fn: Any, paths: list[str]) -> dict[str, tuple[bool, str]]:
        assert all(Path(p).exists() for p in paths)  # the probe files exist while workers look
        return self.answers

    def ncores(self) -> dict[str, int]:
        return dict.fromkeys(self.answers, 1)


def test_workers_that_cannot_see_the_folders_are_refused(tmp_path: Path) -> None:
    from shardkit import __version__

    with pytest.raises(WorkerError, match="cannot see") as err:
        pool._check_workers(distributed, FakeClient({"tcp://127.0.0.1:1": (True, __version__),
                                                     "tcp://127.0.0.1:2": (False, __version__)}),
                            {tmp_path}, tmp_path)
    assert "same path" in str(err.value)
    assert not list(tmp_path.iterdir())  # the probe file is gone
    with pytest.raises(WorkerError, match=r"shardkit 0\.0\.0"):
        pool._check_workers(distributed, FakeClient({"tcp://127.0.0.1:1": (True, "0.0.0")}),
                            {tmp_path}, tmp_path)


def test_unexpected_worker_errors_come_back_as_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything but a ShardkitError becomes text on the worker, so it always pickles back (no hang)."""
    task = SimpleNamespace(split=SPLIT, stem="00003-0123456789ab")

    def explode(task: Any, ctx: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded\nmore")

    monkeypatch.setattr(pool, "convert_shard", explode)
    with pytest.raises(WorkerError) as err:
        pool._convert_on_dask(task, None)  # type: ignore[arg-type]
    assert str(err.value).startswith("shard val/00003-0123456789ab failed on a Dask worker: RecursionError")
    assert "\n" not in str(err.value)
    assert pickle.loads(pickle.dumps(err.value)).args == err.value.args

    def bad_input(task: Any, ctx: Any) -> Any:
        raise DecodeError("cannot decode", path="x.png", fix="replace it")

    monkeypatch.setattr(pool, "convert_shard", bad_input)
    with pytest.raises(DecodeError, match=r"x\.png: cannot decode"):
        pool._convert_on_dask(task, None)  # type: ignore[arg-type]
