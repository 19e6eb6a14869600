"""publish: a file is absent, complete under a temp name, or complete under its final name; cleanup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import shardkit.publish as publish
from shardkit.publish import (
    TMP_MARK,
    atomic_write_bytes,
    collect_garbage,
    link_into_place,
    remove_temps,
    rename_into_place,
)


def test_atomic_write_replaces_the_whole_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    target.write_bytes(b"old")
    atomic_write_bytes(target, b"new contents")
    assert target.read_bytes() == b"new contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask  # like a plain open(), not mkstemp's 0600


def test_a_failed_atomic_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "manifest.json"
    target.write_bytes(b"old")

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


@pytest.mark.parametrize("synced", [False, True])
def test_rename_into_place_makes_data_durable_before_the_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              synced: bool) -> None:
    events: list[tuple[str, str]] = []
    real_replace = os.replace
    monkeypatch.setattr(publish, "fsync_file", lambda p: events.append(("fsync", Path(p).name)))
    monkeypatch.setattr(publish, "fsync_dir", lambda d: events.append(("fsync_dir", Path(d).name)))
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", Path(b).name)), real_replace(a, b)))
    for name in ("a", "b"):
        (tmp_path / f".{name}{TMP_MARK}x").write_bytes(name.encode())
    rename_into_place(tmp_path, [(f".a{TMP_MARK}x", "a"), (f".b{TMP_MARK}x", "b")], synced=synced)
    assert (tmp_path / "a").read_bytes() == b"a" and (tmp_path / "b").read_bytes() == b"b"
    fsyncs = [] if synced else [("fsync", f".a{TMP_MARK}x"), ("fsync", f".b{TMP_MARK}x")]
    want = [*fsyncs[:1], ("replace", "a"), *fsyncs[1:], ("replace", "b"), ("fsync_dir", tmp_path.name)]
    assert events == want


def test_remove_temps_deletes_only_hidden_temp_names(tmp_path: Path) -> None:
    names = [f".images-0{TMP_MARK}host-1-ab", f".manifest.json{TMP_MARK}x", "images-0.npy", ".fingerprints.json",
             f"visible{TMP_MARK}x"]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    remove_temps(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])
    remove_temps(tmp_path / "missing")  # no folder: nothing to do


def test_collect_garbage_keeps_the_manifest_what_is_kept_and_what_is_not_ours(tmp_path: Path) -> None:
    for n in ("manifest.json", "images-1.npy", "images-2.npy", ".shard-old.json", "notes.txt"):
        (tmp_path / n).write_bytes(b"")
    (tmp_path / "images-dir").mkdir()
    collect_garbage(tmp_path, {"images-1.npy"}, lambda n: n.startswith(("images-", ".shard-")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images-1.npy", "images-dir", "manifest.json", "notes.txt"]


def test_link_into_place_gives_a_second_name_and_keeps_the_first(tmp_path: Path) -> None:
    (tmp_path / "images-00000-old.npy").write_bytes(b"pixels")
    link_into_place(tmp_path, "images-00000-old.npy", "images-00001-old.npy")
    assert (tmp_path / "images-00000-old.npy").read_bytes() == (tmp_path / "images-00001-old.npy").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images-00000-old.npy", "images-00001-old.npy"]
