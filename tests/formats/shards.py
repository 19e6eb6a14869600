"""Shards for the format tests: random samples fitting a spec, written and published as convert does."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardkit.files.splitfiles import TMP_MARK, ShardInfo
from shardkit.formats.base import SampleSpec, ShardReader
from shardkit.formats.registry import reader_class, writer_class
from shardkit.store.publish import rename_into_place

RNG = np.random.default_rng(7)
SIZES = [(4, 6), (3, 5), (6, 2), (4, 6), (1, 1)]
STEM = "00000-abcdef012345"


def samples(spec: SampleSpec, n: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` random (image, stored label) pairs of ``spec`` (sizes from SIZES when it has none)."""
    out = []
    for k in range(n):
        hw = spec.size or SIZES[k % len(SIZES)]
        image = RNG.integers(0, 256, (*hw, 3), dtype=np.uint8)
        label = RNG.integers(0, 256, spec.label_shape(hw)).astype(spec.stored_label_dtype)
        out.append((image, label))
    return out


def write_shard(fmt: str, directory: Path, spec: SampleSpec, data: list[tuple[np.ndarray, np.ndarray]],
                planned: int | None = None) -> ShardReader:
    """Write ``data`` as shard 0 the way a worker does, publish it the way the parent does, open a reader."""
    writer = writer_class(fmt)(directory, STEM, spec, len(data) if planned is None else planned, "none")
    for k, (image, label) in enumerate(data):
        writer.add(image, label, f"sample-{k}")
    written = writer.close(sync=False)
    assert [f.final_name for f in written] == list(writer.file_names(writer.stem, spec))
    assert all(f.tmp_name.startswith(".") and TMP_MARK in f.tmp_name for f in written)
    assert not any((directory / f.final_name).exists() for f in written), "nothing final before publishing"
    rename_into_place(directory, [(f.tmp_name, f.final_name) for f in written])
    info = ShardInfo(0, len(data), 0, tuple(f.info() for f in written))
    return reader_class(fmt)(directory, info, spec, writer.format_options(spec, "none"))
