"""CVAT for images 1.1 (``annotations.xml``): ``<image name width height>`` holding ``<polygon points="x,y;…">``,
``<box xtl ytl xbr ybr rotation>``, ``<mask rle left top width height>`` and ``<polyline>``, each with ``label``,
``z_order`` and ``occluded``; labels from ``<meta><task|project|job><labels>`` in file order.

Drawn as CVAT's own "Segmentation mask 1.1" export draws them (``cvat/apps/dataset_manager/formats/mask.py``, on
datumaro): a polygon or a box — as the polygon of its four corners — by pycocotools' ``frPyObjects`` rule, the same
numpy rule as :mod:`.coco`; a rotated box (``rotation`` in degrees) as the polygon of its corners turned about its
centre by CVAT's ``RotatedBoxesToPolygons``, which also moves it after every other shape of its image (painted
later, under the same z-order); a mask by CVAT's RLE (row-major runs over its ``width``×``height`` box at
``left``/``top``, starting with 0); a polyline, ``points`` or ``skeleton`` has no area, so paints nothing and is
counted degenerate; an image-level ``<tag>``, ``source`` and ``<attribute>`` children paint nothing; any other
shape (``ellipse``, ``cuboid`` …) is refused in one line, as are grouped shapes (``group_id``: CVAT's export
merges a group into one instance of its largest member's label) and a "CVAT for video 1.1" file (``<track>``
elements: export the task as "CVAT for images 1.1", which writes every track's shapes per frame). ``occluded``
changes nothing drawn. Default overlap ``z-order`` (higher ``z_order`` on top, then the order above).

The XML is parsed with xml.etree after refusing any DOCTYPE or ENTITY declaration (no external entities, no
entity expansion bombs), from a size-capped read.
"""

from __future__ import annotations

import hashlib
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from ...errors import LabelError
from ...support.limits import MAX_SIDE
from ..classes import ClassInfo, ClassTable
from ..raster import Region, ShapeError, check_polygons, polygon_clipped, polygons_region
from .base import (
    Annotations,
    AnnotationSource,
    ObjectShapes,
    SampleShapes,
    annotation_error,
    file_head,
    inside,
    read_file,
    sorted_unique,
)
from .coco import MAX_COCO_BYTES, MAX_POLYGON_POINTS

IGNORE = 255
_DECLARATION = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)
_NO_AREA = ("polyline", "points", "skeleton")


def _fail(what: Path, problem: str) -> LabelError:
    return annotation_error(what, problem, "annotations.xml", "shape")


def _looks_like_cvat(path: Path) -> bool:
    """Whether the file's first 64 KiB are CVAT 1.1's (read without parsing the whole file)."""
    head = file_head(path)
    return b"<annotations" in head and b"<version>1.1</version>" in head


def parse_xml(raw: bytes, path: Path) -> ET.Element:
    """The XML's root element; a DOCTYPE or ENTITY declaration (external entities, entity bombs) refused."""
    if _DECLARATION.search(raw):
        raise LabelError("the XML declares a DOCTYPE or ENTITY, which shardkit never expands", path=path,
                         fix="remove the DOCTYPE/ENTITY declarations (CVAT's own export has none)")
    try:
        return ET.fromstring(raw)  # declarations refused above: no entity can be expanded
    except ET.ParseError as exc:
        raise LabelError(f"not well-formed XML ({exc})", path=path,
                         fix="pass CVAT's 'CVAT for images 1.1' annotations.xml") from None


def _number(el: ET.Element, name: str, path: Path, where: str, lo: float = -1e8, hi: float = 1e8) -> float:
    text = el.get(name)
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and lo <= value <= hi):
        raise _fail(path, f"{where}: {name}={text!r} is not a finite number in {lo:g}..{hi:g}")
    return value


def _points(el: ET.Element, path: Path, where: str) -> np.ndarray:
    text = el.get("points") or ""
    pairs = [p for p in text.split(";") if p.strip()]
    if len(pairs) > MAX_POLYGON_POINTS:
        raise _fail(path, f"{where}: more than {MAX_POLYGON_POINTS} points")
    try:
        flat = [float(v) for p in pairs for v in p.split(",", 1)]
    except ValueError:
        raise _fail(path, f"{where}: points {text[:60]!r} are not x,y;x,y … numbers") from None
    if len(flat) != 2 * len(pairs):
        raise _fail(path, f"{where}: a point is not an x,y pair")
    return np.asarray(flat, dtype=np.float64)


def _mask(el: ET.Element, path: Path, where: str) -> tuple[int, int, np.ndarray]:
    """A ``<mask>``'s left, top and its box's bool pixels from CVAT's RLE (row-major, starting with 0)."""
    left = int(_number(el, "left", path, where, 0, MAX_SIDE))
    top = int(_number(el, "top", path, where, 0, MAX_SIDE))
    w = int(_number(el, "width", path, where, 1, MAX_SIDE))
    h = int(_number(el, "height", path, where, 1, MAX_SIDE))
    try:
        counts = np.asarray([int(c) for c in (el.get("rle") or "").split(",") if c.strip()], dtype=np.int64)
    except (ValueError, OverflowError):
        raise _fail(path, f"{where}: rle is not a list of integers") from None
    if counts.size > h * w + 1 or (counts.size and (int(counts.min()) < 0 or int(counts.max()) > h * w)) \
            or int(counts.sum()) != h * w:
        raise _fail(path, f"{where}: rle counts do not sum to its width×height = {w}×{h} = {w * h}")
    values = np.zeros(counts.size, dtype=bool)
    values[1::2] = True
    return left, top, np.repeat(values, counts).reshape(h, w)


def _box_corners(x0: float, y0: float, x1: float, y1: float, degrees: float) -> np.ndarray:
    """A box's corners (x0,y0 x1,y0 x1,y1 x0,y1) turned ``degrees`` about its centre, by the arithmetic of CVAT's
    ``RotatedBoxesToPolygons`` (math.cos/sin of math.radians, the centre as x0 + (x1 - x0) / 2), so the float
    coordinates — and the pixels pycocotools fills from them — are CVAT's."""
    if not degrees:
        return np.asarray([x0, y0, x1, y0, x1, y1, x0, y1], dtype=np.float64)
    angle = math.radians(degrees)
    cx, cy = x0 + (x1 - x0) / 2, y0 + (y1 - y0) / 2
    out = []
    for x, y in ((x0, y0), (x1, y0), (x1, y1), (x0, y1)):
        out += [cx + math.cos(angle) * (x - cx) - math.sin(angle) * (y - cy),
                cy + math.sin(angle) * (x - cx) + math.cos(angle) * (y - cy)]
    return np.asarray(out, dtype=np.float64)


class CvatSource(AnnotationSource):
    name = "cvat"
    expected = "annotations.xml (CVAT for images 1.1) + the images it names (beside it or in images/)"
    overlap = "z-order"
    crowd = "class"
    tool_rule = ("CVAT's z_order (higher on top, then file order, rotated boxes last as CVAT's mask export moves "
                 "them); polygons and boxes by pycocotools' rule (datumaro, which CVAT's mask export runs on); "
                 "masks by CVAT's RLE; polylines and points paint nothing")

    def detect(self, root: Path) -> Path | None:
        path = root / "annotations.xml"
        return path if path.is_file() and _looks_like_cvat(path) else None

    def read(self, root: Path, where: Path) -> Annotations:
        path = where if where.is_file() else where / "annotations.xml"
        raw = read_file(path, "CVAT annotations.xml", MAX_COCO_BYTES)
        doc = parse_xml(raw, path)
        if doc.tag != "annotations":
            raise LabelError(f"the XML's root is <{doc.tag}>, not <annotations>", path=path,
                             fix="pass CVAT's 'CVAT for images 1.1' annotations.xml")
        tracks = doc.findall("track")
        if tracks:
            raise LabelError(f"a 'CVAT for video 1.1' file ({len(tracks)} <track> elements): shardkit reads the "
                             "shapes of each <image>", path=path,
                             fix="export the task as 'CVAT for images 1.1' (it writes every track's shapes per frame)")
        labels = [(el.findtext("name") or "") for el in doc.findall("./meta/*/labels/label")]
        labels = [n for n in labels if n]
        if not labels:
            raise _fail(path, "no <meta><task><labels> (the class table) in the file")
        if len(set(labels)) != len(labels) or len(labels) >= IGNORE:
            raise _fail(path, f"{len(labels)} labels, some named twice or more than {IGNORE - 1}")
        stored = {n: i + 1 for i, n in enumerate(labels)}
        samples = []
        polygons: list[np.ndarray] = []
        owners: list[str] = []
        for im in doc.iter("image"):
            name = im.get("name") or ""
            h = int(_number(im, "height", path, f"image {name!r}", 1, MAX_SIDE))
            w = int(_number(im, "width", path, f"image {name!r}", 1, MAX_SIDE))
            objects: list[ObjectShapes] = []
            rotated: list[ObjectShapes] = []  # CVAT's RotatedBoxesToPolygons appends them after the others
            for n, el in enumerate(im):
                if el.tag == "tag":  # an image-level tag: no shape
                    continue
                if el.tag not in ("polygon", "box", "mask", *_NO_AREA):
                    raise LabelError(f"image {name!r} holds a <{el.tag}>, a shape shardkit does not draw", path=path,
                                     fix="convert it to a polygon or mask in CVAT (or leave it out)")
                ident = f"{name}#{n}:{el.tag}"
                label = el.get("label") or ""
                if label not in stored:
                    raise LabelError(f"{ident} has label {label!r}, which <meta> labels lack", path=path,
                                     fix="add the label to the task's labels or drop the shape")
                z = int(_number(el, "z_order", path, ident, -1e6, 1e6)) if el.get("z_order") else 0
                if el.get("group_id") not in (None, "", "0"):
                    raise LabelError(f"{ident} is in group {el.get('group_id')}; CVAT's mask export merges a group "
                                     "into one instance of its largest member's label, which shardkit does not "
                                     "repeat", path=path, fix="ungroup the shapes in CVAT and export again")
                angle = _number(el, "rotation", path, ident, -360, 360) if el.get("rotation") else 0.0
                if angle and el.tag != "box":
                    raise LabelError(f"{ident} is rotated ({angle:g} degrees), which shardkit draws for boxes only",
                                     path=path, fix="convert the rotated shape to a polygon in CVAT")
                data: tuple[object, ...]
                if el.tag == "box":
                    x0, y0 = (_number(el, k, path, ident) for k in ("xtl", "ytl"))
                    x1, y1 = (_number(el, k, path, ident) for k in ("xbr", "ybr"))
                    data = (_box_corners(x0, y0, x1, y1, angle),)
                elif el.tag == "mask":
                    data = _mask(el, path, ident)
                else:
                    data = (_points(el, path, ident),)
                if el.tag in ("polygon", "box"):
                    polygons.append(data[0])  # type: ignore[arg-type]
                    owners.append(ident)
                kind = "polygons" if el.tag in ("polygon", "box") else el.tag
                (rotated if angle else objects).append(ObjectShapes(ident, stored[label], kind, data, False, z))
            image = inside(root, self._base(root, path, name, im.get("subset") or ""), name, path)
            key = image.relative_to(Path(root).resolve()).as_posix()
            samples.append((image, SampleShapes(key, h, w, (*objects, *rotated))))
        try:
            check_polygons(polygons)
        except ShapeError as exc:
            raise _fail(path, f"{owners[exc.args[1]] if len(exc.args) > 1 else '?'}: {exc.args[0]}") from None
        missing = [image for image, _ in samples if not image.is_file()]
        if missing:
            raise LabelError(f"{len(missing)} image(s) the file names are missing, e.g. {missing[0]}", path=path,
                             fix="add them beside annotations.xml or in images/, or leave their entries out")
        table = ClassTable(tuple(ClassInfo(i, n) for i, n in enumerate(["background", *labels])), IGNORE,
                           source=path.name)
        origin = f"{path.name} <meta> labels in file order (0 = background)"
        return Annotations(self.name, root, (path,), table, (None, *labels), {"all": sorted_unique(samples, path)},
                           origin, hashlib.sha256(raw).hexdigest())

    def _base(self, root: Path, path: Path, name: str, subset: str) -> Path:
        """Where the image lies: beside the file (unless the XML is kept elsewhere, ``cvat:FILE``), in
        images/<subset>/ (a project export), images/ or the root."""
        here = path.parent.resolve().is_relative_to(root.resolve())
        bases = (*((path.parent,) if here else ()), *([root / "images" / subset] if subset else []),
                 root / "images", root)
        for base in bases:
            if inside(root, base, name, path).is_file():
                return base
        return path.parent if here else root

    def region(self, obj: ObjectShapes, h: int, w: int) -> tuple[Region, bool, bool]:
        if obj.kind in _NO_AREA:
            return Region(0, 0, np.zeros((0, 0), dtype=bool)), False, True
        if obj.kind == "mask":
            left, top, box = obj.data
            bh, bw = box.shape
            clipped = top + bh > h or left + bw > w
            r = Region.of(box[: max(0, h - top), : max(0, w - left)])
            return Region(r.y0 + top, r.x0 + left, r.mask), clipped, not r.mask.size
        r = polygons_region(obj.data, h, w, checked=True)
        few = obj.data[0].size < 6
        return r, polygon_clipped(obj.data, h, w), few or not r.mask.size


SOURCE = CvatSource
