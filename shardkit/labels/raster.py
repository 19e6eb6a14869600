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

from ..support import jit

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
class Region:
    """A mask as its bounding box: the top-left pixel (``y0``, ``x0``) and the box's bool pixels, so that
    painting an object costs its box, not the image."""

    y0: int
    x0: int
    mask: np.ndarray

    @classmethod
    def of(cls, full: np.ndarray) -> Region:
        """The region of a full-image mask (empty: a 0x0 box)."""
        rows, cols = np.flatnonzero(full.any(axis=1)), np.flatnonzero(full.any(axis=0))
        if not rows.size:
            return cls(0, 0, np.zeros((0, 0), dtype=bool))
        return cls(int(rows[0]), int(cols[0]), full[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1])

    def full(self, h: int, w: int) -> np.ndarray:
        out = np.zeros((h, w), dtype=bool)
        bh, bw = self.mask.shape
        out[self.y0 : self.y0 + bh, self.x0 : self.x0 + bw] = self.mask
        return out

    @property
    def box(self) -> tuple[slice, slice]:
        bh, bw = self.mask.shape
        return slice(self.y0, self.y0 + bh), slice(self.x0, self.x0 + bw)


@dataclass
class Shape:
    """One object to paint: its class id (stored), mask region, and what the report needs."""

    ident: str
    class_id: int
    region: Region
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


def rle_region(counts: Sequence[int] | np.ndarray, h: int, w: int) -> Region:
    """The mask of COCO RLE counts (column-major runs, starting with background) as a region; counts must be
    non-negative and sum to exactly H×W."""
    c = np.asarray(counts, dtype=np.int64).ravel() if len(counts) else np.zeros(0, np.int64)
    if c.size and int(c.min()) < 0:
        raise ShapeError("RLE counts hold a negative run (overflow)")
    total = int(c.sum()) if c.size else 0
    if total != h * w:
        raise ShapeError(f"RLE counts sum to {total}, not H×W = {h}×{w} = {h * w}")
    ends = np.cumsum(c)
    ones = np.flatnonzero(c[1::2]) * 2 + 1  # the runs of ones that hold a pixel
    if not ones.size:
        return Region(0, 0, np.zeros((0, 0), dtype=bool))
    lo, hi = int(ends[ones[0]] - c[ones[0]]), int(ends[ones[-1]])  # [lo, hi) in column-major order
    c0, c1 = lo // h, (hi - 1) // h
    start = c0 * h
    values = np.zeros(ones[-1] - ones[0] + 1, dtype=bool)
    values[0::2] = True
    runs = c[ones[0] : ones[-1] + 1]
    flat = np.zeros((c1 - c0 + 1) * h, dtype=bool)
    flat[lo - start : hi - start] = np.repeat(values, runs)
    return _cropped(0, c0, flat.reshape(c1 - c0 + 1, h).T)


def _cropped(y0: int, x0: int, band: np.ndarray) -> Region:
    """A column band's region cropped to the rows (and columns) that hold a pixel."""
    rows = np.flatnonzero(band.any(axis=1))
    if not rows.size:
        return Region(0, 0, np.zeros((0, 0), dtype=bool))
    cols = np.flatnonzero(band.any(axis=0))
    return Region(y0 + int(rows[0]), x0 + int(cols[0]),
                  band[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1])


def rle_mask(counts: Sequence[int] | np.ndarray, h: int, w: int) -> np.ndarray:
    """The H×W bool mask of COCO RLE counts (:func:`rle_region`, whole)."""
    return rle_region(counts, h, w).full(h, w)


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


def check_polygons(polygons: Sequence[np.ndarray]) -> None:
    """:func:`check_polygon` for many float64 polygons at once (a whole annotation file): a
    :class:`ShapeError` whose ``args`` are (problem, index of the first bad polygon)."""
    if not polygons:
        return
    sizes = np.fromiter((p.size for p in polygons), dtype=np.int64, count=len(polygons))
    odd = np.flatnonzero(sizes % 2)
    if odd.size:
        raise ShapeError("polygon is not a flat list of x, y pairs", int(odd[0]))
    flat = np.concatenate(polygons)
    starts = np.cumsum(sizes) - sizes
    bad = ~np.isfinite(flat)
    if bad.any():
        raise ShapeError("polygon has a NaN or infinite coordinate", int(np.searchsorted(starts, np.argmax(bad),
                                                                                          side="right") - 1))
    far = np.abs(flat) > MAX_COORD
    if far.any():
        raise ShapeError(f"polygon has a coordinate beyond ±{MAX_COORD:g}",
                         int(np.searchsorted(starts, np.argmax(far), side="right") - 1))
    x = np.trunc(5.0 * flat[0::2] + 0.5)
    y = np.trunc(5.0 * flat[1::2] + 0.5)
    first = starts // 2
    last = first + sizes // 2 - 1
    keep = sizes > 0
    step = np.maximum(np.abs(np.diff(x, append=0.0)), np.abs(np.diff(y, append=0.0)))
    # each polygon's last vertex steps back to its first (the diff across polygons is replaced by that)
    step[last[keep]] = np.maximum(np.abs(x[first[keep]] - x[last[keep]]), np.abs(y[first[keep]] - y[last[keep]]))
    per = np.zeros(len(polygons))
    per[keep] = np.add.reduceat(step, first[keep]) + sizes[keep] // 2
    long = np.flatnonzero(per > MAX_WALK)
    if long.size:
        raise ShapeError(f"polygon boundary is {per[long[0]]:.0f} upsampled steps long (more than {MAX_WALK})",
                         int(long[0]))


def polygon_positions(xy: Sequence[float] | np.ndarray, h: int, w: int, *, checked: bool = False) -> np.ndarray:
    """Column-major boundary crossings of one polygon (x0, y0, x1, y1, …), pycocotools' ``rleFrPoly`` rule,
    vectorised: each position toggles the mask from there down its column (and on). ``checked``: ``xy`` is a
    float64 array :func:`check_polygon` already passed (the parent checks once; a worker does not again)."""
    pts = xy if checked and isinstance(xy, np.ndarray) else check_polygon(xy)
    kernels = KERNELS.get()
    if kernels is not None and pts.size:
        x = _trunc_int(5.0 * pts[0::2] + 0.5)
        y = _trunc_int(5.0 * pts[1::2] + 0.5)
        walk = int(np.maximum(np.abs(np.diff(np.append(x, x[:1]))), np.abs(np.diff(np.append(y, y[:1])))).sum())
        out = np.empty(walk + x.size, dtype=np.int64)
        n = kernels[0](x, y, h, w, out)
        return out[:n]
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


def _poly_loop(x: np.ndarray, y: np.ndarray, h: int, w: int, out: np.ndarray) -> int:  # pragma: no cover - numba
    """pycocotools' ``rleFrPoly`` boundary walk and downsampling as its C loops (compiled by numba; the numpy
    code of :func:`polygon_positions` computes the same): the crossings into ``out``, their count returned."""
    k = x.size
    m = 0
    pu = pv = 0
    have = False
    for j in range(k):
        xs, ys = x[j], y[j]
        xe, ye = x[(j + 1) % k], y[(j + 1) % k]
        dx, dy = abs(xe - xs), abs(ys - ye)
        flip = (dx >= dy and xs > xe) or (dx < dy and ys > ye)
        if flip:
            xs, xe = xe, xs
            ys, ye = ye, ys
        steps = dx if dx >= dy else dy
        s = 0.0
        if steps != 0:
            s = (ye - ys) / dx if dx >= dy else (xe - xs) / dy
        for d in range(steps + 1):
            t = steps - d if flip else d
            if dx >= dy:
                u = t + xs
                v = int((ys + s * t) + 0.5)
            else:
                v = t + ys
                u = int((xs + s * t) + 0.5)
            if have and u != pu:
                xd = float(u if u < pu else u - 1)
                xd = (xd + 0.5) / 5.0 - 0.5
                if np.floor(xd) == xd and xd >= 0 and xd <= w - 1:
                    yd = float(v if v < pv else pv)
                    yd = (yd + 0.5) / 5.0 - 0.5
                    yd = 0.0 if yd < 0 else (float(h) if yd > h else yd)
                    out[m] = int(xd) * h + int(np.ceil(yd))
                    m += 1
            pu, pv, have = u, v, True
    return m


def _warm(kernels: tuple[Any, ...]) -> None:
    """Compile (or load from numba's cache) the kernel now, so a compiler failure shows here."""
    out = np.empty(64, dtype=np.int64)
    kernels[0](np.array([0, 10, 0], np.int64), np.array([0, 0, 10], np.int64), 4, 4, out)


#: The compiled polygon walk (numba, when installed; else the numpy code runs).
KERNELS = jit.LazyKernels((_poly_loop,), _warm, "COCO polygon")


def positions_region(positions: np.ndarray, h: int, w: int) -> Region:
    """The mask whose column-major pixels toggle at each of ``positions`` (an odd count toggles), as a region."""
    pos = np.sort(positions[positions < h * w])
    if not pos.size:
        return Region(0, 0, np.zeros((0, 0), dtype=bool))
    # toggles at a position an even number of times cancel: keep the positions held an odd number of times
    starts = np.flatnonzero(np.r_[True, pos[1:] != pos[:-1]])
    odd = (np.diff(np.r_[starts, pos.size]) & 1).astype(bool)
    toggles = pos[starts[odd]]
    if not toggles.size:
        return Region(0, 0, np.zeros((0, 0), dtype=bool))
    if toggles.size & 1:  # an open toggle runs to the end of the image
        toggles = np.r_[toggles, h * w]
    lo, hi = int(toggles[0]), int(toggles[-1])  # pixels [lo, hi) hold the mask
    c0, c1 = lo // h, (hi - 1) // h
    start = c0 * h
    values = np.zeros(toggles.size - 1, dtype=bool)
    values[0::2] = True
    flat = np.zeros((c1 - c0 + 1) * h, dtype=bool)
    flat[lo - start : hi - start] = np.repeat(values, np.diff(toggles))
    return _cropped(0, c0, flat.reshape(c1 - c0 + 1, h).T)


def polygons_region(polygons: Sequence[Sequence[float]], h: int, w: int, *, checked: bool = False) -> Region:
    """The union of COCO polygons (pycocotools: each polygon's RLE, merged by OR) as a region (``checked``: see
    :func:`polygon_positions`)."""
    parts = [r for poly in polygons
             if (r := positions_region(polygon_positions(poly, h, w, checked=checked), h, w)).mask.size]
    if len(parts) <= 1:
        return parts[0] if parts else Region(0, 0, np.zeros((0, 0), dtype=bool))
    y0, x0 = min(r.y0 for r in parts), min(r.x0 for r in parts)
    y1 = max(r.y0 + r.mask.shape[0] for r in parts)
    x1 = max(r.x0 + r.mask.shape[1] for r in parts)
    out = np.zeros((y1 - y0, x1 - x0), dtype=bool)
    for r in parts:
        bh, bw = r.mask.shape
        out[r.y0 - y0 : r.y0 - y0 + bh, r.x0 - x0 : r.x0 - x0 + bw] |= r.mask
    return Region(y0, x0, out)


def polygons_mask(polygons: Sequence[Sequence[float]], h: int, w: int) -> np.ndarray:
    """The H×W union of COCO polygons (:func:`polygons_region`, whole)."""
    return polygons_region(polygons, h, w).full(h, w)


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
    """The id image of ``shapes`` under the overlap and crowd policies, and its report.

    Each object costs its box: the ids, and a full-image array of which object shows at each pixel (-1: none,
    -2: ignore), are painted box by box; each object's visible pixels are counted as later ones cover them."""
    n = len(shapes)
    report = RasterReport(samples=1, objects=n, pixels=h * w)
    owner = np.full((h, w), -1, dtype=np.int16 if n < 32000 else np.int32)  # which object shows at a pixel
    ids = np.full((h, w), background, dtype=dtype)
    order = list(range(n))
    if overlap == "z-order":
        order.sort(key=lambda i: shapes[i].z)
    elif overlap == "area":
        order.sort(key=lambda i: -int(np.count_nonzero(shapes[i].region.mask)))
    classes = np.asarray([s.class_id for s in shapes], dtype=np.int64)
    conflict = np.zeros((h, w), dtype=bool) if overlap == "ignore" else None
    crowd_mask = np.zeros((h, w), dtype=bool) if any(s.crowd for s in shapes) else None
    alive = np.zeros(n, dtype=np.int64)  # pixels each object still shows
    for i in order:
        s = shapes[i]
        report.clipped += s.clipped
        report.degenerate += s.degenerate
        m = s.region.mask
        if not m.size:
            continue
        box = s.region.box
        if s.crowd and crowd_mask is not None:
            crowd_mask[box] |= m
            if crowd != "class":
                continue
        under = owner[box]
        covered = m & (under >= 0)
        k = int(np.count_nonzero(covered))
        if k:
            report.painted_over += k
            alive -= np.bincount(under[covered], minlength=n)
            if conflict is not None:
                conflict[box] |= covered & (classes[np.maximum(under, 0)] != s.class_id)
        np.copyto(under, i, where=m)
        np.copyto(ids[box], s.class_id, where=m)
        alive[i] = int(np.count_nonzero(m))
    ignored = 0
    for name, where in (("crowd", crowd_mask if crowd == "ignore" else None), ("overlap", conflict)):
        if where is None or ignore is None:
            continue
        count = int(np.count_nonzero(where))
        if name == "crowd":
            report.crowd_pixels = count
        else:
            report.overlap_ignored = count
        shown = where & (owner >= 0)
        alive -= np.bincount(owner[shown], minlength=n)
        ignored += count - int(np.count_nonzero(where & (owner == -2)))
        owner[where] = -2
        ids[where] = ignore
    if crowd_mask is not None and crowd != "ignore":
        report.crowd_pixels = int(np.count_nonzero(crowd_mask))
    report.unlabelled = h * w - int(alive.sum()) - ignored
    for i, s in enumerate(shapes):
        if alive[i] == 0 and not (s.crowd and crowd != "class"):
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
