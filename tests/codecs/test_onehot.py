"""The one-hot kernels (numba and numpy) against the definition ``ids[..., None] == arange(C)``, with ignore ids."""

from __future__ import annotations

import numpy as np
import pytest

from shardkit.codecs import onehot
from shardkit.codecs.onehot import onehot_into


def reference(ids: np.ndarray, c: int, dtype: type, channels_first: bool) -> np.ndarray:
    want = (ids[..., None] == np.arange(c)).astype(dtype)
    return np.moveaxis(want, -1, -3) if channels_first else want


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
@pytest.mark.parametrize("channels_first", [False, True])
@pytest.mark.parametrize("ids_dtype", [np.uint8, np.uint16])
def test_onehot_matches_definition_including_ignore_ids(dtype: type, channels_first: bool, ids_dtype: type) -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 12, (3, 37, 41)).astype(ids_dtype)
    ids[0, :5, :7] = 255  # an ignore id: all-zero vector
    ids[2, -1, -1] = 12  # just past the last class
    shape = (3, 12, 37, 41) if channels_first else (3, 37, 41, 12)
    out = np.full(shape, 7, dtype)  # stale contents must be overwritten
    onehot_into(ids, 12, out, channels_first=channels_first)
    assert np.array_equal(out, reference(ids, 12, dtype, channels_first))
    assert out[0, ..., :5, :7].sum() == 0 if channels_first else out[0, :5, :7].sum() == 0


def test_channels_last_chunks_cover_every_pixel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDKIT_NO_NUMBA", "1")  # the numpy kernel is the chunked one
    monkeypatch.setattr(onehot, "CHUNK", 100)  # 5 * 31 * 29 pixels: many chunks and a ragged last one
    ids = np.random.default_rng(1).integers(0, 5, (5, 31, 29)).astype(np.uint8)
    out = np.full((5, 31, 29, 5), 9, np.float32)
    onehot_into(ids, 5, out)
    assert np.array_equal(out, reference(ids, 5, np.float32, False))


def test_channels_last_into_a_strided_buffer_still_correct() -> None:
    ids = np.random.default_rng(2).integers(0, 4, (2, 6, 8)).astype(np.uint8)
    big = np.zeros((2, 6, 8, 8), np.float32)
    view = big[..., :4]  # not contiguous: the broadcast comparison path
    onehot_into(ids, 4, view)
    assert np.array_equal(view, reference(ids, 4, np.float32, False)) and not big[..., 4:].any()


def test_empty_batch_is_a_no_op() -> None:
    out = np.empty((0, 4, 4, 3), np.float32)
    onehot_into(np.empty((0, 4, 4), np.uint8), 3, out)
    assert out.shape == (0, 4, 4, 3)


@pytest.fixture(params=["numba", "numpy"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the compiled kernel (numba is in the dev extra: CI has it) and with numpy."""
    if request.param == "numpy":
        monkeypatch.setenv("SHARDKIT_NO_NUMBA", "1")
    assert onehot.kernel_name() == request.param
    return request.param


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
@pytest.mark.parametrize("ids_dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("channels_first", [False, True])
def test_both_kernels_match_the_definition(kernel: str, dtype: type, ids_dtype: type, channels_first: bool) -> None:
    ids = np.random.default_rng(3).integers(0, 14, (2, 33, 35)).astype(ids_dtype)  # 12, 13: past the classes
    out = np.full((2, 12, 33, 35) if channels_first else (2, 33, 35, 12), 5, dtype)
    onehot_into(ids, 12, out, channels_first=channels_first)
    assert np.array_equal(out, reference(ids, 12, dtype, channels_first))
    single = np.full(out.shape[1:], 5, dtype)  # one sample, no batch axis
    onehot_into(ids[1], 12, single, channels_first=channels_first)
    assert np.array_equal(single, out[1])


def test_without_numba_installed_numpy_kernels_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "numba", None)  # import numba → ImportError
    monkeypatch.setattr(onehot, "KERNELS", onehot.KERNELS.fresh())
    assert onehot.kernel_name() == "numpy"
    ids = np.random.default_rng(4).integers(0, 5, (3, 9, 11)).astype(np.uint8)
    out = np.empty((3, 9, 11, 5), np.float32)
    onehot_into(ids, 5, out)
    assert np.array_equal(out, reference(ids, 5, np.float32, False))


def test_numba_without_a_usable_cache_still_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    import numba

    real = numba.njit

    def no_cache(*args, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function: no locator available")
        return real(*args, **kwargs)

    monkeypatch.setattr(numba, "njit", no_cache)
    monkeypatch.setattr(onehot, "KERNELS", onehot.KERNELS.fresh())
    assert onehot.kernel_name() == "numba"


def test_allow_numba_false_keeps_to_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise AssertionError("numba kernels requested")

    monkeypatch.setattr(onehot, "numba_kernels", fail)
    ids = np.random.default_rng(5).integers(0, 6, (2, 7, 9)).astype(np.uint8)
    out = np.empty((2, 7, 9, 5), np.uint8)
    onehot_into(ids, 5, out, allow_numba=False)
    assert np.array_equal(out, reference(ids, 5, np.uint8, False))


@pytest.mark.parametrize("ignore", [0, 5, 11])
@pytest.mark.parametrize("channels_first", [False, True])
@pytest.mark.parametrize("ids_dtype", [np.uint8, np.uint16, np.int64])
def test_an_ignore_id_inside_the_classes_has_no_channel(ignore: int, channels_first: bool, ids_dtype: type) -> None:
    """Numba and numpy kernels alike: the ignore class is dropped, the classes above it move down one."""
    ids = np.random.default_rng(2).integers(0, 12, (2, 19, 23)).astype(ids_dtype)
    ids[0, :3, :4] = 255
    keep = np.array([k for k in range(12) if k != ignore])
    want = (ids[..., None] == keep).astype(np.float32)
    want = np.moveaxis(want, -1, -3) if channels_first else want
    out = np.full(want.shape, 3, np.float32)
    onehot_into(ids, 12, out, channels_first=channels_first, ignore_index=ignore)
    assert np.array_equal(out, want)
    assert onehot.hot_channels(12, ignore) == 11 and onehot.hot_channels(12, 255) == 12
    assert np.array_equal(onehot.channel_classes(12, ignore), keep)
    lut = onehot.channel_lut(12, ignore)  # the torch / TF kernels' table: same numbering (>= 11: no channel)
    via_lut = lut[np.minimum(ids, 12).astype(np.int64)]
    assert np.array_equal(np.minimum(via_lut, 11), np.minimum(onehot.channel_ids(ids, 12, ignore), 11))


def test_an_ignore_id_outside_the_classes_changes_nothing() -> None:
    ids = np.array([[0, 3, 255]], np.uint8)
    assert onehot.channel_ids(ids, 4, 255) is ids and onehot.channel_ids(ids, 4, None) is ids
    out = np.empty((1, 3, 4), np.uint8)
    onehot_into(ids, 4, out, ignore_index=255)
    assert np.array_equal(out, reference(ids, 4, np.uint8, False))
