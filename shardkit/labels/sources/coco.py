"""COCO instances JSON (``images``, ``annotations``, ``categories``): polygons, uncompressed and compressed RLE,
``iscrowd``; rasterised bit-exactly as pycocotools' ``annToMask`` (:mod:`shardkit.labels.raster`).

Found as ``annotations.json``, ``instances_<split>.json``, ``_annotations.coco.json`` (Roboflow) or
``*coco*.json`` at the input root, in ``annotations/`` or in a split folder; one split per file (``instances_X``
→ X; a split folder's file → the folder; else ``all``). Images are looked up by ``file_name`` relative to the
JSON's folder, the root, ``<split>/``, ``images/<split>/`` or ``images/`` (the first that holds the first image).

Class table: the categories in increasing id order, stored 0, 1, …; stored 0 is ``background`` (pixels no
object covers) unless a category has id 0 (labelme2coco's ``_background_``), which then is stored 0 itself.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import LabelError
from ...support.limits import MAX_SIDE
from ...support.smallfile import loads_bounded
from ..classes import ClassInfo, ClassTable
from ..raster import Region, ShapeError, check_polygons, polygon_clipped, polygons_region, rle_region, rle_string_counts
from .base import (
    Annotations,
    AnnotationSource,
    ObjectShapes,
    SampleShapes,
    file_head,
    inside,
    read_file,
    sorted_unique,
)
from .base import annotation_error as _fail
from .base import checked_int as _int

#: Largest annotation file read (COCO train2017's instances JSON is 448 MB).
MAX_COCO_BYTES = 1 << 30
#: Most vertices one polygon may have.
MAX_POLYGON_POINTS = 1_000_000
IGNORE = 255
_NAMES = re.compile(r"^(annotations|instances_.+|.*_annotations\.coco|.*coco.*)\.json$", re.IGNORECASE)


def _candidates(root: Path) -> list[Path]:
    found = []
    for folder in (root, root / "annotations", *sorted(p for p in root.iterdir() if p.is_dir())):
        if folder.is_dir():
            found += [p for p in sorted(folder.iterdir()) if p.is_file() and _NAMES.match(p.name)]
    return list(dict.fromkeys(found))


def _looks_like_coco(path: Path) -> bool:
    """Whether the file's first 64 KiB name COCO's ``images`` list (read without parsing the whole file)."""
    head = file_head(path)
    return b'"images"' in head and (b'"annotations"' in head or b'"categories"' in head or len(head) == 1 << 16)


def _split_name(path: Path, root: Path) -> str:
    stem = path.stem
    if stem.lower().startswith("instances_"):
        return stem[len("instances_"):]
    if path.parent != root and path.parent.name.lower() != "annotations":
        return path.parent.name
    return "all"


def read_document(path: Path, digest: Any, what: str, names: tuple[str, str], fixes: tuple[str, str]
                  ) -> dict[str, Any]:
    """A COCO-shaped JSON file (instances or panoptic) read once, bounded: its bytes' sha256 into ``digest``, the
    document parsed with its nesting bounded, and the ``images``, ``annotations`` and ``categories`` lists required.
    ``names``: the kind of file in the not-JSON and the wrong-shape refusals; ``fixes``: their fixes."""
    raw = read_file(path, what, MAX_COCO_BYTES)
    digest.update(hashlib.sha256(raw).digest())
    try:
        doc = loads_bounded(raw, what)
    except ValueError as exc:
        raise LabelError(f"not JSON a {names[0]} file can be ({exc})", path=path, fix=fixes[0]) from None
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), list)
                                            for k in ("images", "annotations", "categories")):
        raise LabelError(f"not a {names[1]} file (needs lists images, annotations, categories)", path=path,
                         fix=fixes[1])
    return doc


def read_categories(cats: list[Any], path: Path, document: str = "the annotation file") -> dict[int, str]:
    """category id → name of a COCO-style ``categories`` list (instances and panoptic alike); an entry without a
    name, an id out of range or given twice, or no category at all is refused in one line."""
    seen: dict[int, str] = {}
    for c in cats:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise _fail(path, f"a category is not an object with a name: {str(c)[:80]}", document)
        cid = _int(c.get("id"), path, "a category id", 0, 2**31, document)
        if cid in seen:
            raise _fail(path, f"category id {cid} appears twice", document)
        seen[cid] = c["name"]
    if not seen:
        raise _fail(path, "the file has no categories", document)
    return seen


def read_images(entries: list[Any], path: Path, document: str = "the annotation file"
                ) -> dict[int, tuple[str, int, int]]:
    """image id → (file_name, height, width) of a COCO-style ``images`` list; malformed entries, ids given twice
    and a file named by two entries are refused in one line."""
    images: dict[int, tuple[str, int, int]] = {}
    names: set[str] = set()
    for im in entries:
        if not isinstance(im, dict):
            raise _fail(path, "an images entry is not an object", document)
        iid = _int(im.get("id"), path, "an image id", 0, document=document)
        name = im.get("file_name")
        if not isinstance(name, str):
            raise _fail(path, f"image {iid} has no file_name", document)
        h = _int(im.get("height"), path, f"image {iid}'s height", 1, MAX_SIDE, document)
        w = _int(im.get("width"), path, f"image {iid}'s width", 1, MAX_SIDE, document)
        if iid in images:
            raise _fail(path, f"image id {iid} appears twice", document)
        if name in names:
            raise _fail(path, f"image {name!r} is referenced twice (two images entries)", document)
        names.add(name)
        images[iid] = (name, h, w)
    return images


def _polygons(seg: list[Any], what: Path, ident: str) -> tuple[np.ndarray, ...]:
    """The polygons as float64 arrays: lists of JSON numbers only (no bools, strings or nesting), finite."""
    polys = []
    for poly in seg:
        if not isinstance(poly, list) or len(poly) > 2 * MAX_POLYGON_POINTS:
            raise _fail(what, f"annotation {ident}: a polygon is not a list of at most {MAX_POLYGON_POINTS} points")
        arr = np.array(poly) if poly else np.zeros(0, np.float64)  # numbers only: kind i or f, one dimension
        if arr.ndim != 1 or arr.dtype.kind not in "if":
            raise _fail(what, f"annotation {ident}: a polygon holds a value that is not a number")
        polys.append(arr.astype(np.float64, copy=False))
    return tuple(polys)


def _rle(seg: dict[str, Any], h: int, w: int, what: Path, ident: str) -> np.ndarray:
    size, counts = seg.get("size"), seg.get("counts")
    if not (isinstance(size, list) and len(size) == 2 and size[0] == h and size[1] == w):
        raise _fail(what, f"annotation {ident}: RLE size {size!r} is not its image's [{h}, {w}]")
    try:
        if isinstance(counts, str):
            if len(counts) > 8 * (h * w + 1):
                raise ShapeError("RLE string is longer than any mask of this size needs")
            arr = rle_string_counts(counts)
        elif isinstance(counts, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in counts):
            if len(counts) > h * w + 1:
                raise ShapeError("RLE has more runs than pixels")
            arr = np.asarray(counts, dtype=np.int64) if counts else np.zeros(0, np.int64)
        else:
            raise ShapeError("RLE counts are neither a string nor a list of integers")
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) > h * w):
            raise ShapeError("RLE counts hold a negative or oversized run (overflow)")
        if int(arr.sum()) != h * w:
            raise ShapeError(f"RLE counts sum to {int(arr.sum())}, not H×W = {h}×{w} = {h * w}")
    except ShapeError as exc:
        raise _fail(what, f"annotation {ident}: {exc}") from None
    return arr


class CocoSource(AnnotationSource):
    name = "coco"
    expected = "annotations.json / annotations/instances_<split>.json (COCO instances) + the images it names"
    overlap = "order"
    crowd = "class"
    overlaps = ("order", "area", "ignore")
    tool_rule = ("pycocotools annToMask per object, painted in annotation-file order (later on top); crowd "
                 "objects painted with their class")

    def detect(self, root: Path) -> Path | None:
        """The one COCO file under ``root``, or ``root`` itself when there are several (one per split)."""
        found = [p for p in _candidates(root) if _looks_like_coco(p)]
        return found[0] if len(found) == 1 else root if found else None

    def read(self, root: Path, where: Path) -> Annotations:
        files = [where] if where.is_file() else [p for p in _candidates(where) if _looks_like_coco(p)]
        if not files:
            raise LabelError("no COCO annotation file there", path=where, fix="pass --annotations coco:FILE.json")
        tables: list[tuple[ClassTable, tuple[int | str | None, ...], dict[int, int]]] = []
        splits: dict[str, tuple[tuple[Path, SampleShapes], ...]] = {}
        digest = hashlib.sha256()
        for path in files:
            doc = read_document(path, digest, "annotation file", ("COCO", "COCO instances"),
                                ("pass the COCO instances JSON with --annotations coco:PATH",
                                 "pass the instances JSON (not captions, keypoints or panoptic)"))
            tables.append(self._table(doc["categories"], path))
            split = _split_name(path, root)
            if split in splits:
                raise LabelError(f"two annotation files give split {split!r}", path=path,
                                 fix="pass one with --annotations coco:PATH")
            splits[split] = self._samples(doc, path, root, split, tables[-1][2])
        table, original, _ = tables[0]
        for other, other_original, _ in tables[1:]:
            if other_original != original or [c.name for c in other.classes] != [c.name for c in table.classes]:
                raise LabelError("the splits' annotation files have different categories", path=files[0].parent,
                                 fix="convert each split on its own with --annotations coco:PATH")
        origin = f"{', '.join(p.name for p in files)} categories (ids in increasing category id order"
        origin += ", 0 = background)" if original[0] is None else ")"
        return Annotations(self.name, root, tuple(files), table, original, splits, origin, digest.hexdigest())

    def _table(self, cats: list[Any], path: Path) -> tuple[ClassTable, tuple[int | str | None, ...], dict[int, int]]:
        seen = read_categories(cats, path)
        ordered = sorted(seen)
        original: list[int | str | None] = [] if 0 in seen else [None]
        names = [] if 0 in seen else ["background"]
        original += ordered
        names += [seen[i] for i in ordered]
        if len(names) > 65535:
            raise _fail(path, f"{len(names)} categories; at most 65535")
        stored = {cid: original.index(cid) for cid in ordered}
        ignore = IGNORE if len(names) <= IGNORE else None
        table = ClassTable(tuple(ClassInfo(i, n) for i, n in enumerate(names)), ignore,
                           source=path.name)
        return table, tuple(original), stored

    def _samples(self, doc: dict[str, Any], path: Path, root: Path, split: str,
                 stored: dict[int, int]) -> tuple[tuple[Path, SampleShapes], ...]:
        images = read_images(doc["images"], path)
        objects: dict[int, list[ObjectShapes]] = {i: [] for i in images}
        polygons: list[np.ndarray] = []  # every polygon of the file, checked at once (coordinates, boundary)
        owners: list[str] = []
        for a in doc["annotations"]:
            if not isinstance(a, dict):
                raise _fail(path, "an annotations entry is not an object")
            aid = a.get("id")
            ident = str(aid)
            iid = _int(a.get("image_id"), path, f"annotation {ident}'s image_id", 0)
            if iid not in images:
                raise _fail(path, f"annotation {ident} names image {iid}, which the images list lacks")
            cid = a.get("category_id")
            if isinstance(cid, bool) or not isinstance(cid, int) or cid not in stored:
                raise LabelError(f"annotation {ident} has category id {cid!r}, which the categories lack", path=path,
                                 fix="add the category to 'categories' or drop the annotation")
            _, h, w = images[iid]
            crowd = bool(a.get("iscrowd", 0))
            seg = a.get("segmentation")
            if isinstance(seg, list):
                obj = ObjectShapes(ident, stored[cid], "polygons", _polygons(seg, path, ident), crowd)
                if seg and len(seg[0]) == 4:
                    raise _fail(path, f"annotation {ident}: its first polygon has 2 points, which pycocotools "
                                      "reads as a box [x, y, w, h]")
                polygons += obj.data
                owners += [ident] * len(obj.data)
            elif isinstance(seg, dict):
                obj = ObjectShapes(ident, stored[cid], "rle", (_rle(seg, h, w, path, ident),), crowd)
            else:
                raise _fail(path, f"annotation {ident} has no segmentation (polygons or RLE)")
            objects[iid].append(obj)
        try:
            check_polygons(polygons)
        except ShapeError as exc:
            raise _fail(path, f"annotation {owners[exc.args[1]] if len(exc.args) > 1 else '?'}: {exc.args[0]}"
                        ) from None
        base = self._base(root, path, split, [images[i][0] for i in sorted(images)[:1]])
        out = []
        for iid in sorted(images):
            name, h, w = images[iid]
            image = inside(root, base, name, path)
            key = image.relative_to(Path(root).resolve()).as_posix()
            out.append((image, SampleShapes(key, h, w, tuple(objects[iid]))))
        missing = [image for image, _ in out if not image.is_file()]
        if missing:
            raise LabelError(f"{len(missing)} image(s) the file names are missing, e.g. {missing[0]}", path=path,
                             fix="add them, or leave their entries out of the annotation file")
        return sorted_unique(out, path)

    def _base(self, root: Path, path: Path, split: str, first: list[str]) -> Path:
        bases = [root, root / split, root / "images" / split, root / "images"]
        if path.parent.resolve().is_relative_to(root.resolve()):  # not a JSON kept elsewhere (--annotations coco:F)
            bases.insert(0, path.parent)
        for base in bases:
            if not first or inside(root, base, first[0], path).is_file():  # outside the input: refused
                return base
        raise LabelError(f"image {first[0]!r} named by the file is in none of "
                         f"{', '.join(str(b) for b in dict.fromkeys(bases))}", path=path,
                         fix="put the images where file_name points (relative to the JSON or the input folder)")

    def region(self, obj: ObjectShapes, h: int, w: int) -> tuple[Region, bool, bool]:
        if obj.kind == "rle":
            r = rle_region(obj.data[0], h, w)
            return r, False, not r.mask.size
        r = polygons_region(obj.data, h, w, checked=True)  # checked when the file was read
        few = any(p.size < 6 for p in obj.data)  # fewer than 3 points: no area (pycocotools paints nothing)
        return r, polygon_clipped(obj.data, h, w), few or not obj.data or not r.mask.size


SOURCE = CocoSource
