"""The shard plan: which sample goes into which shard, decided up front from the listing alone.

The plan is a pure function of the discovered pairs and the options — no pixels are
read (byte limits use image headers only) — which is what makes output deterministic
for any worker count, and resumable.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ConvertConfig, ShardSize
from .discover import SamplePair
from .formats.base import SampleSpec


@dataclass(frozen=True)
class ShardTask:
    """One unit of work: a worker decodes these samples and writes shard ``index`` of ``split`` itself."""

    split: str
    index: int
    directory: Path
    samples: tuple[SamplePair, ...]


def stored_hw(source_hw: tuple[int, int], cfg: ConvertConfig) -> tuple[int, int]:
    """(H, W) a source of ``source_hw`` will have once stored (for byte-limited planning)."""
    if cfg.size is None:
        return source_hw
    if cfg.crop == "center" or cfg.resize == "exact":
        return cfg.size
    if cfg.resize == "shorter":
        scale = max(cfg.size[0] / source_hw[0], cfg.size[1] / source_hw[1])
        return max(cfg.size[0], round(source_hw[0] * scale)), max(cfg.size[1], round(source_hw[1] * scale))
    return source_hw


def split_into_shards(
    pairs: Sequence[SamplePair],
    limit: ShardSize,
    spec: SampleSpec,
    cfg: ConvertConfig,
    header_size: Callable[[Path], tuple[int, int]],
) -> list[tuple[SamplePair, ...]]:
    """Cut the ordered pairs into consecutive shards under the sample or byte limit (at least one each)."""
    if limit.samples is not None:
        n = limit.samples
        return [tuple(pairs[i : i + n]) for i in range(0, len(pairs), n)]
    assert limit.nbytes is not None
    fixed = spec.size is not None
    shards: list[tuple[SamplePair, ...]] = []
    current: list[SamplePair] = []
    used = 0
    for pair in pairs:
        hw = spec.size if fixed else stored_hw(header_size(pair.image), cfg)
        nbytes = spec.sample_nbytes(hw)  # type: ignore[arg-type]
        if current and used + nbytes > limit.nbytes:
            shards.append(tuple(current))
            current, used = [], 0
        current.append(pair)
        used += nbytes
    if current:
        shards.append(tuple(current))
    return shards


def plan_tasks(split: str, directory: Path, shards: list[tuple[SamplePair, ...]]) -> list[ShardTask]:
    return [ShardTask(split, i, directory, s) for i, s in enumerate(shards)]




def listing_fingerprint(pairs: Sequence[SamplePair], root: Path, options: dict[str, Any]) -> str:
    """sha256 over relative paths, sizes, mtimes and the preprocessing options: cheap change detection."""
    h = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    for p in pairs:
        for path in (p.image, p.label):
            if path is None:
                continue
            st = path.stat()
            rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()
