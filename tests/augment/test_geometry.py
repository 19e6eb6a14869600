"""The numpy/OpenCV augmentation path: its fast label gathers give exactly the float64 rule's labels.

:func:`~shardkit.augment.geometry.gather_labels_exact` is the rule in plain float64 numpy (the one the torch
backend reproduces). :func:`~shardkit.augment.geometry.warp_labels` picks a faster way — one row and one
column index vector for matrices without rotation, a compiled loop (numba) otherwise, or the rule in
blocks of rows without numba. Each is compared here with the rule, pixel for pixel, on real CamVid
labels (uint8 and uint16 with ids above 255) under drawn and hand-made matrices, including coordinates
that land exactly on .5, outside the source, or entirely outside it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit import augment as A
from shardkit.augment import geometry

IGNORE = 11
OUT_HW = (256, 384)


@pytest.fixture(scope="module")
def labels(camvid_val_npy: Path) -> list[np.ndarray]:
    """Four real CamVid val labels (360x480, ids 0..11), as uint8 and as uint16 with ids moved above 255."""
    ds = shardkit.open(camvid_val_npy)
    labs = ds.batch(np.arange(4))[1]
    return [*labs, *(labs.astype(np.uint16) * 300 + 7)]


def _matrices() -> list[np.ndarray]:
    """Drawn matrices (with and without rotation) plus edge cases of the rounding and the border."""
    mats = [np.asarray(A.parse(spec).params(i, seed=s, hw=(360, 480)).matrix)
            for spec in ("scale=0.5:2,crop=256x384,hflip,rotate=10", "scale=0.5:2,crop=256x384,hflip",
                         "scale=0.25:4,crop=256x384,rotate=180", "crop=256x384,hflip=1")
            for i in range(3) for s in (0, 1)]
    mats += [np.array(m, np.float64) for m in (
        [[1, 0, 0.5], [0, 1, -0.5]],        # every coordinate exactly on .5: floor(c + 0.5) decides
        [[1, 0, -0.5], [0, 1, 100.5]],
        [[-1, 0, 479.5], [0, 1, 0]],       # a flip whose coordinates land on .5
        [[1 / 3, 0, -1 / 3], [0, 1 / 3, -1 / 3]],  # inexact scale (upscaling x3, pixel-centre aligned)
        [[3, 0, 1], [0, 3, 1]],            # downscaling: most of the output maps outside
        [[1, 0, -200], [0, 1, -150]],      # a window hanging over the top-left corner
        [[1, 0, 5000], [0, 1, 5000]],      # entirely outside: all ignore
        [[0, -1, 383], [1, 0, 0]],         # exact 90 degrees: the rotated path with integer coordinates
        [[0.5, 0.5, -0.25], [-0.5, 0.5, 200.25]],  # 45-degree-ish shear with .25 offsets
        [[1, 1e-17, 0.5], [-1e-17, 1, 0.5]],  # almost separable: rotated path, coordinates a hair from .5
    )]
    return mats


MATRICES = _matrices()


def _rule(label: np.ndarray, m: np.ndarray) -> np.ndarray:
    return geometry.gather_labels_exact(label[None], m[None], OUT_HW, IGNORE)[0]


def test_matrices_cover_both_paths() -> None:
    separable = [m[0, 1] == 0 and m[1, 0] == 0 for m in MATRICES]
    assert sum(separable) >= 8 and len(separable) - sum(separable) >= 8


@pytest.mark.parametrize("numba", [True, False], ids=["numba", "numpy"])
def test_warp_labels_equals_the_float64_rule(labels: list[np.ndarray], numba: bool,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    if numba:
        pytest.importorskip("numba")
        assert geometry.kernel_name() == "numba"
    else:
        monkeypatch.setenv("SHARDKIT_NO_NUMBA", "1")
        assert geometry.kernel_name() == "numpy"
    some_outside = False
    for lab in labels:
        for m in MATRICES:
            want = _rule(lab, m)
            got = geometry.warp_labels(lab, m, OUT_HW, IGNORE)
            assert got.dtype == lab.dtype and np.array_equal(got, want), (lab.dtype, m.tolist())
            some_outside |= bool((want == IGNORE).any()) and bool((want != IGNORE).any())
    assert some_outside


def test_each_fast_path_alone_equals_the_rule(labels: list[np.ndarray]) -> None:
    """The separable gather on separable matrices, both compiled loops and the blocked rule on all."""
    pytest.importorskip("numba")
    loops = geometry._gather_kernels()
    assert loops is not None and len(loops) == 2  # the int64 loop and its vectorised int32 form
    for lab in labels:
        fill = lab.dtype.type(IGNORE)
        for m in MATRICES:
            want = _rule(lab, m)
            out = np.empty(OUT_HW, lab.dtype)
            for loop in loops:
                out[...] = 0
                loop(lab, m, out, fill)
                assert np.array_equal(out, want), m.tolist()
            blocked = geometry.gather_labels_exact(lab[None], m[None], OUT_HW, IGNORE, block_rows=7)[0]
            assert np.array_equal(blocked, want), m.tolist()
            if m[0, 1] == 0 and m[1, 0] == 0:
                out[...] = 0
                geometry._gather_separable(lab, m, out, fill)
                assert np.array_equal(out, want), m.tolist()


def test_the_rule_is_the_independent_one(labels: list[np.ndarray]) -> None:
    """The float64 rule itself against a per-pixel Python evaluation of round(M @ [x, y, 1]) (a few rows)."""
    lab = labels[5]
    h, w = lab.shape
    for m in MATRICES[::3]:
        want = _rule(lab, m)
        for y in (0, 1, 100, OUT_HW[0] - 1):
            for x in range(0, OUT_HW[1], 7):
                sx = int(np.floor(((m[0, 0] * x + m[0, 1] * y) + m[0, 2]) + 0.5))
                sy = int(np.floor(((m[1, 0] * x + m[1, 1] * y) + m[1, 2]) + 0.5))
                expect = lab[sy, sx] if 0 <= sx < w and 0 <= sy < h else IGNORE
                assert want[y, x] == expect


def test_batched_views_and_strided_outputs(labels: list[np.ndarray]) -> None:
    """Stacked labels, a non-contiguous source and a non-contiguous output give the same labels."""
    stack = np.stack(labels[:4])
    mats = np.stack(MATRICES[:4])
    want = geometry.gather_labels_exact(stack, mats, OUT_HW, IGNORE)
    assert np.array_equal(geometry.warp_labels_batch(stack, mats, OUT_HW, IGNORE), want)
    wide = np.zeros((2, OUT_HW[0], OUT_HW[1] * 2), np.uint8)
    src = np.ascontiguousarray(np.repeat(labels[0], 2, axis=1))[:, ::2]  # strided view of the same values
    assert not src.flags.c_contiguous
    for m in MATRICES[:2]:
        out = wide[0, :, ::2]
        geometry.warp_labels(src, m, OUT_HW, IGNORE, out=out)
        assert np.array_equal(out, _rule(labels[0], m))


def test_ignore_index_that_does_not_fit_the_dtype_is_refused(labels: list[np.ndarray]) -> None:
    with pytest.raises(OverflowError):
        geometry.warp_labels(labels[0], MATRICES[0], OUT_HW, 300)



def test_npy_samples_augment_from_their_memory_maps(camvid_val_npy: Path) -> None:
    """augmented_batch warps npy samples from their memory-mapped views: the same batch as from a stacked read."""
    ds = shardkit.open(camvid_val_npy)
    assert ds.format == "npy"
    aug = A.parse("scale=0.5:2,crop=256x384,hflip,rotate=10,jitter=0.2")
    want = aug(*ds.batch([0, 1, 2]), [0, 1, 2], seed=4, ignore_index=IGNORE)
    got = ds.augmented_batch([0, 1, 2], aug, seed=4, epoch=0)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_compiled_loops_equal_the_rule_under_random_matrices(labels: list[np.ndarray]) -> None:
    """Random rotations, scales, shears and offsets (many coordinates near the source border and on .5 steps),
    into odd output sizes: the vectorised int32 loop and the int64 loop both give the rule's labels."""
    pytest.importorskip("numba")
    loops = geometry._gather_kernels()
    assert loops is not None
    rng = np.random.default_rng(30)
    lab = labels[6][:97, :131]  # an odd-sized window (uint16 ids above 255), as a strided view made contiguous
    src = np.ascontiguousarray(lab)
    for _ in range(120):
        a, s = rng.uniform(-np.pi, np.pi), rng.uniform(0.2, 3.0)
        m = np.array([[s * np.cos(a), -s * np.sin(a) + rng.normal(0, 0.1), rng.uniform(-150, 250)],
                      [s * np.sin(a), s * np.cos(a), rng.uniform(-150, 250)]])
        if rng.random() < 0.3:  # offsets on .5 steps: coordinates land exactly where floor(c + 0.5) decides
            m[:, 2] = np.round(m[:, 2] * 2) / 2
        hw = (int(rng.integers(1, 70)), int(rng.integers(1, 90)))
        want = geometry.gather_labels_exact(src[None], m[None], hw, IGNORE)[0]
        for loop in loops:
            out = np.zeros(hw, src.dtype)
            loop(src, m, out, src.dtype.type(IGNORE))
            assert np.array_equal(out, want), m.tolist()


def _band_images(labels: list[np.ndarray]) -> list[np.ndarray]:
    """Real CamVid label rows made into 5-band uint16 / int16 (negative values) / float32 (NaN and values past 1)
    images, and rasterio's real 4-band uint16 GeoTIFF (RGBA.uint16.tif, Landsat reflectance)."""
    tifffile = pytest.importorskip("tifffile")
    base = np.stack([labels[0].astype(np.int64) * 5000 + k * 37 for k in range(5)], -1)
    u16 = np.clip(base, 0, 65535).astype(np.uint16)
    i16 = (base - 30000).clip(-32768, 32767).astype(np.int16)
    f32 = (base / 40000.0).astype(np.float32)
    f32[10:14, 20:30, 1] = np.nan
    geo = tifffile.imread(Path(__file__).parents[1] / "data" / "geotiff" / "RGBA.uint16.tif")
    return [u16, i16, f32, np.ascontiguousarray(geo[:360, :480])]


def test_the_numpy_backend_warp_is_the_numpy_rule(labels: list[np.ndarray]) -> None:
    """uint16, int16 (negative values) and float32 (NaN, values past 1) images of 5 bands, a real 4-band GeoTIFF and
    a non-contiguous view, warped by OpenCV (cpu.warp_bands) under every matrix, equal the rule restated in numpy:
    integers within one level and all but a few in 10^5 values equal (none, measured), float32 within one float32
    rounding (NaN where the rule has NaN), the zero outside, int16 through its shift."""
    from shardkit.augment import cpu

    images = _band_images(labels)
    differ = total = 0
    for src in [*images, images[2][:, ::-1]]:
        for m in MATRICES[:24:3] + MATRICES[24:]:  # some drawn matrices, every hand-made edge case
            want = geometry.warp_rule_numpy(src, m, OUT_HW, np.empty((*OUT_HW, src.shape[2]), src.dtype))
            got = np.empty((*OUT_HW, src.shape[2]), src.dtype)
            cpu.warp_bands(src, m, OUT_HW, got)
            if src.dtype == np.float32:
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
                np.testing.assert_allclose(got, want, rtol=2.0 ** -23, atol=2.0 ** -23 * np.nanmax(np.abs(want)))
            else:
                assert np.abs(got.astype(np.int64) - want).max() <= 1, (src.dtype, m)
                differ += int(np.count_nonzero(got != want))
                total += got.size
    assert differ <= total * 1e-5, differ


def test_the_rule_keeps_dtype_ranges_and_the_zero_outside() -> None:
    """Extremes: uint16 65535 and int16 -32768/32767 stay in range, and a window entirely outside reads 0 (int16's
    shifted border shifts back to 0, not to -32768)."""
    from shardkit.augment import cpu

    for dt, values in (("uint16", (0, 65535)), ("int16", (-32768, 32767))):
        src = np.tile(np.array(values, dt), (40, 30)).reshape(40, 60, 1)
        for m in (np.array([[0.7, 0.2, 3.3], [-0.2, 0.7, 1.1]]), np.array([[1.0, 0, 5000], [0, 1.0, 5000]])):
            want = geometry.warp_rule_numpy(src, m, (32, 48), np.empty((32, 48, 1), dt))
            got = np.empty((32, 48, 1), dt)
            cpu.warp_bands(src, m, (32, 48), got)
            assert np.abs(got.astype(np.int64) - want).max() <= 1
            assert want.min() >= values[0] and want.max() <= values[1]
        assert not want.any()  # the last matrix maps everything outside: 0, the zero outside


# ---------------------------------------------------------------- crop, pad, flip: a slice copy with the warp's bytes
SHIFT_SPECS = ("crop=256x384", "crop=256x384,hflip", "crop=400x520,hflip", "hflip=1", "crop=360x480",
               "crop=100x700,hflip")  # crop, crop+flip, pad+crop (+flip), flip alone, identity, pad one side


def _shift_images(camvid_val_npy: Path, labels: list[np.ndarray]) -> list[np.ndarray]:
    """Real CamVid RGB uint8 images, one band of them, and the uint16 / int16 5-band images and real 4-band GeoTIFF
    of :func:`_band_images` (float32 keeps the warp: see test_float32_images_keep_the_warp)."""
    rgb = shardkit.open(camvid_val_npy).batch(np.arange(2))[0]
    return [rgb[0], rgb[1], np.ascontiguousarray(rgb[0][:, :, 1:2]),
            *[im for im in _band_images(labels) if im.dtype != np.float32]]


def test_integer_shift_takes_exactly_crops_pads_and_flips() -> None:
    """Only matrices of ±1 and integer offsets are shifts; a scale of 1 + 1e-16, a rotation of 1e-17, a half-pixel
    offset or an offset past float32's exact integers keep the warp."""
    assert geometry.integer_shift(np.array([[1.0, 0, 7], [0, 1, -3]])) == ((1, 7), (1, -3))
    assert geometry.integer_shift(np.array([[-1.0, 0, 479], [0, -1, 359]])) == ((-1, 479), (-1, 359))
    for m in ([[1 + 2**-52, 0, 0], [0, 1, 0]], [[1, 1e-17, 0], [0, 1, 0]], [[1, 0, 0.5], [0, 1, 0]],
              [[1, 0, 0], [0, 1, 2.0**23]], [[2, 0, 0], [0, 1, 0]], [[0, -1, 383], [1, 0, 0]]):
        assert geometry.integer_shift(np.array(m, np.float64)) is None, m
    drawn = [geometry.integer_shift(np.asarray(A.parse(spec).params(i, seed=s, hw=(360, 480)).matrix))
             for spec in SHIFT_SPECS for i in range(4) for s in range(3)]
    assert None not in drawn and any(sx < 0 for (sx, _), _ in drawn)


def test_shift_copies_equal_the_warps_on_random_shifts(camvid_val_npy: Path, labels: list[np.ndarray]) -> None:
    """Random integer offsets (inside, hanging over every side, entirely outside) with and without left-right and
    top-bottom mirroring: copy_shifted (with cv2.flip, and numpy's reversed slices) gives the bytes of OpenCV's warp
    (the RGBA path for RGB uint8, warp_bands otherwise), of the numpy image rule, and of the float64 label rule."""
    from shardkit.augment import cpu

    rng = np.random.default_rng(42)
    images = _shift_images(camvid_val_npy, labels)
    for trial in range(60):
        sx, sy = rng.choice([1, -1], 2)
        hw = (int(rng.integers(1, 500)), int(rng.integers(1, 600)))
        tx, ty = (int(rng.integers(-700, 1200)) for _ in range(2))
        m = np.array([[sx, 0, tx], [0, sy, ty]], np.float64)
        shift = geometry.integer_shift(m)
        assert shift is not None
        for src in images[trial % 2:: 2] if trial % 3 else images:
            for flip in (cpu.flip_copy, None):
                got = geometry.copy_shifted(src, shift, np.full((*hw, src.shape[2]), 77, src.dtype), 0, flip)
                if src.shape[2] == 3 and src.dtype == np.uint8:
                    warped = cpu._warp(src, m, hw)
                else:
                    warped = np.empty((*hw, src.shape[2]), src.dtype)
                    cpu.warp_bands(src, m, hw, warped)
                assert got.tobytes() == warped.tobytes(), (m, hw, src.dtype, src.shape)
            rule = geometry.warp_rule_numpy(src, m, hw, np.empty((*hw, src.shape[2]), src.dtype))
            assert got.tobytes() == rule.tobytes()
        for lab in labels[:: 4]:
            want = geometry.gather_labels_exact(lab[None], m[None], hw, IGNORE)[0]
            assert geometry.copy_shifted(lab, shift, np.full(hw, 99, lab.dtype), IGNORE).tobytes() == want.tobytes()
            assert geometry.warp_labels(lab, m, hw, IGNORE).tobytes() == want.tobytes()


@pytest.mark.parametrize("spec", SHIFT_SPECS)
def test_drawn_crops_pads_and_flips_take_the_fast_path_with_the_warps_bytes(
        camvid_val_npy: Path, labels: list[np.ndarray], spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The numpy backend's batches for many seeds, through the fast path (a slice copy per sample: no warp runs) and
    with it switched off (every sample warped), are the same bytes: images of every integer dtype and band count,
    labels (ignore index in the padding), with a colour jitter after the copy."""
    from shardkit.augment import cpu

    aug = A.parse(spec + ",jitter=0.2")
    ds = shardkit.open(camvid_val_npy)
    rgb, labs = ds.batch(np.arange(8))
    batches = [rgb, *[np.stack([im] * 8) for im in _shift_images(camvid_val_npy, labels)[2:]]]
    warps: list[str] = []
    for name in ("_warp", "warp_bands"):  # count the warps that run
        real = getattr(cpu, name)
        monkeypatch.setattr(cpu, name, lambda *a, _real=real, _name=name, **k: warps.append(_name) or _real(*a, **k))
    for seed in range(12):
        for images in batches:
            kw = {"seed": seed, "epoch": seed // 3, "ignore_index": IGNORE}
            warps.clear()
            fast = cpu.apply_batch(aug, images, labs, np.arange(8), **kw)
            assert not warps  # no sample was warped
            warps.append("fast")
            with monkeypatch.context() as off:
                off.setattr(cpu, "integer_shift", lambda m: None)
                off.setattr(geometry, "integer_shift", lambda m: None)
                slow = cpu.apply_batch(aug, images, labs, np.arange(8), **kw)
            assert len(warps) > 1  # ...and with the fast path off, they were
            assert fast[0].dtype == slow[0].dtype and fast[0].tobytes() == slow[0].tobytes(), (seed, images.dtype)
            assert fast[1].tobytes() == slow[1].tobytes()
            if "400x520" in spec:
                assert (fast[1][:, 360:] == IGNORE).all()  # the padding (its image bytes: jittered zeros)


def test_float32_images_keep_the_warp(labels: list[np.ndarray]) -> None:
    """float32 images are warped even under a crop: the warp's blend makes -0.0 into 0.0 and a NaN's neighbours
    NaN, which a copy would not."""
    from shardkit.augment import cpu

    f32 = next(im for im in _band_images(labels) if im.dtype == np.float32).copy()
    f32[0, 0] = -0.0
    aug = A.parse("crop=300x400")
    got, _ = cpu.apply_batch(aug, f32[None], labels[0][None], [0], seed=0, epoch=0, ignore_index=IGNORE)
    m = np.asarray(aug.params(0, seed=0, hw=(360, 480)).matrix)
    want = np.empty((300, 400, 5), np.float32)
    cpu.warp_bands(f32, m, (300, 400), want)
    assert got[0].tobytes() == want.tobytes()
