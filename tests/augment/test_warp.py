"""The numpy/OpenCV image warp (RGBA copy of the box the warp reads, 4-channel warpAffine, back to RGB)
gives exactly the pixels of one 3-channel ``cv2.warpAffine`` of the whole image, then the colour ops.

The RGBA scratch buffer is filled with noise before every warp, so a box that missed a pixel the warp
reads would show up as a difference."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import cv2
import numpy as np
import pytest

import shardkit
from shardkit import augment as A
from shardkit.augment import cpu
from tests.augment.test_geometry import MATRICES

OUT_HW = (256, 384)


def _reference(image: np.ndarray, p: A.Params) -> np.ndarray:
    """The warp as first written: one 3-channel warpAffine of the whole image, then the colour ops."""
    h, w = p.out_hw
    img = cv2.warpAffine(np.ascontiguousarray(image), np.asarray(p.matrix), (w, h),
                         flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_CONSTANT,
                         borderValue=(0, 0, 0))
    cpu.jitter_colour(img, p)  # the colour steps are shared; the LUT itself is checked against cv2.LUT below
    return img


@pytest.fixture(scope="module")
def images(camvid_val_npy: Path) -> list[np.ndarray]:
    """Three real CamVid val images at 360x480 and one upscaled to 1080x1440."""
    ims = list(shardkit.open(camvid_val_npy).batch(np.arange(3))[0])
    return [*ims, cv2.resize(ims[0], (1440, 1080), interpolation=cv2.INTER_LINEAR)]


def _noisy_scratch(image: np.ndarray, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*image.shape[:2], 4), dtype=np.uint8)


def _params(image: np.ndarray) -> list[A.Params]:
    """Drawn parameters (scale, rotation, flip, crop, colour) for this image, plus the hand-made edge-case
    matrices of the label tests (coordinates on .5, windows off the image or entirely outside, 90 and 45
    degrees, downscaling), scaled to this image's size where it is larger."""
    hw = image.shape[:2]
    drawn = [A.parse(spec).params(i, seed=s, hw=hw)
             for spec in ("scale=0.5:2,crop=256x384,hflip,rotate=10,jitter=0.2", "scale=0.25:4,crop=256x384,rotate=180",
                          "scale=0.5:2,crop=256x384,hflip,jitter=0.3:0.3:0.4:0.1", "crop=256x384,hflip=1")
             for i in range(4) for s in (0, 3)]
    k = hw[0] / 360
    made = [A.Params(matrix=np.array(m) * [[k], [k]], out_hw=OUT_HW) for m in MATRICES]
    return drawn + made


def test_warp_image_equals_one_three_channel_warp_of_the_whole_image(images: list[np.ndarray]) -> None:
    n = 0
    for image in images:
        for j, p in enumerate(_params(image)):
            want = _reference(image, p)
            got = cpu.warp_image(image, p, scratch=_noisy_scratch(image, j))
            np.testing.assert_array_equal(got, want, err_msg=f"{image.shape} {p}")
            n += int(p.colour)
    assert n > 10  # the colour ops ran on many of them too


def test_into_a_batch_slot_from_strided_and_read_only_images(images: list[np.ndarray]) -> None:
    image = images[0]
    p = dataclasses.replace(A.parse("scale=0.5:2,crop=256x384,hflip,rotate=10").params(5, hw=(360, 480)),
                            brightness=1.1, contrast=0.9)
    want = _reference(image, p)
    batch = np.zeros((3, *OUT_HW, 3), np.uint8)
    flipped_twice = image[:, ::-1][:, ::-1]  # negative strides twice: a strided view of the same pixels
    ro = image.copy()
    ro.setflags(write=False)
    for k, src in enumerate((flipped_twice, ro, np.asfortranarray(image))):
        got = cpu.warp_image(src, p, out=batch[k], scratch=_noisy_scratch(image, k))
        assert np.shares_memory(got, batch)
        np.testing.assert_array_equal(batch[k], want)


def test_source_box_holds_every_pixel_read_and_is_empty_outside() -> None:
    m = np.array([[1.0, 0, 5000], [0, 1, 5000]])
    y0, y1, x0, x1 = cpu.source_box(m, OUT_HW, (360, 480))
    assert y0 == y1 or x0 == x1
    y0, y1, x0, x1 = cpu.source_box(np.array([[2.0, 0, 10.5], [0, 0.5, 3.25]]), (100, 50), (360, 480))
    assert (y0, x0) == (1, 8)  # 3.25 and 10.5, floored, less the 2-pixel margin
    assert (y1, x1) == (min(360, int(0.5 * 99 + 3.25) + 3), min(480, int(2 * 49 + 10.5) + 3))


def test_batches_from_the_pipeline_equal_the_reference(images: list[np.ndarray]) -> None:
    aug = A.parse("scale=0.5:2,crop=256x384,hflip,rotate=10,jitter=0.2")
    ims = images[:3]
    labels = [np.zeros(im.shape[:2], np.uint8) for im in ims]
    out, _ = aug(ims, labels, [4, 9, 2], seed=1, epoch=2, ignore_index=11)
    for k, (i, im) in enumerate(zip((4, 9, 2), ims, strict=True)):
        np.testing.assert_array_equal(out[k], _reference(im, aug.params(i, seed=1, epoch=2, hw=im.shape[:2])))


@pytest.mark.parametrize("numba", [True, False], ids=["numba", "cv2"])
def test_apply_lut_is_cv2_lut(numba: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if numba:
        pytest.importorskip("numba")
        assert cpu.KERNELS.name() == "numba"
    else:
        monkeypatch.setenv("SHARDKIT_NO_NUMBA", "1")
    rng = np.random.default_rng(3)
    lut = rng.integers(0, 256, 256, dtype=np.uint8)
    for shape in ((352, 480, 3), (7, 5, 3), (1, 1, 3), (3, 3)):  # even and odd byte counts
        image = rng.integers(0, 256, shape, dtype=np.uint8)
        want = cv2.LUT(image, lut)
        got = image.copy()
        cpu.apply_lut(got, lut)
        np.testing.assert_array_equal(got, want)
    image = rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)
    view = image[::2, 1:-1]  # not contiguous: cv2.LUT, written back in place
    want = cv2.LUT(np.ascontiguousarray(view), lut)
    cpu.apply_lut(view, lut)
    np.testing.assert_array_equal(image[::2, 1:-1], want)


def test_warp_image_without_numba_is_the_same(images: list[np.ndarray], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDKIT_NO_NUMBA", "1")
    for j, p in enumerate(_params(images[0])[:8]):
        np.testing.assert_array_equal(cpu.warp_image(images[0], p, scratch=_noisy_scratch(images[0], j)),
                                      _reference(images[0], p))


def test_batch_luts_equal_the_per_sample_formula() -> None:
    aug = A.parse("jitter=0.9:0.9")
    params = [*aug.params_batch(range(200), seed=4, hws=[(8, 8)] * 200),
              A.Params(matrix=np.eye(2, 3), out_hw=(8, 8), brightness=1.0, contrast=1.0),
              A.Params(matrix=np.eye(2, 3), out_hw=(8, 8), brightness=0.5, contrast=1.5)]
    got = cpu.colour_luts(params)
    for p, row in zip(params, got, strict=True):
        v = np.arange(256, dtype=np.float64) * p.brightness
        np.testing.assert_array_equal(row, np.clip(np.rint((v - 128.0) * p.contrast + 128.0), 0, 255).astype(np.uint8))


def _exact_bilinear(image: np.ndarray, m: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """Bilinear in float64 at the source coordinate ``m @ [x, y, 1]`` of every output pixel; 0 outside."""
    ys, xs = np.mgrid[0 : hw[0], 0 : hw[1]].astype(np.float64)
    sx, sy = m[0, 0] * xs + m[0, 1] * ys + m[0, 2], m[1, 0] * xs + m[1, 1] * ys + m[1, 2]
    x0, y0 = np.floor(sx).astype(np.int64), np.floor(sy).astype(np.int64)
    fx, fy = (sx - x0)[..., None], (sy - y0)[..., None]
    h, w = image.shape[:2]

    def at(y: np.ndarray, x: np.ndarray) -> np.ndarray:
        inside = (y >= 0) & (y < h) & (x >= 0) & (x < w)
        return np.where(inside[..., None], image[y.clip(0, h - 1), x.clip(0, w - 1)].astype(np.float64), 0.0)

    return (at(y0, x0) * (1 - fx) * (1 - fy) + at(y0, x0 + 1) * fx * (1 - fy)
            + at(y0 + 1, x0) * (1 - fx) * fy + at(y0 + 1, x0 + 1) * fx * fy)


def test_the_installed_opencv_warps_within_half_a_level_of_exact_bilinear(images: list[np.ndarray]) -> None:
    """What pyproject's OpenCV >= 5 buys: warpAffine in float32 coordinates, so the CPU path's images agree with
    the torch/TF paths within one level. OpenCV 4 (coordinates rounded to 1/32 pixel) is ~2.9 levels off here."""
    for p in _params(images[0])[:16]:
        m = np.asarray(p.matrix, np.float64)
        got = cv2.warpAffine(images[0], m, p.out_hw[::-1], flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                             borderMode=cv2.BORDER_CONSTANT)
        # 0.5 of rounding plus float32 coordinates and weights (~0.001 here); OpenCV 4: ~2.9
        assert np.abs(got - _exact_bilinear(images[0], m, p.out_hw)).max() <= 0.55


@pytest.mark.parametrize(("version", "warns"), [("5.0.0", False), ("5.1.2-dev", False), ("4.12.0", True),
                                                ("4.8.1", True), ("custom", True)])
def test_an_opencv_older_than_5_is_named_in_a_warning(version: str, warns: bool) -> None:
    msg = cpu.opencv_mismatch(version)
    assert (msg is not None) == warns
    if msg is not None:
        assert version in msg and "labels are unaffected" in msg and "opencv-python-headless>=5" in msg
