"""Peak memory of one convert worker decoding an image (and its label) at exactly ``--max-pixels``.

Why the default ``--max-pixels`` is what it is (README, "Memory"): every kind of image and label convert
reads, at the limit, one sample, default settings (no --size, npy unless --format), ``--workers 1``. Each run
is its own process; its peak RSS (``ru_maxrss`` from ``wait4``, the largest of it and its reaped children:
TFRecord writes in a child) is printed per case, with a 64x64 run of the same case as the baseline.

    PYTHONPATH=$PWD python scripts/max_pixels_memory.py                 # at the default limit
    PYTHONPATH=$PWD python scripts/max_pixels_memory.py --pixels 268435456 --cases png8,jpeg-progressive

Needs about 2 GB of free disk in the temp folder at the default limit (noise-free pictures, so files stay small).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from shardkit.conversion.config import DEFAULT_MAX_PIXELS

COLOURS = [(0, 0, 0), (128, 64, 128), (70, 70, 70), (220, 20, 60)]


def _picture(h: int, w: int, channels: int, dtype: type = np.uint8) -> np.ndarray:
    """A smooth picture with some texture (compresses well, decodes like any other)."""
    yy = (np.arange(h, dtype=np.uint32) * 7)[:, None]
    xx = (np.arange(w, dtype=np.uint32) * 3)[None, :]
    base = ((yy + xx) % 256).astype(np.uint8)
    out = np.stack([base, base[::-1], base[:, ::-1], np.full_like(base, 255)][:channels], axis=-1)
    if dtype == np.uint16:
        return out.astype(np.uint16) * 257
    return out


def _ids(h: int, w: int) -> np.ndarray:
    return ((np.arange(h)[:, None] // 64 + np.arange(w)[None, :] // 64) % len(COLOURS)).astype(np.uint8)


def _write_image(kind: str, path: Path, h: int, w: int) -> Path:
    if kind == "png8":
        cv2.imwrite(str(path.with_suffix(".png")), _picture(h, w, 3))
        return path.with_suffix(".png")
    if kind == "png16-rgba":
        cv2.imwrite(str(path.with_suffix(".png")), _picture(h, w, 4, np.uint16))
        return path.with_suffix(".png")
    if kind == "jpeg":
        cv2.imwrite(str(path.with_suffix(".jpg")), _picture(h, w, 3), [cv2.IMWRITE_JPEG_QUALITY, 90])
        return path.with_suffix(".jpg")
    if kind == "jpeg-progressive":
        cv2.imwrite(str(path.with_suffix(".jpg")), _picture(h, w, 3), [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
        return path.with_suffix(".jpg")
    if kind == "jpeg-cmyk-progressive":
        Image.fromarray(_picture(h, w, 4), "CMYK").save(path.with_suffix(".jpg"), progressive=True)
        return path.with_suffix(".jpg")
    if kind == "tiff16-rgba":
        cv2.imwrite(str(path.with_suffix(".tiff")), _picture(h, w, 4, np.uint16))
        return path.with_suffix(".tiff")
    if kind in ("bmp", "webp"):
        params = [cv2.IMWRITE_WEBP_QUALITY, 101] if kind == "webp" else []
        cv2.imwrite(str(path.with_suffix("." + kind)), _picture(h, w, 3), params)
        return path.with_suffix("." + kind)
    if kind == "gif":  # discovery lists only .png/.jpg/.bmp/.tif/.webp names; OpenCV goes by content
        Image.fromarray(_picture(h, w, 3)).convert("P").save(path.with_suffix(".gif"))
        return path.with_suffix(".gif").rename(path.with_suffix(".png"))
    if kind == "ppm":
        cv2.imwrite(str(path.with_suffix(".ppm")), _picture(h, w, 3))
        return path.with_suffix(".ppm").rename(path.with_suffix(".png"))
    raise SystemExit(f"unknown case {kind}")


def _segnet(kind: str, root: Path, h: int, w: int) -> list[str]:
    (root / "train").mkdir(parents=True)
    (root / "trainannot").mkdir()
    image = _write_image(kind, root / "train" / "a", h, w)
    cv2.imwrite(str(root / "trainannot" / (image.stem + ".png")), _ids(h, w))
    return ["--num-classes", str(len(COLOURS))]


def _colour(root: Path, h: int, w: int) -> list[str]:
    (root / "train").mkdir(parents=True)
    (root / "train_labels").mkdir()
    (root / "class_dict.csv").write_text("name,r,g,b\n" + "".join(f"c{i},{r},{g},{b}\n"
                                                                 for i, (r, g, b) in enumerate(COLOURS)))
    cv2.imwrite(str(root / "train" / "a.png"), _picture(h, w, 3))
    rgb = np.array(COLOURS, np.uint8)[_ids(h, w)]
    cv2.imwrite(str(root / "train_labels" / "a_L.png"), rgb[:, :, ::-1])
    return ["--layout", "class_dict", "--label-suffix", "_L"]


def _palette(root: Path, h: int, w: int) -> list[str]:
    (root / "JPEGImages").mkdir(parents=True)
    (root / "SegmentationClass").mkdir()
    cv2.imwrite(str(root / "JPEGImages" / "a.jpg"), _picture(h, w, 3))
    label = Image.fromarray(_ids(h, w), "P")
    label.putpalette([c for rgb in COLOURS for c in rgb])
    label.save(root / "SegmentationClass" / "a.png")
    return []


IMAGE_KINDS = ("png8", "png16-rgba", "jpeg", "jpeg-progressive", "jpeg-cmyk-progressive", "tiff16-rgba", "bmp",
               "gif", "webp", "ppm")
CASES: dict[str, Callable[[Path, int, int], list[str]]] = {
    **{k: (lambda root, h, w, k=k: _segnet(k, root, h, w)) for k in IMAGE_KINDS},  # type: ignore[misc]
    "colour-label": _colour,
    "palette-label": _palette,
}


def peak_rss_mb(args: list[str]) -> tuple[float, int, str]:
    """Run ``python -m shardkit ARGS``; (peak RSS in MB of it and its children, exit code, last output line)."""
    proc = subprocess.Popen([sys.executable, "-m", "shardkit", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read() if proc.stdout is not None else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss / 1024, proc.returncode, (out.strip().splitlines() or [""])[-1][:160]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pixels", type=int, default=DEFAULT_MAX_PIXELS, help="image size (also --max-pixels)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ",".join(CASES))
    ap.add_argument("--format", default="npy")
    ap.add_argument("--make", nargs=4, metavar=("CASE", "ROOT", "H", "W"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.make:
        case, root, hh, ww = a.make
        print(" ".join(CASES[case](Path(root), int(hh), int(ww))))
        return
    side = math.isqrt(a.pixels)
    h, w = side, a.pixels // side  # exactly the limit when it is a square (the default is)
    print(f"{h}x{w} = {h * w} pixels, --max-pixels {a.pixels}, --format {a.format}, --workers 1")
    print(f"{'case':24} {'64x64 MB':>9} {'limit MB':>9}  result")
    for case in a.cases.split(","):
        row = []
        for hh, ww in ((64, 64), (h, w)):
            with tempfile.TemporaryDirectory(prefix="shardkit-maxpx-") as tmp:
                # built in another process: a child's peak RSS starts at this process's peak when it execs
                made = subprocess.run([sys.executable, __file__, "--make", case, str(Path(tmp) / "in"), str(hh),
                                       str(ww)], check=True, capture_output=True, text=True)
                extra = made.stdout.split()
                mb, rc, last = peak_rss_mb(["convert", str(Path(tmp) / "in"), str(Path(tmp) / "out"), "-q",
                                            "--workers", "1", "--format", a.format, "--max-pixels",
                                            str(a.pixels), *extra])
                row.append((mb, rc, last))
        (base, _, _), (peak, rc, last) = row
        print(f"{case:24} {base:9.0f} {peak:9.0f}  {'ok' if rc == 0 else f'exit {rc}: {last}'}", flush=True)


if __name__ == "__main__":
    main()
