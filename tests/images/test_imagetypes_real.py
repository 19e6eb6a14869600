"""Real multi-band and 16-bit rasters (tests/data/geotiff, rasterio's CC0 Landsat samples) through convert and read:
bands and values bit-exact in every format, whatever the TIFF's layout, and nothing rescaled unless asked."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile

from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
from shardkit.errors import ConfigError, DecodeError
from shardkit.images.imageio import check_pixels, decode_image
from shardkit.images.imagetypes import ImageOptions
from shardkit.read.dataset import Dataset

DATA = Path(__file__).parents[1] / "data" / "geotiff"
UINT16 = DATA / "RGBA.uint16.tif"  # 4 bands, uint16, deflate, chunky
BYTE = DATA / "rgb-byte-tenth.tif"  # 3 bands, uint8, LZW


def real() -> np.ndarray:
    with tifffile.TiffFile(UINT16) as tif:
        return tif.pages[0].asarray()


def test_the_real_tiff_decodes_to_its_four_bands_exactly() -> None:
    values = real()
    assert values.shape == (411, 634, 4) and values.dtype == np.uint16 and values.max() > 255
    out = decode_image(UINT16)
    assert out.dtype == np.uint16 and np.array_equal(out, values)  # the 4th band is a band, not alpha
    assert np.array_equal(decode_image(UINT16, options=ImageOptions(bands=(4, 3, 2))), values[:, :, [3, 2, 1]])
    header = check_pixels(UINT16, 1 << 24)
    assert (header.height, header.width, header.bytes_per_pixel) == (411, 634, 8)


@pytest.mark.parametrize("layout", [
    dict(planarconfig="separate", compression="lzw"),
    dict(planarconfig="contig", tile=(128, 128), compression="zstd"),
    dict(bigtiff=True, compression="zlib", planarconfig="separate", tile=(64, 64)),
])
def test_every_tiff_layout_gives_the_same_values(tmp_path: Path, layout: dict) -> None:
    values = real()
    path = tmp_path / "x.tif"
    data = np.moveaxis(values, -1, 0) if layout.get("planarconfig") == "separate" else values
    tifffile.imwrite(path, data, photometric="minisblack", **layout)
    assert np.array_equal(decode_image(path), values)


def test_multi_page_is_refused_unless_pages_are_bands(tmp_path: Path) -> None:
    values = real()
    path = tmp_path / "pages.tif"
    for b in range(4):
        tifffile.imwrite(path, values[:, :, b], append=b > 0)
    with pytest.raises(DecodeError, match="--pages-as-bands"):
        decode_image(path)
    assert np.array_equal(decode_image(path, options=ImageOptions(pages_as_bands=True)), values)


def test_rescale_only_when_asked() -> None:
    values = real()
    shifted = decode_image(UINT16, options=ImageOptions("uint8", "shift"))
    assert np.array_equal(shifted, (values >> 8).astype(np.uint8))
    stretched = decode_image(UINT16, options=ImageOptions("uint8", "percentile:2"))
    assert stretched.dtype == np.uint8
    for b in range(4):  # per band: clipped at its 2nd and 98th percentiles, spread over 0..255
        band = values[:, :, b].astype(np.float64)
        lo, hi = np.percentile(band, 2), np.percentile(band, 98)
        want = np.rint(np.clip((band - lo) / (hi - lo), 0, 1) * 255) if hi > lo else np.zeros_like(band)
        assert np.array_equal(stretched[:, :, b], want.astype(np.uint8)), b
    widened = decode_image(BYTE, options=ImageOptions("float32"))  # lossless: no --rescale needed
    assert widened.dtype == np.float32 and np.array_equal(widened, decode_image(BYTE).astype(np.float32))
    with pytest.raises(ConfigError, match="needs a target"):
        ImageOptions(rescale="minmax")


def centre(src: np.ndarray, n: int) -> np.ndarray:
    """``src`` centre-cropped, or zero-padded (half before, the rest after), to n x n: convert's --size rule."""
    out = np.zeros((n, n, src.shape[2]), src.dtype)
    h, w = src.shape[:2]
    sy, dy, sx, dx = max((h - n) // 2, 0), max((n - h) // 2, 0), max((w - n) // 2, 0), max((n - w) // 2, 0)
    ch, cw = min(h, n), min(w, n)
    out[dy : dy + ch, dx : dx + cw] = src[sy : sy + ch, sx : sx + cw]
    return out


def dataset(root: Path) -> dict[str, np.ndarray]:
    """Four inputs from the real raster: the file itself, a planar tiled copy, a 16-bit PNG of 3 of its bands
    plus 1 (as .npy: 4 bands), crops; labels thresholded from band 1 (0/1, and 255 where band 4 is 0)."""
    values = real()
    (root / "img").mkdir(parents=True)
    (root / "lab").mkdir()
    images = {"a": values, "b": values[:300, :500], "c": values[100:, 50:], "d": values[::2, ::2]}
    (root / "img" / "a.tif").write_bytes(UINT16.read_bytes())
    tifffile.imwrite(root / "img" / "b.tif", np.moveaxis(images["b"], -1, 0), planarconfig="separate",
                     tile=(64, 64), compression="lzw", photometric="minisblack")
    tifffile.imwrite(root / "img" / "c.tif", images["c"], compression="zstd", bigtiff=True, photometric="minisblack",
                     planarconfig="contig")
    np.save(root / "img" / "d.npy", images["d"])
    for name, img in images.items():
        ids = (img[:, :, 0] > np.median(img[:, :, 0])).astype(np.uint8)
        ids[img[:, :, 3] == 0] = 255
        cv2.imwrite(str(root / "lab" / f"{name}.png"), ids)
    return images


@pytest.mark.parametrize("fmt,codec,size", [
    ("npy", "raw", None), ("npy", "raw", "256x256"), ("lmdb", "zstd", None), ("hdf5", "lz4", "256x256"),
    ("hdf5", "raw", None), ("tfrecord", "raw", None), ("tfrecord", "png", "256x256"),
])
def test_real_bands_and_values_survive_convert_and_read(tmp_path: Path, fmt: str, codec: str,
                                                        size: str | None) -> None:
    images = dataset(tmp_path / "in")
    cfg = ConvertConfig(tmp_path / "in", tmp_path / "out", format=fmt, image_codec=codec, size=size,
                        images="img/{name}.*", labels="lab/{name}.png", num_classes=2, ignore_index=255,
                        workers=1, shard_size=3, quiet=True)
    convert(cfg)
    split = next(p for p in (tmp_path / "out").iterdir() if p.is_dir())
    manifest = json.loads((split / "manifest.json").read_text())
    assert manifest["manifest_version"] == 4 and manifest["format_version"] == 3
    assert manifest["sample"]["image"]["dtype"] == "<u2" and manifest["sample"]["image"]["shape"][2] == 4
    ds = Dataset(split)
    assert ds.image_dtype == np.uint16 and ds.bands == 4 and ds.mean.shape == (4,) and ds.std.shape == (4,)
    seen = set()
    for i in range(len(ds)):
        image, _ = ds[i]
        name = Path(ds.key(i)).name.split(".")[0]
        seen.add(name)
        src = images[name]
        assert image.dtype == np.uint16 and image.shape[2] == 4
        if size is None:
            assert np.array_equal(image, src), name  # bit-exact, every band
        else:
            assert np.array_equal(image, centre(src, 256)), name
    assert seen == set(images)
    if size is None:  # per-band statistics over every stored pixel, at the stored values' scale
        stacked = np.concatenate([im.reshape(-1, 4).astype(np.float64) for im in images.values()])
        std = np.array(manifest["stats"]["image_std"])  # ds.std turns a constant band's 0 into 1
        assert np.allclose(ds.mean, stacked.mean(0), rtol=1e-5) and np.allclose(std, stacked.std(0), atol=1e-3)


def test_a_split_keeps_one_type_and_band_count(tmp_path: Path) -> None:
    dataset(tmp_path / "in")
    (tmp_path / "in" / "img" / "e.tif").write_bytes(BYTE.read_bytes())  # uint8 RGB among uint16 4-band images
    ids = np.zeros((71, 79), np.uint8)
    cv2.imwrite(str(tmp_path / "in" / "lab" / "e.png"), ids)
    cfg = ConvertConfig(tmp_path / "in", tmp_path / "out", images="img/{name}.*", labels="lab/{name}.png",
                        num_classes=2, ignore_index=255, workers=1, quiet=True)
    with pytest.raises(DecodeError, match="uint8 with 3 bands; this split stores uint16 with 4 bands"):
        convert(cfg)


def test_padding_is_left_out_of_the_band_statistics(tmp_path: Path) -> None:
    images = dataset(tmp_path / "in")
    cfg = ConvertConfig(tmp_path / "in", tmp_path / "out", size="700x700", images="img/{name}.*",
                        labels="lab/{name}.png", num_classes=2, ignore_index=255, workers=1, quiet=True)
    convert(cfg)
    ds = Dataset(next(p for p in (tmp_path / "out").iterdir() if p.is_dir()))
    stacked = np.concatenate([im.reshape(-1, 4).astype(np.float64) for im in images.values()])
    assert np.allclose(ds.mean, stacked.mean(0), rtol=1e-5)  # padded to 700x700 with zeros, not counted


def test_georeference_is_kept_per_sample_on_the_stored_grid(tmp_path: Path) -> None:
    """RGBA.uint16.tif is EPSG:32612 with ModelPixelScale (1.37998…, 1.37934…) and a tie point at
    (733268.98…, 4078301.24…) (its GeoKeys and tags, read here with tifffile): every sample's sidecar row keeps
    them, moved by the centre crop (--size) onto the stored pixels."""
    with tifffile.TiffFile(UINT16) as tif:
        geo = tif.geotiff_metadata
    sx, sy = geo["ModelPixelScale"][:2]
    x0, y0 = geo["ModelTiepoint"][3:5]
    assert int(geo["ProjectedCSTypeGeoKey"]) == 32612
    root = tmp_path / "in"
    (root / "img").mkdir(parents=True)
    (root / "lab").mkdir()
    (root / "img" / "a.tif").write_bytes(UINT16.read_bytes())
    cv2.imwrite(str(root / "lab" / "a.png"), np.zeros((411, 634), np.uint8))
    np.save(root / "img" / "b.npy", real()[:300, :400])  # no georeference: NaN / None in its row
    cv2.imwrite(str(root / "lab" / "b.png"), np.zeros((300, 400), np.uint8))
    for size, (dy, dx) in ((None, (0, 0)), ("256x256", ((411 - 256) // 2, (634 - 256) // 2))):
        out = tmp_path / f"out-{size}"
        convert(ConvertConfig(root, out, size=size, images="img/{name}.*", labels="lab/{name}.png", num_classes=1,
                              workers=1, quiet=True))
        ds = Dataset(next(p for p in out.iterdir() if p.is_dir()))
        records = {Path(r["key"]).stem: r for r in ds.manifest.samples}
        assert ds.manifest.manifest_version == 4
        assert records["a"]["crs"] == "EPSG:32612"
        want = [sx, 0.0, x0 + dx * sx, 0.0, -sy, y0 - dy * sy]
        assert np.allclose(records["a"]["transform"], want, rtol=0, atol=1e-6), size
        assert records["b"]["crs"] is None and records["b"]["transform"] is None


def test_rgb_geotiff_keeps_rgb_uint8_and_its_georeference(tmp_path: Path) -> None:
    root = tmp_path / "in"
    (root / "img").mkdir(parents=True)
    (root / "lab").mkdir()
    (root / "img" / "a.tif").write_bytes(BYTE.read_bytes())
    cv2.imwrite(str(root / "lab" / "a.png"), np.zeros((71, 79), np.uint8))
    convert(ConvertConfig(root, tmp_path / "out", images="img/{name}.tif", labels="lab/{name}.png", num_classes=1,
                          workers=1, quiet=True))
    ds = Dataset(next(p for p in (tmp_path / "out").iterdir() if p.is_dir()))
    with tifffile.TiffFile(BYTE) as tif:
        values = tif.pages[0].asarray()
    image, _ = ds[0]
    assert image.dtype == np.uint8 and np.array_equal(image, values)  # RGB uint8 as before: format version 1
    assert ds.manifest.format_version == 1 and ds.manifest.manifest_version == 4  # 4: the georeference columns
    assert ds.manifest.samples[0]["transform"][0] == pytest.approx(3004.1772151898736)


@pytest.mark.parametrize("fmt,codec", [("npy", "raw"), ("lmdb", "zstd"), ("tfrecord", "raw")])
def test_nan_no_data_is_stored_exactly_and_left_out_of_the_statistics(tmp_path: Path, fmt: str, codec: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Float rasters mark "no data" with NaN (and overflow with inf): the values are kept bit for bit, the band
    statistics count finite values only, the manifest says how many were left out, and the run says so."""
    values = real().astype(np.float32) / np.float32(65535)
    values[real()[:, :, 3] == 0] = np.nan  # the raster's own no-data area (band 4 is 0 there)
    ys, xs = np.nonzero(real()[:, :, 3])
    values[ys[:3], xs[:3], 1] = np.inf  # three overflowed values inside the data area, in band 2 only
    (tmp_path / "in" / "img").mkdir(parents=True)
    (tmp_path / "in" / "lab").mkdir()
    images = {"a": values, "b": values[:200, :300]}
    for name, img in images.items():
        np.save(tmp_path / "in" / "img" / f"{name}.npy", img)
        cv2.imwrite(str(tmp_path / "in" / "lab" / f"{name}.png"), (img[:, :, 0] > 0.3).astype(np.uint8))
    cfg = ConvertConfig(tmp_path / "in", tmp_path / "out", format=fmt, image_codec=codec, images="img/{name}.*",
                        labels="lab/{name}.png", num_classes=2, workers=1, quiet=True)
    with caplog.at_level("WARNING", logger="shardkit"):
        convert(cfg)
    split = next(p for p in (tmp_path / "out").iterdir() if p.is_dir())
    ds = Dataset(split)
    for i in range(len(ds)):
        image, _ = ds[i]
        src = images[Path(ds.key(i)).name.split(".")[0]]
        assert image.dtype == np.float32 and np.array_equal(image.view(np.uint32), src.view(np.uint32))
    stats = json.loads((split / "manifest.json").read_text())["stats"]
    stacked = np.concatenate([im.reshape(-1, 4).astype(np.float64) for im in images.values()])
    finite = np.isfinite(stacked)
    assert stats["image_nonfinite"] == (~finite).sum(0).tolist() and sum(stats["image_nonfinite"]) > 0
    want = np.array([stacked[finite[:, b], b].mean() for b in range(4)])
    assert np.allclose(stats["image_mean"], want, rtol=1e-5, atol=1e-6)  # rounded to 6 decimals
    assert np.allclose(stats["image_std"], [stacked[finite[:, b], b].std() for b in range(4)], atol=1e-6)
    assert stats["image_max"] == [float(stacked[finite[:, b], b].max()) for b in range(4)]
    assert stats["image_nonfinite"][1] == stats["image_nonfinite"][0] + 3
    assert any("NaN/inf image values" in r.getMessage() and "band 2" in r.getMessage() for r in caplog.records)
