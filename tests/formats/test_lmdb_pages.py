"""Where each record lies in an LMDB shard, read from its B-tree pages: exact on real CamVid shards (raw and
zstd, fixed and variable size, one and several leaf pages), and never more than "no table" on a damaged file."""

from __future__ import annotations

from pathlib import Path

import lmdb
import numpy as np
import pytest

import shardkit
from shardkit.formats._lmdb_pages import value_ranges
from shardkit.formats.lmdb import sample_key


@pytest.fixture(scope="module")
def lmdb_splits(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """CamVid train as LMDB: raw 360x480 in shards of 40; zstd at stored size (variable) in one shard of 123."""
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert

    out = {}
    for name, size, codec, per in (("raw", (360, 480), "raw", 40), ("zstd", None, "zstd", 200)):
        root = tmp_path_factory.mktemp(f"camvid-lmdb-{name}")
        convert(ConvertConfig(camvid_root, root, format="lmdb", size=size, splits=("train",), workers=2, quiet=True,
                              shard_size=ShardSize(samples=per), image_codec=codec, label_codec=codec))
        out[name] = root / "train"
    return out


def _shards(split: Path) -> list[tuple[Path, int]]:
    ds = shardkit.open(split)
    return [(r.path(r.shard.files[0].name), len(r)) for r in ds.readers]


@pytest.mark.parametrize("kind", ["raw", "zstd"])
def test_every_record_range_is_the_bytes_lmdb_returns(lmdb_splits: dict[str, Path], kind: str) -> None:
    for path, n in _shards(lmdb_splits[kind]):
        data = path.read_bytes()
        ranges = value_ranges(data, n)
        assert ranges is not None and ranges.shape == (n, 2)
        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=False)
        try:
            with env.begin(buffers=True) as txn:
                bufs = [txn.get(sample_key(j)) for j in range(n)]
                addrs = np.array([np.frombuffer(b, np.uint8).ctypes.data for b in bufs], np.int64)
                for j, buf in enumerate(bufs):
                    begin, end = ranges[j]
                    assert data[begin:end] == bytes(buf)
            # and where LMDB's own map holds them: the same layout, shifted by the map's address
            assert np.array_equal(addrs - addrs[0], ranges[:, 0] - ranges[0, 0])
        finally:
            env.close()


def test_a_split_with_fewer_records_than_asked_for_has_no_table(lmdb_splits: dict[str, Path]) -> None:
    path, n = _shards(lmdb_splits["raw"])[0]
    assert value_ranges(path.read_bytes(), n + 1) is None  # record n is missing
    assert value_ranges(path.read_bytes(), 10**15) is None  # a manifest's claim is not allocated
    assert value_ranges(path.read_bytes(), 0) is not None


def test_a_tree_of_branch_pages_and_inline_values(tmp_path: Path) -> None:
    """3,000 records (depth 2: branch and leaf pages), small values stored in the leaf, large ones on overflow
    pages, keys written out of order, plus a key that is not a sample's."""
    path = tmp_path / "many.lmdb"
    rng = np.random.default_rng(1)
    n = 3000
    values = {j: rng.integers(0, 256, int(rng.choice([5, 300, 5000])), dtype=np.uint8).tobytes() for j in range(n)}
    env = lmdb.open(str(path), subdir=False, map_size=1 << 26, lock=False)
    with env.begin(write=True) as txn:
        for j in rng.permutation(n).tolist():
            txn.put(sample_key(j), values[j])
        txn.put(b"__shardkit__", b"{}")
    assert env.stat()["depth"] >= 2
    env.close()
    data = path.read_bytes()
    ranges = value_ranges(data, n)
    assert ranges is not None
    assert all(data[b:e] == values[j] for j, (b, e) in enumerate(ranges.tolist()))


def test_damaged_files_give_no_table_or_a_bounded_one_never_an_error(lmdb_splits: dict[str, Path]) -> None:
    """Truncated, zeroed or randomly changed meta and tree pages: ``None`` or ranges inside the file, never an
    exception (the walk also refuses cycles and pages outside the file)."""
    path, n = _shards(lmdb_splits["zstd"])[0]
    data = path.read_bytes()
    psize = 4096
    for case in (b"", data[:100], data[: psize + 50], data[: 3 * psize], bytes(len(data)), data[:-psize]):
        assert value_ranges(case, n) is None
    rng = np.random.default_rng(7)
    damaged = bytearray(data)
    tree = psize * 8  # the meta pages and the first pages after them
    for _ in range(400):
        spots = [int(a) for a in rng.integers(0, tree, int(rng.integers(1, 6)))]
        for a in spots:
            damaged[a] = int(rng.integers(0, 256))
        got = value_ranges(damaged, n)
        if got is not None:
            assert ((got[:, 0] >= 0) & (got[:, 0] <= got[:, 1]) & (got[:, 1] <= len(data))).all()
        for a in spots:
            damaged[a] = data[a]
