"""One set of limits: convert refuses, before writing anything, what its readers would refuse (one line, an exit
code), and a tiling's output is estimated from the headers and refused above --max-tile-ratio."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile

from shardkit.files.splitfiles import SampleSpec
from shardkit.formats import base
from shardkit.support import limits
from tests.test_bad_input import invoke, one_line_error


def dataset(root: Path, image: np.ndarray | None = None, pages: np.ndarray | None = None,
            hw: tuple[int, int] = (8, 8)) -> Path:
    """images/x.tif (``image`` as samples of one page, or ``pages`` as pages) and labels/x.png of 0s."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    if image is not None:
        tifffile.imwrite(root / "images" / "x.tif", image, photometric="minisblack", planarconfig="contig")
    else:
        tifffile.imwrite(root / "images" / "x.tif", pages)
    cv2.imwrite(str(root / "labels" / "x.png"), np.zeros(hw, np.uint8))
    return root


def test_the_bounds_readers_check_are_the_ones_declared_once() -> None:
    spec = {"image": {"shape": [8, 8, limits.MAX_BANDS + 1], "dtype": "|u1", "channels": "bands"},
            "label": {"encoding": "index", "num_classes": 2, "class_id_dtype": "|u1"}}
    with pytest.raises(ValueError, match=f"image channels {limits.MAX_BANDS + 1} is not an integer in 1..1024"):
        SampleSpec.from_json(spec)
    assert base.MAX_BANDS == limits.MAX_BANDS


@pytest.mark.parametrize("case", ["1100 samples", "2000 pages as bands"])
def test_an_image_of_more_bands_than_a_split_stores_is_refused_before_anything_is_written(tmp_path: Path,
                                                                                           case: str) -> None:
    """Before: exit 0, then open/info/verify refused the manifest (image channels 1100 is not in 1..1024)."""
    if case == "1100 samples":
        raw, extra, bands = dataset(tmp_path / "raw", image=np.zeros((8, 8, 1100), np.uint8)), [], 1100
    else:
        raw = dataset(tmp_path / "raw", pages=np.zeros((2000, 8, 8), np.uint8))
        extra, bands = ["--pages-as-bands"], 2000
    out = tmp_path / "out"
    res = invoke("convert", raw, out, "--num-classes", "2", "-q", *extra)
    assert res.exit_code == 1
    line = one_line_error(res.output)
    assert f"x.tif: image has {bands} bands, more than the 1024 a split stores" in line
    assert "fix: pick at most 1024 with --bands" in line
    assert not out.exists()  # nothing written, not even the output folder
    # following the fix stores what the readers open
    res = invoke("convert", raw, out, "--num-classes", "2", "-q", "--bands", "1,2,3", *extra)
    assert res.exit_code == 0, res.output
    assert invoke("verify", out / "all").exit_code == 0


@pytest.mark.parametrize(("args", "said"), [
    (["--bands", ",".join(["1"] * 1025)], "--bands names 1025 bands, more than the 1024 a split stores"),
    (["--max-pixels", str(1 << 29)], "--max-pixels 536870912 is more than the 268435456 pixels a stored sample may"),
    (["--size", "70000x2"], "--size 70000x2 is larger than a stored sample may be (at most 65536 per side"),
    (["--tile", "20000", "--max-pixels", str(1 << 30)], "--tile 20000x20000 is larger than a stored sample may be"),
    (["--max-tile-ratio", "0.5"], "--max-tile-ratio '0.5' is not a number of at least 1")])
def test_options_that_would_store_what_readers_refuse_are_usage_errors(tmp_path: Path, args: list[str],
                                                                       said: str) -> None:
    raw = dataset(tmp_path / "raw", image=np.zeros((8, 8, 3), np.uint8))
    res = invoke("convert", raw, tmp_path / "out", "--num-classes", "2", "-q", *args)
    assert res.exit_code == 2, res.output
    assert said in one_line_error(res.output)
    assert not (tmp_path / "out").exists()


def test_a_strip_longer_than_a_stored_side_is_refused_not_written_unreadable(tmp_path: Path) -> None:
    """70000 pixels is within --max-pixels, but a stored side is at most 65536: readers refuse it."""
    (tmp_path / "raw" / "images").mkdir(parents=True)
    (tmp_path / "raw" / "labels").mkdir()
    cv2.imwrite(str(tmp_path / "raw" / "images" / "a.png"), np.zeros((1, 70000, 3), np.uint8))
    cv2.imwrite(str(tmp_path / "raw" / "labels" / "a.png"), np.zeros((1, 70000), np.uint8))
    res = invoke("convert", tmp_path / "raw", tmp_path / "out", "--num-classes", "2", "-q", "--workers", "1")
    assert res.exit_code == 1
    assert "a.png: image 1x70000 is not two integers in 1..65536" in one_line_error(res.output)
    assert not list((tmp_path / "out").rglob("manifest*.json"))


def test_stride_1_tiling_of_a_camvid_image_is_refused_from_its_header_before_anything_is_written(
        camvid_root: Path, tmp_path: Path) -> None:
    """The issue's case: --tile 64 --stride 1 on one 360x480 PNG wrote 123,849 tiles (2.0 GB) unasked."""
    name = sorted(p.name for p in (camvid_root / "val").iterdir())[0]
    for sub in ("images", "labels"):
        (tmp_path / "raw" / sub).mkdir(parents=True)
    src = camvid_root / "val" / name
    (tmp_path / "raw" / "images" / name).write_bytes(src.read_bytes())
    (tmp_path / "raw" / "labels" / name).write_bytes((camvid_root / "valannot" / name).read_bytes())
    out = tmp_path / "out"
    res = invoke("convert", tmp_path / "raw", out, "--num-classes", "12", "-q", "--tile", "64", "--stride", "1")
    assert res.exit_code == 2
    line = one_line_error(res.output)
    assert f"{name}: --tile 64x64 --stride 1x1 would store 123,849 tiles (2,029 MB) of this 360x480 source, " \
           "2935.7 times its pixels, more than --max-tile-ratio 16" in line
    assert "fix: use a larger --stride (--stride 32x32: half-tile overlap), or raise --max-tile-ratio" in line
    assert not out.exists()
    # the fix's stride converts: 11 x 14 tiles, 4 times the pixels
    res = invoke("convert", tmp_path / "raw", out, "--num-classes", "12", "-q", "--tile", "64", "--stride", "32")
    assert res.exit_code == 0, res.output
    assert invoke("verify", out / "all").exit_code == 0


def test_a_shard_whose_sidecar_readers_would_refuse_is_not_written(camvid_root: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers refuse a samples sidecar over MAX_SIDECAR_BYTES (1 GiB: ~7M samples in one shard, --shard-size
    10000000); convert refuses to write one. The bound is lowered here so one real sample's sidecar is over it."""
    import shardkit.files.samples

    name = sorted(p.name for p in (camvid_root / "val").iterdir())[0]
    for sub, src in (("images", "val"), ("labels", "valannot")):
        (tmp_path / "raw" / sub).mkdir(parents=True)
        (tmp_path / "raw" / sub / name).write_bytes((camvid_root / src / name).read_bytes())
    monkeypatch.setattr(shardkit.files.samples, "MAX_SIDECAR_BYTES", 300)
    res = invoke("convert", tmp_path / "raw", tmp_path / "out", "--num-classes", "12", "-q", "--workers", "1")
    assert res.exit_code == 2
    assert "a shard's samples sidecar would be 432 bytes (1 samples), more than the 300 its readers read" \
        in one_line_error(res.output)
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file() and p.name != ".shardkit.lock"]
