"""What ``shardkit audit`` reports about a converted dataset, gathered from its manifests and sidecars.

Everything per split comes from the manifest (class pixel counts and shares, ignore share, shard files, the
annotation sources' rasterisation report, the label options) and the samples sidecars (keys, class bitmaps, pixel
hashes): no label is decoded, so the facts of a 200,000-sample split cost a few bytes per sample. Only the few
samples drawn for the picture grid (:func:`draw_indices`) are read, and what is said of single labels beyond the
bitmaps (ignore share per image, the share of the largest class, tiny connected components) is said of those
samples alone (:func:`label_sanity`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from ..read.dataset import Dataset
from ..store.duplicates import DuplicateReport, find_duplicates, split_hashes
from ..store.stats import ignore_share
from .groups import GroupRule
from .near import DEFAULT_THRESHOLD, NearReport, near_report
from .split import leaks, pool

log = logging.getLogger(__name__)

#: a label whose largest class covers at least this share of its pixels is "almost all one class"
ONE_CLASS_SHARE = 0.95
#: a connected region of one class smaller than this many pixels (8-connected) is "tiny"
TINY_COMPONENT = 16
#: names listed at most per finding (the rest are counted)
LISTED = 10
#: shared groups and duplicate groups pictured side by side at most (each picture reads one sample)
PICTURED = 4
#: the preprocessing entries that say how label values became class ids
LABEL_OPTIONS = ("label_encoding", "label_interpolation", "colour_tolerance", "unknown_as", "ignore_index",
                 "cityscapes_train_ids", "label_map", "reduce_zero_label", "threshold", "tile",
                 "drop_tiles_ignored", "size", "resize", "crop")


@dataclass(frozen=True)
class ClassFacts:
    """One class of a split: its pixels (and share of them, as the manifest counts it) and the images holding
    it (from the class bitmaps; None without them)."""

    id: int
    name: str
    colour: tuple[int, int, int] | None
    pixels: int
    pixel_share: float
    images: int | None


@dataclass
class SplitFacts:
    """One split's facts, from its manifest and sidecars."""

    split: str
    folder: Path
    samples: int
    shards: int
    bytes: int
    format: str
    classes: list[ClassFacts]
    ignore_index: int | None
    ignore_share: float | None
    never_present: list[int]
    one_class: int | None  # images whose bitmap holds exactly one class (None without bitmaps)
    one_class_keys: list[tuple[str, int]]  # the first of them: (key, the class)
    sources: int  # distinct keys: tiles of one source share their key
    tiles: dict[str, Any] | None  # tiles per source (min, median, max) of a tiled split, None otherwise
    annotations: dict[str, Any] | None
    label_options: dict[str, Any]
    class_source: str
    skipped: int


@dataclass
class AuditFacts:
    """The facts of every split of one output, and what is found across them."""

    splits: list[SplitFacts]
    rule: str
    groups: int
    group_sizes: list[tuple[str, int]]  # the largest groups, largest first
    group_size_counts: dict[int, int]  # group size → how many groups have it
    shared_groups: dict[str, list[str]]  # group → the splits it is in (more than one)
    duplicates: DuplicateReport
    notes: list[str] = field(default_factory=list)
    #: the first :data:`PICTURED` shared groups, each with its first sample in each of its splits: (split, index)
    leak_examples: list[tuple[str, list[tuple[str, int]]]] = field(default_factory=list)
    #: near-duplicate pairs by kind (None: a split keeps no look hashes), and examples of each kind as
    #: ((split, index), (split, index), bits)
    near: NearReport | None = None
    near_examples: dict[str, list[tuple[tuple[str, int], tuple[str, int], int]]] = field(default_factory=dict)


def _class_facts(ds: Dataset, presence: np.ndarray | None) -> list[ClassFacts]:
    stats = ds.manifest.stats
    pixels = list(stats.class_pixels or ())
    shares = list(stats.class_share or ())
    images = presence.sum(axis=0).tolist() if presence is not None else None
    out = []
    for c, (name, colour) in enumerate(zip(ds.class_names, ds.class_colours, strict=True)):
        out.append(ClassFacts(c, name, colour, int(pixels[c]) if c < len(pixels) else 0,
                              float(shares[c]) if c < len(shares) else 0.0,
                              int(images[c]) if images is not None else None))
    return out


def split_facts(ds: Dataset, presence: np.ndarray | None, keys: Sequence[str]) -> SplitFacts:
    """The facts of one split (``presence`` and ``keys``: its rows of the pooled table)."""
    m = ds.manifest
    classes = _class_facts(ds, presence)
    ignore = m.classes.ignore_index
    counted = [c for c in classes if c.id != ignore]
    never = [c.id for c in counted if (c.images == 0 if c.images is not None else c.pixels == 0)]
    one_class = one_keys = None
    if presence is not None:
        single = np.flatnonzero(presence.sum(axis=1) == 1)
        one_class = len(single)
        one_keys = [(keys[int(i)], int(np.argmax(presence[i]))) for i in single[:LISTED]]
    per_source = Counter(keys)
    preprocessing = m.preprocessing.options
    tiled = preprocessing.get("tile") is not None
    tiles = None
    if tiled and per_source:
        counts = np.fromiter(per_source.values(), np.int64)
        tiles = {"sources": len(counts), "min": int(counts.min()), "median": float(np.median(counts)),
                 "max": int(counts.max()), "tile": "x".join(map(str, preprocessing.get("tile") or ()))}
    options = {k: preprocessing[k] for k in LABEL_OPTIONS if preprocessing.get(k) not in (None, False)}
    return SplitFacts(
        split=m.split, folder=Path(ds.path), samples=m.num_samples, shards=len(m.shards),
        bytes=sum(f.bytes for s in m.shards for f in s.all_files), format=m.format, classes=classes,
        ignore_index=ignore, ignore_share=ignore_share(m, ignore, len(classes)),
        never_present=never, one_class=one_class, one_class_keys=one_keys or [], sources=len(per_source),
        tiles=tiles, annotations=m.source.extra.get("annotations"), label_options=options,
        class_source=m.classes.source or "an unrecorded source", skipped=len(m.skipped))


def gather(datasets: Sequence[Dataset], rule: GroupRule, near: int = DEFAULT_THRESHOLD) -> AuditFacts:
    """The facts of ``datasets`` (the splits of one output) with groups by ``rule`` and near-duplicates within
    ``near`` bits; reads sidecars only."""
    pooled = pool(datasets, rule)
    splits = []
    start = 0
    for k, ds in enumerate(datasets):
        n = len(ds)
        presence = pooled.presence[start:start + n] if pooled.presence is not None else None
        splits.append(split_facts(ds, presence, pooled.keys[start:start + n]))
        start += n
        log.debug("audit: split %d (%s) gathered", k, ds.manifest.split)
    sizes = Counter(pooled.groups)
    shards = []
    for ds in datasets:
        shards += split_hashes(ds.manifest, ds.manifest.split)
    notes = []
    if pooled.presence is None:
        notes.append("no class bitmaps (more than 256 classes): images per class and one-class images are not "
                     "known; classes never present are judged by their pixel counts")
    shared = leaks(pooled)
    first: dict[tuple[str, int], int] = {}  # (group, split position) → its first sample's index in the split
    wanted = set(list(shared)[:PICTURED])
    starts = np.concatenate([[0], np.cumsum([len(ds) for ds in datasets])])
    for row, (g, s) in enumerate(zip(pooled.groups, pooled.split_of.tolist(), strict=True)):
        if g in wanted:
            first.setdefault((g, int(s)), row - int(starts[int(s)]))
    examples = [(g, [(pooled.splits[s], i) for (h, s), i in sorted(first.items()) if h == g]) for g in wanted]
    nearby = None if pooled.looks is None else near_report(pooled.split_of, pooled.groups, pooled.looks, near)
    if pooled.looks is None:
        notes.append(f"near-duplicates not searched: {', '.join(pooled.unhashed)} keep no look hashes (converted "
                     "before them; re-convert with --force to add them)")

    def place(row: int) -> tuple[str, int]:
        s = int(pooled.split_of[row])
        return pooled.splits[s], row - int(starts[s])

    near_examples = {k: [(place(i), place(j), b) for i, j, b in got]
                     for k, got in (nearby.examples.items() if nearby is not None else ())}
    return AuditFacts(splits=splits, rule=rule.describe(), groups=len(sizes),
                      group_sizes=sizes.most_common(LISTED), group_size_counts=dict(sorted(Counter(
                          sizes.values()).items())), shared_groups=shared,
                      duplicates=find_duplicates(shards), notes=notes,
                      leak_examples=sorted(examples, key=lambda e: list(shared).index(e[0])),
                      near=nearby, near_examples=near_examples)


def draw_indices(num_samples: int, count: int, seed: int = 0) -> list[int]:
    """``count`` sample indices (all of them when fewer) drawn without replacement from ``seed``, ascending."""
    if num_samples <= count:
        return list(range(num_samples))
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xA0D17]))
    return sorted(int(i) for i in rng.choice(num_samples, size=count, replace=False))


@dataclass(frozen=True)
class LabelSanity:
    """What one label read in full shows: the ignore share, the largest class and its share, and the connected
    regions (8-connected, per class) smaller than :data:`TINY_COMPONENT` pixels."""

    ignore_share: float | None
    top_class: int
    top_share: float
    tiny_components: int
    components: int

    @property
    def almost_one_class(self) -> bool:
        return self.top_share >= ONE_CLASS_SHARE


def label_sanity(ids: np.ndarray, num_classes: int, ignore_index: int | None) -> LabelSanity:
    """The :class:`LabelSanity` of one (H, W) label of class ids."""
    flat = np.asarray(ids).ravel()
    counts = np.bincount(flat, minlength=num_classes)
    total = max(int(counts.sum()), 1)
    ignored = None if ignore_index is None else int(counts[ignore_index]) / total if ignore_index < len(counts) else 0.0
    classes = counts[:num_classes].copy()
    if ignore_index is not None and ignore_index < num_classes:
        classes[ignore_index] = 0
    top = int(np.argmax(classes))
    tiny = regions = 0
    for c in np.flatnonzero(classes).tolist():
        n, _, stats, _ = cv2.connectedComponentsWithStats((ids == c).astype(np.uint8), connectivity=8)
        areas = stats[1:, cv2.CC_STAT_AREA]
        regions += n - 1
        tiny += int((areas < TINY_COMPONENT).sum())
    return LabelSanity(ignored, top, int(classes[top]) / total, tiny, regions)
