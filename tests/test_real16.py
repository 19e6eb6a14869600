"""Real 16-bit microscopy and a real CT slice (tests/data/microscopy16, tests/data/ct16) through convert and read.

Every stored image is compared bit-exactly, dtype included, with the source file decoded independently (tifffile,
OpenCV's IMREAD_UNCHANGED, numpy), in every format and every codec that takes the type; labels exactly; the band
statistics and ranges with numpy's over the real pixels. The files: a DSB 2018 nuclei image with its instance
mask (uint16), a big-endian ImageJ fluorescence image with its spot labels (values up to 43716), a big-endian
ImageJ TCYX hyperstack (pages as bands) and a CT slice in Hounsfield units (int16, half of it negative)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
from shardkit.errors import ConfigError, DecodeError
from shardkit.images.imageio import check_pixels, decode_image, decode_label_pixels
from shardkit.images.imagetypes import ImageOptions
from shardkit.read.dataset import Dataset

DATA = Path(__file__).parent / "data"
MICRO = DATA / "microscopy16"
DSB, DSB_MASK = MICRO / "dsb2018-img2d.tif", MICRO / "dsb2018-mask2d.tif"
SPOTS, SPOTS_LABELS = MICRO / "spots-input2_yx.tiff", MICRO / "spots-labels-output2.tiff"
HYPERSTACK = MICRO / "hyperstack-multi_f.tiff"
CT_DICOM, CT_HU = DATA / "ct16" / "CT_small.dcm", DATA / "ct16" / "ct_small_hu.tif"


def dicom_pixels(path: Path) -> tuple[np.ndarray, float, float]:
    """(stored int16 pixels, rescale slope, intercept) of an Explicit VR Little Endian DICOM slice, read with the
    standard library and numpy alone (no DICOM package): walk the data elements to Pixel Data (7FE0,0010)."""
    data = path.read_bytes()
    assert data[128:132] == b"DICM"
    pos, values = 132, {}
    while pos < len(data):
        group, element = struct.unpack_from("<HH", data, pos)
        vr = data[pos + 4 : pos + 6]
        if vr in (b"OB", b"OW", b"OF", b"SQ", b"UT", b"UN"):
            length, head = struct.unpack_from("<I", data, pos + 8)[0], 12
        else:
            length, head = struct.unpack_from("<H", data, pos + 6)[0], 8
        value = data[pos + head : pos + head + length]
        values[(group, element)] = value
        if (group, element) == (0x7FE0, 0x0010):
            break
        pos += head + length
    assert values[(0x0002, 0x0010)].rstrip(b"\0 ") == b"1.2.840.10008.1.2.1"  # Explicit VR Little Endian
    rows, cols = (struct.unpack("<H", values[(0x0028, t)])[0] for t in (0x0010, 0x0011))
    assert struct.unpack("<H", values[(0x0028, 0x0100)])[0] == 16  # bits allocated
    assert struct.unpack("<H", values[(0x0028, 0x0103)])[0] == 1  # pixel representation: signed
    raw = np.frombuffer(values[(0x7FE0, 0x0010)], "<i2").reshape(rows, cols)
    slope, intercept = (float(values[(0x0028, t)].decode().strip()) for t in (0x1053, 0x1052))
    return raw, slope, intercept


def hyperstack_bands() -> np.ndarray:
    """The TCYX hyperstack as tifffile reads it, its four planes as bands in page order (T0C0, T0C1, T1C0, T1C1)."""
    with tifffile.TiffFile(HYPERSTACK) as tif:
        series = tif.series[0]
        assert tif.is_imagej and series.axes == "TCYX" and tif.byteorder == ">"
        planes = series.asarray()
    return np.moveaxis(planes.reshape(-1, *planes.shape[-2:]), 0, -1)


def test_the_ct_tiff_is_the_dicom_slice_in_hounsfield_units() -> None:
    raw, slope, intercept = dicom_pixels(CT_DICOM)
    assert (slope, intercept) == (1.0, -1024.0) and raw.min() >= 0
    hu = tifffile.imread(CT_HU)
    assert hu.dtype == np.int16 and np.array_equal(hu, (raw - 1024).astype(np.int16))  # the README's derivation
    assert hu.min() == -896 and hu.max() == 1167 and (hu < 0).mean() > 0.4


@pytest.mark.parametrize("path", [DSB, DSB_MASK, SPOTS, SPOTS_LABELS, CT_HU])
def test_real_files_decode_as_stored(path: Path) -> None:
    """shardkit's decode = tifffile's = OpenCV's (IMREAD_UNCHANGED), dtype and all, big-endian files included."""
    want = tifffile.imread(path)
    native = want.dtype.newbyteorder("=")  # the big-endian files decode to native-order values
    other = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert other is not None and other.dtype == native and np.array_equal(other, want)
    got = decode_image(path)
    assert got.dtype.isnative and got.dtype == native
    assert got.shape == (*want.shape, 1) and np.array_equal(got[:, :, 0], want)


def test_the_imagej_hyperstack_is_refused_unless_its_pages_are_bands() -> None:
    with pytest.raises(DecodeError, match=r"multi-page TIFF \(4 pages\).*--pages-as-bands"):
        decode_image(HYPERSTACK)
    got = decode_image(HYPERSTACK, options=ImageOptions(pages_as_bands=True))
    assert got.dtype == np.uint16 and np.array_equal(got, hyperstack_bands())
    with pytest.raises(DecodeError, match="multi-page"):
        decode_label_pixels(HYPERSTACK)


def _write_label(path: Path, ids: np.ndarray) -> None:
    assert cv2.imwrite(str(path), ids.astype(np.uint8))


def build(kind: str, root: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, object]]:
    """An input tree of real files → ({name: image as decoded independently}, {name: label ids}, convert options).

    micro: the DSB image with its instance mask and the spot image with its spot labels, both copied as they are
    (uint16, 1 band; the labels are the sources' own uint16 TIFFs). ct: the HU slice as it is, a big-endian tiled
    zstd TIFF of its lower half and a .npy of its left 100 columns (int16); labels thresholded from the HU values.
    hyper: the hyperstack as it is (4 bands with --pages-as-bands), label thresholded from its first plane."""
    img, lab = root / "img", root / "lab"
    img.mkdir(parents=True)
    lab.mkdir()
    if kind == "micro":
        shutil.copy(DSB, img / "dsb.tif")
        shutil.copy(DSB_MASK, lab / "dsb.tif")
        shutil.copy(SPOTS, img / "spots.tiff")
        shutil.copy(SPOTS_LABELS, lab / "spots.tiff")
        images = {"dsb": tifffile.imread(DSB)[:, :, None], "spots": tifffile.imread(SPOTS)[:, :, None]}
        labels = {"dsb": tifffile.imread(DSB_MASK), "spots": tifffile.imread(SPOTS_LABELS)}
        return images, labels, {"num_classes": 184}
    if kind == "ct":
        hu = tifffile.imread(CT_HU)
        shutil.copy(CT_HU, img / "slice.tif")
        tifffile.imwrite(img / "lower.tif", hu[64:], byteorder=">", tile=(32, 32), compression="zstd",
                         photometric="minisblack")
        np.save(img / "left.npy", hu[:, :100])
        images = {"slice": hu[:, :, None], "lower": hu[64:, :, None], "left": hu[:, :100, None]}
        labels = {}
        for name, im in images.items():
            ids = np.where(im[:, :, 0] < -500, 0, np.where(im[:, :, 0] > 300, 2, 1)).astype(np.uint8)
            _write_label(lab / f"{name}.png", ids)
            labels[name] = ids
        return images, labels, {"num_classes": 3}
    shutil.copy(HYPERSTACK, img / "cells.tiff")
    bands = hyperstack_bands()
    ids = (bands[:, :, 0] > np.median(bands[:, :, 0])).astype(np.uint8)
    _write_label(lab / "cells.png", ids)
    return {"cells": bands}, {"cells": ids}, {"num_classes": 2, "pages_as_bands": True}


DTYPES = {"micro": (np.uint16, 1), "ct": (np.int16, 1), "hyper": (np.uint16, 4)}
FORMATS = [("npy", "raw"), ("lmdb", "raw"), ("lmdb", "zstd"), ("lmdb", "lz4"), ("lmdb", "png"), ("hdf5", "raw"),
           ("hdf5", "zstd"), ("hdf5", "lz4"), ("tfrecord", "raw"), ("tfrecord", "png")]


def convert_tree(tmp_path: Path, kind: str, fmt: str, codec: str, **extra: object) -> tuple[Path, dict, dict]:
    images, labels, options = build(kind, tmp_path / "in")
    cfg = ConvertConfig(tmp_path / "in", tmp_path / "out", format=fmt, image_codec=codec, images="img/{name}.*",
                        labels="lab/{name}.*", workers=1, shard_size=2, quiet=True, **{**options, **extra})
    convert(cfg)
    return next(p for p in (tmp_path / "out").iterdir() if p.is_dir()), images, labels


@pytest.mark.parametrize("kind", ["micro", "ct", "hyper"])
@pytest.mark.parametrize("fmt,codec", FORMATS)
def test_real_16bit_values_survive_every_format_and_codec(tmp_path: Path, kind: str, fmt: str, codec: str) -> None:
    dtype, bands = DTYPES[kind]
    if codec == "png" and dtype == np.int16:  # PNG has no signed samples: refused before anything is written
        with pytest.raises(ConfigError, match="png stores uint8 or uint16"):
            convert_tree(tmp_path, kind, fmt, codec)
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("manifest.json"))
        return
    split, images, labels = convert_tree(tmp_path, kind, fmt, codec)
    manifest = json.loads((split / "manifest.json").read_text())
    assert manifest["sample"]["image"]["dtype"] == np.dtype(dtype).newbyteorder("<").str
    ds = Dataset(split)
    assert ds.image_dtype == dtype and ds.bands == bands and len(ds) == len(images)
    for i in range(len(ds)):
        image, label = ds[i]
        name = Path(ds.key(i)).name.split(".")[0]
        assert image.dtype == dtype and np.array_equal(image, images[name]), name  # every value, every band
        assert np.array_equal(label, labels[name]), name
    if fmt == "npy":  # the statistics do not depend on the format: checked once per kind
        pixels = np.concatenate([im.reshape(-1, bands).astype(np.float64) for im in images.values()])
        stats = manifest["stats"]
        assert stats["image_min"] == pixels.min(0).tolist() and stats["image_max"] == pixels.max(0).tolist()
        assert np.allclose(stats["image_mean"], pixels.mean(0), rtol=0, atol=1e-6)
        assert np.allclose(stats["image_std"], pixels.std(0), rtol=0, atol=1e-6)
        ids = np.concatenate([lab.ravel() for lab in labels.values()])
        assert stats["class_pixels"] == np.bincount(ids, minlength=len(stats["class_pixels"])).tolist()


def test_info_shows_the_type_and_each_bands_range(tmp_path: Path) -> None:
    split, _, _ = convert_tree(tmp_path / "ct", "ct", "lmdb", "zstd")
    out = CliRunner().invoke(main, ["info", str(split)], catch_exceptions=False).output
    assert "int16 (1 band)" in out and "band  1: -896..1167" in out, out
    split, _, _ = convert_tree(tmp_path / "h", "hyper", "hdf5", "lz4")
    out = CliRunner().invoke(main, ["info", str(split)], catch_exceptions=False).output
    bands = hyperstack_bands()
    assert "uint16 (4 bands)" in out, out
    for b in range(4):
        assert f"band  {b + 1}: {bands[:, :, b].min()}..{bands[:, :, b].max()}," in out, out


def test_an_imagej_stack_saved_in_one_page_gives_every_plane(tmp_path: Path) -> None:
    """ImageJ saves stacks over 4 GB (and tifffile with truncate=True) as one TIFF page followed by the other
    planes' pixels: shardkit used to keep plane 1 silently. The real hyperstack saved that way."""
    planes = tifffile.imread(HYPERSTACK)
    path = tmp_path / "truncated.tif"
    tifffile.imwrite(path, planes, imagej=True, truncate=True, metadata={"axes": "TCYX"})
    with tifffile.TiffFile(path) as tif:
        assert len(tif.pages) == 1 and tif.imagej_metadata["images"] == 4
    with pytest.raises(DecodeError, match=r"ImageJ stack of 4 planes in one TIFF page.*--pages-as-bands"):
        decode_image(path)
    got = decode_image(path, options=ImageOptions(pages_as_bands=True))
    assert np.array_equal(got, hyperstack_bands())
    assert check_pixels(path, 1 << 20).bytes_per_pixel >= 4 * 2  # the memory check counts every plane
    claimed = tmp_path / "claims-more.tif"  # a description counting planes the file does not hold
    claimed.write_bytes(path.read_bytes().replace(b"images=4", b"images=9"))
    for options in (None, ImageOptions(pages_as_bands=True)):
        with pytest.raises(DecodeError, match="counts 9 images, but the file holds one page"):
            decode_image(claimed, options=options)


def test_an_ome_tiff_of_several_images_is_not_taken_as_bands(tmp_path: Path) -> None:
    """Two series (two images of 2 channels) in one OME-TIFF: with --pages-as-bands shardkit used to make one
    image of 4 bands out of them; it is refused. One series of 2 channels stays 2 bands."""
    planes = tifffile.imread(HYPERSTACK)  # (T, C, Y, X)
    path = tmp_path / "two.ome.tif"
    with tifffile.TiffWriter(path, ome=True) as tif:
        for t in range(2):
            tif.write(planes[t], metadata={"axes": "CYX"}, photometric="minisblack")
    with tifffile.TiffFile(path) as tif:
        assert tif.is_ome and len(tif.series) == 2 and len(tif.pages) == 4
    with pytest.raises(DecodeError, match=r"OME-TIFF of 2 images \(series\)"):
        decode_image(path, options=ImageOptions(pages_as_bands=True))
    one = tmp_path / "one.ome.tif"
    tifffile.imwrite(one, planes[1], ome=True, metadata={"axes": "CYX"}, photometric="minisblack")
    assert np.array_equal(decode_image(one, options=ImageOptions(pages_as_bands=True)), hyperstack_bands()[:, :, 2:])


def test_a_12_bit_tiff_keeps_its_values(tmp_path: Path) -> None:
    """The CT slice's stored values (128..2191, from the DICOM bytes) in a TIFF of 12 bits per sample (packed):
    decoded and stored as uint16 with the same values — never shifted or stretched to 16 bits."""
    raw, _, _ = dicom_pixels(CT_DICOM)
    values = raw.astype(np.uint16)
    root = tmp_path / "in"
    (root / "img").mkdir(parents=True)
    (root / "lab").mkdir()
    tifffile.imwrite(root / "img" / "ct12.tif", values, photometric="minisblack", bitspersample=12)
    with tifffile.TiffFile(root / "img" / "ct12.tif") as tif:
        assert tif.pages[0].bitspersample == 12
    assert np.array_equal(decode_image(root / "img" / "ct12.tif")[:, :, 0], values)
    _write_label(root / "lab" / "ct12.png", values > 1024 + 300)
    convert(ConvertConfig(root, tmp_path / "out", images="img/{name}.tif", labels="lab/{name}.png", num_classes=2,
                          workers=1, quiet=True))
    ds = Dataset(next(p for p in (tmp_path / "out").iterdir() if p.is_dir()))
    image, _ = ds[0]
    assert image.dtype == np.uint16 and np.array_equal(image[:, :, 0], values)
    assert (ds.manifest.stats["image_min"], ds.manifest.stats["image_max"]) == ([128.0], [2191.0])
