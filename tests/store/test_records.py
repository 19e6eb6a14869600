"""Shard records: saved beside the shards, trusted only while the files they name are intact."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from shardkit.files.splitfiles import ShardFile
from shardkit.store.records import RECORD_PREFIX, ShardRecord, reuse


def shard(directory: Path, key: str, *names: str) -> ShardRecord:
    files = []
    for n in names:
        data = f"{n} of {key}".encode()
        (directory / n).write_bytes(data)
        files.append(ShardFile(n, len(data), hashlib.sha256(data).hexdigest()))
    record = ShardRecord(key, tuple(files), 1, "ab" * 32, {"pixels": 6}, ())
    record.save(directory)
    return record


def test_a_saved_record_loads_back_equal(tmp_path: Path) -> None:
    record = shard(tmp_path, "k1", "images-00000-k1.npy", "labels-00000-k1.npy")
    assert ShardRecord.path(tmp_path, "k1").name == f"{RECORD_PREFIX}k1.json"
    assert ShardRecord.load(tmp_path, "k1") == record
    assert ShardRecord.load(tmp_path, "k2") is None


def test_a_record_holds_no_sample_records(tmp_path: Path) -> None:
    """The journal keeps a count and a digest per shard; per-sample records live in the shard's sidecar."""
    shard(tmp_path, "k1", "images-00000-k1.npy")
    saved = json.loads(ShardRecord.path(tmp_path, "k1").read_text())
    assert "samples" not in saved and saved["num_samples"] == 1 and saved["fingerprint"] == "ab" * 32


def test_a_record_of_an_older_version_is_not_reused_when_malformed(tmp_path: Path) -> None:
    """Records written before the sidecars hold their samples inline; a malformed one makes the shard rewritten."""
    record = shard(tmp_path, "k1", "images-00000-k1.npy")
    data = json.loads(ShardRecord.path(tmp_path, "k1").read_text())
    del data["num_samples"], data["fingerprint"]
    data["samples"] = [{"key": "a.png"}]  # no size, no fingerprint
    ShardRecord.path(tmp_path, "k1").write_text(json.dumps(data))
    old = ShardRecord.load(tmp_path, "k1")
    assert old is not None and old.legacy_samples == ({"key": "a.png"},) and old.num_samples == 1
    assert reuse(tmp_path, "k1", (record.files[0].name, "samples-00000-k1.npy")) is None
    assert not (tmp_path / "samples-00000-k1.npy").exists()


def test_an_output_of_an_older_shardkit_is_upgraded_without_rewriting_its_shards(camvid_root: Path,
                                                                                  tmp_path: Path) -> None:
    """Shards whose records hold their samples inline (before sidecars) get their sidecars from those records:
    the re-run reuses every shard and publishes what a fresh conversion publishes."""
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert
    from shardkit.store.manifest import inline_manifest, load_manifest
    from shardkit.store.publish import dump_manifest
    from shardkit.verify import published_digests

    cfg = ConvertConfig(camvid_root, tmp_path / "out", size=(64, 96), splits=("val",), workers=1, quiet=True,
                        shard_size=ShardSize(samples=9))
    convert(cfg)
    split = tmp_path / "out" / "val"
    want = published_digests(split)
    m = load_manifest(split)
    by_sidecar = {s.samples.name: s for s in m.shards if s.samples is not None}
    for path in split.glob(f"{RECORD_PREFIX}*.json"):  # what an older shardkit left
        data = json.loads(path.read_text())
        sidecar = by_sidecar[data["files"].pop()["name"]]
        data["samples"] = m.samples[sidecar.first_index : sidecar.first_index + sidecar.num_samples]
        del data["num_samples"], data["fingerprint"]
        path.write_text(json.dumps(data))
    dump_manifest(inline_manifest(m), split)
    for name in by_sidecar:
        (split / name).unlink()
    again = convert(cfg)
    assert again.reused == again.shards == len(by_sidecar)
    assert published_digests(split) == want
    assert all("num_samples" in json.loads(p.read_text()) for p in split.glob(f"{RECORD_PREFIX}*.json"))


def test_a_damaged_or_unsafe_record_is_not_trusted(tmp_path: Path) -> None:
    path = ShardRecord.path(tmp_path, "k1")
    path.write_text("{not json")
    assert ShardRecord.load(tmp_path, "k1") is None
    path.write_text('{"key": "k1", "files": [{"name": "../escape.npy", "bytes": 1, "sha256": "x"}], '
                    '"samples": [], "stats": {}, "skipped": []}')
    assert ShardRecord.load(tmp_path, "k1") is None


def test_reuse_returns_an_intact_shard(tmp_path: Path) -> None:
    record = shard(tmp_path, "k1", "images-00000-k1.npy")
    assert reuse(tmp_path, "k1", ("images-00000-k1.npy",)) == record


def test_reuse_refuses_a_shard_whose_file_changed_even_at_the_same_size(tmp_path: Path) -> None:
    shard(tmp_path, "k1", "images-00000-k1.npy")
    f = tmp_path / "images-00000-k1.npy"
    f.write_bytes(bytes(reversed(f.read_bytes())))  # same size, other bytes
    assert reuse(tmp_path, "k1", ("images-00000-k1.npy",)) is None
    f.unlink()
    assert reuse(tmp_path, "k1", ("images-00000-k1.npy",)) is None
    assert reuse(tmp_path, "k1", ("a", "b")) is None  # another number of files than planned


def test_a_moved_shard_gets_its_new_names_and_keeps_the_old(tmp_path: Path) -> None:
    shard(tmp_path, "k1", "images-00000-k1.npy")
    moved = reuse(tmp_path, "k1", ("images-00003-k1.npy",))
    assert moved is not None and [f.name for f in moved.files] == ["images-00003-k1.npy"]
    assert (tmp_path / "images-00003-k1.npy").read_bytes() == (tmp_path / "images-00000-k1.npy").read_bytes()
    assert ShardRecord.load(tmp_path, "k1") == moved  # the record now names the new file


@pytest.mark.parametrize("damage", ["deep", "fifo", "folder"])
def test_a_hostile_record_is_dropped_with_a_warning_never_a_traceback_or_hang(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    """A 100,000-deep ``.shard-*.json``, a FIFO or a folder in its place: no record (its shard is rewritten), a
    warning naming it; ``records_within`` (reclaim's bookkeeping) passes it over the same way."""
    from shardkit.store.records import records_within

    shard(tmp_path, "k1", "images-00000-k1.npy")
    path = ShardRecord.path(tmp_path, "k1")
    path.unlink()
    if damage == "deep":
        path.write_text('{"files": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif damage == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    try:
        assert ShardRecord.load(tmp_path, "k1") is None
        assert f"{path}: damaged" in caplog.text
        assert records_within(tmp_path, {"images-00000-k1.npy"}) == set()
        assert reuse(tmp_path, "k1", ("images-00000-k1.npy",)) is None
    finally:
        if damage == "fifo":
            path.unlink()
