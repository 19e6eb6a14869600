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
import shardkit.files.samples as samples_module
from shardkit.files.samples import SampleTable, SidecarBuilder, pixel_hash, split_fingerprint
from shardkit.store.duplicates import group_rows
from shardkit.store.manifest import MANIFEST_NAME, inline_manifest, load_manifest
from shardkit.store.publish import dump_manifest
from shardkit.verify import verify_split

GOLDEN = Path(__file__).resolve().parents[2] / "formats" / "golden"


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


# --------------------------------------------------------------------------- pixel hashes and duplicates


def test_the_pixel_hash_is_of_the_pixels_not_the_file() -> None:
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    want = hashlib.sha256(b"2x3x3:|u1\n" + image.tobytes()).digest()[:16]
    assert pixel_hash(image) == want == pixel_hash(np.asfortranarray(image))
    assert pixel_hash(image.reshape(3, 2, 3)) != want  # same bytes, other shape


def test_sidecars_keep_pixel_hashes_and_older_ones_are_read_without(tmp_path: Path) -> None:
    b = SidecarBuilder(num_classes=12)
    b.add("a.png", None, 3, 4, "ab" * 32, [1], b"\x01" * 16)
    rows = b.array()
    assert rows.dtype.names[:4] == ("height", "width", "fingerprint", "pixels")
    assert bytes(rows["pixels"][0]) == b"\1" * 16
    old = shardkit.open(GOLDEN / "manifest2-npy-fixed" / "train")  # written before the pixels column
    assert old.manifest.samples.pixel_hashes(0) is None and "pixels" not in old.manifest.samples[0]
    new = shardkit.open(GOLDEN / "manifest3-npy-fixed" / "train")
    hashes = new.manifest.samples.pixel_hashes(0)
    assert hashes is not None and bytes(hashes[0]) == pixel_hash(new[0][0])


def test_group_rows_finds_equal_hashes_in_plan_order() -> None:
    h = np.zeros((6, 16), np.uint8)
    h[:, 0] = [5, 1, 5, 2, 1, 5]
    assert [g.tolist() for g in group_rows(h)] == [[0, 2, 5], [1, 4]]
    assert group_rows(np.arange(32, dtype=np.uint8).reshape(2, 16)) == []


def _planted(camvid_root: Path, tmp_path: Path) -> Path:
    """A small CamVid copy (4 train, 3 val pairs) plus one train image re-encoded (other PNG settings, other bytes)
    into val under a new name: a cross-split duplicate whose file fingerprint differs."""
    from PIL import Image

    raw = tmp_path / "raw"
    for split, n in (("train", 4), ("val", 3)):
        for sub in (split, f"{split}annot"):
            (raw / sub).mkdir(parents=True)
            for p in sorted((camvid_root / sub).glob("*.png"))[:n]:
                shutil.copyfile(p, raw / sub / p.name)
    src = sorted((raw / "train").glob("*.png"))[1]
    Image.open(src).save(raw / "val" / "zz_copy.png", compress_level=1)
    shutil.copyfile(raw / "trainannot" / src.name, raw / "valannot" / "zz_copy.png")
    assert (raw / "val" / "zz_copy.png").read_bytes() != src.read_bytes()
    return raw


def test_a_re_encoded_copy_across_train_and_val_is_reported_with_both_keys(camvid_root: Path, tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    from click.testing import CliRunner

    from shardkit.cli import main
    from shardkit.conversion.config import ConvertConfig
    from shardkit.conversion.pipeline import convert

    raw = _planted(camvid_root, tmp_path)
    with caplog.at_level("WARNING"):
        summary = convert(ConvertConfig(raw, tmp_path / "out", workers=2, quiet=True))
    train_key = f"train/{sorted((raw / 'train').glob('*.png'))[1].name}"
    assert summary.duplicates is not None and len(summary.duplicates.groups) == 1
    group = summary.duplicates.groups[0]
    assert [(c.split, c.key) for c in group.copies] == [("train", train_key), ("val", "val/zz_copy.png")]
    assert group.across_splits and "1 group(s) across splits" in summary.line()
    assert f"train:{train_key} = val:val/zz_copy.png" in caplog.text
    run = CliRunner().invoke(main, ["info", str(tmp_path / "out"), "--duplicates"])
    assert run.exit_code == 0 and f"across splits: 2 copies: train:{train_key} = val:val/zz_copy.png" in run.output
    data = json.loads(CliRunner().invoke(main, ["info", str(tmp_path / "out"), "--duplicates", "--json"]).output)
    assert data["groups"][0]["copies"] == [{"split": "train", "index": 1, "key": train_key},
                                           {"split": "val", "index": 3, "key": "val/zz_copy.png"}]


def test_on_duplicate_error_exits_4_with_one_line_and_writes_no_manifest(camvid_root: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    raw = _planted(camvid_root, tmp_path)
    run = subprocess.run([sys.executable, "-m", "shardkit", "convert", str(raw), str(tmp_path / "out"), "-q",
                          "--workers", "1", "--on-duplicate", "error"], capture_output=True, text=True, timeout=240,
                         check=False)
    assert run.returncode == 4, run.stderr
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("Error: 1 image(s) have identical pixels") and "val:val/zz_copy.png" in lines[-1]
    assert "Traceback" not in run.stderr
    assert not list((tmp_path / "out").glob("*/manifest.json"))


def test_on_duplicate_skip_keeps_the_first_copy_for_any_worker_count(camvid_root: Path, tmp_path: Path) -> None:
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert
    from shardkit.verify import published_digests

    raw = _planted(camvid_root, tmp_path)
    digests = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        summary = convert(ConvertConfig(raw, out, workers=workers, quiet=True, on_duplicate="skip",
                                        shard_size=ShardSize(samples=2)))
        assert [s["key"] for s in summary.skipped] == ["val/zz_copy.png"]
        val = shardkit.open(out / "val")
        assert len(val) == 3 and "val/zz_copy.png" not in [val.key(i) for i in range(len(val))]
        assert load_manifest(out / "val").skipped[0]["duplicate_of"].startswith("train:train/")
        digests.append({split: published_digests(out / split) for split in ("train", "val")})
    assert digests[0] == digests[1]
    same = convert(ConvertConfig(raw, tmp_path / "out1", workers=1, quiet=True, on_duplicate="skip",
                                 shard_size=ShardSize(samples=2)))
    assert same.reused == same.shards and same.line().startswith("nothing changed"), same.line()
    assert published_digests(tmp_path / "out1" / "val") == digests[0]["val"]
    again = convert(ConvertConfig(raw, tmp_path / "out1", workers=1, quiet=True, shard_size=ShardSize(samples=2)))
    assert len(shardkit.open(tmp_path / "out1" / "val")) == 4, "a warn run puts the copy back"
    assert again.duplicates is not None and len(again.duplicates.groups) == 1


def test_an_output_without_pixel_hashes_says_so() -> None:
    from click.testing import CliRunner

    from shardkit.cli import main

    run = CliRunner().invoke(main, ["info", str(GOLDEN / "manifest2-npy-fixed" / "train"), "--duplicates"])
    assert run.exit_code == 0 and "no pixel hashes" in run.output and "re-run convert" in run.output


@pytest.mark.parametrize("variant", ["manifest2-npy-fixed", "npy-fixed"])
def test_keys_are_the_records_keys_shard_by_shard(variant: str) -> None:
    """The key column read alone (sidecars, or inline records of version 1) gives each record's key, in order."""
    m = load_manifest(GOLDEN / variant / "train")
    keys = [k for pos in range(len(m.shards)) for k in m.samples.keys(pos)]
    assert keys == [r["key"] for r in m.samples] and len(keys) == 3
