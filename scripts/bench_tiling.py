"""Tiling a large tiled TIFF: ``convert --tile`` throughput against reading the same windows with tifffile alone.

One synthetic SIZExSIZE scene (scripts/tiling_scene.py: textured RGB image and id label, 256x256 zlib TIFF
tiles, content everywhere so no tile is dropped) is tiled 512x512 with stride 384, on one core, three ways, in
one run:

- **convert**: ``shardkit convert --tile 512x512 --stride 384 --workers 1`` at the default ``--max-pixels`` (so
  the scene is read window by window), npy output: read + label check + tile + hash + write shards;
- **tifffile, per window**: for each of the same windows of the image and the label, the TIFF tiles under it
  read (``filehandle.read``) and decoded (``TiffPage.decode``) and copied into the window, no cache — the plain
  way to read windows with tifffile alone (``tifffile.imread(selection=...)`` needs zarr);
- **tifffile, whole page**: ``TiffPage.asarray()`` of image and label then every window sliced out and copied
  (the floor, at the price of holding the scene whole: not possible for the scenes --tile is for).

Throughput is tiles (windows) per second; the ratios are convert / tifffile. Each is the best of ``--repeat``.

    PYTHONPATH=$PWD python scripts/bench_tiling.py               # 6144x6144, 256 tiles
    PYTHONPATH=$PWD python scripts/bench_tiling.py --size 12288
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tifffile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiling_scene import IGNORE, IMAGES, LABELS, NUM_CLASSES, write_scene

from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
from shardkit.images.tiles import Tiling

TILE, STRIDE = "512x512", "384x384"


def windows_per_window(path: Path, windows: list[tuple[int, int, int, int]]) -> int:
    """Read every window with tifffile alone, decoding the TIFF tiles under each (no cache); returns a checksum."""
    total = 0
    with tifffile.TiffFile(path) as tf:
        page, fh = tf.pages.first, tf.filehandle
        th, tw = int(page.tilelength), int(page.tilewidth)
        across = -(-int(page.imagewidth) // tw)
        spp = int(page.samplesperpixel)
        for y, x, h, w in windows:
            out = np.empty((h, w, spp), page.dtype)
            for ty in range(y // th, (y + h - 1) // th + 1):
                for tx in range(x // tw, (x + w - 1) // tw + 1):
                    index = ty * across + tx
                    fh.seek(int(page.dataoffsets[index]))
                    seg = page.decode(fh.read(int(page.databytecounts[index])), index, jpegtables=page.jpegtables)[0]
                    seg = seg.reshape(-1, *seg.shape[-3:])[0]
                    y0, x0 = ty * th, tx * tw
                    sy, sx, ey, ex = max(y, y0), max(x, x0), min(y + h, y0 + th), min(x + w, x0 + tw)
                    out[sy - y : ey - y, sx - x : ex - x] = seg[sy - y0 : ey - y0, sx - x0 : ex - x0]
            total += int(out[0, 0, 0])
    return total


def windows_whole(path: Path, windows: list[tuple[int, int, int, int]]) -> int:
    """Decode the page whole with tifffile, then copy every window out of it; returns a checksum."""
    arr = tifffile.imread(path, maxworkers=1)
    total = 0
    for y, x, h, w in windows:
        total += int(np.ascontiguousarray(arr[y : y + h, x : x + w]).reshape(-1)[0])
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=6144)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    n = args.size
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tiling = Tiling.from_options(TILE, STRIDE)
    assert tiling is not None
    windows = tiling.windows((n, n))
    with tempfile.TemporaryDirectory(prefix="shardkit-bench-tiling-") as tmp:
        root = Path(tmp)
        image, label = write_scene(root / "src", n, n)
        best: dict[str, float] = {}

        def timed(name: str, fn: object) -> None:
            for _ in range(args.repeat):
                started = time.perf_counter()
                fn()  # type: ignore[operator]
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - started)

        def run_convert() -> None:
            out = root / "out"
            shutil.rmtree(out, ignore_errors=True)
            convert(ConvertConfig(root / "src", out, images=IMAGES, labels=LABELS, num_classes=NUM_CLASSES,
                                  ignore_index=IGNORE, tile=TILE, stride=STRIDE, workers=1, quiet=True))

        timed("convert", run_convert)
        timed("tifffile per window", lambda: (windows_per_window(image, windows), windows_per_window(label, windows)))
        timed("tifffile whole page", lambda: (windows_whole(image, windows), windows_whole(label, windows)))
    count = len(windows)
    print(f"scene {n}x{n} RGB + label, {count} tiles of {TILE} stride {STRIDE}, one core, best of {args.repeat}")
    for name, seconds in best.items():
        print(f"  {name:22s} {seconds:7.2f} s  {count / seconds:7.1f} tiles/s")
    for base in ("tifffile per window", "tifffile whole page"):
        print(f"convert / {base}: {best[base] / best['convert']:.2f}x the throughput")


if __name__ == "__main__":
    main()
