"""Augmentation beyond 8-bit RGB on all three backends: any band count, uint8 / uint16 / int16 / float32 images.

The images are real CamVid pixels made into multi-band, 16-bit and float data (bands stacked from the RGB
channels and their grey, levels spread to the 16-bit range, scaled to [0, 1] as float32): labels must stay
exact and identical across the numpy/OpenCV, torch and TensorFlow paths; images within one level (integers)
or 1e-5 relative (float32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardkit
from shardkit import augment as A
from shardkit.augment import ops as O
from shardkit.errors import ConfigError

from .devices import DEVICES

IGNORE = 11
GEOMETRY = "scale=0.5:2,crop=128x160,hflip,rotate=10"


@pytest.fixture(scope="module")
def camvid(camvid_val_npy: Path) -> tuple[np.ndarray, np.ndarray]:
    ds = shardkit.open(camvid_val_npy)
    return ds.batch(np.arange(6))


def _bands(rgb: np.ndarray, n: int) -> np.ndarray:
    """n bands from real RGB pixels: R, G, B, grey, then the channels again, each shifted by its band number."""
    grey = rgb.astype(np.uint16).sum(-1, keepdims=True) // 3
    base = np.concatenate([rgb.astype(np.uint16), grey], -1)
    return np.stack([(base[..., k % 4] + 7 * (k // 4)) % 256 for k in range(n)], -1).astype(np.uint16)


def make(rgb: np.ndarray, n: int, dtype: str) -> np.ndarray:
    b = _bands(rgb, n)
    if dtype == "uint8":
        return b.astype(np.uint8)
    if dtype == "uint16":
        return (b * 257 + (b % 3)).astype(np.uint16)  # the 16-bit range, low bits not all zero
    if dtype == "int16":
        return (b.astype(np.int32) * 256 - 32768 + b % 5).astype(np.int16)  # negative values too
    return (b.astype(np.float32) / 255.0).astype(np.float32)


def _run(backend: str, aug: A.Compose, images: np.ndarray, labels: np.ndarray, idx: np.ndarray, tf: Any) -> tuple:
    kw: dict[str, Any] = {"seed": 3, "epoch": 1, "ignore_index": IGNORE}
    if backend == "numpy":
        return aug(images, labels, idx, **kw)
    if backend == "torch":
        import torch

        from shardkit.augment.torch import apply_batch

        img, lab = apply_batch(aug, torch.from_numpy(images), torch.from_numpy(labels), idx, **kw)
        return img.numpy(), lab.numpy()
    from shardkit.augment.tf import apply_batch as tf_apply

    img, lab = tf_apply(aug, images, labels, idx, **kw)
    return img.numpy(), lab.numpy()


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == np.float32:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    else:
        assert np.abs(got.astype(np.int64) - want).max() <= 1


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int16", "float32"])
@pytest.mark.parametrize("bands", [1, 2, 4, 6, 7])  # 2 and 6: OpenCV 5 warps 2 channels on its 1/32-pixel path
def test_the_fused_warp_on_any_bands_and_dtype_agrees_on_every_backend(tf, camvid: tuple, dtype: str,
                                                                       bands: int) -> None:
    rgb, labels = camvid
    images = make(rgb, bands, dtype)
    aug = A.parse(GEOMETRY)
    idx = np.arange(30, 30 + len(images))
    want_img, want_lab = _run("numpy", aug, images, labels, idx, tf)
    _, rgb_lab = aug(rgb, labels, idx, seed=3, epoch=1, ignore_index=IGNORE)
    np.testing.assert_array_equal(want_lab, rgb_lab)  # labels do not depend on the image at all
    assert want_img.shape == (len(images), 128, 160, bands) and want_img.dtype == images.dtype
    for backend in ("torch", "tf"):
        got_img, got_lab = _run(backend, aug, images, labels, idx, tf)
        np.testing.assert_array_equal(got_lab, want_lab)
        _close(got_img, want_img)


@pytest.mark.parametrize("dtype", ["uint16", "int16", "float32"])
@pytest.mark.parametrize("device", DEVICES)
def test_the_warp_of_bands_on_a_torch_device_is_the_numpy_rule(camvid: tuple, dtype: str, device: str) -> None:
    """5-band 16-bit and float32 batches warped (with 16-bit brightness/contrast) by the torch backend on the CPU
    and, where a GPU is lent, on CUDA: labels identical to the numpy path, images within a level (float32: 1e-5
    relative) — the float64 emulation of OpenCV's float32 rule on the device."""
    import torch

    from shardkit.augment.torch import apply_batch

    rgb, labels = camvid
    images = make(rgb, 5, dtype)
    aug = A.parse(GEOMETRY + (",jitter=0.2:0.2" if dtype != "float32" else ""))
    idx = np.arange(len(images))
    want_img, want_lab = aug(images, labels, idx, seed=5, epoch=2, ignore_index=IGNORE)
    got_img, got_lab = apply_batch(aug, torch.from_numpy(images).to(device), torch.from_numpy(labels).to(device),
                                   idx, seed=5, epoch=2, ignore_index=IGNORE)
    np.testing.assert_array_equal(got_lab.cpu().numpy(), want_lab)
    _close(got_img.cpu().numpy(), want_img)


def test_each_band_is_warped_as_the_rgb_path_warps_a_channel(camvid: tuple) -> None:
    rgb, labels = camvid
    aug = A.parse(GEOMETRY)
    idx = np.arange(len(rgb))
    want, _ = aug(rgb, labels, idx, seed=2, ignore_index=IGNORE)
    seven = make(rgb, 7, "uint8")  # bands 0-2 are R, G, B; 4-6 R, G, B shifted by 7 levels
    got, _ = aug(seven, labels, idx, seed=2, ignore_index=IGNORE)
    np.testing.assert_array_equal(got[..., :3], want)
    one, _ = aug(np.ascontiguousarray(rgb[..., 1:2]), labels, idx, seed=2, ignore_index=IGNORE)
    np.testing.assert_array_equal(one[..., 0], want[..., 1])


def test_per_band_normalize_on_every_backend(tf, camvid: tuple, camvid_val_npy: Path) -> None:
    rgb, labels = camvid
    images = make(rgb, 4, "uint16")
    mean, std = images.reshape(-1, 4).mean(0), images.reshape(-1, 4).std(0)
    aug = A.Compose([*A.parse(GEOMETRY).ops, A.Normalize(mean, std)])
    idx = np.arange(len(images))
    want_img, want_lab = _run("numpy", aug, images, labels, idx, tf)
    plain, _ = A.parse(GEOMETRY)(images, labels, idx, seed=3, epoch=1, ignore_index=IGNORE)
    assert want_img.dtype == np.float32 and want_img.shape[-1] == 4
    np.testing.assert_allclose(want_img, (plain - mean.astype(np.float32)) * (1 / std.astype(np.float32)),
                               rtol=1e-6, atol=1e-6)
    for backend in ("torch", "tf"):
        got_img, got_lab = _run(backend, aug, images, labels, idx, tf)
        np.testing.assert_array_equal(got_lab, want_lab)
        # one uint16 level apart at most before normalising
        assert np.abs(got_img - want_img).max() <= 1.0 / std.min() + 1e-4
    ds = shardkit.open(camvid_val_npy)
    assert A.Normalize.from_split(ds) == A.Normalize(ds.mean, ds.std)


@pytest.mark.parametrize("backend", ["numpy", "torch", "tf"])
@pytest.mark.parametrize(("spec", "bands", "dtype", "match"), [
    ("jitter=0.1:0.1:0.2", 4, "uint8", "saturation and hue mean something for RGB images only"),
    ("jitter=0:0:0:0.1", 1, "uint8", "saturation and hue mean something for RGB images only"),
    ("jitter=0.2", 3, "float32", "ColorJitter applies to integer images"),
    ("jitter=0.2:0.2:0.1", 3, "uint16", "saturation and hue mean something for RGB images only"),
    ("cutout=1:8x8:300", 4, "uint8", r"Cutout's fill \(300, 300, 300\) does not fit uint8 images"),
])
def test_ops_that_mean_nothing_for_the_data_are_refused_on_every_backend(tf, camvid: tuple, backend: str, spec: str,
                                                                         bands: int, dtype: str, match: str) -> None:
    rgb, labels = camvid
    with pytest.raises(ConfigError, match=match) as err:
        _run(backend, A.parse(f"crop=64x64,{spec}"), make(rgb[:2], bands, dtype), labels[:2], np.arange(2), tf)
    assert "\n" not in str(err.value)


def test_brightness_and_contrast_apply_per_band_on_uint8_bands(tf, camvid: tuple) -> None:
    rgb, labels = camvid
    images = make(rgb, 5, "uint8")
    aug = A.parse("crop=128x160,jitter=0.3")
    idx = np.arange(len(images))
    want_img, _ = _run("numpy", aug, images, labels, idx, tf)
    for k, i in enumerate(idx):
        p = aug.params(int(i), seed=3, epoch=1, hw=(360, 480))
        y0, x0 = p.crop_offset
        lut = O.colour_luts([p])[0]
        np.testing.assert_array_equal(want_img[k], lut[images[k, y0:y0 + 128, x0:x0 + 160]])
    for backend in ("torch", "tf"):
        np.testing.assert_array_equal(_run(backend, aug, images, labels, idx, tf)[0], want_img)


@pytest.mark.parametrize("dtype", ["uint16", "int16"])
def test_brightness_and_contrast_on_16_bit_bands_keep_the_dtype_range_on_every_backend(tf, camvid: tuple,
                                                                                         dtype: str) -> None:
    rgb, labels = camvid
    images = make(rgb, 4, dtype)
    aug = A.parse("crop=128x160,jitter=0.5")
    idx = np.arange(len(images))
    want_img, want_lab = _run("numpy", aug, images, labels, idx, tf)
    lo, mid, hi = O.LEVELS[dtype]
    clipped = 0
    for k, i in enumerate(idx):
        p = aug.params(int(i), seed=3, epoch=1, hw=(360, 480))
        y0, x0 = p.crop_offset
        x = images[k, y0:y0 + 128, x0:x0 + 160].astype(np.float64)
        want = np.clip(np.rint((x * p.brightness - mid) * p.contrast + mid), lo, hi)
        np.testing.assert_array_equal(want_img[k], want.astype(dtype))
        np.testing.assert_array_equal(want_lab[k], labels[k, y0:y0 + 128, x0:x0 + 160])
        clipped += int((want_img[k] == hi).sum() + (want_img[k] == lo).sum())
    assert clipped > 0 and want_img.dtype == np.dtype(dtype)  # the range is reached and kept, never wrapped
    for backend in ("torch", "tf"):
        got_img, got_lab = _run(backend, aug, images, labels, idx, tf)
        np.testing.assert_array_equal(got_img, want_img)
        np.testing.assert_array_equal(got_lab, want_lab)


def test_normalize_takes_one_mean_and_std_per_band() -> None:
    assert len(A.Normalize([1.0] * 13, [2.0] * 13).mean) == 13
    with pytest.raises(ConfigError, match="Normalize needs 4 means"):
        A.Normalize([1, 2, 3, 4], [1, 2, 3])
    with pytest.raises(ConfigError, match="Normalize has 4 means and stds, the images 3 channels"):
        A.Compose([A.Normalize([1, 2, 3, 4], [1, 2, 3, 4])]).output_spec(O.BatchSpec())


def _geotiff() -> tuple[np.ndarray, np.ndarray]:
    """Real 4-band uint16 Landsat reflectance (rasterio's CC0 RGBA.uint16.tif, 0..10000), four 160x192 windows,
    with labels thresholded from its first band (ids 0..3)."""
    tifffile = pytest.importorskip("tifffile")
    scene = tifffile.imread(Path(__file__).parents[1] / "data" / "geotiff" / "RGBA.uint16.tif")
    wins = [(0, 0), (100, 200), (250, 400), (200, 40)]
    images = np.stack([scene[y:y + 160, x:x + 192] for y, x in wins])
    labels = np.clip(images[..., 0] // 800, 0, 3).astype(np.uint8)
    return np.ascontiguousarray(images), labels


@pytest.mark.parametrize("dtype", ["uint16", "int16"])
def test_gamma_on_16_bit_bands_maps_the_dtype_range_on_every_backend(tf, camvid: tuple, dtype: str) -> None:
    rgb, labels = camvid
    images = make(rgb, 4, dtype)
    geo = A.parse("crop=128x160")
    aug = A.parse("crop=128x160,gamma=0.5:2")
    idx = np.arange(len(images))
    plain, plain_lab = _run("numpy", geo, images, labels, idx, tf)
    want_img, want_lab = _run("numpy", aug, images, labels, idx, tf)
    np.testing.assert_array_equal(want_lab, plain_lab)  # labels untouched
    lo, _, hi = O.LEVELS[dtype]
    for k, i in enumerate(idx):
        g = aug.params(int(i), seed=3, epoch=1, hw=(360, 480)).get(O.GammaParams).gamma
        t = (plain[k].astype(np.float64) - lo) / (hi - lo)
        np.testing.assert_array_equal(want_img[k], (np.rint(t ** g * (hi - lo)) + lo).astype(dtype))
    assert want_img.dtype == np.dtype(dtype) and not np.array_equal(want_img, plain)
    for backend in ("torch", "tf"):
        got_img, got_lab = _run(backend, aug, images, labels, idx, tf)
        np.testing.assert_array_equal(got_lab, want_lab)
        _close(got_img, want_img)


def test_gamma_on_real_4_band_uint16_geotiff_with_the_warp_on_every_backend(tf) -> None:
    images, labels = _geotiff()
    aug = A.parse("scale=0.8:1.25,crop=128x160,hflip,rotate=10,jitter=0.2:0.2,gamma=0.7:1.4")
    idx = np.arange(len(images))
    want_img, want_lab = _run("numpy", aug, images, labels, idx, tf)
    assert want_img.dtype == np.uint16 and want_img.shape == (4, 128, 160, 4)
    for backend in ("torch", "tf"):
        got_img, got_lab = _run(backend, aug, images, labels, idx, tf)
        np.testing.assert_array_equal(got_lab, want_lab)
        _close(got_img, want_img)


def test_gamma_on_float32_is_a_power_of_values_in_0_1_on_every_backend(tf, camvid: tuple) -> None:
    rgb, labels = camvid
    images = make(rgb, 4, "float32")
    images[0, :4, :4] = np.nan  # NaN (no data) stays NaN
    idx = np.arange(len(images))
    plain, _ = _run("numpy", A.parse(GEOMETRY), images, labels, idx, tf)
    aug = A.parse(f"{GEOMETRY},gamma=0.5:2")
    want_img, want_lab = _run("numpy", aug, images, labels, idx, tf)
    for k, i in enumerate(idx):
        g = np.float32(aug.params(int(i), seed=3, epoch=1, hw=(360, 480)).get(O.GammaParams).gamma)
        exact = plain[k].astype(np.float64) ** float(g)  # within 1e-5 of the exact power (cv2.pow on the CPU)
        np.testing.assert_array_equal(np.isnan(want_img[k]), np.isnan(exact))
        np.testing.assert_allclose(want_img[k], exact, rtol=1e-5, atol=np.finfo(np.float32).tiny)
    assert np.isnan(want_img).any() == np.isnan(plain).any()
    finite = ~np.isnan(want_img)
    for backend in ("torch", "tf"):
        got_img, got_lab = _run(backend, aug, images, labels, idx, tf)
        np.testing.assert_array_equal(got_lab, want_lab)
        np.testing.assert_array_equal(np.isnan(got_img), ~finite)
        np.testing.assert_allclose(got_img[finite], want_img[finite], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "torch", "tf"])
def test_gamma_refuses_float32_values_outside_0_1_on_every_backend(tf, camvid: tuple, backend: str) -> None:
    rgb, labels = camvid
    images = make(rgb[:2], 4, "float32") * 2.0  # up to 2.0
    errors: tuple[type[Exception], ...] = (ConfigError,)
    if backend == "tf":
        errors = (tf.errors.InvalidArgumentError,)
    with pytest.raises(errors, match=r"takes values in \[0, 1\]"):
        _run(backend, A.parse("crop=64x64,gamma=0.8:1.2"), images, labels[:2], np.arange(2), tf)


@pytest.mark.parametrize(("dtype", "fill", "want"), [
    ("uint16", 65535, (65535,) * 4), ("uint16", (1, 2, 60000, 4), (1, 2, 60000, 4)),
    ("int16", -32768, (-32768,) * 4), ("float32", (0.5, -1.0, 2.0, 0.25), (0.5, -1.0, 2.0, 0.25)),
    ("uint8", (9, 8, 7, 6), (9, 8, 7, 6)),
])
def test_cutout_fills_every_band_within_the_dtype_on_every_backend(tf, camvid: tuple, dtype: str, fill: Any,
                                                                   want: tuple) -> None:
    rgb, labels = camvid
    images = make(rgb, 4, dtype)
    plain = A.parse(GEOMETRY)
    aug = A.Compose([*plain.ops, A.Cutout((1, 3), 40, 50, fill=fill, ignore_labels=True)])
    idx = np.arange(len(images))
    base_img, base_lab = _run("numpy", plain, images, labels, idx, tf)
    want_img, want_lab = _run("numpy", aug, images, labels, idx, tf)
    for k, i in enumerate(idx):
        mask = np.zeros((128, 160), bool)
        for y0, x0, y1, x1 in aug.params(int(i), seed=3, epoch=1, hw=(360, 480)).holes:
            mask[y0:y1, x0:x1] = True
        assert mask.any()
        np.testing.assert_array_equal(want_img[k][mask], np.broadcast_to(np.asarray(want, dtype), (mask.sum(), 4)))
        np.testing.assert_array_equal(want_img[k][~mask], base_img[k][~mask])
        assert (want_lab[k][mask] == IGNORE).all()
        np.testing.assert_array_equal(want_lab[k][~mask], base_lab[k][~mask])
    for backend in ("torch", "tf"):
        got_img, got_lab = _run(backend, aug, images, labels, idx, tf)
        np.testing.assert_array_equal(got_lab, want_lab)
        _close(got_img, want_img)


@pytest.mark.parametrize(("dtype", "fill", "match"), [
    ("uint16", 70000, "does not fit uint16 images"), ("uint16", -1, "does not fit uint16"),
    ("uint16", 0.5, "does not fit uint16"), ("int16", 40000, "does not fit int16"),
    ("uint16", (1, 2, 3), "has 3 values, the images 4 bands"),
])
def test_cutout_fills_that_do_not_fit_are_refused_in_one_line(dtype: str, fill: Any, match: str) -> None:
    aug = A.Compose([A.RandomCrop(8, 8), A.Cutout(1, 2, 2, fill=fill)])
    with pytest.raises(ConfigError, match=match) as err:
        aug.output_spec(O.BatchSpec(channels=4, image_dtype=dtype))
    assert "\n" not in str(err.value)


def test_cutout_string_fill_takes_any_number_checked_against_the_data() -> None:
    assert A.parse("cutout=1:8x8:65535") == A.Compose([A.Cutout(1, 8, 8, fill=65535)])
    assert A.parse("cutout=1:8x8:-0.5:ignore") == A.Compose([A.Cutout(1, 8, 8, fill=-0.5, ignore_labels=True)])
    A.parse("crop=8x8,cutout=1:8x8:65535").output_spec(O.BatchSpec(channels=7, image_dtype="uint16"))
    with pytest.raises(ConfigError, match="does not fit uint8"):
        A.parse("crop=8x8,cutout=1:8x8:65535").output_spec(O.BatchSpec(channels=3, image_dtype="uint8"))
