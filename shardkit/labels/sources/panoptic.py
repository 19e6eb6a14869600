"""COCO panoptic: ``panoptic_<split>.json`` (``annotations[].segments_info``, ``categories``) beside the folder
``panoptic_<split>/`` of PNGs whose RGB encodes a segment id (panopticapi's ``rgb2id``: id = R + 256·G + 256²·B).

Each pixel gets the class of its segment's category; segment id 0 is VOID (panopticapi: unlabelled, ignored in
evaluation) and becomes the ignore id. Crowd segments (``iscrowd``) follow the crowd policy (default ``class``:
panopticapi's ``panoptic2semantic_segmentation`` paints them with their category). A segment id in a PNG that the
JSON's ``segments_info`` lacks is refused in one line (file, id, pixel count). Segments never overlap.

Class table: the categories in increasing id order, stored 0, 1, … (no background class: void is ignore 255).
Images are looked up as COCO does (:meth:`CocoSource._base`: the JSON's folder, the root, ``<split>/`` …).
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import LabelError
from ...images.imageio import check_pixels, decode_image
from ...support.limits import MAX_PIXELS
from ..classes import ClassInfo, ClassTable
from ..raster import Region
from .base import (
    Annotations,
    AnnotationSource,
    ObjectShapes,
    SampleShapes,
    annotation_error,
    checked_int,
    file_stamp,
    inside,
    sorted_unique,
)
from .coco import CocoSource, read_categories, read_document, read_images

IGNORE = 255
#: Largest segment id three 8-bit channels can hold.
MAX_SEGMENT = 256**3 - 1
_NAME = re.compile(r"^panoptic_(.+)\.json$", re.IGNORECASE)


def _candidates(root: Path) -> list[Path]:
    """``panoptic_*.json`` at the root or in ``annotations/`` with a PNG folder of the same stem beside it."""
    found = []
    for folder in (root, root / "annotations"):
        if folder.is_dir():
            found += [p for p in sorted(folder.iterdir()) if p.is_file() and _NAME.match(p.name)
                      and p.with_suffix("").is_dir() and any(p.with_suffix("").glob("*.png"))]
    return found


_DOCUMENT = "the panoptic JSON"


def _fail(what: Path, problem: str) -> LabelError:
    return annotation_error(what, problem, _DOCUMENT)


def _int(value: Any, what: Path, name: str, lo: int = 0, hi: int = 2**62) -> int:
    return checked_int(value, what, name, lo, hi, _DOCUMENT)


@lru_cache(maxsize=2)
def segment_ids(path: str, stamp: tuple[int, int, int, int]) -> tuple[np.ndarray, dict[int, int]]:
    """The PNG's segment-id image (panopticapi's rgb2id) and its pixel count per id; cached per file and
    :func:`~.base.file_stamp` so that one sample's segments decode it once."""
    file = Path(path)
    check_pixels(file, MAX_PIXELS, "panoptic PNG")
    rgb = decode_image(file)
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise LabelError(f"panoptic PNG is {rgb.dtype} with shape {rgb.shape}, not 8-bit RGB", path=file,
                         fix="pass the panoptic PNGs as written by panopticapi (id2rgb: 8-bit RGB)")
    c = rgb.astype(np.int32)
    ids = c[:, :, 0] + 256 * c[:, :, 1] + 256 * 256 * c[:, :, 2]
    values, counts = np.unique(ids, return_counts=True)
    return ids, dict(zip(values.tolist(), counts.tolist(), strict=True))


class CocoPanopticSource(AnnotationSource):
    name = "coco-panoptic"
    expected = "panoptic_<split>.json beside panoptic_<split>/ (PNGs, id = R + 256·G + 256²·B) + the images"
    overlap = "order"
    crowd = "class"
    overlaps = ("order",)
    void_is_ignore = True
    tool_rule = ("panopticapi rgb2id per pixel, class from its segment's category; void (id 0) = ignore; crowd "
                 "segments painted with their category (panoptic2semantic_segmentation)")

    def detect(self, root: Path) -> Path | None:
        found = _candidates(root)
        return found[0] if len(found) == 1 else root if found else None

    def read(self, root: Path, where: Path) -> Annotations:
        files = [where] if where.is_file() else _candidates(where)
        if not files:
            raise LabelError("no panoptic_<split>.json beside a panoptic_<split>/ folder of PNGs", path=where,
                             fix="pass --annotations coco-panoptic:FILE.json")
        digest = hashlib.sha256()
        splits: dict[str, tuple[tuple[Path, SampleShapes], ...]] = {}
        tables: list[tuple[ClassTable, tuple[int | str | None, ...]]] = []
        for path in files:
            doc = read_document(path, digest, "panoptic JSON", ("COCO panoptic", "COCO panoptic"),
                                ("pass the panoptic JSON with --annotations coco-panoptic:PATH",
                                 "pass the panoptic JSON (annotations with segments_info)"))
            table, original, stored = self._table(doc["categories"], path)
            tables.append((table, original))
            match = _NAME.match(path.name)
            split = match.group(1) if match else "all"
            if split in splits:
                raise LabelError(f"two panoptic files give split {split!r}", path=path,
                                 fix="pass one with --annotations coco-panoptic:PATH")
            splits[split] = self._samples(doc, path, root, split, stored, digest)
        table, original = tables[0]
        if any(t[1] != original for t in tables[1:]):
            raise LabelError("the splits' panoptic files have different categories", path=files[0].parent,
                             fix="convert each split on its own with --annotations coco-panoptic:PATH")
        origin = (f"{', '.join(p.name for p in files)} categories (ids in increasing category id order; void "
                  f"segment 0 = ignore {IGNORE})")
        return Annotations(self.name, root, tuple(files), table, original, splits, origin, digest.hexdigest())

    def _table(self, cats: list[Any], path: Path) -> tuple[ClassTable, tuple[int | str | None, ...], dict[int, int]]:
        seen = read_categories(cats, path, _DOCUMENT)
        if len(seen) >= IGNORE:
            raise _fail(path, f"{len(seen)} categories; at most {IGNORE - 1} (void is stored as {IGNORE})")
        ordered = sorted(seen)
        table = ClassTable(tuple(ClassInfo(i, seen[c]) for i, c in enumerate(ordered)), IGNORE, source=path.name)
        return table, tuple(ordered), {c: i for i, c in enumerate(ordered)}

    def _samples(self, doc: dict[str, Any], path: Path, root: Path, split: str, stored: dict[int, int],
                 digest: Any) -> tuple[tuple[Path, SampleShapes], ...]:
        images = read_images(doc["images"], path, _DOCUMENT)
        pngs = path.with_suffix("")
        first = [images[i][0] for i in sorted(images)[:1]]
        base = CocoSource()._base(root, path, split, first)
        out = []
        for a in doc["annotations"]:
            if not isinstance(a, dict) or not isinstance(a.get("segments_info"), list) \
                    or not isinstance(a.get("file_name"), str):
                raise _fail(path, "an annotations entry is not an object with file_name and segments_info")
            iid = _int(a.get("image_id"), path, "an annotation's image_id", 0)
            if iid not in images:
                raise _fail(path, f"annotation {a['file_name']!r} names image {iid}, which the images list lacks")
            name, h, w = images[iid]
            png = inside(root, pngs, a["file_name"], path)
            if not png.is_file():
                raise LabelError(f"panoptic PNG {a['file_name']!r} is missing", path=pngs,
                                 fix="add it, or leave its entry out of the panoptic JSON")
            digest.update(f"{png.name}\0{file_stamp(png, 'panoptic PNG')}\0".encode())
            segs: list[tuple[int, int, bool]] = []
            for s in a["segments_info"]:
                if not isinstance(s, dict):
                    raise _fail(path, f"{a['file_name']}: a segments_info entry is not an object")
                sid = _int(s.get("id"), path, f"{a['file_name']}: a segment id", 1, MAX_SEGMENT)
                cid = s.get("category_id")
                if isinstance(cid, bool) or not isinstance(cid, int) or cid not in stored:
                    raise LabelError(f"{a['file_name']}: segment {sid} has category id {cid!r}, which the "
                                     "categories lack", path=path,
                                     fix="add the category to 'categories' or drop the segment")
                segs.append((sid, stored[cid], bool(s.get("iscrowd", 0))))
            if len({sid for sid, _, _ in segs}) != len(segs):
                raise _fail(path, f"{a['file_name']}: a segment id appears twice in segments_info")
            objects = tuple(ObjectShapes(str(sid), cls, "segment", (str(png), sid), crowd) for sid, cls, crowd in segs)
            image = inside(root, base, name, path)
            if not image.is_file():
                raise LabelError(f"image {name!r} the panoptic file names is missing", path=path,
                                 fix="add it, or leave its entry out of the panoptic JSON")
            key = image.relative_to(Path(root).resolve()).as_posix()
            out.append((image, SampleShapes(key, h, w, objects, (str(png),))))
        return sorted_unique(out, path)

    def check(self, sample: SampleShapes, h: int, w: int) -> None:
        """The PNG is the image's size and holds no segment id that ``segments_info`` lacks."""
        png = Path(sample.files[0])
        ids, counts = _decoded(png)
        if ids.shape != (h, w):
            raise LabelError(f"panoptic PNG is {ids.shape[0]}x{ids.shape[1]} (HxW) but its image is {h}x{w}",
                             path=png, fix="pass the panoptic PNG written for this image")
        extra = sorted(set(counts) - {0} - {int(o.data[1]) for o in sample.objects})
        if extra:
            raise LabelError(f"segment id {extra[0]} ({counts[extra[0]]} pixels) is in the PNG but not in its "
                             f"segments_info ({len(extra)} such id(s))", path=png,
                             fix="add the segment to segments_info in the panoptic JSON (or re-export the PNG)")

    def region(self, obj: ObjectShapes, h: int, w: int) -> tuple[Region, bool, bool]:
        ids, counts = _decoded(Path(obj.data[0]))
        sid = int(obj.data[1])
        region = Region.of(ids == sid) if sid in counts else Region(0, 0, np.zeros((0, 0), dtype=bool))
        return region, False, False


def _decoded(png: Path) -> tuple[np.ndarray, dict[int, int]]:
    return segment_ids(str(png), file_stamp(png, "panoptic PNG"))


SOURCE = CocoPanopticSource
