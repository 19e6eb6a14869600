"""labelme JSON: one ``<image stem>.json`` of shapes beside each image (``shapes``: polygon, rectangle, circle,
line, linestrip, point, oriented_rectangle, mask), with ``labels.txt`` at the root (or the names found).
The image is the file ``imagePath`` names (or ``<stem>.<ext>`` beside the JSON); only when no such file exists is
the image embedded in the JSON (``imageData``: the image file's bytes in base64) used, decoded by the same checked
reader as a file (its header's pixel limit before any decode; the JSON is capped at 64 MiB), and the run says so.

Rasterised exactly by labelme's own rule (``labelme/_utils/shape.py``: ``shape_to_mask`` draws each shape with
PIL ``ImageDraw`` into a mode-L image — polygon/rectangle/circle/point filled with an outline, line width 10,
linestrip joint "curve", point radius 5; a ``mask`` shape's base64 PNG patch placed at its rounded first point —
and ``shapes_to_label`` paints them in file order, later on top): the same PIL calls are made here, so the pixels
are PIL's own.

Class table: ``labels.txt`` lines in order, ``__ignore__`` left out and stored as the ignore id 255 (labelme2voc
writes its -1 as 255), so with labelme's usual ``__ignore__``, ``_background_`` first lines ids are labelme2voc's;
without ``labels.txt``: ``_background_`` = 0, then the names found, sorted.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import LabelError
from ...support.limits import MAX_SIDE
from ...support.smallfile import loads_bounded
from ..classes import ClassInfo, ClassTable
from ..raster import Region
from .base import (
    Annotations,
    AnnotationSource,
    ObjectShapes,
    SampleShapes,
    annotation_error,
    inside,
    read_file,
    sorted_unique,
)

log = logging.getLogger(__name__)
IGNORE_NAME = "__ignore__"
BACKGROUND = "_background_"
IGNORE = 255
MAX_LABELME_BYTES = 64 << 20
MAX_POINTS = 1_000_000
MAX_COORD = 1e7
#: labelme's defaults in shape_to_mask
LINE_WIDTH = 10
POINT_SIZE = 5
_POINTS_NEEDED = {"circle": 2, "rectangle": 2, "line": 2, "point": 1, "oriented_rectangle": 4, "mask": 2}
SHAPE_TYPES = ("polygon", "rectangle", "circle", "line", "linestrip", "point", "oriented_rectangle", "mask")
IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


def _fail(what: Path, problem: str) -> LabelError:
    return annotation_error(what, problem, "the labelme file", "shape")


def _jsons(root: Path) -> list[Path]:
    """labelme files: ``*.json`` anywhere under ``root`` whose first KiB names ``shapes``."""
    out = []
    for p in sorted(root.rglob("*.json")):
        if p.is_file() and not p.is_symlink():
            with p.open("rb") as fh:
                head = fh.read(4096)
            if b'"shapes"' in head and (b'"imagePath"' in head or b'"version"' in head):
                out.append(p)
    return out


class LabelmeSource(AnnotationSource):
    name = "labelme"
    expected = "<name>.json (labelme shapes) beside each <name>.jpg/.png, labels.txt at the root (optional)"
    overlap = "order"
    crowd = "class"
    overlaps = ("order", "area", "ignore")
    tool_rule = "labelme shapes_to_label: shapes painted in file order, later on top (PIL ImageDraw)"

    def __init__(self) -> None:
        self.fallbacks = 0  # files whose imagePath did not name a file in the input folder
        self.embedded: list[Path] = []  # files whose embedded imageData is the image (no image file exists)

    def detect(self, root: Path) -> Path | None:
        for p in _jsons(root)[:1]:
            return root if p else None
        return None

    def read(self, root: Path, where: Path) -> Annotations:
        files = _jsons(where)
        if not files:
            raise LabelError("no labelme JSON files (with 'shapes') there", path=where,
                             fix="point the input at the folder of labelme .json files")
        docs: list[tuple[Path, dict[str, Any]]] = []
        digest = hashlib.sha256()
        for path in files:
            raw = read_file(path, "labelme file", MAX_LABELME_BYTES)
            digest.update(hashlib.sha256(path.relative_to(where).as_posix().encode() + b"\0" + raw).digest())
            try:
                doc = loads_bounded(raw, "labelme file")
            except ValueError as exc:
                raise _fail(path, f"not JSON ({exc})") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("shapes"), list):
                raise _fail(path, "not a labelme file (no 'shapes' list)")
            docs.append((path, doc))
        labels_txt = where / "labels.txt"
        if labels_txt.is_file():
            try:
                text = read_file(labels_txt, "labels.txt", 1 << 20).decode("utf-8-sig")
            except UnicodeDecodeError:
                raise LabelError("labels.txt is not UTF-8 text", path=labels_txt,
                                 fix="save it as UTF-8, one label a line") from None
            names = [line.strip() for line in text.splitlines() if line.strip()]
            origin = "labels.txt (line order; __ignore__ = 255)"
        else:
            found = {s.get("label") for _, d in docs for s in d["shapes"] if isinstance(s, dict)}
            names = [BACKGROUND, *sorted(str(n) for n in found - {BACKGROUND, IGNORE_NAME, None})]
            origin = "the labels found in the labelme files (_background_ = 0, then sorted by name)"
        classes = [n for n in names if n != IGNORE_NAME]
        if len(set(classes)) != len(classes):
            raise LabelError("a name appears twice", path=labels_txt, fix="list each label once")
        stored = {n: i for i, n in enumerate(classes)}
        stored[IGNORE_NAME] = IGNORE
        if len(classes) > IGNORE:
            raise LabelError(f"{len(classes)} labels; the ignore id {IGNORE} would be a class", path=where,
                             fix="use at most 255 labels")
        table = ClassTable(tuple(ClassInfo(i, n) for i, n in enumerate(classes)), IGNORE, source=origin)
        samples = [self._sample(root, path, doc, stored, origin) for path, doc in docs]
        if self.fallbacks:
            log.warning("%s: %d labelme file(s) name an imagePath that is no image file in the input folder "
                        "(another machine's path, or the JSON itself); the image beside each file with its name "
                        "was used", where, self.fallbacks)
        if self.embedded:
            log.warning("%s: %d labelme file(s) have no image file beside them; the image embedded in each "
                        "(imageData) was used (first: %s)", where, len(self.embedded), self.embedded[0].name)
        return Annotations(self.name, root, tuple(files), table, tuple(classes), {"all": sorted_unique(samples, where)},
                           origin,
                           digest.hexdigest())

    def _sample(self, root: Path, path: Path, doc: dict[str, Any], stored: dict[str, int],
                origin: str) -> tuple[Path, SampleShapes]:
        image_path = doc.get("imagePath")
        # imagePath (often absolute, from the annotator's machine), its file name, then <stem>.<ext>: the first
        # that is a file inside the input folder; one outside it is never read
        names: list[str] = []
        if isinstance(image_path, str) and image_path:
            names += [image_path.replace("\\", "/"), image_path.replace("\\", "/").rsplit("/", 1)[-1]]
        names += [path.stem + ext for ext in IMAGE_EXTS]
        image = outside = None
        for name in dict.fromkeys(names):
            try:
                candidate = inside(root, path.parent, name, path)
            except LabelError as exc:
                outside = outside or exc
                continue
            if candidate.is_file() and candidate.suffix.lower() != ".json":  # imagePath may name the JSON itself
                image = candidate
                if image_path and name != names[0]:
                    self.fallbacks += 1
                break
        embedded = b""
        if image is None and outside is not None and not doc.get("imageData"):
            raise outside
        if image is None:
            embedded = _embedded_image(doc.get("imageData"), path, image_path)
            self.embedded.append(path)
        h = doc.get("imageHeight")
        w = doc.get("imageWidth")
        if not (isinstance(h, int) and isinstance(w, int) and 1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE):
            raise _fail(path, f"imageHeight/imageWidth {h!r}x{w!r} are not image sides")
        objects = []
        for i, shape in enumerate(doc["shapes"]):
            if not isinstance(shape, dict):
                raise _fail(path, f"shape {i} is not an object")
            label = shape.get("label")
            if label not in stored:
                raise LabelError(f"shape {i} has label {label!r}, which {origin} lacks", path=path,
                                 fix="add it to labels.txt (or correct the shape's label)")
            kind = shape.get("shape_type") or "polygon"
            if kind not in SHAPE_TYPES:
                raise _fail(path, f"shape {i} is a {kind!r}; shardkit reads {', '.join(SHAPE_TYPES)}")
            pts = shape.get("points")
            if not isinstance(pts, list) or len(pts) > MAX_POINTS or not all(
                    isinstance(p, list) and len(p) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                                for v in p) for p in pts):
                raise _fail(path, f"shape {i}'s points are not a list of [x, y] numbers")
            arr = np.asarray(pts, dtype=np.float64).reshape(-1, 2)
            if not np.isfinite(arr).all() or (arr.size and float(np.abs(arr).max()) > MAX_COORD):
                raise _fail(path, f"shape {i} has a NaN, infinite or huge coordinate")
            need = _POINTS_NEEDED.get(kind)
            if (need is not None and len(arr) != need) or (kind == "polygon" and len(arr) < 3):
                raise _fail(path, f"shape {i} ({kind}) has {len(arr)} points (labelme refuses it)")
            data: tuple[np.ndarray, ...] = (arr,)
            if kind == "mask":
                data = (arr, _mask_of(shape.get("mask"), h, w, path, i))
            objects.append(ObjectShapes(f"{path.name}#{i}", stored[label], kind, data))
        if image is None:  # keyed as the image file would be; the JSON (which holds it) is the sample's image path
            holder = path.resolve()
            keyed = holder.parent / _embedded_name(path, image_path, embedded)
            return holder, SampleShapes(keyed.relative_to(Path(root).resolve()).as_posix(), h, w, tuple(objects),
                                        embedded=embedded)
        key = image.relative_to(Path(root).resolve()).as_posix()
        return image, SampleShapes(key, h, w, tuple(objects))

    def region(self, obj: ObjectShapes, h: int, w: int) -> tuple[Region, bool, bool]:
        import PIL.Image
        import PIL.ImageDraw

        arr = obj.data[0]
        if obj.kind == "mask":
            m = _place_mask(arr, obj.data[1], h, w)
            region = Region.of(m)
            return region, bool(arr.min() < 0 or arr[:, 0].max() >= w or arr[:, 1].max() >= h), not region.mask.size
        img = PIL.Image.fromarray(np.zeros((h, w), dtype=np.uint8))
        draw = PIL.ImageDraw.Draw(img)
        xy = [(float(x), float(y)) for x, y in arr]
        kind = obj.kind
        if kind == "circle":
            (cx, cy), (px, py) = xy
            d = math.sqrt((cx - px) ** 2 + (cy - py) ** 2)
            draw.ellipse(((cx - d, cy - d), (cx + d, cy + d)), outline=1, fill=1)
        elif kind == "rectangle":
            (x0, y0), (x1, y1) = xy
            draw.rectangle(((min(x0, x1), min(y0, y1)), (max(x0, x1), max(y0, y1))), outline=1, fill=1)
        elif kind == "line":
            draw.line(xy=xy, fill=1, width=LINE_WIDTH)
        elif kind == "linestrip":
            draw.line(xy=xy, fill=1, width=LINE_WIDTH, joint="curve")
        elif kind == "point":
            cx, cy = xy[0]
            r = POINT_SIZE
            draw.ellipse(((cx - r, cy - r), (cx + r, cy + r)), outline=1, fill=1)
        else:  # polygon, oriented_rectangle
            draw.polygon(xy=xy, outline=1, fill=1)
        m = np.array(img, dtype=bool)
        clipped = bool(arr.size) and bool((arr[:, 0].min() < 0) or (arr[:, 1].min() < 0) or
                                          (arr[:, 0].max() > w) or (arr[:, 1].max() > h))
        region = Region.of(m)
        return region, clipped, not region.mask.size


def _embedded_image(text: Any, path: Path, image_path: Any) -> bytes:
    """The image file's bytes from labelme's ``imageData`` (base64), or one line saying neither exists."""
    if not isinstance(text, str) or not text:
        raise LabelError(f"no image file {image_path!r} beside it and no embedded imageData", path=path,
                         fix="put the image beside the JSON (named as imagePath says), or save the JSON with its "
                             "image data in labelme")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _fail(path, "its imageData is not base64 (and no image file lies beside it)") from None


def _embedded_name(path: Path, image_path: Any, data: bytes) -> str:
    """The file name an embedded image is keyed by: imagePath's, when it names an image; else the JSON's stem
    with the extension of the bytes' type (labelme embeds PNG or JPEG)."""
    name = image_path.replace("\\", "/").rsplit("/", 1)[-1] if isinstance(image_path, str) else ""
    if Path(name).suffix.lower() in IMAGE_EXTS:
        return name
    return path.stem + (".png" if data.startswith(b"\x89PNG") else ".jpg" if data.startswith(b"\xff\xd8") else
                        ".img")


def _mask_of(text: Any, h: int, w: int, path: Path, i: int) -> np.ndarray:
    """A ``mask`` shape's pixels: a base64 PNG (labelme's ``img_b64_to_arr``, then ``astype(bool)``), 2-D, at
    most the image's pixel count (its size read before it is decoded)."""
    import PIL.Image

    if not isinstance(text, str):
        raise _fail(path, f"shape {i} (mask) has no base64 PNG 'mask'")
    try:
        with PIL.Image.open(io.BytesIO(base64.b64decode(text, validate=True))) as img:
            if img.width * img.height > h * w:
                raise _fail(path, f"shape {i}'s mask is {img.height}x{img.width}, larger than its image")
            mask = np.array(img)
    except (ValueError, OSError, binascii.Error) as exc:
        if isinstance(exc, LabelError):
            raise
        raise _fail(path, f"shape {i}'s mask is not a base64 PNG ({exc})") from None
    if mask.ndim != 2:
        raise _fail(path, f"shape {i}'s mask decodes to shape {mask.shape}, not a 2-D image")
    return mask.astype(bool)


def _place_mask(points: np.ndarray, patch: np.ndarray, h: int, w: int) -> np.ndarray:
    """labelme's ``shapes_to_label`` for a ``mask`` shape: the patch placed at the rounded first point (integer
    points: its extent from the points; fractional ones: the patch's own size), cut to the image."""
    mask = np.zeros((h, w), dtype=bool)
    (x1, y1), (x2, y2) = points.round().astype(int)
    if np.array_equal(points, np.trunc(points)):
        ph, pw = y2 - y1 + 1, x2 - x1 + 1
    else:
        ph, pw = patch.shape
    y0, y_stop = max(y1, 0), min(y1 + ph, h)
    x0, x_stop = max(x1, 0), min(x1 + pw, w)
    if y0 < y_stop and x0 < x_stop:
        part = patch[y0 - y1 : y_stop - y1, x0 - x1 : x_stop - x1]
        if part.shape != (y_stop - y0, x_stop - x0):
            raise LabelError(f"a mask shape's points span {ph}x{pw} (HxW) but its mask is {patch.shape[0]}x"
                             f"{patch.shape[1]}", fix="re-save the shape in labelme")
        mask[y0:y_stop, x0:x_stop] = part
    return mask


SOURCE = LabelmeSource
