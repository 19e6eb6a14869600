"""The shard plan: which sample goes into which shard, decided up front from the listing alone.

The plan is a pure function of the discovered pairs, their fingerprints and the options —
no pixels are read (byte limits use image headers only) — which is what makes output
deterministic for any worker count, resumable, and the same on a cluster.

Shard boundaries are content-defined: a shard may end after a sample whose *key* hashes
to a boundary value (and must end at the size limit). Adding or removing a few samples
therefore moves only the boundaries next to them, so an incremental run rewrites only
the shards that contain changed inputs — and still equals a fresh conversion.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ShardkitError
from ..formats.base import SampleSpec
from ..images.preprocess import stored_hw
from ..images.tiles import Tiling
from .config import ConvertConfig, ShardSize
from .pairs import PairTable, SamplePair


@dataclass(frozen=True, eq=False)  # compared by identity: the fields hold arrays and column views
class ShardTask:
    """One unit of work: a worker decodes these samples and writes shard ``stem`` of ``split`` itself."""

    split: str
    index: int
    #: sha256 hex of everything that determines the shard's content; None when the worker computes the
    #: fingerprints (a fresh or forced conversion: nothing to reuse), and with them the key
    key: str | None
    directory: Path
    #: the shard's pairs: a slice (view) of its split's :class:`~shardkit.conversion.pairs.PairTable`, which pickles
    #: its own
    #: rows only
    samples: Sequence[SamplePair]
    #: the samples' fingerprints, an (m, 32) uint8 array (a view of the split's); None: see ``key``
    fingerprints: np.ndarray | None
    #: index of the first sample in its split's pairs
    start: int = 0
    #: each sample's image and label identity when the run planned it, an (m, 2) uint64 array (a view of the
    #: split's :func:`~shardkit.conversion.fingerprint.input_identities`; 0: unknown): the worker checks the files
    #: against
    #: it after reading them. None: not checked (inputs on object storage)
    identities: np.ndarray | None = None
    #: labels from an annotation source: each sample's shapes (:mod:`shardkit.conversion.annotated`), rasterised by
    #: the worker instead of decoding a label file; None for mask images
    shapes: tuple[Any, ...] | None = None

    @property
    def stem(self) -> str:
        """``NNNNN-<12 hex of the key>``; ``NNNNN-pending`` (temporary names only) while the key is unknown."""
        return stem(self.index, self.key)


def stem(index: int, key: str | None) -> str:
    """A shard's file name stem: its position and the start of its content key."""
    return f"{index:05d}-{key[:12] if key is not None else 'pending'}"


def _key_hash(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


def cut_shards(sizes: Sequence[int], keys: Sequence[str], max_samples: int | None, max_bytes: int | None,
               counts: Sequence[int] | None = None) -> list[int]:
    """Content-defined cut points → list of shard lengths.

    ``counts``: samples each source gives (its tiles, with ``--tile``; default 1 each). A source's samples stay
    in one shard, so a source with more tiles than the limit gets a shard of its own.

    A shard holds at most ``max_samples`` samples (or ``max_bytes`` bytes, always ≥ 1 sample).
    Once it holds half its limit, it also ends after any sample whose key hash is 0 modulo a
    third of the limit — about three quarters full on average. Limits under 8 samples
    cut at the limit only.
    """
    if max_samples is None:
        assert max_bytes is not None
        mean = max(1, sum(sizes) // max(len(sizes), 1))
        per_shard = max(1, max_bytes // mean)
    else:
        per_shard = max_samples
    min_fill = max(1, per_shard // 2)
    modulus = max(1, per_shard // 3)
    lengths: list[int] = []
    count = used = 0
    sources = 0  # sources in the current shard (what the lengths count); ``count`` counts their samples
    for k, (size, key) in enumerate(zip(sizes, keys, strict=True)):
        n = 1 if counts is None else counts[k]
        if count and ((max_samples is not None and count + n > max_samples)
                      or (max_bytes is not None and used + size > max_bytes)):
            lengths.append(sources)
            count = used = sources = 0
        count += n
        used += size
        sources += 1
        if count >= min_fill and per_shard >= 8 and _key_hash(key) % modulus == 0:
            lengths.append(sources)
            count = used = sources = 0
    if sources:
        lengths.append(sources)
    return lengths


def settings_text(settings: dict[str, Any]) -> str:
    """The canonical JSON of a conversion's settings: its sha256 is the options digest of every fingerprint."""
    return json.dumps(settings, sort_keys=True)


def shard_key(settings: dict[str, Any] | str, keys: Iterable[str], fingerprints: Iterable[str]) -> str:
    """sha256 of the format settings (or their :func:`settings_text`) and the ordered (key, fingerprint hex)
    list of a shard."""
    h = hashlib.sha256((settings if isinstance(settings, str) else settings_text(settings)).encode())
    for key, fp in zip(keys, fingerprints, strict=True):
        h.update(f"{key}\0{fp}\n".encode())
    return h.hexdigest()


def hex_rows(fingerprints: np.ndarray) -> list[str]:
    """An (m, 32) uint8 array of fingerprints as their 64-hex strings."""
    return [row.tobytes().hex() for row in fingerprints]


def tile_count(tiling: Tiling, image: Path, header_size: Callable[[Path], tuple[int, int]],
               max_ratio: float = float("inf"), tile_bytes: int = 0) -> int:
    """Tiles a source gives, from its header, refused above ``max_ratio``
    (:meth:`~shardkit.images.tiles.Tiling.check_output`);
    1 where the header cannot be read (its worker reports why)."""
    try:
        hw = header_size(image)
    except ShardkitError:
        return 1
    return tiling.check_output(hw, image, max_ratio, tile_bytes)


def checked_tiling(tiling: Tiling, images: Iterable[Path], header_size: Callable[[Path], tuple[int, int]],
                   max_ratio: float, tile_bytes: int) -> Callable[[Path], tuple[int, int]]:
    """Every source's tiling output estimated from its header, refused above ``max_ratio``
    (:meth:`~shardkit.images.tiles.Tiling.check_output`) before anything is decoded or written; returns ``header_size``
    answering from the headers read here (the plan needs them again)."""
    sizes: dict[str, tuple[int, int]] = {}
    for image in images:
        try:
            hw = header_size(image)
        except ShardkitError:
            continue  # its worker reports why
        tiling.check_output(hw, image, max_ratio, tile_bytes)
        sizes[str(image)] = hw

    def known(image: Path) -> tuple[int, int]:
        hw = sizes.get(str(image))
        return hw if hw is not None else header_size(image)

    return known


def plan_split(
    split: str,
    directory: Path,
    pairs: PairTable,
    fingerprints: np.ndarray | None,
    limit: ShardSize,
    spec: SampleSpec,
    cfg: ConvertConfig,
    settings: dict[str, Any],
    header_size: Callable[[Path], tuple[int, int]],
    identities: np.ndarray | None = None,
    slices: list[tuple[int, tuple[int, int]]] | None = None,
) -> list[ShardTask]:
    """Cut one split's ordered pairs into shard tasks.

    ``fingerprints`` (an (n, 32) uint8 array) None: the workers compute them (and the shard keys) from the
    bytes they decode. ``identities``: see :attr:`ShardTask.identities`. ``slices``: volume cases' slice counts
    (:func:`~shardkit.conversion.volumes.slice_counts`), each case's slices in one shard.
    """
    counts = None
    if slices is not None:  # volume cases: one sample per slice, counted from each case's header
        counts = [n for n, _ in slices]
        sizes = [spec.sample_nbytes(hw) * n for n, hw in slices]
    elif cfg.tiling is not None:  # one sample per tile: sizes and counts from each source's header
        tile_bytes = spec.sample_nbytes(cfg.tiling.tile)
        counts = [tile_count(cfg.tiling, p.image, header_size, float(cfg.max_tile_ratio), tile_bytes) for p in pairs]
        sizes = [spec.sample_nbytes(cfg.tiling.tile) * n for n in counts]
    elif spec.size is not None or limit.nbytes is None:
        sizes = [spec.sample_nbytes(spec.size or (1, 1))] * len(pairs)
    else:
        sizes = [spec.sample_nbytes(stored_hw(header_size(p.image), cfg.size, cfg.resize, cfg.crop)) for p in pairs]
    tasks, start = [], 0
    for index, n in enumerate(cut_shards(sizes, pairs.keys, limit.samples, limit.nbytes, counts)):
        chunk = pairs[start : start + n]
        ids = None if identities is None else identities[start : start + n]
        if fingerprints is None:
            tasks.append(ShardTask(split, index, None, directory, chunk, None, start, ids))
        else:
            fps = fingerprints[start : start + n]
            key = shard_key(settings, chunk.keys, hex_rows(fps))
            tasks.append(ShardTask(split, index, key, directory, chunk, fps, start, ids))
        start += n
    return tasks
