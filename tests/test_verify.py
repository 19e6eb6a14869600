"""verify: re-checks sizes, sha256, decoding and class counts; reports, never modifies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from shardkit.store.manifest import MANIFEST_NAME
from shardkit.verify import published_digests, split_folders, verify_split

GOLDEN = Path(__file__).resolve().parents[1] / "formats" / "golden"


@pytest.fixture(params=["npy-fixed", "npy-variable", "lmdb"])
def split(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    out = tmp_path / "out" / "train"
    shutil.copytree(GOLDEN / request.param / "train", out)
    return out


def test_an_intact_split_verifies(split: Path) -> None:
    report = verify_split(split)
    assert report.ok, report.problems
    manifest = json.loads((split / MANIFEST_NAME).read_text())
    assert (report.samples, report.shards) == (manifest["num_samples"], len(manifest["shards"]))


def test_a_flipped_byte_is_found_and_nothing_is_modified(split: Path) -> None:
    shard_file = split / json.loads((split / MANIFEST_NAME).read_text())["shards"][0]["files"][0]["name"]
    data = bytearray(shard_file.read_bytes())
    data[-1] ^= 0xFF
    shard_file.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in split.iterdir()}
    report = verify_split(split)
    assert not report.ok and "sha256" in report.problems[0] and "shard 0" in report.problems[0]
    assert {p.name: p.read_bytes() for p in split.iterdir()} == before


def test_wrong_class_counts_are_reported(split: Path) -> None:
    m = json.loads((split / MANIFEST_NAME).read_text())
    m["stats"]["class_pixels"][0] += 1
    (split / MANIFEST_NAME).write_text(json.dumps(m))
    report = verify_split(split)
    assert len(report.problems) == 1 and "class pixel counts" in report.problems[0]


def test_a_missing_manifest_or_shard_is_a_problem_not_a_crash(split: Path) -> None:
    name = json.loads((split / MANIFEST_NAME).read_text())["shards"][1]["files"][0]["name"]
    (split / name).unlink()
    assert "missing" in " ".join(verify_split(split).problems)
    (split / MANIFEST_NAME).unlink()
    assert "no manifest.json" in verify_split(split).problems[0]


def test_split_folders_finds_the_splits_of_an_output(split: Path) -> None:
    shutil.copytree(split, split.parent / "val")
    assert split_folders(split.parent) == [split, split.parent / "val"]
    assert split_folders(split) == [split]
    assert split_folders(split / "nowhere") == []


def test_published_digests_ignore_where_the_source_was(split: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    shutil.copytree(split, other)
    m = json.loads((other / MANIFEST_NAME).read_text())
    m["source"]["root"] = "/somewhere/else"
    (other / MANIFEST_NAME).write_text(json.dumps(m))
    assert published_digests(other) == published_digests(split)
    m["num_samples"] += 0
    m["skipped"] = [{"key": "x", "reason": "y"}]
    (other / MANIFEST_NAME).write_text(json.dumps(m))
    assert published_digests(other) != published_digests(split)


def test_verifying_a_large_sample_costs_a_few_mb_not_the_label_widened(camvid_root: Path, tmp_path: Path) -> None:
    """Class counts are taken a block of rows at a time: verifying 1440x1920 samples (2.8 M pixels) peaks at a
    few MB of Python allocations; a whole-label ``np.bincount`` widened every id to int64 first (22 MB here;
    2 GB at the largest size a manifest may state), and the manifest was read into a 512 MiB buffer."""
    import tracemalloc

    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert
    from tests.fuzz import camvid_subset

    src = camvid_subset(camvid_root, tmp_path / "input", 2)
    convert(ConvertConfig(src, tmp_path / "out", format="npy", size=(1440, 1920), splits=("val",), quiet=True,
                          workers=0, shard_size=ShardSize(samples=2)))
    verify_split(tmp_path / "out" / "val")  # imports and caches outside the measurement
    tracemalloc.start()
    try:
        report = verify_split(tmp_path / "out" / "val")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.ok and report.samples == 2
    assert peak < 24 << 20  # ~17 MB: sha256's 8 MiB reads; the labels' counts a few MB more


# ------------------------------------------------------------------ derived columns (issue 36)
@pytest.fixture
def camvid_val(camvid_val_npy: Path, tmp_path: Path) -> Path:
    """A writable copy of CamVid val (26 real pairs, 360x480 npy, ignore id 11)."""
    return Path(shutil.copytree(camvid_val_npy, tmp_path / "out" / "val"))


def _converted(camvid_root: Path, tmp_path: Path, **options: object) -> Path:
    """The first 6 CamVid val pairs converted with ``options`` (two samples per shard)."""
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert
    from tests.camvid_copy import small_camvid

    src = small_camvid(camvid_root, tmp_path / "input", 6)
    convert(ConvertConfig(src, tmp_path / "out", splits=("val",), quiet=True, workers=1,
                          shard_size=ShardSize(samples=2), **options))  # type: ignore[arg-type]
    return tmp_path / "out" / "val"


@pytest.mark.parametrize(("options", "bands"), [
    ({"format": "npy", "size": None}, True),
    ({"format": "npy", "size": None, "tile": "200x256", "stride": "150x200"}, True),  # overlapping, padded edges
    ({"format": "lmdb", "size": None, "image_codec": "jpeg:90"}, False),  # the means are of the pixels before JPEG
    ({"format": "tfrecord", "size": None, "image_codec": "png"}, True),
    ({"format": "npy", "size": (360, 480)}, False),  # a centre crop may pad: where, no column says
], ids=["npy", "tiles", "lmdb-jpeg", "tfrecord-png", "npy-fixed"])
def test_the_derived_columns_recomputed_from_real_splits_agree(camvid_root: Path, tmp_path: Path,
                                                               options: dict, bands: bool) -> None:
    """Recomputing bitmaps, pixel hashes and every statistic (band statistics where they can be) from what
    convert stored gives exactly what convert recorded: no false alarm, tiles and lossy codecs included."""
    from shardkit.formats.base import SampleSpec
    from shardkit.store.derived import DerivedCheck
    from shardkit.store.manifest import load_manifest

    split = _converted(camvid_root, tmp_path, **options)
    manifest = load_manifest(split)
    assert DerivedCheck(manifest, SampleSpec.from_manifest(manifest.sample)).bands is bands
    report = verify_split(split)
    assert report.ok, report.problems


def test_zeroed_class_bitmaps_with_refreshed_hashes_are_reported(camvid_val: Path) -> None:
    """The attack of issue 36: every class bitmap zeroed, the sidecars' sizes and sha256 refreshed in the manifest.
    Every byte-level check passes; verify recomputes each sample's classes from its label and names the samples."""
    from tests.tamper import rewrite_sidecars, zero_class_bitmaps

    rewrite_sidecars(camvid_val, zero_class_bitmaps)
    report = verify_split(camvid_val)
    assert not report.ok
    first = report.problems[0]
    assert first == ("sample 'val/0016E5_07959.png' (shard 0, #0): classes column (class bitmap) holds [], its label "
                     "holds [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]")
    # bounded: 10 samples listed, then one line counting the other 16 of the 26
    listed = [p for p in report.problems if "classes column (class bitmap)" in p]
    assert len(listed) == 10 and "… and 16 more disagreement(s) in the classes column" in report.problems


def test_verify_command_exits_1_naming_the_column(camvid_val: Path) -> None:
    from click.testing import CliRunner

    from shardkit.cli import main
    from tests.tamper import rewrite_sidecars, zero_class_bitmaps

    assert CliRunner().invoke(main, ["verify", str(camvid_val)]).exit_code == 0
    rewrite_sidecars(camvid_val, zero_class_bitmaps)
    res = CliRunner().invoke(main, ["verify", str(camvid_val)])
    assert res.exit_code == 1 and "classes column" in res.output and "Traceback" not in res.output


def test_pixel_hashes_all_set_equal_are_reported(camvid_val: Path) -> None:
    """Every pixel hash set to one value (hashes refreshed): ``info --duplicates`` would call 25 samples copies of
    one image; verify recomputes each hash from the stored pixels and reports the column."""
    from tests.tamper import one_pixel_hash, rewrite_sidecars

    rewrite_sidecars(camvid_val, one_pixel_hash)
    report = verify_split(camvid_val)
    listed = [p for p in report.problems if "pixels column (pixel hash)" in p]
    assert len(listed) == 10 and "is 5a5a5a5a" in listed[0] and "'val/0016E5_07959.png'" in listed[0]
    assert "… and 16 more disagreement(s) in the pixels column" in report.problems


def test_look_hashes_all_set_equal_are_reported(camvid_val: Path) -> None:
    """Every look hash set to one value (hashes refreshed): every pair would be a near-duplicate; verify recomputes
    each look hash from the stored pixels and reports the column."""
    from tests.tamper import one_look_hash, rewrite_sidecars

    rewrite_sidecars(camvid_val, one_look_hash)
    report = verify_split(camvid_val)
    listed = [p for p in report.problems if "looks column (look hash)" in p]
    assert len(listed) == 10 and "is 3c3c3c3c3c3c3c3c" in listed[0] and "'val/0016E5_07959.png'" in listed[0]


def test_equal_pixel_hashes_of_a_lossy_codec_must_decode_alike(camvid_root: Path, tmp_path: Path) -> None:
    """JPEG images do not decode to the pixels that were hashed, so their hashes cannot be recomputed; samples that
    claim one hash must still decode to the same pixels, which 6 different CamVid images do not."""
    from tests.tamper import one_pixel_hash, rewrite_sidecars

    split = _converted(camvid_root, tmp_path, format="lmdb", size=None, image_codec="jpeg:90")
    rewrite_sidecars(split, one_pixel_hash)
    problems = verify_split(split).problems
    assert len(problems) == 1 and "6 samples" in problems[0] and "decode to different pixels" in problems[0]


def test_a_changed_band_statistic_is_reported(camvid_root: Path, tmp_path: Path) -> None:
    """The mean a reader normalises with is recomputed where the split holds no padding."""
    split = _converted(camvid_root, tmp_path, format="npy", size=None)
    m = json.loads((split / MANIFEST_NAME).read_text())
    m["stats"]["image_mean"][0] += 10.0
    (split / MANIFEST_NAME).write_text(json.dumps(m))
    problems = verify_split(split).problems
    assert len(problems) == 1 and "stats.image_mean" in problems[0]


def test_a_changed_tile_bitmap_is_reported(camvid_root: Path, tmp_path: Path) -> None:
    from tests.tamper import rewrite_sidecars

    split = _converted(camvid_root, tmp_path, format="npy", size=None, tile="200x256", stride="150x200")

    first = [True]

    def drop_class_0_of_the_first(rows: np.ndarray) -> None:
        if first.pop() if first else False:  # the first tile of the first source only
            assert rows["classes"][0, 0] & 0x80  # it holds class 0 (big-endian bit order: the top bit)
            rows["classes"][0, 0] &= 0x7F

    rewrite_sidecars(split, drop_class_0_of_the_first)
    problems = verify_split(split).problems
    assert len(problems) == 1 and "classes column" in problems[0]


@pytest.mark.parametrize("tile", [[0, 0], "abc", [200, 200, 1], {"a": 1}])
def test_a_hostile_tiling_in_the_manifest_is_one_problem_not_a_traceback(camvid_val: Path, tile: object) -> None:
    """The tile boxes that the band statistics need come from ``preprocessing.tile``/``stride``: anything but a
    tiling shardkit writes is reported as such (it used to be read by nothing verify ran)."""
    m = json.loads((camvid_val / MANIFEST_NAME).read_text())
    m["preprocessing"]["tile"] = tile
    (camvid_val / MANIFEST_NAME).write_text(json.dumps(m))
    problems = verify_split(camvid_val).problems
    assert problems == [f"preprocessing tile {tile} / stride None is not a tiling shardkit writes"]
