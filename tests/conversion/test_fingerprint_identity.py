"""Input identities (fingerprint.py): what a worker compares a file with after reading it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from shardkit.conversion.fingerprint import (
    SourceCache,
    file_identity,
    fingerprint_samples,
    identity_digests,
    input_identities,
)
from shardkit.conversion.layouts import discover
from tests.camvid_copy import small_camvid


def test_identities_from_the_cache_equal_a_stat_of_each_file(camvid_root: Path, tmp_path: Path) -> None:
    raw = small_camvid(camvid_root, tmp_path / "raw", 5)
    pairs = discover(raw).splits["val"]
    stated = input_identities(pairs, None, threads=2)
    _, cache = fingerprint_samples(pairs, "digest", SourceCache(len(pairs)), threads=2)
    assert np.array_equal(input_identities(pairs, cache), stated)
    assert stated.dtype == np.uint64 and stated.shape == (5, 2) and stated.all()
    assert len({int(v) for v in stated.ravel()}) == 10
    assert int(stated[3, 1]) == file_identity(Path(str(pairs.path(3, 1))))


def test_every_stat_value_changes_the_identity_and_a_missing_file_has_none(tmp_path: Path) -> None:
    path = tmp_path / "a.png"
    path.write_bytes(b"abc")
    st = path.stat()
    before = file_identity(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert file_identity(path) != before
    base = np.array([3, 10, 20, 30], np.int64)
    digests = {int(identity_digests(base))}
    for k in range(4):
        changed = base.copy()
        changed[k] += 1
        digests.add(int(identity_digests(changed)))
    assert len(digests) == 5 and 0 not in digests
    assert int(identity_digests(np.zeros(4, np.int64))) == 0  # "unknown"
    path.unlink()
    assert file_identity(path) == 0
