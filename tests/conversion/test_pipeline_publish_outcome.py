"""What a run says about its publish: a full disk right after it (the version is published: exit 5, the file named)
and a new version made of kept shards (an input reverted: "published", not "nothing changed")."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import cv2
import pytest
from click.testing import CliRunner, Result

import shardkit.conversion.fingerprint
import shardkit.conversion.pipeline
import shardkit.store.publish
from shardkit.cli import EXIT_PUBLISHED_WITH_WARNING, main
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
from shardkit.conversion.unchanged import SIGNATURE_NAME
from shardkit.errors import OutputError
from shardkit.store.splitdir import CACHE_NAME
from shardkit.verify import verify_split
from tests.camvid_copy import small_camvid


def cli(raw: Path, out: Path, *more: str) -> Result:
    return CliRunner().invoke(main, ["convert", str(raw), str(out), "--size", "48x64", "--shard-size", "2",
                                     "--workers", "1", *more], catch_exceptions=False)


def full_disk_for(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Writing a file called one of ``names`` fails half-way with ENOSPC inside the real atomic write (as a full
    disk does: the OSError carries no file name)."""
    real = shardkit.store.publish.atomic_write_bytes

    def pieces(data: bytes | Iterable[bytes]) -> Iterator[bytes]:
        yield from [data[:10]] if isinstance(data, bytes) else list(data)[:1]
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def write(path: Path, data: bytes | Iterable[bytes]) -> None:
        real(path, pieces(data) if Path(path).name in names else data)

    for module in (shardkit.store.publish, shardkit.conversion.fingerprint):
        monkeypatch.setattr(module, "atomic_write_bytes", write)


@pytest.fixture()
def raw(camvid_root: Path, tmp_path: Path) -> Path:
    return small_camvid(camvid_root, tmp_path / "raw", 4)


def test_a_full_disk_after_the_publish_says_the_version_is_published_and_names_the_file(
        raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    full_disk_for(monkeypatch, CACHE_NAME)
    res = cli(raw, out)
    assert res.exit_code == EXIT_PUBLISHED_WITH_WARNING == 5, res.output
    lines = [line for line in res.output.splitlines() if "not written" in line]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    assert f"{out / 'val' / CACHE_NAME}: not written (No space left on device); val version 1 is published" \
        in lines[0] and "fix: free disk space" in lines[0]
    assert json.loads((out / "val" / "manifest.json").read_text())["version"] == 1
    assert verify_split(out / "val").ok
    assert not [p for p in (out / "val").iterdir() if ".tmp-" in p.name]
    assert not (out / "val" / CACHE_NAME).exists() and not (out / SIGNATURE_NAME).exists()
    monkeypatch.undo()  # space again: the next run (not the no-op check: no signature) writes both files
    res = cli(raw, out)
    assert res.exit_code == 0, res.output
    assert (out / "val" / CACHE_NAME).is_file() and (out / SIGNATURE_NAME).is_file()


def test_a_full_disk_writing_the_no_op_signature_names_it(raw: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    full_disk_for(monkeypatch, SIGNATURE_NAME)
    res = cli(raw, out)
    assert res.exit_code == 5, res.output
    lines = [line for line in res.output.splitlines() if "not written" in line]
    assert len(lines) == 1 and lines[0].startswith(f"{out / SIGNATURE_NAME}: not written (No space left on device); "
                                                   "val version 1 published"), res.output
    assert not (out / SIGNATURE_NAME).exists() and (out / "val" / CACHE_NAME).is_file()
    assert verify_split(out / "val").ok


def test_a_full_disk_writing_a_manifest_names_it_and_the_splits_published_before(
        camvid_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two splits: the first is published, the second's manifest hits the full disk: exit 1 (not all published),
    one line naming the file and what was published."""
    raw = small_camvid(camvid_root, tmp_path / "raw", 2)
    for sub in ("val", "valannot"):
        (raw / sub.replace("val", "test")).mkdir()
        for p in (raw / sub).iterdir():
            (raw / sub.replace("val", "test") / p.name).write_bytes(p.read_bytes())
    real = shardkit.conversion.pipeline.publish_split

    def second_fails(cfg: ConvertConfig, split: str, *args: Any, **kwargs: Any) -> Any:
        if split == "val":
            full_disk_for(monkeypatch, "manifest-v1.json")
        return real(cfg, split, *args, **kwargs)

    monkeypatch.setattr(shardkit.conversion.pipeline, "publish_split", second_fails)
    cfg = ConvertConfig(raw, tmp_path / "out", size=(48, 64), quiet=True, workers=1)
    with pytest.raises(OutputError) as caught:
        convert(cfg)
    text = str(caught.value)
    assert f"{tmp_path / 'out' / 'val' / 'manifest-v1.json'}: No space left on device: split val not published" \
        in text and "test version 1 published before it" in text, text
    assert (tmp_path / "out" / "test" / "manifest.json").is_file()
    assert not (tmp_path / "out" / "val" / "manifest.json").exists()


def test_a_really_full_disk_right_after_the_publish(raw: Path, small_tmpfs: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A real tmpfs, filled up by a file right after the manifest is published: the real ENOSPC."""
    out = small_tmpfs / "out"
    filler = small_tmpfs / "filler"
    real = shardkit.conversion.pipeline.publish_split

    def then_fill(*args: Any, **kwargs: Any) -> Any:
        done = real(*args, **kwargs)
        with open(filler, "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        return done

    monkeypatch.setattr(shardkit.conversion.pipeline, "publish_split", then_fill)
    res = cli(raw, out)
    assert res.exit_code == 5, res.output
    assert f"{out / 'val' / CACHE_NAME}: not written (No space left on device); val version 1 is published" \
        in res.output
    assert verify_split(out / "val").ok
    filler.unlink()


def test_a_new_version_from_kept_shards_says_it_was_published(camvid_root: Path, tmp_path: Path) -> None:
    """Real CamVid: convert, edit one label, convert, revert it, convert: the third run publishes version 3 from
    version 1's shards; its last line must say so, not "nothing changed"."""
    raw = small_camvid(camvid_root, tmp_path / "raw", 6)
    out = tmp_path / "out"
    label = sorted((raw / "valannot").iterdir())[2]
    original = label.read_bytes()
    assert cli(raw, out).exit_code == 0
    pixels = cv2.imread(str(label), cv2.IMREAD_UNCHANGED)
    pixels[:4, :4] = (int(pixels[0, 0]) + 1) % 11
    cv2.imwrite(str(label), pixels)
    second = cli(raw, out)
    assert second.exit_code == 0 and "val: published version 2" in second.output, second.output
    label.write_bytes(original)  # the edit is undone
    third = cli(raw, out)
    assert third.exit_code == 0, third.output
    last = third.output.strip().splitlines()[-1]
    assert "nothing changed" not in third.output, third.output
    assert last.startswith("published val version 3 from 3 shards kept from earlier runs (none written)"), last
    assert json.loads((out / "val" / "manifest.json").read_text())["version"] == 3
    cv2.imwrite(str(label), pixels)
    assert cli(raw, out).exit_code == 0  # version 4: the edit again (version 2's shards)
    label.write_bytes(original)
    fifth = cli(raw, out, "--log-format", "json")  # version 5, from version 3's (= 1's) shards
    summary = json.loads(fifth.stderr.strip().splitlines()[-1])
    assert summary["event"] == "summary" and summary["published"] == {"val": 5}, summary
    assert summary["message"].startswith("published val version 5 from 3 shards kept"), summary
    fourth = cli(raw, out)  # and now nothing changed indeed
    assert fourth.exit_code == 0 and "nothing changed" in fourth.output.strip().splitlines()[-1]
