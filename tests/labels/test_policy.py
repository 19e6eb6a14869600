"""build_class_table: which class table a conversion uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardkit.errors import ConfigError
from shardkit.labels import CAMVID_SEGNET, CITYSCAPES, CITYSCAPES_LABEL_IDS, VOC, ClassTable, build_class_table

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


def test_build_ids_table_from_num_classes_class_dict_or_layout(rgb_masks_root: Path) -> None:
    t = _build("ids", num_classes=4)
    assert [c.name for c in t.classes] == ["class_0", "class_1", "class_2", "class_3"]
    assert t.ignore_index is None
    t = _build("ids", class_dict=rgb_masks_root / "class_dict.csv")
    assert t.classes[1].name == "giuk" and t.classes[1].colour == (100, 100, 32)
    assert _build("ids", layout="segnet") == CAMVID_SEGNET
    assert _build("ids", layout="listfile") == CAMVID_SEGNET
    with pytest.raises(ConfigError, match="--num-classes"):
        _build("ids", layout="generic")
    with pytest.raises(ConfigError, match="disagrees"):
        _build("ids", class_dict=rgb_masks_root / "class_dict.csv", num_classes=5)


def test_build_palette_cityscapes_and_ignore_override() -> None:
    assert _build("palette", layout="voc") == VOC
    assert _build("cityscapes", layout="cityscapes") == CITYSCAPES
    assert _build("cityscapes", layout="cityscapes", cityscapes_train_ids=False) == CITYSCAPES_LABEL_IDS
    t = _build("ids", layout="segnet", ignore_index=255)
    assert t.ignore_index == 255 and t.num_classes == 12
    c = _build("cityscapes", layout="cityscapes", ignore_index=19)
    assert c.ignore_index == 19 and c.remap is not None and c.remap[0] == 19 and c.remap[7] == 0
    with pytest.raises(ConfigError):
        _build("nonsense")
