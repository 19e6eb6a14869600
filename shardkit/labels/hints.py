"""What label values look like, and the flags that say what they mean: the one place every value hint comes from.

A hint is only ever one that, followed on such data, gives the labels the values mean (or another refusal):

- a JPEG label with two levels plus compression noise → ``--threshold T`` between the levels (never an ignore id:
  the noise is not a class); a JPEG that is not two levels → re-export losslessly, no flag;
- a 0/V binary mask → ``--label-map V:1`` or ``--threshold V//2`` (never ``--ignore-index V``: it would hide the
  foreground);
- evenly spaced codes (0/64/128/192/255, 0/85/170/255) → ``--label-map`` to their ranks (never
  ``--num-classes 256``: the codes would be kept as ids of a table of mostly absent classes);
- a usual ignore value (255, 65535) above the other values by more than they lie apart → ``--ignore-index 255``;
  an ignore id is never suggested for another value, nor for one next to the others (ids 17, 44, 45: 45 is a class);
- anything else is sparse class ids → ``--classes FILE`` or ``--num-classes max+1`` (ids kept as they are).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

JPEG_PROBLEM = ("label is a JPEG: lossy compression changes its values along every edge, so they cannot be read as "
                "class ids as they are")
#: Values datasets use to mark pixels to ignore (VOC's and mmsegmentation's 255; 65535 in 16-bit labels).
USUAL_IGNORE = (255, 65535)
_SPARSE_SLACK = 8  # ids 0..max may miss a few classes; a max far above the number of values is not ids
_MIN_CODE_GAP = 8  # codes are spread out: neighbouring ids (1, 2, 3) are never read as codes
_MAX_MAP_ENTRIES = 32  # a longer --label-map is left to a file
#: JPEG masks: pixels within this many levels of the two levels are compression noise (as --threshold checks).
NOISE_LEVELS = 16
BINARY_SHARE = 0.95
THIRD_SHARE = 0.02  # flat regions of a JPEG decode exactly: a third level this common is a third class


@dataclass(frozen=True)
class Levels:
    """A JPEG label's two levels at threshold ``t``, the share of pixels near them, and the most common other
    value with its share."""

    low: int
    high: int
    share: float
    third: int
    third_share: float

    @property
    def binary(self) -> bool:
        return self.share >= BINARY_SHARE and self.third_share <= THIRD_SHARE


def luma(r: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    """8-bit RGB as one gray channel, ITU-R 601 luma as PIL's ``convert("L")`` computes it (what ``--threshold``
    compares on colour masks)."""
    r, g, b = (c.astype(np.uint32) for c in (r, g, b))
    return ((19595 * r + 38470 * g + 7471 * b + 32768) >> 16).astype(np.uint8)


def two_levels(counts: np.ndarray, t: int) -> Levels:
    """The most common value ``<= t`` and ``> t`` of a value histogram, and how much of it lies near them."""
    low = int(np.argmax(counts[: t + 1]))
    high = t + 1 + int(np.argmax(counts[t + 1 :])) if counts.size > t + 1 else low
    values = np.arange(counts.size)
    total = max(int(counts.sum()), 1)
    near = (np.abs(values - low) <= NOISE_LEVELS) | (np.abs(values - high) <= NOISE_LEVELS)
    rest = counts.copy()
    rest[[low, high]] = 0
    third = int(np.argmax(rest))
    return Levels(low, high, float(counts[near].sum()) / total, third, float(rest[third]) / total)


def _present(counts: np.ndarray) -> list[int]:
    return [int(v) for v in np.flatnonzero(counts)]


def jpeg_fix(counts: np.ndarray) -> str:
    """The fix for JPEG labels read as ids: ``--threshold T`` midway between a two-level mask's levels (the
    threshold's own check then passes), else a lossless re-export — never an ignore id or a class count."""
    present = _present(counts)
    if len(present) >= 2:
        first = int(np.argmax(counts))
        far = [v for v in present if abs(v - first) > 2 * NOISE_LEVELS]
        if far:
            second = max(far, key=lambda v: int(counts[v]))
            t = (min(first, second) + max(first, second)) // 2
            if two_levels(counts, t).binary:
                return (f"a binary JPEG mask (levels {min(first, second)} and {max(first, second)} with compression "
                        f"noise): pass --threshold {t}")
    levels = _levels(counts)
    if levels is not None:
        cuts = [(a + b) // 2 for a, b in itertools.pairwise(levels)]
        ranges = [(lo, hi) for lo, hi in zip([0, *(c + 1 for c in cuts)], [*cuts, counts.size - 1], strict=True)]
        return (f"a JPEG of {len(levels)} levels ({', '.join(map(str, levels))}) with compression noise: pass "
                "--label-map " + ",".join(f"{lo}-{hi}:{i}" for i, (lo, hi) in enumerate(ranges)))
    return ("its values lie too close together for compression noise to be told from class ids: no flag reads it "
            "exactly; export the labels losslessly (PNG) from the annotation tool")


def _levels(counts: np.ndarray) -> list[int] | None:
    """A JPEG's flat levels when they lie far enough apart for its noise to be told from them: each holding
    :data:`THIRD_SHARE` of the pixels, more than twice :data:`NOISE_LEVELS` apart, and with the pixels near them
    :data:`BINARY_SHARE` of the label; else None."""
    total = max(int(counts.sum()), 1)
    common = [int(v) for v in np.flatnonzero(counts >= THIRD_SHARE * total)]
    if len(common) < 2 or len(common) > _MAX_MAP_ENTRIES:
        return None
    if any(b - a <= 2 * NOISE_LEVELS for a, b in itertools.pairwise(common)):
        return None
    values = np.arange(counts.size)
    near = np.zeros(counts.size, bool)
    for v in common:
        near |= np.abs(values - v) <= NOISE_LEVELS
    return common if float(counts[near].sum()) / total >= BINARY_SHARE else None


def _codes(values: list[int]) -> bool:
    """Whether ``values`` are evenly spaced codes (0/64/128/192/255, 0/85/170/255, 64/128/192): gaps at least
    :data:`_MIN_CODE_GAP` and equal up to rounding, starting at 0 or one gap."""
    if len(values) < 2:
        return False
    gaps = [b - a for a, b in itertools.pairwise(values)]
    g = min(gaps)
    tol = g // 8 + 1
    return g >= _MIN_CODE_GAP and max(gaps) - g <= tol and (values[0] <= tol or abs(values[0] - g) <= tol)


def _rank_map(values: list[int]) -> str:
    return ",".join(f"{v}:{i}" for i, v in enumerate(values))


def _spread(values: list[int]) -> int:
    """The largest gap between neighbouring ``values`` (at least :data:`_MIN_CODE_GAP`): a value further than
    this above them stands apart from them; one closer is one of them (45 beside 44)."""
    return max([_MIN_CODE_GAP, *(b - a for a, b in itertools.pairwise(values))])


def _ids_fit(values: list[int], num_classes: int | None) -> bool:
    """Whether ``values`` can be ids ``0..N-1`` of one table (of ``num_classes`` when known)."""
    top = max(values)
    if num_classes is not None:
        return top < num_classes
    return top + 1 <= 2 * len(values) + _SPARSE_SLACK


def _listed(values: list[int]) -> str:
    return ", ".join(map(str, values[:8])) + (", …" if len(values) > 8 else "")


def read_values(counts: np.ndarray, *, num_classes: int | None = None,
                ignore_index: int | None = None) -> tuple[str, str] | None:
    """What lossless label values that are not ids of one table look like, and the fix: ``(what, fix)``; None
    when they fit (``num_classes`` known: every value below it; else a maximum not far above their number).
    ``ignore_index``, the table's ignore id when it has one, is left out."""
    values = [v for v in _present(counts) if v != ignore_index]
    if not values or _ids_fit(values, num_classes):
        return None
    top = max(values)
    if len(values) == 2 and values[0] == 0 and top > 1:
        return (f"a binary 0/{top} mask, not class ids 0..1",
                f"--label-map {top}:1 or --threshold {top // 2}")
    if _codes(values):
        what = f"values {_listed(values)} are evenly spaced codes of {len(values)} classes, not class ids"
        if len(values) > _MAX_MAP_ENTRIES:
            return what, "--label-map FILE with one 'CODE:ID' line per code"
        return what, f"--label-map {_rank_map(values)}"
    rest = values[:-1]
    if top in USUAL_IGNORE and rest and top - rest[-1] > _spread(rest):
        what = f"{top} lies far above the other values ({_listed(rest)}): it marks pixels to ignore"
        if _ids_fit(rest, num_classes):
            return what, f"--ignore-index {top}"
        if _codes(rest) and len(rest) <= _MAX_MAP_ENTRIES:
            return what + f", and {_listed(rest)} are evenly spaced codes", \
                f"--label-map {_rank_map(rest)} --ignore-index {top}"
        return what + ", and the others are sparse class ids", \
            f"--ignore-index {top} --num-classes {max(rest) + 1} (or --ignore-index {top} with --classes FILE naming " \
            "every class)"
    count = f"the table has {num_classes} classes" if num_classes is not None else f"only {len(values)} values"
    return (f"ids up to {top} but {count}: sparse class ids of a larger table",
            f"--classes FILE naming every class, or --num-classes {top + 1} (the ids kept as they are)")
