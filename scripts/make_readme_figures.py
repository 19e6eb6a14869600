#!/usr/bin/env python
"""README's pictures, drawn by ``shardkit show`` from real CamVid, so they stay true when the code changes.

Converts CamVid's val split (the SegNet subset in ``../shared/data/camvid-segnet``) to npy at 270x360 in a
temporary folder, then runs the two ``show`` commands README describes, as a user would::

    shardkit show out/val --index 5 -o docs/img/camvid-sample.png
    shardkit show out/val --index 5 --augment "scale=0.75:1.5,crop=270x360,hflip,rotate=10,jitter=0.3" \\
        --draws 2 -o docs/img/camvid-augmented.png

Each picture is then reduced to 256 colours (Pillow, Floyd-Steinberg dithering) so that it stays small in git
(~130 KB and ~190 KB instead of 0.4 and 0.6 MB); its pixels are otherwise the ones ``show`` drew. Run::

    python scripts/make_readme_figures.py [--data ../shared/data/camvid-segnet] [--out docs/img]
"""

from __future__ import annotations

import argparse
import io
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "camvid-segnet"
SIZE = "270x360"  # CamVid's 360x480 at 3/4: show draws panels from 360 px wide without enlarging them
INDEX = 5  # val/0016E5_07999.png: cyclists, a car, signs — 12 classes in one frame
AUGMENT = "scale=0.75:1.5,crop=270x360,hflip,rotate=10,jitter=0.3"

log = logging.getLogger("make_readme_figures")


def shardkit(*args: object) -> None:
    """Run ``shardkit ARGS`` in a fresh interpreter, as the command line would."""
    subprocess.run([sys.executable, "-m", "shardkit", *map(str, args)], check=True, cwd=ROOT)


def small_png(path: Path) -> int:
    """Rewrite the PNG at ``path`` with a 256-colour palette; returns its new size in bytes."""
    from PIL import Image

    with Image.open(path) as im:
        quantized = im.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT,
                                               dither=Image.Dither.FLOYDSTEINBERG)
    buf = io.BytesIO()
    quantized.save(buf, "PNG", optimize=True)
    path.write_bytes(buf.getvalue())
    return len(buf.getvalue())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="CamVid in the SegNet layout")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where the PNGs go")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="readme-figures-") as tmp:
        shardkit("convert", args.data.resolve(), Path(tmp) / "out", "--format", "npy", "--size", SIZE,
                 "--split", "val", "--quiet")
        split = Path(tmp) / "out" / "val"
        sample, augmented = args.out / "camvid-sample.png", args.out / "camvid-augmented.png"
        shardkit("show", split, "--index", INDEX, "-o", sample.resolve())
        shardkit("show", split, "--index", INDEX, "--augment", AUGMENT, "--draws", 2, "-o", augmented.resolve())
    for path in (sample, augmented):
        log.info("%s: %d KB", path, small_png(path) // 1024)
    return 0


if __name__ == "__main__":
    sys.exit(main())
