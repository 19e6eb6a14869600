"""``shardkit convert`` on volume trees (docs/volumes.md), from the real volumes of tests/data/nifti: every stored
slice equals nibabel's reading, each label volume stitched back from the shards equals its file, and what a volume
run cannot do yet is refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.read.volumes import groups, stitch_volume, write_stitched

from .test_volumes import CASES, DATA, _second_modality, nnunet_tree

nib = pytest.importorskip("nibabel")


def convert(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["convert", *args, "--workers", "1"])
    return result.exit_code, result.output


def volumes_of(root: Path, case: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(np.asanyarray(nib.load(str(p)).dataobj) for p in (  # type: ignore[return-value]
        root / "imagesTr" / f"{case}_0000.nii", root / "imagesTr" / f"{case}_0001.nii.gz",
        root / "labelsTr" / f"{case}.nii.gz"))


#: two int16 cases (nibabel's T1 twice: two groups of one type) — a split stores one element type
INT16_CASES = {"anat": CASES["anat"], "twin": CASES["anat"]}


@pytest.mark.parametrize(("cases", "dtype"), [(INT16_CASES, np.int16), ({"moved": CASES["moved"]}, np.float32)])
def test_an_nnunet_tree_converts_to_exact_slices_that_stitch_back(tmp_path: Path, validate_manifest,
                                                                  cases: dict[str, tuple[str, str]],
                                                                  dtype: type) -> None:
    root, out = nnunet_tree(tmp_path / "Dataset001", cases=cases), tmp_path / "out"
    code, output = convert(str(root), str(out), "--context", "1", "--empty-slices", "drop")
    assert code == 0, output
    first = sorted(cases)[0]
    assert f"slices along each case's axis of largest spacing (first case {first}: axis k (2)" in output
    manifest = validate_manifest(out / "train")
    report = manifest["source"]["volumes"]
    assert report["slicing"]["context"] == 1 and report["slicing"]["modalities"] == ["T1", "negT1"]
    ds = shardkit.open(out / "train")
    assert len(ds) == report["slices"]["written"] == report["slices"]["slices"] - report["slices"]["dropped_empty"]
    assert report["slices"]["dropped_empty"] > 0 and manifest["num_samples"] == len(ds)
    seen: dict[str, list[int]] = {}
    for i in range(len(ds)):
        case, _, where = ds.key(i).partition("/")
        index = int(where[1:])
        t1, neg, lab = volumes_of(root, case)
        image, label = ds[i]
        assert image.dtype == dtype and image.shape == (*t1.shape[:2], 6)
        last = t1.shape[2] - 1
        for band, (vol, offset) in enumerate((v, o) for v in (t1, neg) for o in (-1, 0, 1)):
            np.testing.assert_array_equal(image[..., band], vol[:, :, min(max(index + offset, 0), last)])
        np.testing.assert_array_equal(label, lab[:, :, index])
        seen.setdefault(case, []).append(index)
    assert sorted(seen) == sorted(cases)
    assert groups(ds) == [ds.key(i).split("/")[0] for i in range(len(ds))] and set(groups(ds)) == set(cases)
    assert all(report["cases"][case]["group"] == case for case in cases)
    for case in seen:
        written = write_stitched(ds, case, tmp_path / f"{case}.nii.gz")
        back, original = nib.load(str(written)), nib.load(str(root / "labelsTr" / f"{case}.nii.gz"))
        np.testing.assert_array_equal(np.asanyarray(back.dataobj), np.asanyarray(original.dataobj))
        np.testing.assert_array_equal(back.affine, original.affine)
        assert back.get_data_dtype() == original.get_data_dtype()


def test_cases_of_another_element_type_are_refused_not_cast(tmp_path: Path) -> None:
    code, output = convert(str(nnunet_tree(tmp_path / "d")), str(tmp_path / "out"))  # anat int16, moved float32
    assert code == 1 and "Traceback" not in output
    assert "case 'moved' gives float32 slices of 2 bands; this split stores int16 with 2 bands" in output
    assert not (tmp_path / "out" / "train" / "manifest.json").exists()


def test_a_changed_second_modality_is_written_again_not_reused(tmp_path: Path) -> None:
    root, out = nnunet_tree(tmp_path / "Dataset001", cases=INT16_CASES), tmp_path / "out"
    assert convert(str(root), str(out))[0] == 0
    first = shardkit.open(out / "train")
    key = first.key(0)
    before = first[0][0][..., 1].copy()
    _second_modality(DATA / "anatomical.nii", root / "imagesTr" / "anat_0001.nii.gz")  # same header, new values
    img = nib.load(str(root / "imagesTr" / "anat_0001.nii.gz"))
    nib.save(type(img)(np.asanyarray(img.dataobj) + 7, img.affine, img.header), str(root / "imagesTr" /
                                                                                     "anat_0001.nii.gz"))
    code, output = convert(str(root), str(out))
    assert code == 0, output
    again = shardkit.open(out / "train")
    assert again.key(0) == key
    np.testing.assert_array_equal(again[0][0][..., 1], before + 7)


def test_per_case_folders_convert_with_the_modality_order_and_classes_given(tmp_path: Path) -> None:
    root, out = tmp_path / "brats", tmp_path / "out"
    (root / "anat").mkdir(parents=True)
    shutil.copy(DATA / "anatomical.nii", root / "anat" / "anat_t1.nii")
    _second_modality(DATA / "anatomical.nii", root / "anat" / "anat_flair.nii.gz")
    shutil.copy(DATA / "anatomical_label.nii.gz", root / "anat" / "anat_seg.nii.gz")
    code, output = convert(str(root), str(out))
    assert code == 2 and "per-case volume folders carry no class table" in output and "--num-classes" in output
    code, output = convert(str(root), str(out), "--num-classes", "2", "--modalities", "t1,flair", "--slices", "j")
    assert code == 0, output
    ds = shardkit.open(out / "train")
    t1 = np.asanyarray(nib.load(str(DATA / "anatomical.nii")).dataobj)
    assert len(ds) == t1.shape[1] and ds.key(3) == "anat/j0003"
    image, _ = ds[3]
    np.testing.assert_array_equal(image[..., 0], t1[:, 3, :])
    np.testing.assert_array_equal(image[..., 1], -t1[:, 3, :])
    ids, volume = stitch_volume(ds, "anat")
    np.testing.assert_array_equal(ids, np.asanyarray(nib.load(str(DATA / "anatomical_label.nii.gz")).dataobj))
    assert volume["format"] == "nifti1"


@pytest.mark.parametrize(("args", "message"), [
    (["--tile", "16x16"], "--tile is not available for 3-D volumes yet"),
    (["--size", "16x16"], "--size is not available for 3-D volumes yet"),
    (["--reduce-zero-label"], "--label-map/--reduce-zero-label/--threshold is not available for 3-D volumes yet"),
    (["--slices", "z"], "--slices 'z' is not an array axis"),
])
def test_what_a_volume_run_cannot_do_is_refused_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    code, output = convert(str(nnunet_tree(tmp_path / "d")), str(tmp_path / "out"), *args)
    assert code != 0 and message in output and "Traceback" not in output
    assert not (tmp_path / "out" / "train").exists()


def test_dataset_json_labels_that_are_not_consecutive_are_refused(tmp_path: Path) -> None:
    root = nnunet_tree(tmp_path / "d", labels={"background": 0, "edema": 1, "enhancing": 4})
    code, output = convert(str(root), str(tmp_path / "out"))
    assert code == 1 and "'labels' has ids [0, 1, 4]: shardkit stores class ids 0..2" in output


def test_a_label_value_outside_the_class_table_fails_the_run_in_one_line(tmp_path: Path) -> None:
    root = nnunet_tree(tmp_path / "d", labels={"background": 0})
    code, output = convert(str(root), str(tmp_path / "out"))
    assert code == 1 and "label value 1 (" in output and "is not one of the classes [0]" in output
    assert "Traceback" not in output and not (tmp_path / "out" / "train" / "manifest.json").exists()


def test_the_unlabelled_test_split_is_said_to_be_left_out(tmp_path: Path) -> None:
    root = nnunet_tree(tmp_path / "d")
    (root / "imagesTs").mkdir()
    shutil.copy(DATA / "anatomical.nii", root / "imagesTs" / "new_0000.nii")
    shutil.copy(DATA / "anatomical.nii", root / "imagesTs" / "new_0001.nii")
    code, output = convert(str(root), str(tmp_path / "out"), "--dry-run")
    assert code == 0, output
    assert "split test has no label volumes (imagesTs/) and is not converted" in output
    assert "split train: 2 pairs" in output and "layout nnunet" in output
    assert json.loads((root / "dataset.json").read_text())["channel_names"]["0"] == "T1"


def test_the_shards_are_the_same_bytes_for_any_worker_count(tmp_path: Path) -> None:
    root = nnunet_tree(tmp_path / "d", cases=INT16_CASES)
    digests = []
    for workers in ("1", "2"):
        out = tmp_path / f"out{workers}"
        result = CliRunner().invoke(main, ["convert", str(root), str(out), "--workers", workers, "--shard-size", "8",
                                           "--context", "2"])
        assert result.exit_code == 0, result.output
        manifest = json.loads((out / "train" / "manifest.json").read_text())
        digests.append([(f["name"], f["sha256"]) for s in manifest["shards"] for f in s["files"]])
    assert digests[0] == digests[1] and len(digests[0]) > 2


@pytest.mark.parametrize("args", [["--slices", "k"], ["--context", "1"], ["--empty-slices", "drop"],
                                  ["--modalities", "t1,t2"], ["--spacing", "1,1,1"]])
def test_volume_options_on_an_image_dataset_are_refused_not_ignored(tmp_path: Path, args: list[str]) -> None:
    isbi = Path(__file__).resolve().parents[1] / "data" / "isbi-em"
    root = tmp_path / "em"
    for folder, src in (("images", "image"), ("labels", "label")):
        (root / folder).mkdir(parents=True)
        shutil.copyfile(isbi / src / "0.png", root / folder / "0.png")
    code, output = convert(str(root), str(tmp_path / "out"), "--label-map", "255:1", *args)
    assert code == 2 and f"{args[0]} is for 3-D volume trees, and the generic layout holds images" in output


def msd_tree(root: Path, modality: dict[str, str]) -> tuple[Path, np.ndarray, np.ndarray]:
    """MSD's own layout: nibabel's 4-D NIfTI-2 example (32x20x12, 2 volumes) as one case of two modalities, a label
    thresholded from it at test time, and a macOS ``._`` resource fork as MSD's archives carry."""
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    shutil.copy(DATA / "example_nifti2.nii.gz", root / "imagesTr" / "case1.nii.gz")
    (root / "imagesTr" / "._case1.nii.gz").write_bytes(b"\x00\x05\x16\x07 macOS resource fork")
    img = nib.load(str(DATA / "example_nifti2.nii.gz"))
    data = np.asanyarray(img.dataobj)
    label = (data[..., 0] > np.median(data[..., 0])).astype(np.uint8)
    nib.save(nib.Nifti2Image(label, img.affine), str(root / "labelsTr" / "case1.nii.gz"))
    (root / "dataset.json").write_text(json.dumps({"name": "example", "modality": modality,
                                                   "labels": {"0": "background", "1": "bright"}, "numTraining": 1,
                                                   "training": [{"image": "./imagesTr/case1.nii.gz",
                                                                 "label": "./labelsTr/case1.nii.gz"}]}))
    return root, data, label


def test_msd_4d_images_are_read_as_their_modalities_and_stitch_back(tmp_path: Path, validate_manifest) -> None:
    root, data, label = msd_tree(tmp_path / "Task00_Example", {"0": "first", "1": "second"})
    out = tmp_path / "out"
    code, output = convert(str(root), str(out), "--slices", "i")
    assert code == 0, output
    assert "int16, 2 bands (first/second x 1 slices)" in output
    assert validate_manifest(out / "train")["source"]["volumes"]["cases"]["case1"]["image"]["channels"] == 2
    ds = shardkit.open(out / "train")
    assert len(ds) == data.shape[0] and groups(ds) == ["case1"] * data.shape[0]
    for i in range(len(ds)):
        image, stored = ds[i]
        assert ds.key(i) == f"case1/i{i:04d}"
        np.testing.assert_array_equal(image, data[i])  # (20, 12, 2): both modalities of slice i
        np.testing.assert_array_equal(stored, label[i])
    back = nib.load(str(write_stitched(ds, "case1", tmp_path / "case1.nii.gz")))
    np.testing.assert_array_equal(np.asanyarray(back.dataobj), label)
    assert isinstance(back, nib.Nifti2Image) and (back.affine == nib.load(str(root / "labelsTr" / "case1.nii.gz"))
                                                  .affine).all()


def test_an_msd_image_with_another_modality_count_than_dataset_json_is_refused(tmp_path: Path) -> None:
    root, _, _ = msd_tree(tmp_path / "Task00_Example", {"0": "a", "1": "b", "2": "c"})
    code, output = convert(str(root), str(tmp_path / "out"))
    assert code == 1 and "dataset.json names 3 modalities, so MSD stores them on a 4th axis of 3" in output


def test_a_volume_file_is_decoded_from_the_bytes_its_worker_hashed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """One read of each input file up to the keep limit: the worker decodes a case's image and label from the bytes
    it read to fingerprint them, not from a second read. Shown by handing the decoder other bytes than the file
    holds (the label with its classes swapped, as if the file changed between the two reads): the stored labels
    are those bytes' (nibabel reads the file's), and the image equals nibabel's reading."""
    import shardkit.conversion.worker as worker

    root, out = nnunet_tree(tmp_path / "Dataset001", cases={"anat": CASES["anat"]}), tmp_path / "out"
    label_file = root / "labelsTr" / "anat.nii.gz"
    original = nib.load(str(label_file))
    ids = np.asanyarray(original.dataobj)
    swapped = tmp_path / "swapped.nii.gz"
    nib.save(nib.Nifti1Image((1 - ids).astype(ids.dtype), original.affine, original.header), str(swapped))
    real = worker.source_digest
    kept: list[str] = []

    def digest(path: Path, cached: object, on_error: str, *, keep: bool = False) -> object:
        entry, cacheable, data = real(path, cached, on_error, keep=keep)  # type: ignore[arg-type]
        if data is not None:
            kept.append(Path(path).name)
        if Path(path) == label_file and data is not None:
            data = np.frombuffer(swapped.read_bytes(), np.uint8)
        return entry, cacheable, data

    monkeypatch.setattr(worker, "source_digest", digest)
    code, output = convert(str(root), str(out))
    assert code == 0, output
    assert kept == ["anat_0000.nii", "anat.nii.gz"]  # the pair's files, hashed and kept in the worker
    ds = shardkit.open(out / "train")
    t1 = np.asanyarray(nib.load(str(root / "imagesTr" / "anat_0000.nii")).dataobj)
    for i in range(len(ds)):
        image, label = ds[i]
        index = int(ds.key(i).split("/")[1][1:])
        np.testing.assert_array_equal(label, 1 - ids[:, :, index])
        np.testing.assert_array_equal(image[..., 0], t1[:, :, index])
