"""``--images``/``--labels`` templates naming 3-D volume cases (docs/volumes.md): ``{case}`` and ``{modality}``
over trees no volume layout detects, with the real NIfTI, NRRD and DICOM volumes of tests/data; every stored slice
equal to nibabel's / pynrrd's / pydicom's reading; one-line refusals; ``--on-error skip`` for a case missing a
modality or its label."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.read.volumes import stitch_volume

from ..volumes.test_dicom import pydicom_reading
from .test_volumes import DATA, _second_modality

nib = pytest.importorskip("nibabel")

NRRD = Path(__file__).resolve().parents[1] / "data" / "nrrd"
CT5N = Path(__file__).resolve().parents[1] / "data" / "dicom" / "CT5N"
IMAGES = "scans/{case}/{case}_{modality}.nii*"
LABELS = "scans/{case}/{case}_seg.nii.gz"


def convert(root: Path, out: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["convert", str(root), str(out), "--num-classes", "2", "--workers", "1",
                                       "--shard-size", "1", *args])
    return result.exit_code, result.output


def nifti_tree(root: Path, cases: tuple[str, ...] = ("p1", "p2")) -> Path:
    """``scans/<case>/<case>_t1.nii`` (nibabel's real T1), ``<case>_neg.nii.gz`` (its negative, on its grid) and
    ``<case>_seg.nii.gz`` (its real label): neither nnU-Net's tree nor per-case folders at the root."""
    for case in cases:
        folder = root / "scans" / case
        folder.mkdir(parents=True)
        shutil.copy(DATA / "anatomical.nii", folder / f"{case}_t1.nii")
        _second_modality(DATA / "anatomical.nii", folder / f"{case}_neg.nii.gz")
        shutil.copy(DATA / "anatomical_label.nii.gz", folder / f"{case}_seg.nii.gz")
    return root


def test_the_tree_is_not_detected_without_templates(tmp_path: Path) -> None:
    code, output = convert(nifti_tree(tmp_path / "tree"), tmp_path / "out")
    assert code == 1 and "no known dataset layout" in output, output


@pytest.mark.parametrize(("order", "bands"), [(None, ("neg", "t1")), ("t1,neg", ("t1", "neg"))])
def test_nifti_modalities_stack_in_name_or_modalities_order_exactly(tmp_path: Path, validate_manifest,
                                                                    order: str | None,
                                                                    bands: tuple[str, ...]) -> None:
    root, out = nifti_tree(tmp_path / "tree"), tmp_path / "out"
    code, output = convert(root, out, "--images", IMAGES, "--labels", LABELS,
                           *(["--modalities", order] if order else []))
    assert code == 0, output
    assert "layout case-templates" in output
    if order is None:
        assert "modalities not given: bands in name order ['neg', 't1']" in output
    manifest = validate_manifest(out / "all")
    assert manifest["source"]["volumes"]["slicing"]["modalities"] == list(bands)
    t1 = np.asanyarray(nib.load(str(DATA / "anatomical.nii")).dataobj)
    label = np.asanyarray(nib.load(str(DATA / "anatomical_label.nii.gz")).dataobj)
    want = {"t1": t1, "neg": -t1}
    ds = shardkit.open(out / "all")
    assert len(ds) == 2 * t1.shape[2]
    for i in range(len(ds)):
        where = ds.key(i).partition("/")[2]
        index = int(where[1:])
        image, ids = ds[i]
        for band, name in enumerate(bands):
            np.testing.assert_array_equal(image[..., band], want[name][:, :, index])
        np.testing.assert_array_equal(ids, label[:, :, index])
    record = manifest["source"]["volumes"]["cases"]["p2"]
    assert record["images"] == [f"scans/p2/p2_{b}.nii" + (".gz" if b == "neg" else "") for b in bands]
    stitched, _ = stitch_volume(ds, "p2")
    np.testing.assert_array_equal(stitched, label)


def test_a_single_nrrd_modality_and_a_dicom_series_folder_named_by_templates(tmp_path: Path) -> None:
    nrrd = pytest.importorskip("nrrd")
    root = tmp_path / "tree"
    (root / "vols").mkdir(parents=True)
    (root / "masks").mkdir()
    shutil.copy(NRRD / "BallBinary30x30x30.nrrd", root / "vols" / "ball.nrrd")
    ball, _ = nrrd.read(str(NRRD / "BallBinary30x30x30.nrrd"))
    twin = nib.load(str(NRRD / "BallBinary30x30x30.nii.gz"))
    nib.save(nib.Nifti1Image((ball > 0).astype(np.uint8), twin.affine), str(root / "masks" / "ball_mask.nii.gz"))
    code, output = convert(root, tmp_path / "out", "--images", "vols/{case}.nrrd", "--labels",
                           "masks/{case}_mask.nii.gz")
    assert code == 0, output
    ds = shardkit.open(tmp_path / "out" / "all")
    assert len(ds) == 30
    for i in range(len(ds)):
        index = int(ds.key(i).split("/k")[1])
        image, ids = ds[i]
        np.testing.assert_array_equal(image[..., 0], ball[:, :, index])
        np.testing.assert_array_equal(ids, (ball[:, :, index] > 0).astype(np.uint8))
    # a DICOM series: the template names a folder
    pytest.importorskip("pydicom")
    root = tmp_path / "dicom"
    hu, affine = pydicom_reading(CT5N)
    for case, threshold in (("a", -300), ("b", 0)):
        shutil.copytree(CT5N, root / "patients" / case / "ct")
        nib.save(nib.Nifti1Image((hu > threshold).astype(np.uint8), affine),
                 str(root / "patients" / case / "mask.nii.gz"))
    code, output = convert(root, tmp_path / "out2", "--images", "patients/{case}/ct", "--labels",
                           "patients/{case}/mask.nii.gz")
    assert code == 0, output
    ds = shardkit.open(tmp_path / "out2" / "all")
    assert len(ds) == 10 and ds.manifest.source.extra["volumes"]["cases"]["a"]["image"]["format"] == "dicom"
    for i in range(len(ds)):
        case, _, where = ds.key(i).partition("/")
        index = int(where[1:])
        image, ids = ds[i]
        np.testing.assert_array_equal(image[..., 0], hu[:, :, index])
        np.testing.assert_array_equal(ids, (hu[:, :, index] > (-300 if case == "a" else 0)).astype(np.uint8))


def test_templates_that_cannot_be_read_are_refused_in_one_line(tmp_path: Path) -> None:
    root = nifti_tree(tmp_path / "tree")
    cases = [
        (("--images", "nothing/{case}_{modality}.nii.gz", "--labels", LABELS), "matches no volume file"),
        (("--images", "scans/{case}/{case}_{modality}.nii.gz", "--labels", "scans/{name}_seg.nii.gz"),
         "names {case} (3-D volume cases), the other {name}"),
        (("--images", "scans/p1/{name}_t1.nii", "--labels", "scans/p1/{name}_seg.nii.gz"),
         "matches the 3-D volume scans/p1/p1_t1.nii: volume cases are named by {case}"),
        (("--images", IMAGES, "--labels", "scans/{case}/{case}_seg_{modality}.nii.gz"), "goes once, in --images"),
    ]
    for args, message in cases:
        code, output = convert(root, tmp_path / "out", *args)
        assert code != 0 and message in output, (args, output)
        assert "Traceback" not in output
    (root / "scans" / "p1" / "p1_t1.png").write_bytes(b"")  # refused by its name, before it is read
    code, output = convert(root, tmp_path / "out", "--images", "scans/{case}/{case}_{modality}.*", "--labels",
                           LABELS)
    assert code == 1 and "matches the image file scans/p1/p1_t1.png: a template with {case} reads 3-D volumes" in output


def _skipped(out: Path) -> list[dict[str, str]]:
    return json.loads((out / "all" / "manifest.json").read_text())["skipped"]


@pytest.mark.parametrize(("remove", "message"), [
    ("p2/p2_neg.nii.gz", "case 'p2' has no modality 'neg' volume matching --images"),
    ("p2/p2_seg.nii.gz", "case 'p2' has no label volume matching --labels"),
])
def test_a_case_missing_a_file_is_refused_or_with_on_error_skip_skipped_and_recorded(tmp_path: Path, remove: str,
                                                                                     message: str) -> None:
    root = nifti_tree(tmp_path / "tree", ("p1", "p2", "p3"))
    (root / "scans" / remove).unlink()
    code, output = convert(root, tmp_path / "out", "--images", IMAGES, "--labels", LABELS)
    assert code == 1 and message in output and "Traceback" not in output, output
    assert not (tmp_path / "out" / "all" / "manifest.json").exists()  # nothing published
    if "seg" in remove:  # a missing label is found by discovery, so a dry run says so too
        code, output = convert(root, tmp_path / "dry", "--images", IMAGES, "--labels", LABELS, "--dry-run")
        assert code == 1 and message in output, output
    code, output = convert(root, tmp_path / "out", "--images", IMAGES, "--labels", LABELS, "--on-error", "skip")
    assert code == 3, output  # inputs skipped
    line = next(ln for ln in output.splitlines() if ln.startswith("skipped p2: "))
    assert message in line
    skipped = _skipped(tmp_path / "out")
    assert [s["key"] for s in skipped] == ["p2"] and message in skipped[0]["reason"]
    ds = shardkit.open(tmp_path / "out" / "all")
    assert sorted({ds.key(i).split("/")[0] for i in range(len(ds))}) == ["p1", "p3"]


def test_an_unreadable_modality_is_skipped_with_on_error_skip(tmp_path: Path) -> None:
    root = nifti_tree(tmp_path / "tree", ("p1", "p2"))
    (root / "scans" / "p1" / "p1_neg.nii.gz").write_bytes(b"not a volume")  # the first case: its header fails
    code, output = convert(root, tmp_path / "out", "--images", IMAGES, "--labels", LABELS)
    assert code == 1 and "p1_neg.nii.gz" in output and "Traceback" not in output, output
    code, output = convert(root, tmp_path / "out", "--images", IMAGES, "--labels", LABELS, "--on-error", "skip")
    assert code == 3, output  # inputs skipped
    assert [s["key"] for s in _skipped(tmp_path / "out")] == ["p1"]
    assert len(shardkit.open(tmp_path / "out" / "all")) == 25


def _brats(root: Path, cases: tuple[str, ...] = ("p1", "p2", "p3")) -> Path:
    """Per-case folders (detected): ``<case>/<case>_t1.nii``, ``<case>_neg.nii.gz``, ``<case>_seg.nii.gz``."""
    for case in cases:
        (root / case).mkdir(parents=True)
        shutil.copy(DATA / "anatomical.nii", root / case / f"{case}_t1.nii")
        _second_modality(DATA / "anatomical.nii", root / case / f"{case}_neg.nii.gz")
        shutil.copy(DATA / "anatomical_label.nii.gz", root / case / f"{case}_seg.nii.gz")
    return root


@pytest.mark.parametrize(("tree", "remove", "message"), [
    ("case-folders", "p1/p1_neg.nii.gz", "case 'p1' has modalities ['t1'], not ['neg', 't1']"),  # was: blamed p2
    ("case-folders", "p2/p2_seg.nii.gz", "case folder 'p2' has no p2_seg.nii.gz"),
    ("nnunet", "imagesTr/moved_0001.nii.gz", "case 'moved' has channels [0], dataset.json names 2"),
    ("nnunet", "labelsTr/anat.nii.gz", "case 'anat' has no label volume anat.nii.gz"),
])
def test_a_detected_tree_missing_a_file_is_refused_or_with_on_error_skip_that_case_skipped(
        tmp_path: Path, tree: str, remove: str, message: str) -> None:
    """Before: the missing file refused the whole tree at discovery even with --on-error skip."""
    from .test_volumes import nnunet_tree

    root = _brats(tmp_path / "t") if tree == "case-folders" else nnunet_tree(tmp_path / "t")
    (root / remove).unlink()
    case = remove.split("/")[1].split("_")[0].split(".")[0]
    code, output = convert(root, tmp_path / "out", "--shard-size", "1")
    assert code == 1 and message in output and "Traceback" not in output, output
    code, output = convert(root, tmp_path / "out", "--on-error", "skip")
    assert code == 3, output
    split = "train"
    skipped = json.loads((tmp_path / "out" / split / "manifest.json").read_text())["skipped"]
    assert [s["key"] for s in skipped] == [case], skipped
    assert f"skipped {case}: " in output
    ds = shardkit.open(tmp_path / "out" / split)
    kept = sorted({ds.key(i).split("/")[0] for i in range(len(ds))})
    assert case not in kept and kept
    t1 = np.asanyarray(nib.load(str(DATA / "anatomical.nii")).dataobj)
    for i in range(len(ds)):
        if ds.key(i).startswith("anat/") or tree == "case-folders":
            index = int(ds.key(i).split("/")[1][1:])
            np.testing.assert_array_equal(ds[i][0][..., 0 if tree == "nnunet" else 1], t1[:, :, index])


def test_template_cases_reuse_unchanged_shards_and_an_unchanged_run_is_a_no_op(tmp_path: Path) -> None:
    root, out = nifti_tree(tmp_path / "tree"), tmp_path / "out"
    args = ("--images", IMAGES, "--labels", LABELS, "--modalities", "neg,t1")
    code, output = convert(root, out, *args)
    assert code == 0 and "2 shards planned, 0 reused, 2 to write" in output, output
    code, output = convert(root, out, *args)
    assert code == 0 and "nothing changed" in output, output
    path = root / "scans" / "p2" / "p2_t1.nii"  # the second band: not the file discovery pairs the case by
    img = nib.load(str(path))
    t1 = np.asanyarray(img.dataobj) + 9
    nib.save(type(img)(t1, img.affine, img.header), str(path))
    code, output = convert(root, out, *args)
    assert code == 0 and "2 shards planned, 1 reused, 1 to write" in output, output
    ds = shardkit.open(out / "all")
    for i in range(len(ds)):
        case, _, where = ds.key(i).partition("/")
        if case == "p2":
            np.testing.assert_array_equal(ds[i][0][..., 1], t1[:, :, int(where[1:])])


def test_templates_with_globs_find_each_cases_files_by_listing(tmp_path: Path) -> None:
    """``**`` left in the template once the case and modality are filled in: the worker lists the folders under the
    filled template's fixed part (one stat per modality otherwise)."""
    root = nifti_tree(tmp_path / "tree")
    code, output = convert(root, tmp_path / "out", "--images", "**/{case}_{modality}.nii*", "--labels",
                           "*/{case}/{case}_seg.nii.gz", "--modalities", "t1,neg")
    assert code == 0, output
    t1 = np.asanyarray(nib.load(str(DATA / "anatomical.nii")).dataobj)
    ds = shardkit.open(tmp_path / "out" / "all")
    assert len(ds) == 2 * t1.shape[2]
    for i in range(len(ds)):
        k = int(ds.key(i).split("/k")[1])
        np.testing.assert_array_equal(ds[i][0][..., 0], t1[:, :, k])
        np.testing.assert_array_equal(ds[i][0][..., 1], -t1[:, :, k])
