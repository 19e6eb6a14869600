"""Per-sample records of a converted split read from the text of formats/samples.md alone (json + numpy).

Manifest version 1 keeps them inline in ``samples``; version 2 in one ``.npy`` sidecar per shard, named by
``shards[k].samples``. No shardkit import: tests use this to check what a third-party reader gets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def sidecar_records(folder: Path, shard: dict[str, Any], num_classes: int) -> list[dict[str, Any]]:
    """The records of one shard of a version 2 manifest, decoded as formats/samples.md says."""
    rows = np.load(Path(folder) / shard["samples"]["name"], mmap_mode="r", allow_pickle=False)
    assert rows.shape == (shard["num_samples"],)
    out = []
    for row in rows:
        rec = {"key": row["key"].decode("utf-8"), "label": row["label"].decode("utf-8") or None,
               "height": int(row["height"]), "width": int(row["width"]), "fingerprint": bytes(row["fingerprint"]).hex()}
        if "classes" in rows.dtype.names:
            rec["classes"] = np.flatnonzero(np.unpackbits(row["classes"], count=num_classes, bitorder="big")).tolist()
        out.append(rec)
    return out


def records(folder: Path, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every sample record of a split in global index order, from its parsed ``manifest.json``."""
    if manifest["manifest_version"] == 1:
        return list(manifest["samples"])
    n = manifest["sample"]["label"]["num_classes"]
    return [rec for shard in manifest["shards"] for rec in sidecar_records(folder, shard, n)]
