"""Peak memory of reading a COCO instances file of COCO val2017's size once (the converting process's cost):
5000 images, 36,781 annotations, polygons of COCO's average length, 80 categories (~25 MB of JSON, as
instances_val2017.json), written synthetically into a temporary folder with empty image files.

    python scripts/coco_memory.py [--scale 1]
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("coco_memory")


def write(root: Path, scale: int) -> Path:
    rng = np.random.default_rng(0)
    n_images, n_anns = 5000 * scale, 36781 * scale
    (root / "val2017").mkdir(parents=True)
    (root / "annotations").mkdir()
    images: list[dict[str, Any]] = [{"id": i, "file_name": f"{i:012d}.jpg", "height": 480, "width": 640}
                                   for i in range(n_images)]
    for im in images:
        (root / "val2017" / im["file_name"]).touch()
    anns = []
    for a in range(n_anns):
        k = int(rng.integers(6, 40))
        cx, cy, r = rng.uniform(50, 590), rng.uniform(50, 430), rng.uniform(5, 60)
        t = np.sort(rng.uniform(0, 2 * np.pi, k))
        poly = np.round(np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], 1).ravel(), 2).tolist()
        anns.append({"id": a, "image_id": int(rng.integers(0, n_images)), "category_id": int(rng.integers(1, 81)),
                     "segmentation": [poly], "area": 1.0, "bbox": [0, 0, 1, 1], "iscrowd": 0})
    cats = [{"id": i, "name": f"c{i}", "supercategory": "x"} for i in range(1, 81)]
    path = root / "annotations" / "instances_val2017.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path


def measure(path: str) -> None:
    from shardkit.labels.sources.coco import CocoSource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    notes = CocoSource().read(Path(path).parent.parent, Path(path))
    took = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    n = sum(len(s) for s in notes.splits.values())
    print(json.dumps({"images": n, "seconds": round(took, 2), "peak_mb": round(peak / 1024),
                      "before_mb": round(before / 1024)}))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), args.scale)
        size = path.stat().st_size
        out = subprocess.run([sys.executable, __file__, "--measure", str(path)], check=True, capture_output=True,
                             text=True).stdout
        got = json.loads(out)
        log.info("COCO file of %.1f MB (%d images): read in %.2f s, peak RSS %d MB (%d MB before reading)",
                 size / 1e6, got["images"], got["seconds"], got["peak_mb"], got["before_mb"])


if __name__ == "__main__":
    main()
