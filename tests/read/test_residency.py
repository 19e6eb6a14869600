"""Batches read from storage are hinted sample by sample; batches from the page cache are not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit.formats.mapping import MappedArray
from shardkit.read import residency
from shardkit.read.residency import StorageReads


def test_a_batch_is_hinted_when_the_previous_one_read_from_storage(monkeypatch) -> None:
    blocks = iter([10, 10, 10, 18, 18, 18, 18])
    monkeypatch.setattr(residency, "blocks_read", lambda: next(blocks))
    reads = StorageReads()
    assert reads.begin() is True  # nothing known: the first batch is hinted
    reads.end()  # read nothing from storage (10 -> 10)
    assert reads.begin() is False
    reads.end()  # 10 -> 18: it did
    assert reads.begin() is True
    reads.end()
    assert reads.begin() is False


def test_the_real_counter_moves_only_with_storage_reads() -> None:
    before = residency.blocks_read()
    assert before >= 0 and residency.blocks_read() - before >= 0


@pytest.fixture()
def advice(monkeypatch) -> list[tuple[int, int, int]]:
    calls: list[tuple[int, int, int]] = []
    real = MappedArray._advise
    monkeypatch.setattr(MappedArray, "_advise", lambda self, *a: (calls.append(a), real(self, *a)))
    return calls


def test_cold_batches_ask_for_exactly_their_samples_and_warm_ones_for_nothing(
        camvid_val_npy: Path, advice: list, monkeypatch) -> None:
    import mmap

    counter = iter(range(0, 10**6, 7))  # every batch "reads from storage" until switched
    monkeypatch.setattr(residency, "blocks_read", lambda: next(counter))
    ds = shardkit.open(camvid_val_npy)
    starts = [r.shard.first_index for r in ds.readers]
    assert len(starts) >= 2 and starts[1] >= 4
    plain = [r.fixed_arrays() for r in ds.readers]
    idx = np.array([1, 2, 3, starts[1], starts[1] + 2])  # a run of three in shard 0, two apart in shard 1
    images, labels = ds.batch(idx)
    row_i, row_l = 360 * 480 * 3, 360 * 480
    willneed = [(s, n) for a, s, n in advice if a == mmap.MADV_WILLNEED]
    assert any(a == mmap.MADV_RANDOM for a, _, _ in advice)
    # one range per array for the run in shard 0, one per sample in shard 1; each range starts at the
    # page holding the sample's first byte
    want = sorted([3 * row_i, 3 * row_l, row_i, row_i, row_l, row_l])
    got = sorted(n for _, n in willneed)
    assert len(got) == 6 and all(w <= g < w + mmap.PAGESIZE for g, w in zip(got, want, strict=True))

    def row(i: int, k: int) -> np.ndarray:
        s = max(j for j, first in enumerate(starts) if first <= i)
        return plain[s][k][i - starts[s]]

    expect_i = np.stack([row(int(i), 0) for i in idx])
    expect_l = np.stack([row(int(i), 1) for i in idx])
    assert np.array_equal(images, expect_i) and np.array_equal(labels, expect_l)

    monkeypatch.setattr(residency, "blocks_read", lambda: 5)  # from now on everything is cached
    ds.batch(idx)  # the previous batch read from storage: still hinted, and it reads nothing
    advice.clear()
    images, labels = ds.batch(idx)
    assert not advice  # cached: no per-sample hints
    assert np.array_equal(images, expect_i) and np.array_equal(labels, expect_l)


@pytest.fixture(scope="module")
def camvid_val_hdf5(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """CamVid val as HDF5 shards three ways: raw chunks, zstd-coded chunks, and variable size (no --size)."""
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert

    out: dict[str, Path] = {}
    for name, size, codec in (("raw", (360, 480), "raw"), ("zstd", (360, 480), "zstd"), ("flat", None, "raw")):
        root = tmp_path_factory.mktemp(f"camvid-val-h5-{name}")
        convert(ConvertConfig(camvid_root, root, format="hdf5", size=size, splits=("val",), workers=2, quiet=True,
                              shard_size=ShardSize(samples=13), image_codec=codec, label_codec=codec))
        out[name] = root / "val"
    return out


def _h5_ranges(path: Path, local: list[int], offsets: np.ndarray | None) -> list[tuple[int, int]]:
    """The file byte ranges holding samples ``local`` of one HDF5 shard, from h5py's own chunk index."""
    import h5py

    ranges = []
    with h5py.File(path, "r") as f:
        for k, name in enumerate(("images", "labels")):
            ds = f[name]
            infos = [ds.id.get_chunk_info(j) for j in range(ds.id.get_num_chunks())]
            by_first = {info.chunk_offset[0]: info for info in infos}
            for i in local:
                if offsets is None:  # one sample per chunk
                    info = by_first[i]
                    ranges.append((info.byte_offset, info.byte_offset + info.size))
                    continue
                a, b, per = int(offsets[i, k]), int(offsets[i + 1, k]), ds.chunks[0]
                for c in range(a // per, (b - 1) // per + 1):
                    info, item = by_first[c * per], ds.dtype.itemsize
                    lo, hi = max(a, c * per) - c * per, min(b, (c + 1) * per) - c * per
                    ranges.append((info.byte_offset + lo * item, info.byte_offset + hi * item))
    return ranges


@pytest.mark.parametrize("kind", ["raw", "zstd", "flat"])
def test_hdf5_cold_batches_ask_for_exactly_their_chunks(camvid_val_hdf5: dict[str, Path], kind: str,
                                                        advice: list, monkeypatch) -> None:
    """HDF5 shards read through the memory map (raw or zstd chunks, fixed or variable size) are hinted like npy:
    read-around off, then ``MADV_WILLNEED`` on exactly the bytes of each sample's chunks, as h5py indexes them."""
    import mmap

    counter = iter(range(0, 10**6, 7))
    monkeypatch.setattr(residency, "blocks_read", lambda: next(counter))
    ds = shardkit.open(camvid_val_hdf5[kind])
    reader = ds.readers[1]
    assert reader.direct  # read from the memory map, not through h5py
    first = reader.shard.first_index
    local = [0, 2, 3, 5]  # a run of two and two singles
    if kind == "flat":  # variable size: no batches; a sample's rows span several 1-D chunks
        reader.prefetch(np.array(local))
    else:  # through the dataset, which decides to hint
        import h5py

        images, _ = ds.batch(np.array(local) + first)
        with h5py.File(reader.path(reader.shard.files[0].name), "r") as f:
            assert np.array_equal(images, f["images"][local])
    assert any(a == mmap.MADV_RANDOM for a, _, _ in advice)
    _assert_asked_for(advice, reader, local, kind)


def _assert_asked_for(advice: list, reader: object, local: list[int], kind: str) -> None:
    """The ``MADV_WILLNEED`` calls in ``advice`` are exactly samples ``local``'s chunk bytes (touching ranges as
    one), each from the page holding its first byte to its last byte."""
    import mmap

    willneed = sorted((s, s + n) for a, s, n in advice if a == mmap.MADV_WILLNEED)
    offsets = reader._offsets if kind == "flat" else None  # type: ignore[attr-defined]
    want = sorted(_h5_ranges(reader.path(reader.shard.files[0].name), local, offsets))  # type: ignore[attr-defined]
    merged: list[list[int]] = []
    for a, b in want:
        if merged and merged[-1][1] == a:
            merged[-1][1] = b
        else:
            merged.append([a, b])
    assert len(willneed) == len(merged)
    for (s, e), (a, b) in zip(willneed, merged, strict=True):
        assert s == a - a % mmap.PAGESIZE and e == b


@pytest.mark.parametrize("kind", ["raw", "zstd", "flat"])
def test_hdf5_single_reads_ask_for_their_sample(camvid_val_hdf5: dict[str, Path], kind: str, advice: list) -> None:
    """``read(i)`` (``ds[i]``; variable-size splits are augmented from it) asks for sample ``i``'s chunk bytes, as
    npy's does, and returns what h5py reads."""
    import h5py

    ds = shardkit.open(camvid_val_hdf5[kind])
    reader = ds.readers[1]
    image, label = reader.read(0)  # opens the file; the hint of this read is checked next time
    advice.clear()
    image, label = reader.read(3)
    _assert_asked_for(advice, reader, [3], kind)
    with h5py.File(reader.path(reader.shard.files[0].name), "r") as f:
        if kind == "flat":
            (a0, b0), (a1, b1) = reader._offsets[3], reader._offsets[4]
            assert np.array_equal(image.reshape(-1), f["images"][a0:a1])
            assert np.array_equal(label.reshape(-1), f["labels"][b0:b1])
        else:
            assert np.array_equal(image, f["images"][3]) and np.array_equal(label, f["labels"][3])


@pytest.fixture(scope="module")
def camvid_val_lmdb(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert

    root = tmp_path_factory.mktemp("camvid-val-lmdb")
    convert(ConvertConfig(camvid_root, root, format="lmdb", size=(360, 480), splits=("val",), workers=2, quiet=True,
                          shard_size=ShardSize(samples=13)))
    return root / "val"


def test_lmdb_cold_batches_ask_for_exactly_their_records(camvid_val_lmdb: Path, advice: list, monkeypatch) -> None:
    """LMDB: a batch read from storage asks for exactly its records' bytes (as the record table finds them), touching
    records as one range; a cached batch asks for nothing; pixels are unchanged."""
    import mmap

    counter = iter(range(0, 10**6, 7))
    monkeypatch.setattr(residency, "blocks_read", lambda: next(counter))
    ds = shardkit.open(camvid_val_lmdb)
    reader = ds.readers[0]
    first = reader.shard.first_index
    local = [1, 2, 5, len(reader) - 1]
    assert len(reader) > 6
    images, _ = ds.batch(np.array(local) + first)
    path = reader.path(reader.shard.files[0].name)
    data = path.read_bytes()
    records = [bytes(reader.record(j)) for j in local]
    starts = [data.find(r) for r in records]  # each record's bytes, found in the file itself
    want = [[s, s + len(r)] for s, r in zip(starts, records, strict=True)]
    merged: list[list[int]] = []
    for a, b in sorted(want):
        if merged and merged[-1][1] == a:
            merged[-1][1] = b
        else:
            merged.append([a, b])
    willneed = sorted((s, s + n) for a, s, n in advice if a == mmap.MADV_WILLNEED)
    assert len(willneed) == len(merged)
    for (s, e), (a, b) in zip(willneed, merged, strict=True):
        assert s == a - a % mmap.PAGESIZE and e == b
    header = 16
    for k, r in enumerate(records):
        assert np.array_equal(images[k].reshape(-1), np.frombuffer(r, np.uint8)[header : header + 360 * 480 * 3])

    monkeypatch.setattr(residency, "blocks_read", lambda: 5)
    ds.batch(np.array(local) + first)
    advice.clear()
    ds.batch(np.array(local) + first)
    assert not advice


def test_lmdb_single_reads_ask_for_their_record(camvid_val_lmdb: Path, advice: list) -> None:
    """``read(i)`` (``ds[i]``; variable-size splits are augmented from it) asks for record ``i``'s bytes."""
    import mmap

    ds = shardkit.open(camvid_val_lmdb)
    reader = ds.readers[1]
    reader.read(0)  # builds the table
    advice.clear()
    image, _ = reader.read(2)
    (s, n), = [(s, n) for a, s, n in advice if a == mmap.MADV_WILLNEED]
    begin, end = (int(v) for v in reader._table.ranges[2])
    assert s == begin - begin % mmap.PAGESIZE and s + n == end
    assert np.array_equal(image, ds[reader.shard.first_index + 2][0])
