"""DICOM series: pydicom's own real series (its DICOMDIR test tree: a 5-slice CT, a mixed MR folder, a CT with a
gap) read exactly as an independent pydicom reading (apply_modality_lut, positions, orientation) gives them;
series built at test time from pydicom's real CT_small.dcm slice (copies moved along the normal) for the int16 and
float32 rules; hostile folders refused in one line before any pixel is decoded."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from shardkit.errors import DecodeError
from shardkit.volumes.files import read_header, read_voxels

pydicom = pytest.importorskip("pydicom")
from pydicom.data import get_testdata_file  # noqa: E402
from pydicom.pixels import apply_modality_lut  # noqa: E402

TESTS = Path(get_testdata_file("CT_small.dcm")).parent  # shipped inside the pydicom wheel, no download
TREE = TESTS / "dicomdirtests"


def pydicom_reading(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """The volume and RAS affine as a plain pydicom reading gives them (slices sorted by z, all axial)."""
    dss = sorted((pydicom.dcmread(p) for p in folder.iterdir()), key=lambda d: float(d.ImagePositionPatient[2]))
    vol = np.stack([apply_modality_lut(d.pixel_array, d).T for d in dss], axis=-1)
    first, second = dss[0], dss[1]
    row, col = np.array(first.ImageOrientationPatient[:3], float), np.array(first.ImageOrientationPatient[3:], float)
    dz = float(second.ImagePositionPatient[2]) - float(first.ImagePositionPatient[2])
    affine = np.eye(4)
    affine[:3, 0] = row * float(first.PixelSpacing[1])
    affine[:3, 1] = col * float(first.PixelSpacing[0])
    affine[:3, 2] = (0, 0, dz)
    affine[:3, 3] = [float(v) for v in first.ImagePositionPatient]
    return vol, np.diag([-1.0, -1.0, 1.0, 1.0]) @ affine


def test_real_ct_series_reads_as_pydicom_does_sorted_along_the_normal() -> None:
    folder = TREE / "98892001" / "CT5N"  # 5 real axial CT slices, files in descending z order
    head = read_header(folder)
    want, affine = pydicom_reading(folder)
    assert head.shape == (16, 16, 5) and head.version == "dicom"
    assert head.spacing == pytest.approx((0.488281, 0.488281, 2.5))
    np.testing.assert_allclose(head.affine_array(), affine, atol=1e-6)
    data = read_voxels(head)
    # signed 16-bit stored, intercept -1024: the stored range does not fit int16, so int32 (exact integers)
    assert data.dtype == np.int32
    np.testing.assert_array_equal(data, want)


def _series_from_ct_small(tmp_path: Path, z: list[float], slope: float = 1.0, bits: int | None = None) -> Path:
    """Copies of pydicom's real CT_small.dcm slice at positions ``z`` (file names shuffled against z)."""
    folder = tmp_path / "ct"
    folder.mkdir()
    for i, zi in enumerate(z):
        ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
        ds.ImagePositionPatient = [-158.135803, -179.035797, zi]
        ds.RescaleSlope = slope
        if bits is not None:
            ds.BitsStored, ds.HighBit = bits, bits - 1
        ds.save_as(folder / f"IM{(7 * i) % len(z):04d}")
    return folder


def test_built_series_with_12_bit_ct_is_int16_hu_in_position_order(tmp_path: Path) -> None:
    folder = _series_from_ct_small(tmp_path, [-75.7, -70.7, -73.2, -68.2], bits=12)
    head = read_header(folder)
    data = read_voxels(head)
    assert data.dtype == np.int16 and head.spacing[2] == pytest.approx(2.5)
    want, affine = pydicom_reading(folder)
    np.testing.assert_array_equal(data, want)
    np.testing.assert_allclose(head.affine_array(), affine, atol=1e-6)


def test_non_integral_slope_gives_float32(tmp_path: Path) -> None:
    folder = _series_from_ct_small(tmp_path, [0.0, 1.5, 3.0], slope=0.25)
    data = read_voxels(read_header(folder))
    want, _ = pydicom_reading(folder)
    assert data.dtype == np.float32
    np.testing.assert_array_equal(data, want.astype(np.float32))


def test_rle_lossless_decodes_as_its_uncompressed_twin(tmp_path: Path) -> None:
    for name in ("MR_small.dcm", "MR_small_RLE.dcm"):
        (tmp_path / name).mkdir()
        shutil.copy(get_testdata_file(name), tmp_path / name / "slice.dcm")
    plain, rle = (read_voxels(read_header(tmp_path / n)) for n in ("MR_small.dcm", "MR_small_RLE.dcm"))
    assert plain.shape == (64, 64, 1) and plain.dtype == rle.dtype
    np.testing.assert_array_equal(plain, rle)


@pytest.mark.parametrize(("folder", "words"), [
    ("98892003/MR2", "mixes series: "),  # three real series in one folder
    ("77654033/CT2", "uneven slice spacing"),  # a real CT with a 202.5 mm gap
    ("98892001/CT2N", "mixes ImageOrientationPatient"),
])
def test_real_hostile_folders_refused_in_one_line(folder: str, words: str) -> None:
    with pytest.raises(DecodeError, match=words) as err:
        read_header(TREE / folder)
    assert "\n" not in str(err.value) and "fix:" in str(err.value)


def test_mixed_series_names_both(tmp_path: Path) -> None:
    folder = _series_from_ct_small(tmp_path, [0.0, 2.0])
    ds = pydicom.dcmread(folder / "IM0001")
    uid = ds.SeriesInstanceUID
    ds.SeriesInstanceUID = "1.2.3.4"
    ds.save_as(folder / "IM0001")
    with pytest.raises(DecodeError, match=rf"1\.2\.3\.4.*{uid}|{uid}.*1\.2\.3\.4"):
        read_header(folder)


def test_missing_and_repeated_positions_refused(tmp_path: Path) -> None:
    folder = _series_from_ct_small(tmp_path, [0.0, 2.0, 2.0])
    with pytest.raises(DecodeError, match="same position 2 mm"):
        read_header(folder)
    ds = pydicom.dcmread(folder / "IM0001")
    del ds.ImagePositionPatient
    ds.save_as(folder / "IM0001")
    with pytest.raises(DecodeError, match="IM0001: has no ImagePositionPatient"):
        read_header(folder)


def test_huge_rows_columns_refused_before_any_pixel(tmp_path: Path) -> None:
    folder = tmp_path / "huge"
    folder.mkdir()
    for i in range(3):
        ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
        ds.Rows = ds.Columns = 65535
        del ds.PixelData  # nothing to decode: the refusal comes from the headers alone
        ds.ImagePositionPatient = [0, 0, i]
        ds.save_as(folder / f"{i}.dcm")
    with pytest.raises(DecodeError, match="65535x65535x3 = 12884508675 voxels, more than the voxel limit"):
        read_header(folder)


def test_compressed_transfer_syntax_refused(tmp_path: Path) -> None:
    (tmp_path / "jls").mkdir()
    shutil.copy(get_testdata_file("MR_small_jpeg_ls_lossless.dcm"), tmp_path / "jls" / "a.dcm")
    with pytest.raises(DecodeError, match=r"transfer syntax 1\.2\.840\.10008\.1\.2\.4\.80 is compressed"):
        read_header(tmp_path / "jls")


def test_non_dicom_file_refused_naming_it(tmp_path: Path) -> None:
    folder = _series_from_ct_small(tmp_path, [0.0, 2.0])
    (folder / "notes.txt").write_text("not a slice")
    with pytest.raises(DecodeError, match=r"notes\.txt: is not a readable DICOM file"):
        read_header(folder)


def test_tilted_gantry_positions_refused(tmp_path: Path) -> None:
    folder = _series_from_ct_small(tmp_path, [0.0, 2.0, 4.0])
    for i, name in enumerate(sorted(folder.iterdir(), key=lambda p: float(pydicom.dcmread(p).ImagePositionPatient[2]))):
        ds = pydicom.dcmread(name)
        ds.ImagePositionPatient = [-158.135803, -179.035797 + 0.2 * i, 2.0 * i]  # 0.1 mm sideways per mm: ~5.7 deg
        ds.save_as(name)
    with pytest.raises(DecodeError, match="position leaves the slice normal"):
        read_header(folder)
