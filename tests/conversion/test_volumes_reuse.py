"""Shard reuse for volume runs (docs/volumes.md): each case's fingerprint covers every file of the case (every
modality and its label), so an edit to one case's file writes only that case's shard again, and an unchanged
case's shard is reused as it is, file for file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main

from .test_volumes import DATA, nnunet_tree
from .test_volumes_convert import INT16_CASES, volumes_of

nib = pytest.importorskip("nibabel")


def convert(root: Path, out: Path, *args: str) -> str:
    """Run convert (the full path, not the no-op: an input changed); the line saying how many shards it reused."""
    result = CliRunner().invoke(main, ["convert", str(root), str(out), "--workers", "1", "--shard-size", "1",
                                       "--context", "1", *args])
    assert result.exit_code == 0, result.output
    planned = [line for line in result.output.splitlines() if "shards planned" in line]
    assert len(planned) == 1, result.output  # the no-op check (a stat walk) logs no plan
    return planned[0]


def shard_files(out: Path) -> dict[str, dict[str, tuple[str, int]]]:
    """Per case (the first key of its shard): each published file's name -> (sha256, inode): a shard written again
    is a new file (a new inode) even where its bytes are the same."""
    manifest = json.loads((out / "train" / "manifest.json").read_text())
    ds = shardkit.open(out / "train")
    by_case = {}
    for shard in manifest["shards"]:
        case = ds.key(shard["first_index"]).split("/")[0]
        files = [*shard["files"], shard["samples"]]
        by_case[case] = {f["name"]: (f["sha256"], (out / "train" / f["name"]).stat().st_ino) for f in files}
    return by_case


def check_exact(root: Path, out: Path, context: int = 1) -> None:
    """Every stored slice (both modalities, ``context`` neighbours each side, edge slices repeated) and label equal
    to nibabel's reading."""
    ds = shardkit.open(out / "train")
    assert len(ds) > 0
    for i in range(len(ds)):
        case, _, where = ds.key(i).partition("/")
        index = int(where[1:])
        t1, second, lab = volumes_of(root, case)
        image, label = ds[i]
        last = t1.shape[2] - 1
        for band, (vol, offset) in enumerate((v, o) for v in (t1, second) for o in range(-context, context + 1)):
            np.testing.assert_array_equal(image[..., band], vol[:, :, min(max(index + offset, 0), last)])
        np.testing.assert_array_equal(label, lab[:, :, index])


def test_an_edited_modality_file_rewrites_only_its_cases_shard(tmp_path: Path) -> None:
    root, out = nnunet_tree(tmp_path / "Dataset001", cases=INT16_CASES), tmp_path / "out"
    assert "2 shards planned, 0 reused" in convert(root, out)
    before = shard_files(out)
    assert sorted(before) == ["anat", "twin"]  # one shard per case (--shard-size 1: a case is never split)

    second = root / "imagesTr" / "twin_0001.nii.gz"  # twin's 2nd modality: same header, other values
    img = nib.load(str(second))
    nib.save(type(img)(np.asanyarray(img.dataobj) + 7, img.affine, img.header), str(second))
    reused = convert(root, out)
    after = shard_files(out)
    assert after["anat"] == before["anat"]  # reused: the very same files
    assert "2 shards planned, 1 reused, 1 to write" in reused
    assert set(after["twin"]) != set(before["twin"])  # a new key: its fingerprint covers the edited file
    assert not set(after["twin"].values()) & set(before["twin"].values())
    check_exact(root, out)

    first = root / "imagesTr" / "anat_0000.nii"  # anat's 1st modality, in its pair: rewritten alone as well
    data = np.asanyarray(nib.load(str(first)).dataobj)
    img = nib.load(str(first))
    nib.save(type(img)(data - 3, img.affine, img.header), str(first))
    reused = convert(root, out)
    again = shard_files(out)
    assert again["twin"] == after["twin"] and set(again["anat"]) != set(after["anat"])
    assert "2 shards planned, 1 reused, 1 to write" in reused
    check_exact(root, out)


@pytest.mark.parametrize("name", ["anat_0001.nii.gz", "anat_0000.nii"])
def test_a_touched_but_equal_modality_file_reuses_every_shard(tmp_path: Path, name: str) -> None:
    root, out = nnunet_tree(tmp_path / "Dataset001", cases=INT16_CASES), tmp_path / "out"
    convert(root, out)
    before = shard_files(out)
    path = root / "imagesTr" / name
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))  # same bytes, a newer mtime
    assert "2 shards planned, 2 reused, 0 to write" in convert(root, out)  # the full path ran, hashing the file
    assert shard_files(out) == before
    check_exact(root, out)


def test_an_edited_case_rewrites_only_its_shard_on_a_per_case_folder_tree(tmp_path: Path) -> None:
    """BraTS-like folders: the fingerprint covers the --modalities files found by name beside the first."""
    from .test_volumes import _second_modality

    root = tmp_path / "brats"
    for case in ("a", "b"):
        (root / case).mkdir(parents=True)
        (root / case / f"{case}_t1.nii").write_bytes((DATA / "anatomical.nii").read_bytes())
        _second_modality(DATA / "anatomical.nii", root / case / f"{case}_flair.nii.gz")
        (root / case / f"{case}_seg.nii.gz").write_bytes((DATA / "anatomical_label.nii.gz").read_bytes())
    out = tmp_path / "out"
    args = ("--num-classes", "2", "--modalities", "t1,flair")
    convert(root, out, *args)
    before = shard_files(out)
    flair = root / "b" / "b_flair.nii.gz"
    img = nib.load(str(flair))
    nib.save(type(img)(np.asanyarray(img.dataobj) * 2, img.affine, img.header), str(flair))
    convert(root, out, *args)
    after = shard_files(out)
    assert after["a"] == before["a"] and set(after["b"]) != set(before["b"])
    ds = shardkit.open(out / "train")
    t1 = np.asanyarray(nib.load(str(DATA / "anatomical.nii")).dataobj)
    flair_data = np.asanyarray(nib.load(str(flair)).dataobj)
    seen = 0
    for i in range(len(ds)):
        case, _, where = ds.key(i).partition("/")
        if case != "b":
            continue
        image, _ = ds[i]
        k = int(where[1:])
        np.testing.assert_array_equal(image[..., 1], t1[:, :, k])
        np.testing.assert_array_equal(image[..., 4], flair_data[:, :, k])
        seen += 1
    assert seen == t1.shape[2]


def test_an_edit_to_the_first_band_chosen_by_modalities_rewrites_its_case(tmp_path: Path) -> None:
    """``--modalities t1,flair``: discovery pairs each case with its first file by name (flair), so t1 (the first
    band) is a file beside the pair's own: its digest must be folded into the case's fingerprint too (it was not:
    only the bands after the first were, and an edit to t1 reused the stale shard)."""
    from .test_volumes import _second_modality

    root = tmp_path / "brats"
    for case in ("a", "b"):
        (root / case).mkdir(parents=True)
        (root / case / f"{case}_t1.nii").write_bytes((DATA / "anatomical.nii").read_bytes())
        _second_modality(DATA / "anatomical.nii", root / case / f"{case}_flair.nii.gz")
        (root / case / f"{case}_seg.nii.gz").write_bytes((DATA / "anatomical_label.nii.gz").read_bytes())
    out = tmp_path / "out"
    args = ("--num-classes", "2", "--modalities", "t1,flair")
    convert(root, out, *args)
    before = shard_files(out)
    t1_path = root / "b" / "b_t1.nii"
    img = nib.load(str(t1_path))
    t1 = np.asanyarray(img.dataobj) - 5
    nib.save(type(img)(t1, img.affine, img.header), str(t1_path))
    assert "2 shards planned, 1 reused, 1 to write" in convert(root, out, *args)
    after = shard_files(out)
    assert after["a"] == before["a"] and set(after["b"]) != set(before["b"])
    ds = shardkit.open(out / "train")
    for i in range(len(ds)):
        case, _, where = ds.key(i).partition("/")
        if case == "b":
            np.testing.assert_array_equal(ds[i][0][..., 1], t1[:, :, int(where[1:])])  # band 0 x (K=1) centre


def test_a_volume_split_on_the_dask_backend_is_byte_identical(tmp_path: Path) -> None:
    """The same cases cut on a real (loopback) Dask cluster write the local pool's bytes, shard for shard."""
    pytest.importorskip("distributed")
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert as convert_api
    from shardkit.store.records import content_digest

    root = nnunet_tree(tmp_path / "Dataset001", cases=INT16_CASES)
    digests = []
    for backend in ("local", "dask"):
        out = tmp_path / backend
        convert_api(ConvertConfig(root, out, shard_size=ShardSize(samples=8), workers=2, backend=backend,
                                  quiet=True, context=2, empty_slices="drop"))
        digests.append({p.name: content_digest(p) for p in sorted((out / "train").iterdir()) if p.is_file()})
    assert digests[0] == digests[1] and len(digests[0]) >= 7  # two case shards (3 files each) and the manifest
    manifest = json.loads((tmp_path / "dask" / "train" / "manifest.json").read_text())
    assert sorted(manifest["source"]["volumes"]["cases"]) == ["anat", "twin"]
    check_exact(root, tmp_path / "dask", context=2)
