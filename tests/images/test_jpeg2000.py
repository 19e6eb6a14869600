"""JPEG 2000 images: size from the SIZ marker before decoding, pixels exactly as stored (real files from glymur's
test data, tests/data/jpeg2000; a synthetic 5-band file for the band count)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
from shardkit.errors import DecodeError
from shardkit.images import imageio
from shardkit.images.imageio import check_pixels, decode_image, decode_label_pixels, read_header

DATA = Path(__file__).resolve().parents[1] / "data" / "jpeg2000"
RGB_JP2 = DATA / "text_GBR.jp2"  # JP2 boxes (an ICC profile, reader requirements), 400x400, 3 x uint8
RGB_J2K = DATA / "p1_06.j2k"  # conformance codestream, 12x12, 3 x uint8
GRAY16_J2K = DATA / "uint16.j2k"  # raw codestream, 128x128, 1 x uint16
SIGNED_J2K = DATA / "p0_03.j2k"  # conformance codestream, 256x256, 1 x signed 8-bit


def _forbid_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    import imagecodecs

    def boom(*_: object, **__: object) -> None:
        raise AssertionError("decoded")

    monkeypatch.setattr(imagecodecs, "jpeg2k_decode", boom)


@pytest.mark.parametrize(("path", "size"), [(RGB_JP2, (400, 400, 3)), (GRAY16_J2K, (128, 128, 2))])
def test_header_comes_from_the_siz_marker_without_decoding(path: Path, size: tuple[int, int, int],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _forbid_decoding(monkeypatch)
    header = read_header(path)
    assert (header.kind, header.height, header.width, header.bytes_per_pixel) == ("JPEG2000", *size)


def test_pixel_limit_refuses_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    _forbid_decoding(monkeypatch)
    with pytest.raises(DecodeError, match=r"400x400 = 160000 pixels, more than --max-pixels 100000"):
        check_pixels(RGB_JP2, 100_000)
    assert check_pixels(RGB_J2K, 144).pixels == 144


@pytest.mark.parametrize("path", [RGB_J2K, GRAY16_J2K])
def test_real_files_decode_bit_exactly_as_pillows_openjpeg_reads_them(path: Path) -> None:
    """Independent reading: Pillow's JPEG 2000 plugin (RGB, or I;16 for the 16-bit gray codestream)."""
    want = np.array(Image.open(path))
    got = decode_image(path)
    if want.ndim == 2:
        assert got.dtype == np.uint16 and got.shape == (*want.shape, 1)  # 16 bits kept, not scaled to 8
        want = want[:, :, None].astype(np.uint16)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_jp2_boxes_are_walked_to_the_codestream() -> None:
    """A JP2 with an ICC profile and a reader-requirements box before its codestream (Pillow cannot open it)."""
    got = decode_image(RGB_JP2)
    assert got.shape == (400, 400, 3) and got.dtype == np.uint8 and got.min() == 0 and got.max() == 255


def test_signed_codestream_is_refused_not_read_as_unsigned() -> None:
    """Pillow reads this signed 8-bit codestream as unsigned gray (other values); shardkit names the type."""
    assert read_header(SIGNED_J2K).height == 256
    with pytest.raises(DecodeError, match="int8"):
        decode_image(SIGNED_J2K)


def test_multi_band_16_bit_kept_as_stored(tmp_path: Path) -> None:
    bands = (np.arange(6 * 5 * 5, dtype=np.uint16).reshape(6, 5, 5) * 997)
    import imagecodecs

    path = tmp_path / "five.jp2"
    path.write_bytes(imagecodecs.jpeg2k_encode(bands, level=0, codecformat="jp2"))  # lossless
    assert read_header(path).bytes_per_pixel == 10
    got = decode_image(path)
    assert got.dtype == np.uint16 and np.array_equal(got, bands)


def test_damaged_siz_is_one_line(tmp_path: Path) -> None:
    data = bytearray(GRAY16_J2K.read_bytes())
    data[40:42] = b"\x00\x00"  # Csiz: no components
    path = tmp_path / "bad.j2k"
    path.write_bytes(bytes(data))
    with pytest.raises(DecodeError, match="SIZ marker is damaged") as info:
        read_header(path)
    assert "\n" not in str(info.value)


def test_a_jpeg_2000_label_is_refused_not_decoded(tmp_path: Path) -> None:
    path = tmp_path / "label.png"
    path.write_bytes(GRAY16_J2K.read_bytes())
    with pytest.raises(DecodeError, match="JPEG 2000 is read for images only"):
        decode_label_pixels(path)


def test_jp2_images_are_found_paired_and_stored_exactly(tmp_path: Path) -> None:
    """Before: ".jp2" was not an image extension, so every label was "without an image"."""
    root = tmp_path / "data"
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    (root / "images" / "scene.j2k").write_bytes(RGB_J2K.read_bytes())
    label = (np.arange(12 * 12) % 3).astype(np.uint8).reshape(12, 12)
    Image.fromarray(label).save(root / "labels" / "scene.png")
    convert(ConvertConfig(root, tmp_path / "out", workers=1, quiet=True, num_classes=3))
    from shardkit.read.dataset import Dataset

    image, stored = Dataset(tmp_path / "out" / "all")[0]
    assert np.array_equal(image, np.array(Image.open(RGB_J2K))) and np.array_equal(stored, label)


def test_supported_types_name_jpeg_2000() -> None:
    from shardkit.conversion.layouts.scan import IMAGE_EXTENSIONS

    assert "JPEG 2000" in imageio.SUPPORTED_TYPES and ".jp2" in IMAGE_EXTENSIONS
