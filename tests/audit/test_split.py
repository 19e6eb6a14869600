"""``shardkit split`` on real CamVid: groups kept whole, lists that convert takes back, the real sequence shared by
the subset's train and val found; the stratification on many groups keeps rare classes in every part."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.audit.groups import GroupRule
from shardkit.audit.stratify import parse_ratios, stratify
from shardkit.cli import main
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import ConfigError

SEQUENCE = r"(\w+?)_"


@pytest.fixture(scope="module")
def camvid(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CamVid subset's train and val as npy at 90x120 (its own split: sequence 0016E5 is in both)."""
    out = tmp_path_factory.mktemp("split-camvid")
    convert(ConvertConfig(camvid_root, out, format="npy", size=(90, 120), workers=1, quiet=True,
                          shard_size=ShardSize(samples=32)))
    return out


def _sequence(key: str) -> str:
    found = re.search(SEQUENCE, key)
    assert found is not None
    return found.group(1)


def test_check_finds_the_sequence_the_subsets_train_and_val_share(camvid: Path) -> None:
    got = CliRunner().invoke(main, ["split", str(camvid), "--check", "--group-by", SEQUENCE])
    assert got.exit_code == 1 and "1 group(s) are in more than one split: 0016E5 (train, val)" in got.output
    alone = CliRunner().invoke(main, ["split", str(camvid), "--check"])  # each sample its own group: no leak
    assert alone.exit_code == 0 and "no group is in more than one split" in alone.output


def test_lists_keep_sequences_whole_and_convert_takes_them(camvid: Path, camvid_root: Path, tmp_path: Path) -> None:
    lists = tmp_path / "lists"
    got = CliRunner().invoke(main, ["split", str(camvid), "--into", "train=0.5,val=0.5", "--group-by", SEQUENCE,
                                    "--seed", "3", "--lists", str(lists)])
    assert got.exit_code == 0, got.output
    parts = {p: (lists / f"{p}.txt").read_text().split() for p in ("train", "val")}
    everything = [shardkit.open(camvid / s).key(i) for s in ("train", "val")
                  for i in range(len(shardkit.open(camvid / s)))]
    assert sorted(parts["train"] + parts["val"]) == sorted(everything)  # every sample once
    assert not {_sequence(k) for k in parts["train"]} & {_sequence(k) for k in parts["val"]}
    report = json.loads((lists / "split-report.json").read_text())
    assert report["samples"] == len(everything) and report["groups"] == 3
    out = tmp_path / "out"
    convert(ConvertConfig(camvid_root, out, format="npy", size=(90, 120), workers=1, quiet=True,
                          split_lists=(("train", lists / "train.txt"), ("val", lists / "val.txt"))))
    for part in ("train", "val"):
        ds = shardkit.open(out / part)
        assert sorted(ds.key(i) for i in range(len(ds))) == sorted(parts[part])
    again = CliRunner().invoke(main, ["split", str(out), "--check", "--group-by", SEQUENCE])
    assert again.exit_code == 0, again.output


def test_the_same_seed_gives_the_same_lists(camvid: Path, tmp_path: Path) -> None:
    def lists(seed: int, name: str) -> str:
        folder = tmp_path / name
        CliRunner().invoke(main, ["split", str(camvid), "--into", "a=0.6,b=0.4", "--seed", str(seed),
                                  "--lists", str(folder)])
        return (folder / "a.txt").read_text()

    assert lists(1, "x") == lists(1, "y") and lists(1, "x") != lists(2, "z")


def test_rare_classes_land_in_every_part_and_no_group_is_cut() -> None:
    """60 groups of 1–9 images; class 3 is in only 4 groups, class 4 in 3: each part of three gets some of each,
    and the parts' image counts follow the shares."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 10, 60)
    presence = (rng.random((60, 5)) < [0.9, 0.6, 0.3, 0.0, 0.0]) * sizes[:, None]
    presence[[5, 17, 33, 48], 3] = 1
    presence[[2, 40, 51], 4] = 1
    part = stratify(presence, sizes, [0.6, 0.2, 0.2], seed=7)
    assert part.shape == (60,) and set(part.tolist()) == {0, 1, 2}
    for c in (3, 4):
        assert {int(part[g]) for g in np.flatnonzero(presence[:, c])} == {0, 1, 2}
    share = np.bincount(part, weights=sizes, minlength=3) / sizes.sum()
    assert np.allclose(share, [0.6, 0.2, 0.2], atol=0.06)
    assert np.array_equal(stratify(presence, sizes, [0.6, 0.2, 0.2], seed=7), part)


def test_group_rules_refuse_what_they_do_not_cover(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("does not match the key 'x/abc.png'")):
        GroupRule.of(r"(\d+)_").group("x/abc.png")
    table = tmp_path / "groups.csv"
    table.write_text("key,group\ntrain/a.png,p1\ntrain/b.png,p1\n")
    rule = GroupRule.of(None, table)
    assert rule.groups(["train/a.png", "train/b.png"]) == ["p1", "p1"]
    with pytest.raises(ConfigError, match=re.escape("has no row for the key 'train/c.png'")):
        rule.group("train/c.png")
    table.write_text("train/a.png,p1\ntrain/a.png,p2\n")
    with pytest.raises(ConfigError, match="is in group 'p1' and 'p2'"):
        GroupRule.of(None, table)
    with pytest.raises(ConfigError, match="both name the groups"):
        GroupRule.of("x", table)
    with pytest.raises(ConfigError, match="positive share"):
        parse_ratios("train=0.8,val=-1")


def test_tiles_of_one_source_stay_in_one_part(camvid_root: Path, tmp_path: Path) -> None:
    """Without a rule every sample is its own group, but tiles carry their source's key: all tiles of an image go
    to one part."""
    out = tmp_path / "tiled"
    convert(ConvertConfig(camvid_root, out, format="npy", splits=("val",), tile=(180, 240), workers=1, quiet=True))
    ds = shardkit.open(out / "val")
    assert len(ds) > len({ds.key(i) for i in range(len(ds))})  # several tiles per source
    lists = tmp_path / "lists"
    got = CliRunner().invoke(main, ["split", str(out), "--into", "a=0.5,b=0.5", "--lists", str(lists)])
    assert got.exit_code == 0, got.output
    a, b = ((lists / f"{p}.txt").read_text().split() for p in ("a", "b"))
    assert not set(a) & set(b) and sorted(a + b) == sorted({ds.key(i) for i in range(len(ds))})


def test_the_slices_of_a_volume_case_are_one_group(tmp_path: Path) -> None:
    """Without a rule the slices of one volume case (real NIfTI volumes, two cases) are one group: --into keeps
    each case whole, and info counts the cases as the groups."""
    pytest.importorskip("nibabel")
    from tests.conversion.test_volumes import CASES, nnunet_tree

    root = nnunet_tree(tmp_path / "Dataset001", cases={"anat": CASES["anat"], "twin": CASES["anat"]})
    got = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "out"), "--workers", "1"])
    assert got.exit_code == 0, got.output
    ds = shardkit.open(tmp_path / "out" / "train")
    keys, groups = GroupRule().sample_groups(ds)
    assert sorted(set(groups)) == ["anat", "twin"] and len(keys) == len(ds) > 2
    lists = tmp_path / "lists"
    got = CliRunner().invoke(main, ["split", str(tmp_path / "out"), "--into", "a=0.5,b=0.5", "--lists", str(lists)])
    assert got.exit_code == 0, got.output
    a, b = ((lists / f"{p}.txt").read_text().split() for p in ("a", "b"))
    assert {k.partition("/")[0] for k in a} == {"anat"} or {k.partition("/")[0] for k in a} == {"twin"}
    assert not {k.partition("/")[0] for k in a} & {k.partition("/")[0] for k in b}
    info = CliRunner().invoke(main, ["info", str(tmp_path / "out" / "train")])
    assert f"groups: 2 of {len(ds)} samples" in info.output


def test_info_counts_the_sources_of_tiles_as_groups(camvid_root: Path, tmp_path: Path) -> None:
    convert(ConvertConfig(camvid_root, tmp_path, format="npy", splits=("val",), tile=(180, 240), workers=1,
                          quiet=True))
    got = CliRunner().invoke(main, ["info", str(tmp_path / "val")])
    assert got.exit_code == 0 and "groups: 26 of 104 samples, 4 each" in got.output


def test_convert_records_the_group_rule_and_the_tools_use_it(camvid_root: Path, tmp_path: Path) -> None:
    """convert --group-by checks every key and records the rule; split --check and info then group by it without
    being told (and find the sequence the subset's train and val share); a key it does not match is refused."""
    got = CliRunner().invoke(main, ["convert", str(camvid_root), str(tmp_path / "out"), "--format", "npy",
                                    "--size", "90x120", "--group-by", SEQUENCE, "-q", "--workers", "1"])
    assert got.exit_code == 0, got.output
    ds = shardkit.open(tmp_path / "out" / "val")
    assert ds.manifest.source.extra["groups"] == {"group_by": SEQUENCE}
    check = CliRunner().invoke(main, ["split", str(tmp_path / "out"), "--check"])
    assert check.exit_code == 1 and "0016E5 (train, val)" in check.output and f"--group-by {SEQUENCE}" in check.output
    info = CliRunner().invoke(main, ["info", str(tmp_path / "out" / "val")])
    assert f"groups: 1 of {len(ds)} samples, {len(ds)} each: --group-by {SEQUENCE}" in info.output
    bad = CliRunner().invoke(main, ["convert", str(camvid_root), str(tmp_path / "bad"), "--format", "npy",
                                    "--group-by", r"(\d{9})", "-q"])
    assert bad.exit_code == 2 and "does not match the key" in bad.output
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").rglob("*.npy"))
