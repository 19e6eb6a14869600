"""Source fingerprints: content and options decide them; the stat cache skips reads, never changes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import shardkit.fingerprint as fp
from shardkit.discover import SamplePair
from shardkit.errors import InputNotFoundError
from shardkit.fingerprint import CACHE_NAME, fingerprint_samples, load_cache, save_cache


@pytest.fixture
def pairs(tmp_path: Path) -> list[SamplePair]:
    out = []
    for i in range(3):
        (tmp_path / f"{i}.png").write_bytes(f"image {i}".encode())
        (tmp_path / f"{i}_L.png").write_bytes(f"label {i}".encode())
        out.append(SamplePair(f"{i}.png", tmp_path / f"{i}.png", tmp_path / f"{i}_L.png"))
    return out


def test_fingerprints_follow_content_and_options_only(pairs: list[SamplePair]) -> None:
    a, cache = fingerprint_samples(pairs, "opts", {}, threads=2)
    assert len(set(a)) == 3 and set(cache) == {str(p) for pair in pairs for p in (pair.image, pair.label)}
    assert fingerprint_samples(pairs, "opts", {}, threads=1)[0] == a  # threads change nothing
    assert all(x != y for x, y in zip(fingerprint_samples(pairs, "other", {})[0], a, strict=True))
    pairs[1].label.write_bytes(b"label 1 edited")  # type: ignore[union-attr]
    b, _ = fingerprint_samples(pairs, "opts", cache)
    assert (b[0], b[2]) == (a[0], a[2]) and b[1] != a[1]


def test_an_unchanged_file_is_not_read_again(pairs: list[SamplePair], monkeypatch: pytest.MonkeyPatch) -> None:
    first, cache = fingerprint_samples(pairs, "opts", {})
    reads: list[Path] = []
    real = fp.file_sha256
    monkeypatch.setattr(fp, "file_sha256", lambda p: (reads.append(p), real(p))[1])
    assert fingerprint_samples(pairs, "opts", cache)[0] == first
    assert reads == []


def test_an_edit_that_restores_size_and_mtime_is_still_seen(pairs: list[SamplePair]) -> None:
    first, cache = fingerprint_samples(pairs, "opts", {})
    image = pairs[0].image
    st = image.stat()
    image.write_bytes(b"image X")  # same size
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))  # like touch -r: only the ctime tells
    assert fingerprint_samples(pairs, "opts", cache)[0][0] != first[0]


def test_missing_files_fail_or_get_a_placeholder_with_skip(pairs: list[SamplePair]) -> None:
    pairs[2].image.unlink()
    with pytest.raises(InputNotFoundError):
        fingerprint_samples(pairs, "opts", {})
    prints, cache = fingerprint_samples(pairs, "opts", {}, on_error="skip")
    assert len(prints) == 3 and str(pairs[2].image) not in cache


def test_the_cache_round_trips_and_a_damaged_one_is_empty(tmp_path: Path, pairs: list[SamplePair]) -> None:
    _, cache = fingerprint_samples(pairs, "opts", {})
    save_cache(tmp_path, cache)
    assert load_cache(tmp_path) == cache
    (tmp_path / CACHE_NAME).write_text("[1, 2")
    assert load_cache(tmp_path) == {}
    (tmp_path / CACHE_NAME).write_text("[1, 2]")
    assert load_cache(tmp_path) == {}


def _small_camvid(camvid_root: Path, dst: Path, n: int = 6) -> Path:
    """A SegNet-layout copy of the first ``n`` CamVid val pairs (real files, so stats and inodes are their own)."""
    import shutil

    for sub in ("val", "valannot"):
        (dst / sub).mkdir(parents=True)
        for p in sorted((camvid_root / sub).glob("*.png"))[:n]:
            shutil.copyfile(p, dst / sub / p.name)
    return dst


@pytest.mark.parametrize("workers", [1, 2])
def test_fingerprints_hashed_in_workers_equal_the_parents(camvid_root: Path, tmp_path: Path, workers: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A first conversion hashes sources in the workers (from the bytes they decode); its fingerprints, cache
    and shard names are those the parent computes, so a run that hashes in the parent reuses every shard."""
    import shardkit.staging as staging
    from shardkit.config import ConvertConfig, ShardSize
    from shardkit.manifest import load_manifest
    from shardkit.pipeline import convert

    src = _small_camvid(camvid_root, tmp_path / "src")
    out = tmp_path / "out" / "val"
    cfg = ConvertConfig(input=src, output=tmp_path / "out", size=(352, 480), layout="segnet", workers=workers,
                        shard_size=ShardSize(samples=2), quiet=True)
    in_parent: list[tuple[list[str], dict]] = []
    real = fp.fingerprint_samples

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        in_parent.append(real(*args, **kwargs))
        return in_parent[-1]

    monkeypatch.setattr(staging, "fingerprint_samples", spy)
    first = convert(cfg)
    assert in_parent == [] and first.shards == 3  # nothing to reuse: the parent hashed nothing
    from_workers = [s["fingerprint"] for s in load_manifest(out).samples]
    worker_cache = load_cache(out)
    assert len(set(from_workers)) == 6 and len(worker_cache) == 12
    (out / CACHE_NAME).unlink()  # shard records are there: the parent hashes every file itself
    again = convert(cfg)
    assert len(in_parent) == 1 and again.reused == again.shards == 3  # same shard keys
    assert in_parent[0] == (from_workers, worker_cache)
    assert load_cache(out) == worker_cache


def test_unreadable_inputs_skipped_in_workers_get_the_parents_placeholder(camvid_root: Path, tmp_path: Path) -> None:
    """With --on-error skip, a source that is not a regular file gets the same placeholder digest in a worker as
    in the parent: the shard holding it keeps its name, and a run that hashes in the parent reuses it."""
    from shardkit.config import ConvertConfig, ShardSize
    from shardkit.manifest import load_manifest
    from shardkit.pipeline import convert

    src = _small_camvid(camvid_root, tmp_path / "src", n=4)
    fifo = sorted((src / "valannot").iterdir())[1]
    fifo.unlink()
    os.mkfifo(fifo)
    out = tmp_path / "out" / "val"
    cfg = ConvertConfig(input=src, output=tmp_path / "out", size=(352, 480), layout="segnet", workers=1,
                        shard_size=ShardSize(samples=2), on_error="skip", quiet=True)
    first = convert(cfg)
    assert len(first.skipped) == 1 and str(fifo) not in load_cache(out)
    (out / CACHE_NAME).unlink()
    again = convert(cfg)
    assert again.reused == again.shards == 2 and len(again.skipped) == 1
    assert [s["key"] for s in load_manifest(out).skipped] == [first.skipped[0]["key"]]


@pytest.mark.parametrize("entries", [0, 1, 5, 12])
def test_the_cache_file_is_json_dumps_bytes_written_in_pieces(entries: int, monkeypatch) -> None:
    from shardkit import fingerprint

    monkeypatch.setattr(fingerprint, "CACHE_CHUNK", 5)
    rng = np.random.default_rng(entries)
    cache = {f"/data/{rng.integers(10**6)}/ü{i}.png": [int(rng.integers(10**9)), 1, 2, 3, "ab" * 32]
             for i in range(entries)}
    pieces = list(fingerprint.cache_json(cache))
    assert b"".join(pieces) == json.dumps(cache, sort_keys=True).encode()
    assert len(pieces) == 2 + -(-entries // 5)  # "{", one piece per 5 entries, "}"
