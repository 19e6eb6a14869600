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


def test_zeros_to_ones_checks_the_range_and_lists_the_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    """The float32 gamma's one pass: values in [0, 1] (NaN allowed) pass, each 0 and -0 becomes 1 and is listed,
    compiled and numpy alike; a value outside [0, 1] (after some zeros) is one ConfigError line, nothing changed."""
    x = np.random.default_rng(0).random(5000, dtype=np.float32)
    x[[3, 10, 4000]] = 0.0
    x[77] = -0.0
    x[5] = np.nan
    fast, slow = x.copy(), x.copy()
    want = np.flatnonzero(x == 0)
    got = [levels.zeros_to_ones(fast)]
    with monkeypatch.context() as mp:
        mp.setenv("SHARDKIT_NO_NUMBA", "1")
        got.append(levels.zeros_to_ones(slow))
    for zeros, arr in zip(got, (fast, slow), strict=True):
        np.testing.assert_array_equal(zeros, want)
        assert (arr[want] == 1).all() and np.array_equal(np.delete(arr, want), np.delete(x, want), equal_nan=True)
    for bad in (-0.01, 1.5, np.inf):
        y = x.copy()
        y[2000] = bad
        before = y.copy()
        for numba in ("0", "1"):
            with monkeypatch.context() as mp, pytest.raises(ConfigError, match=r"takes values in \[0, 1\]") as err:
                mp.setenv("SHARDKIT_NO_NUMBA", numba)
                levels.zeros_to_ones(y)
            assert "\n" not in str(err.value)
            np.testing.assert_array_equal(y, before)  # nothing changed (the zeros before 2000 put back)


@pytest.mark.parametrize("batch", [1, 26])
def test_compiled_normalisation_gives_numpys_bits(camvid_val_npy: Path, monkeypatch: pytest.MonkeyPatch,
                                                 batch: int) -> None:
    """Normalize on real CamVid uint8 batches (one sample: one thread; 26: split over threads) by the compiled
    one-pass loop equals numpy's two passes bit for bit, with the split's own statistics and with extreme ones."""
    from shardkit.augment.ops import Normalize

    if levels.NORMALIZE_KERNELS.get() is None:
        pytest.skip("numba is not installed (the shardkit[fast] extra)")
    monkeypatch.setattr(levels, "_NORMALIZE_ROWS", 1 << 16)  # several threads for the 26-sample batch
    ds = shardkit.open(camvid_val_npy)
    images = ds.batch(np.arange(batch))[0]
    ran: list[bool] = []

    def counted(*args: np.ndarray) -> bool:
        ran.append(levels.normalize_uint8(*args))
        return ran[-1]

    monkeypatch.setattr("shardkit.augment.ops.normalize_uint8", counted)
    for op in (ds.normalizer, Normalize([0.5, 254.5, 127.0], [1e-3, 300.0, 0.7])):
        ran.clear()
        fast = op.numpy(images)
        with monkeypatch.context() as mp:
            mp.setenv("SHARDKIT_NO_NUMBA", "1")
            slow = op.numpy(images)
        assert ran[0] and not ran[1]  # the compiled loop ran, then numpy alone
        assert fast.dtype == slow.dtype == np.float32 and np.array_equal(fast.view(np.uint32), slow.view(np.uint32))
