"""shardkit diff: samples added, removed and changed between two kept versions of a split."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import pytest
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.diff import diff_split
from shardkit.errors import InputNotFoundError


@pytest.fixture()
def two_versions(camvid_root: Path, tmp_path: Path) -> tuple[Path, list[str]]:
    """Version 1 of 6 CamVid samples; version 2 with sample 1 edited, sample 4 removed and a 7th added."""
    names = sorted(p.name for p in (camvid_root / "val").iterdir())[:7]
    raw = tmp_path / "raw"
    for sub in ("val", "valannot"):
        (raw / sub).mkdir(parents=True)
        for name in names[:6]:
            (raw / sub / name).write_bytes((camvid_root / sub / name).read_bytes())
    cfg = ConvertConfig(raw, tmp_path / "out", shard_size=ShardSize(samples=2), workers=1, quiet=True)
    convert(cfg)
    image = cv2.imread(str(raw / "val" / names[1]))
    image[:8, :8] = 0
    cv2.imwrite(str(raw / "val" / names[1]), image)
    for sub in ("val", "valannot"):
        (raw / sub / names[4]).unlink()
        (raw / sub / names[6]).write_bytes((camvid_root / sub / names[6]).read_bytes())
    convert(cfg)
    convert(cfg)  # nothing changed: no version 3
    return tmp_path / "out", [f"val/{n}" for n in names]


def test_diff_lists_added_removed_and_changed_keys_with_fingerprints(two_versions: tuple[Path, list[str]]) -> None:
    out, keys = two_versions
    d = diff_split(out / "val")  # default: the current version against the one before
    assert (d.old, d.new) == (1, 2)
    assert [k for k, _ in d.added] == [keys[6]]
    assert [k for k, _ in d.removed] == [keys[4]]
    assert [k for k, _, _ in d.changed] == [keys[1]]
    _, before, after = d.changed[0]
    assert before != after and len(before) == len(after) == 64
    assert d.unchanged == 4
    same = diff_split(out / "val", 2, 2)
    assert not (same.added or same.removed or same.changed) and same.unchanged == 6


def test_diff_cli_text_and_json(two_versions: tuple[Path, list[str]]) -> None:
    out, keys = two_versions
    text = CliRunner().invoke(main, ["diff", str(out), "--from", "1", "--to", "2"])
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert lines[0] == "val: version 1 → 2: 1 added, 1 removed, 1 changed, 4 unchanged"
    assert lines[1].startswith(f"  + {keys[6]}  ") and lines[2].startswith(f"  - {keys[4]}  ")
    assert lines[3].startswith(f"  ~ {keys[1]}  ")
    js = CliRunner().invoke(main, ["diff", str(out / "val"), "--json"])
    report = json.loads(js.output)["splits"][0]
    assert (report["from"], report["to"], report["unchanged"]) == (1, 2, 4)
    assert [c["key"] for c in report["changed"]] == [keys[1]] and len(report["changed"][0]["to"]) == 64


def test_diff_of_a_version_that_is_not_kept_is_one_line(two_versions: tuple[Path, list[str]]) -> None:
    out, _ = two_versions
    with pytest.raises(InputNotFoundError, match=r"version 3 is not kept \(kept: 1, 2\)"):
        diff_split(out / "val", 1, 3)
    res = CliRunner().invoke(main, ["diff", str(out), "--from", "7"])
    assert res.exit_code == 1 and "version 7 is not kept" in res.output and "Traceback" not in res.output


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["fifo", "deep"])
def test_a_kept_manifest_that_is_a_fifo_or_deep_json_is_one_line_and_convert_does_not_hang(
        two_versions: tuple[Path, list[str]], damage: str) -> None:
    """``manifest-v1.json`` replaced by a FIFO (reclaim read it while holding the output lock: convert hung) or by
    100,000-deep JSON: diff names the file and the problem in one line (not "version 1 is not kept (kept: 1,
    2)"), and the next convert that publishes retires it without hanging."""
    import os

    out, _ = two_versions
    kept = out / "val" / "manifest-v1.json"
    kept.unlink()
    if damage == "fifo":
        os.mkfifo(kept)
    else:
        kept.write_text("[" * 100_000 + "]" * 100_000)
    res = CliRunner().invoke(main, ["diff", str(out), "--from", "1", "--to", "2"])
    line = res.output.strip()
    assert res.exit_code == 1 and "Traceback" not in res.output and len(line.splitlines()) == 1, res.output
    assert "manifest-v1.json" in line and "not kept" not in line
    assert ("not a regular file" if damage == "fifo" else "nests more than") in line
    raw = out.parent / "raw"
    (raw / "val" / sorted((raw / "val").iterdir())[0].name).unlink()  # a new publish: version 3
    (raw / "valannot" / sorted((raw / "valannot").iterdir())[0].name).unlink()
    res = CliRunner().invoke(main, ["convert", str(raw), str(out), "--shard-size", "2", "--workers", "1",
                                    "--keep-versions", "3"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "val" / "manifest.json").read_text())["version"] == 3
