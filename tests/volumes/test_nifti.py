"""NIfTI volumes: real files read exactly as nibabel decodes them, and hostile headers refused in one line before
any voxel is decoded (tests/data/nifti: nibabel's and MONAI's test volumes, see tests/data/README.md)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from shardkit.errors import DecodeError, LabelError
from shardkit.volumes import nifti, volume
from shardkit.volumes.nifti import read_header, read_voxels
from shardkit.volumes.volume import label_ids

nib = pytest.importorskip("nibabel")

DATA = Path(__file__).resolve().parents[1] / "data" / "nifti"


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text and "fix:" in text
    return text


@pytest.mark.parametrize(("name", "dtype"), [("anatomical.nii", np.int16), ("reoriented_anat_moved.nii", np.float32),
                                             ("anatomical_label.nii.gz", np.uint16)])
def test_real_volumes_decode_as_nibabel_does_in_their_stored_type(name: str, dtype: type) -> None:
    head = read_header(DATA / name)
    data = read_voxels(head)
    want = np.asanyarray(nib.load(str(DATA / name)).dataobj)
    assert data.dtype == dtype and data.dtype.isnative  # big-endian >i2 / >f4 on disk: same values, native order
    assert data.shape == want.shape == head.shape
    np.testing.assert_array_equal(data, want)
    assert head.dtype == np.dtype(dtype).name
    np.testing.assert_array_equal(head.affine_array(), nib.load(str(DATA / name)).affine)
    assert head.spacing == tuple(float(z) for z in nib.load(str(DATA / name)).header.get_zooms())


def _crafted(path: Path, shape: tuple[int, ...], *, version: int = 1, zooms: tuple[float, ...] | None = None,
             sform: np.ndarray | None = None, data: bool = False) -> Path:
    """A NIfTI file written from a header set by hand (no voxels unless ``data``): what a hostile file says."""
    klass = nib.Nifti2Header if version == 2 else nib.Nifti1Header
    header = klass()
    header.set_data_dtype(np.uint8)
    raw = np.frombuffer(header.binaryblock, dtype=np.uint8).copy()
    header = klass(raw.tobytes())
    header["dim"][:] = 1
    header["dim"][0] = len(shape)
    header["dim"][1: 1 + len(shape)] = shape
    header["pixdim"][1:4] = zooms or (1.0, 1.0, 1.0)
    if sform is not None:
        header.set_sform(np.eye(4), code=1)
        header["srow_x"], header["srow_y"], header["srow_z"] = sform[0], sform[1], sform[2]
    header["vox_offset"] = len(header.binaryblock) + 4
    body = header.binaryblock + b"\0\0\0\0"
    if data:
        body += bytes(int(np.prod(shape)))
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(body))
    else:
        path.write_bytes(body)
    return path


@pytest.mark.parametrize(("shape", "version", "suffix"), [((2048, 1024, 1024), 1, ".nii"),
                                                         ((2**31, 1, 1), 2, ".nii"),
                                                         ((2048, 1024, 1024), 1, ".nii.gz")])
def test_a_header_of_2_31_voxels_is_refused_from_the_header(tmp_path: Path, shape: tuple[int, ...], version: int,
                                                            suffix: str) -> None:
    path = _crafted(tmp_path / f"big{suffix}", shape, version=version)
    with pytest.raises(DecodeError, match=r"2147483648 voxels, more than the voxel limit") as exc:
        read_header(path)
    one_line(exc)


@pytest.mark.parametrize("zooms", [(0.0, 1.0, 1.0), (1.0, -2.0, 1.0), (1.0, 1.0, float("nan")),
                                   (float("inf"), 1.0, 1.0)])
def test_zero_negative_or_nan_spacing_is_refused(tmp_path: Path, zooms: tuple[float, ...]) -> None:
    path = _crafted(tmp_path / "bad.nii", (4, 4, 4), zooms=zooms, data=True)
    with pytest.raises(DecodeError, match="spacing") as exc:
        read_header(path)
    one_line(exc)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_infinite_affine_is_refused(tmp_path: Path, bad: float) -> None:
    sform = np.eye(4)
    sform[1, 3] = bad
    path = _crafted(tmp_path / "bad.nii", (4, 4, 4), sform=sform, data=True)
    with pytest.raises(DecodeError, match="affine") as exc:
        read_header(path)
    one_line(exc)


def test_a_singular_affine_is_refused(tmp_path: Path) -> None:
    sform = np.eye(4)
    sform[2, 2] = 0.0
    with pytest.raises(DecodeError, match="singular"):
        read_header(_crafted(tmp_path / "flat.nii", (4, 4, 4), sform=sform, data=True))


def test_4d_volumes_are_refused_but_one_volume_stored_as_4d_is_read(tmp_path: Path) -> None:
    with pytest.raises(DecodeError, match=r"is 4-D \(4x4x4x2\)") as exc:
        read_header(_crafted(tmp_path / "t.nii", (4, 4, 4, 2), data=True))
    one_line(exc)
    head = read_header(_crafted(tmp_path / "one.nii", (4, 5, 6, 1), data=True))
    assert head.shape == (4, 5, 6) and read_voxels(head).shape == (4, 5, 6)


def test_a_truncated_volume_is_refused_in_one_line(tmp_path: Path) -> None:
    raw = (DATA / "anatomical.nii").read_bytes()
    path = tmp_path / "cut.nii"
    path.write_bytes(raw[: len(raw) // 2])
    head = read_header(path)  # the header is whole
    with pytest.raises(DecodeError, match="cannot be decoded") as exc:
        read_voxels(head)
    one_line(exc)


def test_a_gzip_stream_longer_than_its_header_says_is_read_no_further(tmp_path: Path) -> None:
    path = _crafted(tmp_path / "bomb.nii.gz", (4, 4, 4), data=True)
    body = gzip.decompress(path.read_bytes()) + bytes(64 << 20)  # 64 MB of zeros past the 64 voxels
    path.write_bytes(gzip.compress(body, compresslevel=1))
    assert read_voxels(read_header(path, max_voxels=64)).shape == (4, 4, 4)


def test_not_a_nifti_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.nii"
    path.write_bytes(b"not a header" * 40)
    with pytest.raises(DecodeError, match="not a NIfTI file nibabel can read") as exc:
        read_header(path)
    one_line(exc)


def test_labels_stored_as_float_holding_integers_are_taken_exactly() -> None:
    real = np.asanyarray(nib.load(str(DATA / "anatomical_label.nii.gz")).dataobj)
    ids = label_ids(real.astype(np.float32) * 3, DATA / "x.nii.gz")
    assert ids.dtype == np.uint8
    np.testing.assert_array_equal(ids, real.astype(np.int64) * 3)
    assert label_ids(np.array([0.0, 300.0]), DATA).dtype == np.uint16


@pytest.mark.parametrize("chunk", [1 << 22, 7])  # the whole volume at once, or 10 chunks
@pytest.mark.parametrize(("value", "shown"), [(2.5, "2.5"), (float("nan"), "nan"), (float("inf"), "inf")])
def test_a_non_integer_label_voxel_is_an_error_naming_value_and_count(value: float, shown: str, chunk: int,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(volume, "_CHECK_CHUNK", chunk)
    data = np.zeros((4, 4, 4), np.float32, order="F")
    data[3, 3, 1:] = value  # in the last chunk, Fortran order as nibabel decodes
    data[0, 0, 0] = -0.25
    with pytest.raises(LabelError, match=r"seg.nii.gz: label voxel value .*(0.25|" + shown + r").* is not an "
                                         r"integer \((1|3) voxels hold it; 4 non-integer voxels in all\)"):
        label_ids(data, Path("seg.nii.gz"))
    data[0, 0, 0] = 0
    with pytest.raises(LabelError, match=rf"value .*{shown}.* is not an integer \(3 voxels hold it; 3 non-integer"):
        label_ids(data, Path("seg.nii.gz"))


def test_nibabel_missing_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_nibabel(name: str, *args: object, **kwargs: object) -> object:
        if name == "nibabel":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_nibabel)
    from shardkit.errors import ConfigError

    with pytest.raises(ConfigError, match=r"needs nibabel.*volumes"):
        nifti.read_header(DATA / "anatomical.nii")


def test_a_scaled_volume_is_decoded_as_nibabel_scales_it_and_its_header_says_that_type(tmp_path: Path) -> None:
    src = nib.load(str(DATA / "anatomical.nii"))
    img = nib.Nifti1Image(np.asanyarray(src.dataobj), src.affine, src.header)
    img.header.set_slope_inter(0.5, -1024.0)
    nib.save(img, str(tmp_path / "ct.nii"))
    head = read_header(tmp_path / "ct.nii")
    data = read_voxels(head)
    want = np.asanyarray(nib.load(str(tmp_path / "ct.nii")).dataobj)
    assert want.dtype.kind == "f" and head.dtype == data.dtype.name == want.dtype.name
    np.testing.assert_array_equal(data, want)


@pytest.mark.parametrize(("name", "channels"), [("anatomical_label.nii.gz", 1), ("example_nifti2.nii.gz", 2)])
def test_fast_gzip_decodes_the_same_voxels_and_refuses_the_same_files(name: str, channels: int, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """python-isal's gzip reader (used when installed) gives nibabel's bytes; a truncated stream and a stream
    longer than its header are handled as with Python's gzip (one line; read no further)."""
    pytest.importorskip("isal")
    from shardkit.volumes import nifti

    head = read_header(DATA / name, channels=channels)
    fast = read_voxels(head)
    monkeypatch.setattr(nifti, "FAST_GZIP", False)
    plain = read_voxels(head)
    assert fast.dtype == plain.dtype and fast.shape == plain.shape
    np.testing.assert_array_equal(fast, plain)
    monkeypatch.setattr(nifti, "FAST_GZIP", True)
    raw = gzip.decompress((DATA / name).read_bytes())
    cut = tmp_path / "cut.nii.gz"
    cut.write_bytes(gzip.compress(raw[: len(raw) // 2]))
    with pytest.raises(DecodeError, match="cannot be decoded") as exc:
        read_voxels(read_header(cut, channels=channels))
    one_line(exc)
    long = tmp_path / "long.nii.gz"
    long.write_bytes(gzip.compress(raw + bytes(64 << 20), compresslevel=1))
    np.testing.assert_array_equal(read_voxels(read_header(long, channels=channels)), plain)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize(("name", "channels"), [("anatomical.nii", 1), ("anatomical_label.nii.gz", 1),
                                                ("example_nifti2.nii.gz", 2)])
def test_voxels_decoded_from_bytes_in_memory_are_the_files(name: str, channels: int, fast: bool, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_voxels(head, raw)``: the file's bytes read (and hashed) by the caller decode to nibabel's voxels
    without the file being opened again (it is gone here), with isal's gzip or Python's; a truncated stream in
    memory is refused in one line like a truncated file, and a stream longer than its header is read no further."""
    monkeypatch.setattr(nifti, "FAST_GZIP", fast)
    copy = tmp_path / name
    copy.write_bytes((DATA / name).read_bytes())
    head = read_header(copy, channels=channels)
    want = read_voxels(head)
    raw = np.frombuffer(copy.read_bytes(), np.uint8)
    copy.unlink()
    got = read_voxels(head, raw)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.asanyarray(__import__("nibabel").load(str(DATA / name)).dataobj))
    if name.endswith(".gz"):
        inflated = gzip.decompress(raw.tobytes())
        with pytest.raises(DecodeError, match="cannot be decoded") as exc:
            read_voxels(head, np.frombuffer(gzip.compress(inflated[: len(inflated) // 2]), np.uint8))
        one_line(exc)
        longer = np.frombuffer(gzip.compress(inflated + bytes(1 << 20), compresslevel=1), np.uint8)
        np.testing.assert_array_equal(read_voxels(head, longer), want)
