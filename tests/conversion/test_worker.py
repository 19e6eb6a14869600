"""The worker: decode, fit, encode and write one shard under temp names; skip or fail per --on-error."""

from __future__ import annotations

import hashlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from shardkit.conversion.layouts import SamplePair
from shardkit.conversion.plan import ShardTask
from shardkit.conversion.worker import WorkerContext, convert_shard, process_sample
from shardkit.errors import DecodeError
from shardkit.files.splitfiles import TMP_MARK
from shardkit.formats.base import SampleSpec
from shardkit.labels import ClassInfo, ClassTable, LabelDecoder

F1, F2 = "f1" * 32, "f2" * 32  # sample fingerprints (64 hex digits)
PRINTS = np.frombuffer(bytes.fromhex(F1 + F2), np.uint8).reshape(2, 32)  # as a task carries them

RNG = np.random.default_rng(3)
TABLE = ClassTable(tuple(ClassInfo(i, f"c{i}") for i in range(4)), 255)


def pair(root: Path, name: str, hw: tuple[int, int]) -> SamplePair:
    image, label = root / f"{name}.png", root / f"{name}_L.png"
    cv2.imwrite(str(image), RNG.integers(0, 256, (*hw, 3), dtype=np.uint8))
    cv2.imwrite(str(label), RNG.integers(0, 4, hw, dtype=np.uint8))
    return SamplePair(f"{name}.png", image, label)


def context(root: Path, *, size: tuple[int, int] | None = (8, 8), encoding: str = "index",
            on_error: str = "fail") -> WorkerContext:
    spec = SampleSpec(size, encoding, TABLE.num_classes, "|u1")
    return WorkerContext("npy", spec, LabelDecoder("ids", TABLE), root, size, "none", "center", "none", on_error)


def test_a_sample_is_fitted_encoded_and_its_padding_reported(tmp_path: Path) -> None:
    p = pair(tmp_path, "a", (6, 10))
    image, stored, ids, padded = process_sample(p, context(tmp_path, encoding="onehot"))
    assert image.shape == (8, 8, 3) and ids.shape == (8, 8) and stored.shape == (8, 8, 4)
    assert padded  # 6 rows < 8: padded with the ignore id
    assert (ids[0] == 255).all() and not stored[0].any()  # ignore pixels have no class set
    source = cv2.imread(str(p.label), cv2.IMREAD_UNCHANGED)
    assert np.array_equal(ids[1:7], source[:, 1:9])  # centre crop of columns, rows kept exactly
    assert not process_sample(pair(tmp_path, "b", (9, 9)), context(tmp_path))[3]


def test_a_shard_is_written_under_temp_names_with_its_records(tmp_path: Path) -> None:
    pairs = (pair(tmp_path, "a", (8, 8)), pair(tmp_path, "b", (8, 8)))
    out = tmp_path / "out"
    out.mkdir()
    task = ShardTask("train", 0, "k" * 64, out, pairs, PRINTS)
    ticks: list[int] = []
    result = convert_shard(task, context(tmp_path), lambda: ticks.append(1))
    assert len(ticks) == 2 and result.skipped == [] and result.padded == 0
    assert result.num_samples == 2 and result.files[-1].final_name == "samples-00000-kkkkkkkkkkkk.npy"
    rows = np.load(out / result.files[-1].tmp_name, allow_pickle=False)  # the sidecar, as the spec reads it
    assert rows["key"].tolist() == [b"a.png", b"b.png"] and rows["label"].tolist() == [b"a_L.png", b"b_L.png"]
    assert [bytes(f).hex() for f in rows["fingerprint"]] == [F1, F2]
    assert rows["height"].tolist() == rows["width"].tolist() == [8, 8]
    assert result.fingerprint == hashlib.sha256(bytes.fromhex(F1 + F2)).hexdigest()
    assert all(TMP_MARK in p.name for p in out.iterdir())  # the parent publishes them
    assert sorted(f.tmp_name for f in result.files) == sorted(p.name for p in out.iterdir())
    assert sum(result.stats["class_pixels"]) == 2 * 64


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_a_broken_input_fails_the_shard_or_is_skipped(tmp_path: Path, on_error: str) -> None:
    good, bad = pair(tmp_path, "a", (8, 8)), pair(tmp_path, "b", (8, 8))
    bad.image.write_bytes(b"\x89PNG\r\n\x1a\n broken")
    out = tmp_path / "out"
    out.mkdir()
    task = ShardTask("train", 0, "k" * 64, out, (good, bad), PRINTS)
    if on_error == "fail":
        with pytest.raises(DecodeError, match=r"b\.png"):
            convert_shard(task, context(tmp_path, on_error=on_error))
        assert list(out.iterdir()) == []  # the aborted shard left no temp file
    else:
        result = convert_shard(task, context(tmp_path, on_error=on_error))
        rows = np.load(out / result.files[-1].tmp_name, allow_pickle=False)
        assert result.num_samples == 1 and rows["key"].tolist() == [b"a.png"]
        assert [s["key"] for s in result.skipped] == ["b.png"] and "cannot decode" in result.skipped[0]["reason"]


def test_the_worker_context_takes_each_option_of_the_same_name_from_the_config(tmp_path: Path) -> None:
    from shardkit.conversion.config import ConvertConfig

    cfg = ConvertConfig(tmp_path, tmp_path / "out", format="hdf5", size="8x8", resize="exact", crop="none",
                        on_error="skip", max_pixels=1000, image_codec="zstd")
    spec = SampleSpec((8, 8), "index", 3, "|u1")
    ctx = WorkerContext.from_config(cfg, spec=spec, decoder=LabelDecoder("ids", TABLE), root=tmp_path,
                                    settings="{}")
    assert (ctx.format, ctx.size, ctx.resize, ctx.crop, ctx.compression, ctx.on_error, ctx.max_pixels) == (
        "hdf5", (8, 8), "exact", "none", "none", "skip", 1000)
    assert ctx.codecs == cfg.codecs and str(ctx.codecs.image) == "zstd" and ctx.spec is spec
    assert ctx.settings == "{}" and ctx.sync_files and ctx.source is None and ctx.drop == ()
