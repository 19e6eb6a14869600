"""The local worker pool: results in plan order, and a worker that dies is an error, never a hang."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from shardkit import pool
from shardkit.config import ConvertConfig, ShardSize
from shardkit.errors import WorkerError
from shardkit.pipeline import convert


def worker_pids() -> list[int]:
    """Loky worker processes of this process (not its resource tracker)."""
    me = str(os.getpid())
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        cmdline = (status.parent / "cmdline").read_bytes() if status.parent.exists() else b""
        if fields.get("PPid", "").strip() == me and b"popen_loky" in cmdline:
            pids.append(int(status.parent.name))
    return pids


def test_a_killed_worker_is_reported_not_a_hang(camvid_root: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    real = pool.run_tasks

    def run_and_kill(*args, **kwargs):  # type: ignore[no-untyped-def]
        inner = kwargs.get("on_result")
        killed = []

        def on_result(result):  # type: ignore[no-untyped-def]
            if not killed:  # after the first shard, SIGKILL every worker process (as the OOM killer would)
                for pid in worker_pids():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            if inner is not None:
                inner(result)

        kwargs["on_result"] = on_result
        return real(*args, **kwargs)

    monkeypatch.setattr("shardkit.pipeline.run_tasks", run_and_kill)
    cfg = ConvertConfig(camvid_root, tmp_path / "out", size=(352, 480), splits=("val",), workers=2, quiet=True,
                        shard_size=ShardSize(samples=2))
    with pytest.raises(WorkerError, match="worker process died"):
        convert(cfg)
    monkeypatch.undo()
    again = convert(cfg)  # a fresh pool; the shards finished before the kill are reused
    assert again.samples == 26 and again.reused >= 1


def test_largest_shards_are_dispatched_first(camvid_root: Path, tmp_path: Path) -> None:
    seen: list[int] = []
    real = pool.run_tasks

    def record(tasks, ctx, **kwargs):  # type: ignore[no-untyped-def]
        inner = kwargs.pop("on_result")
        sizes = {(t.split, t.index): len(t.samples) for t in tasks}

        def on_result(result):  # type: ignore[no-untyped-def]
            seen.append(sizes[(result.split, result.index)])
            inner(result)

        return real(tasks, ctx, on_result=on_result, **kwargs)

    import shardkit.pipeline as pipeline

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "run_tasks", record)
        convert(ConvertConfig(camvid_root, tmp_path / "out", format="npy", size=(64, 96), splits=("train",),
                              shard_size=ShardSize(samples=16), workers=1, quiet=True))
    assert len(set(seen)) > 1  # content-defined cuts: shards of different sizes
    assert seen == sorted(seen, reverse=True)


@pytest.mark.parametrize("when", ["workers starting", "shards being written"])
def test_ctrl_c_is_one_line_and_leaves_no_temporary_files(camvid_root: Path, tmp_path: Path, when: str) -> None:
    """Ctrl-C reaches the whole process group: the workers must not print tracebacks over the one line
    (not even while they are still importing), and no temporary shard file may stay behind."""
    import subprocess
    import sys
    import time

    # CamVid train hard-linked 4x under new names: a run long enough (~500 samples) that a loaded machine
    # cannot finish it before the test has seen its workers or its first temporary file
    src = tmp_path / "src"
    for folder in ("train", "trainannot"):
        (src / folder).mkdir(parents=True)
        for f in sorted((camvid_root / folder).iterdir()):
            for k in range(4):
                os.link(f, src / folder / f"{k}{f.name}")
    out = tmp_path / "out"

    def as_a_terminal_starts_it() -> None:  # SIGINT handled and not blocked, whatever this test process inherited
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    mine = {k: v.strip() for k, v in (line.split(":", 1) for line in Path("/proc/self/status").read_text()
                                       .splitlines() if line.startswith(("SigBlk", "SigIgn")))}
    proc = subprocess.Popen([sys.executable, "-m", "shardkit", "convert", str(src), str(out), "--size",
                             "360x480", "--workers", "2", "--shard-size", "16"], start_new_session=True,
                            preexec_fn=as_a_terminal_starts_it,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    if when == "workers starting":
        import psutil  # (comes with dask.distributed)

        def ignoring_sigint() -> bool:  # the parent ignores SIGINT only while it starts the workers
            status = Path(f"/proc/{proc.pid}/status").read_text()
            return bool(int(status.split("SigIgn:")[1].split()[0], 16) & (1 << (signal.SIGINT - 1)))

        def is_worker(child: psutil.Process) -> bool:
            try:
                return "popen_loky" in " ".join(child.cmdline())
            except psutil.NoSuchProcess:  # a short-lived helper process that exited meanwhile
                return False

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and (
                sum(map(is_worker, psutil.Process(proc.pid).children())) < 2 or ignoring_sigint()):
            time.sleep(0.002)  # until both workers exist
        time.sleep(0.2)  # Python is up in them, they are importing numpy, OpenCV …
    else:
        deadline = time.monotonic() + 120
        while (not any(".tmp-" in p.name for p in out.rglob("*")) and time.monotonic() < deadline
               and proc.poll() is None):
            time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, f"{output}\n(the test process's signal masks: {mine})"
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert output.splitlines()[-1].startswith("interrupted;")
    time.sleep(0.5)  # a surviving worker would keep writing: give it the chance to show
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]
    assert not list(out.rglob("manifest.json"))
