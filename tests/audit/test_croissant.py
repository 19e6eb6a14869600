"""``shardkit audit --croissant`` on real CamVid: the reference validator (mlcroissant) finds no error, and what a
Croissant reader loads through it — the class table, the splits, every sample's key and where its image and label
lie — is the dataset's own (checked against ``shardkit.open`` and the shard files' bytes)."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import mlcroissant as mlc
import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main

#: mlcroissant 1.1.1 builds an rdflib ConjunctiveGraph, which rdflib 7.6 deprecates (the validator's, not ours)
pytestmark = pytest.mark.filterwarnings("ignore:ConjunctiveGraph is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def croissant(audited: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("croissant") / "croissant.json"
    got = CliRunner().invoke(main, ["audit", str(audited), "--croissant", str(target)])
    assert got.exit_code == 0, got.output
    assert not (audited / "audit.html").exists()  # --croissant alone writes no page
    return target


def _errors(doc: dict[str, object] | Path) -> set[str]:
    """The reference validator's errors (its Dataset raises on any; the issues say which)."""
    try:
        ds = mlc.Dataset(jsonld=doc if isinstance(doc, dict) else str(doc))
    except mlc.ValidationError as exc:
        return {str(exc)}
    return set(ds.metadata.ctx.issues.errors)


def test_the_reference_validator_finds_no_error(croissant: Path) -> None:
    assert _errors(croissant) == set()
    doc = json.loads(croissant.read_text())
    assert doc["conformsTo"] == "http://mlcommons.org/croissant/1.1"
    assert doc["version"] == "1.0.0"  # both splits are at their first publish


def test_the_validator_would_see_a_broken_document(croissant: Path) -> None:
    doc = json.loads(croissant.read_text())
    broken = copy.deepcopy(doc)
    broken["distribution"] = [d for d in broken["distribution"] if d["@id"] != "samples-table"]
    assert _errors(broken)  # the samples' fields name a file that is no longer there


def test_every_shard_file_is_there_with_the_manifests_checksum_and_size(croissant: Path, audited: Path) -> None:
    doc = json.loads(croissant.read_text())
    objects = {d["@id"]: d for d in doc["distribution"] if d["@type"] == "cr:FileObject"}
    listed = 0
    for split in ("train", "val"):
        m = shardkit.open(audited / split).manifest
        for shard in m.shards:
            for f in shard.all_files:
                entry = next(o for o in objects.values() if o["contentUrl"].endswith(f"/{split}/{f.name}"))
                assert entry["sha256"] == f.sha256 and entry["contentSize"] == f"{f.bytes} B"
                path = (croissant.parent / entry["contentUrl"]).resolve()
                assert path == (audited / split / f.name).resolve()
                assert hashlib.sha256(path.read_bytes()).hexdigest() == f.sha256
                listed += 1
    assert listed == len(objects) - 1  # and the sample table
    sets = {d["@id"]: d for d in doc["distribution"] if d["@type"] == "cr:FileSet"}
    assert set(sets) == {"train-shards", "val-shards"}


def test_a_reader_loads_the_class_table_and_the_splits(croissant: Path, audited: Path) -> None:
    ds = mlc.Dataset(jsonld=str(croissant))
    m = shardkit.open(audited / "train").manifest
    want = [{"id": c["id"], "name": c["name"], "colour": "#" + "".join(f"{v:02x}" for v in c["colour"])}
            for c in sorted(m.classes["classes"], key=lambda c: c["id"])]
    got = [{k.split("/")[1]: (v.decode() if isinstance(v, bytes) else v) for k, v in r.items()}
           for r in ds.records("classes")]
    assert sorted(got, key=lambda r: r["id"]) == want and len(want) == 12
    splits = [{k: (v.decode() if isinstance(v, bytes) else v) for k, v in r.items()} for r in ds.records("splits")]
    assert [s["splits/name"] for s in splits] == ["train", "val"]


def test_a_reader_finds_every_sample_where_it_lies(croissant: Path, audited: Path) -> None:
    records = list(mlc.Dataset(jsonld=str(croissant)).records("samples"))
    assert len(records) == 31 + 26
    seen = 0
    for split in ("train", "val"):
        ds = shardkit.open(audited / split, labels="ids")
        rows = [r for r in records if r["samples/split"] == split.encode()]
        assert [r["samples/key"].decode() for r in rows] == [ds.key(i) for i in range(len(ds))]
        for r in rows[::7]:  # the image and label at the named shard file and row are the sample's
            i = int(r["samples/index"])
            image = np.load(croissant.parent / r["samples/image_file"].decode(), mmap_mode="r")[
                int(r["samples/image_row"])]
            label = np.load(croissant.parent / r["samples/label_file"].decode(), mmap_mode="r")[
                int(r["samples/label_row"])]
            want_image, want_label = ds[i]
            assert np.array_equal(image, want_image) and np.array_equal(label, want_label)
            seen += 1
    assert seen >= 8


def test_one_file_formats_name_the_shard_for_image_and_label(camvid_root: Path, tmp_path: Path) -> None:
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert

    out = tmp_path / "out"
    convert(ConvertConfig(camvid_root, out, format="lmdb", size=(90, 120), splits=("val",), workers=1, quiet=True,
                          shard_size=ShardSize(samples=10)))
    target = out / "croissant.json"
    assert CliRunner().invoke(main, ["audit", str(out), "--croissant", str(target)]).exit_code == 0
    assert _errors(target) == set()
    records = list(mlc.Dataset(jsonld=str(target)).records("samples"))
    ds = shardkit.open(out / "val")
    assert len(records) == len(ds) == 26
    for r in records:
        i = int(r["samples/index"])
        shard = next(s for s in ds.manifest.shards if s.first_index <= i < s.first_index + s.num_samples)
        assert r["samples/image_file"] == r["samples/label_file"] == f"val/{shard.files[0].name}".encode()
        assert int(r["samples/image_row"]) == i - shard.first_index
