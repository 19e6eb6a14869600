"""The look hash of uint8 images, whose row blocks OpenCV sums, is the one the int64 rule gives (the same pixels as
uint16 take numpy's path): on a real CamVid image, crops of it, and random images of every band count and of fewer
rows or columns than blocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardkit.images.imageio import decode_image
from shardkit.images.looks import look_hash


def test_uint8_block_sums_by_opencv_give_the_int64_rules_hash(camvid_root: Path) -> None:
    real = decode_image(sorted((camvid_root / "train").glob("*.png"))[0])
    rng = np.random.default_rng(9)
    images = [real, real[5:300, 11:477], real[::-1, ::3], real[:, :, 1], real[:5, :7], real[:1, :1],
              *(rng.integers(0, 256, (h, w, c), dtype=np.uint8) for h, w, c in
                ((3, 4, 1), (9, 20, 4), (100, 1, 3), (17, 8, 2), (8, 9, 3), (1000, 13, 3)))]
    hashes = set()
    for image in images:
        got = look_hash(image)
        assert got == look_hash(image.astype(np.uint16))
        hashes.add(got)
    assert len(hashes) > len(images) // 2  # the hashes tell images apart
