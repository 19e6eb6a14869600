"""Object storage end to end against a real S3 HTTP endpoint: moto's server on 127.0.0.1, started and stopped here.

Nothing else is contacted: ``shardkit.testing.local_s3`` sets dummy credentials, no config files, no
instance metadata, and ``AWS_ENDPOINT_URL`` to the local server (inherited by the subprocesses).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import InputNotFoundError, IntegrityError, OutputError, StorageError
from shardkit.files.lock import LOCK_NAME, RemoteLock
from shardkit.files.storage import Remote, parse_storage_options
from shardkit.testing import local_s3, make_bucket

ROOT = Path(__file__).resolve().parents[1]
RAW = "s3://raw/camvid"
OPTIONS = {"size": (360, 480), "splits": ("val",), "quiet": True, "shard_size": ShardSize(samples=13)}


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """A fresh local S3 endpoint for this module, always stopped (and the environment restored) after."""
    with local_s3() as endpoint:
        make_bucket("raw")
        make_bucket("out")
        yield endpoint


@pytest.fixture(scope="module")
def raw_camvid(s3: str, camvid_root: Path) -> str:
    """The real CamVid val split (26 pairs, its val.txt list file) uploaded to s3://raw/camvid."""
    remote = Remote(RAW)
    for sub in ("val", "valannot"):
        for p in sorted((camvid_root / sub).iterdir()):
            remote.upload(p, f"{sub}/{p.name}")
    remote.upload(camvid_root / "val.txt", "val.txt")
    return RAW


def upload_val(remote: Remote, camvid_root: Path, count: int) -> list[str]:
    """The first ``count`` CamVid val pairs uploaded under val/ and valannot/; returns their file names."""
    names = sorted(p.name for p in (camvid_root / "val").iterdir())[:count]
    for sub in ("val", "valannot"):
        for n in names:
            remote.upload(camvid_root / sub / n, f"{sub}/{n}")
    return names


def manifest_of(url: str) -> dict:
    return json.loads(Remote(url).read_bytes("manifest.json"))


def assert_same_samples(a: shardkit.Dataset, b: shardkit.Dataset) -> None:
    assert len(a) == len(b) and a.num_classes == b.num_classes
    for i in range(len(a)):
        (ia, la), (ib, lb) = a[i], b[i]
        assert ia.dtype == ib.dtype and la.dtype == lb.dtype
        assert np.array_equal(ia, ib) and np.array_equal(la, lb), f"sample {i} differs"


def test_convert_bucket_to_bucket_reads_back_bit_exactly(raw_camvid: str, camvid_val_npy: Path,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = "s3://out/exact"
    summary = convert(ConvertConfig(raw_camvid, out, workers=2, **OPTIONS))
    assert summary.samples == 26 and summary.reused == 0 and summary.manifests == [f"{out}/val/manifest.json"]
    remote, local = manifest_of(f"{out}/val"), json.loads((camvid_val_npy / "manifest.json").read_text())
    assert remote["source"]["root"] == raw_camvid
    # same plan, same bytes: every shard file has the sha256 of the local conversion's
    assert [[f["sha256"] for f in s["files"]] for s in remote["shards"]] == \
           [[f["sha256"] for f in s["files"]] for s in local["shards"]]
    assert remote["stats"] == local["stats"] and remote["classes"] == local["classes"]
    ds = shardkit.open(f"{out}/val", cache_dir=tmp_path / "cache")
    assert_same_samples(ds, shardkit.open(camvid_val_npy))
    assert ds.cache is not None and ds.cache.downloads == len(remote["shards"])
    # a second pass and a second Dataset on the same cache download nothing
    again = shardkit.open(f"{out}/val", cache_dir=tmp_path / "cache")
    assert_same_samples(again, ds)
    assert again.cache is not None and again.cache.downloads == 0
    # a first batch is hinted (read-ahead) through the cache's reader, like a local split's
    from shardkit.formats.npy import NpyReader

    hinted: list[tuple[int, bool]] = []
    monkeypatch.setattr(NpyReader, "prefetch", lambda self, idx, cold=True: hinted.append((len(idx), cold)))
    again.batch(np.arange(len(again)))
    assert sum(n for n, _ in hinted) == len(again) and all(cold for _, cold in hinted)
    # a re-run reuses every shard from the bucket, decoding nothing
    rerun = convert(ConvertConfig(raw_camvid, out, workers=1, **OPTIONS))
    assert rerun.reused == rerun.shards == len(remote["shards"])
    assert manifest_of(f"{out}/val")["shards"] == remote["shards"]


def test_local_input_to_bucket_and_bucket_to_local(raw_camvid: str, camvid_root: Path, camvid_val_npy: Path,
                                                   tmp_path: Path) -> None:
    convert(ConvertConfig(camvid_root, "s3://out/from-local", workers=1, **OPTIONS))
    up = shardkit.open("s3://out/from-local/val", cache_dir=tmp_path / "cache")
    assert_same_samples(up, shardkit.open(camvid_val_npy))
    convert(ConvertConfig(raw_camvid, tmp_path / "down", workers=1, **OPTIONS))
    assert_same_samples(shardkit.open(tmp_path / "down" / "val"), shardkit.open(camvid_val_npy))
    names = {p.name for p in (tmp_path / "down" / "val").iterdir()}
    assert "manifest.json" in names and not any(".tmp-" in n for n in names)


def _objects(url: str) -> dict[str, int]:
    return {k: int(v["size"]) for k, v in Remote(url).listing().items()}


def test_killed_convert_resumes_from_the_bucket(raw_camvid: str, camvid_val_npy: Path, tmp_path: Path) -> None:
    out = "s3://out/killed"
    cmd = [sys.executable, "-m", "shardkit", "convert", raw_camvid, out, "--size", "360x480", "--split", "val",
           "--shard-size", "2", "--workers", "1", "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if sum(n.startswith(".shard-") for n in _objects(f"{out}/val")) >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"convert ended before it could be killed: {proc.stderr.read()!r}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()  # type: ignore[union-attr]
    left = _objects(f"{out}/val")
    assert "manifest.json" not in left  # nothing committed
    assert LOCK_NAME in _objects(out)  # the killed run's lock object is still there
    done = sum(n.startswith(".shard-") for n in left)
    # the resumed run takes over the dead holder's lock and reuses every shard uploaded before the kill
    summary = convert(ConvertConfig(raw_camvid, out, workers=1, **{**OPTIONS, "shard_size": ShardSize(samples=2)}))
    assert summary.reused >= done >= 3 and summary.samples == 26
    assert LOCK_NAME not in _objects(out)
    ds = shardkit.open(f"{out}/val", cache_dir=tmp_path / "cache")
    assert_same_samples(ds, shardkit.open(camvid_val_npy))
    final = _objects(f"{out}/val")
    named = {f["name"] for s in manifest_of(f"{out}/val")["shards"] for f in [*s["files"], s["samples"]]}
    assert {n for n in final if not n.startswith((".", "manifest"))} == named  # no orphans
    assert {n for n in final if n.startswith("manifest")} == {"manifest.json", "manifest-v1.json"}


def test_changed_input_object_rewrites_only_its_shard(s3: str, camvid_root: Path, tmp_path: Path) -> None:
    src = Remote("s3://raw/changing")
    names = upload_val(src, camvid_root, 12)
    opts = {**OPTIONS, "shard_size": ShardSize(samples=3)}
    first = convert(ConvertConfig(src.url, "s3://out/changing", workers=1, **opts))
    src.upload(camvid_root / "valannot" / names[1], f"valannot/{names[0]}")  # label 0 replaced by label 1
    second = convert(ConvertConfig(src.url, "s3://out/changing", workers=1, **opts))
    assert second.shards == first.shards and second.reused == first.shards - 1
    # equal to a fresh local conversion of the changed data
    for sub in ("val", "valannot"):
        (tmp_path / "raw" / sub).mkdir(parents=True)
        for n in names:
            (tmp_path / "raw" / sub / n).write_bytes((camvid_root / sub / n).read_bytes())
    (tmp_path / "raw" / "valannot" / names[0]).write_bytes((camvid_root / "valannot" / names[1]).read_bytes())
    convert(ConvertConfig(tmp_path / "raw", tmp_path / "local", workers=1, **opts))
    ds = shardkit.open("s3://out/changing/val", cache_dir=tmp_path / "cache")
    assert_same_samples(ds, shardkit.open(tmp_path / "local" / "val"))


def test_removed_inputs_move_shards_by_server_side_copy(s3: str, camvid_root: Path, tmp_path: Path) -> None:
    src = Remote("s3://raw/shrinking")
    names = upload_val(src, camvid_root, 12)
    opts = {**OPTIONS, "shard_size": ShardSize(samples=3)}  # under 8: cuts at the limit only, 4 shards of 3
    convert(ConvertConfig(src.url, "s3://out/shrinking", workers=1, **opts))
    src.delete([f"{sub}/{n}" for sub in ("val", "valannot") for n in names[:3]])  # the whole first shard
    again = convert(ConvertConfig(src.url, "s3://out/shrinking", workers=1, keep_versions=1, **opts))
    assert again.shards == 3 and again.reused == 3  # every remaining shard reused under its new position
    m = manifest_of("s3://out/shrinking/val")
    assert [s["files"][0]["name"].split("-")[1] for s in m["shards"]] == ["00000", "00001", "00002"]
    objects = {n for n in _objects("s3://out/shrinking/val") if not n.startswith(".") and n != "manifest.json"}
    assert "manifest-v2.json" in objects and "manifest-v1.json" not in objects  # --keep-versions 1
    objects.discard("manifest-v2.json")
    assert objects == {f["name"] for s in m["shards"] for f in [*s["files"], s["samples"]]}  # old names collected
    for sub in ("val", "valannot"):
        (tmp_path / "raw" / sub).mkdir(parents=True)
        for n in names[3:]:
            (tmp_path / "raw" / sub / n).write_bytes((camvid_root / sub / n).read_bytes())
    convert(ConvertConfig(tmp_path / "raw", tmp_path / "local", workers=1, **opts))
    assert_same_samples(shardkit.open("s3://out/shrinking/val", cache_dir=tmp_path / "cache"),
                        shardkit.open(tmp_path / "local" / "val"))


def _read_all(url: str, cache_dir: str, barrier: object, queue: object) -> None:
    """In a fresh process: open the split on the shared cache, read every sample, report downloads + digest."""
    import hashlib

    ds = shardkit.open(url, cache_dir=cache_dir)
    barrier.wait()  # type: ignore[attr-defined]
    h = hashlib.sha256()
    for i in range(len(ds)):
        image, label = ds[i]
        h.update(image.tobytes())
        h.update(label.tobytes())
    assert ds.cache is not None
    queue.put((ds.cache.downloads, h.hexdigest()))  # type: ignore[attr-defined]


def test_two_reader_processes_share_one_cache_without_double_downloads(raw_camvid: str, camvid_val_npy: Path,
                                                                       tmp_path: Path) -> None:
    out = "s3://out/shared"
    convert(ConvertConfig(raw_camvid, out, workers=1, **{**OPTIONS, "shard_size": ShardSize(samples=4)}))
    shards = len(manifest_of(f"{out}/val")["shards"])
    mp = multiprocessing.get_context("spawn")
    barrier, queue = mp.Barrier(2), mp.Queue()
    procs = [mp.Process(target=_read_all, args=(f"{out}/val", str(tmp_path / "cache"), barrier, queue))
             for _ in range(2)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    import hashlib

    ref = shardkit.open(camvid_val_npy)
    h = hashlib.sha256()
    for i in range(len(ref)):
        image, label = ref[i]
        h.update(image.tobytes())
        h.update(label.tobytes())
    assert [d for _, d in results] == [h.hexdigest()] * 2
    assert sum(n for n, _ in results) == shards  # every shard downloaded once, by one of the two


def test_cache_smaller_than_the_split_serves_correct_data_and_keeps_a_stable_subset(
        raw_camvid: str, camvid_val_npy: Path, tmp_path: Path) -> None:
    out = "s3://out/limited"
    convert(ConvertConfig(raw_camvid, out, workers=1, **{**OPTIONS, "shard_size": ShardSize(samples=3)}))
    m = manifest_of(f"{out}/val")
    sizes = [sum(f["bytes"] for f in s["files"]) for s in m["shards"]]
    limit = sum(sizes[:3]) + len(json.dumps(m)) + 16384  # room for about three of the nine shards
    ds = shardkit.open(f"{out}/val", cache_dir=tmp_path / "cache", cache_limit=limit, remote_reads="shards")
    ref = shardkit.open(camvid_val_npy)
    assert ds.cache is not None
    cached_after: list[set[str]] = []
    downloads: list[int] = []
    for epoch in range(3):
        before = ds.cache.downloads
        for batch in ds.sampler(4, shuffle=True, seed=1, epoch=epoch, shuffle_mode="buffer",
                                    buffer_size=2).batches():
            images, labels = ds.batch(batch)
            want_i, want_l = ref.batch(batch)
            assert np.array_equal(images, want_i) and np.array_equal(labels, want_l)
        downloads.append(ds.cache.downloads - before)
        assert ds.cache.cached_bytes() <= limit  # admitted shards within the limit,
        assert ds.cache.usage() <= limit + max(sizes) + 65536  # and one read-through shard at most beyond it
        cached_after.append({p.name for p in ds.cache.directory.iterdir()
                             if p.name.endswith(".npy") and not p.name.startswith(".")})
    cached_shards = sum(name.startswith("images-") for name in cached_after[0])
    assert 1 <= cached_shards < len(sizes)
    assert cached_after[0] == cached_after[1] == cached_after[2]  # a stable subset, never evicted by itself
    # later epochs download the shards outside the cached subset, and at most one again (a sample that stays
    # long in the shuffle buffer can need a shard the process dropped to stay within the limit); an LRU would
    # re-download all nine
    assert all(d <= len(sizes) - cached_shards + 1 for d in downloads[1:]), (downloads, cached_shards)
    ds.cache.release_transient()
    assert not [p for p in ds.cache.directory.iterdir() if p.name.startswith(".transient-")]


def test_another_split_evicts_least_recently_used_files_of_other_splits(raw_camvid: str, tmp_path: Path) -> None:
    out = "s3://out/lru"
    convert(ConvertConfig(raw_camvid, out, workers=1, **OPTIONS))
    convert(ConvertConfig(raw_camvid, "s3://out/lru2", workers=1, **OPTIONS))
    m = manifest_of(f"{out}/val")
    total = sum(f["bytes"] for s in m["shards"] for f in [*s["files"], s["samples"]])
    limit = total + 65536  # one split fits, two do not
    a = shardkit.open(f"{out}/val", cache_dir=tmp_path / "c", cache_limit=limit, remote_reads="shards")
    for i in range(len(a)):
        a[i]
    assert a.cache is not None and a.cache.cached_bytes() == total
    b = shardkit.open("s3://out/lru2/val", cache_dir=tmp_path / "c", cache_limit=limit, remote_reads="shards")
    for i in range(len(b)):
        b[i]
    # a still reads its files (pinned): b may not evict them and reads its shards through instead
    assert b.cache is not None and b.cache.cached_bytes() == 0 and a.cache.cached_bytes() == total
    assert np.array_equal(a[0][0], b[0][0]) and np.array_equal(a[len(a) - 1][1], b[len(b) - 1][1])
    a.close()
    b.close()
    b = shardkit.open("s3://out/lru2/val", cache_dir=tmp_path / "c", cache_limit=limit, remote_reads="shards")
    for i in range(len(b)):
        b[i]
    assert b.cache is not None and b.cache.cached_bytes() == total  # b evicted a's files to fit
    assert a.cache.cached_bytes() <= limit - total and b.cache.usage() <= limit  # at most a small sidecar left


def test_verify_and_info_on_a_bucket(raw_camvid: str, tmp_path: Path) -> None:
    out = "s3://out/verified"
    convert(ConvertConfig(raw_camvid, out, workers=1, **OPTIONS))
    n = len(manifest_of(f"{out}/val")["shards"])
    res = CliRunner().invoke(main, ["verify", out])
    assert res.exit_code == 0 and f"{out}/val: 26 samples in {n} shards verified" in res.output, res.output
    res = CliRunner().invoke(main, ["info", out])
    assert res.exit_code == 0 and f"split val, format npy v1, 26 samples, {n} shards" in res.output
    # an object changed behind the manifest's back (same size): verify and the cache both refuse it
    shard = manifest_of(f"{out}/val")["shards"][1]
    name = shard["files"][1]["name"]
    remote = Remote(f"{out}/val")
    data = bytearray(remote.read_bytes(name))
    data[-1] ^= 0xFF
    remote.write_bytes(name, bytes(data))
    res = CliRunner().invoke(main, ["verify", f"{out}/val"])
    assert res.exit_code == 1 and "sha256" in res.output and name in res.output
    ds = shardkit.open(f"{out}/val", cache_dir=tmp_path / "cache")
    with pytest.raises(IntegrityError, match="sha256"):
        ds[shard["first_index"]]
    res = CliRunner().invoke(main, ["verify", "s3://out/no-such-thing"])
    assert res.exit_code == 1 and "nothing is stored under this prefix" in res.output, res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("command", ["info", "verify", "diff"])
def test_a_missing_bucket_or_an_empty_prefix_is_named_as_such(s3: str, command: str) -> None:
    """Not "no manifest.json here" (#27): the bucket (found missing by listing it, whatever its name), or a prefix
    with nothing under it; a prefix that holds objects but no manifest keeps that message."""
    for url, said, where in (("s3://nobucket/out", "the bucket does not exist", "s3://nobucket:"),
                             ("s3://absent/out/train", "the bucket does not exist", "s3://absent:"),
                             ("s3://out/never-written", "nothing is stored under this prefix",
                              "s3://out/never-written:")):
        res = CliRunner().invoke(main, [command, url])
        assert res.exit_code == 1 and said in res.output and where in res.output, res.output
        assert "no manifest.json" not in res.output and "Traceback" not in res.output
        assert len(res.output.strip().splitlines()) == 1, res.output
    Remote("s3://out/stray").write_bytes("notes.txt", b"not a split")
    res = CliRunner().invoke(main, [command, "s3://out/stray"])
    assert res.exit_code == 1 and "no manifest.json here" in res.output, res.output


def test_a_missing_bucket_is_told_by_its_error_code_not_by_a_word_in_the_message(s3: str, tmp_path: Path) -> None:
    """A missing object in a bucket whose name says "bucket" is no such object; a missing bucket is named as such
    for every transfer, from the server's NoSuchBucket code (whatever its message says)."""
    make_bucket("my-bucket")
    present = Remote("s3://my-bucket/x")
    for call in (lambda r: r.read_bytes("manifest.json"), lambda r: r.read_range("manifest.json", 0, 4),
                 lambda r: r.download("manifest.json", tmp_path / "m.json")):
        with pytest.raises(InputNotFoundError, match="no such object") as found:
            call(present)
        assert "bucket does not exist" not in str(found.value) and "s3://my-bucket/x/manifest.json" in str(found.value)
    (tmp_path / "notes.txt").write_bytes(b"x")
    missing = Remote("s3://no-such-bucket/x")
    for call in (lambda r: r.read_bytes("manifest.json"), lambda r: r.download("manifest.json", tmp_path / "m.json"),
                 lambda r: r.upload(tmp_path / "notes.txt", "notes.txt"), lambda r: r.write_bytes("a", b"x"),
                 lambda r: r.delete(["a"])):
        with pytest.raises(InputNotFoundError, match="the bucket does not exist") as found:
            call(missing)
        assert "create the bucket 'no-such-bucket'" in str(found.value)
    # the code decides, not the text: botocore's error, as s3fs raises it, with a message that never says "bucket"
    from botocore.exceptions import ClientError

    def raise_translated(code: str) -> None:
        raise FileNotFoundError("gone") from ClientError({"Error": {"Code": code, "Message": "gone"}}, "GetObject")

    with pytest.raises(InputNotFoundError, match="the bucket does not exist"):
        missing._call("read", "a", raise_translated, "NoSuchBucket")
    with pytest.raises(InputNotFoundError, match="read: no such object"):
        missing._call("read", "a", raise_translated, "NoSuchKey")


def test_cli_convert_with_storage_options_and_a_wrong_endpoint(raw_camvid: str, tmp_path: Path) -> None:
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    config = tmp_path / "convert.toml"
    config.write_text(f'[convert]\nsize = "360x480"\n[convert.storage_options]\nendpoint_url = "{endpoint}"\n'
                      f'config_kwargs = {{ retries = {{ max_attempts = 2 }} }}\n')
    res = CliRunner().invoke(main, ["convert", raw_camvid, "s3://out/cli", "--config", str(config), "--split", "val",
                                    "-q"])
    assert res.exit_code == 0, res.output
    assert manifest_of("s3://out/cli/val")["sample"]["image"]["shape"] == [360, 480, 3]
    res = CliRunner().invoke(main, ["convert", raw_camvid, "s3://out/cli2", "--split", "val", "-q",
                                    "--storage-option", "endpoint_url=http://127.0.0.1:9",  # nothing listens
                                    "--storage-option", "config_kwargs.retries.max_attempts=1"])
    assert res.exit_code == 1 and "Traceback" not in res.output and "endpoint" in res.output, res.output


def test_a_live_lock_refuses_a_second_run_and_a_silent_one_expires(s3: str) -> None:
    remote = Remote("s3://out/locked")
    with RemoteLock(remote, ttl=60), pytest.raises(OutputError, match="another shardkit convert"):
        RemoteLock(remote, ttl=60).__enter__()
    assert not remote.exists(LOCK_NAME)
    # a lock from another machine written just now is live, whatever our own ttl
    remote.write_bytes(LOCK_NAME, json.dumps({"host": "elsewhere", "pid": 1, "ttl": 30}).encode())
    with pytest.raises(OutputError, match="host elsewhere"):
        RemoteLock(remote, ttl=60).__enter__()
    # one whose heartbeat stopped longer ago than its ttl is taken over
    remote.write_bytes(LOCK_NAME, json.dumps({"host": "elsewhere", "pid": 1, "ttl": 0.5}).encode())
    time.sleep(1.5)
    with RemoteLock(remote, ttl=60) as lock:
        assert json.loads(remote.read_bytes(LOCK_NAME))["token"] == lock.token
    assert not remote.exists(LOCK_NAME)


def test_storage_options_parse_nested_typed_values() -> None:
    opts = parse_storage_options(["anon=true", "client_kwargs.region_name=eu-west-1", "max_concurrency=4",
                                  "endpoint_url=http://h:9000"])
    assert opts == {"anon": True, "client_kwargs": {"region_name": "eu-west-1"}, "max_concurrency": 4,
                    "endpoint_url": "http://h:9000"}
    from shardkit.errors import ConfigError

    with pytest.raises(ConfigError, match="key=value"):
        parse_storage_options(["no-equals-sign"])


def test_without_fsspec_a_url_is_a_one_line_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)  # import fsspec now raises ImportError
    with pytest.raises(StorageError, match=r'pip install "fsspec>=.*"s3fs>=.*\[s3\] extra'):
        Remote("s3://bucket/x").fs  # noqa: B018
    res = CliRunner().invoke(main, ["info", "s3://bucket/x"])
    assert res.exit_code == 1 and "[s3] extra" in res.output and "Traceback" not in res.output
    with pytest.raises(StorageError, match=r"\[s3\] extra"):
        shardkit.open("s3://bucket/x/val", cache_dir=tmp_path)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_loader_workers_read_a_bucket_through_one_cache(raw_camvid: str, camvid_val_npy: Path, tmp_path: Path,
                                                              context: str) -> None:
    import torch

    from shardkit.read.torch import make_loader

    out = "s3://out/torch"
    if not Remote(f"{out}/val").exists("manifest.json"):
        convert(ConvertConfig(raw_camvid, out, workers=1, **{**OPTIONS, "shard_size": ShardSize(samples=6)}))
    ds = shardkit.open(f"{out}/val", cache_dir=tmp_path / "cache")
    ds[0]  # the parent already holds a filesystem client and a cached shard when the workers start
    loader = make_loader(ds, shardkit.EpochPlan(4, shuffle=False), num_workers=2, multiprocessing_context=context)
    ref = shardkit.open(camvid_val_npy)
    seen = 0
    for images, labels in loader:
        want_i, want_l = ref.batch(list(range(seen, seen + len(images))))
        assert torch.equal(images.permute(0, 2, 3, 1).cpu(), torch.from_numpy(want_i))
        assert torch.equal(labels.cpu(), torch.from_numpy(want_l).to(labels.dtype))
        seen += len(images)
    assert seen == len(ref)
    named = {f["name"] for s in manifest_of(f"{out}/val")["shards"] for f in [*s["files"], s["samples"]]}
    cached = {p.name for p in (tmp_path / "cache").glob("*/*") if not p.name.startswith(".")}
    assert cached == named | {"manifest.json", "manifest-v1.json"}


def test_tf_dataset_reads_a_tfrecord_split_from_a_bucket(raw_camvid: str, camvid_val_npy: Path,
                                                         tmp_path: Path) -> None:
    out = "s3://out/tfrecord"
    convert(ConvertConfig(raw_camvid, out, workers=1, format="tfrecord", **OPTIONS))
    import shardkit.tf

    ds = shardkit.open(f"{out}/val", cache_dir=tmp_path / "cache")
    ref = shardkit.open(camvid_val_npy)
    seen = 0
    for images, labels in shardkit.tf.dataset(ds, shardkit.EpochPlan(8, shuffle=False)):
        want_i, want_l = ref.batch(list(range(seen, seen + len(images))))
        assert np.array_equal(images.numpy(), want_i) and np.array_equal(labels.numpy(), want_l)
        seen += len(images)
    assert seen == len(ref)


# ------------------------------------------------------------------ versions and a shared cache (issue 24)
def _tree_bytes(folder: Path) -> int:
    """Bytes of every file under ``folder``; files and folders deleted while they are counted count 0."""
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += (Path(dirpath) / name).stat().st_size
    return total


@contextlib.contextmanager
def _peak_bytes(folder: Path) -> Iterator[list[int]]:
    """The largest :func:`_tree_bytes` of ``folder`` seen while the block runs (sampled every millisecond or so)."""
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_bytes(folder))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield peak
    finally:
        done.set()
        watcher.join()
        peak[0] = max(peak[0], _tree_bytes(folder))


def test_the_cache_limit_bounds_the_folder_while_processes_read_through(raw_camvid: str, camvid_val_npy: Path,
                                                                          tmp_path: Path) -> None:
    """The cache folder's peak, sampled while one process reads every sample in a shuffled order and then a
    2-worker DataLoader reads a shuffled epoch, stays within the limit plus one shard per process (the
    read-through slots used to sit on top of the limit: up to 4 shards per process)."""
    pytest.importorskip("torch")
    from shardkit.read.torch import make_loader

    out = "s3://out/bound"
    convert(ConvertConfig(raw_camvid, out, workers=1, **{**OPTIONS, "shard_size": ShardSize(samples=3)}))
    m = manifest_of(f"{out}/val")
    shard_bytes = max(sum(f["bytes"] for f in [*s["files"], s["samples"]]) for s in m["shards"])
    limit = 2 * shard_bytes + 2 * len(json.dumps(m)) + 4096  # two of the nine shards and the manifests
    cache = tmp_path / "cache"
    ref = shardkit.open(camvid_val_npy)
    ds = shardkit.open(f"{out}/val", cache_dir=cache, cache_limit=limit, remote_reads="shards")
    order = np.random.default_rng(0).permutation(len(ds))
    with _peak_bytes(cache) as one:
        for i in order.tolist():
            (image, label), (want_i, want_l) = ds[i], ref[i]
            assert np.array_equal(image, want_i) and np.array_equal(label, want_l)
    assert one[0] <= limit + shard_bytes + 1024, (one[0], limit, shard_bytes)
    ds.close()
    loader = make_loader(f"{out}/val", shardkit.EpochPlan(4, seed=3), num_workers=2, layout="NHWC",
                         pin_memory=False, multiprocessing_context="fork", persistent_workers=False,
                         options=shardkit.OpenOptions(cache_dir=cache, cache_limit=limit, remote_reads="shards"))
    with _peak_bytes(cache) as two:
        for images, labels in loader:
            assert images.shape[0] == labels.shape[0] > 0
    assert two[0] <= limit + 3 * shard_bytes + 1024, (two[0], limit, shard_bytes)  # the parent and two workers


def test_a_reader_keeps_its_version_while_a_changed_input_is_published(s3: str, camvid_root: Path,
                                                                        tmp_path: Path) -> None:
    src = Remote("s3://raw/versioned")
    names = upload_val(src, camvid_root, 6)
    out = "s3://out/versioned"
    opts = {**OPTIONS, "shard_size": ShardSize(samples=2)}
    convert(ConvertConfig(src.url, out, workers=1, **opts))
    old = shardkit.open(f"{out}/val", cache_dir=tmp_path / "c")
    assert old.version == 1  # nothing read yet: its shards are fetched only after the next publish
    image = cv2.imread(str(camvid_root / "val" / names[0]))
    image[:, :] = 7
    src.write_bytes(f"val/{names[0]}", cv2.imencode(".png", image)[1].tobytes())
    convert(ConvertConfig(src.url, out, workers=1, **opts))  # version 2 (default --keep-versions 3)
    first_old, _ = old[0]
    assert not (first_old == 7).all()  # the version it opened, fetched after the publish
    new = shardkit.open(f"{out}/val", cache_dir=tmp_path / "c")
    assert new.version == 2 and (new[0][0] == 7).all()
    again = shardkit.open(f"{out}/val", cache_dir=tmp_path / "c2", version=1)
    assert np.array_equal(again[0][0], first_old)
    assert all(np.array_equal(again[i][1], old[i][1]) for i in range(len(old)))
    convert(ConvertConfig(src.url, out, workers=1, keep_versions=1, **{**opts, "force": True}))
    objects = _objects(f"{out}/val")
    assert [n for n in objects if n.startswith("manifest-v")] == ["manifest-v2.json"]
    with pytest.raises(shardkit.errors.InputNotFoundError):
        shardkit.open(f"{out}/val", cache_dir=tmp_path / "c3", version=1)


def test_key_over_a_split_larger_than_the_cache_leaves_nothing_behind(raw_camvid: str, camvid_val_npy: Path,
                                                                      tmp_path: Path) -> None:
    out = "s3://out/keys"
    convert(ConvertConfig(raw_camvid, out, workers=1, **{**OPTIONS, "shard_size": ShardSize(samples=3)}))
    m = manifest_of(f"{out}/val")
    shard_bytes = max(sum(f["bytes"] for f in [*s["files"], s["samples"]]) for s in m["shards"])
    limit = 4096  # not even one sidecar fits: everything is read through
    ds = shardkit.open(f"{out}/val", cache_dir=tmp_path / "cache", cache_limit=limit, remote_reads="shards")
    ref = shardkit.open(camvid_val_npy)
    peak = 0
    for i in range(len(ds)):
        assert ds.key(i) == ref.key(i)
        peak = max(peak, _tree_bytes(tmp_path / "cache"))
    assert ds.cache is not None and ds.cache.downloads == 0  # keys need sidecars only, never whole shards
    assert peak < shard_bytes  # (each read-through used to download the whole shard and keep it)
    for i in range(len(ds)):
        ds[i]
    assert _tree_bytes(tmp_path / "cache") <= limit + shard_bytes + 65536  # one read-through shard over the limit
    ds.cache.release_transient()
    assert _tree_bytes(tmp_path / "cache") <= limit + 65536  # manifests and lock files only
    assert not [p for p in ds.cache.directory.iterdir() if p.name.startswith(".transient-")]


def _loader_epoch(url: str, cache_dir: str) -> None:
    from shardkit.read.torch import make_loader

    ds = shardkit.open(url, cache_dir=cache_dir, cache_limit=1, remote_reads="shards")
    for _ in make_loader(ds, shardkit.EpochPlan(4, shuffle=False), num_workers=2, multiprocessing_context="fork"):
        pass
    os._exit(0)  # like a job killed after its epoch: no atexit in this process either


def test_read_through_folders_of_exited_workers_are_reclaimed(raw_camvid: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = "s3://out/transient"
    convert(ConvertConfig(raw_camvid, out, workers=1, **{**OPTIONS, "shard_size": ShardSize(samples=6)}))
    cache = tmp_path / "cache"
    proc = multiprocessing.get_context("fork").Process(target=_loader_epoch, args=(f"{out}/val", str(cache)))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 0
    left = [p for p in cache.glob("*/.transient-*")]
    # the DataLoader workers removed their own folders on exit; the parent's (which never ran atexit) are
    # removed by the next process that opens the split
    assert all(p.name.startswith(f".transient-{proc.pid}-") for p in left), left
    shardkit.open(f"{out}/val", cache_dir=cache, cache_limit=1, remote_reads="shards")
    assert not list(cache.glob("*/.transient-*"))


def _hold_split(url: str, cache_dir: str, limit: int, ready: object, go: object, queue: object) -> None:
    """Open a split, read it all (its shards cached and pinned), wait, then read it all again."""
    import hashlib

    try:
        ds = shardkit.open(url, cache_dir=cache_dir, cache_limit=limit, remote_reads="shards")
        for i in range(len(ds)):
            ds[i]
        ready.set()  # type: ignore[attr-defined]
        go.wait(120)  # type: ignore[attr-defined]
        h = hashlib.sha256()
        for i in range(len(ds)):
            image, label = ds[i]
            h.update(image.tobytes() + label.tobytes())
        queue.put(h.hexdigest())  # type: ignore[attr-defined]
    except Exception as exc:  # reported to the test
        queue.put(f"error: {exc}")  # type: ignore[attr-defined]


def test_another_job_on_the_same_cache_never_evicts_files_a_reader_has_open(raw_camvid: str, tmp_path: Path) -> None:
    a_url, b_url = "s3://out/job-a", "s3://out/job-b"
    convert(ConvertConfig(raw_camvid, a_url, workers=1, **OPTIONS))
    convert(ConvertConfig(raw_camvid, b_url, workers=1, **OPTIONS))
    m = manifest_of(f"{a_url}/val")
    total = sum(f["bytes"] for s in m["shards"] for f in [*s["files"], s["samples"]])
    limit = total + 65536  # one split fits, two do not: b would evict a's files
    mp = multiprocessing.get_context("fork")
    ready, go, queue = mp.Event(), mp.Event(), mp.Queue()
    job_a = mp.Process(target=_hold_split, args=(f"{a_url}/val", str(tmp_path / "c"), limit, ready, go, queue))
    job_a.start()
    try:
        assert ready.wait(120)
        b = shardkit.open(f"{b_url}/val", cache_dir=tmp_path / "c", cache_limit=limit, remote_reads="shards")
        for i in range(len(b)):
            b[i]
        shard = max(sum(f["bytes"] for f in [*s["files"], s["samples"]]) for s in m["shards"])
        assert b.cache is not None and b.cache.usage() <= limit + shard  # within the limit ± one shard
        held = tmp_path / "c" / Remote(f"{a_url}/val").token()
        assert {p.name for p in held.iterdir() if p.suffix == ".npy" and not p.name.startswith(".")} == {
            f["name"] for s in m["shards"] for f in [*s["files"], s["samples"]]}  # a's open files all stayed
        go.set()
        result = queue.get(timeout=120)
    finally:
        job_a.join(timeout=60)
        if job_a.is_alive():
            job_a.kill()
    import hashlib

    h = hashlib.sha256()
    for i in range(len(b)):
        image, label = b[i]
        h.update(image.tobytes() + label.tobytes())
    assert result == h.hexdigest()  # a read every sample again, from files b could not evict
    b.close()


def test_an_object_larger_than_the_manifest_says_is_not_downloaded(raw_camvid: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = "s3://out/oversized"
    convert(ConvertConfig(raw_camvid, out, workers=1, **OPTIONS))
    name = manifest_of(f"{out}/val")["shards"][0]["files"][0]["name"]
    Remote(f"{out}/val").write_bytes(name, b"\0" * (32 << 20))  # replaced by 32 MB
    fetched: list[str] = []
    real = Remote.download

    def spy(self: Remote, rel: str, local: Path, **kwargs: object) -> None:
        fetched.append(rel)
        real(self, rel, local, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Remote, "download", spy)
    ds = shardkit.open(f"{out}/val", cache_dir=tmp_path / "c")
    with pytest.raises(IntegrityError, match=r"33554432 bytes, the manifest says .*not downloaded"):
        ds[0]
    assert name not in fetched and _tree_bytes(tmp_path / "c") < (1 << 20)


def test_going_back_to_a_kept_versions_content_reuses_its_objects(s3: str, camvid_root: Path,
                                                                  tmp_path: Path) -> None:
    """A local input (fingerprints hash content; a bucket input's hash its ETag and LastModified, which a
    re-upload changes) converted into a bucket: the kept version's shard records stay with its objects."""
    raw = tmp_path / "raw"
    names = sorted(p.name for p in (camvid_root / "val").iterdir())[:4]
    for sub in ("val", "valannot"):
        (raw / sub).mkdir(parents=True)
        for n in names:
            (raw / sub / n).write_bytes((camvid_root / sub / n).read_bytes())
    out = "s3://out/revert"
    cfg = ConvertConfig(raw, out, workers=1, **{**OPTIONS, "format": "lmdb", "shard_size": ShardSize(samples=2)})
    convert(cfg)
    v1 = manifest_of(f"{out}/val")
    original = (raw / "val" / names[0]).read_bytes()
    image = cv2.imread(str(raw / "val" / names[0]))
    image[:4, :4] = 0
    cv2.imwrite(str(raw / "val" / names[0]), image)
    assert convert(cfg).reused == 1
    (raw / "val" / names[0]).write_bytes(original)  # the edit is undone
    third = convert(cfg)
    assert third.reused == third.shards == 2  # version 1's objects reused (an LMDB rewrite would change bytes)
    v3 = manifest_of(f"{out}/val")
    assert v3["version"] == 3 and v3["shards"] == v1["shards"]


# ------------------------------------------------------------------ one reading contract (issue 25)
@pytest.fixture(scope="module")
def limited_split(raw_camvid: str) -> tuple[str, int]:
    """CamVid val on the bucket in nine shards, and a cache limit that holds about three of them."""
    out = "s3://out/adapters"
    convert(ConvertConfig(raw_camvid, out, workers=1, **{**OPTIONS, "shard_size": ShardSize(samples=3)}))
    m = manifest_of(f"{out}/val")
    sizes = [sum(f["bytes"] for f in [*s["files"], s["samples"]]) for s in m["shards"]]
    return f"{out}/val", sum(sizes[:3]) + len(json.dumps(m)) + 16384


def _check_cache(ds: shardkit.Dataset, cache_dir: Path, limit: int, endpoint: str) -> None:
    """The options reached this adapter's Dataset: its cache is in ``cache_dir`` under ``limit``, its storage
    options are the ones given, and the shards it read were downloaded there."""
    assert ds.cache is not None and ds.cache.root == cache_dir and ds.cache.limit == limit
    assert ds.cache.remote.options["endpoint_url"] == endpoint
    assert ds.cache.cached_bytes() <= limit
    assert any(p.name.startswith("images-") for p in cache_dir.glob("*/*")), "nothing was cached where it was asked"


def test_every_adapter_reads_a_bucket_under_a_cache_limit_with_its_options(limited_split: tuple[str, int],
                                                                           camvid_val_npy: Path,
                                                                           tmp_path: Path) -> None:
    import torch

    import shardkit.tf
    from shardkit.read.keras import ShardkitPyDataset
    from shardkit.read.torch import CudaPrefetcher, ShardkitTorchDataset, make_loader

    url, limit = limited_split
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    ref = shardkit.open(camvid_val_npy)
    want_images, want_labels = ref.batch(np.arange(len(ref)))
    plan = shardkit.EpochPlan(4, shuffle=False)

    def options(name: str) -> shardkit.OpenOptions:
        return shardkit.OpenOptions(cache_dir=tmp_path / name, cache_limit=limit, remote_reads="shards",
                                    storage_options={"endpoint_url": endpoint})

    def same(images: np.ndarray, labels: np.ndarray) -> bool:
        return np.array_equal(images, want_images) and np.array_equal(labels, want_labels.astype(labels.dtype))

    # make_loader, with a worker process (the options travel to it), and CudaPrefetcher over it
    loader = make_loader(url, plan, 1, options=options("loader"), layout="NHWC", pin_memory=False,
                         multiprocessing_context="fork", persistent_workers=False)
    batches = [(x.numpy(), y.numpy()) for x, y in CudaPrefetcher(loader, "cpu", normalize=False)]
    assert same(np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches]))
    _check_cache(loader.dataset.dataset, tmp_path / "loader", limit, endpoint)
    # ShardkitTorchDataset (map-style, a whole batch per index list)
    tds = ShardkitTorchDataset(url, options=options("torch"), layout="NHWC")
    images, labels = tds[list(range(len(tds)))]
    assert isinstance(images, torch.Tensor) and same(images.numpy(), labels.numpy())
    _check_cache(tds.dataset, tmp_path / "torch", limit, endpoint)
    # shardkit.tf.dataset
    parts = list(shardkit.tf.dataset(url, plan, options=options("tf")))
    assert same(np.concatenate([x.numpy() for x, _ in parts]), np.concatenate([y.numpy() for _, y in parts]))
    # Keras
    seq = ShardkitPyDataset(url, plan, options=options("keras"), normalize=False)
    parts = [seq[i] for i in range(len(seq))]
    assert same(np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]))
    _check_cache(seq.dataset, tmp_path / "keras", limit, endpoint)
    for name in ("loader", "torch", "tf", "keras"):  # the limit held: a subset cached there, the rest read through
        cached = [p for p in (tmp_path / name).glob("*/*") if p.is_file() and not p.name.startswith(".")]
        assert 0 < sum(p.name.startswith("images-") for p in cached) < 9, name  # of nine shards
        assert sum(p.stat().st_size for p in cached) <= limit, name
    # storage_options reach every adapter: a wrong endpoint fails each one, with the library's one-line error
    bad = shardkit.OpenOptions(cache_dir=tmp_path / "bad", storage_options={
        "endpoint_url": "http://127.0.0.1:9", "config_kwargs": {"retries": {"max_attempts": 1}}})
    for open_with in (lambda: make_loader(url, plan, options=bad), lambda: ShardkitTorchDataset(url, options=bad),
                      lambda: shardkit.tf.dataset(url, plan, options=bad),
                      lambda: ShardkitPyDataset(url, plan, options=bad)):
        with pytest.raises(StorageError, match="endpoint"):
            open_with()


def test_a_bucket_split_gets_the_local_fast_paths(limited_split: tuple[str, int], camvid_val_npy: Path,
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote npy split is served by the format's own reader on the cached copy, so batches are gathered from
    its memory-mapped arrays like a local split's (the reader subclass it replaced turned that path off)."""
    from shardkit.formats.npy import NpyReader

    url, _ = limited_split
    ds = shardkit.open(url, cache_dir=tmp_path / "cache")
    ref = shardkit.open(camvid_val_npy)
    reader = ds.source.reader(1)
    assert type(reader) is NpyReader and reader.fixed_arrays() is not None

    def slow_path(*args: object) -> None:
        raise AssertionError("read_batch_into: the npy fast path was not taken")

    monkeypatch.setattr(NpyReader, "read_batch_into", slow_path)
    idx = np.array([25, 0, 4, 5, 6, 7, 13, 12, 3])
    images, labels = ds.batch(idx)
    want_images, want_labels = ref.batch(idx)
    assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)


def test_class_statistics_of_a_bucket_fetch_sidecars_through_the_shard_cache(raw_camvid: str, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Class weights and repeat factors of a remote split read their sidecars through the cache (its lock,
    admission under the limit, verified download), never through a second store that skips them."""
    import shardkit.store.source

    out = "s3://out/sidecar-cache"
    convert(ConvertConfig(raw_camvid, out, workers=1, **{**OPTIONS, "shard_size": ShardSize(samples=5)}))
    ref = shardkit.open(f"{out}/val", cache_dir=tmp_path / "ref")
    want = ref.class_weights()

    def second_downloader(*args: object, **kwargs: object) -> None:
        raise AssertionError("a sidecar was downloaded outside the shard cache")

    monkeypatch.setattr(shardkit.store.source.TempFiles, "hold", second_downloader)
    ds = shardkit.open(f"{out}/val", cache_dir=tmp_path / "cache")
    assert ds.cache is not None
    assert np.array_equal(ds.class_weights(), want)
    sidecars = {s.samples.name for s in ds.manifest.shards if s.samples is not None}
    assert sidecars and sidecars <= {p.name for p in ds.cache.directory.iterdir()}  # admitted into the cache
    assert len(ds.repeat_factors()) == len(ds)


def test_a_sidecar_stays_pinned_while_it_is_read_while_another_job_evicts(raw_camvid: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote sidecar is held (pinned) from its fetch until its rows are read: another job on the same cache_dir
    that evicts everything it may, at that very moment, cannot delete it; once read, the pin is gone."""
    import shardkit.files.samples
    from shardkit.read.cache import _remove_unpinned

    out = "s3://out/pinned-sidecars"
    convert(ConvertConfig(raw_camvid, out, workers=1, **{**OPTIONS, "shard_size": ShardSize(samples=9)}))
    ref = [shard["samples"]["name"] for shard in manifest_of(f"{out}/val")["shards"]]
    want = shardkit.open(f"{out}/val", cache_dir=tmp_path / "ref").manifest.samples.keys(0)
    ds = shardkit.open(f"{out}/val", cache_dir=tmp_path / "c", remote_reads="shards")
    read_sidecar = shardkit.files.samples.read_sidecar
    seen: list[tuple[str, bool]] = []

    def evicting_read(directory: Path, shard: object, *args: object) -> object:
        name = shard.samples.name  # type: ignore[attr-defined]
        evicted = _remove_unpinned(directory / name)  # what another job's eviction does to each file it may take
        seen.append((name, not evicted and (directory / name).is_file()))
        return read_sidecar(directory, shard, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(shardkit.files.samples, "read_sidecar", evicting_read)
    keys = [ds.key(i) for i in range(len(ds))]
    assert keys[:len(want)] == want and len(set(keys)) == len(ds) == 26
    assert seen == [(name, True) for name in ref]  # each sidecar was still there when read
    for name in ref:  # and nothing stays pinned after its rows were read: eviction may now take it
        assert _remove_unpinned(ds.cache.directory / name)  # type: ignore[union-attr]


def test_opening_a_bucket_split_parses_its_manifest_once(raw_camvid: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """One parse per open (under the manifest's parse bounds), whether the cache is fresh or already holds it."""
    import shardkit.store.manifest

    out = "s3://out/parsed-once"
    convert(ConvertConfig(raw_camvid, out, workers=1, **OPTIONS))
    parse = shardkit.store.manifest.parse_manifest_bytes
    calls: list[str] = []

    def counted(raw: bytes, path: object) -> object:
        calls.append(str(path))
        return parse(raw, path)  # type: ignore[arg-type]

    monkeypatch.setattr(shardkit.store.manifest, "parse_manifest_bytes", counted)
    for _ in range(2):  # a fresh cache, then one that holds the manifest already
        calls.clear()
        ds = shardkit.open(f"{out}/val", cache_dir=tmp_path / "c")
        assert len(calls) == 1, calls
        assert ds.version == 1 and len(ds) == 26
        ds.close()


def test_verify_diff_info_and_readers_of_a_bucket_go_through_one_byte_source(
        s3: str, camvid_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify, diff, info and a reader each open a remote split through one ByteSource per version read, and every
    file they fetch comes through its one download-then-verify, each once."""
    import shardkit.read.cache
    import shardkit.store.source as source

    assert shardkit.read.cache.download_verified is source.download_verified  # the cache's downloader is the one
    src = Remote("s3://raw/one-source")
    upload_val(src, camvid_root, 3)
    out = "s3://out/one-source"
    opts = {**OPTIONS, "shard_size": ShardSize(samples=2)}
    convert(ConvertConfig(src.url, out, workers=1, **opts))
    upload_val(src, camvid_root, 4)
    convert(ConvertConfig(src.url, out, workers=1, **opts))  # version 2: one sample more
    m = manifest_of(f"{out}/val")
    every = [f["name"] for s in m["shards"] for f in [*s["files"], s["samples"]]]
    sidecars = [s["samples"]["name"] for s in m["shards"]]
    opened: list[int | None] = []
    fetched: list[str] = []
    init, download = source.RemoteBytes.__init__, source.download_verified

    def counted_init(self: source.RemoteBytes, files: source.FileStore, version: int | None = None) -> None:
        opened.append(version)
        init(self, files, version)

    def counted_download(remote: Remote, f: object, directory: Path) -> Path:
        fetched.append(f.name)  # type: ignore[attr-defined]
        return download(remote, f, directory)  # type: ignore[arg-type]

    monkeypatch.setattr(source.RemoteBytes, "__init__", counted_init)
    monkeypatch.setattr(source, "download_verified", counted_download)
    monkeypatch.setattr(shardkit.read.cache, "download_verified", counted_download)

    def run(*args: str) -> str:
        opened.clear()
        fetched.clear()
        res = CliRunner().invoke(main, list(args))
        assert res.exit_code == 0, res.output
        return res.output

    run("verify", f"{out}/val")
    assert opened == [None] and sorted(fetched) == sorted(every)  # every file once, each shard checked
    assert "1 added, 0 removed" in run("diff", f"{out}/val")
    old = json.loads(Remote(f"{out}/val").read_bytes("manifest-v1.json"))
    assert opened == [None, 1, 2] and sorted(fetched) == sorted(
        sidecars + [s["samples"]["name"] for s in old["shards"]])  # each version's sidecars alone, never shard data
    run("info", f"{out}/val", "--class-weights", "median_frequency")
    assert opened == [None] and sorted(fetched) == sorted(sidecars)
    opened.clear()
    fetched.clear()
    ds = shardkit.open(f"{out}/val", cache_dir=tmp_path / "c")
    ds.class_weights()
    assert opened == [None] and sorted(fetched) == sorted(sidecars)  # through the reader's cache, the same way


def test_threads_opening_shards_never_lose_a_read_through_copy_to_each_other(limited_split: tuple[str, int],
                                                                             camvid_val_npy: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread fetching a shard into this process's read-through slot opens its files before another thread's
    fetch may drop that slot (tf.data's parallel map and Keras threads read shards at once): thread A pauses
    between its fetch and its open while thread B fetches another shard; B waits, A's read is exact."""
    import threading

    from shardkit.read.cache import ShardCache

    url, _ = limited_split
    ds = shardkit.open(url, options=shardkit.OpenOptions(
        cache_dir=tmp_path / "cache", cache_limit=1, remote_reads="shards",
        storage_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}))
    ref = shardkit.open(camvid_val_npy)
    a_fetched, b_done = threading.Event(), threading.Event()
    real = ShardCache.hold
    paused: list[int] = []

    def hold(self: ShardCache, shard: Any, *args: Any, **kwargs: Any) -> Any:
        held = real(self, shard, *args, **kwargs)
        if threading.current_thread().name == "A" and not paused:
            paused.append(1)
            a_fetched.set()
            b_done.wait(2.0)  # B finishes first unless it must wait for A's open
        return held

    monkeypatch.setattr(ShardCache, "hold", hold)
    got: dict[str, Any] = {}

    def read(name: str, index: int) -> None:
        try:
            got[name] = ds.batch(np.array([index]))
        except Exception as exc:  # reported below, with its message
            got[name] = exc

    a = threading.Thread(target=read, args=("A", 4), name="A")
    a.start()
    assert a_fetched.wait(30)
    b = threading.Thread(target=lambda: (read("B", 20), b_done.set()), name="B")
    b.start()
    a.join(60)
    b.join(60)
    for name, index in (("A", 4), ("B", 20)):
        assert not isinstance(got[name], Exception), f"{name}: {got[name]}"
        want = ref.batch(np.array([index]))
        assert got[name][0].tobytes() == want[0].tobytes() and got[name][1].tobytes() == want[1].tobytes()
