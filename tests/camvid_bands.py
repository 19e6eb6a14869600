"""Multi-band uint8 copies of real CamVid val pairs, for the codecs that store 2 and 4 bands (jpeg's band frame).

4 bands: R, G, B and gray (as ``scripts/multiband_camvid.py`` builds them, but uint8); 2 bands: R and gray. Images
are ``.npy`` arrays in the SegNet layout (``val/`` + ``valannot/``), labels the real annotation PNGs copied."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np


def band_stack(rgb: np.ndarray, bands: int) -> np.ndarray:
    """(H, W, 3) uint8 RGB → (H, W, ``bands``) uint8: 4 is R, G, B, gray; 2 is R, gray; 1 and 3 gray and RGB."""
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    return {1: gray[:, :, None], 2: np.dstack([rgb[:, :, 0], gray]), 3: rgb,
            4: np.dstack([rgb, gray])}[bands].copy()


def camvid_bands(src: Path, dst: Path, bands: int, n: int, dtype: type = np.uint8) -> dict[str, np.ndarray]:
    """Write the first ``n`` CamVid val pairs of ``src`` as ``bands``-band ``.npy`` images into ``dst`` (uint8, or
    uint16 over its whole range: each level x257, as ``scripts/multiband_camvid.py``); returns each image by its
    stem."""
    images = {}
    (dst / "val").mkdir(parents=True)
    (dst / "valannot").mkdir()
    for p in sorted((src / "val").glob("*.png"))[:n]:
        image = band_stack(cv2.imread(str(p), cv2.IMREAD_COLOR)[:, :, ::-1], bands)
        if dtype == np.uint16:
            image = image.astype(np.uint16) * 257
        np.save(dst / "val" / f"{p.stem}.npy", image)
        shutil.copyfile(src / "valannot" / p.name, dst / "valannot" / p.name)
        images[p.stem] = image
    return images
