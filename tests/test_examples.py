"""examples/: the tutorial script runs end to end on the real CamVid subset, a few steps per framework, on the CPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import cv2
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_camvid_tutorial_runs_a_few_steps(camvid_root: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERAS_BACKEND": "torch", "CUDA_VISIBLE_DEVICES": "",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "camvid_tutorial.py"), str(camvid_root),
                           str(tmp_path), "--steps", "2", "--size", "96x128", "--crop", "64x96", "--workers", "0",
                           "--batch-size", "4"], capture_output=True, text=True, env=env, timeout=880, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "ignore index 11 (Unlabelled)" in out  # shardkit info ran on the converted split
    for name in ("torch", "keras"):
        m = re.search(rf"^{name}: 2 steps in [0-9.]+ s, last loss ([0-9.]+); val pixel accuracy ([0-9.]+) %", out,
                      re.MULTILINE)
        assert m, out[-2000:]
        assert 0 < float(m.group(1)) < 10 and 0 <= float(m.group(2)) <= 100
    assert "keras step 2 (shardkit epoch 0)" in out
    for picture in ("sample.png", "augmented.png"):
        assert cv2.imread(str(tmp_path / picture)) is not None, picture
    assert (tmp_path / "camvid-shards" / "val" / "manifest.json").is_file()
