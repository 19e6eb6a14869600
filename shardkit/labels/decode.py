"""Label files to stored class ids: :class:`LabelDecoder`.

A :class:`LabelDecoder` turns one label file into a ``(H, W)`` array of stored class
ids, bit-exactly: ids are never interpolated or guessed, and anything that does not
map to a class (an id out of range, a colour not in the table) is reported with its
pixel count and a fix, unless the user asked for ``--colour-tolerance`` or
``--unknown-as``. Raw values become ids through the user's value map (:mod:`.values`: ``--label-map``,
``--reduce-zero-label``, ``--threshold``) when one is given. JPEG id labels are read only through a
threshold or a label map: their compression noise is never taken for class ids. Reading the file's pixels
is :mod:`shardkit.images.imageio`'s job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConfigError, LabelError
from ..images.imageio import decode_label_pixels, decode_palette_label, file_bytes, is_jpeg_data
from .ade20k import ade20k_class_ids
from .builtin import _VOC_CMAP
from .classes import _MAX_LISTED, LABEL_KINDS, ClassInfo, ClassTable
from .hints import JPEG_PROBLEM, jpeg_fix, luma, read_values
from .values import ValueMap

_TOLERANCE_HINT = 16  # suggest an exact --colour-tolerance only for near-misses (e.g. anti-aliasing)
_FIX_RANGE = "pass --classes FILE naming every class id, or --num-classes N (N above every id)"


def _pack(rgb: np.ndarray) -> np.ndarray:
    """(..., 3) RGB uint8 → (...) uint32 keys r<<16 | g<<8 | b."""
    rgb = rgb.astype(np.uint32)
    return (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]


def _unpack(keys: np.ndarray) -> np.ndarray:
    keys = keys.astype(np.uint32)
    return np.stack([(keys >> 16) & 255, (keys >> 8) & 255, keys & 255], axis=-1).astype(np.int16)


def _fmt_rgb(c: Sequence[int]) -> str:
    return "(" + ",".join(str(int(v)) for v in c) + ")"


@dataclass(frozen=True)
class LabelDecoder:
    """Decodes one label file into ``(H, W)`` stored class ids of ``table.label_dtype()``.

    ``kind`` is the label kind (ids, colour, palette, cityscapes, ade20k: :mod:`.ade20k`). ``colour_tolerance``
    N maps a colour within N (on every channel) of its nearest class colour to that
    class; ``unknown_as`` maps any remaining unknown colour / out-of-range id to that
    stored id instead of failing. ``values``: the user's value map for id labels (raw values → ids).
    """

    kind: str
    table: ClassTable
    colour_tolerance: int = 0
    unknown_as: int | None = None
    values: ValueMap = field(default_factory=ValueMap)
    # Derived once, small, picklable: sorted colour keys → stored ids (colour / palette-RGB).
    _keys: np.ndarray = field(init=False, repr=False, compare=False)
    _key_ids: np.ndarray = field(init=False, repr=False, compare=False)
    _key_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _luts: dict[int, np.ndarray] = field(init=False, repr=False, compare=False)  # value-map tables by size

    def __post_init__(self) -> None:
        if self.kind not in LABEL_KINDS:
            raise ConfigError(f"label kind {self.kind!r} is not one of {', '.join(LABEL_KINDS)}")
        if not 0 <= self.colour_tolerance <= 255:
            raise ConfigError("--colour-tolerance must be between 0 and 255")
        t = self.table
        if self.unknown_as is not None and not t.is_stored_id(self.unknown_as):
            raise ConfigError(
                f"--unknown-as {self.unknown_as} is neither a class id (0..{t.num_classes - 1}) "
                f"nor the ignore index ({t.ignore_index})",
                fix="choose a class id or the --ignore-index value",
            )
        pairs: list[tuple[int, int, str]] = []  # (key, stored id, name)
        if self.kind == "colour" and self.values.active:
            raise ConfigError(f"{self.values.describe()} maps label values, but these labels are colour masks",
                              fix="drop it: colours map to classes through the class table")
        if self.kind == "colour":
            for c in t.classes:
                if c.colour is None:
                    raise ConfigError(
                        f"class {c.id} {c.name!r} of {t.source} has no colour, "
                        "so colour masks cannot be decoded",
                        fix="use a class_dict.csv / --palette with name,r,g,b",
                    )
        if self.kind in ("colour", "palette"):
            by_key: dict[int, ClassInfo] = {}
            for c in t.classes:
                if c.colour is None:
                    continue
                key = (c.colour[0] << 16) | (c.colour[1] << 8) | c.colour[2]
                if key in by_key:
                    raise ConfigError(
                        f"classes {by_key[key].name!r} and {c.name!r} of {t.source} share colour {c.colour}",
                        fix="give every class its own colour",
                    )
                by_key[key] = c
                pairs.append((key, c.id, c.name))
            ig = t.ignore_index
            if self.kind == "palette" and t.source.startswith("builtin:voc") and ig is not None and ig < 256:
                key = int(_pack(_VOC_CMAP[ig]))
                if key not in by_key:  # VOC RGB exports draw the void border (224,224,192) for 255
                    pairs.append((key, ig, "ignore"))
        pairs.sort()
        dtype = t.label_dtype()
        object.__setattr__(self, "_keys", np.array([p[0] for p in pairs], dtype=np.uint32))
        object.__setattr__(self, "_key_ids", np.array([p[1] for p in pairs], dtype=dtype))
        object.__setattr__(self, "_key_names", tuple(p[2] for p in pairs))
        object.__setattr__(self, "_luts", {})

    # -- entry point

    def decode(self, path: Path, data: np.ndarray | None = None) -> np.ndarray:
        """Read one label file (or decode its already-read bytes ``data``) and return its stored class ids;
        errors name the file and the fix."""
        path = Path(path)
        data = file_bytes(path, "label", data)
        if self.kind == "palette":
            return self._decode_palette(path, data)
        if self.kind == "colour":
            return self._map_colours(self._colour_keys(decode_label_pixels(path, data), path), path)
        if self.kind == "ade20k":
            return self._ids_to_stored(ade20k_class_ids(decode_label_pixels(path, data), path), path)
        lossy = is_jpeg_data(data)
        raw = decode_label_pixels(path, data, indices=True)
        if lossy and not self.values.takes_lossy:
            gray = self._gray(raw)
            gray = gray if gray.ndim == 2 else gray[:, :, 0]
            raise LabelError(JPEG_PROBLEM, path=path, fix=jpeg_fix(np.bincount(gray.ravel(), minlength=256)))
        ids = self._as_ids(self._gray(raw) if self.values.threshold is not None else raw, path)
        return self._ids_to_stored(ids, path, lossy)

    def decode_pixels(self, raw: np.ndarray, path: Path) -> np.ndarray:
        """Stored class ids of already-decoded label pixels in RGB(A) or gray order (a window of a tiled TIFF
        read by :mod:`shardkit.images.tiles`), with every check :meth:`decode` makes; palette labels need their file."""
        if self.kind == "palette":
            raise LabelError("palette labels are read whole, not window by window", path=path,
                             fix="store the labels as one-channel class ids, or raise --max-pixels")
        if raw.ndim == 3 and raw.shape[2] >= 3:  # the decoders below take OpenCV's BGR(A) order
            raw = np.ascontiguousarray(raw[:, :, [2, 1, 0, *range(3, raw.shape[2])]])
        if self.kind == "colour":
            return self._map_colours(self._colour_keys(raw, path), path)
        if self.kind == "ade20k":
            return self._ids_to_stored(ade20k_class_ids(raw, path), path)
        ids = self._as_ids(self._gray(raw) if self.values.threshold is not None else raw, path)
        return self._ids_to_stored(ids, path)

    def _ids_to_stored(self, ids: np.ndarray, path: Path, lossy: bool = False) -> np.ndarray:
        """Raw ids → the value map, the table's remap, the range check."""
        if self.values.active:
            ids = self._apply_values(ids, path, lossy)
        if self.table.remap is not None:
            ids = self._apply_remap(ids, path)
        return self._check_range(ids, path)

    @staticmethod
    def _gray(raw: np.ndarray) -> np.ndarray:
        """A colour mask as one gray channel for ``--threshold``: equal channels as they are, else ITU-R 601
        luma as PIL's ``convert("L")`` computes it (``(19595 R + 38470 G + 7471 B + 2**15) >> 16``)."""
        if raw.ndim != 3 or raw.shape[2] < 3 or raw.dtype != np.uint8:
            return raw
        b, g, r = (raw[:, :, k] for k in range(3))
        if np.array_equal(b, g) and np.array_equal(g, r):
            return raw[:, :, 0]
        return luma(r, g, b)

    def _apply_values(self, ids: np.ndarray, path: Path, lossy: bool) -> np.ndarray:
        """The user's value map (a lookup table over the raw values' range)."""
        if self.values.threshold is not None:
            self.values.check_binary(ids, lossy, path)
        self.values.check_merges(ids, self.table.ignore_index, path)
        size = 256 if ids.dtype == np.uint8 else 65536
        lut = self._luts.get(size)
        if lut is None:
            lut = self._luts[size] = self.values.lut(size, self.table.ignore_index)
        return lut[ids]

    # -- ids

    def _as_ids(self, raw: np.ndarray, path: Path) -> np.ndarray:
        """One channel of integer ids: equal-channel RGB collapses, alpha is dropped, colours are refused."""
        if raw.ndim == 3:
            if raw.shape[2] <= 2:  # gray, gray + alpha
                raw = raw[:, :, 0]
            else:
                b, g, r = raw[:, :, 0], raw[:, :, 1], raw[:, :, 2]
                differ = (b != g) | (g != r)
                n = int(np.count_nonzero(differ))
                if n:
                    y, x = np.argwhere(differ)[0]
                    raise LabelError(
                        f"label has colours, not class ids ({n} px where R, G, B differ, e.g. "
                        f"{_fmt_rgb((r[y, x], g[y, x], b[y, x]))} at x={x} y={y})",
                        path=path,
                        fix="pass a class_dict.csv / --palette FILE "
                        "(palette-indexed PNGs like VOC: palette labels)",
                    )
                raw = b
        if raw.dtype not in (np.uint8, np.uint16):
            raise LabelError(
                f"label pixels are {raw.dtype}, not 8- or 16-bit integer class ids",
                path=path,
                fix="re-export the label as an 8- or 16-bit grayscale PNG",
            )
        return np.ascontiguousarray(raw)

    def _apply_remap(self, ids: np.ndarray, path: Path) -> np.ndarray:
        """Raw ids → stored ids through the 256-entry LUT (before any range check)."""
        if ids.dtype != np.uint8:
            counts = np.bincount(ids.ravel())
            big = np.flatnonzero(counts[256:]) + 256
            if big.size:
                raise LabelError(
                    f"label has raw ids above 255 that the {self.table.source} remap cannot map: "
                    f"{self._list_counts(big, counts)}",
                    path=path,
                    fix="use the labelIds PNGs (not instanceIds), or turn the remap off",
                )
            ids = ids.astype(np.uint8)
        lut = np.asarray(self.table.remap, dtype=self.table.label_dtype())
        return lut[ids]

    def _range_fix(self, counts: np.ndarray) -> str:
        """The fix for out-of-range ids, by what the values look like (:func:`.hints.read_values`): a 0/V mask
        its value map, codes a --label-map, 255 above the ids --ignore-index 255, sparse ids the class count."""
        t = self.table
        if self.values.active:
            return f"check {self.values.describe()}: it leaves values outside the class table"
        reading = read_values(counts, num_classes=t.num_classes, ignore_index=t.ignore_index)
        return reading[1] if reading is not None else _FIX_RANGE

    @staticmethod
    def _list_counts(values: np.ndarray, counts: np.ndarray) -> str:
        order = sorted(values.tolist(), key=lambda v: (-int(counts[v]), v))
        shown = ", ".join(f"{v} ({int(counts[v])} px)" for v in order[:_MAX_LISTED])
        more = len(order) - _MAX_LISTED
        return shown + (f" and {more} more" if more > 0 else "")

    def _check_range(self, ids: np.ndarray, path: Path) -> np.ndarray:
        """Every value must be a class or the ignore id; else error (or ``unknown_as``)."""
        t = self.table
        if ids.size == 0 or int(ids.max()) < t.num_classes:  # the common case, ~15x cheaper than counting
            return ids.astype(t.label_dtype(), copy=False)
        counts = np.bincount(ids.ravel(), minlength=1)
        n = counts.size
        valid = np.zeros(n, dtype=bool)
        valid[: min(t.num_classes, n)] = True
        if t.ignore_index is not None and t.ignore_index < n:
            valid[t.ignore_index] = True
        bad = np.flatnonzero((counts > 0) & ~valid)
        dtype = t.label_dtype()
        if bad.size:
            if self.unknown_as is None:
                ig = f", ignore {t.ignore_index}" if t.ignore_index is not None else ""
                raise LabelError(
                    f"label has ids outside the {t.num_classes} classes (0..{t.num_classes - 1}{ig}): "
                    f"{self._list_counts(bad, counts)}",
                    path=path,
                    fix=self._range_fix(counts),
                )
            lut = np.where(valid, np.arange(n), self.unknown_as).astype(dtype)
            return lut[ids]
        return ids.astype(dtype, copy=False)

    # -- colours

    @staticmethod
    def _colour_keys(raw: np.ndarray, path: Path) -> np.ndarray:
        """BGR(A)/gray uint8 pixels → (H, W) uint32 RGB keys; alpha dropped, gray v read as (v, v, v)."""
        if raw.dtype != np.uint8:
            raise LabelError(
                f"colour mask is {raw.dtype}, not 8-bit",
                path=path,
                fix="re-export the mask as an 8-bit RGB PNG",
            )
        if raw.ndim == 3 and raw.shape[2] <= 2:
            raw = raw[:, :, 0]
        if raw.ndim == 2:
            return raw.astype(np.uint32) * np.uint32(0x010101)
        return _pack(raw[:, :, 2::-1])

    def _map_colours(self, keys: np.ndarray, path: Path) -> np.ndarray:
        """Map colour keys to stored ids with a sorted-key binary search (vectorised over pixels)."""
        h, w = keys.shape
        flat = keys.ravel()
        if self._keys.size == 0:
            raise LabelError(
                f"{self.table.source} has no colours to decode a colour label with",
                path=path,
                fix="pass a class_dict.csv / --palette FILE",
            )
        pos = np.searchsorted(self._keys, flat)
        np.minimum(pos, self._keys.size - 1, out=pos)
        match = self._keys[pos] == flat
        out = self._key_ids[pos]
        if not match.all():
            bad_idx = np.flatnonzero(~match)
            uniq, inverse, counts = np.unique(flat[bad_idx], return_inverse=True, return_counts=True)
            mapped = self._map_unknown(uniq, counts, path)
            out[bad_idx] = mapped[inverse]
        return out.reshape(h, w)

    def _nearest(self, uniq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per unknown colour key: index of the nearest class key (max-abs distance), and that distance."""
        class_rgb = _unpack(self._keys)
        nearest = np.empty(uniq.size, dtype=np.intp)
        dist = np.empty(uniq.size, dtype=np.int16)
        step = max(1, 2_000_000 // max(1, class_rgb.shape[0]))  # bound the (U, K, 3) temporary
        for s in range(0, uniq.size, step):
            u = _unpack(uniq[s : s + step])
            d = np.abs(u[:, None, :] - class_rgb[None, :, :]).max(axis=2)
            nearest[s : s + step] = d.argmin(axis=1)
            dist[s : s + step] = d[np.arange(d.shape[0]), nearest[s : s + step]]
        return nearest, dist

    def _map_unknown(self, uniq: np.ndarray, counts: np.ndarray, path: Path) -> np.ndarray:
        nearest, dist = self._nearest(uniq)
        mapped = np.zeros(uniq.size, dtype=self._key_ids.dtype)
        within = dist <= self.colour_tolerance
        mapped[within] = self._key_ids[nearest[within]]
        left = np.flatnonzero(~within)
        if left.size:
            if self.unknown_as is None:
                raise self._unknown_colour_error(uniq[left], counts[left], nearest[left], dist[left], path)
            mapped[left] = self.unknown_as
        return mapped

    def _unknown_colour_error(
        self, keys: np.ndarray, counts: np.ndarray, nearest: np.ndarray, dist: np.ndarray, path: Path
    ) -> LabelError:
        order = np.lexsort((keys, -counts.astype(np.int64)))
        rgb = _unpack(keys)
        class_rgb = _unpack(self._keys)
        parts = []
        for i in order[:_MAX_LISTED]:
            k = nearest[i]
            parts.append(
                f"{_fmt_rgb(rgb[i])} {int(counts[i])} px, nearest {_fmt_rgb(class_rgb[k])} "
                f"{self._key_names[k]!r} (distance {int(dist[i])})"
            )
        more = keys.size - _MAX_LISTED
        listed = "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
        src = self.table.source or "the class table"
        jpeg = (
            " (JPEG labels are lossy: re-export them as PNG)"
            if path.suffix.lower() in (".jpg", ".jpeg")
            else ""
        )
        target = src if src.endswith((".csv", ".json", ".txt")) else "class_dict.csv"
        # a tolerance only for near misses (anti-aliased edges): a far colour is a class of its own, and a
        # tolerance wide enough to reach its nearest class would merge the two
        near = dist[dist <= _TOLERANCE_HINT]
        tol = f", or --colour-tolerance {int(near.max())} for the near misses" if near.size else ""
        return LabelError(
            f"label has {keys.size} colour(s) not in {src} ({int(counts.sum())} px): {listed}{jpeg}",
            path=path,
            fix=f"add it to {target}{tol}, or --unknown-as ID to store it as that class or ignore id on purpose",
        )

    # -- palette PNGs

    def _decode_palette(self, path: Path, data: np.ndarray | None = None) -> np.ndarray:
        """Palette-indexed labels via PIL: mode P gives indices directly (OpenCV would expand colours)."""
        mode, arr = decode_palette_label(path, data)
        if mode in ("RGB", "RGBA"):
            return self._map_colours(_pack(arr[:, :, :3]), path)
        if mode in ("P", "PA", "L", "LA"):
            ids = arr if arr.ndim == 2 else arr[:, :, 0]
        elif mode == "1":
            ids = arr.astype(np.uint8)
        elif mode.startswith("I;16") or (
            mode == "I" and (arr.size == 0 or (arr.min() >= 0 and arr.max() <= 65535))
        ):
            ids = arr.astype(np.uint16)
        else:
            raise LabelError(
                f"palette label has image mode {mode}, not palette indices",
                path=path,
                fix="re-export it as a palette (mode P) or grayscale PNG",
            )
        return self._ids_to_stored(np.ascontiguousarray(ids), path)
