"""choose_class_table / build_class_table: which class table a conversion uses, and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardkit.errors import ConfigError
from shardkit.labels import CAMVID_SEGNET, CITYSCAPES, CITYSCAPES_LABEL_IDS, VOC, ClassTable, build_class_table
from shardkit.labels.policy import TableChoice, choose_class_table

# --------------------------------------------------------------------------- build_class_table


def _build(kind: str, **kw: object) -> ClassTable:
    args: dict[str, object] = {
        "class_dict": None,
        "palette": None,
        "layout": "generic",
        "num_classes": None,
        "ignore_index": None,
    }
    args.update(kw)
    return build_class_table(kind, **args)  # type: ignore[arg-type]


def test_build_colour_table_prefers_palette_over_class_dict(tmp_path: Path, rgb_masks_root: Path) -> None:
    t = _build("colour", class_dict=rgb_masks_root / "class_dict.csv", layout="class_dict")
    assert t.num_classes == 3
    t = _build(
        "colour",
        class_dict=rgb_masks_root / "class_dict.csv",
        palette=rgb_masks_root / "annotation_config.json",
    )
    assert t.num_classes == 7


def test_build_colour_table_without_a_table_says_how_to_give_one() -> None:
    with pytest.raises(ConfigError) as e:
        _build("colour", layout="class_dict")
    assert "colour masks need a class table" in str(e.value)
    assert "class_dict.csv" in str(e.value) and "--palette" in str(e.value)


def test_build_ids_table_from_num_classes_class_dict_or_the_layouts_own(rgb_masks_root: Path) -> None:
    t = _build("ids", num_classes=4)
    assert [c.name for c in t.classes] == ["class_0", "class_1", "class_2", "class_3"]
    assert t.ignore_index is None
    t = _build("ids", class_dict=rgb_masks_root / "class_dict.csv")
    assert t.classes[1].name == "giuk" and t.classes[1].colour == (100, 100, 32)
    camvid = TableChoice(CAMVID_SEGNET, "the segnet layout with CamVid frame names")
    assert _build("ids", layout="segnet", default=camvid) == CAMVID_SEGNET
    with pytest.raises(ConfigError, match="disagrees"):
        _build("ids", class_dict=rgb_masks_root / "class_dict.csv", num_classes=5)


@pytest.mark.parametrize("layout", ["segnet", "listfile", "generic", "voc"])
def test_no_layout_name_alone_gives_a_builtin_table(layout: str) -> None:
    """Before: segnet and listfile meant CamVid's 12 classes and voc PASCAL's 21 for any data (exit 0)."""
    kind = "palette" if layout == "voc" else "ids"
    with pytest.raises(ConfigError, match=rf"the {layout} layout does not identify the dataset.*--classes FILE"):
        _build(kind, layout=layout)


def test_build_palette_cityscapes_and_ignore_override() -> None:
    assert _build("palette", layout="voc", default=TableChoice(VOC, "voc")) == VOC
    assert _build("cityscapes", layout="cityscapes") == CITYSCAPES
    assert _build("cityscapes", layout="cityscapes", cityscapes_train_ids=False) == CITYSCAPES_LABEL_IDS
    t = _build("ids", layout="segnet", ignore_index=255, default=TableChoice(CAMVID_SEGNET, "camvid"))
    assert t.ignore_index == 255 and t.num_classes == 12
    c = _build("cityscapes", layout="cityscapes", ignore_index=19)
    assert c.ignore_index == 19 and c.remap is not None and c.remap[0] == 19 and c.remap[7] == 0
    with pytest.raises(ConfigError):
        _build("nonsense")


# --------------------------------------------------------------------------- choose_class_table


def _choose(kind: str = "ids", **kw: object) -> TableChoice:
    args: dict[str, object] = {"class_dict": None, "palette": None, "num_classes": None, "ignore_index": None}
    args.update(kw)
    return choose_class_table(kind, **args)  # type: ignore[arg-type]


def test_the_order_is_file_then_num_classes_then_layout_then_scan(tmp_path: Path) -> None:
    names = tmp_path / "names.txt"
    names.write_text("road\nsky\n")
    scanned: list[int | None] = []

    def scan(ignore: int | None) -> TableChoice:
        scanned.append(ignore)
        return TableChoice(ClassTable(CAMVID_SEGNET.classes[:3], ignore, source="scan:label-values"), "the scan")

    layout = TableChoice(CAMVID_SEGNET, "the layout")
    assert _choose(classes=names, num_classes=2, default=layout, scan=scan).reason == f"--classes {names}"
    assert _choose(num_classes=3, default=layout, scan=scan).reason.startswith("--num-classes 3")
    assert _choose(default=layout, scan=scan).reason == "the layout"
    assert scanned == []  # nothing is read while anything else gives the classes
    got = _choose(scan=scan, ignore_index=7)
    assert scanned == [7] and got.table.ignore_index == 7 and got.reason == "the scan"
    with pytest.raises(ConfigError, match=r"--num-classes 3 disagrees with names\.txt"):
        _choose(classes=names, num_classes=3)


def test_every_choice_states_its_source_in_one_line(tmp_path: Path) -> None:
    line = _choose(num_classes=2, ignore_index=255).line()
    assert line == ("class table: 2 classes from --num-classes 2 (names class_0 … class_1), ignore id 255 from "
                    "--ignore-index; ignore id 255")


def test_classes_and_palette_together_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "c.txt"
    f.write_text("a\nb\n")
    with pytest.raises(ConfigError, match="--classes and --palette"):
        _choose(classes=f, palette=f)
