"""publish: a file is absent, complete under a temp name, or complete under its final name; cleanup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import shardkit.store.publish as publish
from shardkit.files.splitfiles import TMP_MARK
from shardkit.store.publish import atomic_write_bytes, collect_garbage, link_into_place, remove_temps, rename_into_place


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


def test_a_crash_inside_atomic_write_leaves_a_temp_name_the_cleanup_removes(tmp_path: Path) -> None:
    """A process killed between writing the temp file and renaming it: what it leaves is a shardkit temp name."""
    import subprocess
    import sys

    root = Path(publish.__file__).resolve().parents[2]
    code = ("import os, sys; from pathlib import Path; from shardkit.store.publish import atomic_write_bytes\n"
            "os.replace = lambda a, b: os._exit(9)  # killed just before the rename\n"
            "atomic_write_bytes(Path(sys.argv[1]) / 'manifest.json', b'half')\n")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env={**os.environ, "PYTHONPATH": str(root)},
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 9, res.stderr
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".manifest.json" + TMP_MARK), left
    (tmp_path / "notes.txt").write_bytes(b"mine")
    remove_temps(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


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


# ------------------------------------------------------------------------------------------ versions
def _version(directory: Path, number: int, names: list[str]) -> None:
    """A kept version naming ``names`` (and the files themselves)."""
    import json

    for name in names:
        (directory / name).write_bytes(name.encode())
    shards = [{"files": [{"name": n, "bytes": len(n), "sha256": "0" * 64}]} for n in names]
    (directory / f"manifest-v{number}.json").write_text(json.dumps({"version": number, "shards": shards}))


def _owned(name: str) -> bool:
    return name.startswith("images-")


def test_versions_to_keep_takes_the_newest_and_every_leased_one() -> None:
    assert publish.versions_to_keep([1, 2, 3, 4, 5], 3) == {3, 4, 5}
    assert publish.versions_to_keep([1, 2, 3, 4, 5], 1, leased=[2, 9]) == {2, 5}  # 9 does not exist
    assert publish.versions_to_keep([4], 3) == {4}
    assert publish.versions_to_keep([], 3) == set()


def test_reclaim_keeps_the_files_of_kept_versions_only(tmp_path: Path) -> None:
    for number in (1, 2, 3):
        _version(tmp_path, number, [f"images-{number}.npy", "images-shared.npy"])
    (tmp_path / "unowned.txt").write_text("x")
    kept = publish.reclaim(tmp_path, 2, {"images-current.npy"}, _owned)
    assert kept == [2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "images-2.npy", "images-3.npy", "images-shared.npy", "manifest-v2.json", "manifest-v3.json", "unowned.txt"]


def test_a_live_lease_keeps_its_version_and_a_dead_or_expired_one_does_not(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    for number in (1, 2, 3, 4):
        _version(tmp_path, number, [f"images-{number}.npy"])
    lease = publish.take_lease(tmp_path, 1)
    assert lease is not None and lease.name.startswith(f".lease-v1-{socket.gethostname()}-{os.getpid()}-")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    (tmp_path / f".lease-v2-{socket.gethostname()}-{dead.stdout.strip()}-abcd").touch()  # its process is gone
    far = tmp_path / ".lease-v3-other-host.example-123-abcd"
    far.touch()
    os.utime(far, (0, 0))  # another host's lease, untouched for longer than LEASE_TTL
    assert publish.leased_versions(tmp_path) == {1}
    assert not (tmp_path / f".lease-v2-{socket.gethostname()}-{dead.stdout.strip()}-abcd").exists()
    assert publish.reclaim(tmp_path, 1, set(), _owned) == [1, 4]
    assert (tmp_path / "images-1.npy").exists() and not (tmp_path / "images-2.npy").exists()
    publish.drop_lease(lease, os.getpid() + 1)  # another process's copy of the reader: not its lease
    assert lease.exists()
    publish.drop_lease(lease, os.getpid())
    assert publish.reclaim(tmp_path, 1, set(), _owned) == [4]
    assert not (tmp_path / "images-1.npy").exists()


def test_a_reader_that_cannot_write_the_folder_gets_no_lease(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def read_only(*args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", read_only)
    assert publish.take_lease(tmp_path, 1) is None


def test_uncommitted_versions_are_dropped_and_a_legacy_manifest_is_kept_as_version_1(tmp_path: Path) -> None:
    import json

    (tmp_path / "manifest.json").write_text(json.dumps({"manifest_version": 2, "shards": []}))
    (tmp_path / "manifest-v1.json").write_text("{}")  # a killed first publish of a newer shardkit
    publish.drop_uncommitted(tmp_path)
    assert not (tmp_path / "manifest-v1.json").exists()
    assert publish.keep_legacy(tmp_path, publish.current_manifest(tmp_path)) == 1
    assert (tmp_path / "manifest-v1.json").read_bytes() == (tmp_path / "manifest.json").read_bytes()
    (tmp_path / "manifest.json").write_text(json.dumps({"manifest_version": 3, "version": 4, "shards": []}))
    (tmp_path / "manifest-v5.json").write_text("{}")
    publish.drop_uncommitted(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("manifest-v*")) == ["manifest-v1.json"]
    assert publish.keep_legacy(tmp_path, publish.current_manifest(tmp_path)) == 4


def _dead_pid() -> int:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


def test_a_folder_or_fifo_named_like_a_dead_readers_lease_is_left_alone_and_reclaim_works(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Not a lease: it protects nothing, is not removed (it is no file of ours to unlink) and fails nothing."""
    import socket

    for number in (1, 2, 3):
        _version(tmp_path, number, [f"images-{number}.npy"])
    folder = tmp_path / f".lease-v1-{socket.gethostname()}-{_dead_pid()}-abcd"
    folder.mkdir()
    fifo = tmp_path / f".lease-v2-{socket.gethostname()}-1-abcd"
    os.mkfifo(fifo)
    assert publish.leased_versions(tmp_path) == set()
    assert "not a regular file" in caplog.text and "remove it" in caplog.text
    assert publish.reclaim(tmp_path, 1, set(), _owned) == [3]
    assert folder.is_dir() and fifo.exists() and not (tmp_path / "images-1.npy").exists()


def test_a_pid_1_lease_or_one_dated_in_the_future_keeps_no_version(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """pid 1 is always alive (init): a lease nobody holds the flock of, naming it, is stale; a lease dated past
    LEASE_SKEW in the future (this host or another) would never expire, so it counts for nothing."""
    import socket
    import time

    host = socket.gethostname()
    init = tmp_path / f".lease-v1-{host}-1-abcd"
    init.touch()
    ahead = time.time() + 10 * 365 * 86400
    for name in (f".lease-v2-{host}-{os.getpid()}-abcd", ".lease-v3-other-host.example-123-abcd"):
        (tmp_path / name).touch()
        os.utime(tmp_path / name, (ahead, ahead))
    assert publish.leased_versions(tmp_path) == set()
    assert not init.exists()  # stale: removed
    assert "in the future" in caplog.text
    just = time.time() + 60  # within the skew between hosts' clocks: counts
    os.utime(tmp_path / ".lease-v3-other-host.example-123-abcd", (just, just))
    assert publish.leased_versions(tmp_path) == {3}


def test_a_lease_counts_while_its_reader_holds_it_whatever_its_pid_or_age(tmp_path: Path) -> None:
    """Liveness is the lease's flock, which the kernel drops with the process: a reader open for longer than
    LEASE_TTL still counts; an old unheld lease naming a live pid (an older shardkit's, or forged) expires."""
    import socket
    import subprocess
    import sys
    import time

    code = ("import sys, shardkit.store.publish as p; p.take_lease(sys.argv[1], 5); print('ok', flush=True); "
            "sys.stdin.read()")
    reader = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=Path(publish.__file__).parents[2])
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "ok"
        (lease,) = tmp_path.glob(".lease-v5-*")
        old = time.time() - 2 * publish.LEASE_TTL
        os.utime(lease, (old, old))
        unheld = tmp_path / f".lease-v6-{socket.gethostname()}-{reader.pid}-abcd"  # a live pid, no flock
        unheld.touch()
        assert publish.leased_versions(tmp_path) == {5, 6}
        os.utime(unheld, (old, old))
        assert publish.leased_versions(tmp_path) == {5}
        assert not unheld.exists()
    finally:
        reader.communicate("")
    assert publish.leased_versions(tmp_path) == set()  # the reader is gone: its flock went with it
