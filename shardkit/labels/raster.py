"""Shapes to class-id images, exactly as the tools that drew them define it, with stated policies and a report.

- COCO RLE (uncompressed counts and the compressed string) and COCO polygons, bit-exact with pycocotools'
  ``annToMask`` (its ``rleFrPoly``: vertices upsampled by 5, edges walked, column crossings downsampled; a
  pixel is inside when an odd number of crossings lie above it in its column), in numpy;
- painting many objects into one id image under an overlap policy (``order``: file order, later on top;
  ``z-order``: by the shape's z value, then file order; ``area``: larger first, so the smaller is on top;
  ``ignore``: pixels that objects of different classes share become the ignore id) and a crowd policy
  (``ignore``: crowd pixels become the ignore id, ``class``: painted with their class, ``drop``: left out);
- a :class:`RasterReport` of what the painting lost: pixels painted over, crowd pixels, unlabelled pixels,
  objects left with no visible pixel (by id), shapes clipped by the image border or degenerate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

OVERLAPS = ("order", "z-order", "area", "ignore")
CROWDS = ("ignore", "class", "drop")
#: Most points one polygon's boundary walk may produce (pycocotools walks every upsampled pixel step of every
#: edge): a polygon with coordinates far outside any image would otherwise allocate gigabytes.
MAX_WALK = 50_000_000
#: Largest absolute coordinate accepted (pycocotools scales by 5 into a C int).
MAX_COORD = 1e8


class ShapeError(ValueError):
    """A shape that cannot be rasterised (NaN coordinates, RLE counts that do not sum to H×W …); the caller
    words it with the file and the object."""


@dataclass
class Shape:
    """One object to paint: its class id (stored), mask (H×W bool), and what the report needs."""

    ident: str
    class_id: int
    mask: np.ndarray
    crowd: bool = False
    z: int = 0
    clipped: bool = False
    degenerate: bool = False


@dataclass
class RasterReport:
    """What painting lost, summed over samples (``merge``); ``to_json`` is what the manifest stores."""

    samples: int = 0
    objects: int = 0
    pixels: int = 0
    painted_over: int = 0
    overlap_ignored: int = 0
    crowd_pixels: int = 0
    unlabelled: int = 0
    clipped: int = 0
    degenerate: int = 0
    lost: list[str] = field(default_factory=list)

    def merge(self, other: RasterReport) -> None:
        for name in ("samples", "objects", "pixels", "painted_over", "overlap_ignored", "crowd_pixels",
                     "unlabelled", "clipped", "degenerate"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.lost.extend(other.lost)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in ("samples", "objects", "pixels", "painted_over",
                                                              "overlap_ignored", "crowd_pixels", "unlabelled",
                                                              "clipped", "degenerate")}
        out["unlabelled_share"] = round(self.unlabelled / self.pixels, 6) if self.pixels else 0.0
        out["lost_objects"] = len(self.lost)
        out["lost_ids"] = self.lost[:100]
        return out


# ---------------------------------------------------------------------------------------------------- COCO RLE
def rle_string_counts(text: str | bytes) -> np.ndarray:
    """The counts of a compressed COCO RLE string (pycocotools' ``rleFrString``: 5 bits a character, offset 48,
    0x20 = more, sign from 0x10; from the third count on each is a difference to the one two before)."""
    raw = text.encode("ascii") if isinstance(text, str) else bytes(text)
    counts: list[int] = []
    p = 0
    n = len(raw)
    while p < n:
        x = k = 0
        more = True
        while more:
            if p >= n:
                raise ShapeError("RLE string ends inside a count")
            c = raw[p] - 48
            if not 0 <= c < 64:
                raise ShapeError(f"RLE string has a character outside the COCO alphabet ({chr(raw[p])!r})")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if k > 7:
                raise ShapeError("RLE string has a count longer than 7 characters (overflow)")
            if not more and (c & 0x10):
                x |= -1 << (5 * k)
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return np.asarray(counts, dtype=np.int64)


def rle_mask(counts: Sequence[int] | np.ndarray, h: int, w: int) -> np.ndarray:
    """An H×W bool mask from COCO RLE counts (column-major runs, starting with background); counts must be
    non-negative and sum to exactly H×W."""
    c = np.asarray(counts, dtype=np.int64) if not isinstance(counts, np.ndarray) else counts.astype(np.int64)
    if c.ndim != 1:
        raise ShapeError("RLE counts are not a flat list")
    if c.size and int(c.min()) < 0:
        raise ShapeError("RLE counts hold a negative run (overflow)")
    total = int(c.sum()) if c.size else 0
    if total != h * w:
        raise ShapeError(f"RLE counts sum to {total}, not H×W = {h}×{w} = {h * w}")
    values = np.zeros(c.size, dtype=bool)
    values[1::2] = True
    return np.repeat(values, c).reshape(w, h).T


def _trunc_int(a: np.ndarray) -> np.ndarray:
    """C's ``(int)`` of a double: toward zero."""
    return np.trunc(a).astype(np.int64)


def check_polygon(xy: Sequence[float] | np.ndarray) -> np.ndarray:
    """``xy`` as float64, refused (:class:`ShapeError`) when it is not x, y pairs, holds NaN/inf, a coordinate
    beyond :data:`MAX_COORD` or a boundary longer than :data:`MAX_WALK` upsampled steps."""
    pts = np.asarray(xy, dtype=np.float64)
    if pts.ndim != 1 or pts.size % 2:
        raise ShapeError("polygon is not a flat list of x, y pairs")
    if not np.isfinite(pts).all():
        raise ShapeError("polygon has a NaN or infinite coordinate")
    if pts.size and float(np.abs(pts).max()) > MAX_COORD:
        raise ShapeError(f"polygon has a coordinate beyond ±{MAX_COORD:g}")
    if pts.size:
        x = np.trunc(5.0 * pts[0::2] + 0.5)
        y = np.trunc(5.0 * pts[1::2] + 0.5)
        dx, dy = np.abs(np.diff(np.append(x, x[:1]))), np.abs(np.diff(np.append(y, y[:1])))
        total = float(np.maximum(dx, dy).sum()) + x.size
        if total > MAX_WALK:
            raise ShapeError(f"polygon boundary is {total:.0f} upsampled steps long (more than {MAX_WALK})")
    return pts


def polygon_positions(xy: Sequence[float] | np.ndarray, h: int, w: int) -> np.ndarray:
    """Column-major boundary crossings of one polygon (x0, y0, x1, y1, …), pycocotools' ``rleFrPoly`` rule,
    vectorised: each position toggles the mask from there down its column (and on)."""
    pts = check_polygon(xy)
    scale = 5.0
    x = _trunc_int(scale * pts[0::2] + 0.5)
    y = _trunc_int(scale * pts[1::2] + 0.5)
    x = np.append(x, x[:1])
    y = np.append(y, y[:1])
    xs0, xe0, ys0, ye0 = x[:-1], x[1:], y[:-1], y[1:]
    dx = np.abs(xe0 - xs0)
    dy = np.abs(ys0 - ye0)
    along_x = dx >= dy
    flip = (along_x & (xs0 > xe0)) | (~along_x & (ys0 > ye0))
    xs = np.where(flip, xe0, xs0)
    xe = np.where(flip, xs0, xe0)
    ys = np.where(flip, ye0, ys0)
    ye = np.where(flip, ys0, ye0)
    steps = np.where(along_x, dx, dy)
    total = int(steps.sum()) + steps.size
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(along_x, (ye - ys) / np.where(dx == 0, 1, dx), (xe - xs) / np.where(dy == 0, 1, dy))
    s = np.where(steps == 0, 0.0, s)  # pycocotools divides 0 by 0 there; that point's v is never used
    n = steps + 1
    edge = np.repeat(np.arange(steps.size), n)
    start = np.cumsum(n) - n
    d = np.arange(total) - start[edge]
    t = np.where(flip[edge], steps[edge] - d, d)
    ax, se, xse, yse = along_x[edge], s[edge], xs[edge], ys[edge]
    u = np.where(ax, t + xse, _trunc_int((xse + se * t) + 0.5))
    v = np.where(ax, _trunc_int((yse + se * t) + 0.5), t + yse)
    # points where the walk changes column: the crossings, downsampled
    j = np.flatnonzero(u[1:] != u[:-1]) + 1
    uj, up = u[j], u[j - 1]
    xd = np.where(uj < up, uj, uj - 1).astype(np.float64)
    xd = (xd + 0.5) / scale - 0.5
    keep = (np.floor(xd) == xd) & (xd >= 0) & (xd <= w - 1)
    yd = np.minimum(v[j], v[j - 1]).astype(np.float64)
    yd = (yd + 0.5) / scale - 0.5
    yd = np.ceil(np.clip(yd, 0, h))
    return (xd[keep].astype(np.int64) * h + yd[keep].astype(np.int64))


def positions_mask(positions: np.ndarray, h: int, w: int) -> np.ndarray:
    """The H×W mask whose column-major pixels toggle at each of ``positions`` (an odd count toggles)."""
    flat = np.zeros(h * w, dtype=bool)
    pos = positions[positions < h * w]
    if pos.size:
        lo, hi = int(pos.min()), int(pos.max())
        odd = (np.bincount(pos - lo, minlength=hi - lo + 1) & 1).astype(bool)
        run = np.logical_xor.accumulate(odd)
        flat[lo : hi + 1] = run
        if run[-1]:
            flat[hi + 1 :] = True
    return flat.reshape(w, h).T


def polygons_mask(polygons: Sequence[Sequence[float]], h: int, w: int) -> np.ndarray:
    """The union of COCO polygons (pycocotools: each polygon's RLE, merged by OR)."""
    mask = np.zeros((h, w), dtype=bool)
    for poly in polygons:
        mask |= positions_mask(polygon_positions(poly, h, w), h, w)
    return mask


def polygon_clipped(polygons: Sequence[Sequence[float]], h: int, w: int) -> bool:
    """Whether any vertex lies outside the image (the shape is clipped by its border)."""
    for poly in polygons:
        pts = np.asarray(poly, dtype=np.float64)
        if pts.size and (pts[0::2].min() < 0 or pts[1::2].min() < 0 or pts[0::2].max() > w or pts[1::2].max() > h):
            return True
    return False


# ---------------------------------------------------------------------------------------------------- painting
def paint(shapes: Sequence[Shape], h: int, w: int, dtype: np.dtype[Any] | type, *, overlap: str, crowd: str,
          background: int, ignore: int | None) -> tuple[np.ndarray, RasterReport]:
    """The id image of ``shapes`` under the overlap and crowd policies, and its report."""
    report = RasterReport(samples=1, objects=len(shapes), pixels=h * w)
    ids = np.full((h, w), background, dtype=dtype)
    owner = np.full((h, w), -1, dtype=np.int32)  # which shape a pixel shows
    order = list(range(len(shapes)))
    if overlap == "z-order":
        order.sort(key=lambda i: shapes[i].z)
    elif overlap == "area":
        order.sort(key=lambda i: -int(shapes[i].mask.sum()))
    cover = np.zeros((h, w), dtype=bool)
    conflict = np.zeros((h, w), dtype=bool)
    first_class = np.full((h, w), -1, dtype=np.int64)
    crowd_mask = np.zeros((h, w), dtype=bool)
    for i in order:
        s = shapes[i]
        report.clipped += s.clipped
        report.degenerate += s.degenerate
        if s.crowd:
            crowd_mask |= s.mask
            if crowd != "class":
                continue
        report.painted_over += int(np.count_nonzero(s.mask & cover))
        if overlap == "ignore":
            conflict |= s.mask & cover & (first_class != s.class_id)
            first_class[s.mask & ~cover] = s.class_id
        ids[s.mask] = s.class_id
        owner[s.mask] = i
        cover |= s.mask
    report.crowd_pixels = int(np.count_nonzero(crowd_mask))
    if crowd == "ignore" and ignore is not None:
        ids[crowd_mask] = ignore
        owner[crowd_mask] = -2
    if overlap == "ignore" and ignore is not None:
        report.overlap_ignored = int(np.count_nonzero(conflict))
        ids[conflict] = ignore
        owner[conflict] = -2
    report.unlabelled = int(np.count_nonzero(ids == background))
    seen = np.zeros(len(shapes) + 2, dtype=bool)
    seen[np.unique(owner) + 2] = True
    for i, s in enumerate(shapes):
        if not seen[i + 2] and not (s.crowd and crowd != "class"):
            report.lost.append(s.ident)
    return ids, report


def report_lines(notes: Any) -> list[str]:
    """``shardkit info``'s lines for a split converted from annotations (its manifest's
    ``source.annotations``); none for mask images."""
    if not isinstance(notes, dict) or not isinstance(notes.get("report"), dict):
        return []
    r = notes["report"]
    lost = r.get("lost_ids") or []
    more = ", …" if int(r.get("lost_objects", 0)) > len(lost) else ""
    return [f"annotations: {notes.get('source')} ({', '.join(map(str, notes.get('files', [])))}), overlap "
            f"{notes.get('overlap')}, crowd {notes.get('crowd')}; classes from {notes.get('classes_from')}",
            f"  {r.get('objects', 0)} objects in {r.get('samples', 0)} samples: {r.get('painted_over', 0)} pixels "
            f"painted over by a later object, {r.get('overlap_ignored', 0)} set to ignore as overlaps, "
            f"{r.get('crowd_pixels', 0)} crowd pixels, {100 * float(r.get('unlabelled_share', 0)):.2f} % unlabelled",
            f"  {r.get('clipped', 0)} shapes clipped by the image border, {r.get('degenerate', 0)} degenerate, "
            f"{r.get('lost_objects', 0)} objects with no visible pixel"
            + (f": {', '.join(map(str, lost[:10]))}{more}" if lost else "")]
