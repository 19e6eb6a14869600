"""verify: re-checks sizes, sha256, decoding and class counts; reports, never modifies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shardkit.manifest import MANIFEST_NAME
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

    from shardkit.config import ConvertConfig, ShardSize
    from shardkit.pipeline import convert
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
