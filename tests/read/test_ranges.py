"""Range reads of a split on object storage (issue 41), against a real local S3 server (moto on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardkit
from shardkit.errors import ConfigError, IntegrityError, ShardFormatError
from shardkit.files.storage import Remote
from shardkit.read.ranges import PerBatchShards, RangedShards
from shardkit.read.source import CachedShards
from shardkit.testing import local_s3, make_bucket

URL = "s3://ranges/camvid/val"


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    with local_s3() as endpoint:
        make_bucket("ranges")
        yield endpoint


def _upload(folder: Path, url: str) -> None:
    remote = Remote(url)
    for p in sorted(folder.iterdir()):
        if p.is_file():
            remote.upload(p, p.name)


@pytest.fixture(scope="module")
def split(s3: str, camvid_val_npy: Path) -> str:
    """The CamVid val npy split (26 samples of 360x480 in two shards) copied to the bucket as it is."""
    _upload(camvid_val_npy, URL)
    return URL


def _ranged(url: str, cache: Path, **options: Any) -> shardkit.Dataset:
    ds = shardkit.open(url, cache_dir=cache, remote_reads="ranges", **options)
    assert isinstance(ds.source, RangedShards)
    return ds


def _tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def test_a_shuffled_epoch_by_ranges_equals_a_local_read_and_fetches_only_what_it_uses(
        split: str, camvid_val_npy: Path, tmp_path: Path) -> None:
    ref = shardkit.open(camvid_val_npy)
    ds = _ranged(split, tmp_path / "cache")
    stats = ds.source.stats  # type: ignore[attr-defined]
    seen: list[int] = []
    for batch in ds.sampler(shardkit.EpochPlan(4, seed=5)).batches():
        images, labels = ds.batch(batch)
        want_images, want_labels = ref.batch(batch)
        assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)
        seen.extend(np.asarray(batch).tolist())
    assert sorted(seen) == list(range(len(ref)))
    # read amplification (bytes fetched ÷ bytes of samples used) of a shuffled epoch, counted, not timed
    assert stats.used == len(ref) * (360 * 480 * 3 + 360 * 480)
    assert 1.0 <= stats.amplification <= 1.2, (stats.fetched, stats.used)
    assert stats.requests <= 2 * len(ref) + 2 * len(ds.source)  # at most one per sample and object (+ headers)
    for i in (25, 0, 13, 12):  # single samples too, in an order that crosses shards
        (image, label), (want_i, want_l) = ds[i], ref[i]
        assert np.array_equal(image, want_i) and np.array_equal(label, want_l)
    # no shard is downloaded: the cache folder holds the manifest and the samples sidecars only
    files = _tree(ds.cache.directory)  # type: ignore[union-attr]
    assert not [n for n in files if n.startswith(("images-", "labels-")) or ".transient-" in n], files
    manifest = json.loads((camvid_val_npy / "manifest.json").read_text())
    sidecars = sum(s["samples"]["bytes"] for s in manifest["shards"])
    assert sum(files.values()) <= 2 * (camvid_val_npy / "manifest.json").stat().st_size + sidecars + 4096
    assert ds.source.fetcher.held <= ds.source.block_bytes  # type: ignore[attr-defined]
    ds.close()  # handles and request threads let go of; a later read opens them again
    assert np.array_equal(ds[3][0], ref[3][0])


def test_adjacent_samples_of_a_batch_are_coalesced_into_one_request(split: str, tmp_path: Path) -> None:
    ds = _ranged(split, tmp_path / "cache")
    stats = ds.source.stats  # type: ignore[attr-defined]
    ds.batch([3, 4, 5, 6])  # headers coalesce with nothing (sample 0 is not read): 2 requests, then one per object
    assert stats.requests == 4, stats
    before = stats.requests
    ds.batch([20, 22])  # a row apart: more than the gap threshold, and another shard
    assert stats.requests - before == 2 + 4, stats
    before, fetched = stats.requests, stats.fetched
    ds.batch([4, 5])  # within the block fetched for 3..6: served by the block LRU
    assert (stats.requests, stats.fetched) == (before, fetched)


def test_the_block_cache_stays_within_its_byte_bound(split: str, tmp_path: Path) -> None:
    ds = _ranged(split, tmp_path / "cache", cache_limit=2_000_000)
    source = ds.source
    assert isinstance(source, RangedShards) and source.block_bytes == 2_000_000
    for batch in ds.sampler(shardkit.EpochPlan(3, seed=1)).batches():
        ds.batch(batch)
        assert source.fetcher.held <= 2_000_000


def test_auto_chooses_per_batch_only_for_a_split_larger_than_the_cache_and_states_the_rule(
        split: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="shardkit.read.ranges"):
        small = shardkit.open(split, cache_dir=tmp_path / "a", cache_limit="8MB", remote_reads="auto")
        large = shardkit.open(split, cache_dir=tmp_path / "b", cache_limit="1GB", remote_reads="auto")
        unlimited = shardkit.open(split, cache_dir=tmp_path / "c", remote_reads="auto")
    assert isinstance(small.source, PerBatchShards)
    assert isinstance(large.source, CachedShards) and isinstance(unlimited.source, CachedShards)
    said = [r.getMessage() for r in caplog.records]
    rule = [m for m in said if "remote_reads='auto' chooses per batch" in m]
    assert len(rule) == 1, said  # the rule, stated once when the split is opened
    assert "consecutive samples in order" in rule[0] and "whole through the cache" in rule[0], rule
    assert "shuffled or sparse" in rule[0] and "by ranges" in rule[0] and "exceed cache_limit 8000000" in rule[0]
    assert sum("whole shards through the cache" in m for m in said) == 2, said
    assert shardkit.OpenOptions().remote_reads == "auto"  # the default
    with caplog.at_level(logging.INFO, logger="shardkit.read.ranges"):
        default = shardkit.open(split, cache_dir=tmp_path / "d", cache_limit="8MB")
        pinned = shardkit.open(split, cache_dir=tmp_path / "e", cache_limit="8MB", remote_reads="shards")
        ranged = shardkit.open(split, cache_dir=tmp_path / "f", cache_limit="8MB", remote_reads="ranges")
    assert isinstance(default.source, PerBatchShards) and isinstance(pinned.source, CachedShards)
    assert type(ranged.source) is RangedShards
    with pytest.raises(ConfigError, match="remote_reads='fast' is not one of"):
        shardkit.OpenOptions(remote_reads="fast")


def _count_shard_downloads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the objects the shard cache downloads whole from now on (one GET each, no Range)."""
    import shardkit.read.cache as cache_module

    names: list[str] = []
    real = cache_module.download_verified

    def counted(remote: Remote, f: Any, directory: Path) -> Any:
        names.append(f.name)
        return real(remote, f, directory)

    monkeypatch.setattr(cache_module, "download_verified", counted)
    return names


def _shard_objects(ds: shardkit.Dataset, names: list[str] | None = None) -> list[str]:
    """The split's image and label objects (of ``names``: those of them, each as often as it is there)."""
    data = {f.name for s in ds.manifest.shards for f in s.files}
    return sorted(n for n in (data if names is None else names) if n in data)


def test_auto_reads_a_sequential_pass_in_whole_shards_equal_to_a_local_read(
        split: str, camvid_val_npy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unshuffled epoch (split 18 MB, cache_limit 8 MB) under auto: every shard object downloaded whole once,
    no range request, every sample equal to a local read."""
    ref = shardkit.open(camvid_val_npy)
    ds = shardkit.open(split, cache_dir=tmp_path / "cache", cache_limit="8MB", remote_reads="auto")
    downloads = _count_shard_downloads(monkeypatch)
    for batch in ds.sampler(shardkit.EpochPlan(4, shuffle=False)).batches():
        images, labels = ds.batch(batch)
        want_images, want_labels = ref.batch(batch)
        assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)
    assert _shard_objects(ds, downloads) == _shard_objects(ds), downloads  # each shard file once, whole
    assert ds.source.stats.requests == 0  # type: ignore[attr-defined]
    # a DataLoader worker's share of a sequential pass, every other batch: whole shards too
    worker = shardkit.open(split, cache_dir=tmp_path / "cache2", cache_limit="8MB", remote_reads="auto")
    downloads.clear()
    for start in range(0, len(ref), 8):
        batch = list(range(start, min(start + 4, len(ref))))
        assert np.array_equal(worker.batch(batch)[0], ref.batch(batch)[0])
    assert _shard_objects(ds, downloads) == _shard_objects(ds), downloads
    assert worker.source.stats.requests == 0  # type: ignore[attr-defined]
    sparse = shardkit.open(split, cache_dir=tmp_path / "cache3", cache_limit="8MB", remote_reads="auto")
    downloads.clear()
    assert np.array_equal(sparse.batch([11, 12])[0], ref.batch([11, 12])[0])  # consecutive, but in no pass
    assert _shard_objects(ds, downloads) == [] and sparse.source.stats.requests > 0  # type: ignore[attr-defined]


def test_auto_reads_shuffled_passes_by_ranges_and_a_sequential_one_whole_on_one_dataset(
        split: str, camvid_val_npy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One Dataset under auto: a shuffled epoch by ranges (read amplification <= 1.2, nothing downloaded whole),
    then an unshuffled epoch in whole shards, then a shuffled one by ranges again; every sample equal to a local
    read."""
    ref = shardkit.open(camvid_val_npy)
    ds = shardkit.open(split, cache_dir=tmp_path / "cache", cache_limit="8MB", remote_reads="auto")
    downloads = _count_shard_downloads(monkeypatch)
    stats = ds.source.stats  # type: ignore[attr-defined]

    def epoch(plan: shardkit.EpochPlan) -> None:
        for batch in ds.sampler(plan).batches():
            images, labels = ds.batch(batch)
            want_images, want_labels = ref.batch(batch)
            assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)

    epoch(shardkit.EpochPlan(4, seed=5))
    assert _shard_objects(ds, downloads) == [], downloads  # the samples sidecars only (pixel hashes)
    assert stats.used == len(ref) * (360 * 480 * 3 + 360 * 480)
    assert 1.0 <= stats.amplification <= 1.2, (stats.fetched, stats.used)
    epoch(shardkit.EpochPlan(4, shuffle=False))
    assert _shard_objects(ds, downloads) == _shard_objects(ds), downloads
    requests = stats.requests
    epoch(shardkit.EpochPlan(4, seed=6))
    assert stats.requests > requests and stats.used == 2 * len(ref) * (360 * 480 * 3 + 360 * 480)
    assert _shard_objects(ds, downloads) == _shard_objects(ds), downloads


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 4 workers on a 2-core machine
@pytest.mark.parametrize("workers", [2, 4])
def test_workers_read_by_ranges_and_the_cache_folder_never_holds_a_shard(split: str, camvid_val_npy: Path,
                                                                          tmp_path: Path, workers: int) -> None:
    """A 2- and a 4-worker DataLoader read a shuffled epoch by ranges, equal to a local read; the cache folder's
    peak, sampled while they read, is the manifests and samples sidecars (the whole split is 18 MB)."""
    pytest.importorskip("torch")
    from shardkit.read.torch import make_loader

    ref = shardkit.open(camvid_val_npy)
    cache = tmp_path / "cache"
    plan = shardkit.EpochPlan(4, seed=2)
    loader = make_loader(split, plan, num_workers=workers, layout="NHWC", pin_memory=False,
                         multiprocessing_context="fork", persistent_workers=False,
                         options=shardkit.OpenOptions(cache_dir=cache, cache_limit="4MB", remote_reads="auto"))
    batches = list(ref.sampler(plan).batches())
    done, peak = threading.Event(), [0]

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], sum(_tree(cache).values()) if cache.is_dir() else 0)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        got = [(images.numpy(), labels.numpy()) for images, labels in loader]
    finally:
        done.set()
        watcher.join()
    assert len(got) == len(batches)
    for (images, labels), batch in zip(got, batches, strict=True):
        want_images, want_labels = ref.batch(batch)
        assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)
    manifest = json.loads((camvid_val_npy / "manifest.json").read_text())
    sidecars = sum(s["samples"]["bytes"] for s in manifest["shards"])
    small = 2 * (camvid_val_npy / "manifest.json").stat().st_size + sidecars
    assert 0 < peak[0] <= small + 4096, (peak[0], small)
    assert not list(cache.glob("*/images-*"))


# ------------------------------------------------------------------ hostile servers
def _first_image_object(url: str) -> str:
    m = json.loads(Remote(url).read_bytes("manifest.json"))
    return str(m["shards"][0]["files"][0]["name"])


@pytest.mark.parametrize("answer", ["truncated", "whole object (200)", "longer"])
def test_a_range_response_of_the_wrong_length_is_a_one_line_error_naming_the_object(
        split: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: str) -> None:
    from s3fs.core import S3File

    real = S3File._fetch_range

    def hostile(self: Any, start: int, end: int) -> bytes:
        data = real(self, start, end)
        if answer == "truncated":
            return data[:-7]
        if answer == "longer":
            return data + b"\0"
        return real(self, 0, self.size)  # the server ignored the Range header

    monkeypatch.setattr(S3File, "_fetch_range", hostile)
    ds = _ranged(split, tmp_path / "cache")
    with pytest.raises(IntegrityError) as err:
        ds.batch([1, 2])
    text = str(err.value)
    assert "\n" not in text and "the server sent" in text and "s3://ranges/camvid/val/" in text


def test_an_object_overwritten_mid_epoch_is_refused_never_a_wrong_sample(
        s3: str, camvid_val_npy: Path, tmp_path: Path) -> None:
    url = "s3://ranges/changed/val"
    _upload(camvid_val_npy, url)
    ref = shardkit.open(camvid_val_npy)
    ds = _ranged(url, tmp_path / "cache")
    images, _ = ds.batch([0, 1])
    assert np.array_equal(images, ref.batch([0, 1])[0])
    name = _first_image_object(url)
    last = ds.manifest.shards[0].num_samples - 1
    data = bytearray((camvid_val_npy / name).read_bytes())
    data[-5000:] = bytes(5000)  # same size, other pixels in the shard's last sample
    Remote(url).write_bytes(name, bytes(data))
    with pytest.raises(IntegrityError, match="changed while it was being read") as err:
        ds.batch([1, last])
    assert name in str(err.value) and "\n" not in str(err.value)
    # a process that opens the changed object afresh (same size, so its size check passes) still never returns
    # the wrong pixels: the image is checked against its sample's pixel hash
    fresh = _ranged(url, tmp_path / "cache2")
    assert np.array_equal(fresh.batch([0])[0], ref.batch([0])[0])  # an untouched sample still reads
    with pytest.raises(IntegrityError, match=f"sample {last}'s image bytes do not match its pixel hash"):
        fresh.batch([last])
    with pytest.raises(IntegrityError, match="differs from the manifest's"):  # verify=True hashes whole objects
        _ranged(url, tmp_path / "cache3", verify=True)
    assert isinstance(_ranged(URL, tmp_path / "cache4", verify=True).source, RangedShards)  # an intact split opens


def test_a_label_object_replaced_before_a_process_opens_it_is_refused_by_the_class_bitmaps(
        s3: str, camvid_val_npy: Path, tmp_path: Path) -> None:
    """No per-sample label hash exists: a same-size label object whose sample holds other classes is refused by
    the class bitmap in the samples sidecar (never returned as that sample's label)."""
    url = "s3://ranges/labels-changed/val"
    _upload(camvid_val_npy, url)
    m = json.loads((camvid_val_npy / "manifest.json").read_text())
    name = m["shards"][0]["files"][1]["name"]
    arr = np.load(camvid_val_npy / name)
    arr[2] = 0  # sample 2: every pixel class 0
    fake = tmp_path / "labels.npy"
    np.save(fake, arr)
    Remote(url).write_bytes(name, fake.read_bytes())
    ds = _ranged(url, tmp_path / "cache")
    ref = shardkit.open(camvid_val_npy)
    assert np.array_equal(ds[1][1], ref[1][1])  # the other samples still read
    with pytest.raises(IntegrityError, match=r"sample 2's label holds classes \[0\], its samples sidecar records"):
        ds.batch([1, 2])


def test_an_object_of_another_size_or_a_foreign_header_is_refused_before_any_sample(
        s3: str, camvid_val_npy: Path, tmp_path: Path) -> None:
    url = "s3://ranges/resized/val"
    _upload(camvid_val_npy, url)
    name = _first_image_object(url)
    data = (camvid_val_npy / name).read_bytes()
    Remote(url).write_bytes(name, data + b"\0" * 64)
    with pytest.raises(IntegrityError, match="the manifest says"):
        _ranged(url, tmp_path / "a").batch([1])
    arr = np.load(camvid_val_npy / name)
    other = arr.reshape(arr.shape[0], arr.shape[1] * 2, arr.shape[2] // 2, 3)  # same bytes, another shape
    fake = Path(tmp_path / "fake.npy")
    np.save(fake, other)
    assert fake.stat().st_size == len(data)
    Remote(url).write_bytes(name, fake.read_bytes())
    with pytest.raises(ShardFormatError, match=r"the \.npy header says"):
        _ranged(url, tmp_path / "b").batch([0])


def test_a_variable_size_npy_split_by_ranges_equals_a_local_read(s3: str, camvid_root: Path,
                                                                   tmp_path: Path) -> None:
    """Without --size the npy arrays are flat with a sizes table: fetched whole (sha256 checked), then each sample
    is its stretch of the flat arrays."""
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert

    convert(ConvertConfig(camvid_root, tmp_path / "out", format="npy", splits=("val",), workers=1, quiet=True,
                          shard_size=ShardSize(samples=7)))
    url = "s3://ranges/npy-variable/val"
    _upload(tmp_path / "out" / "val", url)
    ref = shardkit.open(tmp_path / "out" / "val")
    assert ref.spec.size is None
    ds = _ranged(url, tmp_path / "cache")
    order = np.random.default_rng(4).permutation(len(ref)).tolist()
    for i in order[:9]:
        (image, label), (want_i, want_l) = ds[i], ref[i]
        assert np.array_equal(image, want_i) and np.array_equal(label, want_l)
    rest = np.array(order[9:])
    images, labels = ds.batch(rest)  # CamVid's samples share one size: batches work as they do locally
    want_images, want_labels = ref.batch(rest)
    assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)
    stats = ds.source.stats  # type: ignore[attr-defined]
    tables = sum(s.files[2].bytes for s in ds.manifest.shards)
    headers = sum(ds.source.reader(p).layout[k][2] for p in range(len(ds.source)) for k in (0, 1))  # type: ignore[attr-defined]
    assert stats.used == sum(s.files[0].bytes + s.files[1].bytes for s in ds.manifest.shards) - headers  # all once
    assert stats.used + tables <= stats.fetched <= 1.2 * stats.used
    copy = pickle.loads(pickle.dumps(ds))  # laid out again from the sizes table in the next process
    assert np.array_equal(copy[order[0]][0], ref[order[0]][0])


# ------------------------------------------------------------------ TFRecord: records by their index offsets
def _tfrecord_split(camvid_root: Path, out: Path, url: str, **options: Any) -> Path:
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert

    convert(ConvertConfig(camvid_root, out, format="tfrecord", splits=("val",), workers=1, quiet=True,
                          shard_size=ShardSize(samples=7), **options))
    _upload(out / "val", url)
    return out / "val"


@pytest.mark.parametrize("options", [{"size": (90, 120)}, {"image_codec": "png"},
                                     {"image_codec": "jpeg:90", "size": (90, 120)}],
                         ids=["raw-fixed", "png-variable", "jpeg-fixed"])
def test_a_tfrecord_split_read_by_ranges_equals_a_local_read(s3: str, camvid_root: Path, tmp_path: Path,
                                                              options: dict[str, Any]) -> None:
    url = f"s3://ranges/tfr-{len(options)}-{next(iter(options))}/val"
    local = _tfrecord_split(camvid_root, tmp_path / "out", url, **options)
    ref = shardkit.open(local)
    ds = _ranged(url, tmp_path / "cache")
    stats = ds.source.stats  # type: ignore[attr-defined]
    order = np.random.default_rng(3).permutation(len(ref)).tolist()
    if "size" in options:  # one size: batches, each shard's records in one plan
        for batch in np.array_split(np.array(order), 6):
            images, labels = ds.batch(batch)
            want_images, want_labels = ref.batch(batch)
            assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)
    else:  # CamVid's own sizes, PNG images: sample by sample
        for i in order:
            (image, label), (want_i, want_l) = ds[i], ref[i]
            assert np.array_equal(image, want_i) and np.array_equal(label, want_l)
    indexes = sum(s.files[1].bytes for s in ds.manifest.shards)
    assert stats.used == sum(s.files[0].bytes for s in ds.manifest.shards)  # every record once
    # the records, each shard's index, and gaps of at most 64 KiB between records of one batch fetched with them
    assert stats.used + indexes <= stats.fetched <= 1.2 * stats.used, (stats.fetched, stats.used)
    assert not list((tmp_path / "cache").glob("*/shard-*"))
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned worker gets: it opens its own objects
    assert np.array_equal(copy[order[0]][1], ref[order[0]][1])


def test_a_damaged_tfrecord_object_is_refused_by_its_record_crc(s3: str, camvid_root: Path, tmp_path: Path) -> None:
    url = "s3://ranges/tfr-damaged/val"
    local = _tfrecord_split(camvid_root, tmp_path / "out", url, size=(90, 120))
    m = json.loads((local / "manifest.json").read_text())
    name = m["shards"][0]["files"][0]["name"]
    data = bytearray((local / name).read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte inside a record, same size
    Remote(url).write_bytes(name, bytes(data))
    ds = _ranged(url, tmp_path / "cache")
    with pytest.raises(ShardFormatError, match="fails its CRC32C check") as err:
        ds.batch(np.arange(m["shards"][0]["num_samples"]))
    assert url in str(err.value) and "\n" not in str(err.value)


def test_ranges_are_refused_for_a_split_they_cannot_read(s3: str, camvid_root: Path, tmp_path: Path) -> None:
    _tfrecord_split(camvid_root, tmp_path / "out", "s3://ranges/tfr-gzip/val", size=(90, 120), compression="gzip")
    with pytest.raises(ConfigError, match="remote_reads='ranges': a gzip-compressed TFRecord shard has no"):
        shardkit.open("s3://ranges/tfr-gzip/val", cache_dir=tmp_path / "cache", remote_reads="ranges")
    ds = shardkit.open("s3://ranges/tfr-gzip/val", cache_dir=tmp_path / "cache", cache_limit=1000,
                       remote_reads="auto")
    assert isinstance(ds.source, CachedShards)  # auto falls back to whole shards


# ------------------------------------------------------------------ LMDB and HDF5: through their page and chunk tables
def _converted(camvid_root: Path, out: Path, url: str, fmt: str, **options: Any) -> Path:
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert

    convert(ConvertConfig(camvid_root, out, format=fmt, splits=("val",), workers=1, quiet=True,
                          shard_size=ShardSize(samples=7), **options))
    _upload(out / "val", url)
    return out / "val"


TABLED = {"lmdb-raw-fixed": ("lmdb", {"size": (360, 480)}),
          "lmdb-zstd-variable": ("lmdb", {"image_codec": "zstd", "label_codec": "zstd"}),
          "hdf5-raw-fixed": ("hdf5", {"size": (360, 480)}),
          "hdf5-raw-variable": ("hdf5", {}),
          "hdf5-gzip-fixed": ("hdf5", {"size": (360, 480), "compression": "gzip"}),
          "hdf5-lz4-variable": ("hdf5", {"image_codec": "lz4", "label_codec": "lz4"})}


@pytest.mark.parametrize("case", list(TABLED))
def test_an_lmdb_or_hdf5_split_read_by_ranges_equals_a_local_read(s3: str, camvid_root: Path, tmp_path: Path,
                                                                   case: str) -> None:
    """Every sample of a shuffled epoch equals a local read; no shard is downloaded; what is fetched beyond the
    samples' own bytes is the tables (LMDB B-tree pages, HDF5 metadata and chunk index) and gaps."""
    fmt, options = TABLED[case]
    url = f"s3://ranges/{case}/val"
    local = _converted(camvid_root, tmp_path / "out", url, fmt, **options)
    ref = shardkit.open(local)
    ds = _ranged(url, tmp_path / "cache")
    stats = ds.source.stats  # type: ignore[attr-defined]
    order = np.random.default_rng(6).permutation(len(ref)).tolist()
    if "size" in options:
        for batch in np.array_split(np.array(order), 5):
            images, labels = ds.batch(batch)
            want_images, want_labels = ref.batch(batch)
            assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)
    else:
        for i in order:
            (image, label), (want_i, want_l) = ds[i], ref[i]
            assert np.array_equal(image, want_i) and np.array_equal(label, want_l)
    assert not list((tmp_path / "cache").glob("*/shard-*"))
    split_bytes = sum(s.files[0].bytes for s in ds.manifest.shards)
    assert 0 < stats.used <= split_bytes
    # read amplification: beyond the samples' bytes, each shard's tables (LMDB: 2-3 pages; HDF5: its metadata,
    # in 4 KiB units) and gaps of at most 64 KiB coalesced into a batch's requests
    assert stats.amplification <= 1.2, (stats.fetched, stats.used)
    if "size" in options and "compression" not in options:  # raw samples: exactly their bytes are used
        sample = 360 * 480 * 3 + 360 * 480 + (16 if fmt == "lmdb" else 0)
        assert stats.used == len(ref) * sample
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned worker gets: it walks the tables again itself
    assert np.array_equal(copy[order[0]][1], ref[order[0]][1])


# ------------------------------------------------------------------ hostile servers, every format read by ranges
HOSTILE = {"npy": ("npy", {}), "lmdb": ("lmdb", {}), "hdf5": ("hdf5", {}), "tfrecord": ("tfrecord", {})}


@pytest.fixture(scope="module")
def hostile_splits(s3: str, camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """CamVid val at 180x240 in shards of 7 samples, one local split per format (each uploaded per test)."""
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert

    out = {}
    for fmt in HOSTILE:
        root = tmp_path_factory.mktemp(f"hostile-{fmt}")
        convert(ConvertConfig(camvid_root, root, format=fmt, size=(180, 240), splits=("val",), workers=1,
                              quiet=True, shard_size=ShardSize(samples=7)))
        out[fmt] = root / "val"
    return out


def _hostile_url(hostile_splits: dict[str, Path], fmt: str, name: str) -> str:
    url = f"s3://ranges/hostile-{name}-{fmt}/val"
    _upload(hostile_splits[fmt], url)
    return url


@pytest.mark.parametrize("fmt", list(HOSTILE))
@pytest.mark.parametrize("answer", ["truncated", "whole object (200)", "longer"])
@pytest.mark.parametrize("when", ["tables", "samples"])
def test_every_format_refuses_a_range_response_of_the_wrong_length_in_one_line(
        hostile_splits: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, answer: str,
        when: str) -> None:
    """A server (or proxy) that truncates a body, answers 200 with the whole object, or sends more than asked:
    while the shard's tables are read (npy header, TFRecord index, LMDB B-tree, HDF5 metadata) or its samples."""
    from s3fs.core import S3File

    url = _hostile_url(hostile_splits, fmt, f"{answer[:5]}-{when}")
    ref = shardkit.open(hostile_splits[fmt])
    ds = _ranged(url, tmp_path / "cache")
    if when == "samples":  # the shard's tables fetched intact first
        assert np.array_equal(ds.batch([0, 1])[1], ref.batch([0, 1])[1])
    real = S3File._fetch_range

    def hostile(self: Any, start: int, end: int) -> bytes:
        data = real(self, start, end)
        if fmt == "hdf5" and start == 0:  # the file's head, fetched before h5py opens it: the hostile answers
            return data  # come to h5py's own metadata reads (passed on through its file object)
        if answer == "truncated":
            return data[:-7]
        if answer == "longer":
            return data + b"\0"
        return real(self, 0, self.size)  # the server ignored the Range header

    monkeypatch.setattr(S3File, "_fetch_range", hostile)
    with pytest.raises(IntegrityError) as err:
        ds.batch([3, 5])
    text = str(err.value)
    assert "\n" not in text and "the server sent" in text and f"{url}/" in text, text


@pytest.mark.parametrize("fmt", list(HOSTILE))
def test_every_format_refuses_an_object_changed_mid_epoch_never_a_wrong_sample(
        hostile_splits: dict[str, Path], tmp_path: Path, fmt: str) -> None:
    """An object overwritten (same size) while a process reads it: the next range request fails on its ETag; a
    process that opens the changed object afresh refuses every sample the change touched (pixel hash, class
    bitmap, record CRC, record or chunk framing) and returns the others exactly."""
    url = _hostile_url(hostile_splits, fmt, "changed")
    local = hostile_splits[fmt]
    ref = shardkit.open(local)
    ds = _ranged(url, tmp_path / "cache")
    assert np.array_equal(ds.batch([0, 1])[0], ref.batch([0, 1])[0])
    name = ds.manifest.shards[0].files[0].name
    data = bytearray((local / name).read_bytes())
    for at in range(len(data) // 4, len(data), len(data) // 4):  # three stretches inside the shard's samples
        data[at : at + 3000] = bytes(b ^ 0x5A for b in data[at : at + 3000])
    Remote(url).write_bytes(name, bytes(data))
    with pytest.raises(IntegrityError, match="changed while it was being read") as err:
        ds.batch([2, 6])
    assert f"{url}/{name}" in str(err.value) and "\n" not in str(err.value)
    fresh = _ranged(url, tmp_path / "cache2")
    refused = 0
    for i in range(ds.manifest.shards[0].num_samples):
        try:
            image, label = fresh[i]
        except (IntegrityError, ShardFormatError) as exc:
            assert "\n" not in str(exc) and url in str(exc), exc
            refused += 1
            continue
        want_image, want_label = ref[i]
        assert np.array_equal(image, want_image) and np.array_equal(label, want_label), i
    assert refused >= 1


def test_a_label_holding_an_id_of_no_class_is_refused_even_when_its_classes_are_kept(
        s3: str, camvid_val_npy: Path, tmp_path: Path) -> None:
    """Ids past the class range (other than the ignore id) are not in the class bitmap: they are refused by name."""
    url = "s3://ranges/labels-foreign/val"
    _upload(camvid_val_npy, url)
    m = json.loads((camvid_val_npy / "manifest.json").read_text())
    name = m["shards"][0]["files"][1]["name"]
    arr = np.load(camvid_val_npy / name)
    arr[4, 0, :3] = 200  # three pixels of sample 4 set to an id no class has; its other classes all stay
    fake = tmp_path / "labels.npy"
    np.save(fake, arr)
    Remote(url).write_bytes(name, fake.read_bytes())
    ds = _ranged(url, tmp_path / "cache")
    assert np.array_equal(ds[3][1], shardkit.open(camvid_val_npy)[3][1])
    with pytest.raises(IntegrityError, match="sample 4's label holds id 200, which is not one of its 12 classes"):
        ds.batch([4])


# ------------------------------------------------------------------ the cache limit is a bound (must-have 3)
def _folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` now (files removed while it is walked are skipped)."""
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += (Path(dirpath) / name).stat().st_size
    return total


def _second_job(url: str, cache: str, limit: int, mode: str) -> None:
    """Another job on the same cache folder: its own process, a shuffled pass sample by sample."""
    ds = shardkit.open(url, cache_dir=cache, cache_limit=limit, remote_reads=mode)
    for i in np.random.default_rng(9).permutation(len(ds)).tolist():
        ds[i]
    ds.close()


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 4 workers on a 2-core machine
@pytest.mark.parametrize("mode", ["shards", "ranges", "auto"])
@pytest.mark.parametrize("workers", [2, 4])
def test_the_cache_folder_stays_within_the_limit_under_a_dataloader_and_a_second_job(
        s3: str, camvid_root: Path, tmp_path: Path, workers: int, mode: str) -> None:
    """A 2- or 4-worker DataLoader reads a shuffled epoch while a second job (another process) reads the same
    split through the same cache folder; the folder's peak, sampled every 2 ms, stays within ``cache_limit`` plus
    one shard per process (whole shards), or holds manifests and samples sidecars only (ranges). Under auto the
    loader reads an unshuffled epoch (whole shards) while the second job reads single samples (ranges)."""
    import multiprocessing

    pytest.importorskip("torch")
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert
    from shardkit.read.torch import make_loader

    local = tmp_path / "split"
    convert(ConvertConfig(camvid_root, local, format="npy", size=(180, 240), splits=("val",), workers=1,
                          quiet=True, shard_size=ShardSize(samples=2)))
    url = f"s3://ranges/bound-{mode}-{workers}/val"
    _upload(local / "val", url)
    m = json.loads((local / "val" / "manifest.json").read_text())
    shard_bytes = max(sum(f["bytes"] for f in [*s["files"], s["samples"]]) for s in m["shards"])
    small = 2 * (local / "val" / "manifest.json").stat().st_size + sum(s["samples"]["bytes"] for s in m["shards"])
    limit = 2 * shard_bytes + small + 4096  # two of the thirteen shards, the manifests and the sidecars
    cache = tmp_path / "cache"
    ref = shardkit.open(local / "val")
    plan = shardkit.EpochPlan(4, seed=2, shuffle=mode != "auto")
    loader = make_loader(url, plan, num_workers=workers, layout="NHWC", pin_memory=False,
                         multiprocessing_context="fork", persistent_workers=False,
                         options=shardkit.OpenOptions(cache_dir=cache, cache_limit=limit, remote_reads=mode))
    done, peak = threading.Event(), [0]

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _folder_bytes(cache))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    job = multiprocessing.get_context("fork").Process(target=_second_job, args=(url, str(cache), limit, mode))
    try:
        job.start()
        got = [(images.numpy(), labels.numpy()) for images, labels in loader]
        job.join(120)
    finally:
        done.set()
        watcher.join()
    assert job.exitcode == 0
    for (images, labels), batch in zip(got, ref.sampler(plan).batches(), strict=True):
        want_images, want_labels = ref.batch(batch)
        assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)
    if mode == "ranges":
        assert 0 < peak[0] <= small + 4096, (peak[0], small)
    else:  # the loader's parent, its workers and the second job: one read-through shard each at most
        assert mode == "shards" or peak[0] > small + 4096, (peak[0], small)  # auto: shards were read whole
        assert 0 < peak[0] <= limit + (workers + 2) * shard_bytes + 4096, (peak[0], limit, shard_bytes)


@pytest.mark.parametrize("edit", ["stated size past the file", "overflow page past the end"])
def test_a_damaged_lmdb_leaf_node_read_by_ranges_is_one_line_naming_the_sample(
        hostile_splits: dict[str, Path], tmp_path: Path, edit: str) -> None:
    """The B-tree walk by ranges is the local reader's checked walk: a leaf node whose value size or first overflow
    page lies past the object is refused by name (nothing sized or fetched from it); the other samples read."""
    import shutil
    import struct

    from shardkit.formats._lmdb_pages import _current_meta
    from shardkit.formats.lmdb import sample_key
    from tests.fuzz import refresh_manifest

    split = tmp_path / "val"
    shutil.copytree(hostile_splits["lmdb"], split)
    path = sorted(split.glob("shard-*.lmdb"))[0]
    data = bytearray(path.read_bytes())
    psize, root = _current_meta(data, len(data))  # seven samples and the metadata: the root is the one leaf page
    node = data.find(struct.pack("<H", 8) + sample_key(1), root * psize, (root + 1) * psize) - 6
    assert node > 0 and data[node + 4] & 1  # an F_BIGDATA node: the value is on overflow pages
    if edit == "stated size past the file":
        data[node : node + 4] = struct.pack("<HH", 0xFFFF, 0x00FF)  # the value's size: 16 MiB
    else:
        data[node + 16 : node + 24] = struct.pack("<Q", 10**6)  # first overflow page far past the end
    path.write_bytes(bytes(data))
    refresh_manifest(split)
    url = f"s3://ranges/lmdb-damaged-{edit.split()[0]}/val"
    _upload(split, url)
    ds = _ranged(url, tmp_path / "cache")
    with pytest.raises(ShardFormatError, match="sample 1 cannot be found in the LMDB B-tree") as err:
        ds.batch([0, 1])
    assert f"{url}/{path.name}" in str(err.value) and "\n" not in str(err.value)
    ref = shardkit.open(hostile_splits["lmdb"])
    assert np.array_equal(ds.batch([0, 2])[0], ref.batch([0, 2])[0])
    assert ds.source.stats.fetched < ds.manifest.shards[0].files[0].bytes  # type: ignore[attr-defined]


_HDF5_OPEN_FAILS = """
import sys
from pathlib import Path
import shardkit
from s3fs.core import S3File
from shardkit.errors import IntegrityError
from shardkit.files.storage import Remote
from shardkit.testing import local_s3, make_bucket

with local_s3():
    make_bucket("crash")
    remote = Remote("s3://crash/val")
    for p in sorted(Path(sys.argv[1]).iterdir()):
        remote.upload(p, p.name)
    ds = shardkit.open(remote.url, cache_dir=sys.argv[2], remote_reads="ranges")
    real = S3File._fetch_range
    S3File._fetch_range = lambda self, a, b: real(self, a, b)[: None if a == 0 else -7]  # truncated after the head
    try:
        ds.batch([3, 5])
    except IntegrityError as exc:
        kept = exc  # held to the end, as a test runner or a caller's log handler holds it
        print("refused:", exc)
"""


def test_an_hdf5_open_that_fails_by_ranges_does_not_crash_the_process_at_exit(
        hostile_splits: dict[str, Path], tmp_path: Path) -> None:
    """h5py's file object keeps the Python object it reads through: the failed open's exception chain held h5py's
    frames (its file access list) until the interpreter exited, and freeing them then killed the process
    (SIGSEGV, exit 139) after the error was reported."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _HDF5_OPEN_FAILS, str(hostile_splits["hdf5"]), str(tmp_path / "c")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert "refused:" in done.stdout and "the server sent" in done.stdout, done.stderr[-2000:]
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
