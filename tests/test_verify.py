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
