"""Volume datasets: the nnU-Net/MSD and per-case-folder trees detected, modalities stacked in dataset.json order
and checked to share one grid, labels exact and within the class table; built from the real volumes in
tests/data/nifti (tests/data/README.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from shardkit.conversion.layouts.volumes import detect
from shardkit.conversion.volumes import VolumeRun, cut_split, read_case
from shardkit.errors import DecodeError, LabelError, LayoutError
from shardkit.volumes.nifti import to_nifti
from shardkit.volumes.slices import Slicing, stitch_labels

nib = pytest.importorskip("nibabel")

DATA = Path(__file__).resolve().parents[1] / "data" / "nifti"
CASES = {"anat": ("anatomical.nii", "anatomical_label.nii.gz"),
         "moved": ("reoriented_anat_moved.nii", "reoriented_anat_moved_label.nii.gz")}


def _second_modality(src: Path, dst: Path, affine_shift: float = 0.0) -> None:
    """A second modality on the grid of ``src``: its voxels reversed in sign (stored type kept), same header."""
    img = nib.load(str(src))
    data = np.asanyarray(img.dataobj)
    affine = img.affine.copy()
    affine[0, 3] += affine_shift
    nib.save(type(img)((-data).astype(data.dtype.newbyteorder("=")), affine, img.header), str(dst))


def nnunet_tree(root: Path, labels: dict[str, int] | None = None,
                cases: dict[str, tuple[str, str]] | None = None) -> Path:
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    for case, (image, label) in (cases or CASES).items():
        shutil.copy(DATA / image, root / "imagesTr" / f"{case}_0000.nii")
        _second_modality(DATA / image, root / "imagesTr" / f"{case}_0001.nii.gz")
        shutil.copy(DATA / label, root / "labelsTr" / f"{case}.nii.gz")
    meta = {"channel_names": {"0": "T1", "1": "negT1"}, "labels": labels or {"background": 0, "brain": 1},
            "numTraining": 2, "file_ending": ".nii.gz"}
    (root / "dataset.json").write_text(json.dumps(meta))
    return root


def test_an_nnunet_tree_is_detected_with_its_channels_and_classes(tmp_path: Path) -> None:
    layout = detect(nnunet_tree(tmp_path / "Dataset001"))
    assert layout is not None and layout.kind == "nnunet"
    assert layout.modalities == ("T1", "negT1") and layout.classes == {0: "background", 1: "brain"}
    assert [c.key for c in layout.splits["train"]] == ["anat", "moved"]
    case = layout.splits["train"][0]
    assert [p.name for p in case.images] == ["anat_0000.nii", "anat_0001.nii.gz"]
    assert case.label is not None and case.label.name == "anat.nii.gz"
    assert layout.describe() == "nnunet volume layout, bands ['T1', 'negT1'] (in this order), train: 2 cases"
    assert detect(tmp_path) is None  # the folder above holds neither tree


def test_msd_labels_id_to_name_are_read_too(tmp_path: Path) -> None:
    root = nnunet_tree(tmp_path / "Task01")
    meta = json.loads((root / "dataset.json").read_text())
    meta.pop("channel_names")
    meta.update(modality={"0": "T1", "1": "negT1"}, labels={"0": "background", "1": "brain"})
    (root / "dataset.json").write_text(json.dumps(meta))
    layout = detect(root)
    assert layout is not None and layout.classes == {0: "background", 1: "brain"} and layout.modalities[0] == "T1"


def test_every_slice_of_every_case_equals_nibabel_and_labels_stitch_back(tmp_path: Path) -> None:
    root = nnunet_tree(tmp_path / "Dataset001")
    layout = detect(root)
    assert layout is not None
    run = VolumeRun(Slicing(context=1, empty="drop"))
    by_case: dict[str, list[tuple[int, np.ndarray]]] = {}
    for s in cut_split(layout, "train", run.slicing, run):
        t1 = np.asanyarray(nib.load(str(root / "imagesTr" / f"{s.case}_0000.nii")).dataobj)
        neg = np.asanyarray(nib.load(str(root / "imagesTr" / f"{s.case}_0001.nii.gz")).dataobj)
        lab = np.asanyarray(nib.load(str(root / "labelsTr" / f"{s.case}.nii.gz")).dataobj)
        last = t1.shape[2] - 1
        assert s.axis == 2 and s.image.dtype == t1.dtype.newbyteorder("=")
        for band, (vol, offset) in enumerate((v, o) for v in (t1, neg) for o in (-1, 0, 1)):
            np.testing.assert_array_equal(s.image[..., band], vol[:, :, min(max(s.index + offset, 0), last)])
        assert s.label is not None
        np.testing.assert_array_equal(s.label, lab[:, :, s.index])
        record = s.record()
        assert record["group"] == s.case and record["index"] == s.index and record["spacing"] == list(s.spacing)
        affine = nib.load(str(root / "imagesTr" / f"{s.case}_0000.nii")).affine  # pixel (r, c) → voxel (r, c, index)
        np.testing.assert_allclose(np.array(record["affine"]) @ [3, 5, 0, 1], affine @ [3, 5, s.index, 1])
        by_case.setdefault(s.case, []).append((s.index, s.label))
    report = run.to_json()
    assert report["slicing"] == {"axis": None, "context": 1, "context_padding": "edge", "empty": "drop",
                                 "orientation": "as stored"}
    assert report["slices"]["volumes"] == 2 and report["slices"]["dropped_empty"] > 0
    assert report["slices"]["written"] + report["slices"]["dropped_empty"] == report["slices"]["slices"] == 25 + 22
    for case, parts in by_case.items():
        record = json.loads(json.dumps(run.volumes[case]))  # as a manifest would hold it
        volume = record["label_volume"]
        rebuilt = stitch_labels(tuple(volume["shape"]), record["axis"], parts, record["dropped_empty"])
        nib.save(to_nifti(rebuilt, volume), str(tmp_path / f"{case}.nii.gz"))
        back, original = nib.load(str(tmp_path / f"{case}.nii.gz")), nib.load(str(root / record["label"]))
        np.testing.assert_array_equal(np.asanyarray(back.dataobj), np.asanyarray(original.dataobj))
        np.testing.assert_array_equal(back.affine, original.affine)
        assert back.header.get_data_dtype() == original.header.get_data_dtype()


def test_modalities_on_different_grids_are_refused_in_one_line(tmp_path: Path) -> None:
    root = nnunet_tree(tmp_path / "d")
    shutil.copy(DATA / "reoriented_anat_moved.nii", root / "imagesTr" / "anat_0001.nii")
    (root / "imagesTr" / "anat_0001.nii.gz").unlink()
    layout = detect(root)
    assert layout is not None
    with pytest.raises(DecodeError, match=r"anat_0001.nii: modality is 21x26x22, anat_0000.nii is 33x41x25: "
                                          r"not one grid — fix: resample"):
        read_case(layout.splits["train"][0], layout.classes)


def test_an_affine_off_by_more_than_the_tolerance_is_refused(tmp_path: Path) -> None:
    root = nnunet_tree(tmp_path / "d")
    _second_modality(DATA / "anatomical.nii", root / "imagesTr" / "anat_0001.nii.gz", affine_shift=0.5)
    layout = detect(root)
    assert layout is not None
    with pytest.raises(DecodeError, match=r"modality's affine differs from anat_0000.nii's by up to 0.5"):
        read_case(layout.splits["train"][0], layout.classes)
    _second_modality(DATA / "anatomical.nii", root / "imagesTr" / "anat_0001.nii.gz", affine_shift=1e-5)
    assert read_case(layout.splits["train"][0], layout.classes).images.shape == (2, 33, 41, 25)


def test_a_float_label_of_integers_is_exact_and_a_fraction_is_an_error(tmp_path: Path) -> None:
    root = nnunet_tree(tmp_path / "d")
    src = nib.load(str(DATA / "anatomical_label.nii.gz"))
    ids = np.asanyarray(src.dataobj)
    path = root / "labelsTr" / "anat.nii.gz"
    nib.save(nib.Nifti1Image(ids.astype(np.float32), src.affine), str(path))
    layout = detect(root)
    assert layout is not None
    read = read_case(layout.splits["train"][0], layout.classes)
    assert read.label is not None
    np.testing.assert_array_equal(read.label, ids)
    bad = ids.astype(np.float32)
    bad[10, 10, 10:14] = 0.5
    nib.save(nib.Nifti1Image(bad, src.affine), str(path))
    with pytest.raises(LabelError, match=r"anat.nii.gz: label voxel value .*0.5.* is not an integer \(4 voxels"):
        read_case(layout.splits["train"][0], layout.classes)


@pytest.mark.parametrize("chunk", [1 << 22, 1000])  # one count, or counts summed over 34 chunks
def test_a_label_value_outside_dataset_json_is_an_error_naming_it(tmp_path: Path, chunk: int,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shardkit.conversion.volumes._COUNT_CHUNK", chunk)
    root = nnunet_tree(tmp_path / "d", labels={"background": 0, "brain": 2})
    layout = detect(root)
    assert layout is not None
    count = int((np.asanyarray(nib.load(str(DATA / "anatomical_label.nii.gz")).dataobj) == 1).sum())
    with pytest.raises(LabelError, match=rf"anat.nii.gz: label value 1 \({count} voxels\) is not one of the classes "
                                         r"\[0, 2\] of dataset.json 'labels' — fix:"):
        read_case(layout.splits["train"][0], layout.classes)


def test_a_case_missing_a_channel_or_its_label_is_refused(tmp_path: Path) -> None:
    root = nnunet_tree(tmp_path / "d")
    (root / "imagesTr" / "moved_0001.nii.gz").unlink()
    with pytest.raises(LayoutError, match=r"case 'moved' has channels \[0\], dataset.json names 2"):
        detect(root)
    shutil.copy(DATA / "reoriented_anat_moved.nii", root / "imagesTr" / "moved_0001.nii")
    (root / "labelsTr" / "moved.nii.gz").unlink()
    with pytest.raises(LayoutError, match=r"case 'moved' has no label volume moved.nii.gz"):
        detect(root)


def test_per_case_folders_are_detected_with_modalities_in_name_or_given_order(tmp_path: Path) -> None:
    root = tmp_path / "brats"
    for case, (image, label) in CASES.items():
        (root / case).mkdir(parents=True)
        shutil.copy(DATA / image, root / case / f"{case}_t1.nii")
        _second_modality(DATA / image, root / case / f"{case}_flair.nii.gz")
        shutil.copy(DATA / label, root / case / f"{case}_seg.nii.gz")
    layout = detect(root)
    assert layout is not None and layout.kind == "case-folders" and layout.modalities == ("flair", "t1")
    assert layout.classes is None
    layout = detect(root, ["t1", "flair"])
    assert layout is not None and layout.modalities == ("t1", "flair")
    read = read_case(layout.splits["train"][1], layout.classes)
    moved = np.asanyarray(nib.load(str(DATA / "reoriented_anat_moved.nii")).dataobj)
    np.testing.assert_array_equal(read.images[0], moved)
    (root / "moved" / "moved_flair.nii.gz").rename(root / "moved" / "moved_t2.nii.gz")
    with pytest.raises(LayoutError, match=r"case 'moved' has modalities \['t1', 't2'\], not \['flair', 't1'\]"):
        detect(root, ["t1", "flair"])


def test_volumes_in_a_tree_convert_does_not_know_are_named_with_the_trees_it_reads(tmp_path: Path) -> None:
    """Before: "saw: scans/ (0 images), masks/ (0 images)" and an --images hint that cannot read volumes."""
    from click.testing import CliRunner

    from shardkit.cli import main

    root = tmp_path / "scans-and-masks"
    (root / "scans").mkdir(parents=True)
    (root / "masks").mkdir()
    shutil.copy(DATA / "anatomical.nii", root / "scans" / "anat.nii")
    shutil.copy(DATA / "anatomical_label.nii.gz", root / "masks" / "anat.nii.gz")
    result = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "out")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert ("holds 3-D volumes (NIfTI or NRRD files in masks/, scans/), but not in a volume tree convert knows"
            in result.output)
    assert "0 images" not in result.output and "imagesTr/<case>_0000.nii.gz" in result.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert "--images 'DIR/{case}.nii.gz' --labels 'DIR/{case}.nii.gz'" in result.output
    # the hint followed on this tree: exact slices
    result = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "out"), "--images", "scans/{case}.nii",
                                       "--labels", "masks/{case}.nii.gz", "--num-classes", "2", "--workers", "1"])
    assert result.exit_code == 0, result.output
    import shardkit

    ds = shardkit.open(tmp_path / "out" / "all")
    t1 = np.asanyarray(nib.load(str(DATA / "anatomical.nii")).dataobj)
    label = np.asanyarray(nib.load(str(DATA / "anatomical_label.nii.gz")).dataobj)
    assert len(ds) == t1.shape[2]
    for i in range(len(ds)):
        k = int(ds.key(i).split("/k")[1])
        np.testing.assert_array_equal(ds[i][0][..., 0], t1[:, :, k])
        np.testing.assert_array_equal(ds[i][1], label[:, :, k])


def test_an_msd_4d_image_without_a_channel_suffix_is_refused_with_the_split_fix(tmp_path: Path) -> None:
    root = nnunet_tree(tmp_path / "Task01")
    (root / "imagesTr" / "anat_0000.nii").rename(root / "imagesTr" / "anat.nii")
    with pytest.raises(LayoutError, match=r"anat.nii: is not named <case>_<CCCC>.nii.gz .*"
                                          r"nnUNetv2_convert_MSD_dataset"):
        detect(root)


def test_a_split_cut_into_3d_patches_records_what_stitches_each_case(tmp_path: Path) -> None:
    from shardkit.volumes.patches import Patching, stitch_patches

    root = nnunet_tree(tmp_path / "d")
    layout = detect(root)
    assert layout is not None
    patching = Patching.parse("8x8x8", empty="drop")
    run = VolumeRun(patching)
    parts: dict[str, list[tuple[tuple[int, int, int], np.ndarray]]] = {}
    for p in cut_split(layout, "train", patching, run):
        assert p.image.shape[3] == 2 and p.label is not None  # (D, H, W, modalities)
        t1 = np.asanyarray(nib.load(str(root / "imagesTr" / f"{p.case}_0000.nii")).dataobj)
        region = tuple(slice(o, o + n) for o, n in zip(p.origin, p.image.shape[:3], strict=True))
        np.testing.assert_array_equal(p.image[..., 0], t1[region])
        parts.setdefault(p.case, []).append((p.origin, p.label))  # type: ignore[attr-defined]
    report = json.loads(json.dumps(run.to_json()))
    assert report["patching"]["patch"] == [8, 8, 8] and report["patches"]["dropped_empty"] > 0
    for case, stored in parts.items():
        record = report["volumes"][case]
        shape = tuple(record["label_volume"]["shape"])
        rebuilt = stitch_patches(shape, stored, patching, [tuple(o) for o in record["dropped_empty"]])
        np.testing.assert_array_equal(rebuilt, np.asanyarray(nib.load(str(root / record["label"])).dataobj))


def test_nrrd_cases_are_read_and_a_nifti_image_shares_the_grid_of_an_nrrd_label(tmp_path: Path) -> None:
    """pynrrd's ball: the NIfTI twin as the image, the NRRD (LPS) as the label (ids 0 and 257) — one grid in RAS."""
    from shardkit.volumes.files import write_volume

    nrrd = pytest.importorskip("nrrd")
    balls = Path(__file__).resolve().parents[1] / "data" / "nrrd"
    root = tmp_path / "Dataset002"
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    shutil.copy(balls / "BallBinary30x30x30.nii.gz", root / "imagesTr" / "ball_0000.nii.gz")
    shutil.copy(balls / "BallBinary30x30x30_gz.nrrd", root / "imagesTr" / "ball_0001.nrrd")
    shutil.copy(balls / "BallBinary30x30x30.nrrd", root / "labelsTr" / "ball.nrrd")
    (root / "dataset.json").write_text(json.dumps({"channel_names": {"0": "nifti", "1": "nrrd"},
                                                   "labels": {"background": 0, "ball": 257}, "file_ending": ".nrrd"}))
    layout = detect(root)
    assert layout is not None
    run = VolumeRun(Slicing(axis=0, empty="drop"))
    want, _ = nrrd.read(str(balls / "BallBinary30x30x30.nrrd"))
    parts = []
    for s in cut_split(layout, "train", run.slicing, run):
        np.testing.assert_array_equal(s.image[..., 0], want[s.index])
        np.testing.assert_array_equal(s.image[..., 1], want[s.index])
        assert s.label is not None and s.label.dtype == np.uint16
        np.testing.assert_array_equal(s.label, want[s.index])
        parts.append((s.index, s.label))
    record = json.loads(json.dumps(run.volumes["ball"]))
    assert record["label_volume"]["format"] == "nrrd" and record["dropped_empty"] == []  # the ball fills 0..29
    volume = record["label_volume"]
    rebuilt = stitch_labels(tuple(volume["shape"]), record["axis"], parts, record["dropped_empty"])
    write_volume(rebuilt, volume, tmp_path / "ball.nrrd")
    back, header = nrrd.read(str(tmp_path / "ball.nrrd"))
    np.testing.assert_array_equal(back, want)
    np.testing.assert_array_equal(header["space directions"], nrrd.read_header(str(balls / "BallBinary30x30x30.nrrd"))[
        "space directions"])
