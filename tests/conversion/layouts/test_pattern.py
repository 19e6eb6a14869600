"""--images/--labels templates and --split-list files: synthetic trees (empty files: nothing is decoded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardkit.conversion.config import ConvertConfig, parse_split_lists
from shardkit.conversion.layouts import discover
from shardkit.conversion.layouts.pattern import Template
from shardkit.errors import ConfigError, InputNotFoundError, LayoutError


def touch(root: Path, *names: str) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).touch()


def pairs(found, split: str) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(p.key, p.label.relative_to(found.root).as_posix()) for p in found.splits[split]]


@pytest.mark.parametrize(("text", "match"), [
    ("/abs/{name}.png", "must be a path inside the input folder"),
    ("../up/{name}.png", "must be a path inside the input folder"),
    ("C:/x/{name}.png", "must be a path inside the input folder"),
    ("img/*.png", r"needs exactly one \{name\}"),
    ("img/{name}/{name}.png", r"needs exactly one \{name\}"),
    ("img/{split}/{split}/{name}.png", r"only \{split\} \(once\)"),
    ("img/{stem}/{name}.png", r"only \{split\} \(once\)"),
])
def test_bad_templates_are_usage_errors(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Template.parse(text, "--images")


def test_images_without_labels_and_split_only_in_labels_are_usage_errors(tmp_path: Path) -> None:
    touch(tmp_path, "img/a.png")
    with pytest.raises(ConfigError, match="--images needs --labels"):
        discover(tmp_path, images="img/{name}.png")
    with pytest.raises(ConfigError, match=r"--labels has \{split\} but --images has not"):
        discover(tmp_path, images="img/{name}.png", labels="gt/{split}/{name}.png")
    with pytest.raises(ConfigError, match="--layout segnet and --images/--labels"):
        discover(tmp_path, layout="segnet", images="img/{name}.png", labels="gt/{name}.png")


def test_templates_pair_by_split_and_name_with_globs_and_report_the_rest(tmp_path: Path) -> None:
    touch(tmp_path, "img/train/a.tif", "img/train/b.tif", "img/val/c.tif", "img/val/notes.txt",
          "gt/train/a_mask.gif", "gt/val/c_mask.gif", "gt/val/z_mask.gif", "gt/train/a_other.gif")
    found = discover(tmp_path, images="img/{split}/{name}.tif", labels="gt/{split}/{name}_mask.*")
    assert found.layout == "pattern" and found.label_kind == "ids"
    assert pairs(found, "train") == [("img/train/a.tif", "gt/train/a_mask.gif")]
    assert pairs(found, "val") == [("img/val/c.tif", "gt/val/c_mask.gif")]
    assert found.unmatched_images == {"train": ("img/train/b.tif",)}
    assert found.unmatched_labels == {"val": ("gt/val/z_mask.gif",)}


def test_double_star_and_labels_shared_by_every_split(tmp_path: Path) -> None:
    touch(tmp_path, "data/train/city1/a.png", "data/val/city2/b.png", "masks/a.png", "masks/b.png")
    found = discover(tmp_path, images="data/{split}/**/{name}.png", labels="masks/{name}.png")
    assert pairs(found, "train") == [("data/train/city1/a.png", "masks/a.png")]
    assert pairs(found, "val") == [("data/val/city2/b.png", "masks/b.png")]


def test_a_template_matching_two_files_for_one_name_names_both(tmp_path: Path) -> None:
    touch(tmp_path, "img/x/a.png", "img/y/a.png", "gt/a.png")
    with pytest.raises(LayoutError, match=r"matches img/x/a\.png and img/y/a\.png for name 'a'"):
        discover(tmp_path, images="img/*/{name}.png", labels="gt/{name}.png")


# --- --split-list ---------------------------------------------------------------------------------------------


def test_pair_lists_from_outside_the_input_make_the_listfile_layout(tmp_path: Path) -> None:
    root, lists = tmp_path / "data", tmp_path / "lists"
    touch(root, "img/a.png", "img/b.png", "lbl/a.png", "lbl/b.png")
    lists.mkdir()
    (lists / "tr.txt").write_text("/far/img/a.png /far/lbl/a.png\n")
    (lists / "va.txt").write_text("img/b.png lbl/b.png\n")
    found = discover(root, split_lists={"train": lists / "tr.txt", "val": lists / "va.txt"})
    assert found.layout == "listfile" and pairs(found, "train") == [("img/a.png", "lbl/a.png")]
    assert pairs(found, "val") == [("img/b.png", "lbl/b.png")]
    assert not any(p.suffix == ".txt" for p in root.rglob("*"))


def test_name_lists_choose_among_the_pairs_of_the_layout_found(tmp_path: Path) -> None:
    touch(tmp_path / "d", "images/x1.png", "images/x2.png", "images/x3.png", "labels/x1.png", "labels/x2.png",
          "labels/x3.png")
    (tmp_path / "train.txt").write_text("x1\nimages/x2.png\n")
    (tmp_path / "val.txt").write_text("x3.png\n")
    found = discover(tmp_path / "d", split_lists={"train": tmp_path / "train.txt", "val": tmp_path / "val.txt"})
    assert found.layout == "generic"
    assert [k for k, _ in pairs(found, "train")] == ["images/x1.png", "images/x2.png"]
    assert [k for k, _ in pairs(found, "val")] == ["images/x3.png"]


def test_split_list_errors_name_the_file_and_line(tmp_path: Path) -> None:
    touch(tmp_path / "d", "images/x1.png", "labels/x1.png")
    bad = tmp_path / "bad.txt"
    bad.write_text("x1\nnope\n")
    with pytest.raises(InputNotFoundError, match=r"bad\.txt: line 2: 'nope' names no image/label pair"):
        discover(tmp_path / "d", split_lists={"train": bad})
    dup = tmp_path / "dup.txt"
    dup.write_text("x1\nx1.png\n")
    with pytest.raises(LayoutError, match=r"lines 1 and 2 both name images/x1\.png"):
        discover(tmp_path / "d", split_lists={"train": dup})
    pair = tmp_path / "pair.txt"
    pair.write_text("images/x1.png labels/x1.png\n")
    with pytest.raises(ConfigError, match="mix 'image label' lines and name lines"):
        discover(tmp_path / "d", split_lists={"train": pair, "val": bad})
    with pytest.raises(InputNotFoundError, match="split list does not exist"):
        discover(tmp_path / "d", split_lists={"train": tmp_path / "missing.txt"})


@pytest.mark.parametrize(("value", "match"), [
    (["train"], "is not SPLIT=PATH"),
    (["a/b=x.txt"], "the split must be a plain name"),
    (["train=a.txt", "train=b.txt"], "names split 'train' twice"),
])
def test_split_list_option_values_are_checked(value: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_split_lists(value)


def test_split_lists_accept_a_mapping_and_pairs(tmp_path: Path) -> None:
    assert parse_split_lists({"val": "v.txt"}) == (("val", Path("v.txt")),)
    cfg = ConvertConfig(tmp_path, tmp_path / "o", split_lists=("train=t.txt",))  # type: ignore[arg-type]
    assert cfg.split_lists == (("train", Path("t.txt")),)


def test_the_cli_imports_the_layouts_only_when_convert_runs() -> None:
    import subprocess
    import sys

    code = ("import sys, shardkit.cli; "
            "print(sorted(m for m in sys.modules if m.startswith('shardkit.conversion.layouts')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_unknown_layout_is_a_usage_error_listing_the_registered_ones(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shardkit.cli import main

    result = CliRunner().invoke(main, ["convert", str(tmp_path), str(tmp_path / "o"), "--layout", "coco"])
    assert result.exit_code == 2 and "'coco' is not one of auto, cityscapes, ade20k, labelme2voc" in result.output
