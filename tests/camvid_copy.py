"""A small SegNet-layout copy of the shared CamVid val pairs, for tests that change, touch or re-convert inputs."""

from __future__ import annotations

import shutil
from pathlib import Path


def small_camvid(src: Path, dst: Path, n: int) -> Path:
    """Copy the first ``n`` val pairs of the CamVid folder ``src`` into ``dst`` (``val/`` and ``valannot/``): real
    files of their own, so their stats, inodes and contents may be changed without touching the shared data."""
    names = sorted(p.name for p in (src / "val").glob("*.png"))[:n]
    for sub in ("val", "valannot"):
        (dst / sub).mkdir(parents=True)
        for name in names:
            shutil.copyfile(src / sub / name, dst / sub / name)
    return dst
