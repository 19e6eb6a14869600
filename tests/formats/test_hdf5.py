"""HDF5 shards: read back by plain h5py (formats/hdf5.md only), round trips, determinism, compression."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import pickle
import time
from pathlib import Path

import cv2
import h5py
import numpy as np
import pytest

import shardkit
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import ShardFormatError
from tests.sample_records import records

CROP = (352, 480)
SPEC = Path(__file__).resolve().parents[2] / "formats" / "hdf5.md"


def spec_reader():
    """``read_hdf5_split`` exactly as formats/hdf5.md prints it (json, numpy and h5py only)."""
    text = SPEC.read_text(encoding="utf-8").split("## A complete reader", 1)[1]
    namespace: dict = {}
    exec(compile(text.split("```python\n", 1)[1].split("```", 1)[0], str(SPEC), "exec"), namespace)
    return namespace["read_hdf5_split"]


def cropped_source(root: Path, key: str, label_rel: str) -> tuple[np.ndarray, np.ndarray]:
    """CamVid sample as documented: decode with OpenCV, RGB, centre-crop 360 → 352 rows."""
    image = cv2.cvtColor(cv2.imread(str(root / key), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    label = cv2.imread(str(root / label_rel), cv2.IMREAD_UNCHANGED)
    top = (image.shape[0] - CROP[0]) // 2
    return image[top : top + CROP[0]], label[top : top + CROP[0]]


def shard_digests(split_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(split_dir.glob("shard-*"))}


def camvid_val(root: Path, out: Path, **kw) -> Path:
    cfg = ConvertConfig(root, out, format="hdf5", size=CROP, splits=("val",), shard_size=ShardSize(10),
                        quiet=True, **{"workers": 2, **kw})
    convert(cfg)
    return out / "val"


def rgb_masks(root: Path, out: Path, fmt: str, unknown: int, **kw) -> Path:
    cfg = ConvertConfig(root, out, format=fmt, splits=("train",), unknown_as=unknown, ignore_index=unknown,
                        shard_size=ShardSize(samples=5), workers=2, quiet=True, **kw)
    convert(cfg)
    return out / "train"


@pytest.fixture(scope="module")
def camvid_h5(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return camvid_val(camvid_root, tmp_path_factory.mktemp("h5"))


def test_plain_h5py_reads_every_sample(camvid_h5: Path, camvid_root: Path, validate_manifest) -> None:
    """Only json + h5py + the text of formats/hdf5.md: no shardkit on this path."""
    manifest = validate_manifest(camvid_h5)
    assert manifest["format"] == "hdf5" and manifest["format_version"] == 1
    recs = iter(records(camvid_h5, manifest))
    seen = 0
    for shard in manifest["shards"]:
        (entry,) = shard["files"]
        with h5py.File(camvid_h5 / entry["name"], "r") as f:
            assert dict(f.attrs) | {"num_samples": shard["num_samples"]} == dict(f.attrs)
            assert f.attrs["format"] == "shardkit-hdf5" and f.attrs["layout"] == "fixed"
            images, labels = f["images"], f["labels"]
            n = shard["num_samples"]
            assert images.shape == (n, *CROP, 3) and images.dtype == np.uint8
            assert images.chunks == (1, *CROP, 3)
            assert labels.shape == (n, *CROP) and labels.dtype == np.uint8 and labels.chunks == (1, *CROP)
            assert images.compression is None
            for i in range(n):
                rec = next(recs)
                assert f["keys"][i].decode() == rec["key"]
                want_image, want_label = cropped_source(camvid_root, rec["key"], rec["label"])
                np.testing.assert_array_equal(images[i], want_image)
                np.testing.assert_array_equal(labels[i], want_label)
                seen += 1
    assert seen == manifest["num_samples"] == 26
    documented = list(spec_reader()(camvid_h5))
    assert len(documented) == 26
    for (image, label), want in zip(documented, shardkit.open(camvid_h5), strict=True):
        np.testing.assert_array_equal(image, want[0])
        np.testing.assert_array_equal(label, want[1])


def test_shardkit_reader_and_batch_reads(camvid_h5: Path) -> None:
    ds = shardkit.open(camvid_h5, verify=True)
    reader = ds.readers[0]
    n = len(reader)
    idx = [n - 1, 0, 1, 2, 2, n - 2]  # unsorted, with a run and a duplicate
    out_img = np.zeros((len(idx), *CROP, 3), np.uint8)
    out_lab = np.zeros((len(idx), *CROP), np.uint8)
    reader.read_batch_into(idx, out_img, out_lab)
    for k, i in enumerate(idx):
        image, label = reader.read(i)
        np.testing.assert_array_equal(out_img[k], image)
        np.testing.assert_array_equal(out_lab[k], label)
    clone = pickle.loads(pickle.dumps(reader))  # no handle travels; the clone reopens lazily
    assert reader.is_open and not clone.is_open
    np.testing.assert_array_equal(clone.read(n - 1)[0], out_img[0])


def test_bytes_identical_for_one_and_two_workers(camvid_h5: Path, camvid_root: Path, tmp_path: Path) -> None:
    time.sleep(1.1)  # any timestamp in the file would now differ
    again = camvid_val(camvid_root, tmp_path, workers=1)
    assert shard_digests(again) == shard_digests(camvid_h5)
    assert len(shard_digests(again)) >= 2


@pytest.mark.parametrize("compression", ["gzip", "lzf"])
def test_compression_is_lossless_and_deterministic(compression: str, camvid_h5: Path, camvid_root: Path,
                                                   tmp_path: Path) -> None:
    """gzip shards are byte-identical for 1 and 2 workers; lzf shards decode identically, but their bytes are not
    promised (h5py's bundled liblzf leaves its hash table uninitialised: formats/hdf5.md)."""
    split = camvid_val(camvid_root, tmp_path / "a", compression=compression)
    again = camvid_val(camvid_root, tmp_path / "b", compression=compression, workers=1)
    if compression == "gzip":
        assert shard_digests(split) == shard_digests(again)
    else:
        assert shard_digests(split).keys() == shard_digests(again).keys()
        first, second = shardkit.open(split), shardkit.open(again)
        for i in range(len(first)):
            for a, b in zip(first[i], second[i], strict=True):
                np.testing.assert_array_equal(a, b)
    plain, packed = shardkit.open(camvid_h5), shardkit.open(split)
    assert packed.manifest.format_options["compression"] == compression
    for i in range(len(plain)):
        for a, b in zip(plain[i], packed[i], strict=True):
            np.testing.assert_array_equal(a, b)
    name = packed.manifest.shards[0].files[0].name
    with h5py.File(split / name, "r") as f:
        assert f["images"].compression == compression and f["labels"].compression == compression
    assert sum(f.bytes for s in packed.manifest.shards for f in s.files) < sum(
        f.bytes for s in plain.manifest.shards for f in s.files)


@pytest.mark.parametrize(("encoding", "unknown", "compression"),
                         [("packed", 255, "lzf"), ("index", 300, "gzip")])
def test_variable_size_round_trip_and_flat_layout(encoding: str, unknown: int, compression: str,
                                                  rgb_masks_root: Path, tmp_path: Path,
                                                  validate_manifest) -> None:
    """rgb-masks-mini (sizes differ) as npy and as HDF5: same samples; id 300 makes labels uint16."""
    npy = shardkit.open(rgb_masks(rgb_masks_root, tmp_path / "npy", "npy", unknown))
    split = rgb_masks(rgb_masks_root, tmp_path / "h5", "hdf5", unknown, compression=compression,
                      label_encoding=encoding)
    manifest = validate_manifest(split)
    ds, stored = shardkit.open(split, labels="ids"), shardkit.open(split, labels="stored")
    assert len(ds) == len(npy) > 1 and ds.spec.size is None
    sizes = set()
    for i in range(len(ds)):
        (image, ids), (want_image, want_ids) = ds[i], npy[i]
        np.testing.assert_array_equal(image, want_image)
        np.testing.assert_array_equal(ids, want_ids)
        sizes.add(image.shape)
    assert len(sizes) > 1  # really variable
    documented = list(spec_reader()(split))
    assert len(documented) == len(ds)
    for i, (image, label) in enumerate(documented):
        np.testing.assert_array_equal(image, stored[i][0])
        np.testing.assert_array_equal(label, stored[i][1])
    # plain h5py by hand: flat arrays, shapes, offsets
    tail = (-1,) if encoding == "packed" else ()
    first = manifest["shards"][0]
    with h5py.File(split / first["files"][0]["name"], "r") as f:
        assert f.attrs["layout"] == "flat" and f.attrs["label_encoding"] == encoding
        assert f["labels"].dtype == np.dtype("<u2" if unknown == 300 else "u1")
        shapes, offsets = f["shapes"][()], f["offsets"][()]
        assert shapes.shape == (first["num_samples"], 2) and offsets.shape == (first["num_samples"] + 1, 2)
        for i, (h, w) in enumerate(shapes):
            image = f["images"][offsets[i, 0] : offsets[i + 1, 0]].reshape(h, w, 3)
            label = f["labels"][offsets[i, 1] : offsets[i + 1, 1]].reshape(h, w, *tail)
            np.testing.assert_array_equal(image, npy[i][0])
            assert ds.readers[0].shape_of(i) == (h, w)
            np.testing.assert_array_equal(label, stored[i][1])


def test_truncated_shard_is_a_one_line_error(camvid_root: Path, tmp_path: Path) -> None:
    split = camvid_val(camvid_root, tmp_path)
    mpath = split / "manifest.json"
    manifest = json.loads(mpath.read_text())
    entry = manifest["shards"][1]["files"][0]
    path = split / entry["name"]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    entry["bytes"] = len(data) // 2  # the manifest agrees: only the HDF5 reader can notice
    mpath.write_text(json.dumps(manifest))
    ds = shardkit.open(split)
    ds[0]
    with pytest.raises(ShardFormatError) as err:
        ds[manifest["shards"][1]["first_index"]]
    assert "\n" not in str(err.value) and entry["name"] in str(err.value)


# ---------------------------------------------------------------- direct (memory-mapped) reads
def h5py_twin(reader):
    """A clone of ``reader`` forced onto the h5py path (what compressed shards use)."""
    twin = pickle.loads(pickle.dumps(reader))
    twin.ensure_open()
    twin._map = twin._chunks = None
    assert not twin.direct
    return twin


def assert_same_batches(reader, twin, rng: np.random.Generator, tail: tuple[int, ...], dtype) -> None:
    n = len(reader)
    batches = [list(range(n)), [i % n for i in (n - 1, 0, 1, 2, 2, 5)]]
    batches += [np.sort(rng.choice(n, min(n, 7), replace=False)) for _ in range(10)]
    batches += [rng.integers(0, n, 9) for _ in range(10)]  # unsorted, with duplicates
    for idx in batches:
        got = (np.zeros((len(idx), *CROP, 3), np.uint8), np.zeros((len(idx), *CROP, *tail), dtype))
        want = (np.ones_like(got[0]), np.ones_like(got[1]))
        reader.read_batch_into(idx, *got)
        twin.read_batch_into(idx, *want)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


def test_uncompressed_shards_read_from_a_memory_map(camvid_h5: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed-size, uncompressed: samples come from the map, bit-identical to h5py's reads, never via h5py."""
    ds = shardkit.open(camvid_h5, labels="stored")
    assert len(ds.readers) >= 2
    twins = [h5py_twin(r) for r in ds.readers]
    expected = [(t.read(i)[0].copy(), t.read(i)[1].copy()) for t in twins for i in range(len(t))]
    rng = np.random.default_rng(0)

    def no_h5py(*args, **kwargs):
        raise AssertionError("the h5py path was used for an uncompressed shard")

    monkeypatch.setattr(type(ds.readers[0]), "_get", no_h5py)
    for reader, twin in zip(ds.readers, twins, strict=True):
        assert reader.direct and reader._map is not None and set(reader._chunks) == {"images", "labels"}
        image, label = reader.read(len(reader) - 1)
        assert not image.flags.writeable and not label.flags.writeable  # zero-copy views of the map
        assert np.shares_memory(image, reader._map)
        monkeypatch.undo()
        assert_same_batches(reader, twin, rng, (), np.uint8)
        monkeypatch.setattr(type(ds.readers[0]), "_get", no_h5py)
    for i, (image, label) in enumerate(expected):
        np.testing.assert_array_equal(ds[i][0], image)
        np.testing.assert_array_equal(ds[i][1], label)
    idx = np.sort(rng.choice(len(ds), 20, replace=False))
    images, labels = ds.batch(idx, out=ds.empty_batch(24))
    for k, i in enumerate(idx):
        np.testing.assert_array_equal(images[k], expected[i][0])
        np.testing.assert_array_equal(labels[k], expected[i][1])
    with pytest.raises(IndexError):
        ds.readers[0].read_batch_into([0, len(ds.readers[0])], *ds.empty_batch(2))


def test_memory_map_with_uint16_and_packed_labels(rgb_masks_root: Path, tmp_path: Path) -> None:
    """Label dtypes other than uint8 (index ids above 255 → uint16) and trailing label axes: same bytes."""
    rng = np.random.default_rng(1)
    for encoding, unknown, tail, dtype in (("index", 300, (), np.dtype("<u2")), ("packed", 255, (1,), np.uint8)):
        split = rgb_masks(rgb_masks_root, tmp_path / encoding, "hdf5", unknown, size=CROP, resize="exact",
                          label_encoding=encoding)
        for reader in shardkit.open(split, labels="stored").readers:
            assert reader.direct
            assert reader.read(0)[1].dtype == dtype
            assert_same_batches(reader, h5py_twin(reader), rng, tail, dtype)


def test_flat_uncompressed_reads_across_chunk_boundaries(rgb_masks_root: Path, tmp_path: Path) -> None:
    """Variable size, uncompressed: each sample assembled from its chunks in the map equals h5py's read."""
    split = rgb_masks(rgb_masks_root, tmp_path, "hdf5", 300)
    ds = shardkit.open(split, labels="stored")
    crossing = 0
    for reader in ds.readers:
        twin = h5py_twin(reader)
        assert reader.direct and reader._chunks["images"].per_chunk == 262144
        for i in range(len(reader)):
            a0, a1 = reader._offsets[i, 0], reader._offsets[i + 1, 0]
            crossing += a0 // 262144 != (a1 - 1) // 262144
            for got, want in zip(reader.read(i), twin.read(i), strict=True):
                assert got.shape == want.shape and got.dtype == want.dtype
                np.testing.assert_array_equal(got, want)
    assert crossing > 0


@pytest.mark.parametrize("compression", ["gzip", "lzf"])
def test_compressed_shards_are_decoded_by_shardkit_not_hdf5(camvid_h5: Path, camvid_root: Path, tmp_path: Path,
                                                            compression: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """gzip and LZF chunks are decoded from the memory map by shardkit's bounded decoders (HDF5's filters are
    unbounded): the same pixels as the uncompressed split, never through h5py."""
    plain = shardkit.open(camvid_h5)
    packed = shardkit.open(camvid_val(camvid_root, tmp_path, compression=compression))

    def no_h5py(*args, **kwargs):
        raise AssertionError("a compressed chunk was read through h5py")

    monkeypatch.setattr(type(packed.readers[0]), "_get", no_h5py)
    assert all(r.direct for r in packed.readers) and all(r.direct for r in plain.readers)
    rng = np.random.default_rng(2)
    for idx in ([0, 1, 2, 3], np.sort(rng.choice(len(plain), 12, replace=False)), rng.integers(0, 26, 8)):
        for a, b in zip(plain.batch(idx), packed.batch(idx), strict=True):
            np.testing.assert_array_equal(a, b)


def _forked_read(reader, idx, queue) -> None:
    inherited = reader._map
    images, labels = np.zeros((len(idx), *CROP, 3), np.uint8), np.zeros((len(idx), *CROP), np.uint8)
    reader.read_batch_into(idx, images, labels)
    queue.put((reader._pid == os.getpid(), reader._map is not None and reader._map is not inherited,
               images.tobytes() + labels.tobytes()))


def test_pickled_and_forked_readers_reopen_the_map(camvid_h5: Path) -> None:
    reader = shardkit.open(camvid_h5).readers[0]
    idx = [len(reader) - 1, 1, 0, 0]
    want = (np.zeros((4, *CROP, 3), np.uint8), np.zeros((4, *CROP), np.uint8))
    reader.read_batch_into(idx, *want)
    assert reader._map is not None
    clone = pickle.loads(pickle.dumps(reader))  # the map never travels
    assert clone._map is None and clone._chunks is None and clone._file is None
    got = (np.zeros_like(want[0]), np.zeros_like(want[1]))
    clone.read_batch_into(idx, *got)
    assert clone.direct and clone._map is not None and clone._map is not reader._map
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_forked_read, args=(reader, idx, queue))
    proc.start()
    reopened, fresh_map, data = queue.get(timeout=60)
    proc.join(60)
    assert proc.exitcode == 0 and reopened and fresh_map
    assert data == want[0].tobytes() + want[1].tobytes()


# ---------------------------------------------------------------- decompression bombs
def _lzf_bomb(nbytes: int) -> bytes:
    """An LZF block of one literal zero byte, then back references of 264 bytes each (3 bytes apiece)."""
    return b"\x00\x00" + b"\xe0\xff\x00" * (nbytes // 264)


def _bombs() -> dict[str, tuple[dict, bytes]]:
    import zlib

    import zstandard

    zeros = bytes(64 << 20)  # 64 MiB in a chunk that declares one 64x96x3 image (18 KiB)
    return {
        "gzip": ({"compression": "gzip"}, zlib.compress(zeros, 9)),
        "lzf": ({"compression": "lzf"}, _lzf_bomb(16 << 20)),
        "zstd": ({"image_codec": "zstd"}, zstandard.ZstdCompressor(write_content_size=False).compress(zeros)),
        "zstd-claims-its-size": ({"image_codec": "zstd"}, _zstd_frame_longer_than_it_says(CROP[0] * CROP[1] * 3)),
        "lz4": ({"image_codec": "lz4"}, (64 << 20).to_bytes(8, "big") + (1 << 30).to_bytes(4, "big")
                + (1000).to_bytes(4, "big") + bytes(1000)),
    }


def _zstd_frame_longer_than_it_says(size: int) -> bytes:
    """Two zstd frames back to back: the first of exactly ``size`` bytes, then 64 MiB more."""
    import zstandard

    c = zstandard.ZstdCompressor(write_content_size=True)
    return c.compress(bytes(size)) + zstandard.ZstdCompressor(write_content_size=False).compress(bytes(64 << 20))


@pytest.mark.parametrize("bomb", list(_bombs()))
def test_a_decompression_bomb_in_a_chunk_is_refused_before_it_is_inflated(camvid_root: Path, tmp_path: Path,
                                                                          bomb: str) -> None:
    """A chunk whose data inflates past the declared chunk (gzip, LZF, zstd, lz4) is a one-line error naming the
    sample, from ``ds[i]``, a batch and ``verify``; before the fix HDF5's filters served it (gzip: 2 GiB from
    507 KB) or retried for minutes (LZF)."""
    from shardkit.verify import verify_split
    from tests.fuzz import refresh_manifest

    options, payload = _bombs()[bomb]
    split = camvid_val(camvid_root, tmp_path, workers=0, **options)
    name = json.loads((split / "manifest.json").read_text())["shards"][0]["files"][0]["name"]
    with h5py.File(split / name, "r+") as f:
        f["images"].id.write_direct_chunk((0, 0, 0, 0), payload, 0)
    refresh_manifest(split)
    ds = shardkit.open(split)
    with pytest.raises(ShardFormatError) as err:
        ds[0]
    assert "sample 0 image" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ShardFormatError):
        ds.batch([1, 0])
    np.testing.assert_array_equal(ds[1][0], shardkit.open(camvid_val(camvid_root, tmp_path / "plain"))[1][0])
    report = verify_split(split)
    assert not report.ok and "sample 0 image" in report.problems[0]


def test_lzf_decoder_matches_h5py_on_real_chunks(camvid_root: Path, tmp_path: Path) -> None:
    """shardkit's LZF decoding (numba kernel, and the plain-Python loop) gives h5py's bytes for every chunk."""
    from shardkit.codecs import registry as codecs

    split = camvid_val(camvid_root, tmp_path, compression="lzf")
    checked = 0
    for name in sorted(p.name for p in split.glob("shard-*.h5")):
        with h5py.File(split / name, "r") as f:
            for ds in (f["images"], f["labels"]):
                whole = ds[()]
                nbytes = int(np.prod(ds.chunks)) * ds.dtype.itemsize
                for j in range(ds.id.get_num_chunks()):
                    info = ds.id.get_chunk_info(j)
                    mask, raw = ds.id.read_direct_chunk(info.chunk_offset)
                    want = whole[info.chunk_offset[0]].tobytes()
                    if mask:
                        continue
                    out = np.empty(nbytes, np.uint8)
                    codecs.lzf_decode_into(raw, out)
                    buf = bytearray(nbytes)
                    assert codecs._lzf_python(bytes(raw), buf) == nbytes
                    assert out.tobytes() == want and bytes(buf) == want
                    checked += 1
    assert checked >= 26
