"""Real CamVid outputs for the audit tests: train and val with a planted leak, and a tiled split."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert

#: CamVid's driving sequence: the key's prefix before the first underscore
SEQUENCE = r"(\w+?)_"


@pytest.fixture(scope="session")
def audited(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The subset's first 30 train pairs (sequences 0001TP, 0006R0) and its 26 val pairs (0016E5) at 90x120 npy,
    with val's first pair planted in train under its own name: one sequence shared, one exact copy across splits."""
    raw = tmp_path_factory.mktemp("audit-raw")
    for split, n in (("train", 30), ("val", 26)):
        names = sorted(p.name for p in (camvid_root / split).glob("*.png"))[:n]
        for sub in (split, f"{split}annot"):
            (raw / sub).mkdir()
            for name in names:
                shutil.copyfile(camvid_root / sub / name, raw / sub / name)
    first = sorted(p.name for p in (camvid_root / "val").glob("*.png"))[0]
    for src, dst in (("val", "train"), ("valannot", "trainannot")):
        shutil.copyfile(camvid_root / src / first, raw / dst / first)
    out = tmp_path_factory.mktemp("audit-out")
    convert(ConvertConfig(raw, out, format="npy", size=(90, 120), workers=1, quiet=True,
                          shard_size=ShardSize(samples=16)))
    return out


@pytest.fixture(scope="session")
def audited_tiles(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The subset's val pairs (360x480) stored as 180x240 tiles: 4 per source."""
    out = tmp_path_factory.mktemp("audit-tiles")
    convert(ConvertConfig(camvid_root, out, format="npy", splits=("val",), tile=(180, 240),
                          workers=1, quiet=True))
    return out
