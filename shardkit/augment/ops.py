"""Augmentation ops, their parameter draws, and the ``"scale=0.5:2,crop=512x1024,…"`` string form.

Every op draws from its own ``np.random.Generator(PCG64([seed, epoch, index, position]))``,
so a sample's parameters depend on (seed, epoch, index) only — never on the batch it is in
or the worker reading it — and a retried draw in one op (``cat_max_ratio``) does not shift
the draws of the others. (:mod:`.seeding` computes those generators' states for a whole batch at
once; the draws are the same.) Geometry ops compose into one 3x3 matrix (output → source pixel,
pixel centres at integer coordinates) while tracking the current canvas size.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ..codecs import encoding
from ..codecs.onehot import hot_channels
from ..errors import ConfigError
from . import backends, seeding
from .geometry import IMAGE_RANGES, warp_labels
from .levels import LEVELS, normalize_uint8


class Kind(enum.Enum):
    """What an op does to a batch, which decides how every backend applies it.

    ``GEOMETRIC``: moves pixels; contributes a step to the one fused matrix per sample and needs no kernel of its
    own (every backend applies the matrix). ``PHOTOMETRIC``: changes image values only, after the warp, in
    pipeline order; never labels. ``MASK``: changes image and label pixels in the output canvas (Cutout).
    ``OUTPUT``: changes the batch's dtype or layout (Normalize, OneHot); last, draws nothing."""

    GEOMETRIC = "geometric"
    PHOTOMETRIC = "photometric"
    MASK = "mask"
    OUTPUT = "output"


@dataclass(frozen=True)
class OpParams:
    """One op's drawn values for one sample (each op has its own record type)."""


@dataclass(frozen=True)
class ScaleParams(OpParams):
    scale: float = 1.0


@dataclass(frozen=True)
class FlipParams(OpParams):
    flip: bool = False


@dataclass(frozen=True)
class RotateParams(OpParams):
    angle: float = 0.0


@dataclass(frozen=True)
class CropParams(OpParams):
    offset: tuple[int, int] = (0, 0)  # (y0, x0) in the scaled / rotated canvas


@dataclass(frozen=True)
class JitterParams(OpParams):
    brightness: float = 1.0
    contrast: float = 1.0
    saturation: float = 1.0
    hue: float = 0.0

    @property
    def identity(self) -> bool:
        return (self.brightness, self.contrast, self.saturation, self.hue) == (1.0, 1.0, 1.0, 0.0)


@dataclass(frozen=True)
class GammaParams(OpParams):
    gamma: float = 1.0


@dataclass(frozen=True)
class CutoutParams(OpParams):
    holes: tuple[tuple[int, int, int, int], ...] = ()  # (y0, x0, y1, x1) output pixels, ends exclusive
    fill: tuple[int | float, ...] = (0, 0, 0)  # written into the image's holes: one level, or one value per band
    ignore: bool = False  # True: label pixels in holes become the ignore index


@dataclass(frozen=True)
class BatchSpec:
    """What a batch holds, as an op sees it and passes it on (:meth:`Op.output_spec`): image channels and dtype,
    label encoding. Backends check a pipeline against their input's spec before drawing anything."""

    channels: int = 3
    image_dtype: str = "uint8"
    labels: str = "ids"  # or "onehot"


R = TypeVar("R", bound=OpParams)
K = TypeVar("K")  # a backend's kernel type


class _Legacy:
    """A read-only attribute of :class:`Params` kept from its flat form: ``field`` of the sample's last record of
    type ``record`` (its default when none)."""

    def __init__(self, record: type[OpParams], field_name: str) -> None:
        self.record, self.field = record, field_name

    def __get__(self, obj: Params | None, owner: type) -> Any:
        if obj is None:
            return self
        rec = obj.get(self.record)
        return getattr(rec if rec is not None else self.record(), self.field)


#: The flat ``Params`` keywords of earlier releases → (record type, field). Still accepted by ``Params(...)`` and
#: ``dataclasses.replace``, and readable as attributes: they set / read the sample's last record of that type.
LEGACY_FIELDS: dict[str, tuple[type[OpParams], str]] = {
    "scale": (ScaleParams, "scale"), "angle": (RotateParams, "angle"), "flip": (FlipParams, "flip"),
    "crop_offset": (CropParams, "offset"), "brightness": (JitterParams, "brightness"),
    "contrast": (JitterParams, "contrast"), "saturation": (JitterParams, "saturation"), "hue": (JitterParams, "hue"),
    "holes": (CutoutParams, "holes"), "cutout_fill": (CutoutParams, "fill"), "cutout_ignore": (CutoutParams, "ignore"),
}


@dataclass(frozen=True, init=False, eq=False)
class Params:
    """One sample's drawn values: ``matrix`` maps output (x, y, 1) → source (x, y) (every geometric op fused),
    ``out_hw`` the output size, ``records`` one :class:`OpParams` (or None) per drawing op of the pipeline, in
    pipeline order (output ops draw nothing and have none)."""

    matrix: np.ndarray
    out_hw: tuple[int, int]
    records: tuple[OpParams | None, ...]

    def __init__(self, matrix: np.ndarray, out_hw: tuple[int, int],
                 records: Sequence[OpParams | None] = (), **legacy: Any) -> None:
        recs = list(records)
        for name, value in legacy.items():
            if name not in LEGACY_FIELDS:
                raise TypeError(f"Params() got an unexpected keyword argument {name!r}")
            kind, fname = LEGACY_FIELDS[name]
            at = max((k for k, r in enumerate(recs) if type(r) is kind), default=None)
            if at is None:
                recs.append(kind(**{fname: value}))
            else:
                recs[at] = dataclasses.replace(recs[at], **{fname: value})  # type: ignore[type-var]
        object.__setattr__(self, "matrix", matrix)
        object.__setattr__(self, "out_hw", (int(out_hw[0]), int(out_hw[1])))
        object.__setattr__(self, "records", tuple(recs))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Params) and np.array_equal(self.matrix, other.matrix)
                and (self.out_hw, self.records) == (other.out_hw, other.records))

    __hash__ = None  # type: ignore[assignment]

    def get(self, kind: type[R]) -> R | None:
        """The sample's last record of type ``kind``, or None."""
        found = [r for r in self.records if type(r) is kind]
        return found[-1] if found else None

    scale = _Legacy(ScaleParams, "scale")
    angle = _Legacy(RotateParams, "angle")
    crop_offset = _Legacy(CropParams, "offset")
    brightness = _Legacy(JitterParams, "brightness")
    contrast = _Legacy(JitterParams, "contrast")
    saturation = _Legacy(JitterParams, "saturation")
    hue = _Legacy(JitterParams, "hue")
    holes = _Legacy(CutoutParams, "holes")
    cutout_fill = _Legacy(CutoutParams, "fill")
    cutout_ignore = _Legacy(CutoutParams, "ignore")

    @property
    def flip(self) -> bool:
        """True when the sample is mirrored: an odd number of its flip ops drew a flip."""
        return sum(r.flip for r in self.records if isinstance(r, FlipParams)) % 2 == 1

    @property
    def colour(self) -> bool:
        """True when the sample's colour jitter changes anything."""
        rec = self.get(JitterParams)
        return rec is not None and not rec.identity


class _State:
    """Mutable draw state while the ops of a Compose run: matrix, canvas size, the records drawn so far.

    ``values["records"]``: the drawing ops' :class:`OpParams`, in order (``Params(matrix=, out_hw=, **values)``)."""

    def __init__(self, hw: tuple[int, int], label: np.ndarray | None, ignore_index: int, index: int = 0) -> None:
        self.t = np.eye(3)
        self.index = int(index)  # the sample's global index (what a per-sample output op looks its values up by)
        self.hw = (int(hw[0]), int(hw[1]))
        self.label = label
        self.ignore_index = ignore_index
        self.values: dict[str, Any] = {"records": []}

    def then(self, a: np.ndarray, hw: tuple[int, int] | None = None) -> None:
        """Append a new-canvas → old-canvas step ``a`` (3x3)."""
        self.t = self.t @ a
        if hw is not None:
            self.hw = hw

    def record(self, rec: OpParams) -> None:
        """Keep the drawing op's own record."""
        self.values["records"].append(rec)


class Op:
    """An augmentation op: its :attr:`kind`, its draw into the sample's :class:`_State` (its own
    :class:`OpParams` record), the spec of the batch it gives (:meth:`output_spec`) and, for non-geometric ops,
    the arrays its drawn values pack into for the device backends (:meth:`layout`, :meth:`pack`). Each backend
    applies a non-geometric op through its own kernel table, keyed by op class; an op missing from a backend's
    table is refused there (:meth:`shardkit.augment.ops.Compose.kernels`)."""

    kind: Kind = Kind.PHOTOMETRIC
    #: An output op whose values differ per sample (e.g. a volume's statistics, looked up by sample index): it
    #: draws a record like the other ops, which its kernels get (packed) with the batch.
    samplewise: bool = False
    #: An output op that turns images into normalised float32 ones (a pipeline takes one; readers then do not
    #: normalise again).
    normalizes_images: bool = False

    @property
    def geometric(self) -> bool:
        return self.kind is Kind.GEOMETRIC

    @property
    def output(self) -> bool:
        """Output ops (Normalize, OneHot) change the batch's dtype or shape; they come last and draw nothing."""
        return self.kind is Kind.OUTPUT

    @property
    def draws(self) -> bool:
        """True when the op records one :class:`OpParams` per sample (every op but the plain output ones)."""
        return not self.output or self.samplewise

    def draw(self, rng: np.random.Generator, st: _State) -> None:
        raise NotImplementedError

    def output_spec(self, spec: BatchSpec) -> BatchSpec:
        """The spec of the batch this op gives for a batch of ``spec``; a ConfigError for one it cannot take."""
        return spec

    def layout(self) -> dict[str, tuple[str, tuple[int | str | None, ...]]]:
        """The arrays :meth:`pack` gives: name → (dtype, shape), a shape's ``"B"`` the batch size and None a size
        that varies per batch."""
        return {}

    def pack(self, records: Sequence[Any]) -> dict[str, np.ndarray]:
        """This op's drawn records of a batch (one per sample) as the host arrays of :meth:`layout`."""
        return {}

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


# ---------------------------------------------------------------------- bounds
#: Largest side of an augmented sample, and most pixels: a 8192 x 8192 RGB sample is 200 MB (800 MB as float32
#: after Normalize), per sample of a batch. Checked for a crop at construction and for every drawn sample.
MAX_OUTPUT_SIDE = 16384
MAX_OUTPUT_PIXELS = 1 << 26
#: Most values one augmented sample may hold (pixels x channels, one-hot classes included): 1 GiB as uint8.
MAX_OUTPUT_VALUES = 1 << 30
#: Largest scale factor (the canvas grows by it before any crop), rotation in degrees, holes per sample,
#: colour-jitter strength, and the smallest Normalize std (1 / std is applied in float32: 1e-45 would be inf).
MAX_SCALE = 16.0
MAX_DEGREES = 360.0
MAX_HOLES = 1024
MAX_JITTER = 10.0
MAX_GAMMA = 10.0
MIN_STD = 1e-3
MAX_MEAN = 1e6
#: Most image channels (bands) an op takes.
MAX_BANDS = 1024
#: Image dtypes the backends warp (labels: any integer dtype).
IMAGE_DTYPES = tuple(IMAGE_RANGES)
#: OneHot classes: a stored label holds at most uint16 ids.
MAX_CLASSES = 65536
#: Longest augmentation string.
MAX_TEXT = 4096


def _num(name: str, value: Any, lo: float = 0.0, hi: float | None = None) -> float:
    """``value`` as a finite float in [lo, hi]; a string must be ASCII (``float`` takes full-width digits)."""
    if isinstance(value, bool) or (isinstance(value, str) and not value.isascii()):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v < lo or (hi is not None and v > hi):
        within = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ConfigError(f"{name} must be a finite number {within}, got {value!r}")
    return v


def _int(name: str, value: Any, lo: int, hi: int) -> int:
    """``value`` as an integer in [lo, hi]: no bools, no fractions, no non-ASCII digits."""
    if isinstance(value, bool) or (isinstance(value, str) and not (value.isascii() and value.isdigit())):
        raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    try:
        ok = int(value) == value if not isinstance(value, str) else True
        v = int(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}") from None
    if not ok or not lo <= v <= hi:
        raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return v


def check_output(hw: tuple[int, int], channels: int = 3, what: str = "augmented sample") -> None:
    """Refuse an output of ``hw`` (times ``channels`` values per pixel) past the bounds above, in one line."""
    h, w = hw
    if max(h, w) > MAX_OUTPUT_SIDE or h * w > MAX_OUTPUT_PIXELS or h * w * channels > MAX_OUTPUT_VALUES:
        raise ConfigError(f"{what} would be {h}x{w} pixels x {channels} values, more than the {MAX_OUTPUT_SIDE} "
                          f"per side, {MAX_OUTPUT_PIXELS} pixels and {MAX_OUTPUT_VALUES} values allowed",
                          fix="crop to a smaller size (crop=HxW), or lower the scale or the class count")


class RandomScale(Op):
    """Resize the canvas by a factor drawn uniformly from [lo, hi]."""

    kind = Kind.GEOMETRIC

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = _num("scale lo", lo, 0, MAX_SCALE), _num("scale hi", hi, 0, MAX_SCALE)
        if not 0 < self.lo <= self.hi:
            raise ConfigError(f"scale range must satisfy 0 < lo <= hi, got {lo}:{hi}")

    def draw(self, rng: np.random.Generator, st: _State) -> None:
        s = float(rng.uniform(self.lo, self.hi))
        h, w = st.hw
        hw = (max(1, round(h * s)), max(1, round(w * s)))
        sy, sx = h / hw[0], w / hw[1]  # pixel-centre aligned: old = (new + 0.5) * (old/new) - 0.5
        st.then(np.array([[sx, 0, 0.5 * sx - 0.5], [0, sy, 0.5 * sy - 0.5], [0, 0, 1]]), hw)
        st.record(ScaleParams(s))


class RandomFlip(Op):
    """Mirror left-right with probability ``horizontal``."""

    kind = Kind.GEOMETRIC

    def __init__(self, horizontal: float = 0.5) -> None:
        self.horizontal = _num("flip probability", horizontal, 0, 1)

    def draw(self, rng: np.random.Generator, st: _State) -> None:
        flip = bool(rng.random() < self.horizontal)
        if flip:
            st.then(np.array([[-1.0, 0, st.hw[1] - 1], [0, 1, 0], [0, 0, 1]]))
        st.record(FlipParams(flip))


class RandomRotate(Op):
    """Rotate about the canvas centre by an angle drawn uniformly from [-degrees, degrees]."""

    kind = Kind.GEOMETRIC

    def __init__(self, degrees: float) -> None:
        self.degrees = _num("rotate degrees", degrees, 0, MAX_DEGREES)

    def draw(self, rng: np.random.Generator, st: _State) -> None:
        a = float(rng.uniform(-self.degrees, self.degrees))
        h, w = st.hw
        cy, cx = (h - 1) / 2, (w - 1) / 2
        c, s = math.cos(math.radians(a)), math.sin(math.radians(a))
        st.then(np.array([[c, -s, cx - c * cx + s * cy], [s, c, cy - s * cx - c * cy], [0, 0, 1]]))
        st.record(RotateParams(a))


class RandomCrop(Op):
    """Cut an (h, w) window at a random position (canvas smaller than the crop: padded bottom/right).

    ``cat_max_ratio``: re-draw the position (up to 10 times, as mmseg) while one class other
    than ignore covers more than this share of the window's labelled pixels. It needs the
    label (``params(..., label=)``); without one the first position is kept.
    """

    kind = Kind.GEOMETRIC
    TRIES = 10

    def __init__(self, h: int, w: int, cat_max_ratio: float | None = None) -> None:
        self.h, self.w = _int("crop height", h, 1, MAX_OUTPUT_SIDE), _int("crop width", w, 1, MAX_OUTPUT_SIDE)
        check_output((self.h, self.w), what=f"crop {self.h}x{self.w}")
        self.cat_max_ratio = None if cat_max_ratio is None else _num("cat_max_ratio", cat_max_ratio, 0, 1)

    def _window(self, rng: np.random.Generator, st: _State) -> tuple[int, int]:
        h, w = st.hw
        return int(rng.integers(0, max(h - self.h, 0) + 1)), int(rng.integers(0, max(w - self.w, 0) + 1))

    def draw(self, rng: np.random.Generator, st: _State) -> None:
        y0, x0 = self._window(rng, st)
        if self.cat_max_ratio is not None and self.cat_max_ratio < 1 and st.label is not None:
            for _ in range(self.TRIES):  # as mmseg: 10 checks, the last re-draw kept unchecked
                m = (st.t @ _shift(x0, y0))[:2]
                crop = warp_labels(st.label, m, (self.h, self.w), st.ignore_index)
                _, counts = np.unique(crop[crop != st.ignore_index], return_counts=True)
                if len(counts) > 1 and counts.max() / counts.sum() < self.cat_max_ratio:
                    break
                y0, x0 = self._window(rng, st)
        st.then(_shift(x0, y0), (self.h, self.w))
        st.record(CropParams((y0, x0)))


def _shift(x0: float, y0: float) -> np.ndarray:
    return np.array([[1.0, 0, x0], [0, 1, y0], [0, 0, 1]])


class ColorJitter(Op):
    """Brightness / contrast (one per-sample 256-entry LUT), saturation, hue; factors in [1-v, 1+v].

    Contrast pivots about mid-grey 128 (not the image mean), so it stays a per-sample LUT.
    ``hue`` is a shift in [-hue, hue] of the full circle (``hue <= 0.5``).
    """

    def __init__(self, brightness: float = 0.0, contrast: float = 0.0, saturation: float = 0.0,
                 hue: float = 0.0) -> None:
        self.brightness = _num("brightness", brightness, 0, MAX_JITTER)
        self.contrast = _num("contrast", contrast, 0, MAX_JITTER)
        self.saturation = _num("saturation", saturation, 0, MAX_JITTER)
        self.hue = _num("hue", hue, 0, 0.5)

    def draw(self, rng: np.random.Generator, st: _State) -> None:
        u = rng.uniform(-1.0, 1.0, 4)
        st.record(JitterParams(float(1 + self.brightness * u[0]), float(1 + self.contrast * u[1]),
                               float(1 + self.saturation * u[2]), float(self.hue * u[3]) + 0.0))

    def output_spec(self, spec: BatchSpec) -> BatchSpec:
        if spec.image_dtype not in LEVELS:
            raise ConfigError(f"ColorJitter applies to integer images ({', '.join(LEVELS)}), not {spec.image_dtype}: "
                              "a float image has no range to keep levels in", fix="drop jitter from the pipeline")
        if (self.saturation or self.hue) and (spec.channels != 3 or spec.image_dtype != "uint8"):
            raise ConfigError(f"ColorJitter's saturation and hue mean something for RGB images only (3 channels, "
                              f"uint8), not for {spec.channels}-channel {spec.image_dtype}",
                              fix="use jitter=B:C (brightness and contrast, per band) only")
        return spec

    def layout(self) -> dict[str, tuple[str, tuple[int | str | None, ...]]]:
        out: dict[str, tuple[str, tuple[int | str | None, ...]]] = {}
        if self.brightness or self.contrast:
            out["lut"] = ("uint8", ("B", 256))  # brightness then contrast as one LUT: colour_luts
            out["bc"] = ("float64", ("B", 2))  # the factors themselves, for 16-bit images: levels.brightness_contrast
        if self.saturation:
            out["sat"] = ("float32", ("B",))
        if self.hue:
            out["shift"] = ("int32", ("B",))  # OpenCV's 8-bit hue units, rounded as the CPU path rounds
        return out

    def pack(self, records: Sequence[Any]) -> dict[str, np.ndarray]:
        want = self.layout()
        out = {}
        if "lut" in want:
            out["lut"] = colour_luts(records)
            out["bc"] = np.array([[r.brightness, r.contrast] for r in records], np.float64).reshape(-1, 2)
        if "sat" in want:
            out["sat"] = np.array([r.saturation for r in records], np.float32)
        if "shift" in want:
            out["shift"] = np.array([round(r.hue * 180) for r in records], np.int32)
        return out


def colour_luts(records: Sequence[Any]) -> np.ndarray:
    """Brightness then contrast (about 128) as one uint8 LUT of 256 entries per sample, (B, 256), for records
    with ``brightness`` and ``contrast`` (:class:`JitterParams` or :class:`Params`); the batch at once (the same
    float64 operations element by element as one sample alone, so the same values)."""
    b = np.array([r.brightness for r in records], np.float64).reshape(-1, 1)
    c = np.array([r.contrast for r in records], np.float64).reshape(-1, 1)
    v = np.arange(256, dtype=np.float64) * b
    return np.clip(np.rint((v - 128.0) * c + 128.0), 0, 255).astype(np.uint8)


class RandomGamma(Op):
    """Gamma correction, albumentations' ``RandomGamma``: a gamma drawn uniformly from [lo, hi] per sample
    (its ``gamma_limit=(80, 120)`` is ``RandomGamma(0.8, 1.2)``). uint8 images: its 256-entry LUT
    ``uint8((v / 255) ** gamma * 255)`` (truncated; :func:`gamma_luts`). uint16 and int16: over the dtype's whole
    range, ``lo + rint(((v - lo) / (hi - lo)) ** gamma * (hi - lo))`` (:func:`shardkit.augment.levels.gamma_table16`).
    float32: ``v ** gamma`` for values in [0, 1], a ConfigError for values outside (no range to map them over).
    Images only: labels never change."""

    def __init__(self, lo: float = 0.8, hi: float = 1.2) -> None:
        self.lo, self.hi = _num("gamma lo", lo, 0, MAX_GAMMA), _num("gamma hi", hi, 0, MAX_GAMMA)
        if not 0 < self.lo <= self.hi:
            raise ConfigError(f"gamma range must satisfy 0 < lo <= hi, got {lo}:{hi}")

    def draw(self, rng: np.random.Generator, st: _State) -> None:
        st.record(GammaParams(float(rng.uniform(self.lo, self.hi))))

    def layout(self) -> dict[str, tuple[str, tuple[int | str | None, ...]]]:
        # uint8: the table; other dtypes: the gamma itself (each backend builds the 16-bit table or raises floats)
        return {"lut": ("uint8", ("B", 256)), "gamma": ("float64", ("B",))}

    def pack(self, records: Sequence[Any]) -> dict[str, np.ndarray]:
        gammas = [r.gamma for r in records]
        return {"lut": gamma_luts(gammas), "gamma": np.asarray(gammas, np.float64).reshape(-1)}


def gamma_luts(gammas: Sequence[float]) -> np.ndarray:
    """(B, 256) uint8: albumentations' gamma table for each gamma, its own expression (``np.arange`` with a
    1/255 step, raised, times 255, truncated), so the same bytes."""
    base = np.arange(0, 256.0 / 255, 1.0 / 255)[:256]
    return np.stack([(base ** g) * 255 for g in gammas]).astype(np.uint8).reshape(-1, 256)


def _ints(values: Any, lo: int, hi: int | None) -> tuple[int, ...] | None:
    """``values`` as a tuple of integers in [lo, hi] (no bools, no fractions), or None."""
    try:
        vals = tuple(values)
        ok = all(not isinstance(v, (bool, str)) and int(v) == v and lo <= v and (hi is None or v <= hi)
                 for v in vals)
    except (TypeError, ValueError, OverflowError):
        return None
    return tuple(int(v) for v in vals) if ok else None


class Cutout(Op):
    """Cut ``holes`` rectangles of ``h`` x ``w`` output pixels (mmseg's ``RandomCutOut``): image pixels there
    become ``fill``: one level for every band (a grey level), or one value per band (an RGB triple for RGB
    images); each within the images' dtype (0..255 for uint8, 0..65535 for uint16, -32768..32767 for int16,
    any finite value for float32; checked against the batch, :meth:`output_spec`). A fill whose values are all
    equal is a grey level: it fills any band count. Labels stay unchanged, or with ``ignore_labels`` become the
    ignore index (mmseg's ``seg_fill_in``).

    ``holes`` is a count or a (lo, hi) range drawn per sample (``(0, 2)``: none, one or two). Each
    hole's top-left corner is drawn uniformly over the output; holes are clipped at its border and
    may overlap. Holes are cut in the output canvas, after the geometry and colour ops, so a Cutout
    must follow every geometry op, and a pipeline has at most one.
    """

    kind = Kind.MASK

    def __init__(self, holes: int | tuple[int, int], h: int, w: int, *, fill: float | Sequence[float] = 0,
                 ignore_labels: bool = False) -> None:
        counts = _ints((holes, holes) if np.ndim(holes) == 0 else holes, 0, MAX_HOLES)
        if counts is None or len(counts) != 2 or counts[0] > counts[1]:
            raise ConfigError(f"cutout holes must be a count in [0, {MAX_HOLES}] or a range (lo, hi) of them with "
                              f"lo <= hi, got {holes!r}")
        lo, hi = counts
        if _ints((h, w), 1, MAX_OUTPUT_SIDE) is None:
            raise ConfigError(f"cutout hole size must be integers in [1, {MAX_OUTPUT_SIDE}], got {h}x{w}")
        rgb = _fill_values((fill,) * 3 if np.ndim(fill) == 0 else fill)
        if rgb is None:
            raise ConfigError(f"cutout fill must be a level or one value per band (1 to {MAX_BANDS} finite numbers "
                              f"within ±{MAX_FILL}), got {fill!r}")
        self.holes = (int(lo), int(hi))
        self.h, self.w = int(h), int(w)
        self.fill = rgb
        self.ignore_labels = bool(ignore_labels)

    def draw(self, rng: np.random.Generator, st: _State) -> None:
        n = int(rng.integers(self.holes[0], self.holes[1] + 1))
        h, w = st.hw
        ys, xs = rng.integers(0, h, n), rng.integers(0, w, n)
        st.record(CutoutParams(tuple((int(y), int(x), min(int(y) + self.h, h), min(int(x) + self.w, w))
                                     for y, x in zip(ys, xs, strict=True)), self.fill, self.ignore_labels))

    def output_spec(self, spec: BatchSpec) -> BatchSpec:
        band_fill(self.fill, spec.channels, spec.image_dtype)
        return spec

    def layout(self) -> dict[str, tuple[str, tuple[int | str | None, ...]]]:
        return {"boxes": ("int32", ("B", None, 4))}  # (y0, x0, y1, x1), padded with empty boxes

    def pack(self, records: Sequence[Any]) -> dict[str, np.ndarray]:
        boxes = np.zeros((len(records), max((len(r.holes) for r in records), default=0), 4), np.int32)
        for k, r in enumerate(records):
            boxes[k, :len(r.holes)] = np.asarray(r.holes, np.int32).reshape(-1, 4)
        return {"boxes": boxes}


#: Largest magnitude of a Cutout fill value (float32 images; integer images: their dtype's range).
MAX_FILL = 1e6


def _fill_values(values: Any) -> tuple[int | float, ...] | None:
    """``values`` as a tuple of 1 to MAX_BANDS finite numbers within ±MAX_FILL (integral ones as int), or None."""
    try:
        vals = tuple(values)
        ok = 0 < len(vals) <= MAX_BANDS and all(
            not isinstance(v, (bool, str, bytes)) and math.isfinite(float(v)) and abs(float(v)) <= MAX_FILL
            for v in vals)
    except (TypeError, ValueError, OverflowError):
        return None
    if not ok:
        return None
    return tuple(int(v) if float(v) == int(float(v)) else float(v) for v in vals)


def band_fill(fill: Sequence[int | float], channels: int, dtype: str) -> tuple[int | float, ...]:
    """A Cutout ``fill`` as one value per band of ``channels``-band ``dtype`` images: all values equal (a level)
    fill every band; else one per band. A ConfigError when the count does not match or a value does not fit."""
    given = tuple(fill)
    if len(set(given)) == 1:
        fill = (given[0],) * channels
    if len(fill) != channels:
        raise ConfigError(f"Cutout's fill {given} has {len(fill)} values, the images {channels} bands",
                          fix="give one level for every band, or one value per band")
    limits = IMAGE_RANGES.get(dtype)
    if limits is not None and not all(float(v).is_integer() and limits[0] <= v <= limits[1] for v in fill):
        raise ConfigError(f"Cutout's fill {given} does not fit {dtype} images (integers "
                          f"{limits[0]:g}..{limits[1]:g})", fix="give a fill within the images' dtype")
    return tuple(fill)


class Normalize(Op):
    """Images → float32 ``(x - mean) * (1 / std)`` per channel (band): one mean and one std for each of the
    images' N channels, on the images' own value scale (0–255 for uint8, 0–65535 for uint16, the values
    themselves for int16 / float32), e.g. a split's ``ds.mean`` / ``ds.std`` (:meth:`from_split`). The one
    definition of normalising that every reader and backend applies."""

    kind = Kind.OUTPUT
    normalizes_images = True

    def __init__(self, mean: Sequence[float] | np.ndarray, std: Sequence[float] | np.ndarray) -> None:
        try:
            m, s = np.asarray(mean, np.float64).reshape(-1), np.asarray(std, np.float64).reshape(-1)
        except (TypeError, ValueError, OverflowError):
            m = s = np.zeros(0)
        n = f"{m.size}" if 0 < m.size <= MAX_BANDS else f"1 to {MAX_BANDS}"
        if (not 0 < m.size <= MAX_BANDS or m.shape != s.shape or not (np.abs(m) <= MAX_MEAN).all()
                or not ((s >= MIN_STD) & (s <= MAX_MEAN)).all()):
            raise ConfigError(f"Normalize needs {n} means in [-{MAX_MEAN:g}, {MAX_MEAN:g}] and {n} stds in "
                              f"[{MIN_STD:g}, {MAX_MEAN:g}] (one per image channel, on the images' value scale), "
                              f"got mean={mean!r} std={std!r}")
        self.mean = tuple(float(v) for v in m)  # as given: each backend rounds them to its dtype
        self.std = tuple(float(v) for v in s)

    @classmethod
    def from_split(cls, ds: Any) -> Normalize:
        """The split's own per-band statistics: ``Normalize(ds.mean, ds.std)`` (a :class:`shardkit.Dataset`)."""
        return cls(ds.mean, ds.std)

    def draw(self, rng: np.random.Generator, st: _State) -> None:
        return None

    def output_spec(self, spec: BatchSpec) -> BatchSpec:
        if spec.channels != len(self.mean):
            raise ConfigError(f"Normalize has {len(self.mean)} means and stds, the images {spec.channels} channels",
                              fix="give one mean and one std per channel")
        return dataclasses.replace(spec, image_dtype="float32")

    def layout(self) -> dict[str, tuple[str, tuple[int | str | None, ...]]]:
        return {"constants": ("float32", (2, len(self.mean)))}

    def pack(self, records: Sequence[Any]) -> dict[str, np.ndarray]:
        """The mean and ``1 / std`` as float32 (2, C): what the device kernels upload."""
        return {"constants": np.stack([self.mean_f32, self.inv_std_f32])}

    @property
    def mean_f32(self) -> np.ndarray:
        return np.asarray(self.mean, np.float32)

    @property
    def inv_std_f32(self) -> np.ndarray:
        """``1 / std`` rounded to float32 once: every backend multiplies by this same value."""
        return np.float32(1.0) / np.asarray(self.std, np.float32)

    def numpy(self, images: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The numpy application (channels last; no OpenCV, so the reader core uses it too), into ``out``."""
        if out is None:
            out = np.empty(images.shape, np.float32)
        if images.ndim and images.shape[-1] == len(self.mean) and normalize_uint8(
                images, self.mean_f32, self.inv_std_f32, out):  # one compiled pass over uint8 batches
            return out
        np.subtract(images, self.mean_f32, out=out, dtype=np.float32)
        np.multiply(out, self.inv_std_f32, out=out)
        return out


class OneHot(Op):
    """Label ids → one-hot, ``(…, H, W, C)`` or with ``channels_first`` ``(…, C, H, W)``, uint8 or float32.

    The ignore class is never a channel (the rule of :mod:`shardkit.codecs.onehot`, on every backend): ignore
    pixels — augmentation padding included — are all-zero vectors, and when the ignore index (the one the
    pipeline is called with) lies inside ``0..num_classes-1`` (CamVid's 11) the output has
    ``num_classes - 1`` channels, the classes above the ignore id moved down by one (:meth:`channels`).
    The label side of an output: it is :class:`shardkit.codecs.encoding.OneHot`, the encoding a reader's
    ``labels="onehot"`` gives."""

    kind = Kind.OUTPUT

    def __init__(self, num_classes: int, dtype: Any = np.uint8, *, channels_first: bool = False) -> None:
        num_classes = _int("OneHot num_classes", num_classes, 1, MAX_CLASSES)
        try:
            dt = np.dtype(dtype)
        except TypeError:
            dt = None
        if dt not in (np.dtype(np.uint8), np.dtype(np.float32)):
            raise ConfigError(f"OneHot dtype must be uint8 or float32, got {dtype!r}")
        self.num_classes = int(num_classes)
        self.dtype = dt.name
        self.channels_first = bool(channels_first)

    def draw(self, rng: np.random.Generator, st: _State) -> None:
        return None

    def output_spec(self, spec: BatchSpec) -> BatchSpec:
        return dataclasses.replace(spec, labels="onehot")

    def channels(self, ignore_index: int | None) -> int:
        """Output channels under ``ignore_index``: ``num_classes``, less one when the ignore id is a class."""
        return hot_channels(self.num_classes, ignore_index)

    def encoding(self, ignore_index: int | None) -> encoding.OneHot:
        """The encoding this op gives under ``ignore_index`` (the ignore class without a channel)."""
        return encoding.OneHot(self.num_classes, self.dtype, channels_first=self.channels_first,
                               ignore_index=ignore_index)

    def numpy(self, ids: np.ndarray, ignore_index: int | None, out: np.ndarray | None = None) -> np.ndarray:
        """The numpy application: :meth:`shardkit.codecs.encoding.OneHot.encode` (numba kernels when installed)."""
        return self.encoding(ignore_index).encode(ids, out)


_local = threading.local()


def _generator() -> np.random.Generator:
    """This thread's reusable Generator, re-seeded by :func:`seeding.reseed` before every op's draw (building
    one costs a SeedSequence run; draws within a thread never interleave)."""
    gen = getattr(_local, "gen", None)
    if gen is None:
        gen = _local.gen = np.random.Generator(np.random.PCG64(0))
    return gen


class Compose:
    """A pipeline of ops. ``aug(images, labels, indices, seed=, epoch=, ignore_index=)`` → augmented batch."""

    def __init__(self, ops: Sequence[Op]) -> None:
        for op in ops:
            if not isinstance(op, Op):
                raise ConfigError(f"Compose takes augmentation ops, got {type(op).__name__}")
        cutouts = [k for k, op in enumerate(ops) if isinstance(op, Cutout)]
        if len(cutouts) > 1:
            raise ConfigError("a pipeline takes one Cutout", fix="draw more holes with Cutout(holes=(lo, hi), ...)")
        if cutouts and any(op.geometric for op in ops[cutouts[0]:]):
            raise ConfigError("Cutout must come after the geometry ops (scale, crop, flip, rotate): it cuts "
                              "holes in the output", fix="move cutout to the end of the pipeline")
        firsts = [k for k, op in enumerate(ops) if op.output]
        if firsts and not all(op.output for op in ops[firsts[0]:]):
            raise ConfigError("Normalize and OneHot must end the pipeline: they turn the batch into float "
                              "images / one-hot labels", fix="move them after the other ops")
        if sum(op.normalizes_images for op in ops) > 1:
            raise ConfigError("a pipeline takes one Normalize (or VolumeNormalize)")
        if sum(isinstance(op, OneHot) for op in ops) > 1:
            raise ConfigError("a pipeline takes one OneHot")
        self.ops = list(ops)
        #: Each drawing (non-output) op's position in the pipeline → its record's place in ``Params.records``.
        self.record_at = {k: j for j, k in enumerate(k for k, op in enumerate(self.ops) if op.draws)}
        if self.out_hw is not None:
            check_output(self.out_hw, self.channels)

    def kernels(self, table: Mapping[type, K], backend: str) -> list[tuple[int, Op, K]]:
        """``(position, op, kernel)`` of every non-geometric op, in pipeline order, from a backend's kernel
        ``table`` (keyed by op class; a subclass takes its base's kernel). Geometric ops need none: they are folded
        into the one matrix every backend applies. An op with no kernel here is one ConfigError before anything
        runs, never skipped."""
        out = []
        for k, op in enumerate(self.ops):
            if op.geometric:
                continue
            kernel = next((table[c] for c in type(op).__mro__ if c in table), None)
            if kernel is None:
                raise ConfigError(f"the {backend} augmentation backend does not apply {type(op).__name__} "
                                  f"({op.kind.value} op): it has no kernel for it",
                                  fix="drop it from the pipeline, or augment on a backend that has one")
            out.append((k, op, kernel))
        return out

    @property
    def channels(self) -> int:
        """Values per output pixel that bound a sample's size: 3 image channels, or the one-hot classes."""
        return max([3] + [op.num_classes for op in self.ops if isinstance(op, OneHot)])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compose) and self.ops == other.ops

    def __repr__(self) -> str:
        return f"Compose({self.ops!r})"

    def output_spec(self, spec: BatchSpec) -> BatchSpec:
        """The spec of the batch this pipeline gives for input batches of ``spec``: each op's in turn; a
        ConfigError naming the first op that cannot take its input (e.g. hue on 4-band images)."""
        for op in self.ops:
            spec = op.output_spec(spec)
        return spec

    def records(self, params: Sequence[Params], position: int) -> list[Any]:
        """The records that the op at ``position`` drew for each sample of ``params``."""
        j = self.record_at[position]
        return [p.records[j] for p in params]

    @property
    def normalizes(self) -> bool:
        """True when the pipeline ends in :class:`Normalize` or another normalising op (float32 images out)."""
        return any(op.normalizes_images for op in self.ops)

    @property
    def one_hot(self) -> bool:
        """True when the pipeline ends in :class:`OneHot` (one-hot labels out)."""
        return any(isinstance(op, OneHot) for op in self.ops)

    @property
    def out_hw(self) -> tuple[int, int] | None:
        """Output size fixed by the last crop, or None when the output follows the input size."""
        crops = [op for op in self.ops if isinstance(op, RandomCrop)]
        return (crops[-1].h, crops[-1].w) if crops else None

    def params(self, index: int, *, seed: int = 0, epoch: int = 0, hw: tuple[int, int],
               label: np.ndarray | None = None, ignore_index: int = 255) -> Params:
        """Draw sample ``index``'s parameters for an input of height/width ``hw``."""
        return self.params_batch([index], seed=seed, epoch=epoch, hws=[hw], labels=[label],
                                 ignore_index=ignore_index)[0]

    def params_batch(self, indices: Sequence[int] | np.ndarray, *, seed: int = 0, epoch: int = 0,
                     hws: Sequence[tuple[int, int]], labels: Sequence[np.ndarray | None] | None = None,
                     ignore_index: int = 255) -> list[Params]:
        """:meth:`params` for each of ``indices`` (input sizes ``hws``, labels for ``cat_max_ratio``): the same
        values, with the per-op generators' seeding done for the whole batch at once (:mod:`.seeding`)."""
        idx = [int(i) for i in np.asarray(indices).reshape(-1)]
        states = seeding.op_states(seed, epoch, idx, len(self.ops))
        gen = _generator()
        out = []
        for s in range(len(idx)):
            st = _State(hws[s], None if labels is None else labels[s], ignore_index, idx[s])
            recs = st.values["records"]
            for k, op in enumerate(self.ops):
                if op.draws:  # plain output ops draw nothing
                    before = len(recs)
                    op.draw(seeding.reseed(gen, states[s][k]), st)
                    if len(recs) == before:
                        recs.append(None)  # an op that records nothing (a custom geometric one)
                    elif len(recs) > before + 1:
                        raise ConfigError(f"{type(op).__name__}.draw recorded {len(recs) - before} records; an "
                                          "op records one (st.record)")
            check_output(st.hw, self.channels, f"augmented sample {idx[s]} (input {hws[s][0]}x{hws[s][1]})")
            m = st.t[:2].copy()
            m.setflags(write=False)
            out.append(Params(matrix=m, out_hw=st.hw, **st.values))
        return out

    def __call__(self, images: Any, labels: Any, indices: Sequence[int] | np.ndarray, *, seed: int = 0,
                 epoch: int = 0, ignore_index: int | None = 255,
                 out: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The batch augmented by the numpy/OpenCV backend; ``out``: arrays to write it into when they fit
        (:func:`shardkit.augment.cpu.apply_batch`; the arrays returned are then ``out`` itself)."""
        apply = backends.apply_batch("numpy")
        return apply(self, images, labels, indices, seed=seed, epoch=epoch,
                     ignore_index=255 if ignore_index is None else int(ignore_index), out=out)


# ---------------------------------------------------------------------- string form
def _range(key: str, text: str) -> tuple[float, float]:
    lo, sep, hi = text.partition(":")
    if not sep:
        raise ConfigError(f"augment {key}={text!r}: expected LO:HI, e.g. {key}=0.5:2")
    return _num(f"{key} lo", lo), _num(f"{key} hi", hi)


def _digits(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` also takes full-width and other scripts' digits)."""
    return text.isascii() and text.isdigit()


def _hw(key: str, text: str) -> tuple[int, int]:
    h, sep, w = text.lower().partition("x")
    if not sep or not _digits(h) or not _digits(w):
        raise ConfigError(f"augment {key}={text!r}: expected HxW, e.g. {key}=512x1024")
    return int(h), int(w)


_CUTOUT_FORM = "cutout=N:HxW[:FILL][:ignore], e.g. cutout=2:32x64 or cutout=0-3:48x48:128:ignore"


def _cutout(val: str) -> Cutout:
    """``N:HxW[:FILL][:ignore]`` (N a count or LO-HI) → :class:`Cutout`."""
    parts = [p.strip() for p in val.split(":")]
    if len(parts) < 2:
        raise ConfigError(f"augment cutout={val!r}: expected {_CUTOUT_FORM}")
    lo, dash, hi = parts[0].partition("-")
    if not _digits(lo) or (dash and not _digits(hi)):
        raise ConfigError(f"augment cutout={val!r}: hole count {parts[0]!r} is not N or LO-HI; expected "
                          f"{_CUTOUT_FORM}")
    h, sep, w = parts[1].lower().partition("x")
    if not sep or not _digits(h) or not _digits(w):
        raise ConfigError(f"augment cutout={val!r}: hole size {parts[1]!r} is not HxW; expected {_CUTOUT_FORM}")
    fill: int | float | None = None
    ignore = False
    for extra in parts[2:]:
        if extra.lower() == "ignore" and not ignore:
            ignore = True
        elif _FILL_TEXT.fullmatch(extra) and fill is None:
            fill = int(extra) if _digits(extra.lstrip("-")) else float(extra)
        else:  # cutout
            raise ConfigError(f"augment cutout={val!r}: {extra!r} is neither a fill level (a number) nor 'ignore'; "
                              f"expected {_CUTOUT_FORM}")
    return Cutout((int(lo), int(hi if dash else lo)), int(h), int(w), fill=fill or 0, ignore_labels=ignore)


#: A Cutout FILL in the string form: an optionally negative decimal number, ASCII digits only.
_FILL_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?")


PARSE_KEYS = ("scale", "crop", "hflip", "rotate", "jitter", "cutout", "gamma")  # the items parse() knows, in docs order


def parse(text: str) -> Compose:
    """``"scale=0.5:2,crop=512x1024,hflip,rotate=10,jitter=0.2,cutout=2:32x64"`` → the equal :class:`Compose`.

    Keys: ``scale=LO:HI``, ``crop=HxW`` (``crop=HxW:R`` adds cat_max_ratio R), ``hflip`` or
    ``hflip=P``, ``rotate=DEG``, ``jitter=V`` (brightness and contrast V) or ``jitter=B:C[:S[:H]]``,
    ``gamma=LO:HI`` (a gamma drawn per sample), ``cutout=N:HxW[:FILL][:ignore]``: N holes (or LO-HI, drawn per
    sample) of H x W pixels, every band filled with level FILL (default 0), whose labels become the ignore index
    with ``:ignore`` (else unchanged).
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("augment string is empty; expected e.g. 'scale=0.5:2,crop=512x1024,hflip'")
    if len(text) > MAX_TEXT:
        raise ConfigError(f"augment string is {len(text)} characters, more than {MAX_TEXT}")
    ops: list[Op] = []
    for part in text.split(","):
        key, sep, val = (s.strip() for s in part.partition("="))
        key = key.lower()
        if not key:
            raise ConfigError(f"augment string {text!r} has an empty item")
        if key not in PARSE_KEYS:
            raise ConfigError(f"unknown augment item {key!r}; known: {', '.join(PARSE_KEYS)} "
                              "(docs/augment-grammar.md)")
        if key == "hflip":
            ops.append(RandomFlip(_num("hflip", val) if sep else 0.5))
            continue
        if not sep or not val:
            raise ConfigError(f"augment item {part.strip()!r} needs a value ({key}=…)")
        if key == "scale":
            ops.append(RandomScale(*_range(key, val)))
        elif key == "crop":
            size, _, ratio = val.partition(":")
            ops.append(RandomCrop(*_hw(key, size), cat_max_ratio=_num("crop ratio", ratio) if ratio else None))
        elif key == "rotate":
            ops.append(RandomRotate(_num("rotate", val)))
        elif key == "jitter":
            vals = [_num("jitter", v) for v in val.split(":")]
            if len(vals) > 4:
                raise ConfigError(f"augment jitter={val!r}: at most B:C:S:H")
            ops.append(ColorJitter(*(vals * 2 if len(vals) == 1 else vals)))
        elif key == "gamma":
            ops.append(RandomGamma(*_range(key, val)))
        else:  # cutout
            ops.append(_cutout(val))
    return Compose(ops)
