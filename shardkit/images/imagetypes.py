"""Image element types and bands: what convert stores, and the only changes it makes when asked.

An image is stored as it was decoded: its element type (uint8, uint16, int16, float32) and its bands
(1..N). Nothing here runs unless the user asked for it: ``--bands 4,3,2`` picks bands (1-based, in that
order), ``--image-dtype uint8 --rescale shift|minmax|percentile:P`` changes the element type. A widening
cast that loses nothing (uint8 → uint16/int16/float32, uint16/int16 → float32) needs no ``--rescale``; every
other change of type does, and is refused without one. Only numpy is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DecodeError
from ..support.limits import MAX_BANDS

#: ``--image-dtype`` names → the little-endian dtype strings manifests record.
DTYPE_NAMES = {"uint8": "|u1", "uint16": "<u2", "int16": "<i2", "float32": "<f4"}
#: dtype strings → ``--image-dtype`` names.
NAME_OF = {v: k for k, v in DTYPE_NAMES.items()}
RESCALES = ("shift", "minmax", "percentile")
#: Casts that keep every value exactly: no ``--rescale`` needed.
_WIDENING = {("uint8", "uint16"), ("uint8", "int16"), ("uint8", "float32"), ("uint16", "float32"),
             ("int16", "float32")}


def dtype_name(dtype: Any) -> str:
    """``uint16`` for a numpy dtype or dtype string (byte order ignored)."""
    return np.dtype(dtype).newbyteorder("=").name


def stored_dtype(dtype: Any) -> str:
    """The manifest's dtype string of a decoded image's dtype; DecodeError-free: ValueError if not storable."""
    name = dtype_name(dtype)
    if name not in DTYPE_NAMES:
        raise ValueError(name)
    return DTYPE_NAMES[name]


def parse_bands(text: str | tuple[int, ...] | list[int] | None) -> tuple[int, ...]:
    """``"4,3,2"`` → ``(4, 3, 2)``: 1-based band numbers; empty for None or ``""``."""
    if text is None or text == "" or text == ():
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        bands = tuple(int(str(b).strip()) for b in items)
    except ValueError:
        raise ConfigError(f"--bands {text!r} is not a list of band numbers",
                          fix="write it like --bands 4,3,2") from None
    if not bands or any(b < 1 for b in bands):
        raise ConfigError(f"--bands {text!r}: band numbers start at 1", fix="write it like --bands 1,2,3")
    if len(bands) > MAX_BANDS:
        raise ConfigError(f"--bands names {len(bands)} bands, more than the {MAX_BANDS} a split stores",
                          fix=f"name at most {MAX_BANDS} bands")
    return bands


def check_band_count(bands: int, path: Path | None = None) -> None:
    """Refuse an image of more bands than a split stores (:data:`~shardkit.support.limits.MAX_BANDS`, what every reader
    allows): convert says so before writing anything, instead of writing a split its readers refuse."""
    if bands > MAX_BANDS:
        raise DecodeError(f"image has {bands} bands, more than the {MAX_BANDS} a split stores (its readers refuse "
                          "more)", path=path, fix=f"pick at most {MAX_BANDS} with --bands (e.g. --bands 1,2,3), or "
                          "--on-error skip")


def parse_rescale(text: str | None) -> tuple[str, float] | None:
    """``"percentile:2"`` → ``("percentile", 2.0)``; ``"minmax"`` → ``("minmax", 0.0)``; None stays None."""
    if text is None or text == "":
        return None
    name, _, arg = str(text).strip().lower().partition(":")
    if name not in RESCALES:
        raise ConfigError(f"--rescale {text!r} is not one of shift, minmax, percentile:P",
                          fix="write e.g. --rescale percentile:2")
    if name != "percentile":
        if arg:
            raise ConfigError(f"--rescale {text!r}: {name} takes no value", fix=f"write --rescale {name}")
        return name, 0.0
    try:
        p = float(arg)
    except ValueError:
        raise ConfigError(f"--rescale {text!r} needs a percentile P in 0..50 (excluded)",
                          fix="write e.g. --rescale percentile:2") from None
    if not 0 <= p < 50:
        raise ConfigError(f"--rescale {text!r}: P must be in 0..50 (excluded)", fix="write e.g. --rescale percentile:2")
    return name, p


@dataclass(frozen=True)
class ImageOptions:
    """What the user asked to change about images (nothing by default): bands, element type, rescaling."""

    dtype: str | None = None  # an --image-dtype name (uint8 …), None: as decoded
    rescale: str | None = None  # "shift", "minmax", "percentile:P"
    bands: tuple[int, ...] = ()  # 1-based band numbers; () keeps every band
    pages_as_bands: bool = False  # a multi-page TIFF's pages become bands (all the same type and size)

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPE_NAMES:
            raise ConfigError(f"--image-dtype {self.dtype!r} is not one of {', '.join(DTYPE_NAMES)}")
        parsed = parse_rescale(self.rescale)
        if parsed is not None and self.dtype is None:
            raise ConfigError(f"--rescale {self.rescale} needs a target type", fix="add --image-dtype uint8")
        object.__setattr__(self, "bands", parse_bands(self.bands))

    @property
    def default(self) -> bool:
        return self == ImageOptions()

    def to_json(self) -> dict[str, Any]:
        """What the manifest's ``preprocessing`` records (nothing at all for the defaults: fingerprints stay)."""
        out: dict[str, Any] = {}
        if self.bands:
            out["bands"] = list(self.bands)
        if self.pages_as_bands:
            out["pages_as_bands"] = True
        if self.dtype is not None:
            out["image_dtype"] = self.dtype
            out["rescale"] = self.rescale
        return out

    def apply(self, image: np.ndarray, path: Path | None = None) -> np.ndarray:
        """``image`` (H, W, C) with the bands and type asked for; a band or cast that cannot be is a DecodeError."""
        if self.bands:
            image = select_bands(image, self.bands, path)
        if self.dtype is not None:
            image = convert_dtype(image, self.dtype, parse_rescale(self.rescale), path)
        return image


def select_bands(image: np.ndarray, bands: tuple[int, ...], path: Path | None = None) -> np.ndarray:
    """Bands ``bands`` (1-based) of an (H, W, C) image, in that order."""
    have = image.shape[2]
    if max(bands) > have:
        raise DecodeError(f"image has {have} band{'s' * (have != 1)}; --bands asks for band {max(bands)}",
                          path=path, fix=f"choose bands within 1..{have}, or --on-error skip")
    if bands == tuple(range(1, have + 1)):
        return image
    return np.ascontiguousarray(image[:, :, [b - 1 for b in bands]])


def _scale(image: np.ndarray, lo: np.ndarray, hi: np.ndarray, target: np.dtype) -> np.ndarray:
    """Per band: ``[lo, hi]`` → the target's range (integers: its full range, rounded; float32: 0..1)."""
    x = image.astype(np.float64)
    span = np.where(hi > lo, hi - lo, 1.0)
    unit = np.clip((x - lo) / span, 0.0, 1.0)
    unit[..., (hi <= lo)] = 0.0
    if target.kind == "f":
        return unit.astype(target)
    info = np.iinfo(target)
    return np.rint(unit * (float(info.max) - float(info.min)) + float(info.min)).astype(target)


def convert_dtype(image: np.ndarray, name: str, rescale: tuple[str, float] | None,
                  path: Path | None = None) -> np.ndarray:
    """``image`` as ``name`` (an :data:`DTYPE_NAMES` key): cast when lossless, else by ``rescale``."""
    source = dtype_name(image.dtype)
    target = np.dtype(name)
    if rescale is None:
        if source == name:
            return image
        if (source, name) in _WIDENING or (name == "float32" and source not in DTYPE_NAMES):
            return image.astype(target)  # widening, or a type shardkit does not store: the nearest float32
        raise DecodeError(f"image is {source}; --image-dtype {name} would change its values",
                          path=path, fix=f"add --rescale shift, minmax or percentile:P to say how (or drop "
                          f"--image-dtype to store {source} as it is)")
    how, p = rescale
    if how == "shift":
        if image.dtype.kind not in "iu" or target.kind not in "iu" or target.itemsize > image.dtype.itemsize:
            raise DecodeError(f"--rescale shift turns wider integers into narrower ones, not {source} into {name}",
                              path=path, fix="use --rescale minmax or percentile:P")
        bits = 8 * (image.dtype.itemsize - target.itemsize)
        wide = image.astype(np.int64)
        if image.dtype.kind == "i":  # signed: offset to unsigned first (int16 -32768 → 0)
            wide -= np.iinfo(image.dtype).min
        if target.kind == "i":
            wide += np.iinfo(target).min << bits
        return (wide >> bits).astype(target)
    flat = image.reshape(-1, image.shape[-1])
    finite = np.isfinite(flat) if flat.dtype.kind == "f" else None
    if finite is not None and not finite.all():
        flat = np.where(finite, flat, np.nan)
    if how == "minmax":
        lo, hi = np.nanmin(flat, axis=0), np.nanmax(flat, axis=0)
    else:
        lo, hi = np.nanpercentile(flat, p, axis=0), np.nanpercentile(flat, 100 - p, axis=0)
    out = _scale(np.nan_to_num(image, nan=0.0) if finite is not None else image, lo.astype(np.float64),
                 hi.astype(np.float64), target)
    return out
