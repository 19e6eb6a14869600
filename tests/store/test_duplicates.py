"""The duplicate report: one bounded line per group, however many groups and copies; claims from forged pixel
hashes are caught by verify."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.store.duplicates import LOGGED_GROUPS, ShardHashes, find_duplicates, group_lines, log_report


def _shard(hashes: np.ndarray, first: int = 0) -> ShardHashes:
    keys = [f"img/{first + i:06d}.png" for i in range(len(hashes))]
    return ShardHashes("train", first, hashes, lambda: keys)


def test_a_group_of_200000_copies_is_one_short_line() -> None:
    """A run of 200,000 identical pairs printed every key on one line (megabytes); now the count and three keys."""
    report = find_duplicates([_shard(np.full((200_000, 16), 7, np.uint8))])
    assert len(report.groups) == 1 and report.extra_copies == 199_999
    lines = group_lines(report)
    assert lines == ["identical images: 200000 copies: train:img/000000.png = train:img/000001.png = "
                     "train:img/000002.png = … (199997 more)"]


def test_many_groups_are_listed_up_to_the_limit_then_counted(caplog: pytest.LogCaptureFixture) -> None:
    hashes = np.repeat(np.arange(1000, dtype=np.uint16), 2).view(np.uint8).reshape(-1, 2)
    report = find_duplicates([_shard(np.pad(hashes, ((0, 0), (0, 14))))])  # 1000 groups of 2 copies
    assert len(report.groups) == 1000
    lines = group_lines(report)
    assert len(lines) == LOGGED_GROUPS + 1 and lines[-1].startswith("… and 980 more group(s) of identical images")
    assert lines[0] == "identical images: 2 copies: train:img/000000.png = train:img/000001.png"
    with caplog.at_level(logging.WARNING, logger="shardkit.store.duplicates"):
        log_report(report)
    assert len(caplog.records) == LOGGED_GROUPS + 1 and sum(len(r.getMessage()) for r in caplog.records) < 4000
    assert all(len(r.copies) <= 3 for r in caplog.records[:-1])  # type: ignore[attr-defined]


def test_forged_pixel_hashes_are_listed_in_one_line_and_verify_flags_them(camvid_val_npy: Path,
                                                                          tmp_path: Path) -> None:
    """Every pixel hash of real CamVid val set equal (sidecar hashes refreshed): ``info --duplicates`` reads the
    claim (25 duplicates) in one bounded line and says where it comes from; ``verify`` recomputes the hashes and
    fails, so the claim does not stand unflagged."""
    from tests.tamper import one_pixel_hash, rewrite_sidecars

    split = Path(shutil.copytree(camvid_val_npy, tmp_path / "val"))
    rewrite_sidecars(split, one_pixel_hash)
    info = CliRunner().invoke(main, ["info", str(split), "--duplicates"])
    assert info.exit_code == 0, info.output
    lines = info.output.splitlines()
    assert lines[0] == "25 duplicate image(s) in 1 group(s) among 26 samples, 0 group(s) across splits"
    assert lines[1].startswith("  identical images: 26 copies: val:val/0016E5_07959.png = ")
    assert lines[1].endswith(" = … (23 more)") and len(lines) == 3 and "shardkit verify" in lines[2]
    verify = CliRunner().invoke(main, ["verify", str(split)])
    assert verify.exit_code == 1 and "pixels column (pixel hash) is 5a5a" in verify.output
