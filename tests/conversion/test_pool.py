"""The local worker pool: results in plan order, and a worker that dies is an error, never a hang."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from shardkit.conversion import pool
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import WorkerError


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

    monkeypatch.setattr("shardkit.conversion.pipeline.run_tasks", run_and_kill)
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

    import shardkit.conversion.pipeline as pipeline

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

    # CamVid train symlinked 4x under new names: a run long enough (~500 samples) that a loaded machine
    # cannot finish it before the test has seen its workers or its first temporary file. Not hard links: a link
    # changes the shared file's ctime, which a conversion of it running beside this test takes for an edit.
    src = tmp_path / "src"
    for folder in ("train", "trainannot"):
        (src / folder).mkdir(parents=True)
        for f in sorted((camvid_root / folder).iterdir()):
            for k in range(4):
                (src / folder / f"{k}{f.name}").symlink_to(f)
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


# --- nothing to do: the empty-list cases (issue 24, defect 5) -------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_a_tfrecord_rerun_with_nothing_to_rewrite_succeeds(camvid_root: Path, tmp_path: Path, workers: int) -> None:
    """TFRecord writes in a subprocess even with one worker (``isolate``): an unchanged re-run has no task for
    it, and must reuse every shard instead of failing on the first task of an empty list."""
    cfg = ConvertConfig(camvid_root, tmp_path / "out", format="tfrecord", size=(64, 96), splits=("val",),
                        workers=workers, quiet=True, shard_size=ShardSize(samples=13))
    first = convert(cfg)
    manifest = (tmp_path / "out" / "val" / "manifest.json").read_bytes()
    again = convert(cfg)
    assert again.samples == first.samples == 26
    assert again.reused == again.shards == first.shards
    assert (tmp_path / "out" / "val" / "manifest.json").read_bytes() == manifest
    assert "nothing changed" in again.line()


def test_a_rerun_after_every_shard_was_published_writes_the_manifest(camvid_root: Path, tmp_path: Path) -> None:
    """A run that failed after publishing every shard but before its manifest (here: the manifest removed) is
    finished by a re-run that has no shard left to write."""
    cfg = ConvertConfig(camvid_root, tmp_path / "out", format="tfrecord", size=(64, 96), splits=("val",),
                        workers=1, quiet=True, shard_size=ShardSize(samples=13))
    first = convert(cfg)
    manifest = tmp_path / "out" / "val" / "manifest.json"
    before = manifest.read_bytes()
    manifest.unlink()
    again = convert(cfg)
    assert again.reused == again.shards == first.shards and again.samples == 26
    assert manifest.read_bytes() == before


@pytest.mark.parametrize(("backend", "isolate"), [("local", False), ("local", True), ("dask", False)])
def test_run_tasks_with_no_task_starts_nothing(backend: str, isolate: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pool(*args: object, **kwargs: object) -> None:
        raise AssertionError("a pool was started for no task")

    monkeypatch.setattr("joblib.executor.get_memmapping_executor", no_pool)
    monkeypatch.setattr(pool, "_DaskClient", no_pool)
    seen: list[object] = []
    assert pool.run_tasks([], None, workers=2, quiet=True, on_result=seen.append,  # type: ignore[arg-type]
                          isolate=isolate, backend=backend) == []
    assert seen == []
    assert list(pool._iterate([], None, 1, True, None)) == []  # type: ignore[arg-type]


def test_an_unknown_backend_is_refused_even_with_no_task() -> None:
    with pytest.raises(WorkerError, match="unknown backend"):
        pool.run_tasks([], None, workers=1, backend="spark")  # type: ignore[arg-type]


@pytest.mark.parametrize("exc", [TimeoutError(), OSError(), ValueError("\n\n")])
def test_an_error_without_text_is_reported_by_its_type(exc: BaseException) -> None:
    """``str(TimeoutError())`` is empty: the one-line report must not index its (absent) first line."""

    class Distributed:
        class Client:
            def __init__(self, *args: object, **kwargs: object) -> None:
                raise exc

    with pytest.raises(WorkerError, match=rf"cannot reach the Dask scheduler at tcp://x:1 \({type(exc).__name__}\)"):
        pool._DaskClient(Distributed, "tcp://x:1", 1, 1).__enter__()
    assert pool._first_line(RuntimeError("first\nsecond"), 3) == "fir"


@pytest.mark.parametrize("fmt", ["npy", "tfrecord"])
def test_a_shard_whose_every_sample_is_skipped_converts_and_reruns(camvid_root: Path, tmp_path: Path,
                                                                   fmt: str) -> None:
    """The other empty list: a shard with no sample written (every image unreadable, ``--on-error skip``)."""
    from shardkit.verify import verify_split

    label = sorted((camvid_root / "valannot").iterdir())[0]
    for folder in ("train", "trainannot"):
        (tmp_path / "in" / folder).mkdir(parents=True)
    for k in range(2):
        (tmp_path / "in" / "train" / f"a{k}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
        (tmp_path / "in" / "trainannot" / f"a{k}.png").symlink_to(label)  # no hard link: see above
    cfg = ConvertConfig(tmp_path / "in", tmp_path / "out", format=fmt, size=(64, 96), workers=1, quiet=True,
                        on_error="skip")
    first = convert(cfg)
    assert first.samples == 0 and len(first.skipped) == 2
    again = convert(cfg)
    assert again.samples == 0 and again.reused == again.shards == first.shards
    assert verify_split(tmp_path / "out" / "train").ok


def test_a_killed_parent_leaves_no_leaked_semlock_warning_and_no_semaphores(camvid_root: Path,
                                                                            tmp_path: Path) -> None:
    """SIGKILL the converting parent while its workers run: loky's resource tracker removes the pool's
    semaphores and memory-mapping folders, and (before the fix) printed a 'leaked semlock objects' warning
    for each kind, lines after the shell's 'Killed'."""
    import subprocess
    import sys
    import time

    import psutil

    proc = subprocess.Popen([sys.executable, "-m", "shardkit", "convert", str(camvid_root), str(tmp_path / "out"),
                             "--size", "360x480", "--workers", "2", "--shard-size", "8", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})

    def workers() -> int:
        try:
            return sum("popen_loky" in " ".join(c.cmdline()) for c in psutil.Process(proc.pid).children())
        except psutil.Error:
            return 0

    deadline = time.monotonic() + 120
    while workers() < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the workers are converting
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    output, _ = proc.communicate(timeout=120)  # to the end: the resource tracker holds the pipe until it exits
    assert proc.returncode == -signal.SIGKILL
    assert "leaked" not in output and "Traceback" not in output, output
    left = [p.name for p in Path("/dev/shm").iterdir()  # semaphores and folders removed all the same
            if p.name.startswith((f"sem.loky-{proc.pid}-", f"joblib_memmapping_folder_{proc.pid}_"))]
    assert not left
