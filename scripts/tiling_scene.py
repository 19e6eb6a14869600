"""A synthetic large scene as two tiled TIFFs (image and id label), written TIFF tile by TIFF tile.

Used by ``scripts/tiling_memory.py`` and ``scripts/bench_tiling.py`` (and the tiling tests through them): a
30000x30000 scene never exists in memory, only one 256x256 tile of it at a time. Inside ``block`` the image is
a textured picture and the label ids 0..4 in 64-pixel squares; outside it the image is 0 and the label the
ignore index 255 (so such tiles compress to almost nothing and ``--drop-tiles-ignored`` drops them).

    write_scene(folder, 30000, 30000, block=(13000, 13000, 2000, 3000))
    # folder/img/train/scene.tif, folder/lbl/train/scene.tif; convert with
    # --images 'img/{split}/{name}.tif' --labels 'lbl/{split}/{name}.tif' --num-classes 5 --ignore-index 255
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tifffile

IGNORE = 255
NUM_CLASSES = 5
IMAGES, LABELS = "img/{split}/{name}.tif", "lbl/{split}/{name}.tif"


def picture(y: int, x: int, h: int, w: int) -> np.ndarray:
    """The scene's image content over ``[y:y+h, x:x+w]`` (h, w, 3) uint8: a smooth texture."""
    yy = (np.arange(y, y + h, dtype=np.uint32) * 7)[:, None]
    xx = (np.arange(x, x + w, dtype=np.uint32) * 3)[None, :]
    base = ((yy + xx) % 256).astype(np.uint8)
    return np.stack([base, 255 - base, (yy * 5 // 3 % 256).astype(np.uint8).repeat(w, 1)], axis=-1)


def ids(y: int, x: int, h: int, w: int) -> np.ndarray:
    """The scene's label ids over ``[y:y+h, x:x+w]`` (h, w) uint8: 0..4 in 64-pixel squares."""
    return ((np.arange(y, y + h)[:, None] // 64 + np.arange(x, x + w)[None, :] // 64) % NUM_CLASSES).astype(np.uint8)


def _tiles(height: int, width: int, tile: int, block: tuple[int, int, int, int] | None,
           label: bool, pages: int = 1) -> Iterator[np.ndarray]:
    by, bx, bh, bw = block if block is not None else (0, 0, height, width)
    for page in range(pages):  # page p: the picture + 40 p (mod 256), so the pages differ
        for y in range(0, height, tile):
            for x in range(0, width, tile):
                out = (np.full((tile, tile), IGNORE, np.uint8) if label else np.zeros((tile, tile, 3), np.uint8))
                y0, y1 = max(y, by), min(y + tile, by + bh, height)
                x0, x1 = max(x, bx), min(x + tile, bx + bw, width)
                if y0 < y1 and x0 < x1:
                    part = ids(y0, x0, y1 - y0, x1 - x0) if label else picture(y0, x0, y1 - y0, x1 - x0) + np.uint8(
                        40 * page)
                    out[y0 - y : y1 - y, x0 - x : x1 - x] = part
                yield out


def write_scene(folder: Path, height: int, width: int, *, block: tuple[int, int, int, int] | None = None,
                tile: int = 256, name: str = "scene", split: str = "train", pages: int = 1) -> tuple[Path, Path]:
    """Write the scene's image and label; returns their paths. ``block``: (y, x, h, w) of the content (None:
    everywhere); ``pages``: the image as that many RGB pages (convert it with --pages-as-bands)."""
    paths = []
    for label in (False, True):
        path = Path(folder) / (LABELS if label else IMAGES).format(split=split, name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        n = 1 if label else pages
        shape = (height, width) if label else (n, height, width, 3) if n > 1 else (height, width, 3)
        tifffile.imwrite(path, _tiles(height, width, tile, block, label, n), shape=shape, dtype=np.uint8,
                         tile=(tile, tile), compression="zlib", photometric="minisblack" if label else "rgb",
                         bigtiff=height * width * 3 * n >= 2**32 - 2**25)
        paths.append(path)
    return paths[0], paths[1]
