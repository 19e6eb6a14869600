"""Source fingerprints: content and options decide them; the stat cache skips reads, never changes."""

from __future__ import annotations

import os
from pathlib import Path

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
