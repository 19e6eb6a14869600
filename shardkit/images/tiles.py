"""Tiling large sources into fixed-size samples, their provenance, and stitching per-tile predictions back.

``convert --tile 512x512 --stride 384`` (or ``--overlap 128``) stores each source image as a grid of tiles
instead of one sample. The grid is a pure function of the source's size and the options:

- along each axis the tiles start at ``0, s, 2s, …`` while they fit, and **the last tile is aligned to the
  image edge** (it starts at ``n - t``) instead of running past it, so every source pixel is covered, no tile
  holds padding where the source is large enough, and no start repeats;
- a source smaller than the tile along an axis gets one tile there, padded at the bottom / right (images with
  0, labels with the ignore index);
- tiles are ordered row-major (y, then x) within a source, and sources keep the plan's order, so the output is
  the same for any worker count.

Each stored tile records its provenance (:class:`Tile`: source key, y, x, h, w, source size) in the samples
sidecar's optional ``tile`` column (formats/samples.md). :func:`stitch` puts per-tile predictions back on one
source's grid; :func:`by_source` groups a split's tiles per source.

Sources larger than ``--max-pixels`` are read window by window when they are tiled TIFFs
(:class:`TiledTiff`: only the TIFF tiles under the current row of windows are decoded and kept), and refused
otherwise — nothing here ever holds such a source whole.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DecodeError, LabelError
from ..support.limits import STITCH_MAX_BYTES, STITCH_MAX_PIXELS

log = logging.getLogger(__name__)

_PAIR_RE = re.compile(r"^\s*(\d+)\s*(?:[xX×,]\s*(\d+))?\s*$")
#: Names of the sidecar ``tile`` column's six values, in order (formats/samples.md).
TILE_FIELDS = ("y", "x", "height", "width", "source_height", "source_width")
#: Largest compressed TIFF tile (bytes) read for one tile of ``n`` decoded bytes: ``2 n + this``.
_SEGMENT_SLACK = 1 << 20
#: The fix of every "cannot be read window by window" error.
TILED_FIX = ("re-save it as a tiled TIFF (e.g. tifffile.imwrite(path, data, tile=(256, 256)) or gdal_translate "
              "-co TILED=YES), raise --max-pixels, or --on-error skip")


def parse_pair(text: str | int | Sequence[int] | None, flag: str) -> tuple[int, int] | None:
    """``"512x384"`` → (512, 384) (height x width); ``"512"`` or 512 → (512, 512); None stays None."""
    if text is None or text == "":
        return None
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        h = w = int(text)
    elif isinstance(text, str):
        m = _PAIR_RE.match(text)
        if not m:
            raise ConfigError(f"{flag} {text!r} is not HEIGHTxWIDTH or one number", fix=f"write it like {flag} 512x512")
        h, w = int(m.group(1)), int(m.group(2) or m.group(1))
    else:
        try:
            h, w = (int(v) for v in text)  # type: ignore[union-attr]
        except (TypeError, ValueError):
            raise ConfigError(f"{flag} {text!r} is not (height, width)", fix=f"write it like {flag} 512x512") from None
    return h, w


def untiled_source(path: Path, kind: str, height: int, width: int, max_pixels: int) -> DecodeError:
    """The error for a source above ``--max-pixels`` that cannot be read window by window (not a TIFF)."""
    return DecodeError(f"image is {height}x{width} = {height * width} pixels, more than --max-pixels {max_pixels}, "
                       f"and a {kind} file: only tiled TIFFs are read window by window", path=path, fix=TILED_FIX)


@dataclass(frozen=True)
class Tiling:
    """The tiling options of a conversion: tile size, stride (both (height, width)) and the drop threshold."""

    tile: tuple[int, int]
    stride: tuple[int, int]
    #: drop a tile when at least this share of its stored label pixels is the ignore index (None: keep all)
    drop_ignored: float | None = None

    @classmethod
    def from_options(cls, tile: Any, stride: Any = None, overlap: Any = None,
                     drop_ignored: float | str | None = None) -> Tiling | None:
        """The tiling of ``--tile/--stride/--overlap/--drop-tiles-ignored``; None without ``--tile``.

        ``stride`` defaults to the tile (no overlap); ``overlap`` o means ``stride = tile - o``. A stride larger
        than the tile would leave pixels uncovered and is refused.
        """
        size = parse_pair(tile, "--tile")
        step, over = parse_pair(stride, "--stride"), parse_pair(overlap, "--overlap")
        if size is None:
            for name, value in (("--stride", step), ("--overlap", over), ("--drop-tiles-ignored", drop_ignored)):
                if value is not None:
                    raise ConfigError(f"{name} needs --tile", fix="add --tile HxW, e.g. --tile 512x512")
            return None
        if min(size) < 1:
            raise ConfigError(f"--tile {size[0]}x{size[1]} must be at least 1x1")
        if step is not None and over is not None:
            raise ConfigError("--stride and --overlap both given", fix="pass one: --overlap O means --stride TILE-O")
        if over is not None:
            if not (0 <= over[0] < size[0] and 0 <= over[1] < size[1]):
                raise ConfigError(f"--overlap {over[0]}x{over[1]} must be at least 0 and smaller than --tile "
                                  f"{size[0]}x{size[1]}")
            step = (size[0] - over[0], size[1] - over[1])
        step = step or size
        if not (1 <= step[0] <= size[0] and 1 <= step[1] <= size[1]):
            raise ConfigError(f"--stride {step[0]}x{step[1]} must be 1..the tile size {size[0]}x{size[1]} per axis "
                              "(a larger stride would leave pixels uncovered)", fix="choose a smaller --stride")
        threshold = None
        if drop_ignored is not None:
            try:
                threshold = float(drop_ignored)
            except ValueError:
                raise ConfigError(f"--drop-tiles-ignored {drop_ignored!r} is not a number",
                                  fix="write it like --drop-tiles-ignored 0.95") from None
            if not 0.0 < threshold <= 1.0:
                raise ConfigError(f"--drop-tiles-ignored {drop_ignored} must be in (0, 1]",
                                  fix="write it like --drop-tiles-ignored 0.95")
        return cls(size, step, threshold)

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``preprocessing`` keys (hashed into every fingerprint)."""
        return {"tile": list(self.tile), "stride": list(self.stride), "drop_tiles_ignored": self.drop_ignored}

    def windows(self, hw: tuple[int, int]) -> list[tuple[int, int, int, int]]:
        """The (y, x, h, w) source regions of a source of size ``hw``, row-major."""
        ys = grid_starts(hw[0], self.tile[0], self.stride[0])
        xs = grid_starts(hw[1], self.tile[1], self.stride[1])
        th, tw = min(self.tile[0], hw[0]), min(self.tile[1], hw[1])
        return [(y, x, th, tw) for y in ys for x in xs]

    def count(self, hw: tuple[int, int]) -> int:
        """How many tiles a source of size ``hw`` gives (before any is dropped)."""
        return _starts(hw[0], self.tile[0], self.stride[0]) * _starts(hw[1], self.tile[1], self.stride[1])

    def ratio(self, hw: tuple[int, int]) -> float:
        """Pixels the tiles of a source of size ``hw`` store per pixel of the source, padding left out: per axis,
        the tiles' total length over the source's (over the tile's, for a source no longer than one tile). 1 without
        overlap (plus the edge tile's), about (tile / stride)^2 with it."""
        along = [_starts(n, t, s) * t / max(n, t) for n, t, s in zip(hw, self.tile, self.stride, strict=True)]
        return along[0] * along[1]

    def check_output(self, hw: tuple[int, int], source: Path, max_ratio: float, tile_bytes: int) -> int:
        """The tiles a source of size ``hw`` gives, refused (one line, before anything is decoded) when they would
        store more than ``max_ratio`` times its pixels (``--max-tile-ratio``)."""
        n = self.count(hw)
        ratio = self.ratio(hw)
        if ratio > max_ratio:
            (th, tw), (sh, sw) = self.tile, self.stride
            wider = (max(sh, -(-th // 2)), max(sw, -(-tw // 2)))
            raise ConfigError(f"--tile {th}x{tw} --stride {sh}x{sw} would store {n:,} tiles "
                              f"({n * tile_bytes / 1e6:,.0f} MB) of this {hw[0]}x{hw[1]} source, {ratio:.1f} times "
                              "its pixels, more than "
                              f"--max-tile-ratio {max_ratio:g}", path=source,
                              fix=f"use a larger --stride (--stride {wider[0]}x{wider[1]}: half-tile overlap), or "
                                  "raise --max-tile-ratio to mean it")
        return n


def _starts(n: int, tile: int, stride: int) -> int:
    """``len(grid_starts(n, tile, stride))``, without the list."""
    return 1 if n <= tile else -(-(n - tile) // stride) + 1


def grid_starts(n: int, tile: int, stride: int) -> list[int]:
    """Tile starts along an axis of length ``n``: ``0, s, 2s, …`` below ``n - tile``, then ``n - tile`` (the
    last tile aligned to the edge); ``[0]`` when the axis is no longer than one tile."""
    if n <= tile:
        return [0]
    starts = list(range(0, n - tile, stride))
    starts.append(n - tile)
    return starts


@dataclass(frozen=True)
class Tile:
    """Where a stored tile came from: the region ``[y:y+height, x:x+width]`` of source ``key``, whose size is
    ``source_height x source_width``. The region is the stored sample's top-left corner; the rest of the stored
    sample (only where the source is smaller than the tile) is padding."""

    key: str
    y: int
    x: int
    height: int
    width: int
    source_height: int
    source_width: int

    @property
    def values(self) -> tuple[int, int, int, int, int, int]:
        """The sidecar column's six values (:data:`TILE_FIELDS` order)."""
        return self.y, self.x, self.height, self.width, self.source_height, self.source_width

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Tile | None:
        """The provenance of a ``Manifest.samples`` record; None for a sample that is not a tile."""
        tile = record.get("tile")
        if tile is None:
            return None
        return cls(str(record["key"]), *(int(tile[f]) for f in TILE_FIELDS))


def owned_box(tile: Tile, tiling: Tiling) -> tuple[int, int, int, int]:
    """(y0, y1, x0, x1) in the stored tile: the part of its source region that no earlier tile of its source (grid
    order: row-major) covers. Over a source's tiles these boxes partition the source, each pixel in exactly one
    box and no padding in any, so statistics summed over them count every real pixel once (overlaps included).

    Along an axis the earlier tiles of a row (or the earlier rows) reach ``previous start + tile``; as the starts
    rise and the stride is at most the tile, what is left of this tile is one rectangle."""
    ys = grid_starts(tile.source_height, tiling.tile[0], tiling.stride[0])
    xs = grid_starts(tile.source_width, tiling.tile[1], tiling.stride[1])
    try:
        row, col = ys.index(tile.y), xs.index(tile.x)
    except ValueError:
        raise ValueError(f"tile {tile} is not on the {tiling.tile} / {tiling.stride} grid of its source") from None
    top = ys[row - 1] + tile.height - tile.y if row else 0
    left = xs[col - 1] + tile.width - tile.x if col else 0
    return max(top, 0), tile.height, max(left, 0), tile.width


def pad_to(arr: np.ndarray, size: tuple[int, int], fill: int | float) -> np.ndarray:
    """``arr`` (H, W[, C]) with H, W ≤ ``size``, padded at the bottom and right to exactly ``size`` with ``fill``."""
    h, w = arr.shape[:2]
    if (h, w) == size:
        return np.ascontiguousarray(arr)
    out = np.full((*size, *arr.shape[2:]), fill, dtype=arr.dtype)
    out[:h, :w] = arr
    return out


def ignored_share(ids: np.ndarray, ignore_index: int | None) -> float:
    """The share of a stored tile's label pixels (padding included) that are the ignore index."""
    if ignore_index is None or ids.size == 0:
        return 0.0
    return float(np.count_nonzero(ids == ignore_index)) / ids.size


# -- reading sources -----------------------------------------------------------------------------------------


class TiledTiff:
    """Windows of a tiled TIFF, decoded TIFF tile by TIFF tile (``tifffile``): its one full-resolution page, or
    with ``pages_as_bands`` every page, each page's samples as bands in page order (as a whole decode gives them).

    The file's pages are checked as a whole decode checks them (:func:`~shardkit.images.imageio.tiff_band_pages`):
    several
    pages without ``pages_as_bands``, or pages that differ, are refused, never read as page 1. Decoded TIFF tiles
    are kept in a least-recently-used cache of ``cache_tiles`` entries: windows visited row-major with the tile
    grid's overlap decode each TIFF tile about once, and memory stays at the cache (e.g. one band of the source
    as tall as a window plus two TIFF tiles, per page), whatever the file's size.
    """

    def __init__(self, path: Path, what: str, max_tile_pixels: int, *, pages_as_bands: bool = False) -> None:
        import tifffile  # only conversions of sources too large to decode whole need it

        # cv2 and PIL (through imageio) stay off the read path, which imports this module for Tile
        from .imageio import tiff_band_pages

        self.path, self.what = Path(path), what
        self.cache_tiles = 1
        self._cache: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self.decoded = 0  # TIFF tiles decoded (the benchmark reads it)
        try:
            self._file = tifffile.TiffFile(self.path)
        except Exception as exc:  # tifffile raises TiffFileError, ValueError, struct.error … on a bad file
            raise DecodeError(f"cannot read {what} as a TIFF ({_first_line(exc)})", path=self.path,
                              fix=TILED_FIX) from None
        try:
            self.pages = tiff_band_pages(self._file, self.path, what, pages_as_bands)
            page = self.pages[0]
            for p in self.pages:
                if not p.is_tiled or p.tiledepth != 1 or p.imagedepth != 1:
                    raise DecodeError(f"{what} is a TIFF but not a tiled one (it is stored in strips), so it cannot "
                                      "be read window by window", path=self.path, fix=TILED_FIX)
                if (int(p.tilelength), int(p.tilewidth), int(p.planarconfig)) != \
                        (int(page.tilelength), int(page.tilewidth), int(page.planarconfig)):
                    raise DecodeError(f"{what}'s TIFF pages are tiled differently ({page.tilelength}x{page.tilewidth}"
                                      f" and {p.tilelength}x{p.tilewidth} tiles, or chunky and planar)",
                                      path=self.path, fix=TILED_FIX)
            self.height, self.width = int(page.imagelength), int(page.imagewidth)
            self.page_samples = int(page.samplesperpixel)
            self.samples = self.page_samples * len(self.pages)
            self.planar = int(page.planarconfig) == 2
            self.dtype = np.dtype(page.dtype)
            self.tile_h, self.tile_w = int(page.tilelength), int(page.tilewidth)
        except DecodeError:
            self.close()
            raise
        except Exception as exc:
            self.close()
            raise DecodeError(f"cannot read {what}'s TIFF header ({_first_line(exc)})", path=self.path,
                              fix=TILED_FIX) from None
        if self.tile_h < 1 or self.tile_w < 1 or self.tile_h * self.tile_w > max_tile_pixels:
            self.close()
            raise DecodeError(f"{what}'s TIFF tiles are {self.tile_h}x{self.tile_w} pixels, more than --max-pixels "
                              f"{max_tile_pixels}", path=self.path, fix=TILED_FIX)
        self.across = -(-self.width // self.tile_w)
        self.down = -(-self.height // self.tile_h)
        self.planes = self.page_samples if self.planar else 1  # segments per tile position in a page
        for p in self.pages:
            if len(p.dataoffsets) != self.across * self.down * self.planes \
                    or len(p.databytecounts) != len(p.dataoffsets):
                self.close()
                raise DecodeError(f"{what}'s TIFF tile table has {len(p.dataoffsets)} entries, its size needs "
                                  f"{self.across * self.down * self.planes}", path=self.path, fix=TILED_FIX)

    @property
    def shape(self) -> tuple[int, ...]:
        """(H, W) or (H, W, C) of the bands read, as tifffile would return one page of them."""
        return (self.height, self.width) if self.samples == 1 else (self.height, self.width, self.samples)

    def plan_cache(self, window_h: int) -> None:
        """Keep enough TIFF tiles for one row of windows ``window_h`` tall (plus one TIFF tile row), every page."""
        rows = -(-window_h // self.tile_h) + 1
        self.cache_tiles = max(1, rows * self.across * self.planes * len(self.pages))

    def close(self) -> None:
        self._cache.clear()
        self._file.close()

    def __enter__(self) -> TiledTiff:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _segment(self, page_no: int, index: int) -> np.ndarray:
        """TIFF tile ``index`` of page ``page_no`` (of :attr:`pages`) decoded, (tile_h, tile_w, samples-in-segment)."""
        key = (page_no, index)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        page = self.pages[page_no]
        per_sample = 1 if self.planar else self.page_samples
        want = self.tile_h * self.tile_w * per_sample * self.dtype.itemsize
        offset, count = int(page.dataoffsets[index]), int(page.databytecounts[index])
        where = f"TIFF tile {index}" + (f" of page {page_no + 1}" if len(self.pages) > 1 else "")
        if count > 2 * want + _SEGMENT_SLACK:
            raise DecodeError(f"{self.what}'s {where} claims {count} bytes, more than a "
                              f"{self.tile_h}x{self.tile_w} tile can need", path=self.path, fix=TILED_FIX)
        try:
            fh = self._file.filehandle
            fh.seek(offset)
            data = fh.read(count) if count else None
            seg, _, _ = page.decode(data, index, jpegtables=page.jpegtables)
        except Exception as exc:
            raise DecodeError(f"cannot decode {self.what}'s {where} ({_first_line(exc)})", path=self.path,
                              fix=TILED_FIX) from None
        if seg is None:  # an empty tile (no bytes): tifffile fills nothing; TIFF says it is 0
            seg = np.zeros((self.tile_h, self.tile_w, per_sample), self.dtype)
        seg = np.asarray(seg).reshape(-1, *np.asarray(seg).shape[-3:])[0]  # drop the depth axis
        if seg.shape[2] != per_sample or seg.shape[0] > self.tile_h or seg.shape[1] > self.tile_w:
            raise DecodeError(f"{self.what}'s {where} decodes to {seg.shape}, not a "
                              f"{self.tile_h}x{self.tile_w}x{per_sample} tile", path=self.path, fix=TILED_FIX)
        self.decoded += 1
        self._cache[key] = seg
        while len(self._cache) > self.cache_tiles:
            self._cache.popitem(last=False)
        return seg

    def read(self, y: int, x: int, h: int, w: int) -> np.ndarray:
        """The window ``[y:y+h, x:x+w]`` as (h, w) or (h, w, C) of the pages' dtype, C the samples of every page."""
        if min(y, x) < 0 or min(h, w) < 1 or y + h > self.height or x + w > self.width:
            raise ValueError(f"window {y},{x} {h}x{w} outside {self.height}x{self.width}")
        out = np.empty((h, w, self.samples), self.dtype)
        per_plane = self.across * self.down
        for ty in range(y // self.tile_h, (y + h - 1) // self.tile_h + 1):
            for tx in range(x // self.tile_w, (x + w - 1) // self.tile_w + 1):
                y0, x0 = ty * self.tile_h, tx * self.tile_w
                sy, sx = max(y, y0), max(x, x0)
                ey, ex = min(y + h, y0 + self.tile_h), min(x + w, x0 + self.tile_w)
                for page_no in range(len(self.pages)):
                    band = page_no * self.page_samples  # the page's first band in ``out``
                    for plane in range(self.planes):
                        seg = self._segment(page_no, plane * per_plane + ty * self.across + tx)
                        part = seg[sy - y0 : ey - y0, sx - x0 : ex - x0]
                        if part.shape[:2] != (ey - sy, ex - sx):
                            raise DecodeError(f"{self.what}'s TIFF tile at {y0},{x0} is smaller than the tile grid",
                                              path=self.path, fix=TILED_FIX)
                        if self.planar:
                            out[sy - y : ey - y, sx - x : ex - x, band + plane] = part[:, :, 0]
                        else:
                            out[sy - y : ey - y, sx - x : ex - x, band : band + self.page_samples] = part
        return out[:, :, 0] if self.samples == 1 else out


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:120]


@dataclass
class TileCounts:
    """One shard's tiling counts (the worker's; summed into the manifest's ``source.tiles``)."""

    sources: int = 0
    written: int = 0
    dropped: int = 0

    def to_json(self) -> dict[str, int]:
        return {"sources": self.sources, "written": self.written, "dropped_ignored": self.dropped}

    def merge(self, d: Mapping[str, Any]) -> None:
        self.sources += int(d.get("sources", 0))
        self.written += int(d.get("written", 0))
        self.dropped += int(d.get("dropped_ignored", 0))


def tiles_in_memory(key: str, image: np.ndarray, ids: np.ndarray, tiling: Tiling,
                    pad_label: int) -> Iterator[tuple[Tile, np.ndarray, np.ndarray]]:
    """Cut a decoded source (image and its label ids, same H x W) into its tiles, in grid order."""
    hw = (int(image.shape[0]), int(image.shape[1]))
    for y, x, h, w in tiling.windows(hw):
        yield (Tile(key, y, x, h, w, *hw), pad_to(image[y : y + h, x : x + w], tiling.tile, 0),
               pad_to(ids[y : y + h, x : x + w], tiling.tile, pad_label))


def tiles_windowed(key: str, image_path: Path, label_path: Path, tiling: Tiling, max_pixels: int,
                   decode_label: Callable[[np.ndarray, Path], np.ndarray], pad_label: int,
                   ignore_index: int | None, to_image: Callable[[np.ndarray], np.ndarray],
                   pages_as_bands: bool = False) -> Iterator[tuple[Tile, np.ndarray, np.ndarray] | None]:
    """Cut a source too large to decode whole (both files tiled TIFFs of one size) into its tiles, reading
    only the windows; yields None for a tile dropped by ``tiling.drop_ignored`` (its image is never read).

    ``decode_label``: raw label window → stored ids (the conversion's label decoder, with its checks);
    ``to_image``: raw image window → the stored image (the conversion's image rule: bands, type);
    ``pages_as_bands``: the image's pages are its bands (``--pages-as-bands``; a label is always one page).
    """
    if tiling.tile[0] * tiling.tile[1] > max_pixels:
        raise ConfigError(f"--tile {tiling.tile[0]}x{tiling.tile[1]} is more than --max-pixels {max_pixels}")
    with TiledTiff(image_path, "image", max_pixels, pages_as_bands=pages_as_bands) as img, \
            TiledTiff(label_path, "label", max_pixels) as lab:
        if (img.height, img.width) != (lab.height, lab.width):
            raise LabelError(f"label is {lab.height}x{lab.width} (HxW) but its image is {img.height}x{img.width}",
                             path=label_path, fix="re-export the label at the image size")
        hw = (img.height, img.width)
        window_h = min(tiling.tile[0], hw[0])
        img.plan_cache(window_h)
        lab.plan_cache(window_h)
        log.debug("%s: %dx%d read window by window (%dx%d TIFF tiles)", image_path, *hw, img.tile_h, img.tile_w)
        for y, x, h, w in tiling.windows(hw):
            ids = pad_to(decode_label(lab.read(y, x, h, w), label_path), tiling.tile, pad_label)
            if tiling.drop_ignored is not None and ignored_share(ids, ignore_index) >= tiling.drop_ignored:
                yield None
                continue
            image = pad_to(to_image(img.read(y, x, h, w)), tiling.tile, 0)
            yield Tile(key, y, x, h, w, *hw), image, ids


# -- stitching ------------------------------------------------------------------------------------------------


def by_source(tiles: Iterable[Tile | None]) -> dict[str, list[int]]:
    """Sample indices grouped by source key, in order of first appearance (the conversion's order)."""
    out: dict[str, list[int]] = {}
    for i, t in enumerate(tiles):
        if t is None:
            raise ValueError(f"sample {i} is not a tile (converted without --tile)")
        out.setdefault(t.key, []).append(i)
    return out


def weight_window(kind: str | np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A (h, w) float64 weight window: ``"mean"`` (all 1: plain overlap averaging), ``"hann"`` (a 2-D Hann
    window sampled strictly inside its zeros, so every pixel keeps a positive weight), or a given array."""
    if isinstance(kind, np.ndarray):
        w = np.asarray(kind, np.float64)
        if w.shape != size or not np.isfinite(w).all() or (w < 0).any():
            raise ValueError(f"weight window of shape {w.shape} must be {size} finite values >= 0")
        return w
    if kind == "mean":
        return np.ones(size, np.float64)
    if kind == "hann":
        wy = np.hanning(size[0] + 2)[1:-1]
        wx = np.hanning(size[1] + 2)[1:-1]
        return np.outer(wy, wx)
    raise ValueError(f"weight window {kind!r} is not 'mean', 'hann' or an array")


def stitch(predictions: Sequence[np.ndarray] | np.ndarray, tiles: Sequence[Tile], *, reduce: str = "mean",
           window: str | np.ndarray = "mean", max_pixels: int = STITCH_MAX_PIXELS,
           max_bytes: int = STITCH_MAX_BYTES) -> np.ndarray:
    """Put one source's per-tile predictions back on its grid.

    ``predictions[k]`` belongs to ``tiles[k]`` (all of one source) and has the stored tile's (height, width),
    optionally followed by channels: (th, tw) or (th, tw, C) — logits, probabilities, class ids. Only each
    tile's source region (its top-left ``height x width``) is used; padding is cut off.

    ``reduce="mean"``: overlapping values are averaged with the weight ``window`` (``"mean"``, ``"hann"`` or
    an array; see :func:`weight_window`) → float32. For floating-point predictions only: averaging class ids
    would invent ids between two classes, so integer predictions with ``"mean"`` are a ValueError.

    ``reduce="vote"``: per pixel the value most tiles agree on (ties: the smallest); for class ids (any integer
    dtype, kept). Stitching a source's stored label tiles this way returns the source label exactly.

    Pixels no tile covers (only when tiles were dropped by ``--drop-tiles-ignored``) are NaN with ``"mean"``
    and raise with ``"vote"`` unless covered. Returns (H, W) or (H, W, C).

    Memory: the output (channels counted) and the working rows, a band of rows at a time, stay within
    ``max_bytes``; a source whose output and one working row do not fit is refused with a ValueError before
    anything is allocated.
    """
    if not len(tiles):
        raise ValueError("no tiles to stitch")
    if len(predictions) != len(tiles):
        raise ValueError(f"{len(predictions)} predictions for {len(tiles)} tiles")
    first = tiles[0]
    hw = (first.source_height, first.source_width)
    for t in tiles:
        if t.key != first.key or (t.source_height, t.source_width) != hw:
            raise ValueError(f"tiles of more than one source ({first.key!r}, {t.key!r}): stitch one source at a "
                             "time (see by_source)")
        if min(t.y, t.x) < 0 or min(t.height, t.width) < 1 or t.y + t.height > hw[0] or t.x + t.width > hw[1]:
            raise ValueError(f"tile {t} lies outside its source")
    if hw[0] * hw[1] > max_pixels:
        raise ValueError(f"source {first.key!r} is {hw[0]}x{hw[1]} pixels, more than max_pixels={max_pixels}")
    pred0 = np.asarray(predictions[0])
    extra = pred0.shape[2:]
    if pred0.ndim not in (2, 3):
        raise ValueError(f"a prediction must be (h, w) or (h, w, C), not {pred0.shape}")
    if reduce == "mean":
        if not np.issubdtype(pred0.dtype, np.floating):
            raise ValueError("averaging integer predictions (class ids) would invent ids between classes: pass "
                             "reduce='vote' for ids, or stitch logits / probabilities")
        return _stitch_mean(predictions, tiles, hw, extra, window, max_bytes)
    if reduce == "vote":
        if not np.issubdtype(pred0.dtype, np.integer) and pred0.dtype != np.bool_:
            raise ValueError(f"reduce='vote' takes class ids (an integer dtype), not {pred0.dtype}: use reduce='mean'")
        return _stitch_vote(predictions, tiles, hw, extra, max_bytes)
    raise ValueError(f"reduce={reduce!r} is not 'mean' or 'vote'")


def _checked(pred: Any, tile: Tile, extra: tuple[int, ...]) -> np.ndarray:
    arr = np.asarray(pred)
    if arr.shape[2:] != extra or arr.shape[0] < tile.height or arr.shape[1] < tile.width:
        raise ValueError(f"prediction of shape {arr.shape} does not hold tile {tile.y},{tile.x} "
                         f"({tile.height}x{tile.width}{'x' + str(extra[0]) if extra else ''})")
    return arr[: tile.height, : tile.width]


def _band_rows(key: str, hw: tuple[int, int], reduce: str, channels: int, out_bytes: int, row_bytes: int,
               max_bytes: int) -> int:
    """Rows stitched at a time: as many as fit in ``max_bytes`` beside the output; a ValueError (one line, before
    anything is allocated) when the output and one working row do not fit."""
    need = out_bytes + row_bytes
    if need > max_bytes:
        raise ValueError(f"stitching {key!r} ({hw[0]}x{hw[1]} pixels, {channels} channel{'s' * (channels != 1)}, "
                         f"reduce={reduce!r}) needs at least {need} bytes, more than max_bytes={max_bytes}: pass a "
                         "larger max_bytes, or stitch fewer channels (e.g. vote on per-tile argmax ids)")
    return max(1, min(hw[0], (max_bytes - out_bytes) // row_bytes))


def _band_tiles(tiles: Sequence[Tile]) -> Callable[[int, int], np.ndarray]:
    """``(r0, r1)`` → indices (in order) of the tiles that cover any of rows ``r0..r1-1``."""
    top = np.array([t.y for t in tiles], np.int64)
    bottom = top + np.array([t.height for t in tiles], np.int64)
    return lambda r0, r1: np.flatnonzero((top < r1) & (bottom > r0))


def _stitch_mean(predictions: Sequence[np.ndarray] | np.ndarray, tiles: Sequence[Tile], hw: tuple[int, int],
                 extra: tuple[int, ...], window: str | np.ndarray, max_bytes: int) -> np.ndarray:
    """Weighted means, a band of rows at a time: each pixel sums its tiles in tile order exactly as a whole-grid
    sum would, so the result does not depend on the band height."""
    channels = int(np.prod(extra, dtype=np.int64)) if extra else 1
    out_bytes = hw[0] * hw[1] * channels * 4
    row_bytes = hw[1] * (16 * channels + 8)  # float64 sums and their quotient, float64 weight totals
    rows = _band_rows(tiles[0].key, hw, "mean", channels, out_bytes, row_bytes, max_bytes)
    tile_hw = np.asarray(predictions[0]).shape[:2]
    weights = weight_window(window, (int(tile_hw[0]), int(tile_hw[1])))
    out = np.empty((*hw, *extra), np.float32)
    covering = _band_tiles(tiles)
    for r0 in range(0, hw[0], rows):
        r1 = min(r0 + rows, hw[0])
        acc = np.zeros((r1 - r0, hw[1], *extra), np.float64)
        total = np.zeros((r1 - r0, hw[1]), np.float64)
        for k in covering(r0, r1).tolist():
            t = tiles[k]
            a, b = max(t.y, r0), min(t.y + t.height, r1)
            part = _checked(predictions[k], t, extra)[a - t.y : b - t.y]
            w = weights[a - t.y : b - t.y, : t.width]
            acc[a - r0 : b - r0, t.x : t.x + t.width] += part * (w[..., None] if extra else w)
            total[a - r0 : b - r0, t.x : t.x + t.width] += w
        with np.errstate(invalid="ignore", divide="ignore"):
            acc /= total[..., None] if extra else total
        acc[total == 0] = np.nan
        out[r0:r1] = acc
        del acc, total  # before the next band's are allocated
    return out


def _stitch_vote(predictions: Sequence[np.ndarray] | np.ndarray, tiles: Sequence[Tile], hw: tuple[int, int],
                 extra: tuple[int, ...], max_bytes: int) -> np.ndarray:
    """Per pixel the most frequent value (ties: the smallest), a band of rows at a time: the band's covering values
    are sorted per pixel and the longest run wins, so memory is the band's values, never depth x H x W."""
    dtype = np.asarray(predictions[0]).dtype
    channels = int(np.prod(extra, dtype=np.int64)) if extra else 1
    key = tiles[0].key
    out_bytes = hw[0] * hw[1] * channels * dtype.itemsize
    # per row of a band: its values (int64, depth of them per pixel and channel, sorted in place), then the best
    # value, the run, the best count and three masks per value (:func:`_mode`), and the coverage counts
    per_value, per_row = hw[1] * channels * 8, hw[1] * (channels * (8 + 4 + 4 + 3) + 4)
    _band_rows(key, hw, "vote", channels, out_bytes, per_value + per_row, max_bytes)
    covering = _band_tiles(tiles)
    depth, uncovered = _row_depths(tiles, hw, covering, max(1, (max_bytes - out_bytes) // (hw[1] * 4)))
    if uncovered:
        raise ValueError(f"{uncovered} pixels of {key!r} are covered by no tile (tiles were dropped): "
                         "stitch them with reduce='mean' on scores, or fill them yourself")
    bands: list[tuple[int, int]] = []
    r0 = 0
    while r0 < hw[0]:  # as many rows as fit beside the output, at the band's deepest coverage
        r1, deepest = r0, 0
        while r1 < hw[0] and (r1 + 1 - r0) * (max(deepest, int(depth[r1])) * per_value + per_row) \
                <= max_bytes - out_bytes:
            deepest = max(deepest, int(depth[r1]))
            r1 += 1
        if r1 == r0:
            need = out_bytes + int(depth[r0]) * per_value + per_row
            raise ValueError(f"stitching {key!r} ({hw[0]}x{hw[1]} pixels, {channels} channel"
                             f"{'s' * (channels != 1)}, reduce='vote') needs at least {need} bytes (row {r0} is "
                             f"covered by {int(depth[r0])} tiles), more than max_bytes={max_bytes}: pass a larger "
                             "max_bytes, or tile with a larger stride")
        bands.append((r0, r1))
        r0 = r1
    out = np.empty((*hw, *extra), dtype)
    flat = out.reshape(hw[0], hw[1], channels)
    sentinel = np.iinfo(np.int64).min  # an unused slot: a value no id has, sorted first
    for r0, r1 in bands:
        # (rows, W, C, depth): each pixel's values contiguous, so the sort along them is in place
        layers = np.full((r1 - r0, hw[1], channels, int(depth[r0:r1].max())), sentinel, np.int64)
        filled = np.zeros((r1 - r0, hw[1], 1), np.int32)  # the next free slot of each pixel
        chans = np.arange(channels)[None, None, :]
        for k in covering(r0, r1).tolist():
            t = tiles[k]
            part = _checked(predictions[k], t, extra)
            if part.dtype != dtype:
                raise ValueError(f"predictions mix dtypes {dtype} and {part.dtype}")
            a, b = max(t.y, r0), min(t.y + t.height, r1)
            level = filled[a - r0 : b - r0, t.x : t.x + t.width]
            rows_at = np.arange(a - r0, b - r0)[:, None, None]
            cols_at = np.arange(t.x, t.x + t.width)[None, :, None]
            layers[rows_at, cols_at, chans, level] = part[a - t.y : b - t.y].reshape(b - a, t.width, channels)
            level += 1
        flat[r0:r1] = _mode(layers, sentinel)
        del layers, filled  # before the next band's are allocated
    return out


def _row_depths(tiles: Sequence[Tile], hw: tuple[int, int], covering: Callable[[int, int], np.ndarray],
                rows: int) -> tuple[np.ndarray, int]:
    """The most tiles covering one pixel of each row, and how many pixels no tile covers: coverage counted
    ``rows`` rows at a time (int32 counts, never the whole grid's when it does not fit)."""
    depth = np.zeros(hw[0], np.int64)
    uncovered = 0
    for r0 in range(0, hw[0], rows):
        r1 = min(r0 + rows, hw[0])
        cover = np.zeros((r1 - r0, hw[1]), np.int32)
        for k in covering(r0, r1).tolist():
            t = tiles[k]
            cover[max(t.y, r0) - r0 : min(t.y + t.height, r1) - r0, t.x : t.x + t.width] += 1
        depth[r0:r1] = cover.max(axis=1)
        uncovered += int(np.count_nonzero(cover == 0))
    return depth, uncovered


def _mode(layers: np.ndarray, sentinel: int) -> np.ndarray:
    """The most frequent value along the last axis (ties: the smallest), ``sentinel`` slots not counted; sorts
    ``layers`` in place. One pass over the sorted values (a value's run ends with its count), in preallocated
    buffers: per value slot 8 bytes of best value, 4 + 4 of counts and 3 of masks."""
    layers.sort(axis=-1)
    shape = layers.shape[:-1]
    best = layers[..., 0].copy()
    best_count = np.zeros(shape, np.int32)
    run = np.zeros(shape, np.int32)
    same, real, better = (np.empty(shape, np.bool_) for _ in range(3))
    for k in range(layers.shape[-1]):
        value = layers[..., k]
        if k:
            np.equal(value, layers[..., k - 1], out=same)
            run += 1
            run *= same
            np.maximum(run, 1, out=run)  # a new value starts a run of 1
        else:
            run[...] = 1
        np.not_equal(value, sentinel, out=real)
        run *= real
        np.greater(run, best_count, out=better)  # strictly more: ties keep the smaller value (sorted first)
        np.copyto(best, value, where=better)
        np.copyto(best_count, run, where=better)
    return best


def stitch_split(tiles: Sequence[Tile], predict: Callable[[list[int]], Sequence[np.ndarray] | np.ndarray],
                 **kwargs: Any) -> Iterator[tuple[str, np.ndarray]]:
    """(source key, stitched prediction) for every source of a split, one source at a time: ``predict(indices)``
    returns the predictions of those sample indices; ``kwargs`` go to :func:`stitch`."""
    for key, indices in by_source(tiles).items():
        yield key, stitch(predict(indices), [tiles[i] for i in indices], **kwargs)


def coverage(hw: tuple[int, int], tiling: Tiling) -> np.ndarray:
    """How many tiles cover each pixel of a source of size ``hw`` (tests: never 0)."""
    cover = np.zeros(hw, np.int32)
    for y, x, h, w in tiling.windows(hw):
        cover[y : y + h, x : x + w] += 1
    return cover

