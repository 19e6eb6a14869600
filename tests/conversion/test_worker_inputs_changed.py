"""Inputs that change while a conversion runs: each worker checks a file against its identity at plan time after
reading it, so a version never mixes old and new inputs (issue #36: 6 of 8 edited labels old, 2 new, exit 0)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import pytest

import shardkit.conversion.pipeline
import shardkit.conversion.worker
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import InputChangedError
from shardkit.verify import published_digests, verify_split
from tests.camvid_copy import small_camvid


def rewrite_keeping_size_and_mtime(path: Path) -> None:
    """Edit a label PNG's pixels in place, then restore its size and mtime (``touch -r``): only its ctime (and
    content) tell; the size is kept by padding after IEND."""
    before = path.stat()
    label = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    label[:4, :4] = (int(label[0, 0]) + 1) % 11
    data = cv2.imencode(".png", label, [cv2.IMWRITE_PNG_COMPRESSION, 9])[1].tobytes()
    assert len(data) <= before.st_size
    time.sleep(0.01)  # a ctime of its own
    path.write_bytes(data + b"\0" * (before.st_size - len(data)))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)


def before_the_workers_run(monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]) -> None:
    """Run ``action`` once the plan is made (the inputs' identities taken) and before the workers start: the
    files change between plan and read, as a writer racing the conversion does."""
    real = shardkit.conversion.pipeline.run_tasks

    def act_then_run(*args: Any, **kwargs: Any) -> Any:
        action()
        return real(*args, **kwargs)

    monkeypatch.setattr(shardkit.conversion.pipeline, "run_tasks", act_then_run)


def after_reading(monkeypatch: pytest.MonkeyPatch, name: str, action: Callable[[], None]) -> None:
    """Run ``action`` once, right after the worker (in this process: one worker, npy) has read and decoded the
    pair whose image is ``name``: the file changes after its read, as a writer racing the conversion does."""
    real = shardkit.conversion.worker.process_sample

    def hooked(pair: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(pair, *args, **kwargs)
        if pair.image.name == name:
            action()
        return out

    monkeypatch.setattr(shardkit.conversion.worker, "process_sample", hooked)


@pytest.fixture()
def raw(camvid_root: Path, tmp_path: Path) -> Path:
    return small_camvid(camvid_root, tmp_path / "raw", 6)


def config(raw: Path, out: Path, **kw: Any) -> ConvertConfig:
    return ConvertConfig(raw, out, format="npy", shard_size=ShardSize(samples=2), quiet=True, workers=1, **kw)


def names(raw: Path) -> list[str]:
    return sorted(p.name for p in (raw / "val").iterdir())


def test_a_label_rewritten_after_its_read_fails_the_first_run_before_publish(raw: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A first conversion (the workers hash the files): the third label is rewritten with its size and mtime
    restored right after the worker read it; the run fails naming it, and no manifest is written."""
    name = names(raw)[2]
    label = raw / "valannot" / name
    after_reading(monkeypatch, name, lambda: rewrite_keeping_size_and_mtime(label))
    with pytest.raises(InputChangedError) as caught:
        convert(config(raw, tmp_path / "out"))
    text = str(caught.value)
    assert str(label) in text and "changed while the conversion ran" in text
    assert "re-run when the input is stable" in text and "\n" not in text
    assert not (tmp_path / "out" / "val" / "manifest.json").exists()
    monkeypatch.undo()  # the input is stable now: the re-run publishes the edited label, equal to a fresh run
    convert(config(raw, tmp_path / "out"))
    convert(config(raw, tmp_path / "fresh"))
    assert published_digests(tmp_path / "out" / "val") == published_digests(tmp_path / "fresh" / "val")


def test_an_input_changed_between_plan_and_read_fails_an_incremental_run(raw: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An incremental run (the parent fingerprints the files, the workers read them again later): a label edited
    after the plan, before its worker reads it, would be stored under the old content's fingerprint."""
    out = tmp_path / "out"
    convert(config(raw, out))
    first = (out / "val" / "manifest.json").read_bytes()
    image = raw / "val" / names(raw)[4]
    pixels = cv2.imread(str(image))
    pixels[:4, :4] = 0
    cv2.imwrite(str(image), pixels)  # a new image: its shard is written again, the others reused
    label = raw / "valannot" / names(raw)[4]
    before_the_workers_run(monkeypatch, lambda: rewrite_keeping_size_and_mtime(label))
    with pytest.raises(InputChangedError, match=str(label)):
        convert(config(raw, out))
    assert (out / "val" / "manifest.json").read_bytes() == first, "the previous version stays the current one"
    assert verify_split(out / "val").ok


def test_on_error_skip_leaves_the_changed_sample_out_and_the_next_run_puts_it_back(
        raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = names(raw)[3]
    label = raw / "valannot" / name
    after_reading(monkeypatch, name, lambda: rewrite_keeping_size_and_mtime(label))
    out = tmp_path / "out"
    summary = convert(config(raw, out, on_error="skip"))
    assert [s["key"] for s in summary.failed] == [f"val/{name}"]
    assert "changed while the conversion ran" in summary.failed[0]["reason"]
    manifest = json.loads((out / "val" / "manifest.json").read_text())
    assert manifest["num_samples"] == 5 and [s["key"] for s in manifest["skipped"]] == [f"val/{name}"]
    assert verify_split(out / "val").ok
    monkeypatch.undo()
    again = convert(config(raw, out, on_error="skip"))
    assert not again.failed and again.samples == 6, "the shard that left it out is not reused"
    assert again.reused == again.shards - 1
    convert(config(raw, tmp_path / "fresh", on_error="skip"))
    assert published_digests(out / "val") == published_digests(tmp_path / "fresh" / "val")


def test_a_removed_input_is_caught_after_the_read_too(raw: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    name = names(raw)[1]
    label = raw / "valannot" / name
    after_reading(monkeypatch, name, label.unlink)
    with pytest.raises(InputChangedError, match="changed while the conversion ran"):
        convert(config(raw, tmp_path / "out"))
    assert not (tmp_path / "out" / "val" / "manifest.json").exists()


def test_tiled_sources_are_checked_before_their_tiles_are_written(raw: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    name = names(raw)[0]
    label = raw / "valannot" / name
    real = shardkit.conversion.worker.decode_pair

    def hooked(pair: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(pair, *args, **kwargs)
        if pair.image.name == name:
            rewrite_keeping_size_and_mtime(label)
        return out

    monkeypatch.setattr(shardkit.conversion.worker, "decode_pair", hooked)
    with pytest.raises(InputChangedError, match=str(label)):
        convert(config(raw, tmp_path / "out", tile="128x128"))


def test_a_skipped_sample_is_not_kept_out_by_reusing_its_shard_when_the_bytes_come_back(
        raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An incremental run whose shard key the parent planned from the files' fingerprints: a label rewritten with
    the same bytes (a sync tool) after its read is left out; the next run, whose fingerprints equal the planned
    ones, must write that shard again rather than reuse the one that lacks the sample."""
    out = tmp_path / "out"
    convert(config(raw, out, on_error="skip"))
    image, label = raw / "val" / names(raw)[2], raw / "valannot" / names(raw)[2]
    pixels = cv2.imread(str(image))
    pixels[:4, :4] = 0
    cv2.imwrite(str(image), pixels)  # its shard is written again in the next run
    after_reading(monkeypatch, image.name, lambda: (time.sleep(0.01), label.write_bytes(label.read_bytes())))
    summary = convert(config(raw, out, on_error="skip"))
    assert [s["key"] for s in summary.failed] == [f"val/{image.name}"]
    monkeypatch.undo()
    again = convert(config(raw, out, on_error="skip"))
    assert not again.failed and again.samples == 6
    convert(config(raw, tmp_path / "fresh", on_error="skip"))
    assert published_digests(out / "val") == published_digests(tmp_path / "fresh" / "val")


@pytest.mark.parametrize("first", [True, False], ids=["first-run", "incremental"])
def test_worker_processes_check_what_the_parent_planned(raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        first: bool) -> None:
    """Two worker processes (loky): the identities travel with the tasks. A label is edited (size and mtime
    restored) after the plan, before any worker starts: on a first run the workers hash what they read, so only
    the planned identity can tell; on an incremental run the parent's fingerprint is the old content's."""
    out = tmp_path / "out"
    if not first:
        convert(config(raw, out).replace(workers=2))
        image = raw / "val" / names(raw)[5]
        pixels = cv2.imread(str(image))
        pixels[:4, :4] = 0
        cv2.imwrite(str(image), pixels)
    label = raw / "valannot" / names(raw)[5]
    before_the_workers_run(monkeypatch, lambda: rewrite_keeping_size_and_mtime(label))
    with pytest.raises(InputChangedError, match=str(label)):
        convert(config(raw, out).replace(workers=2))
    assert (out / "val" / "manifest.json").exists() != first
