#!/usr/bin/env python
"""Build a 4-band uint16 copy of the CamVid SegNet subset for the multi-band benchmarks (#29).

Each image becomes a (H, W, 4) uint16 ``.npy``: its RGB and its gray value as a 4th band, each scaled by 257
(0..255 → 0..65535, so every 16-bit value range is used); labels are copied unchanged. The tree keeps the SegNet
layout, so ``shardkit convert`` finds it as it finds the original.

    python scripts/multiband_camvid.py ../shared/data/camvid-segnet /tmp/b4/raw
    shardkit convert /tmp/b4/raw /tmp/b4/out --format npy --size 352x480 --num-classes 12 --ignore-index 11
    python scripts/bench_read_runs.py /tmp/b4/out/train
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import cv2
import numpy as np


def four_bands(rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 RGB → (H, W, 4) uint16: R, G, B and grey, each x257 (0..255 → 0..65535)."""
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    return np.dstack([rgb, gray]).astype(np.uint16) * 257


def main(src: Path, dst: Path) -> None:
    for split in ("train", "val", "test"):
        if not (src / split).is_dir():
            continue
        (dst / split).mkdir(parents=True, exist_ok=True)
        (dst / f"{split}annot").mkdir(exist_ok=True)
        for p in sorted((src / split).glob("*.png")):
            rgb = cv2.imread(str(p), cv2.IMREAD_COLOR)[:, :, ::-1]
            np.save(dst / split / f"{p.stem}.npy", four_bands(rgb))
            shutil.copy(src / f"{split}annot" / p.name, dst / f"{split}annot" / p.name)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
