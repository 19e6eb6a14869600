"""Label value maps: how the raw values of a label file become class ids, when the user asks for it.

Three ways, at most one per conversion (each recorded in the manifest's preprocessing, so fingerprints
change with it):

- ``--label-map 255:1,0:0`` (or a file): a lookup table; a source may be a range ``128-255:1``. Values the
  map does not name are kept as they are (and then range-checked: never silently mapped).
- ``--reduce-zero-label``: mmsegmentation's rule (ADE20K, LoveDA): 0 → the ignore id, every other value
  ``v`` → ``v - 1``, and the ignore id itself stays the ignore id (255 stays 255).
- ``--threshold T``: binary masks, JPEG ones included: ``v > T`` → 1, else 0. Refused on a label that
  holds more than two classes' worth of values (:meth:`ValueMap.check_binary`).

No map moves a class onto the ignore id, or two raw values onto one id, unless it says so: an ignore id that
--reduce-zero-label would reach from a class's raw value is refused with the table, and a label holding a raw
value the map would merge without naming it (``255:1`` and a raw 1; raw 256 under --reduce-zero-label) is
refused naming the value, its pixel count and the fix (:meth:`ValueMap.check_merges`).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputNotFoundError, LabelError
from .classes import _MAX_LISTED, ClassTable
from .hints import NOISE_LEVELS, jpeg_fix, two_levels
from .policy import TableChoice
from .tablefiles import load_table_json, read_table_text

MAX_VALUE = 65535  # raw label values are 8- or 16-bit
#: mmsegmentation's ignore id, used by --reduce-zero-label when the class table has none.
REDUCE_ZERO_IGNORE = 255
_ENTRY = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*[:=,\s]\s*(\d+)\s*$")
_HEADER = re.compile(r"^\s*[A-Za-z_][\w ]*?\s*[:=,\t ]\s*[A-Za-z_][\w ]*$")
_FORM = "write it like --label-map 255:1,0:0 (ranges: 128-255:1), or give a file of 'SRC:ID' lines"


def _parse_entries(entries: list[str], where: str) -> tuple[tuple[int, int, int], ...]:
    out: list[tuple[int, int, int]] = []
    for entry in entries:
        m = _ENTRY.match(entry)
        if not m:
            raise ConfigError(f"{where}: {entry.strip()!r} is not SRC:ID or LO-HI:ID", fix=_FORM)
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        dst = int(m.group(3))
        if not 0 <= lo <= hi <= MAX_VALUE or dst > MAX_VALUE:
            raise ConfigError(f"{where}: {entry.strip()!r} is outside 0..{MAX_VALUE} (or LO > HI)", fix=_FORM)
        out.append((lo, hi, dst))
    out.sort()
    for (a_lo, a_hi, _), (b_lo, b_hi, _) in itertools.pairwise(out):
        if b_lo <= a_hi:
            raise ConfigError(f"{where}: source values {a_lo}-{a_hi} and {b_lo}-{b_hi} overlap",
                              fix="give every raw value one target")
    if not out:
        raise ConfigError(f"{where}: the label map is empty", fix=_FORM)
    return tuple(out)


def parse_label_map(text: str) -> tuple[tuple[int, int, int], ...]:
    """``--label-map``'s value: inline ``SRC:ID,…`` entries, or a file (lines of ``SRC:ID`` / ``SRC ID``
    with ``#`` comments and an optional header line of words such as ``raw,id``, or a JSON object
    ``{"255": 1, "0-127": 0}`` whose targets are integers) → sorted ``(lo, hi, id)`` ranges. Files are read as
    class tables are (:func:`~shardkit.labels.tablefiles.read_table_text`: size and JSON nesting bounded)."""
    text = str(text).strip()
    path = Path(text)
    if ":" in text and not path.is_file():
        return _parse_entries(text.split(","), f"--label-map {text!r}")
    where = f"--label-map {text}"
    try:
        body = read_table_text(path, "label map")
        obj = load_table_json(body, "label map", path) if path.suffix.lower() == ".json" else None
    except InputNotFoundError:
        raise ConfigError(f"--label-map {text!r} is neither SRC:ID entries nor an existing file",
                          fix=_FORM) from None
    except LabelError as exc:
        raise ConfigError(exc.problem, fix=exc.fix or _FORM) from None
    if obj is not None:
        if not isinstance(obj, dict):
            raise ConfigError(f"{where}: expected a JSON object of SRC: ID", fix=_FORM)
        bad = next(((k, v) for k, v in obj.items() if isinstance(v, bool) or not isinstance(v, int | str)), None)
        if bad is not None:
            raise ConfigError(f"{where}: target {bad[1]!r} of {bad[0]!r} is not an integer id", fix=_FORM)
        return _parse_entries([f"{k}:{v}" for k, v in obj.items()], where)
    lines = [line.split("#", 1)[0] for line in body.splitlines()]
    lines = [line for line in lines if line.strip()]
    if lines and _HEADER.match(lines[0]):  # "raw,id" / "src id": a header row is never an entry
        lines = lines[1:]
    return _parse_entries(lines, where)


@dataclass(frozen=True)
class ValueMap:
    """Raw label values → class ids, applied right after decoding (before any remap and the range check)."""

    mapping: tuple[tuple[int, int, int], ...] = ()  # (lo, hi, id): raw lo..hi → id
    reduce_zero_label: bool = False
    threshold: int | None = None

    def __post_init__(self) -> None:
        chosen = [name for name, on in (("--label-map", bool(self.mapping)),
                                        ("--reduce-zero-label", self.reduce_zero_label),
                                        ("--threshold", self.threshold is not None)) if on]
        if len(chosen) > 1:
            raise ConfigError(f"{' and '.join(chosen)} both given",
                              fix="pass one: a --label-map can express any of them")
        if self.threshold is not None and not 0 <= self.threshold < MAX_VALUE:
            raise ConfigError(f"--threshold {self.threshold} must be between 0 and {MAX_VALUE - 1}")
        object.__setattr__(self, "mapping", tuple(tuple(int(v) for v in e) for e in self.mapping))

    @classmethod
    def from_options(cls, label_map: str | None, reduce_zero_label: bool, threshold: int | None) -> ValueMap:
        """The value map of the CLI / config options (``label_map``: inline entries or a file)."""
        mapping = parse_label_map(label_map) if label_map else ()
        return cls(mapping, bool(reduce_zero_label), threshold)

    @property
    def active(self) -> bool:
        return bool(self.mapping) or self.reduce_zero_label or self.threshold is not None

    @property
    def takes_lossy(self) -> bool:
        """Whether JPEG (lossy) labels may be read: only a threshold or a map of value ranges makes sense of
        their compression noise."""
        return bool(self.mapping) or self.threshold is not None

    def describe(self) -> str:
        """The option as a user would write it (messages, dry run)."""
        if self.threshold is not None:
            return f"--threshold {self.threshold}"
        if self.reduce_zero_label:
            return "--reduce-zero-label"
        if self.mapping:
            return "--label-map " + ",".join(f"{lo}:{d}" if lo == hi else f"{lo}-{hi}:{d}"
                                             for lo, hi, d in self.mapping)
        return "no value map"

    def to_json(self) -> dict[str, Any]:
        """The manifest's preprocessing entries: only the option given (none when inactive, so datasets
        converted without one keep their settings and fingerprints byte for byte)."""
        if self.threshold is not None:
            return {"threshold": self.threshold}
        if self.reduce_zero_label:
            return {"reduce_zero_label": True}
        if self.mapping:
            return {"label_map": [list(e) for e in self.mapping]}
        return {}

    def implied_num_classes(self, ignore_index: int | None) -> int | None:
        """The class count the map itself states: 2 for a threshold, the largest target (other than the ignore
        id) + 1 for a label map; None otherwise."""
        if self.threshold is not None:
            return 2
        targets = [d for _, _, d in self.mapping if d != ignore_index]
        return max(targets) + 1 if targets else None

    def ignore_id(self, ignore_index: int | None) -> int | None:
        """The ignore id under this map: --reduce-zero-label's (mmsegmentation's 255) when none is given."""
        return REDUCE_ZERO_IGNORE if ignore_index is None and self.reduce_zero_label else ignore_index

    def adapt_table(self, table: ClassTable) -> ClassTable:
        """The class table under this map: a threshold needs exactly 2 classes; --reduce-zero-label needs an
        ignore id (mmsegmentation's 255 when the table has none) that no class's raw value reaches: raw ``v``
        is class ``v - 1``, so an ignore id ``I <= C`` would take raw ``I + 1`` (class ``I``) or raw ``I`` (class
        ``I - 1``) into ignore — refused."""
        if self.threshold is not None and table.num_classes != 2:
            raise ConfigError(f"--threshold makes binary masks (2 classes) but the class table "
                              f"({table.source}) has {table.num_classes}",
                              fix="drop --threshold for multi-class ids (use --label-map), or fix --num-classes")
        if not self.reduce_zero_label:
            return table
        ig = self.ignore_id(table.ignore_index)
        if table.ignore_index is None:
            table = table.with_ignore_index(REDUCE_ZERO_IGNORE)
        c = table.num_classes
        if ig is not None and ig <= c:
            lost = (f"raw {ig + 1} (class {ig} {table.classes[ig].name!r}) would become {ig} too" if ig < c else
                    f"raw {ig} (class {ig - 1} {table.classes[ig - 1].name!r}) would stay {ig}")
            fix = ("drop --ignore-index 0: --reduce-zero-label makes raw 0 the ignore id itself (255); where the "
                   "table gives 0 (objectInfo150's ids 1..150), drop --reduce-zero-label, or pass --classes with the "
                   "names alone, in order, for mmsegmentation's reduced ids" if ig == 0
                   else f"pass --ignore-index with an id above every class (--ignore-index "
                        f"{REDUCE_ZERO_IGNORE if c < REDUCE_ZERO_IGNORE else MAX_VALUE}), or a --label-map "
                        "naming every raw value")
            raise ConfigError(f"--reduce-zero-label makes raw 0 the ignore id {ig}, but the class table "
                              f"({table.source}) has {c} classes: {lost}, and the class would be ignored", fix=fix)
        return table

    def adapt(self, choice: TableChoice) -> TableChoice:
        """:meth:`adapt_table` of a table choice, its reason saying where an ignore id it adds comes from (so the
        run's log line and the manifest name the same ignore id)."""
        table = self.adapt_table(choice.table)
        if table.ignore_index == choice.table.ignore_index:
            return TableChoice(table, choice.reason)
        return TableChoice(table, f"{choice.reason}, ignore id {table.ignore_index} from {self.describe()} "
                                  "(raw 0)")

    def merges(self, ignore_index: int | None) -> tuple[tuple[int, int], ...]:
        """(raw value, id) pairs this map puts on an id another raw value goes to without saying so: a value a
        --label-map does not name but targets (``255:1`` keeps raw 1 as 1: raw 1 and 255 would both be 1; a
        target that is the ignore id excepted), and under --reduce-zero-label raw ``I + 1``, which becomes the
        ignore id ``I`` as raw 0 does. A label holding such a value is refused (:meth:`check_merges`)."""
        if self.reduce_zero_label:
            ig = self.ignore_id(ignore_index)
            return ((ig + 1, ig),) if ig is not None and ig < MAX_VALUE else ()
        named = [(lo, hi) for lo, hi, _ in self.mapping]
        targets = sorted({d for _, _, d in self.mapping})
        return tuple((d, d) for d in targets
                     if d != ignore_index and not any(lo <= d <= hi for lo, hi in named))

    def check_merges(self, raw: np.ndarray, ignore_index: int | None, path: Path | None = None) -> None:
        """Refuse a label whose raw values :meth:`merges` would put on one id (or a class on the ignore id)
        without the map saying so, naming the value, its pixel count and the fix."""
        for value, target in self.merges(ignore_index):
            if raw.dtype.kind in "ui" and value > np.iinfo(raw.dtype).max:
                continue
            n = int(np.count_nonzero(raw == value))
            if not n:
                continue
            if self.reduce_zero_label:
                raise LabelError(
                    f"--reduce-zero-label turns raw value {value} ({n} px) into {target}, the ignore id raw 0 "
                    "becomes: a class would be ignored", path=path,
                    fix=f"pass --ignore-index with an id above every class (e.g. --ignore-index {MAX_VALUE}) so "
                        f"raw {value} stays a class, or a --label-map naming every raw value")
            sources = ", ".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi, d in self.mapping if d == target)
            raise LabelError(
                f"{self.describe()} maps raw {sources} to {target}, and raw value {value} ({n} px), which it does "
                f"not name, stays {target}: two raw values would become one id", path=path,
                fix=f"name raw {value} in the map: {value}:{target} if it is the same class, else {value}:ID "
                    "with its own id")

    def lut(self, size: int, ignore_index: int | None) -> np.ndarray:
        """Raw values ``0..size-1`` → ids as a lookup table (uint8 when every output fits, else uint16)."""
        lut = np.arange(size, dtype=np.int64)
        if self.threshold is not None:
            lut = (lut > self.threshold).astype(np.int64)
        elif self.reduce_zero_label:
            ig = REDUCE_ZERO_IGNORE if ignore_index is None else ignore_index
            lut -= 1
            lut[0] = ig
            if 0 < ig < size:
                lut[ig] = ig
        else:
            for lo, hi, dst in self.mapping:
                if lo < size:
                    lut[lo : min(hi, size - 1) + 1] = dst
        return lut.astype(np.uint8 if int(lut.max(initial=0)) <= 255 else np.uint16)

    def apply(self, raw: np.ndarray, ignore_index: int | None) -> np.ndarray:
        """Raw integer label values mapped to ids by :meth:`lut` (what the decoder does, for a scan of the values),
        after :meth:`check_merges` (a LabelError without the file, which the caller adds)."""
        self.check_merges(raw, ignore_index)
        return self.lut(int(raw.max(initial=0)) + 1, ignore_index)[raw]

    def check_binary(self, raw: np.ndarray, lossy: bool, path: Path) -> None:
        """Refuse ``--threshold`` on a label that is not a binary mask.

        Lossless files: at most two distinct values, one ``<= T`` and one ``> T``. JPEG: its two levels (most
        common value ``<= T`` and ``> T``) with the pixels within 16 levels of them (compression noise along
        edges) cover 95 % of the label, and no third value holds 2 % of it exactly (flat regions of a JPEG
        decode exactly: a third class shows as one value) — multi-class ids and grey levels fail.
        """
        t = self.threshold
        if t is None:
            return
        counts = np.bincount(raw.ravel(), minlength=1)
        present = np.flatnonzero(counts)
        if present.size <= 1:
            return
        if not lossy:
            if present.size == 2 and present[0] <= t < present[1]:
                return
            shown = ", ".join(f"{int(v)} ({int(counts[v])} px)" for v in present[:_MAX_LISTED])
            more = f" and {present.size - _MAX_LISTED} more" if present.size > _MAX_LISTED else ""
            raise LabelError(f"--threshold {t} is for binary masks, but the label holds {present.size} values "
                             f"({shown}{more})", path=path,
                             fix="multi-class ids need --num-classes N (or --label-map), not --threshold")
        lv = two_levels(counts, t)  # noise spreads over many values; a third class is one flat value
        if not lv.binary:
            raise LabelError(f"--threshold {t} is for binary masks, but this JPEG label is not one: "
                             f"{100 * lv.share:.1f} % of its pixels lie within {NOISE_LEVELS} levels of {lv.low} and "
                             f"{lv.high}, and {100 * lv.third_share:.1f} % are exactly {lv.third}", path=path,
                             fix=jpeg_fix(counts))


def ignore_warning(table: ClassTable, class_pixels: np.ndarray, ignore_pixels: int) -> str | None:
    """A warning when the ignore id holds more pixels than all foreground classes together (every class but
    0 and the ignore class): the sign of a 0/255 mask whose foreground ``--ignore-index 255`` turned into
    ignore. ``class_pixels`` / ``ignore_pixels``: the split's stats (ignore ids >= C counted apart)."""
    ig = table.ignore_index
    if ig is None:
        return None
    inside = ig < table.num_classes
    ignored = int(class_pixels[ig]) if inside else int(ignore_pixels)
    foreground = int(class_pixels[1:].sum()) - (ignored if inside and ig >= 1 else 0)
    if ignored == 0 or ignored <= foreground:
        return None
    return (f"the ignore id {ig} covers {ignored} px, more than every foreground class together ({foreground} px): "
            f"if {ig} is the foreground of binary masks, re-run with --label-map {ig}:1 or --threshold "
            f"{min(127, ig - 1) if ig > 0 else 0} instead of --ignore-index {ig}")
