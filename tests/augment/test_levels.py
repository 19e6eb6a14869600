"""Level maps on 16-bit and float32 images (shardkit.augment.levels): the compiled loops give exactly the numpy
rules, the gamma table is the stated formula over the dtype's range, float32 gamma refuses values outside [0, 1].
On real CamVid pixels spread to the 16-bit range and rasterio's real 4-band uint16 GeoTIFF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit.augment import levels
from shardkit.errors import ConfigError


@pytest.fixture(scope="module")
def images(camvid_val_npy: Path) -> list[np.ndarray]:
    tifffile = pytest.importorskip("tifffile")
    rgb = shardkit.open(camvid_val_npy).batch(np.arange(2))[0]
    u16 = (rgb.astype(np.uint16) * 257 + rgb % 3).astype(np.uint16)
    i16 = (rgb.astype(np.int32) * 256 - 32768 + rgb % 5).astype(np.int16)
    geo = tifffile.imread(Path(__file__).parents[1] / "data" / "geotiff" / "RGBA.uint16.tif")
    return [u16, i16, np.ascontiguousarray(geo)]


def _both(monkeypatch: pytest.MonkeyPatch, fn, image: np.ndarray, *args: float) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """``fn`` applied to copies of ``image`` with the compiled loop and with numpy alone."""
    if levels.KERNELS.get() is None:
        pytest.skip("numba is not installed (the shardkit[fast] extra)")
    fast = image.copy()
    fn(fast, *args)
    with monkeypatch.context() as mp:
        mp.setenv("SHARDKIT_NO_NUMBA", "1")
        slow = image.copy()
        fn(slow, *args)
    return fast, slow


@pytest.mark.parametrize(("b", "c"), [(1.0, 1.0), (1.3, 0.7), (0.6, 1.8), (1.5, 1.5)])
def test_compiled_brightness_contrast_equals_the_numpy_rule(images: list[np.ndarray], b: float, c: float,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for image in images:
        fast, slow = _both(monkeypatch, levels.brightness_contrast, image, b, c)
        assert fast.tobytes() == slow.tobytes()
        lo, mid, hi = levels.LEVELS[image.dtype.name]
        want = np.clip(np.rint((image.astype(np.float64) * b - mid) * c + mid), lo, hi).astype(image.dtype)
        np.testing.assert_array_equal(fast, want)


@pytest.mark.parametrize("g", [0.3, 0.8, 1.0, 1.2, 2.5])
def test_16_bit_gamma_is_the_formula_over_the_dtype_range(images: list[np.ndarray], g: float,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for image in images:
        fast, slow = _both(monkeypatch, levels.gamma, image, g)
        assert fast.tobytes() == slow.tobytes()
        lo, _, hi = levels.LEVELS[image.dtype.name]
        t = (image.astype(np.float64) - lo) / (hi - lo)
        np.testing.assert_array_equal(fast, (np.rint(t ** g * (hi - lo)) + lo).astype(image.dtype))
    for dt in ("uint16", "int16"):
        table = levels.gamma_table16(g, dt)
        lo, _, hi = levels.LEVELS[dt]
        assert table.dtype == np.dtype(dt) and table[0] == lo and table[-1] == hi  # the range's ends stay
        assert (np.diff(table.astype(np.int64)) >= 0).all()  # monotonic: no level wraps


def test_float_gamma_is_a_float32_power_and_refuses_values_outside_0_1() -> None:
    x = np.linspace(0, 1, 1001, dtype=np.float32).reshape(7, 11, 13)
    x.reshape(-1)[5] = np.nan
    got = x.copy()
    levels.gamma(got, 1.7)
    _close_to_power(got, x, 1.7)
    for bad in (-0.01, 1.5, np.inf):
        y = x.copy()
        y[3, 4, 5] = bad
        before = y.copy()
        with pytest.raises(ConfigError, match=r"takes values in \[0, 1\]") as err:
            levels.gamma(y, 0.8)
        assert "\n" not in str(err.value)
        np.testing.assert_array_equal(y, before)  # nothing changed


def _close_to_power(got: np.ndarray, x: np.ndarray, g: float) -> None:
    """``got`` is ``x ** g`` (g rounded to float32) within 1e-5 relative of the exact power, NaN where x is NaN,
    0 and 1 exactly where x is 0 and 1."""
    exact = np.power(x.astype(np.float64), float(np.float32(g)))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x))
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=np.finfo(np.float32).tiny)
    assert (got[x == 0] == 0).all() and (got[x == 1] == 1).all()


def test_compiled_float_gamma_equals_numpy_power(monkeypatch: pytest.MonkeyPatch) -> None:
    """With and without numba (only the range check is compiled) the same values, within 1e-5 relative of the
    exact power, also over values log-uniform down to 1e-37 and in a non-contiguous view."""
    rng = np.random.default_rng(0)
    x = rng.random((64, 80, 4), dtype=np.float32)
    x[0, 0, 0], x[1, 1, 1], x[2, 2, 2] = 0.0, 1.0, np.nan
    x[3] = (10.0 ** rng.uniform(-37, 0, x[3].shape)).astype(np.float32)
    for g in (0.3, 0.8, 1.0, 1.2, 2.5):
        fast, slow = _both(monkeypatch, levels.gamma, x, g)
        np.testing.assert_array_equal(fast, slow)
        _close_to_power(fast, x, g)
        view = x[:, ::-1].copy()[:, ::-1]  # non-contiguous: copied, powered, written back
        levels.gamma(view, g)
        np.testing.assert_array_equal(view, fast)
