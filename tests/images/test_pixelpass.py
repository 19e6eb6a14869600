"""One compiled pass over a uint8 image gives exactly the band histograms and look-hash block sums computed apart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardkit.images import pixelpass
from shardkit.images.imageio import decode_image
from shardkit.images.looks import look_hash
from shardkit.store.stats import Stats, channel_histograms

pytestmark = pytest.mark.skipif(pixelpass.KERNELS.get() is None, reason="numba not installed")


def _images(camvid_root: Path) -> list[np.ndarray]:
    real = decode_image(sorted((camvid_root / "train").glob("*.png"))[0])
    rng = np.random.default_rng(5)
    return [real, real[3:200, 7:333], np.ascontiguousarray(real[::-1, ::2]),
            *(rng.integers(0, 256, (h, w, c), dtype=np.uint8) for h, w, c in
              ((8, 9, 1), (9, 17, 2), (13, 10, 4), (64, 3, 3), (255, 1, 3)))]


def test_one_pass_equals_the_histograms_and_look_hash_computed_apart(camvid_root: Path) -> None:
    for image in _images(camvid_root):
        got = pixelpass.image_pass(image)
        assert got is not None
        assert np.array_equal(got.histograms, channel_histograms(image))
        assert look_hash(image, got.bands) == look_hash(image)
        apart, together = Stats(4, image.shape[2], ranges=True), Stats(4, image.shape[2], ranges=True)
        ids = np.zeros(image.shape[:2], np.uint8)
        apart.add(image, ids)
        together.add(image, ids, histograms=got.histograms)
        assert apart.to_wire() == together.to_wire()


def test_other_images_are_left_to_the_separate_paths() -> None:
    assert pixelpass.image_pass(np.zeros((7, 20, 3), np.uint8)) is None  # fewer rows than look-hash blocks
    assert pixelpass.image_pass(np.zeros((20, 20, 3), np.uint16)) is None
    assert pixelpass.image_pass(np.zeros((20, 20), np.uint8)) is None
    assert pixelpass.image_pass(np.zeros((20, 20, 5), np.uint8)) is None
