"""OutputLock: one conversion per output folder; the kernel frees it however its holder ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardkit.errors import OutputError
from shardkit.lock import LOCK_NAME, OutputLock


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
    code = ("import sys, os, signal; from shardkit.lock import OutputLock; "
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
