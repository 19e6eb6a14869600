"""scripts/byte_identity.py (#25 item 7): what it compares, what it leaves out, and one real run on a tiny input."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("byte_identity", ROOT / "scripts" / "byte_identity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["byte_identity"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def split_folder(root: Path) -> Path:
    """A small output folder with every kind of file the script treats specially."""
    split = root / "train"
    split.mkdir(parents=True)
    (root / ".shardkit.lock").write_text('{"host": "a", "pid": 1}')
    np.save(split / "images-00000.npy", np.arange(12, dtype=np.uint8).reshape(2, 2, 3))
    rows = np.zeros(2, dtype=[("height", "<u4"), ("key", "|S4")])
    np.save(split / "samples-00000.npy", rows)
    record = {"key": "k", "files": [{"name": "images-00000.npy", "bytes": 140, "sha256": "ab", "stat": [1, 2, 3, 4]}]}
    (split / ".shard-k.json").write_text(json.dumps(record))
    (split / ".fingerprints.json").write_text(json.dumps({"/in/a.png": [10, 111, 222, 333, "ab"]}))
    manifest = {"manifest_version": 3, "shards": [{"samples": {"sha256": "cd"}, "files": [{"name": "x"}]}]}
    (split / "manifest.json").write_text(json.dumps(manifest))
    return split


def test_identical_outputs_differ_only_in_the_fields_it_names(tmp_path: Path) -> None:
    bi = script()
    a, b = split_folder(tmp_path / "a"), split_folder(tmp_path / "b")
    (tmp_path / "b" / ".shardkit.lock").write_text('{"host": "b", "pid": 2}')  # another process wrote it
    rec = json.loads((b / ".shard-k.json").read_text())
    rec["files"][0]["stat"] = [1, 9, 9, 9]  # another mtime, ctime, inode
    (b / ".shard-k.json").write_text(json.dumps(rec))
    (b / ".fingerprints.json").write_text(json.dumps({"/in/a.png": [10, 112, 999, 334, "ab"]}))  # touched input
    diffs, files, _ = bi.compare(a.parent, b.parent)
    assert diffs == [] and files == 6


def test_every_other_difference_is_reported_with_where_it_is(tmp_path: Path) -> None:
    bi = script()
    a, b = split_folder(tmp_path / "a"), split_folder(tmp_path / "b")
    rec = json.loads((b / ".shard-k.json").read_text())
    rec["files"][0]["sha256"] = "ef"
    (b / ".shard-k.json").write_text(json.dumps(rec))
    m = json.loads((b / "manifest.json").read_text())
    m["shards"][0]["samples"]["sha256"], m["manifest_version"] = "00", 4
    (b / "manifest.json").write_text(json.dumps(m))
    np.save(b / "samples-00000.npy", np.zeros(2, dtype=[("height", "<u4"), ("pixels", "|u1", (4,)), ("key", "|S4")]))
    image = np.load(b / "images-00000.npy")
    image[1, 1, 2] ^= 1
    np.save(b / "images-00000.npy", image)
    (b / "manifest-v1.json").write_text("{}")
    (b / ".fingerprints.json").write_text(json.dumps({"/in/a.png": [10, 111, 222, 333, "cd"]}))  # other content
    found = {d.path: d for d in bi.compare(a.parent, b.parent)[0]}
    assert set(found) == {"train/.shard-k.json", "train/manifest.json", "train/samples-00000.npy",
                          "train/images-00000.npy", "train/manifest-v1.json", "train/.fingerprints.json"}
    assert '"ab" -> "cd"' in found["train/.fingerprints.json"].detail
    assert found["train/manifest-v1.json"].kind == "only-new"
    assert "files[0].sha256" in found["train/.shard-k.json"].detail
    assert "manifest_version: 3 -> 4" in found["train/manifest.json"].detail
    assert "shards[0].samples.sha256" in found["train/manifest.json"].detail
    assert "columns only in new: ['pixels']" in found["train/samples-00000.npy"].detail
    assert "values differ" in found["train/images-00000.npy"].detail
    assert all(d.counts for d in found.values())


def test_a_real_run_on_a_tiny_input_is_identical() -> None:
    """The script end to end: this tree against itself, one format, the small real dataset (two converts)."""
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "byte_identity.py"), "worktree", "worktree",
                          "--inputs", "rgb", "--formats", "npy", "--no-variants", "--no-control"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "| rgb/npy/none/raw/raw | 0/0 |" in res.stdout and "identical" in res.stdout
    assert "1 of 1 cases wrote identical output" in res.stdout, res.stdout


def test_the_unchanged_run_signature_is_not_compared(tmp_path: Path) -> None:
    bi = script()
    a, b = split_folder(tmp_path / "a"), split_folder(tmp_path / "b")
    (b.parent / ".shardkit-unchanged.json").write_text('{"tree": "run state"}')  # an older revision writes none
    diffs, files, _ = bi.compare(a.parent, b.parent)
    assert diffs == [] and files == 6
