"""Nightly-pipeline guarantees: crash safety under SIGKILL, resume, incremental runs, one run at a time."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import OutputError
from shardkit.files.lock import LOCK_NAME, OutputLock
from shardkit.verify import published_digests, verify_split


def copy_split(src: Path, dst: Path, split: str = "val", n: int | None = None) -> list[str]:
    names = sorted(p.name for p in (src / split).iterdir())[:n]
    for sub in (split, f"{split}annot"):
        (dst / sub).mkdir(parents=True, exist_ok=True)
        for name in names:
            (dst / sub / name).write_bytes((src / sub / name).read_bytes())
    return names


def cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "shardkit", *map(str, args)]


@pytest.fixture(scope="module")
def reference(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    out = tmp_path_factory.mktemp("reference")
    subprocess.run(cli("convert", camvid_root, out, "--size", "352x480", "--shard-size", "12", "-q"), check=True)
    return {s: published_digests(out / s) for s in ("train", "val")}


def test_sigkill_at_random_moments_then_resume_equals_uninterrupted_run(
    camvid_root: Path, tmp_path: Path, reference: dict[str, dict[str, str]]
) -> None:
    rng = random.Random(20261122)
    out = tmp_path / "out"
    for trial in range(4):
        proc = subprocess.Popen(cli("convert", camvid_root, out, "--size", "352x480", "--shard-size", "12", "-q"))
        time.sleep(rng.uniform(0.3, 2.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for split in ("train", "val"):
            d = out / split
            assert not [p for p in d.glob("*") if ".tmp-" in p.name and not p.name.startswith(".")], trial
            if (d / "manifest.json").exists():  # whatever is published is complete and valid
                assert verify_split(d).ok, trial
    res = subprocess.run(cli("convert", camvid_root, out, "--size", "352x480", "--shard-size", "12"),
                         capture_output=True, text=True, check=True)
    assert "reused" in res.stderr
    for split in ("train", "val"):
        assert published_digests(out / split) == reference[split]
        assert verify_split(out / split).ok
        named = set(reference[split]) - {"manifest.json"}
        visible = {p.name for p in (out / split).iterdir() if not p.name.startswith(".")} - {"manifest.json"}
        assert visible == named | {"manifest-v1.json"}, "only the shards the manifest names are visible"
        # the killed runs committed nothing: the resumed run's publish is version 1, as an uninterrupted one's
        assert (out / split / "manifest-v1.json").read_bytes() == (out / split / "manifest.json").read_bytes()


def test_sigkill_never_damages_the_previous_good_output(camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    copy_split(camvid_root, raw, n=16)
    out = tmp_path / "out"
    subprocess.run(cli("convert", raw, out, "--size", "352x480", "--shard-size", "4", "-q"), check=True)
    before = published_digests(out / "val")
    rng = random.Random(7)
    for _ in range(3):  # a different conversion into the same folder, killed part-way
        proc = subprocess.Popen(cli("convert", raw, out, "--size", "320x480", "--shard-size", "4", "-q"))
        time.sleep(rng.uniform(0.2, 1.2))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if published_digests(out / "val") == before:
            assert verify_split(out / "val").ok
        else:  # the new run finished: then its output must be complete
            assert verify_split(out / "val").ok
            break


def test_unchanged_rerun_reuses_every_shard_without_rewriting(camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    copy_split(camvid_root, raw, n=20)
    cfg = ConvertConfig(raw, tmp_path / "out", size=(352, 480), shard_size=ShardSize(samples=8), quiet=True)
    first = convert(cfg)
    inodes = {p.name: p.stat().st_ino for p in (tmp_path / "out" / "val").iterdir() if not p.name.startswith(".")}
    again = convert(cfg)
    assert again.reused == again.shards == first.shards
    after = {p.name: p.stat().st_ino for p in (tmp_path / "out" / "val").iterdir() if not p.name.startswith(".")}
    shard_files = {k: v for k, v in inodes.items() if k != "manifest.json"}
    assert {k: after[k] for k in shard_files} == shard_files, "no shard file may be rewritten"
    forced = convert(cfg.replace(force=True))
    assert forced.reused == 0


def test_incremental_run_rewrites_only_changed_shards_and_equals_fresh(camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    names = copy_split(camvid_root, raw, split="train")  # 123 samples
    cfg = ConvertConfig(raw, tmp_path / "out", size=(352, 480), shard_size=ShardSize(samples=16), quiet=True,
                        workers=2)
    first = convert(cfg)
    # remove one sample, change one label, add one new sample (a renamed copy)
    for sub in ("train", "trainannot"):
        (raw / sub / names[10]).unlink()
        (raw / sub / ("zz_" + names[50])).write_bytes((raw / sub / names[50]).read_bytes())
    label = cv2.imread(str(raw / "trainannot" / names[80]), cv2.IMREAD_UNCHANGED)
    label[:10, :10] = 2
    cv2.imwrite(str(raw / "trainannot" / names[80]), label)
    second = convert(cfg)
    assert second.samples == 123 and first.shards >= 8
    rewritten = second.shards - second.reused
    assert 0 < rewritten <= 6, f"only the shards around the 3 changes may be rewritten, not {rewritten}"
    fresh = convert(cfg.replace(output=tmp_path / "fresh"))
    assert fresh.reused == 0
    assert published_digests(tmp_path / "out" / "train") == published_digests(tmp_path / "fresh" / "train")


def test_a_second_run_into_the_same_output_is_refused(camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    copy_split(camvid_root, raw, n=2)
    cfg = ConvertConfig(raw, tmp_path / "out", quiet=True)
    with OutputLock(tmp_path / "out"), pytest.raises(OutputError, match="another shardkit convert"):
        convert(cfg)
    assert convert(cfg).samples == 2  # released


def test_a_stale_lock_from_a_killed_run_does_not_block(camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    copy_split(camvid_root, raw, n=2)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / LOCK_NAME).write_text(json.dumps({"host": "elsewhere", "pid": 999999}))
    assert convert(ConvertConfig(raw, tmp_path / "out", quiet=True)).samples == 2


def test_lock_is_released_when_the_holder_is_killed(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (f"from shardkit.files.lock import OutputLock; import time, pathlib\nwith OutputLock({str(tmp_path)!r}):\n"
            f"    pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the child never took the lock"
        with pytest.raises(OutputError, match="another shardkit convert"), OutputLock(tmp_path):
            pass
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with OutputLock(tmp_path):
        pass


def test_manifest_and_shards_are_the_same_for_any_worker_count_after_resume(camvid_root: Path,
                                                                           tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    copy_split(camvid_root, raw, n=12)
    a = convert(ConvertConfig(raw, tmp_path / "a", shard_size=ShardSize(samples=3), workers=1, quiet=True))
    b = convert(ConvertConfig(raw, tmp_path / "b", shard_size=ShardSize(samples=3), workers=2, quiet=True))
    assert a.shards == b.shards
    assert published_digests(tmp_path / "a" / "val") == published_digests(tmp_path / "b" / "val")
    shapes = sorted((tmp_path / "a" / "val").glob("shapes-*.npy"))
    assert [np.load(p, allow_pickle=False).shape for p in shapes] == [(3, 2)] * 4


def test_incremental_run_sees_an_edit_that_kept_size_and_mtime(camvid_root: Path, tmp_path: Path) -> None:
    """Like ``touch -r``: the content changes, size and mtime are restored; ctime (and inode) still differ."""
    raw = tmp_path / "raw"
    names = copy_split(camvid_root, raw, n=4)
    cfg = ConvertConfig(raw, tmp_path / "out", shard_size=ShardSize(samples=2), quiet=True, workers=1)
    convert(cfg)
    target = raw / "valannot" / names[1]
    before = target.stat()
    label = cv2.imread(str(target), cv2.IMREAD_UNCHANGED)
    label[:4, :4] = (int(label[0, 0]) + 1) % 11
    data = cv2.imencode(".png", label, [cv2.IMWRITE_PNG_COMPRESSION, 9])[1].tobytes()
    assert len(data) <= before.st_size
    data = data[: before.st_size] + b"\0" * (before.st_size - len(data))  # same size (padding after IEND)
    time.sleep(0.01)
    target.write_bytes(data)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = target.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    second = convert(cfg)
    assert second.reused < second.shards, "the edited label must be re-read"
    convert(cfg.replace(output=tmp_path / "fresh"))
    assert published_digests(tmp_path / "out" / "val") == published_digests(tmp_path / "fresh" / "val")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_workers_die_with_a_sigkilled_parent(camvid_root: Path, tmp_path: Path) -> None:
    psutil = pytest.importorskip("psutil")
    proc = subprocess.Popen(cli("convert", camvid_root, tmp_path / "out", "--size", "352x480", "--shard-size", "4",
                                "--workers", "2", "-q"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60
    children: list = []
    # wait until both workers are converting (their shard temporaries appear)
    while time.monotonic() < deadline and proc.poll() is None:
        children = parent.children(recursive=True)
        if len(children) >= 2 and len(list((tmp_path / "out").glob("*/.*.tmp-*"))) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None and len(children) >= 2, "the workers never started"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    def alive(p) -> bool:  # type: ignore[no-untyped-def]
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(c) for c in children):
        time.sleep(0.1)
    left = [c for c in children if alive(c)]
    for c in left:
        c.kill()
    assert not left, f"processes outlived their SIGKILLed parent: {left}"


def test_going_back_to_a_kept_versions_content_reuses_its_files(camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    names = copy_split(camvid_root, raw, n=6)
    cfg = ConvertConfig(raw, tmp_path / "out", format="lmdb", shard_size=ShardSize(samples=2), quiet=True,
                        workers=1)
    convert(cfg)
    split = tmp_path / "out" / "val"
    v1 = json.loads((split / "manifest.json").read_text())
    original = (raw / "val" / names[2]).read_bytes()
    image = cv2.imread(str(raw / "val" / names[2]))
    image[:4, :4] = 0
    cv2.imwrite(str(raw / "val" / names[2]), image)
    assert convert(cfg).reused == 2
    (raw / "val" / names[2]).write_bytes(original)  # the edit is undone
    third = convert(cfg)
    assert third.reused == third.shards == 3, "version 1's shard is reused, not rewritten (LMDB bytes would differ)"
    v3 = json.loads((split / "manifest.json").read_text())
    assert v3["version"] == 3 and v3["shards"] == v1["shards"]
    assert verify_split(split).ok
