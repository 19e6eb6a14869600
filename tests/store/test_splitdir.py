"""splitdir: one module owns a split folder — the names in it, what is owned, the keep set, and the sinks that
open, publish, commit and clean it up."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from shardkit.conversion.fingerprint import CACHE_NAME
from shardkit.files.lock import LOCK_NAME
from shardkit.files.splitfiles import TMP_MARK, ShardFile
from shardkit.store.manifest import MANIFEST_NAME, load_manifest, version_name
from shardkit.store.records import ShardRecord
from shardkit.store.splitdir import (
    LocalSink,
    RemoteSink,
    SplitSink,
    has_records,
    keep_set,
    name_kind,
    owned,
    publish_shard,
)


def _record(key: str, *names: str) -> ShardRecord:
    return ShardRecord(key, tuple(ShardFile(n, 1, "0" * 64) for n in names), 1, "f", {}, ())


def test_owned_names_are_shards_sidecars_and_records_of_any_format_and_nothing_else() -> None:
    for name in ("images-00000-abcdef012345.npy", "shard-00000-abcdef012345.lmdb", "shard-00000-abcdef012345.h5",
                 "shard-00000-abcdef012345.tfrecord", "samples-00000-abcdef012345.npy", ".shard-abc.json"):
        assert owned(name), name
    for name in (MANIFEST_NAME, version_name(3), CACHE_NAME, LOCK_NAME, "notes.txt", f".x{TMP_MARK}1"):
        assert not owned(name), name


def test_every_name_kind_of_a_split_folder_is_told_apart() -> None:
    kinds = {MANIFEST_NAME: "manifest", version_name(12): "version", CACHE_NAME: "cache", LOCK_NAME: "lock",
             ".lease-v3-host-12-abcd": "lease", f".images-00000-abc.npy{TMP_MARK}host-1-ab": "temp",
             ".shard-abc.json": "record", "samples-00000-abcdef012345.npy": "sidecar",
             "images-00000-abcdef012345.npy": "shard", "shard-00000-abcdef012345.tfindex": "shard",
             "notes.txt": None, "manifest-v0.json": None}
    assert {name: name_kind(name) for name in kinds} == kinds
    assert {name for name in kinds if owned(name)} == {n for n, k in kinds.items() if k in ("record", "sidecar",
                                                                                            "shard")}


def test_the_keep_set_is_the_records_files_their_records_the_manifest_and_the_cache() -> None:
    records = [_record("a", "images-a.npy", "samples-a.npy"), _record("b", "images-b.npy", "samples-b.npy")]
    assert keep_set(records) == {"images-a.npy", "samples-a.npy", "images-b.npy", "samples-b.npy",
                                 ShardRecord.name("a"), ShardRecord.name("b"), MANIFEST_NAME, CACHE_NAME}


def test_both_sinks_implement_the_one_interface() -> None:
    for method in ("open", "reuse", "shard_published", "commit", "committed", "location", "sidecar_folder"):
        assert callable(getattr(LocalSink, method)) and callable(getattr(RemoteSink, method))
    assert issubclass(LocalSink, SplitSink) and issubclass(RemoteSink, SplitSink)
    assert LocalSink.reuse is not SplitSink.reuse and RemoteSink.reuse is not SplitSink.reuse


def test_open_clears_a_killed_runs_temps_and_uncommitted_versions(tmp_path: Path) -> None:
    split = tmp_path / "out" / "val"
    split.mkdir(parents=True)
    (split / f".images-0{TMP_MARK}host-1-ab").write_bytes(b"half")
    (split / version_name(1)).write_text("{}")  # newer than the (absent) manifest: never committed
    (split / "notes.txt").write_text("mine")
    LocalSink().open(split)
    assert sorted(p.name for p in split.iterdir()) == ["notes.txt"]
    assert not has_records(split)
    LocalSink().open(tmp_path / "new" / "train")  # created where missing
    assert (tmp_path / "new" / "train").is_dir()


#: Temp names of atomic_write_bytes before it used TMP_MARK (tempfile.mkstemp's), for each file it writes whole
OLD_TEMPS = (".manifest.json.ab_cd123.tmp", ".manifest-v3.json.x1y2z3w4.tmp", f".{CACHE_NAME}.abcdefgh.tmp",
             f".{ShardRecord.name('abc')}.0123abcd.tmp", ".samples-00000-abcdef012345.npy.zz_9zz9z.tmp")
#: A user's files that merely look alike: not hidden, not a name shardkit writes whole, not mkstemp's 8 characters
LOOKALIKES = ("manifest.json.abcdefgh.tmp", ".notes.txt.abcdefgh.tmp", ".manifest.json.abcdefg.tmp",
              ".manifest.json.ABCDEFGH.tmp", ".manifest.json.tmp", ".images-00000-abcdef012345.npy.abcdefgh.tmp")


def test_an_older_shardkits_atomic_write_temps_are_temps_and_a_users_lookalikes_are_not() -> None:
    assert {name: name_kind(name) for name in OLD_TEMPS} == dict.fromkeys(OLD_TEMPS, "temp")
    assert not [name for name in LOOKALIKES if name_kind(name) == "temp"]


def test_open_clears_an_older_shardkits_atomic_write_temps_and_keeps_a_users_lookalikes(tmp_path: Path) -> None:
    for name in (*OLD_TEMPS, *LOOKALIKES):
        (tmp_path / name).write_bytes(b"half")
    LocalSink().open(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(LOOKALIKES)


def test_publish_shard_renames_then_records(tmp_path: Path) -> None:
    (tmp_path / f".a{TMP_MARK}x").write_bytes(b"a")
    record = publish_shard(tmp_path, [(f".a{TMP_MARK}x", "a")], _record("k", "a"))
    assert (tmp_path / "a").read_bytes() == b"a" and has_records(tmp_path)
    assert ShardRecord.load(tmp_path, "k") == record and record.stats_on_disk[0] is not None


def test_commit_of_an_unchanged_split_makes_no_new_version_and_keeps_its_files(camvid_val_npy: Path,
                                                                                 tmp_path: Path) -> None:
    split = tmp_path / "val"
    shutil.copytree(camvid_val_npy, split)
    (split / "images-00009-000000000000.npy").write_bytes(b"stale")  # owned, named by no version: removed
    before = sorted(p.name for p in split.iterdir())
    manifest = load_manifest(split)
    records = [r for r in (ShardRecord.load(split, p.name[len(".shard-"):-len(".json")])
                           for p in split.iterdir() if p.name.startswith(".shard-")) if r is not None]
    path, number, new = LocalSink().commit(split, manifest, records, keep_versions=3)
    assert path == split / MANIFEST_NAME and load_manifest(split).version == manifest.version == number and not new
    assert sorted(p.name for p in split.iterdir()) == [n for n in before if n != "images-00009-000000000000.npy"]


@pytest.mark.parametrize("sink", [LocalSink()])
def test_a_local_sink_reports_the_local_manifest(sink: SplitSink, tmp_path: Path) -> None:
    assert sink.location("val", tmp_path / MANIFEST_NAME) == tmp_path / MANIFEST_NAME
