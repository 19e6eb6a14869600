"""OutputLock: one conversion per output folder; the kernel frees it however its holder ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardkit.errors import OutputError
from shardkit.files.lock import LOCK_NAME, OutputLock


def test_the_lock_names_its_holder_and_is_released_on_exit(tmp_path: Path) -> None:
    out = tmp_path / "out" / "deeper"
    with OutputLock(out):
        holder = json.loads((out / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(OutputError, match=f"another shardkit convert is writing here.*{os.getpid()}"), \
                OutputLock(out):
            pass
    with OutputLock(out):  # free again
        pass


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    code = ("import sys, os, signal; from shardkit.files.lock import OutputLock; "
            "lock = OutputLock(sys.argv[1]).__enter__(); print('locked', flush=True); os.kill(os.getpid(), 9)")
    child = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == "locked" and child.returncode == -9
    with OutputLock(tmp_path):
        pass


def test_an_output_under_a_file_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="cannot create the output folder") as info, \
            OutputLock(tmp_path / "file" / "out"):
        pass
    assert "\n" not in str(info.value)


# --- RemoteLock: when a lock on object storage is stale ------------------------------------------


def _remote_lock(ttl: float = 30.0):  # type: ignore[no-untyped-def]
    from shardkit.files.lock import RemoteLock

    return RemoteLock(None, ttl=ttl)  # type: ignore[arg-type]  # _stale reads no remote


def test_a_same_host_lock_whose_pid_was_reused_expires_after_its_ttl() -> None:
    """The holder died and its pid now belongs to another live process (here: this one): the heartbeat decides."""
    import socket
    import time

    body = {"host": socket.gethostname(), "pid": os.getpid(), "ttl": 30}
    lock = _remote_lock()
    assert lock._stale(body, {"LastModified": time.time() - 5}) is None  # a live heartbeat: held
    reason = lock._stale(body, {"LastModified": time.time() - 120})
    assert reason is not None and "no heartbeat for 120 s" in reason


def test_a_same_host_lock_whose_pid_is_dead_is_stale_at_once() -> None:
    import socket
    import time

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    body = {"host": socket.gethostname(), "pid": int(dead.stdout), "ttl": 30}
    reason = _remote_lock()._stale(body, {"LastModified": time.time()})
    assert reason is not None and "is dead" in reason


@pytest.mark.parametrize("claimed", [float("inf"), 1e300, "600", -5, True, None, float("nan")])
def test_a_lock_claiming_a_nonsense_ttl_expires_after_ours(claimed: object) -> None:
    import time

    body = {"host": "elsewhere", "pid": 1, "ttl": claimed}
    lock = _remote_lock(ttl=30)
    assert lock._stale(body, {"LastModified": time.time() - 10}) is None
    assert lock._stale(body, {"LastModified": time.time() - 60}) is not None


@pytest.mark.parametrize("pid", [0, -1, 2**70])
def test_a_lock_naming_an_impossible_pid_is_stale_not_a_crash(pid: int) -> None:
    import socket
    import time

    body = {"host": socket.gethostname(), "pid": pid, "ttl": 30}
    reason = _remote_lock()._stale(body, {"LastModified": time.time()})
    assert reason is not None and "is dead" in reason


@pytest.mark.parametrize("kind", ["folder", "fifo", "link"])
def test_a_lock_that_is_not_a_regular_file_is_one_line_naming_it(tmp_path: Path, kind: str) -> None:
    """A folder, FIFO or symlink named ``.shardkit.lock``: refused with the fix that helps (remove it), never a
    hang on the FIFO, never a write through the link."""
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    lock = tmp_path / LOCK_NAME
    if kind == "folder":
        lock.mkdir()
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.symlink_to(target)
    with pytest.raises(OutputError, match="output lock is not a regular file") as info, OutputLock(tmp_path):
        pass
    assert f"remove {lock}" in (info.value.fix or "")
    assert target.read_text() == "keep me"
