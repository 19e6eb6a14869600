"""Identical images within and across splits, found by the pixel hash every sample's sidecar row keeps.

A sample's pixel hash (:func:`shardkit.files.samples.pixel_hash`) is taken of its stored pixels, so a copy of an
image saved again under another name or re-encoded losslessly is found although its file bytes (and its
fingerprint) differ; near-duplicates (a JPEG re-compression, a resize) are not. Copies are ordered as the
conversion plans them (splits in discovery order, then sample index): the first copy is the one kept by
``convert --on-duplicate skip``, so the choice is the same for any worker count. Pure numpy over
(n, 16) hash arrays: no pixels are read here.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ..files.samples import PIXEL_HASH_BYTES

if TYPE_CHECKING:
    from .manifest import Manifest

log = logging.getLogger(__name__)

#: ``convert --on-duplicate`` choices.
ON_DUPLICATE = ("warn", "error", "skip")
#: Duplicate groups a convert run logs, and ``info --duplicates`` prints, one line each for (the rest are counted).
LOGGED_GROUPS = 20
#: Copies of a group named on its line (the rest are counted): a line stays short however many copies a group has.
SHOWN_COPIES = 3


@dataclass(frozen=True)
class Copy:
    """One sample of a duplicate group: its split, global index in that split and key (the image path)."""

    split: str
    index: int
    key: str

    def __str__(self) -> str:
        return f"{self.split}:{self.key}"


@dataclass(frozen=True)
class DuplicateGroup:
    """Samples with identical pixels, in plan order (the first is the one ``--on-duplicate skip`` keeps)."""

    copies: tuple[Copy, ...]

    @property
    def across_splits(self) -> bool:
        """Whether the copies lie in more than one split (leakage between train and val/test)."""
        return len({c.split for c in self.copies}) > 1

    def __str__(self) -> str:
        return " = ".join(map(str, self.copies))

    def summary(self, shown: int = SHOWN_COPIES) -> str:
        """One bounded line: the number of copies and the first ``shown`` of them (``3 copies: a = b = c``,
        ``200000 copies: a = b = c = … (199997 more)``)."""
        text = " = ".join(map(str, self.copies[:shown]))
        more = len(self.copies) - shown
        return f"{len(self.copies)} copies: {text}" + (f" = … ({more} more)" if more > 0 else "")

    def to_json(self) -> dict[str, Any]:
        return {"across_splits": self.across_splits,
                "copies": [{"split": c.split, "index": c.index, "key": c.key} for c in self.copies]}


@dataclass
class ShardHashes:
    """One shard's pixel hashes ((n, 16) uint8, None where its sidecar keeps none) and its samples' keys (lazily:
    only shards holding a duplicate are asked). ``first``: the global index of its first sample in its split."""

    split: str
    first: int
    hashes: np.ndarray | None
    keys: Callable[[], Sequence[str]]


@dataclass
class DuplicateReport:
    """What :func:`find_duplicates` found: the groups, the samples checked and the shards without hashes."""

    groups: list[DuplicateGroup]
    samples: int
    unchecked: list[tuple[str, int]]  # (split, first index) of shards whose records keep no pixel hashes
    hashes: list[bytes] = field(default_factory=list)  # each group's pixel hash

    @property
    def extra_copies(self) -> int:
        """Samples beyond the first of their group (what ``--on-duplicate skip`` leaves out)."""
        return sum(len(g.copies) - 1 for g in self.groups)

    @property
    def across_splits(self) -> int:
        return sum(g.across_splits for g in self.groups)

    def line(self) -> str:
        """One summary line (convert's summary, ``shardkit info --duplicates``)."""
        if not self.groups:
            text = f"no duplicate images among {self.samples} samples"
        else:
            text = (f"{self.extra_copies} duplicate image(s) in {len(self.groups)} group(s) among {self.samples} "
                    f"samples, {self.across_splits} group(s) across splits")
        if self.unchecked:
            text += f"; {len(self.unchecked)} shard(s) have no pixel hashes (re-run convert with --force)"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"samples": self.samples, "groups": [g.to_json() for g in self.groups],
                "extra_copies": self.extra_copies, "across_splits": self.across_splits,
                "shards_without_pixel_hashes": len(self.unchecked)}


def group_rows(hashes: np.ndarray) -> list[np.ndarray]:
    """Row positions of every hash that occurs more than once: each group ascending, groups by first position."""
    rows = np.ascontiguousarray(hashes, np.uint8).reshape(-1, PIXEL_HASH_BYTES)
    if len(rows) < 2:
        return []
    words = rows.view("<u8")  # (n, 2): two 64-bit halves, sorted lexicographically
    order = np.lexsort((np.arange(len(rows)), words[:, 1], words[:, 0]))
    sorted_words = words[order]
    same = np.all(sorted_words[1:] == sorted_words[:-1], axis=1)
    starts = np.flatnonzero(np.concatenate([[True], ~same]))
    ends = np.append(starts[1:], len(rows))
    groups = [order[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True) if b - a > 1]
    return sorted(groups, key=lambda g: int(g[0]))


def find_duplicates(shards: Sequence[ShardHashes]) -> DuplicateReport:
    """Every group of identical images among ``shards`` (given in plan order)."""
    have = [s for s in shards if s.hashes is not None]
    unchecked = [(s.split, s.first) for s in shards if s.hashes is None]
    sizes = np.array([len(s.hashes) for s in have if s.hashes is not None], np.int64)
    total = int(sizes.sum())
    if not total:
        return DuplicateReport([], 0, unchecked)
    hashes = np.concatenate([s.hashes for s in have if s.hashes is not None])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    keys: dict[int, Sequence[str]] = {}

    def copy(row: int) -> Copy:
        k = int(np.searchsorted(starts, row, side="right")) - 1
        if k not in keys:
            keys[k] = have[k].keys()
        local = row - int(starts[k])
        return Copy(have[k].split, have[k].first + local, str(keys[k][local]))

    rows = group_rows(hashes)
    groups = [DuplicateGroup(tuple(copy(int(r)) for r in g)) for g in rows]
    return DuplicateReport(groups, total, unchecked, [bytes(hashes[int(g[0])]) for g in rows])


#: ``(split, key)`` of a sample to leave out → (the kept copy ``split:key``, its pixel hash in hex)
Drops = dict[tuple[str, str], tuple[str, str]]


def drops(report: DuplicateReport) -> Drops:
    """Every copy after the first of its group, for ``--on-duplicate skip``."""
    return {(c.split, c.key): (str(g.copies[0]), report.hashes[i].hex())
            for i, g in enumerate(report.groups) for c in g.copies[1:]}


def group_lines(report: DuplicateReport, limit: int = LOGGED_GROUPS) -> list[str]:
    """One line per group (at most ``limit``, each naming at most :data:`SHOWN_COPIES` copies), then one line
    counting the groups left out: the output is bounded whatever the number of groups and copies."""
    lines = [f"identical images{' across splits' if g.across_splits else ''}: {g.summary()}"
             for g in report.groups[:limit]]
    if len(report.groups) > limit:
        lines.append(f"… and {len(report.groups) - limit} more group(s) of identical images "
                     "(shardkit info OUT --duplicates --json lists every copy)")
    return lines


def log_report(report: DuplicateReport, level: int = logging.WARNING) -> None:
    """:func:`group_lines`, one log record each."""
    lines = group_lines(report)
    for g, line in zip(report.groups[:LOGGED_GROUPS], lines, strict=False):
        log.log(level, "%s", line, extra={"event": "duplicate", "copies": [str(c) for c in g.copies[:SHOWN_COPIES]],
                                          "count": len(g.copies)})
    if len(report.groups) > LOGGED_GROUPS:
        log.log(level, "%s", lines[-1])


def row_keys(rows: np.ndarray) -> list[str]:
    """The keys (image paths) of checked sidecar rows."""
    return [bytes(k).decode("utf-8") for k in rows["key"].tolist()]


def source_hash(height: int, width: int, tiles: Iterable[tuple[Sequence[int], bytes]]) -> bytes:
    """One pixel hash for a whole tiled source, from its stored tiles' provenance values and pixel hashes in grid
    order (:data:`~shardkit.files.samples.PIXEL_HASH_BYTES` long). Two sources get the same one exactly when they have
    the same size and the same pixels — provided every tile of each is stored (the tiles then cover the source),
    so conversions with ``--drop-tiles-ignored`` have no such hash."""
    h = hashlib.blake2b(digest_size=PIXEL_HASH_BYTES, person=b"shardkit-source")
    h.update(np.array([height, width], "<u8").tobytes())
    for values, digest in tiles:
        h.update(np.asarray(values, "<u8").tobytes())
        h.update(digest)
    return h.digest()


def source_hashes(rows: np.ndarray) -> tuple[list[str], np.ndarray]:
    """(source keys in order, (n, 16) source hashes) from the checked sidecar rows of a tiled shard (its tiles in
    grid order, each source's tiles together)."""
    if not len(rows):  # a shard whose sources were all left out: its sidecar has no tile column
        return [], np.zeros((0, PIXEL_HASH_BYTES), np.uint8)
    keys = row_keys(rows)
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    tiles, pixels = rows["tile"], rows["pixels"]
    out = [source_hash(int(tiles[idx[0]][4]), int(tiles[idx[0]][5]),
                       ((tiles[i].tolist(), bytes(pixels[i])) for i in idx)) for idx in groups.values()]
    return list(groups), np.frombuffer(b"".join(out), np.uint8).reshape(-1, PIXEL_HASH_BYTES)


def split_hashes(manifest: Manifest, split: str) -> list[ShardHashes]:
    """The :class:`ShardHashes` of a converted split from its sidecars (a remote split's held through the byte
    source that read the manifest). A tiled split (without ``--drop-tiles-ignored``) is compared source by source,
    as convert does (:func:`source_hashes`; indices are then the sources' places)."""
    table = manifest.samples
    options = manifest.preprocessing.options
    whole = (options.get("tile") is not None and table.inline is None
             and options.get("drop_tiles_ignored") is None)
    out = []
    sources = 0
    for pos, shard in enumerate(manifest.shards):
        if whole:
            rows = table.rows(pos)
            if "pixels" in (rows.dtype.names or ()):
                names, hashes = source_hashes(rows)
                out.append(ShardHashes(split, sources, hashes, partial(list, names)))
                sources += len(names)
                continue

        def keys(pos: int = pos) -> list[str]:
            if table.inline is not None:
                first = manifest.shards[pos].first_index
                return [str(table[first + j]["key"]) for j in range(manifest.shards[pos].num_samples)]
            return row_keys(table.rows(pos))

        out.append(ShardHashes(split, shard.first_index, table.pixel_hashes(pos), keys))
    return out
