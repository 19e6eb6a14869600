"""The byte source of a split: one manifest parse per open, holds that keep files while held and give them back,
one download-then-verify (a ``file://`` URL stands in for object storage: the same fsspec path as ``s3://``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import shardkit.store.manifest
from shardkit.errors import IntegrityError
from shardkit.store.publish import LEASE_PREFIX
from shardkit.store.source import LocalBytes, RemoteBytes, TempFiles, open_bytes


@pytest.fixture
def split(camvid_val_npy: Path, tmp_path: Path) -> Path:
    """A writable copy of the CamVid val npy split (two shards), without the reader leases other tests of this
    process hold on the shared split (a lease is a file in the split folder)."""
    return Path(shutil.copytree(camvid_val_npy, tmp_path / "val", ignore=shutil.ignore_patterns(f"{LEASE_PREFIX}*")))


def _leases(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(LEASE_PREFIX)]


@pytest.mark.parametrize("remote", [False, True])
def test_an_open_parses_the_manifest_once(split: Path, remote: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    parse = shardkit.store.manifest.parse_manifest_bytes
    calls: list[object] = []
    monkeypatch.setattr(shardkit.store.manifest, "parse_manifest_bytes",
                        lambda raw, path: calls.append(path) or parse(raw, path))
    with open_bytes(f"file://{split}" if remote else split, lease=False) as source:
        assert isinstance(source, RemoteBytes if remote else LocalBytes)
        assert len(calls) == 1 and source.manifest.num_samples == 26
        assert source.manifest.samples.keys(1)[0].startswith("val/")  # records read without parsing it again
    assert len(calls) == 1


def test_a_local_source_leases_its_version_until_closed(split: Path) -> None:
    source = open_bytes(split)
    assert source.manifest.version == 1 and _leases(split) and _leases(split)[0].startswith(f"{LEASE_PREFIX}1-")
    source.close()
    assert not _leases(split)
    with open_bytes(split, lease=False):  # verify, diff's listing, info: read without a lease
        assert not _leases(split)


def test_a_remote_hold_keeps_its_verified_copy_until_closed_then_deletes_it(split: Path) -> None:
    source = open_bytes(f"file://{split}")
    assert isinstance(source.files, TempFiles) and not source.files.directory.exists()  # the manifest alone: no disk
    shard = source.manifest.shards[1]
    with source.hold(shard) as held:
        names = sorted(p.name for p in held.folder.iterdir())
        assert names == sorted(f.name for f in shard.all_files)
        assert all((held.folder / f.name).read_bytes() == (split / f.name).read_bytes() for f in shard.all_files)
    assert not held.folder.exists() and not held.open
    with source.sidecar(shard) as folder:  # the sidecar alone, never the shard's data
        assert [p.name for p in folder.iterdir()] == [shard.samples.name]  # type: ignore[union-attr]
    assert not folder.exists()
    assert source.manifest.samples.keys(0)[0].startswith("val/")  # records: the sidecar held while read, then gone
    assert not [p for p in source.files.directory.rglob("*") if p.is_file()]
    source.close()
    assert not source.files.directory.exists()


def test_a_changed_object_is_refused_before_it_gets_its_name(split: Path) -> None:
    source = open_bytes(f"file://{split}")
    shard = source.manifest.shards[0]
    data = bytearray((split / shard.files[0].name).read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes
    (split / shard.files[0].name).write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="sha256"):
        source.hold(shard)
    assert source.files is not None and not [p for p in source.files.directory.rglob("*") if p.is_file()]
    source.close()
