"""DICOM series as modalities of per-case folders (docs/volumes.md): a real CT series (pydicom's 5-slice CT5N,
tests/data/dicom/) converted beside a NIfTI label volume, every stored slice equal to an independent pydicom reading;
the series fingerprinted file by file (an edit to one slice file writes only its case's shard again, an unchanged
run is the no-op); a label off the series' grid and hostile series (mixed sizes, a missing slice, a repeated
position, uneven spacing) refused in one line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.conversion.fingerprint import file_identity, series_sha256, series_stat
from shardkit.read.volumes import stitch_volume

from ..volumes.test_dicom import pydicom_reading

nib = pytest.importorskip("nibabel")
pydicom = pytest.importorskip("pydicom")

CT5N = Path(__file__).resolve().parents[1] / "data" / "dicom" / "CT5N"
#: HU thresholds giving each case its own label (from the independent reading, not shardkit's)
THRESHOLDS = {"p1": -300, "p2": 0}


def dicom_tree(root: Path) -> Path:
    """Per-case folders ``<case>/<case>_ct/`` (a copy of the real series) + ``<case>/<case>_seg.nii.gz`` (uint8
    0/1 on the series' grid, from pydicom's reading)."""
    for case, threshold in THRESHOLDS.items():
        folder = root / case
        folder.mkdir(parents=True)
        shutil.copytree(CT5N, folder / f"{case}_ct")
        hu, affine = pydicom_reading(CT5N)
        nib.save(nib.Nifti1Image((hu > threshold).astype(np.uint8), affine), str(folder / f"{case}_seg.nii.gz"))
    return root


def convert(root: Path, out: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["convert", str(root), str(out), "--num-classes", "2", "--workers", "1",
                                       "--shard-size", "1", *args])
    return result.exit_code, result.output


def test_dicom_series_modalities_convert_to_exact_slices_that_stitch_back(tmp_path: Path, validate_manifest) -> None:
    root, out = dicom_tree(tmp_path / "tree"), tmp_path / "out"
    code, output = convert(root, out)
    assert code == 0, output
    validate_manifest(out / "train")  # format "dicom" in the schema
    assert "stored as int16, every voxel checked to fit" in output  # 16 bits stored + intercept: int32 by headers
    hu, affine = pydicom_reading(CT5N)
    assert hu.min() == -888 and hu.max() == 85  # HU after the intercept; both classes in every case's label
    ds = shardkit.open(out / "train")
    assert len(ds) == 10 and ds.manifest.sample["image"]["dtype"] == "<i2"
    assert ds.manifest.stats["class_pixels"] == [int((hu <= -300).sum() + (hu <= 0).sum()),
                                                  int((hu > -300).sum() + (hu > 0).sum())]
    for i in range(len(ds)):
        case, _, where = ds.key(i).partition("/")
        assert where[0] == "k"  # the largest spacing: 2.5 mm between slices
        image, label = ds[i]
        index = int(where[1:])
        np.testing.assert_array_equal(image[..., 0], hu[:, :, index])
        np.testing.assert_array_equal(label, (hu[:, :, index] > THRESHOLDS[case]).astype(np.uint8))
    record = ds.manifest.source.extra["volumes"]["cases"]["p1"]
    assert record["images"] == ["p1/p1_ct"] and record["image"]["format"] == "dicom"
    np.testing.assert_allclose(record["image"]["affine"], affine, atol=1e-6)
    ids, volume = stitch_volume(ds, "p2")
    np.testing.assert_array_equal(ids, (hu > THRESHOLDS["p2"]).astype(np.uint8))
    np.testing.assert_allclose(volume["affine"], affine, atol=1e-5)


def _shard_names(out: Path) -> dict[str, set[str]]:
    manifest = json.loads((out / "train" / "manifest.json").read_text())
    ds = shardkit.open(out / "train")
    return {ds.key(s["first_index"]).split("/")[0]: {f["name"] for f in s["files"]} for s in manifest["shards"]}


def test_an_edited_slice_file_rewrites_only_its_case_and_an_unchanged_run_is_a_no_op(tmp_path: Path) -> None:
    root, out = dicom_tree(tmp_path / "tree"), tmp_path / "out"
    code, output = convert(root, out)
    assert code == 0 and "2 shards planned, 0 reused, 2 to write" in output, output
    before = _shard_names(out)
    code, output = convert(root, out)
    assert code == 0 and "nothing changed" in output, output

    # one pixel of one slice file of p2, rewritten in place with its size, mtime and name kept
    path = root / "p2" / "p2_ct" / "2693"
    st = path.stat()
    ds = pydicom.dcmread(path)
    pixels = ds.pixel_array.copy()
    pixels[3, 4] += 11
    ds.PixelData = pixels.tobytes()
    ds.save_as(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size
    code, output = convert(root, out)
    assert code == 0 and "2 shards planned, 1 reused, 1 to write" in output, output
    after = _shard_names(out)
    assert after["p1"] == before["p1"] and not after["p2"] & before["p2"]
    got = shardkit.open(out / "train")
    k = next(i for i in range(len(got)) if got.key(i).startswith("p2/"))
    hu, _ = pydicom_reading(root / "p2" / "p2_ct")
    for i in range(k, k + 5):
        np.testing.assert_array_equal(got[i][0][..., 0], hu[:, :, int(got.key(i).split("/k")[1])])

    os.utime(root / "p1" / "p1_ct" / "2062")  # touched, same bytes: hashed again, reused
    code, output = convert(root, out)
    assert code == 0 and "2 shards planned, 2 reused, 0 to write" in output, output


def test_a_series_stat_and_digest_follow_every_slice_file(tmp_path: Path) -> None:
    folder = shutil.copytree(CT5N, tmp_path / "ct")
    stat, digest, identity = series_stat(folder), series_sha256(folder), file_identity(folder)
    assert stat[0] == sum(p.stat().st_size for p in CT5N.iterdir()) and identity != 0
    (folder / "3023").rename(folder / "3023b")  # renamed: same bytes, another name
    assert series_stat(folder) != stat and series_sha256(folder) != digest and file_identity(folder) != identity
    (folder / "3023b").rename(folder / "3023")
    assert series_sha256(folder) == digest
    (folder / "DICOMDIR").write_bytes(b"x")  # not read by the series reader: not in its digest
    assert series_sha256(folder) == digest
    identity = file_identity(folder)
    path = folder / "2392"  # rewritten in place, same bytes, size and mtime: the ctime moves
    st = path.stat()
    path.write_bytes(path.read_bytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert file_identity(folder) != identity and series_sha256(folder) == digest


def test_a_label_off_the_series_grid_is_refused_in_one_line(tmp_path: Path) -> None:
    root = dicom_tree(tmp_path / "tree")
    hu, affine = pydicom_reading(CT5N)
    shifted = affine.copy()
    shifted[2, 3] += 2.5  # one slice further along z: same shape, another grid
    nib.save(nib.Nifti1Image((hu > -300).astype(np.uint8), shifted), str(root / "p1" / "p1_seg.nii.gz"))
    code, output = convert(root, tmp_path / "out")
    assert code != 0 and "label volume's affine differs from p1_ct's by up to 2.5" in output, output
    assert "Traceback" not in output and not (tmp_path / "out" / "train" / "manifest.json").exists()


def _rows_changed(folder: Path) -> None:
    ds = pydicom.dcmread(folder / "2392")
    ds.PixelData = np.zeros((8, 16), np.int16).tobytes()
    ds.Rows = 8
    ds.save_as(folder / "2392")


def _moved(folder: Path) -> None:
    ds = pydicom.dcmread(folder / "2693")
    ds.ImagePositionPatient = [ds.ImagePositionPatient[0], ds.ImagePositionPatient[1], 4.5]
    ds.save_as(folder / "2693")


@pytest.mark.parametrize(("hostile", "message"), [
    (_rows_changed, "mixes Rows: 2392 has 8, 2062 has 16"),
    (lambda f: (f / "2693").unlink(), "has uneven slice spacing"),  # a missing slice
    (lambda f: shutil.copy(f / "2693", f / "2693copy"), "2693 and 2693copy lie at the same position"),
    (_moved, "has uneven slice spacing: "),
])
def test_hostile_series_in_a_tree_are_refused_in_one_line(tmp_path: Path, hostile, message: str) -> None:
    root = dicom_tree(tmp_path / "tree")
    hostile(root / "p2" / "p2_ct")
    code, output = convert(root, tmp_path / "out")
    assert code != 0 and message in output, output
    line = next(x for x in output.splitlines() if message in x)
    assert "p2_ct" in line and "fix:" in line and "Traceback" not in output


def test_a_series_whose_values_leave_int16_is_refused_not_wrapped(tmp_path: Path) -> None:
    root = dicom_tree(tmp_path / "tree")
    path = root / "p2" / "p2_ct" / "2392"
    ds = pydicom.dcmread(path)
    pixels = ds.pixel_array.copy()
    pixels[0, :3] = -32000  # -33024 HU after the intercept: outside int16
    ds.PixelData = pixels.tobytes()
    ds.save_as(path)
    code, output = convert(root, tmp_path / "out")
    assert code != 0 and "holds the value -33024 (3 voxels outside int16 in all)" in output, output
    assert not (tmp_path / "out" / "train" / "manifest.json").exists()


def test_a_label_series_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    root = dicom_tree(tmp_path / "tree")
    shutil.copytree(CT5N, root / "p1" / "p1_seg")
    (root / "p1" / "p1_seg.nii.gz").unlink()
    code, output = convert(root, tmp_path / "out")
    assert code != 0 and "holds its label as a folder p1_seg/" in output, output


def test_a_dicom_series_and_an_int16_nifti_modality_stack_as_bands_exactly(tmp_path: Path) -> None:
    """The series (int32 by its headers) beside an int16 NIfTI modality on its grid, in either band order: both bands
    exact (stacked as int32, nothing wrapped, then stored as int16)."""
    root = dicom_tree(tmp_path / "tree")
    hu, affine = pydicom_reading(CT5N)
    second = (hu // 2 - 100).astype(np.int16)
    for case in THRESHOLDS:
        nib.save(nib.Nifti1Image(second, affine), str(root / case / f"{case}_pet.nii.gz"))
    for order, bands in (("ct,pet", (hu, second)), ("pet,ct", (second, hu))):
        out = tmp_path / order.replace(",", "-")
        code, output = convert(root, out, "--modalities", order)
        assert code == 0, output
        ds = shardkit.open(out / "train")
        assert ds.manifest.sample["image"]["dtype"] == "<i2" and len(ds) == 10
        for i in range(len(ds)):
            index = int(ds.key(i).split("/k")[1])
            image, _ = ds[i]
            for band, volume in enumerate(bands):
                np.testing.assert_array_equal(image[..., band], volume[:, :, index])


def test_an_edited_slice_of_a_series_that_is_not_the_first_band_rewrites_its_case(tmp_path: Path) -> None:
    """The series as the second modality (its digest folded into the case's fingerprint, not the pair's own file)."""
    root = dicom_tree(tmp_path / "tree")
    hu, affine = pydicom_reading(CT5N)
    for case in THRESHOLDS:
        nib.save(nib.Nifti1Image(hu.astype(np.int16), affine), str(root / case / f"{case}_pet.nii.gz"))
    out = tmp_path / "out"
    code, output = convert(root, out, "--modalities", "pet,ct")
    assert code == 0 and "2 shards planned, 0 reused, 2 to write" in output, output
    path = root / "p1" / "p1_ct" / "3023"
    ds = pydicom.dcmread(path)
    pixels = ds.pixel_array.copy()
    pixels[5, 5] -= 3
    ds.PixelData = pixels.tobytes()
    ds.save_as(path)
    code, output = convert(root, out, "--modalities", "pet,ct")
    assert code == 0 and "2 shards planned, 1 reused, 1 to write" in output, output
    got = shardkit.open(out / "train")
    edited, _ = pydicom_reading(root / "p1" / "p1_ct")
    for i in range(len(got)):
        case, _, where = got.key(i).partition("/")
        want = edited if case == "p1" else hu
        np.testing.assert_array_equal(got[i][0][..., 1], want[:, :, int(where[1:])])


def test_a_series_headers_are_parsed_once_per_process_while_its_files_are_unchanged(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """A worker reads a case's series for its slice count, its checks and its decode: the headers were parsed three
    times (15 reads for 5 slices); now once, and again only after a slice file changed."""
    from shardkit.conversion.volumes import VolumeRun, cut_case, slice_counts, volume_job
    from shardkit.volumes import dicom
    from shardkit.volumes.slices import Slicing

    root = dicom_tree(tmp_path / "tree")
    job = volume_job("case-folders", root, Slicing(), None, 1 << 28, (0, 1))
    assert job is not None
    calls: list[Path] = []
    real = dicom._header
    monkeypatch.setattr(dicom, "_header", lambda path: calls.append(path) or real(path))
    getattr(dicom, "_PASSES", {}).clear()  # nothing kept from another test
    pair = type("Pair", (), {"key": "p1", "image": root / "p1" / "p1_ct", "label": root / "p1" / "p1_seg.nii.gz"})
    assert slice_counts([pair], job) == [(5, (16, 16))]
    slices = list(cut_case(pair, job, VolumeRun(job.slicing), root))
    assert len(slices) == 5 and len(calls) == 5  # one header pass of 5 files
    hu, _ = pydicom_reading(CT5N)
    for s in slices:
        np.testing.assert_array_equal(s.image[..., 0], hu[:, :, int(s.key.split("/k")[1])])
    path = root / "p1" / "p1_ct" / "3023"
    path.write_bytes(path.read_bytes())  # rewritten: its ctime moves
    assert slice_counts([pair], job) == [(5, (16, 16))] and len(calls) == 10  # parsed again
