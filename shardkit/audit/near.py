"""Near-duplicates: samples whose look hashes (formats/samples.md ``looks``) differ in at most ``threshold`` of 64
bits — a copy re-encoded as JPEG or resized lands within a bit or two of its original.

Found by multi-index hashing, not by comparing every pair: the 64 bits are cut into ``threshold + 1`` chunks, and
two hashes within ``threshold`` bits agree exactly on at least one chunk (pigeonhole), so only samples that share a
chunk value are compared, bucket by bucket, a block of rows at a time (memory bounded whatever a bucket's size).
Each pair is reported once, and classed by whether its two samples lie in one split and in one group: a pair across
splits and across groups is a leak the groups do not explain; pairs inside one group (frames of one sequence, tiles
of one scene) are similar by nature and are counted apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError

#: bits (of 64) two look hashes may differ in and still be near-duplicates by default
DEFAULT_THRESHOLD = 4
#: rows compared at a time inside one bucket
_BLOCK = 256
#: the kinds of pair, in report order
KINDS = ("across splits, other groups", "across splits, same group", "one split, other groups", "same group")


def as_words(looks: np.ndarray) -> np.ndarray:
    """(N, 8) uint8 look hashes → (N,) uint64, most significant byte first (the hash's bit order)."""
    return np.ascontiguousarray(looks, np.uint8).view(">u8").reshape(-1).astype(np.uint64)


def near_pairs(looks: np.ndarray, threshold: int = DEFAULT_THRESHOLD) -> np.ndarray:
    """Every pair ``(i, j, bits)``, ``i < j``, of rows of ``looks`` ((N, 8) uint8) whose hashes differ in at most
    ``threshold`` bits; (P, 3) int64, sorted by ``i`` then ``j``."""
    if not 0 <= threshold <= 16:
        raise ConfigError(f"near-duplicate threshold {threshold} is not 0..16 bits (of 64)",
                          fix="pass a threshold such as 4")
    words = as_words(looks)
    found: list[np.ndarray] = []
    chunks = threshold + 1
    for c in range(chunks):
        lo, hi = 64 * c // chunks, 64 * (c + 1) // chunks
        values = (words >> np.uint64(64 - hi)) & np.uint64((1 << (hi - lo)) - 1)
        order = np.argsort(values, kind="stable")
        cuts = np.flatnonzero(np.diff(values[order])) + 1
        for run in np.split(order, cuts):
            if len(run) > 1:
                found += _within(np.sort(run), words, threshold)
    if not found:
        return np.zeros((0, 3), np.int64)
    return np.unique(np.concatenate(found), axis=0)  # each pair once, rows sorted: by i, then j


def _within(run: np.ndarray, words: np.ndarray, threshold: int) -> list[np.ndarray]:
    """The pairs of ``run`` (ascending rows sharing a chunk value) within ``threshold`` bits, a block at a time."""
    out = []
    w = words[run]
    for a in range(0, len(run) - 1, _BLOCK):
        rows = w[a:a + _BLOCK]
        bits = np.bitwise_count(rows[:, None] ^ w[None, a + 1:])  # (block, later)
        r, k = np.nonzero(bits <= threshold)
        keep = k + a + 1 > r + a  # each row against the rows after it only
        r, k = r[keep], k[keep]
        if len(r):
            out.append(np.stack([run[r + a], run[k + a + 1], bits[r, k].astype(np.int64)], axis=1))
    return out


@dataclass
class NearReport:
    """Near-duplicate pairs of pooled samples, counted by kind; the first few of each kind kept as examples
    ``(first, second, bits)`` (pooled rows)."""

    threshold: int
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    examples: dict[str, list[tuple[int, int, int]]] = field(default_factory=lambda: {k: [] for k in KINDS})
    #: splits whose sidecars keep no look hashes (converted before the column): not searched
    unhashed: list[str] = field(default_factory=list)

    @property
    def leaks(self) -> int:
        """Pairs across splits and across groups: near-duplicates the groups do not explain."""
        return self.counts[KINDS[0]]

    def line(self) -> str:
        said = ", ".join(f"{n} {k}" for k, n in self.counts.items())
        return f"near-duplicates (look hashes within {self.threshold} of 64 bits): {said}"


def near_report(split_of: np.ndarray, groups: Sequence[str], looks: np.ndarray, threshold: int = DEFAULT_THRESHOLD,
                examples: int = 8) -> NearReport:
    """The near-duplicate pairs of pooled samples (``split_of`` and ``groups`` per row, ``looks`` (N, 8)) by kind."""
    report = NearReport(threshold)
    group_ids = np.unique(np.asarray(groups, dtype=object), return_inverse=True)[1] if len(groups) else np.zeros(0)
    for i, j, bits in near_pairs(looks, threshold).tolist():
        same_split = split_of[i] == split_of[j]
        same_group = group_ids[i] == group_ids[j]
        kind = KINDS[3] if same_group and same_split else KINDS[1] if same_group else \
            KINDS[2] if same_split else KINDS[0]
        report.counts[kind] += 1
        if len(report.examples[kind]) < examples:
            report.examples[kind].append((int(i), int(j), int(bits)))
    return report
