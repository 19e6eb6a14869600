"""Image types and bands (shardkit.images.imagetypes), the image codecs beyond RGB uint8, and the header checks of the
new inputs. Synthetic arrays: edge cases (the real rasters are tests/images/test_imagetypes_real.py's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile

from shardkit.codecs.registry import ArrayCodecs, Jpeg, Png, Zstd
from shardkit.conversion.config import ConvertConfig
from shardkit.errors import ConfigError, DecodeError
from shardkit.formats.base import SampleSpec
from shardkit.formats.registry import get
from shardkit.images.imageio import check_pixels, decode_image
from shardkit.images.imagetypes import ImageOptions, convert_dtype, parse_bands, parse_rescale

RNG = np.random.default_rng(29)


@pytest.mark.parametrize("dtype,channels", [(np.uint8, 1), (np.uint8, 3), (np.uint8, 4), (np.uint16, 1),
                                            (np.uint16, 3), (np.uint16, 4)])
def test_png_codec_is_lossless_for_its_types_and_channels(dtype: type, channels: int) -> None:
    arr = RNG.integers(0, np.iinfo(dtype).max, (5, 7, channels), endpoint=True).astype(dtype)
    out = np.empty_like(arr)
    Png().decode_into(Png().encode(arr), out)
    assert np.array_equal(out, arr)


@pytest.mark.parametrize("dtype,channels", [(np.uint16, 2), (np.int16, 3), (np.float32, 1), (np.uint8, 5)])
def test_png_refuses_what_it_cannot_hold(dtype: type, channels: int) -> None:
    assert Png().cannot_store(np.dtype(dtype), channels) is not None


def test_jpeg_is_uint8_of_up_to_4_bands_only() -> None:
    for bands in (1, 2, 3, 4):  # 2 and 4 as a band frame of gray/RGB JPEG files (formats/codecs.md)
        assert Jpeg().cannot_store(np.dtype(np.uint8), bands) is None
    assert "not uint8 with 5" in (Jpeg().cannot_store(np.dtype(np.uint8), 5) or "")
    assert Jpeg().cannot_store(np.dtype(np.uint16), 3) is not None


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int16, np.float32])
def test_zstd_stores_every_type_and_band_count(dtype: type) -> None:
    arr = (RNG.normal(0, 1000, (4, 6, 16))).astype(dtype)
    out = np.empty_like(arr)
    Zstd().decode_into(Zstd().encode(arr), out)
    assert np.array_equal(out, arr) and Zstd().cannot_store(arr.dtype, 16) is None


def test_a_codec_that_cannot_store_the_images_is_a_one_line_error() -> None:
    spec = SampleSpec(None, "index", 3, "|u1", "<u2", 5, "bands")
    with pytest.raises(ConfigError, match="png stores uint8 or uint16 images of 1, 3, 4 channels"):
        get("lmdb").check_image(spec, ArrayCodecs.parse("png", "raw"))
    with pytest.raises(ConfigError, match="jpeg"):
        get("tfrecord").check_image(SampleSpec(None, "index", 3, "|u1", "|u1", 5, "bands"),
                                    ArrayCodecs.parse("jpeg:90", "raw"))
    get("tfrecord").check_image(SampleSpec(None, "index", 3, "|u1", "|u1", 4, "bands"), ArrayCodecs.parse("jpeg:90"))
    get("lmdb").check_image(spec, ArrayCodecs.parse("zstd", "lz4"))  # byte codecs store anything


def test_format_version_follows_the_images() -> None:
    rgb = SampleSpec(None, "index", 3, "|u1")
    bands = SampleSpec(None, "index", 3, "|u1", "<f4", 2, "bands")
    for name in ("npy", "lmdb", "hdf5", "tfrecord"):
        fmt = get(name)
        assert fmt.version_for("none", ArrayCodecs.parse(), rgb) == 1 and 3 in fmt.versions
        assert fmt.version_for("none", ArrayCodecs.parse(), bands) == 3


def test_options_parse_and_refuse() -> None:
    assert parse_bands("4, 3,2") == (4, 3, 2) and parse_bands(None) == ()
    assert parse_rescale("percentile:2.5") == ("percentile", 2.5) and parse_rescale("minmax") == ("minmax", 0.0)
    for bad in ("0,1", "a,b"):
        with pytest.raises(ConfigError):
            parse_bands(bad)
    for bad in ("percentile:50", "percentile", "shift:2", "gamma"):
        with pytest.raises(ConfigError):
            parse_rescale(bad)
    with pytest.raises(ConfigError):
        ImageOptions(dtype="uint32")
    assert ImageOptions().to_json() == {}  # defaults: nothing recorded, fingerprints unchanged
    cfg = ConvertConfig(Path("in"), Path("out"), bands="3,2,1", image_dtype="uint8", rescale="minmax")
    assert cfg.bands == (3, 2, 1)
    assert cfg.preprocessing()["bands"] == [3, 2, 1] and cfg.preprocessing()["rescale"] == "minmax"


def test_conversions() -> None:
    u16 = np.array([[[0, 256, 65535]]], np.uint16)
    assert convert_dtype(u16, "uint8", ("shift", 0.0)).tolist() == [[[0, 1, 255]]]
    i16 = np.array([[[-32768, 0, 32767]]], np.int16)
    assert convert_dtype(i16, "uint8", ("shift", 0.0)).tolist() == [[[0, 128, 255]]]
    f = np.array([[[1.0], [3.0], [2.0]]], np.float32)  # one band, three pixels
    assert convert_dtype(f, "uint8", ("minmax", 0.0))[0, :, 0].tolist() == [0, 255, 128]
    assert convert_dtype(f, "float32", ("minmax", 0.0))[0, :, 0].tolist() == [0.0, 1.0, 0.5]
    flat = np.full((2, 2, 1), 7, np.uint16)  # a constant band: the target's minimum, never a division by zero
    assert convert_dtype(flat, "uint8", ("minmax", 0.0)).max() == 0
    with pytest.raises(DecodeError, match="shift"):
        convert_dtype(f, "uint8", ("shift", 0.0))
    assert convert_dtype(np.array([[[200]]], np.uint8), "uint16", None).dtype == np.uint16  # lossless widening


def test_bands_out_of_range_name_the_file(tmp_path: Path) -> None:
    p = tmp_path / "x.npy"
    np.save(p, np.zeros((4, 5, 2), np.uint16))
    with pytest.raises(DecodeError, match="image has 2 bands; --bands asks for band 3"):
        decode_image(p, options=ImageOptions(bands=(1, 3)))


def test_header_checks_cover_the_new_inputs_before_decoding(tmp_path: Path) -> None:
    big = tmp_path / "big.npy"
    with open(big, "wb") as fh:  # a header claiming 5000 x 5000 x 16 float32: refused unread
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (5000, 5000, 16)})
    with pytest.raises(DecodeError, match="more than --max-pixels"):
        check_pixels(big, 1 << 24)
    pickled = tmp_path / "obj.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DecodeError, match="header cannot be read"):
        check_pixels(pickled, 1 << 24)
    short = tmp_path / "short.npy"
    short.write_bytes(np.lib.format.magic(1, 0) + b"")  # header cut
    with pytest.raises(DecodeError):
        check_pixels(short, 1 << 24)
    tif = tmp_path / "wide.tif"
    tifffile.imwrite(tif, np.zeros((64, 64, 16), np.uint16), photometric="minisblack", planarconfig="contig")
    header = check_pixels(tif, 1 << 24)
    assert (header.height, header.width, header.bytes_per_pixel) == (64, 64, 32)  # 16 bands are not "corrupt"
    with pytest.raises(DecodeError, match="more than --max-pixels"):
        check_pixels(tif, 64 * 63)
    truncated = tmp_path / "cut.npy"
    np.save(truncated, np.zeros((8, 8), np.uint16))
    truncated.write_bytes(truncated.read_bytes()[:-10])
    with pytest.raises(DecodeError, match="holds 118 bytes of data, its header says 128"):
        decode_image(truncated)
