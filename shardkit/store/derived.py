"""What a split derives from its stored samples, recomputed from the decoded data (``shardkit verify``).

Convert records, besides the samples themselves, values computed from them: each sample's class bitmap
(``classes``, the classes its label holds), pixel hash (``pixels``) and look hash (``looks``) in the samples
sidecars, and the split's statistics in the manifest (pixel totals, per-class pixel counts and shares, the image
bands' mean, std and range). The class-balanced sampler, class weights, ``info`` and ``info --duplicates`` use
them without reading a label, so a sidecar whose hashes were refreshed after its columns were changed would mislead them
while every sha256 still agrees. :class:`DerivedCheck` recomputes them sample by sample, as the worker did
(:class:`~shardkit.store.stats.Stats`, :func:`~shardkit.files.samples.pixel_hash`), and lists each disagreement: the
sample's key, the column, the stored and the recomputed value. Memory: one sample and one shard's columns at a
time, plus 32 bytes per sample for the pixel-hash groups of a lossy image codec.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..codecs.registry import codec_from_json
from ..errors import ShardkitError
from ..files.samples import PIXEL_HASH_BYTES, pixel_hash
from ..formats.base import SampleSpec
from ..images.looks import look_hash
from ..images.tiles import Tile, Tiling, owned_box
from ..support.columns import ColumnBuilder
from .duplicates import group_rows
from .manifest import Manifest
from .stats import Stats

#: Disagreements listed one line each per column and split; the rest are counted in one more line.
LISTED_PER_COLUMN = 10
#: Label rows decoded and counted at a time in :func:`label_counts` (about this many pixels per block).
COUNT_BLOCK_PIXELS = 1 << 18


def label_counts(spec: SampleSpec, stored: np.ndarray, ignore: int | None) -> np.ndarray:
    """Pixels of each id value in one stored label (int64, at least ``num_classes`` long; values past the class
    range are the ignore id above it), decoded and counted a block of rows at a time: a sample at the largest size
    a manifest allows (2**28 pixels) costs a few MB here, not the 2 GB of a whole-label ``np.bincount`` (which
    widens every id to int64)."""
    c = spec.num_classes
    counts = np.zeros(c, np.int64)
    rows = max(1, COUNT_BLOCK_PIXELS // max(1, int(stored.shape[1]) if stored.ndim > 1 else 1))
    for r in range(0, int(stored.shape[0]), rows):
        ids = spec.encoding.decode(stored[r : r + rows], ignore).ravel()
        block = np.bincount(ids, minlength=c)
        if len(block) > len(counts):
            counts = np.pad(counts, (0, len(block) - len(counts)))
        counts[: len(block)] += block
    return counts


#: Manifest statistics that are float sums (compared up to the rounding :meth:`Stats.to_manifest` applies).
_FLOAT_STATS = ("image_mean", "image_std", "image_min", "image_max")


def _close(a: Any, b: Any) -> bool:
    """Two lists of floats (None for a band without values) equal to 6 significant digits."""
    if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if (x is None) != (y is None):
            return False
        if x is not None and not np.isclose(float(x), float(y), rtol=1e-6, atol=2e-6):
            return False
    return True


def _lossless_images(manifest: Manifest) -> bool:
    """Whether the split's image codec decodes to exactly the pixels it was given (all but ``jpeg``)."""
    codecs = manifest.format_options.get("codecs") if manifest.format_version >= 2 else None
    if not isinstance(codecs, dict):
        return True
    try:
        return bool(codec_from_json(codecs.get("image")).lossless)
    except ValueError:  # the shard readers report an unknown codec
        return True


def _ids(bits: np.ndarray) -> str:
    """A bitmap row as its class ids, ``[0, 3, 11]``."""
    return str(np.flatnonzero(bits).tolist())


class DerivedCheck:
    """Recomputes one split's derived columns and statistics; feed it every stored sample, shard by shard."""

    def __init__(self, manifest: Manifest, spec: SampleSpec) -> None:
        self.manifest = manifest
        self.spec = spec
        self.ignore = manifest.classes.ignore_index
        self.stats = self._new_stats()
        self.found: dict[str, list[str]] = {}
        self.counted: dict[str, int] = {}
        opts = manifest.preprocessing.options
        self.tiling: Tiling | None = None
        if opts.get("tile") is not None:
            try:
                self.tiling = Tiling.from_options(opts.get("tile"), opts.get("stride"))
            except (ShardkitError, TypeError, ValueError):  # a hostile manifest: no tile boxes, so no band stats
                self.problem("manifest preprocessing", f"preprocessing tile {str(opts.get('tile'))[:40]} / stride "
                             f"{str(opts.get('stride'))[:40]} is not a tiling shardkit writes")
        #: the image codec gives back the pixels convert hashed and counted (not jpeg)
        self.lossless = _lossless_images(manifest)
        #: the band statistics can be recomputed: the images decode as they were counted, and no sample can hold
        #: padding the sidecars do not locate (a centre crop to a fixed --size pads smaller sources; a tile's
        #: padding lies outside its recorded region)
        self.bands = self.lossless and (self.tiling is not None or (opts.get("tile") is None and (
            opts.get("size") is None or opts.get("crop") != "center")))
        # lossy image codec: stored pixel hash -> hash of the decoded pixels, checked group by group at the end
        self._claimed = bytearray()
        self._decoded = bytearray()
        self._keys = ColumnBuilder()

    def _new_stats(self) -> Stats:
        return Stats(self.spec.num_classes, self.spec.image_channels, ranges=not self.spec.legacy_image)

    def problem(self, column: str, text: str) -> None:
        """Record one disagreement of ``column`` (listed up to :data:`LISTED_PER_COLUMN`, then counted)."""
        self.counted[column] = self.counted.get(column, 0) + 1
        listed = self.found.setdefault(column, [])
        if len(listed) < LISTED_PER_COLUMN:
            listed.append(text)

    def shard(self, pos: int, directory: Any) -> ShardCheck:
        """The check of the shard at position ``pos`` (its sidecar read from ``directory``)."""
        return ShardCheck(self, pos, directory)

    def finish(self, complete: bool = True) -> list[str]:
        """Every disagreement found: one line each (bounded per column). ``complete``: every sample was added, so
        the split's statistics are compared too."""
        self._lossy_groups()
        if complete:
            self._compare_stats()
        out: list[str] = []
        for column, listed in self.found.items():
            out += listed
            more = self.counted[column] - len(listed)
            if more:
                out.append(f"… and {more} more disagreement(s) in {column}")
        return out

    def _lossy_groups(self) -> None:
        """Samples with equal stored pixel hashes must decode to equal pixels (a lossy codec's copies are
        encoded alike): each group whose decoded pixels differ is one disagreement."""
        if not self._claimed:
            return
        claimed = np.frombuffer(self._claimed, np.uint8).reshape(-1, PIXEL_HASH_BYTES)
        decoded = np.frombuffer(self._decoded, np.uint8).reshape(-1, PIXEL_HASH_BYTES)
        for rows in group_rows(claimed):
            if len({bytes(decoded[int(r)]) for r in rows}) > 1:
                keys = ", ".join(self._keys.get(int(r)) for r in rows[:3]) + (", …" if len(rows) > 3 else "")
                self.problem("the pixels column", f"{len(rows)} samples ({keys}) share stored pixel hash "
                             f"{bytes(claimed[int(rows[0])]).hex()} but decode to different pixels")

    def _compare_stats(self) -> None:
        stored = self.manifest.stats
        mine = self.stats.to_manifest()
        keys = ["pixels", "class_pixels", "ignore_pixels", "class_share"]
        if self.bands:
            keys += [k for k in ("image_mean", "image_std", "image_min", "image_max", "image_nonfinite")
                     if k in mine or stored.get(k) is not None]
        for key in keys:
            want = mine.get(key)
            have = stored.get(key)
            if isinstance(have, tuple):
                have = list(have)
            if key in _FLOAT_STATS and _close(want, have):
                continue  # float sums: equal up to the rounding the manifest keeps
            if key == "class_pixels" and want != have:  # the line older shardkit gave (scripts may look for it)
                self.problem("manifest stats", f"class pixel counts {want} differ from the manifest's {have}")
            elif want != have:
                self.problem("manifest stats", f"stats.{key} recomputed from the samples is {want}, the manifest "
                             f"says {have}")


class ShardCheck:
    """One shard's part of a :class:`DerivedCheck`: its stored columns, compared sample by sample."""

    def __init__(self, split: DerivedCheck, pos: int, directory: Any) -> None:
        self.split = split
        m = split.manifest
        table = m.samples
        self.shard = m.shards[pos]
        self.stats = split._new_stats()
        self.presence = table.presence(pos, directory)
        self.hashes = table.pixel_hashes(pos, directory)
        self.looks = table.look_hashes(pos, directory)
        if table.inline is not None:
            recs = table[self.shard.first_index : self.shard.first_index + self.shard.num_samples]
            self.keys: Sequence[str] = [str(r["key"]) for r in recs]
            self.tiles: list[Tile | None] = [Tile.from_record(r) for r in recs]
        else:
            rows = table.rows(pos, directory)
            self.keys = [bytes(k).decode("utf-8", "replace") for k in rows["key"].tolist()]
            has_tiles = "tile" in (rows.dtype.names or ())
            self.tiles = [Tile(k, *(int(v) for v in rows["tile"][j])) if has_tiles else None
                          for j, k in enumerate(self.keys)]

    def add(self, j: int, image: np.ndarray, stored: np.ndarray) -> None:
        """Sample ``j`` of the shard as decoded."""
        split, key = self.split, self.keys[j]
        where = f"sample {key!r} (shard {self.shard.index}, #{j})"
        counts = label_counts(split.spec, stored, split.ignore)
        self.stats.add_label_counts(counts)
        tile = self.tiles[j]
        box = owned_box(tile, split.tiling) if tile is not None and split.tiling is not None else None
        self.stats.add_image(image, box)
        c = split.spec.num_classes
        if self.presence is not None:
            have, want = self.presence[j], counts[:c] > 0
            if not np.array_equal(have, want):
                split.problem("the classes column", f"{where}: classes column (class bitmap) holds {_ids(have)}, "
                              f"its label holds {_ids(want)}")
        if self.hashes is not None:
            have_hash, want_hash = bytes(self.hashes[j]), pixel_hash(image)
            if split.lossless and have_hash != want_hash:
                split.problem("the pixels column", f"{where}: pixels column (pixel hash) is {have_hash.hex()}, its "
                              f"stored image hashes to {want_hash.hex()}")
            elif not split.lossless:
                split._claimed += have_hash
                split._decoded += want_hash
                split._keys.append(key)
        if self.looks is not None and split.lossless:  # a lossy codec's decoded pixels are not the hashed ones
            have_look, want_look = bytes(self.looks[j]), look_hash(image)
            if have_look != want_look:
                split.problem("the looks column", f"{where}: looks column (look hash) is {have_look.hex()}, its "
                              f"stored image's look hash is {want_look.hex()}")

    def done(self) -> None:
        """Add the shard's statistics to the split's, in shard order (as convert merges them)."""
        self.split.stats.merge(self.stats)

