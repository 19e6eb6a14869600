"""Iterative stratification over groups (Sechidis, Tsoumakas and Vlahavas, ECML 2011), so that rare classes land
in every part of a split and no group is cut.

Each group carries how many of its images contain each class (from the per-sample class bitmaps). The class with
the fewest images still unassigned is taken first; each of its groups (in an order drawn from the seed) goes to a
part that has none of that class yet, while there is one (so a class in at least as many groups as there are parts
lands in every part — the original algorithm deals by need alone and can leave a small part without a rare
class), the one that most lacks that class, then the part that most lacks images, then the lowest-numbered part.
Groups with no class go last, to the part that most lacks images. A pure function of the inputs and the seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError


def parse_ratios(text: str) -> dict[str, float]:
    """``"train=0.8,val=0.1,test=0.1"`` → ``{part: share}``; shares positive, normalised to sum 1."""
    parts: dict[str, float] = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        name, sep, value = item.partition("=")
        try:
            share = float(value)
        except ValueError:
            share = -1.0
        if not sep or not name.strip().isidentifier() or not share > 0 or not np.isfinite(share):
            raise ConfigError(f"--into {item!r} is not PART=SHARE with a positive share",
                              fix="write it like --into train=0.8,val=0.1,test=0.1")
        if name.strip() in parts:
            raise ConfigError(f"--into names {name.strip()!r} twice", fix="name each part once")
        parts[name.strip()] = share
    if len(parts) < 2:
        raise ConfigError(f"--into {text!r} names fewer than two parts", fix="e.g. --into train=0.8,val=0.2")
    total = sum(parts.values())
    return {k: v / total for k, v in parts.items()}


def stratify(presence: np.ndarray, sizes: Sequence[int] | np.ndarray, ratios: Sequence[float], seed: int) -> np.ndarray:
    """The part (0..P-1) of each group. ``presence``: (G, C) images of each group containing each class;
    ``sizes``: images per group; ``ratios``: the parts' shares (summing to 1)."""
    counts = np.asarray(presence, np.float64)
    size = np.asarray(sizes, np.float64)
    share = np.asarray(ratios, np.float64)
    g_count = len(size)
    want_images = share * size.sum()
    want_class = share[:, None] * counts.sum(axis=0)[None, :]
    part = np.full(g_count, -1, np.int64)
    order = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5EED])).permutation(g_count)
    rank = np.empty(g_count, np.int64)
    rank[order] = np.arange(g_count)
    left = counts.copy()
    has = np.zeros_like(want_class, dtype=bool)  # (P, C): the part holds some of the class
    while True:
        totals = left.sum(axis=0)
        open_classes = np.flatnonzero(totals > 0)
        if not len(open_classes):
            break
        c = int(open_classes[np.argmin(totals[open_classes])])
        members = np.flatnonzero((left[:, c] > 0) & (part < 0))
        for g in members[np.argsort(rank[members], kind="stable")]:
            lacking = np.flatnonzero(~has[:, c])
            p = _most_lacking(want_class[:, c], want_images, lacking if len(lacking) else None)
            part[g] = p
            has[p] |= counts[g] > 0
            want_class[p] -= counts[g]
            want_images[p] -= size[g]
            left[g] = 0
    for g in np.flatnonzero(part < 0)[np.argsort(rank[part < 0], kind="stable")]:
        p = int(np.argmax(want_images))
        part[g] = p
        want_images[p] -= size[g]
    return part


def _most_lacking(lack_class: np.ndarray, lack_images: np.ndarray, among: np.ndarray | None) -> int:
    """The part (of ``among``, default all) lacking the class most; ties by images lacking; then the lowest
    number."""
    best = np.arange(len(lack_class)) if among is None else among
    best = best[lack_class[best] == lack_class[best].max()]
    if len(best) > 1:
        best = best[lack_images[best] == lack_images[best].max()]
    return int(best[0])
