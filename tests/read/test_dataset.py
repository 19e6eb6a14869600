"""The core reader on converted real data: samples, batches, label outputs, epochs, ranks, errors."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

import shardkit
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import ConfigError, IntegrityError, ShardFormatError, UnsafePathError
from shardkit.images.preprocess import encode_label
from shardkit.read.dataset import Dataset

CROP = (352, 480)
#: format → stored label encoding: together they decode all three encodings.
VARIANTS = {"npy": "index", "lmdb": "packed", "hdf5": "onehot", "tfrecord": "index"}


@pytest.fixture(scope="module")
def splits(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """CamVid val (26 pairs) in every format, 7 samples per shard (4 shards)."""
    out = tmp_path_factory.mktemp("read")
    folders = {}
    for fmt, enc in VARIANTS.items():
        convert(ConvertConfig(camvid_root, out / fmt, format=fmt, size=CROP, splits=("val",), workers=2,
                              quiet=True, label_encoding=enc, shard_size=ShardSize(samples=7),
                              compression="gzip" if fmt == "tfrecord" else "none"))
        folders[fmt] = out / fmt / "val"
    return folders


@pytest.fixture(scope="module")
def truth(splits: dict[str, Path]) -> tuple[np.ndarray, np.ndarray]:
    """Every image and id label, read one by one from the npy index split."""
    ds = shardkit.open(splits["npy"])
    images, ids = zip(*(ds[i] for i in range(len(ds))), strict=True)
    return np.stack(images), np.stack(ids)


def test_labels_are_bit_exact_against_the_source(splits: dict[str, Path], camvid_root: Path) -> None:
    ds = shardkit.open(splits["lmdb"])  # packed on disk, ids out
    for i in (0, 13, 25):
        rec = ds.manifest.samples[i]
        src = cv2.imread(str(camvid_root / rec["label"]), cv2.IMREAD_UNCHANGED)
        top = (src.shape[0] - CROP[0]) // 2  # 360 → 352: centre crop
        assert np.array_equal(ds[i][1], src[top:top + CROP[0]])


@pytest.mark.parametrize("fmt", list(VARIANTS))
@pytest.mark.parametrize("labels", ["ids", "onehot", "float_onehot"])
def test_every_format_and_label_output_agrees(splits: dict[str, Path], truth: tuple, fmt: str,
                                             labels: str) -> None:
    images, ids = truth
    ds = shardkit.open(splits[fmt], labels=labels)
    assert len(ds) == 26 and ds.num_classes == 12 and len(ds.readers) == 4
    if labels == "ids":
        want = ids
    else:
        # the ignore class (11, the last of CamVid's 12) has no one-hot channel: 11 channels, ignore all zero
        want = encode_label(ids, "onehot", 11).astype(np.float32 if labels == "float_onehot" else np.uint8)
    order = np.array([25, 3, 3, 0, 14, 7, 6, -1, 20, 8])  # unsorted, repeated, negative, across shards
    got_images, got_labels = ds.batch(order)
    assert got_labels.dtype == ds.label_dtype == want.dtype
    assert np.array_equal(got_images, images[order]) and np.array_equal(got_labels, want[order])
    for i in (0, 9, 25):
        image, label = ds[i]
        assert np.array_equal(image, images[i]) and np.array_equal(label, want[i])


def test_stored_labels_are_the_stored_encoding(splits: dict[str, Path], truth: tuple) -> None:
    _, ids = truth
    packed = shardkit.open(splits["lmdb"], labels="stored").batch(range(26))[1]
    assert packed.shape == (26, *CROP, 2) and np.array_equal(packed, encode_label(ids, "packed", 12))
    onehot = shardkit.open(splits["hdf5"], labels="stored")[5][1]
    assert onehot.shape == (*CROP, 12) and np.array_equal(onehot, encode_label(ids[5], "onehot", 12))


def test_batch_fills_caller_buffers_and_checks_them(splits: dict[str, Path], truth: tuple) -> None:
    images, ids = truth
    ds = shardkit.open(splits["npy"])
    out = ds.empty_batch(8)
    got_images, got_labels = ds.batch([4, 5, 6], out=out)
    assert got_images.shape[0] == 3
    assert np.shares_memory(got_images, out[0]) and np.shares_memory(got_labels, out[1])
    assert np.array_equal(got_images, images[4:7]) and np.array_equal(got_labels, ids[4:7])
    onehot = shardkit.open(splits["lmdb"], labels="onehot")
    with pytest.raises(ConfigError, match="empty_batch"):
        onehot.batch([0, 1], out=out)  # id buffers for a one-hot dataset
    with pytest.raises(ConfigError):
        ds.batch([0, 1, 2], out=ds.empty_batch(2))  # too small
    with pytest.raises(IndexError, match="26"):
        ds.batch([0, 26])
    with pytest.raises(ConfigError):
        ds.batch([[0, 1]])
    assert ds.batch([])[0].shape == (0, *CROP, 3)


def test_iter_batches_one_epoch_every_sample_once(splits: dict[str, Path], truth: tuple) -> None:
    images, ids = truth
    for fmt in ("npy", "tfrecord"):
        ds = shardkit.open(splits[fmt])
        seen = []
        buffers = []
        for idx, got_images, got_labels in ds.iter_batches(4, seed=7, epoch=1, with_indices=True):
            assert list(idx) == sorted(idx)
            assert np.array_equal(got_images, images[idx]) and np.array_equal(got_labels, ids[idx])
            buffers.append(got_images.base if got_images.base is not None else got_images)
            seen.extend(idx.tolist())
        assert sorted(seen) == list(range(26)) and len(seen) == 26
        assert len({id(b) for b in buffers}) == 2  # a ring of two reused buffers
        again = [i for idx, _, _ in ds.iter_batches(4, seed=7, epoch=1, with_indices=True) for i in idx]
        other = [i for idx, _, _ in ds.iter_batches(4, seed=7, epoch=2, with_indices=True) for i in idx]
        assert again == seen and other != seen
    dropped = list(shardkit.open(splits["npy"]).iter_batches(4, drop_last=True, buffers=0))
    assert len(dropped) == 6 and all(len(b[0]) == 4 for b in dropped)


@pytest.mark.parametrize("fmt", ["npy", "tfrecord"])
def test_two_ranks_get_equal_disjoint_shares(splits: dict[str, Path], fmt: str) -> None:
    ds = shardkit.open(splits[fmt])
    assert ds.random_access == (fmt != "tfrecord")
    shares = [[i for idx, _, _ in ds.iter_batches(5, seed=3, epoch=0, rank=r, world_size=2, with_indices=True)
               for i in idx] for r in range(2)]
    assert len(shares[0]) == len(shares[1]) == 13
    assert not set(shares[0]) & set(shares[1]) and set(shares[0]) | set(shares[1]) == set(range(26))
    three = [list(ds.sampler(5, rank=r, world_size=3).indices()) for r in range(3)]
    assert [len(s) for s in three] == [9, 9, 9] and set().union(*three) == set(range(26))


def test_normalize_uses_manifest_stats(splits: dict[str, Path]) -> None:
    ds = shardkit.open(splits["npy"])
    images, _ = ds.batch([0, 1])
    mean = np.array(ds.manifest.stats["image_mean"], np.float32)
    std = np.array(ds.manifest.stats["image_std"], np.float32)
    np.testing.assert_allclose(ds.normalize(images), (images - mean) / std, rtol=1e-5, atol=1e-5)
    assert ds.class_names[:2] == ["Sky", "Building"] and ds.class_colours[3] == (128, 64, 128)


@pytest.mark.parametrize("fmt", ["npy", "lmdb"])
def test_a_slice_reads_a_batch_as_numpy_slices_an_array(splits: dict[str, Path], truth: tuple, fmt: str) -> None:
    """``ds[a:b]`` is what a numpy user expects of ``array[a:b]`` (#43): the stacked samples, any step or sign."""
    images, ids = truth
    ds = shardkit.open(splits[fmt])
    for key in (slice(0, 2), slice(20, None), slice(-3, None), slice(None, None, 5), slice(10, 4, -2), slice(3, 3)):
        got_images, got_labels = ds[key]
        assert np.array_equal(got_images, images[key]) and np.array_equal(got_labels, ids[key]), key
    assert np.array_equal(ds[np.int64(-1)][1], ids[-1])  # numpy integers index as ints do
    for bad in ([0, 1], 1.5, "0"):
        with pytest.raises(TypeError) as err:
            ds[bad]  # type: ignore[index]
        assert len(str(err.value).splitlines()) == 1 and "ds.batch([...])" in str(err.value), err.value


def test_variable_size_reads_samples_and_refuses_batches(rgb_masks_root: Path, tmp_path: Path) -> None:
    convert(ConvertConfig(rgb_masks_root, tmp_path, format="npy", splits=("val",), workers=1, quiet=True,
                          unknown_as=255, ignore_index=255))
    ds = shardkit.open(tmp_path / "val", labels="onehot")
    shapes = {ds[i][0].shape for i in range(len(ds))}
    assert len(shapes) > 1 and all(ds[i][1].shape == (*ds[i][0].shape[:2], 3) for i in range(len(ds)))
    with pytest.raises(ConfigError, match=f"samples of one size, but this split's {len(ds)} samples have "
                       f"{len(shapes)} sizes"):
        ds.batch([0, 1])
    with pytest.raises(ConfigError, match="samples of one size"):
        next(ds.iter_batches(2))


@pytest.mark.parametrize("fmt", ["npy", "lmdb", "hdf5"])
def test_unresized_split_of_one_size_batches_as_it_is(camvid_root: Path, tmp_path: Path, fmt: str) -> None:
    """CamVid converted without --size: every sample is 360x480, so it batches (it used to be refused)."""
    convert(ConvertConfig(camvid_root, tmp_path, format=fmt, splits=("val",), workers=1, quiet=True))
    ds = shardkit.open(tmp_path / "val")
    assert ds.spec.size is None and ds.sample_sizes() == {(360, 480): len(ds)}
    order = [5, 0, 25, 3]
    images, labels = ds.batch(order)
    assert images.shape == (4, 360, 480, 3) and labels.shape == (4, 360, 480)
    for k, i in enumerate(order):
        assert np.array_equal(images[k], ds[i][0]) and np.array_equal(labels[k], ds[i][1])
    seen = np.concatenate([lab.reshape(len(lab), -1)[:, :1] for _, lab in ds.iter_batches(8, shuffle=False)])
    assert len(seen) == len(ds)


def test_sample_sizes_counted_by_another_thread_are_never_seen_half_done(camvid_root: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras's thread workers ask a fresh Dataset for its sample sizes at once: one thread counting the sidecars
    must not leave a partial (empty) count for another to read ("123 samples have 0 sizes"), which it did."""
    import threading

    convert(ConvertConfig(camvid_root, tmp_path, format="npy", splits=("val",), workers=1, quiet=True))
    ds = shardkit.open(tmp_path / "val")
    assert ds.spec.size is None  # sizes come from the sidecars
    entered, release = threading.Event(), threading.Event()
    table, hw = ds.manifest.samples, ds.manifest.samples.hw

    def slow_hw(pos: int) -> np.ndarray:
        if threading.current_thread() is not threading.main_thread():
            entered.set()
            release.wait(10)
        return hw(pos)

    monkeypatch.setattr(table, "hw", slow_hw)
    counting = threading.Thread(target=ds.sample_sizes)
    counting.start()
    assert entered.wait(10)
    try:
        assert ds.sample_sizes() == {(360, 480): len(ds)}  # while the other thread is still counting
    finally:
        release.set()
        counting.join()
    assert ds.sample_sizes() == {(360, 480): len(ds)}


def test_pickled_dataset_reopens_lazily(splits: dict[str, Path], truth: tuple) -> None:
    ds = shardkit.open(splits["lmdb"])
    ds.batch([0, 1])  # opened here
    clone = pickle.loads(pickle.dumps(ds))
    assert ds.readers[0].is_open and not any(r.is_open for r in clone.readers)
    assert np.array_equal(clone.batch([2, 20])[1], truth[1][[2, 20]])
    second = shardkit.open(splits["lmdb"])  # same LMDB files, same process: one shared environment
    assert np.array_equal(second[3][1], truth[1][3])


def _child_checksum(path: str) -> int:
    ds = shardkit.open(path)
    return int(ds.batch(range(len(ds)))[1].sum(dtype=np.int64))


def test_forked_child_reads_lmdb_the_parent_holds_open(splits: dict[str, Path], truth: tuple) -> None:
    ds = shardkit.open(splits["lmdb"])
    ds[0]  # the parent holds every environment it touched open
    ds.batch(range(26))
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_child_checksum, (str(splits["lmdb"]),)) == int(truth[1].sum(dtype=np.int64))
    assert np.array_equal(ds[25][1], truth[1][25])  # the parent's environments still work


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_damaged_splits_are_clear_errors(splits: dict[str, Path], tmp_path: Path) -> None:
    shardkit.open(splits["npy"], verify=True)
    split = _copy(splits["npy"], tmp_path / "flip")
    name = json.loads((split / "manifest.json").read_text())["shards"][1]["files"][0]["name"]
    data = bytearray((split / name).read_bytes())
    data[-1] ^= 0xFF
    (split / name).write_bytes(bytes(data))
    shardkit.open(split)  # sizes agree: only the hash can tell
    with pytest.raises(IntegrityError, match="sha256"):
        shardkit.open(split, verify=True)
    (split / name).write_bytes(bytes(data[:-10]))
    with pytest.raises(IntegrityError, match="truncated"):
        shardkit.open(split)

    split = _copy(splits["npy"], tmp_path / "escape")
    m = json.loads((split / "manifest.json").read_text())
    m["shards"][0]["files"][0]["name"] = "../../etc/passwd"
    (split / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UnsafePathError, match="escapes"):
        shardkit.open(split)

    split = _copy(splits["npy"], tmp_path / "version")
    m = json.loads((split / "manifest.json").read_text())
    m["format_version"] = 99
    (split / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ShardFormatError, match="version 99"):
        shardkit.open(split)
    with pytest.raises(ConfigError):
        Dataset(splits["npy"], labels="probabilities")


def test_imports_no_framework(splits: dict[str, Path]) -> None:
    """``import shardkit`` and the core reader (reading included) pull in no deep-learning framework."""
    code = (
        "import sys, shardkit, shardkit.read.dataset, shardkit.read.sampling, shardkit.show, shardkit.tf\n"
        f"ds = shardkit.open({str(splits['lmdb'])!r}, labels='onehot'); ds.batch([0, 1]); ds[2]\n"
        "list(ds.iter_batches(8))\n"
        "print(sorted(m for m in ('torch', 'tensorflow', 'keras', 'tfrecord', 'jax') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_opening_a_local_split_loads_no_shard_cache_or_package_metadata(splits: dict[str, Path]) -> None:
    """What only a split on object storage (the shard cache: multiprocessing, locks) or an error message (the
    package metadata, ~40 ms) needs is not imported to open and read a local split (#42: open time)."""
    code = (
        "import sys, shardkit\n"
        f"ds = shardkit.open({str(splits['npy'])!r}); ds.batch([0, 1]); ds[2]\n"
        "print(sorted(m for m in ('shardkit.read.cache', 'multiprocessing', 'importlib.metadata', "
        "'shardkit.augment') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("fmt", list(VARIANTS))
@pytest.mark.parametrize("labels", ["onehot", "float_onehot"])
def test_channels_first_one_hot_equals_moved_channels_last(splits: dict[str, Path], truth: tuple, fmt: str,
                                                          labels: str) -> None:
    _, ids = truth
    ds = shardkit.open(splits[fmt], labels=labels, label_layout="channels_first")
    want = np.moveaxis(encode_label(ids, "onehot", 11), -1, -3).astype(ds.label_dtype)  # no ignore channel
    order = np.array([25, 3, 0, 14, 7])
    _, got = ds.batch(order)
    assert got.shape == (5, 11, *CROP) and got.flags.c_contiguous
    assert np.array_equal(got, want[order])
    assert np.array_equal(ds[9][1], want[9])


@pytest.mark.parametrize("damage", ["short", "header"])
def test_batch_refuses_a_damaged_lmdb_record(splits: dict[str, Path], tmp_path: Path, damage: str) -> None:
    import lmdb

    from shardkit.formats.lmdb import RECORD_HEADER

    folder = tmp_path / "val"
    shutil.copytree(splits["lmdb"], folder)
    ds = shardkit.open(folder)
    shard = folder / ds.manifest.shards[0].files[0].name
    env = lmdb.open(str(shard), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        good = bytes(txn.get(b"%08d" % 2))
        hdr = RECORD_HEADER.itemsize
        h, w, ni, nl = np.frombuffer(good, RECORD_HEADER, count=1)[0].tolist()
        bad = (good[:-1] if damage == "short"  # same header, one byte missing
               else np.array([(w, h, ni, nl)], RECORD_HEADER).tobytes() + good[hdr:])  # same length, H/W swapped
        txn.put(b"%08d" % 2, bad)
    env.close()
    manifest = json.loads((folder / "manifest.json").read_text())  # the damage is inside a well-formed file
    entry = manifest["shards"][0]["files"][0]
    entry["bytes"] = shard.stat().st_size
    entry["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    fresh = shardkit.open(folder)
    assert np.array_equal(fresh.batch([0, 1])[0], ds.batch([0, 1])[0])  # undamaged records still read
    with pytest.raises(ShardFormatError, match="sample 2"):
        fresh.batch([1, 2, 3])


def test_a_dataset_reads_its_version_and_holds_a_lease_until_closed(tmp_path: Path) -> None:
    golden = Path(__file__).resolve().parents[2] / "formats" / "golden"
    split = tmp_path / "train"
    shutil.copytree(golden / "manifest3-npy-fixed" / "train", split)
    ds = shardkit.open(split)
    assert ds.version == 1
    leases = [p.name for p in split.glob(".lease-v1-*")]
    assert len(leases) == 1
    clone = pickle.loads(pickle.dumps(ds))  # a spawned worker: same version, no lease of its own
    assert clone.version == 1 and np.array_equal(clone[2][0], ds[2][0])
    del clone
    assert [p.name for p in split.glob(".lease-v1-*")] == leases
    ds.close()
    assert not list(split.glob(".lease-*"))
    assert shardkit.open(golden / "manifest2-npy-fixed" / "train").version is None  # written before versions
    for bad in (0, -1, True, "1"):
        with pytest.raises(ConfigError, match="is not a publish number"):
            shardkit.open(split, version=bad)  # type: ignore[arg-type]
