"""Rasterisation throughput: shardkit's COCO rasteriser against pycocotools' own per-image annToMask loop, on
the same real annotations, side by side in one run (same process, same objects, results checked equal).

    python scripts/bench_raster.py [--repeat 5]

Uses tests/data/coco-labelme (labelme's COCO example: real polygons) and tests/data/coco-results (cocoapi's
val2014 segmentation results: 734 real compressed-RLE masks over 100 images). Needs pycocotools.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from shardkit.labels.classes import ClassInfo, ClassTable
from shardkit.labels.raster import KERNELS
from shardkit.labels.sources.base import ObjectShapes, Policies, SampleShapes, rasterise
from shardkit.labels.sources.coco import CocoSource

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
log = logging.getLogger("bench_raster")


def images_of(doc: Any) -> dict[int, list[dict[str, Any]]]:
    by_image: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for a in doc if isinstance(doc, list) else doc["annotations"]:
        by_image[a["image_id"]].append(a)
    return by_image


def size_of(anns: list[dict[str, Any]], sizes: dict[int, tuple[int, int]]) -> tuple[int, int]:
    seg = anns[0]["segmentation"]
    if isinstance(seg, dict):
        return int(seg["size"][0]), int(seg["size"][1])
    return sizes[anns[0]["image_id"]]


def pycocotools_loop(by_image: dict[int, list[dict[str, Any]]], sizes: dict[int, tuple[int, int]]) -> list[np.ndarray]:
    """What a pycocotools user writes: annToMask per object, painted in file order."""
    import pycocotools.mask as mask_api  # type: ignore[import-untyped]

    out = []
    for anns in by_image.values():
        h, w = size_of(anns, sizes)
        ids = np.zeros((h, w), dtype=np.uint8)
        for a in anns:
            seg = a["segmentation"]
            rle = mask_api.merge(mask_api.frPyObjects(seg, h, w)) if isinstance(seg, list) else (
                mask_api.frPyObjects(seg, h, w) if isinstance(seg["counts"], list) else seg)
            ids[mask_api.decode(rle) > 0] = a["category_id"]
        out.append(ids)
    return out


def shardkit_samples(by_image: dict[int, list[dict[str, Any]]], sizes: dict[int, tuple[int, int]]
                     ) -> list[SampleShapes]:
    """The same objects as the COCO source hands a worker (parsed and validated once, outside the timing)."""
    from shardkit.labels.raster import rle_string_counts

    samples = []
    for iid, anns in by_image.items():
        h, w = size_of(anns, sizes)
        objs = []
        for a in anns:
            seg = a["segmentation"]
            if isinstance(seg, list):
                objs.append(ObjectShapes(str(a.get("id")), a["category_id"], "polygons",
                                         tuple(np.asarray(p, np.float64) for p in seg)))
            else:
                counts = rle_string_counts(seg["counts"]) if isinstance(seg["counts"], str) else np.asarray(
                    seg["counts"], np.int64)
                objs.append(ObjectShapes(str(a.get("id")), a["category_id"], "rle", (counts,)))
        samples.append(SampleShapes(str(iid), h, w, tuple(objs)))
    return samples


def bench(name: str, doc: Any, sizes: dict[int, tuple[int, int]], repeat: int) -> float:
    by_image = images_of(doc)
    table = ClassTable(tuple(ClassInfo(i, f"c{i}") for i in range(100)), 255)
    samples = shardkit_samples(by_image, sizes)
    source, policies = CocoSource(), Policies("order", "class")
    ref = pycocotools_loop(by_image, sizes)
    got = [rasterise(source, s, s.height, s.width, table, policies)[0] for s in samples]
    if not all(np.array_equal(a, b) for a, b in zip(ref, got, strict=True)):
        raise SystemExit(f"{name}: results differ")
    times: dict[str, float] = {}
    def ours() -> list[Any]:
        return [rasterise(source, s, s.height, s.width, table, policies) for s in samples]

    for label, fn in (("pycocotools", lambda: pycocotools_loop(by_image, sizes)), ("shardkit", ours)):
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        times[label] = best
    n = len(samples)
    objects = sum(len(s.objects) for s in samples)
    ratio = times["pycocotools"] / times["shardkit"]
    log.info("%s: %d images, %d objects — pycocotools loop %.1f images/s, shardkit (%s polygon walk) %.1f "
             "images/s: %.2fx (equal results)", name, n, objects, n / times["pycocotools"], KERNELS.name(),
             n / times["shardkit"], ratio)
    return ratio


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # pycocotools under numpy 2
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    poly = json.loads((DATA / "coco-labelme" / "annotations.json").read_text())
    sizes = {im["id"]: (im["height"], im["width"]) for im in poly["images"]}
    bench("polygons (labelme's COCO example)", poly, sizes, args.repeat)
    rle = json.loads((DATA / "coco-results" / "instances_val2014_fakesegm100_results.json").read_text())
    bench("compressed RLE (cocoapi val2014 results)", rle, {}, args.repeat)


if __name__ == "__main__":
    main()
