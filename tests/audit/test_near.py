"""Near-duplicates on real CamVid: re-encoded and resized copies of val images planted in train are found across
splits at the default threshold; the real frames' close pairs are all inside one sequence and reported apart; the
search equals brute force."""

from __future__ import annotations

import re
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.audit.groups import GroupRule
from shardkit.audit.near import DEFAULT_THRESHOLD, KINDS, as_words, near_pairs, near_report
from shardkit.audit.split import pool
from shardkit.cli import main
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
from shardkit.images.looks import look_hash

SEQUENCE = r"(\w+?)_"
PLANTED = ["0016E5_07959.png", "0016E5_08031.png", "0016E5_08111.png"]


def _planted_tree(camvid_root: Path, root: Path) -> Path:
    """20 real train pairs and every val pair (links), plus in train: three val images re-encoded as JPEG at
    quality 75 and three at half size (each saved as PNG, its label alike: copied or resized by nearest)."""
    for sub in ("train", "trainannot", "val", "valannot"):
        (root / sub).mkdir(parents=True)
    for name in sorted(p.name for p in (camvid_root / "train").iterdir())[:20]:
        for sub in ("train", "trainannot"):
            (root / sub / name).symlink_to(camvid_root / sub / name)
    for p in sorted((camvid_root / "val").iterdir()):
        for sub in ("val", "valannot"):
            (root / sub / p.name).symlink_to(camvid_root / sub / p.name)
    for name in PLANTED:
        image = cv2.imread(str(camvid_root / "val" / name), cv2.IMREAD_COLOR)
        label = cv2.imread(str(camvid_root / "valannot" / name), cv2.IMREAD_UNCHANGED)
        ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 75])
        assert ok
        cv2.imwrite(str(root / "train" / f"jpeg_{name}"), cv2.imdecode(jpeg, cv2.IMREAD_COLOR))
        cv2.imwrite(str(root / "trainannot" / f"jpeg_{name}"), label)
        half = (image.shape[1] // 2, image.shape[0] // 2)
        cv2.imwrite(str(root / "train" / f"half_{name}"), cv2.resize(image, half, interpolation=cv2.INTER_AREA))
        cv2.imwrite(str(root / "trainannot" / f"half_{name}"),
                    cv2.resize(label, half, interpolation=cv2.INTER_NEAREST))
    return root


@pytest.fixture(scope="module")
def planted(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("near")
    out = base / "out"
    convert(ConvertConfig(_planted_tree(camvid_root, base / "raw"), out, format="npy", workers=1, quiet=True))
    return out


def test_planted_copies_are_found_across_splits(planted: Path) -> None:
    datasets = [shardkit.open(planted / s) for s in ("train", "val")]
    pooled = pool(datasets, GroupRule.of(SEQUENCE))
    assert pooled.looks is not None
    report = near_report(pooled.split_of, pooled.groups, pooled.looks, DEFAULT_THRESHOLD, examples=100)
    found = {(pooled.keys[i], pooled.keys[j]) for i, j, _ in report.examples[KINDS[0]]}
    for name in PLANTED:
        for copy in (f"train/jpeg_{name}", f"train/half_{name}"):
            assert (copy, f"val/{name}") in found, (copy, sorted(found))
    bits = {(pooled.keys[i], pooled.keys[j]): b for i, j, b in report.examples[KINDS[0]]}
    assert max(bits[(f"train/{k}_{n}", f"val/{n}")] for k in ("jpeg", "half") for n in PLANTED) <= 2
    assert report.leaks == len(report.examples[KINDS[0]]) >= 6
    got = CliRunner().invoke(main, ["split", str(planted), "--check", "--group-by", SEQUENCE])
    assert got.exit_code == 1 and "near-duplicate pair(s) lie in two splits and two groups" in got.output
    assert "train/jpeg_0016E5_07959.png (train) ~ val/0016E5_07959.png (val): 0 bits" in got.output


def test_distinct_real_frames_that_look_alike_stay_inside_their_sequence(camvid_root: Path, tmp_path: Path) -> None:
    """All 149 real frames (train and val of the subset): the close pairs at the default threshold are frames of
    one sequence (a car standing still), counted as "same group"; none crosses sequences."""
    out = tmp_path / "out"
    convert(ConvertConfig(camvid_root, out, format="npy", size=(90, 120), workers=1, quiet=True))
    datasets = [shardkit.open(out / s) for s in ("train", "val")]
    pooled = pool(datasets, GroupRule.of(SEQUENCE))
    assert pooled.looks is not None
    report = near_report(pooled.split_of, pooled.groups, pooled.looks, DEFAULT_THRESHOLD, examples=1000)
    assert report.counts[KINDS[0]] == report.counts[KINDS[2]] == 0
    for kind in (KINDS[1], KINDS[3]):
        for i, j, _ in report.examples[kind]:
            assert re.search(SEQUENCE, pooled.keys[i]).group(1) == re.search(SEQUENCE, pooled.keys[j]).group(1)


def test_stored_look_hashes_are_the_images_look_hashes(planted: Path) -> None:
    ds = shardkit.open(planted / "val")
    looks = ds.look_hashes()
    assert looks is not None and looks.shape == (len(ds), 8)
    for i in (0, 7, len(ds) - 1):
        assert bytes(looks[i]) == look_hash(ds[i][0])


@pytest.mark.parametrize("threshold", [0, 3, 6])
def test_multi_index_search_equals_brute_force(threshold: int) -> None:
    rng = np.random.default_rng(threshold)
    base = rng.integers(0, 256, (400, 8), dtype=np.uint8)
    copies = base[:150].copy()
    for r in range(150):  # near copies: up to 8 bits flipped
        for b in rng.choice(64, rng.integers(0, 9), replace=False):
            copies[r, b // 8] ^= 0x80 >> (b % 8)
    looks = np.concatenate([base, copies, np.zeros((5, 8), np.uint8)])  # and a bucket of equal hashes
    words = as_words(looks)
    bits = np.bitwise_count(words[:, None] ^ words[None, :])
    i, j = np.nonzero(np.triu(bits <= threshold, 1))
    assert np.array_equal(near_pairs(looks, threshold), np.stack([i, j, bits[i, j]], axis=1))
