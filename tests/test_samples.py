"""Samples sidecars (manifest version 2): written per shard, read lazily, same records as version 1 inline."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

import shardkit
import shardkit.samples as samples_module
from shardkit.manifest import MANIFEST_NAME, load_manifest
from shardkit.publish import dump_manifest
from shardkit.samples import SampleTable, SidecarBuilder, inline_manifest, split_fingerprint
from shardkit.verify import verify_split

GOLDEN = Path(__file__).resolve().parents[1] / "formats" / "golden"


def _forbid_sidecars(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a sidecar was read")

    monkeypatch.setattr(samples_module, "read_sidecar", refuse)


def test_opening_and_reading_a_fixed_size_split_reads_no_sidecar(monkeypatch: pytest.MonkeyPatch) -> None:
    _forbid_sidecars(monkeypatch)
    ds = shardkit.open(GOLDEN / "manifest2-npy-fixed" / "train", labels="stored")
    images, _ = ds.batch([0, 1, 2])
    assert images.shape == (3, 4, 6, 3) and len(ds) == 3
    assert ds.sample_sizes() == {(4, 6): 3}  # fixed size: from the manifest's sample description
    assert ds.manifest.samples.loads == 0


def test_a_variable_size_split_reads_only_the_sidecar_of_the_shard_it_reads() -> None:
    ds = shardkit.open(GOLDEN / "manifest2-lmdb-zstd" / "train", labels="stored")
    assert ds.manifest.samples.loads == 0  # open reads none
    ds[0]  # LMDB bounds each record's size by the sidecar's (H, W): shard 0's only
    assert ds.manifest.samples.loads == 1
    assert ds.key(1) == "train/s1.png" and ds.manifest.samples.loads == 1  # cached
    assert ds.key(2) == "train/s2.png" and ds.manifest.samples.loads == 2


@pytest.mark.parametrize("variant", ["npy-fixed", "npy-variable", "lmdb-zstd"])
def test_version_2_records_equal_the_version_1_inline_records(variant: str) -> None:
    v1, v2 = load_manifest(GOLDEN / variant / "train"), load_manifest(GOLDEN / f"manifest2-{variant}" / "train")
    assert v1.manifest_version == 1 and v2.manifest_version == 2
    assert list(v2.samples) == list(v1.samples) and len(v2.samples) == len(v1.samples) == 3
    assert [v2.samples[i] for i in (-1, 0, 2)] == [v1.samples[i] for i in (-1, 0, 2)]
    assert v2.samples[1:] == v1.samples[1:]
    assert set(v2.samples[0]) == {"key", "label", "height", "width", "fingerprint", "classes"}
    with pytest.raises(IndexError):
        v2.samples[3]


def test_inline_manifest_is_the_version_1_manifest() -> None:
    """What inline_manifest writes is byte for byte the version 1 golden (what shardkit wrote before)."""
    a = json.loads(json.dumps(inline_manifest(load_manifest(GOLDEN / "manifest2-npy-fixed" / "train")).to_json()))
    b = json.loads((GOLDEN / "npy-fixed" / "train" / MANIFEST_NAME).read_text())
    for m in (a, b):
        del m["source"]["root"], m["tool"]["version"]
    assert a == b


def test_a_split_rewritten_as_version_1_still_opens_and_verifies(camvid_val_npy: Path, tmp_path: Path) -> None:
    split = tmp_path / "val"
    shutil.copytree(camvid_val_npy, split)
    dump_manifest(inline_manifest(load_manifest(split)), split)
    for p in split.glob("samples-*.npy"):
        p.unlink()  # a version 1 split has no sidecars
    m = json.loads((split / MANIFEST_NAME).read_text())
    assert m["manifest_version"] == 1 and len(m["samples"]) == 26
    ds, ref = shardkit.open(split), shardkit.open(camvid_val_npy)
    assert [ds.key(i) for i in range(len(ds))] == [ref.key(i) for i in range(len(ref))]
    assert np.array_equal(ds[25][1], ref[25][1])
    assert verify_split(split).ok


def test_verify_recomputes_the_source_fingerprint_from_the_sidecars(camvid_val_npy: Path, tmp_path: Path) -> None:
    split = tmp_path / "val"
    shutil.copytree(camvid_val_npy, split)
    m = load_manifest(split)
    digests = [hashlib.sha256(m.samples.rows(k)["fingerprint"].tobytes()).hexdigest() for k in range(len(m.shards))]
    assert m.source["fingerprint"] == split_fingerprint(digests)
    data = json.loads((split / MANIFEST_NAME).read_text())
    data["source"]["fingerprint"] = "0" * 64
    (split / MANIFEST_NAME).write_text(json.dumps(data))
    report = verify_split(split)
    assert not report.ok and "source fingerprint" in report.problems[0]


def test_the_row_cache_is_bounded(camvid_val_npy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(samples_module, "CACHE_BYTES", 1)  # at most one shard's rows stay cached
    table = load_manifest(camvid_val_npy).samples
    assert isinstance(table, SampleTable) and len(table.shards) >= 2
    keys = [rec["key"] for rec in table]  # streams shard by shard
    assert len(keys) == 26 and keys == sorted(keys) and len(table._cache) == 1
    assert table.loads == len(table.shards)


def test_a_pickled_dataset_carries_no_sample_records(camvid_val_npy: Path) -> None:
    """What a spawned DataLoader worker receives: the shard table, not one record per sample."""
    ds = shardkit.open(camvid_val_npy)
    ds.key(0)
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.manifest.samples._cache == {} and clone.manifest.samples.loads == ds.manifest.samples.loads
    assert clone.key(25) == ds.key(25)


def test_the_builder_writes_what_numpy_reads(tmp_path: Path) -> None:
    b = SidecarBuilder(num_classes=12)
    b.add("a/é.png", "a/é_L.png", 3, 4, "ab" * 32, [0, 11])
    b.add("b.png", None, 5, 6, "cd" * 32, [])
    b.write(tmp_path / "s.npy")
    rows = np.load(tmp_path / "s.npy", mmap_mode="r", allow_pickle=False)
    assert rows["key"].tolist() == ["a/é.png".encode(), b"b.png"]
    assert rows["label"].tolist() == ["a/é_L.png".encode(), b""]
    assert rows.dtype["key"].itemsize == len("a/é.png".encode()) and rows["classes"].shape == (2, 2)
    assert np.unpackbits(rows["classes"][0], count=12).nonzero()[0].tolist() == [0, 11]
    assert b.digest() == hashlib.sha256(bytes.fromhex("ab" * 32 + "cd" * 32)).hexdigest()


def test_many_classes_keep_no_bitmap(tmp_path: Path) -> None:
    b = SidecarBuilder(num_classes=1000)
    b.add("a.png", "a_L.png", 3, 4, "ab" * 32, [999])
    rows = b.array()
    assert "classes" not in (rows.dtype.names or ()) and rows.dtype.itemsize == 4 + 4 + 32 + 5 + 7
