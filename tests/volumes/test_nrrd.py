"""NRRD volumes: pynrrd's real test volumes (tests/data/nrrd) read exactly as pynrrd reads them and with the affine
of their NIfTI twin; hostile headers refused in one line; a gzip stream read no further than its header declares;
a label volume written back with its own header."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from shardkit.errors import DecodeError
from shardkit.volumes.files import read_header, read_voxels, write_volume
from shardkit.volumes.nrrd import _TYPES

nrrd = pytest.importorskip("nrrd")
nib = pytest.importorskip("nibabel")

DATA = Path(__file__).resolve().parents[1] / "data" / "nrrd"


@pytest.mark.parametrize("name", ["BallBinary30x30x30.nrrd", "BallBinary30x30x30_gz.nrrd"])
def test_real_nrrd_volumes_read_as_pynrrd_does_with_their_nifti_twins_affine(name: str) -> None:
    want, _ = nrrd.read(str(DATA / name))
    head = read_header(DATA / name)
    data = read_voxels(head)
    assert data.dtype == want.dtype == np.int16 and data.shape == (30, 30, 30) == head.shape
    np.testing.assert_array_equal(data, want)
    twin = nib.load(str(DATA / "BallBinary30x30x30.nii.gz"))  # the same ball written as NIfTI (RAS)
    np.testing.assert_array_equal(data, np.asanyarray(twin.dataobj))
    np.testing.assert_array_equal(head.affine_array(), twin.affine)  # LPS space directions → RAS
    assert head.spacing == (1.0, 1.0, 1.0) and head.version == "nrrd"


def _nrrd(path: Path, fields: str, body: bytes = b"", sizes: str = "4 4 4", encoding: str = "raw") -> Path:
    lines = ["NRRD0004", "type: uchar", f"dimension: {len(sizes.split())}", f"sizes: {sizes}", f"encoding: {encoding}",
             *([fields] if fields else [])]
    path.write_bytes("\n".join(lines).encode() + b"\n\n" + body)
    return path


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    assert "\n" not in str(exc.value) and "fix:" in str(exc.value)
    return str(exc.value)


@pytest.mark.parametrize(("sizes", "fields", "match"), [
    ("2048 1024 1024", "", r"2147483648 voxels, more than the voxel limit"),
    ("4 4 4 2", "", r"is 4-D \(4x4x4x2\)"),
    ("4 4 4", "space: left-posterior-superior\nspace directions: (1,0,0) (0,0,0) (0,0,1)", r"spacing"),
    ("4 4 4", "space: left-posterior-superior\nspace directions: (1,0,0) (0,1,0) (1,0,0)", r"singular"),
    ("4 4 4", "space: left-posterior-superior\nspace directions: (1,0,0) (0,nan,0) (0,0,1)", r"spacing|affine"),
    ("4 4 4", "spacings: 1 -2 1", r"spacing"),
    ("4 4 4", "data file: /etc/passwd", r"names a separate data file"),
])
def test_hostile_nrrd_headers_are_refused_in_one_line(tmp_path: Path, sizes: str, fields: str, match: str) -> None:
    with pytest.raises(DecodeError, match=match) as exc:
        read_header(_nrrd(tmp_path / "bad.nrrd", fields, bytes(64), sizes))
    one_line(exc)


@pytest.mark.parametrize(("encoding", "match"), [("bzip2", "only raw and gzip"), ("ascii", "only raw and gzip")])
def test_other_encodings_are_refused(tmp_path: Path, encoding: str, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        read_header(_nrrd(tmp_path / "e.nrrd", "", b"", encoding=encoding))


def test_a_gzip_stream_longer_than_the_header_says_is_decompressed_no_further(tmp_path: Path) -> None:
    body = gzip.compress(bytes(range(64)) + bytes(256 << 20), compresslevel=1)  # 256 MB of zeros past the voxels
    head = read_header(_nrrd(tmp_path / "bomb.nrrd", "", body, encoding="gzip"))
    data = read_voxels(head)
    np.testing.assert_array_equal(data, np.arange(64, dtype=np.uint8).reshape((4, 4, 4), order="F"))


def test_truncated_data_and_non_nrrd_files_are_refused(tmp_path: Path) -> None:
    head = read_header(_nrrd(tmp_path / "short.nrrd", "", bytes(10)))
    with pytest.raises(DecodeError, match="holds 10 bytes of data, its header declares 64") as exc:
        read_voxels(head)
    one_line(exc)
    gz = read_header(_nrrd(tmp_path / "short_gz.nrrd", "", gzip.compress(bytes(10)), encoding="gzip"))
    with pytest.raises(DecodeError, match="holds 10 bytes of data"):
        read_voxels(gz)
    (tmp_path / "x.nrrd").write_bytes(b"P5 not nrrd")
    with pytest.raises(DecodeError, match="is not an NRRD file"):
        read_header(tmp_path / "x.nrrd")


def test_a_big_endian_nrrd_with_skipped_lines_reads_native(tmp_path: Path) -> None:
    values = np.arange(24, dtype=">i2").reshape((2, 3, 4), order="F")
    path = tmp_path / "be.nrrd"
    path.write_bytes(b"NRRD0004\ntype: short\ndimension: 3\nsizes: 2 3 4\nendian: big\nencoding: raw\nline skip: 2\n"
                     b"\nskipped one\nskipped two\n" + values.tobytes(order="F"))
    data = read_voxels(read_header(path))
    assert data.dtype == np.int16 and data.dtype.isnative
    np.testing.assert_array_equal(data, values)


@pytest.mark.parametrize("name", ["BallBinary30x30x30.nrrd", "BallBinary30x30x30_gz.nrrd"])
def test_a_real_nrrd_label_volume_is_written_back_with_its_header(tmp_path: Path, name: str) -> None:
    head = read_header(DATA / name)
    data = read_voxels(head)
    write_volume(data.astype(np.int64), head.to_json(), tmp_path / "back.nrrd")
    back, back_header = nrrd.read(str(tmp_path / "back.nrrd"))
    want, header = nrrd.read(str(DATA / name))
    np.testing.assert_array_equal(back, want)
    assert back.dtype == want.dtype
    assert _TYPES[back_header["type"]] == _TYPES[header["type"]] == "i2"  # pynrrd writes "int16" for "short"
    for field in ("dimension", "space", "endian", "encoding", "kinds"):
        assert back_header.get(field) == header.get(field), field
    for field in ("sizes", "space directions", "space origin"):
        np.testing.assert_array_equal(back_header[field], header[field])
