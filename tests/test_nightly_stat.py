"""No-op nightly re-runs read no shard bytes: shards are reused by their recorded (size, mtime_ns, ctime_ns, inode).

What a stat can see (any write through the file system moves ctime; a replaced file has a new inode) is
caught without reading; what it cannot (bit rot, a raw-device write) is caught by ``--rehash`` and ``verify``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardkit.store.records
from shardkit.cli import main
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.store.records import RECORD_PREFIX, file_stat
from shardkit.verify import published_digests, verify_split

from .test_nightly import copy_split


def rchar() -> int:
    """Bytes this process read through read() calls so far (page cache or disk)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


class HashCounter:
    """Stands in for ``records.sha256_file``: counts the shard files hashed, then hashes them."""

    def __init__(self) -> None:
        self.paths: list[Path] = []
        self.real = shardkit.store.records.sha256_file

    def __call__(self, path: Path) -> str:
        self.paths.append(Path(path))
        return self.real(path)


@pytest.fixture()
def hashes(monkeypatch: pytest.MonkeyPatch) -> HashCounter:
    counter = HashCounter()
    monkeypatch.setattr(shardkit.store.records, "sha256_file", counter)
    return counter


@pytest.fixture()
def small(camvid_root: Path, tmp_path: Path) -> ConvertConfig:
    raw = tmp_path / "raw"
    copy_split(camvid_root, raw, n=12)
    cfg = ConvertConfig(raw, tmp_path / "out", size=(352, 480), shard_size=ShardSize(samples=4), quiet=True,
                        workers=1)
    convert(cfg)
    return cfg


def records(cfg: ConvertConfig) -> list[Path]:
    return sorted((cfg.output / "val").glob(f"{RECORD_PREFIX}*.json"))


def published(cfg: ConvertConfig) -> list[Path]:
    """Every shard file the manifest names (samples sidecars included)."""
    manifest = json.loads((cfg.output / "val" / "manifest.json").read_text())
    return sorted(cfg.output / "val" / f["name"] for s in manifest["shards"] for f in [*s["files"], s["samples"]])


def flip_a_byte(path: Path) -> None:
    """Change one pixel byte in place, then put size and mtime back (``touch -r``): only ctime tells."""
    before = path.stat()
    with path.open("r+b") as fh:
        fh.seek(before.st_size // 2)
        b = fh.read(1)
        fh.seek(before.st_size // 2)
        fh.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_records_hold_the_stat_of_every_published_file(small: ConvertConfig) -> None:
    for rec in records(small):
        for f in json.loads(rec.read_text())["files"]:
            assert f["stat"] == list(file_stat(small.output / "val" / f["name"]))


def test_unchanged_rerun_hashes_no_shard_file(small: ConvertConfig, hashes: HashCounter) -> None:
    again = convert(small)
    assert again.reused == again.shards == 3
    assert hashes.paths == [], "an unchanged shard was hashed"


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="/proc/self/io is Linux-only")
def test_unchanged_rerun_reads_fewer_bytes_than_one_shard_file(small: ConvertConfig) -> None:
    smallest = min(p.stat().st_size for p in published(small) if p.name.startswith("images-"))
    before = rchar()
    again = convert(small)
    read = rchar() - before
    assert again.reused == again.shards
    assert read < smallest, f"a no-op re-run read {read} bytes; one image shard file is {smallest}"


def test_a_shard_edited_in_place_is_seen_by_its_stat_and_rewritten(small: ConvertConfig, tmp_path: Path) -> None:
    target = published(small)[0]
    flip_a_byte(target)
    again = convert(small)
    assert again.shards - again.reused == 1, "exactly the edited shard is rewritten"
    assert verify_split(small.output / "val").ok
    convert(small.replace(output=tmp_path / "fresh"))
    assert published_digests(small.output / "val") == published_digests(tmp_path / "fresh" / "val")


def test_a_replaced_shard_file_is_seen_by_its_inode(small: ConvertConfig, hashes: HashCounter) -> None:
    target = published(small)[1]
    copy = target.with_name(".copy")
    copy.write_bytes(target.read_bytes())
    st = target.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(copy, target)  # same bytes, same size and mtime, new inode: hashed, found intact, reused
    again = convert(small)
    assert again.reused == again.shards
    assert hashes.paths == [target]
    hashes.paths.clear()
    convert(small)
    assert hashes.paths == [], "the re-hashed file's new stat was recorded"


def test_rehash_catches_a_change_the_stat_cannot_see(small: ConvertConfig, tmp_path: Path) -> None:
    """Bit rot or a raw-device write leaves the stat alone; simulated by recording the stat after the edit."""
    target = published(small)[2]
    flip_a_byte(target)
    for rec in records(small):
        data = json.loads(rec.read_text())
        for f in data["files"]:
            if f["name"] == target.name:
                f["stat"] = list(file_stat(target))
        rec.write_text(json.dumps(data))
    quick = convert(small)
    assert quick.reused == quick.shards, "by design the default re-run trusts an unchanged stat"
    assert not verify_split(small.output / "val").ok, "verify hashes every file"
    full = convert(small.replace(rehash=True))
    assert full.shards - full.reused == 1
    assert verify_split(small.output / "val").ok
    convert(small.replace(output=tmp_path / "fresh"))
    assert published_digests(small.output / "val") == published_digests(tmp_path / "fresh" / "val")


def test_rehash_hashes_every_shard_file_and_finds_them_intact(small: ConvertConfig, hashes: HashCounter) -> None:
    full = convert(small.replace(rehash=True))
    assert full.reused == full.shards
    assert sorted(hashes.paths) == published(small)


def test_records_without_stats_are_hashed_once_then_trusted(small: ConvertConfig, hashes: HashCounter) -> None:
    """Records written before stats were kept: the first run hashes (and records stats), the next reads nothing."""
    for rec in records(small):
        data = json.loads(rec.read_text())
        for f in data["files"]:
            del f["stat"]
        rec.write_text(json.dumps(data))
    first = convert(small)
    assert first.reused == first.shards and sorted(hashes.paths) == published(small)
    hashes.paths.clear()
    convert(small)
    assert hashes.paths == []


@pytest.mark.parametrize("how", ["flag", "env", "toml"])
def test_rehash_is_an_option_of_the_command_line_its_environment_and_config_file(
    small: ConvertConfig, hashes: HashCounter, how: str, tmp_path: Path
) -> None:
    args = ["convert", str(small.input), str(small.output), "--size", "352x480", "--shard-size", "4",
            "--workers", "1", "-q"]
    env = {}
    if how == "flag":
        args.append("--rehash")
    elif how == "env":
        env["SHARDKIT_REHASH"] = "1"
    else:
        (tmp_path / "c.toml").write_text("[convert]\nrehash = true\n")
        args += ["--config", str(tmp_path / "c.toml")]
    res = CliRunner().invoke(main, args, env=env, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert sorted(hashes.paths) == published(small)


def test_without_rehash_the_command_hashes_nothing(small: ConvertConfig, hashes: HashCounter) -> None:
    res = CliRunner().invoke(main, ["convert", str(small.input), str(small.output), "--size", "352x480",
                                    "--shard-size", "4", "--workers", "1", "-q"], catch_exceptions=False)
    assert res.exit_code == 0 and hashes.paths == []




def test_content_digest_ignores_only_the_recorded_stats(small: ConvertConfig, tmp_path: Path) -> None:
    """Two conversions of the same input agree on their records except the stats of their own file copies."""
    from shardkit.store.records import content_digest

    rec = records(small)[0]
    data = json.loads(rec.read_text())
    other = tmp_path / rec.name
    for f in data["files"]:
        f["stat"] = [f["stat"][0], 1, 2, 3]
    other.write_text(json.dumps(data))
    assert content_digest(other) == content_digest(rec)
    data["files"][0]["sha256"] = "0" * 64
    other.write_text(json.dumps(data))
    assert content_digest(other) != content_digest(rec)
