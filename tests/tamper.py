"""What an attacker (or a buggy tool) does to a converted split: change its samples sidecars' columns and refresh
every hash the manifest keeps of them, so that byte-level verification (sizes, sha256) still passes.

Only the derived columns are changed (class bitmaps, pixel hashes); the fingerprints stay as they were, so the
split's ``source.fingerprint`` also still agrees."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from shardkit.store.manifest import MANIFEST_NAME


def rewrite_sidecars(split: Path, change: Callable[[np.ndarray], None]) -> None:
    """Apply ``change`` to a writable copy of every shard's sidecar rows, write them back and put their new size
    and sha256 into ``manifest.json`` and the published ``manifest-vN.json`` it is a copy of."""
    path = split / MANIFEST_NAME
    m = json.loads(path.read_text())
    for shard in m["shards"]:
        entry = shard["samples"]
        rows = np.load(split / entry["name"], allow_pickle=False).copy()
        change(rows)
        buf = io.BytesIO()
        np.lib.format.write_array(buf, rows, version=(1, 0), allow_pickle=False)
        data = buf.getvalue()
        (split / entry["name"]).write_bytes(data)
        entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    text = json.dumps(m, indent=1)
    for target in [path, *split.glob("manifest-v*.json")]:
        if json.loads(target.read_text()).get("version") == m.get("version"):
            target.write_text(text)


def zero_class_bitmaps(rows: np.ndarray) -> None:
    """Every sample's class bitmap says it holds no class."""
    rows["classes"] = 0


def one_pixel_hash(rows: np.ndarray) -> None:
    """Every sample's pixel hash is the same (all samples look like copies of one image)."""
    rows["pixels"] = 0x5A


def one_look_hash(rows: np.ndarray) -> None:
    """Every sample's look hash is the same (all samples near-duplicates of one image)."""
    rows["looks"] = 0x3C
