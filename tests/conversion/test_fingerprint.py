"""Source fingerprints: content and options decide them; the stat cache skips reads, never changes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import shardkit.conversion.fingerprint as fp
from shardkit.conversion.fingerprint import (
    CACHE_NAME,
    SourceCache,
    cache_items,
    fingerprint_samples,
    load_cache,
    save_cache,
)
from shardkit.conversion.pairs import PairBuilder, PairTable
from shardkit.errors import InputNotFoundError
from tests.camvid_copy import small_camvid


@pytest.fixture
def pairs(tmp_path: Path) -> PairTable:
    out = PairBuilder(tmp_path)
    for i in range(3):
        (tmp_path / f"{i}.png").write_bytes(f"image {i}".encode())
        (tmp_path / f"{i}_L.png").write_bytes(f"label {i}".encode())
        out.add(f"{i}.png", str(tmp_path / f"{i}.png"), str(tmp_path / f"{i}_L.png"))
    return out.build()


def prints(pairs: PairTable, options: str, cache: SourceCache | None = None, **kw) -> tuple[list[str], SourceCache]:
    """Fingerprints as hex, and the refreshed cache."""
    out, cache = fingerprint_samples(pairs, options, cache or SourceCache(len(pairs)), **kw)
    return [row.tobytes().hex() for row in out], cache


def entries(pairs: PairTable, cache: SourceCache) -> dict[str, list]:
    """The cache as the cache file holds it: {path: [size, mtime_ns, ctime_ns, inode, sha256 hex]}."""
    return dict(cache_items(pairs, cache))


def cache_file(path: Path) -> dict[str, list]:
    """The entries of a cache file (its checksum left out)."""
    return {k: v for k, v in json.loads(path.read_bytes()).items() if k != fp.CHECKSUM_KEY}


def signed(text: str) -> str:
    """A cache file's JSON ``text`` with the checksum shardkit gives it (the sha256 of every byte before it)."""
    import hashlib

    body = text.rstrip()[:-1].encode() + (b", " if json.loads(text) else b"") + b'"\\u0000checksum": "'
    return (body + hashlib.sha256(body).hexdigest().encode() + b'"}').decode()


def test_fingerprints_follow_content_and_options_only(pairs: PairTable) -> None:
    a, cache = prints(pairs, "opts", threads=2)
    files = {str(p) for pair in pairs for p in (pair.image, pair.label)}
    assert len(set(a)) == 3 and set(entries(pairs, cache)) == files
    assert prints(pairs, "opts", threads=1)[0] == a  # threads change nothing
    assert all(x != y for x, y in zip(prints(pairs, "other")[0], a, strict=True))
    pairs[1].label.write_bytes(b"label 1 edited")  # type: ignore[union-attr]
    b, _ = prints(pairs, "opts", cache)
    assert (b[0], b[2]) == (a[0], a[2]) and b[1] != a[1]


def test_an_unchanged_file_is_not_read_again(pairs: PairTable, monkeypatch: pytest.MonkeyPatch) -> None:
    first, cache = prints(pairs, "opts")
    reads: list[Path] = []
    real = fp.file_sha256
    monkeypatch.setattr(fp, "file_sha256", lambda p: (reads.append(p), real(p))[1])
    assert prints(pairs, "opts", cache)[0] == first
    assert reads == []


def test_an_edit_that_restores_size_and_mtime_is_still_seen(pairs: PairTable) -> None:
    first, cache = prints(pairs, "opts")
    image = pairs[0].image
    st = image.stat()
    image.write_bytes(b"image X")  # same size
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))  # like touch -r: only the ctime tells
    assert prints(pairs, "opts", cache)[0][0] != first[0]


def test_missing_files_fail_or_get_a_placeholder_with_skip(pairs: PairTable) -> None:
    pairs[2].image.unlink()
    with pytest.raises(InputNotFoundError):
        prints(pairs, "opts")
    found, cache = prints(pairs, "opts", on_error="skip")
    assert len(found) == 3 and str(pairs[2].image) not in entries(pairs, cache)


def test_the_cache_round_trips_and_a_damaged_one_is_empty(tmp_path: Path, pairs: PairTable) -> None:
    _, cache = prints(pairs, "opts")
    save_cache(tmp_path, pairs, cache)
    written = cache_file(tmp_path / CACHE_NAME)
    assert entries(pairs, load_cache(tmp_path, pairs)) == entries(pairs, cache) == written
    assert (tmp_path / CACHE_NAME).read_bytes() == signed(json.dumps(written, sort_keys=True)).encode()
    good = (tmp_path / CACHE_NAME).read_text()
    at = good.index('": [') + 4  # the first entry's size: another digit, valid JSON, checksum now stale
    edited = good[:at] + ("1" if good[at] != "1" else "2") + good[at + 1:]
    for damaged in ("[1, 2", "[1, 2]", '{"a": [1, 2, 3, 4, "' + "0" * 64 + '"], "b": [',
                    json.dumps(written, sort_keys=True),  # no checksum: an older shardkit's
                    edited,
                    good[:-10] + "0" * 8 + '"}'):  # the checksum itself damaged
        (tmp_path / CACHE_NAME).write_text(damaged)
        assert entries(pairs, load_cache(tmp_path, pairs)) == {}


def test_the_cache_is_read_a_piece_at_a_time_and_keeps_only_this_splits_files(
        tmp_path: Path, pairs: PairTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries of other files are dropped, malformed ones (an older 3-field cache, a bad digest) hashed again; a
    file laid out otherwise (indented) is read whole; the result is the same whatever the piece size."""
    _, cache = prints(pairs, "opts")
    mine = entries(pairs, cache)
    other = {str(tmp_path / f"other{i}.png"): [i, 2, 3, 4, "ab" * 32] for i in range(50)}
    bad = dict(mine)
    image0, label2 = str(pairs[0].image), str(pairs[2].label)
    bad[image0] = bad[image0][:2] + bad[image0][3:]  # 3 stat fields
    bad[label2] = [*bad[label2][:4], "AB" * 32]  # not lowercase hex
    expected = {k: v for k, v in mine.items() if k not in (image0, label2)}
    for text in (json.dumps(mine | other, sort_keys=True), json.dumps(mine | other, sort_keys=True, indent=1),
                 json.dumps(bad | other, sort_keys=True)):
        (tmp_path / CACHE_NAME).write_text(signed(text))
        for piece in (7, 64, 1 << 20):
            monkeypatch.setattr(fp, "READ_BLOCK", piece)
            got = entries(pairs, load_cache(tmp_path, pairs))
            assert got == (expected if "AB" in text else mine), (piece, text[:40])


def test_spilled_entries_come_back_as_written(tmp_path: Path, pairs: PairTable,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A first conversion's cache waits in a spill file: put in blocks, read back a block at a time."""
    import tempfile

    _, cache = prints(pairs, "opts")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spilled = SourceCache(len(pairs), spill=True)
    spilled.put(1, cache.rows(1, 2))
    spilled.put(0, cache.rows(0, 1))
    assert entries(pairs, spilled) == entries(pairs, cache)
    spilled.close()
    assert list(tmp_path.glob("shardkit-cache-*")) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_fingerprints_hashed_in_workers_equal_the_parents(camvid_root: Path, tmp_path: Path, workers: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A first conversion hashes sources in the workers (from the bytes they decode); its fingerprints, cache
    and shard names are those the parent computes, so a run that hashes in the parent reuses every shard."""
    import shardkit.conversion.staging as staging
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert
    from shardkit.store.manifest import load_manifest

    src = small_camvid(camvid_root, tmp_path / "src", n=6)
    out = tmp_path / "out" / "val"
    cfg = ConvertConfig(input=src, output=tmp_path / "out", size=(352, 480), layout="segnet", workers=workers,
                        shard_size=ShardSize(samples=2), quiet=True)
    in_parent: list[tuple[list[str], dict]] = []
    real = fp.fingerprint_samples

    def spy(pairs, *args, **kwargs):  # type: ignore[no-untyped-def]
        out, cache = real(pairs, *args, **kwargs)
        in_parent.append(([row.tobytes().hex() for row in out], entries(pairs, cache)))
        return out, cache

    monkeypatch.setattr(staging, "fingerprint_samples", spy)
    first = convert(cfg)
    assert in_parent == [] and first.shards == 3  # nothing to reuse: the parent hashed nothing
    from_workers = [s["fingerprint"] for s in load_manifest(out).samples]
    worker_cache = cache_file(out / CACHE_NAME)
    assert len(set(from_workers)) == 6 and len(worker_cache) == 12
    (out / CACHE_NAME).unlink()  # shard records are there: the parent hashes every file itself
    again = convert(cfg)
    assert len(in_parent) == 1 and again.reused == again.shards == 3  # same shard keys
    assert in_parent[0] == (from_workers, worker_cache)
    assert cache_file(out / CACHE_NAME) == worker_cache


def test_unreadable_inputs_skipped_in_workers_get_the_parents_placeholder(camvid_root: Path, tmp_path: Path) -> None:
    """With --on-error skip, a source that is not a regular file gets the same placeholder digest in a worker as
    in the parent: the shard holding it keeps its name, and a run that hashes in the parent reuses it."""
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert
    from shardkit.store.manifest import load_manifest

    src = small_camvid(camvid_root, tmp_path / "src", n=4)
    fifo = sorted((src / "valannot").iterdir())[1]
    fifo.unlink()
    os.mkfifo(fifo)
    out = tmp_path / "out" / "val"
    cfg = ConvertConfig(input=src, output=tmp_path / "out", size=(352, 480), layout="segnet", workers=1,
                        shard_size=ShardSize(samples=2), on_error="skip", quiet=True)
    first = convert(cfg)
    assert len(first.skipped) == 1 and str(fifo) not in json.loads((out / CACHE_NAME).read_text())
    (out / CACHE_NAME).unlink()
    again = convert(cfg)
    assert again.reused == again.shards == 2 and len(again.skipped) == 1
    assert [s["key"] for s in load_manifest(out).skipped] == [first.skipped[0]["key"]]


@pytest.mark.parametrize("entries", [0, 1, 5, 12])
def test_the_cache_file_is_json_dumps_bytes_written_in_pieces(entries: int, monkeypatch) -> None:
    from shardkit.conversion import fingerprint

    monkeypatch.setattr(fingerprint, "CACHE_CHUNK", 5)
    rng = np.random.default_rng(entries)
    cache = {f"/data/{rng.integers(10**6)}/ü{i}.png": [int(rng.integers(10**9)), 1, 2, 3, "ab" * 32]
             for i in range(entries)}
    pieces = list(fingerprint.cache_json(sorted(cache.items())))
    assert b"".join(pieces).decode() == signed(json.dumps(cache, sort_keys=True))
    assert len(pieces) == 3 + -(-entries // 5)  # "{", one piece per 5 entries, the checksum's head, its digits


def test_a_spilled_cache_reads_and_writes_like_one_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Single entries go through a few write-back blocks, whole rows straight to the file: any mix of the two
    reads back what an in-memory cache holds (tiny blocks, so that blocks are evicted and rewritten)."""
    import random

    monkeypatch.setattr(SourceCache, "BLOCK", 3)
    monkeypatch.setattr(SourceCache, "KEEP", 2)
    rng = random.Random(0)
    n = 40
    memory, spilled = SourceCache(n), SourceCache(n, spill=True)
    for step in range(2000):
        op, i, side = rng.random(), rng.randrange(n), rng.randrange(2)
        if op < 0.4:
            entry = None if rng.random() < 0.2 else [rng.randrange(1 << 40), step, -step, rng.randrange(1 << 64),
                                                     bytes(rng.randrange(256) for _ in range(32)).hex()]
            assert memory.set(i, side, entry) and spilled.set(i, side, entry)
        elif op < 0.5:
            count = rng.randrange(1, n - i + 1)
            part = memory.part(i, count)
            part.set(0, side, [1, 2, 3, 4, "ab" * 32])
            memory.put(i, part.rows(0, count))
            spilled.put(i, part.rows(0, count))
        elif op < 0.6:
            count = rng.randrange(1, n - i + 1)
            assert spilled.rows(i, count).tobytes() == memory.rows(i, count).tobytes()
        else:
            assert spilled.get(i, side) == memory.get(i, side)
    assert spilled.rows(0, n).tobytes() == memory.rows(0, n).tobytes()
    spilled.close()


def test_an_unchanged_cache_file_is_not_written_again(pairs: PairTable, tmp_path: Path) -> None:
    """A re-run whose every entry came from the cache file leaves the file alone; a changed, new or dropped
    entry writes it again, with exactly the current entries."""
    out = tmp_path / "out"
    out.mkdir()
    _, cache = prints(pairs, "opts")
    save_cache(out, pairs, cache)
    path = out / CACHE_NAME
    written = path.read_bytes()
    path.write_bytes(written)  # same bytes, new inode and times: a rewrite would show in the stat
    before = path.stat()
    cache = load_cache(out, pairs)
    assert not cache.changed
    _, cache = prints(pairs, "opts", cache)
    save_cache(out, pairs, cache)
    assert path.stat().st_ino == before.st_ino and path.stat().st_mtime_ns == before.st_mtime_ns
    pairs[1].label.write_bytes(b"label 1 edited")  # type: ignore[union-attr]
    _, cache = prints(pairs, "opts", load_cache(out, pairs))
    assert cache.changed
    save_cache(out, pairs, cache)
    assert path.read_bytes() != written and cache_file(path) == entries(pairs, cache)
    fewer = pairs[:2]  # a pair removed: its entries must leave the file
    cache = load_cache(out, fewer)
    assert cache.changed
    _, cache = prints(fewer, "opts", cache)
    save_cache(out, fewer, cache)
    assert cache_file(path) == entries(fewer, cache)


@pytest.mark.parametrize("damage", ["deep", "deep-value", "fifo", "folder", "no-separator"])
def test_a_hostile_cache_file_is_dropped_with_a_warning_never_a_traceback_or_hang(
        tmp_path: Path, pairs: PairTable, damage: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100,000-deep cache (whole, or one entry's value), a FIFO or folder in its place, one huge entry: the cache
    is empty (every file hashed again) with a warning naming it; the next save writes a good one."""
    path = tmp_path / CACHE_NAME
    if damage == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "deep-value":
        path.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif damage == "fifo":
        os.mkfifo(path)
    elif damage == "folder":
        path.mkdir()
    else:
        monkeypatch.setattr(fp, "MAX_WHOLE_BYTES", 1 << 16)
        path.write_text('{"' + "a" * (fp.MAX_ENTRY_BYTES + 10) + '": [1, 2, 3, 4, "' + "0" * 64 + '"]}')
    try:
        assert entries(pairs, load_cache(tmp_path, pairs)) == {}
        assert f"{path}: damaged" in caplog.text and "hashed again" in caplog.text
    finally:
        if damage == "fifo":
            path.unlink()
    if damage != "folder":
        _, cache = prints(pairs, "opts")
        save_cache(tmp_path, pairs, cache)
        assert entries(pairs, load_cache(tmp_path, pairs)) == entries(pairs, cache)
