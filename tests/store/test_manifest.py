"""The manifest: load, validate, dump byte-identically; shard paths never leave the split folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shardkit.errors import InputNotFoundError, ShardFormatError, UnsafePathError
from shardkit.files.splitfiles import member_path, safe_member
from shardkit.store.manifest import MANIFEST_NAME, Manifest, load_manifest
from shardkit.store.publish import dump_manifest

GOLDEN = Path(__file__).resolve().parents[2] / "formats" / "golden"


@pytest.mark.parametrize("name", ["npy-fixed", "npy-variable", "lmdb", "manifest2-npy-fixed",
                                  "manifest2-lmdb-zstd"])
def test_a_loaded_manifest_dumps_to_the_same_bytes(tmp_path: Path, name: str) -> None:
    m = load_manifest(GOLDEN / name / "train")
    assert m.num_samples == sum(s.num_samples for s in m.shards) == len(m.samples)
    dump_manifest(m, tmp_path)
    assert (tmp_path / MANIFEST_NAME).read_bytes() == (GOLDEN / name / "train" / MANIFEST_NAME).read_bytes()


def _hostile(tmp_path: Path, change) -> Path:  # type: ignore[no-untyped-def]
    split = tmp_path / "train"
    shutil.copytree(GOLDEN / "npy-fixed" / "train", split)
    m = json.loads((split / MANIFEST_NAME).read_text())
    change(m)
    (split / MANIFEST_NAME).write_text(json.dumps(m))
    return split


@pytest.mark.parametrize("change", [
    lambda m: m.update(manifest_version=99),
    lambda m: m.update(format="zip"),
    lambda m: m["shards"][1].update(first_index=5),
    lambda m: m.update(num_samples=99),
    lambda m: m["sample"]["label"].update(num_classes=0),
    lambda m: m["samples"][0].update(height="4"),
    lambda m: m.pop("shards"),
], ids=["version", "format", "gap", "count", "classes", "height", "no-shards"])
def test_a_damaged_manifest_is_a_shard_format_error(tmp_path: Path, change) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ShardFormatError) as info:
        load_manifest(_hostile(tmp_path, change))
    assert "\n" not in str(info.value) and info.value.fix


def test_a_shard_path_that_escapes_is_refused(tmp_path: Path) -> None:
    split = _hostile(tmp_path, lambda m: m["shards"][0]["files"][0].update(name="../../etc/passwd"))
    with pytest.raises(UnsafePathError):
        load_manifest(split)


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a\\b", "c:x", ".hidden", "a/../b", "", "x\x00y"])
def test_safe_member_refuses_anything_but_a_plain_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafePathError):
        safe_member(name, tmp_path)


def test_member_path_stays_inside_the_folder(tmp_path: Path) -> None:
    (tmp_path / "images-0.npy").write_bytes(b"")
    assert member_path("images-0.npy", tmp_path) == tmp_path / "images-0.npy"
    (tmp_path / "link.npy").symlink_to("/etc/hostname")
    with pytest.raises(UnsafePathError):
        member_path("link.npy", tmp_path)


def test_no_manifest_says_where_to_point(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError, match=r"no manifest\.json") as info:
        load_manifest(tmp_path)
    assert "split folder" in (info.value.fix or "")
    (tmp_path / MANIFEST_NAME).write_text("{")
    with pytest.raises(ShardFormatError, match="cannot be read"):
        load_manifest(tmp_path)


def test_to_json_and_from_json_round_trip() -> None:
    m = load_manifest(GOLDEN / "lmdb" / "train")
    assert Manifest.from_json(json.loads(json.dumps(m.to_json()))) == m
