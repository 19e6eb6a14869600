"""Class table files: class_dict.csv, JSON and text palettes, and their one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardkit.errors import InputNotFoundError, LabelError
from shardkit.labels import ClassInfo, read_class_dict, read_palette
from shardkit.labels.tablefiles import read_classes

# --------------------------------------------------------------------------- class_dict.csv / palettes


def test_read_class_dict_reads_the_real_file(rgb_masks_root: Path) -> None:
    table = read_class_dict(rgb_masks_root / "class_dict.csv")
    assert [(c.id, c.name, c.colour) for c in table.classes] == [
        (0, "batang", (1, 1, 1)),
        (1, "giuk", (100, 100, 32)),
        (2, "aa", (150, 100, 234)),
    ]
    assert table.ignore_index is None and table.source == "class_dict.csv"


def test_read_class_dict_tolerates_bom_case_spaces_and_extra_columns(tmp_path: Path) -> None:
    p = tmp_path / "class_dict.csv"
    p.write_text(
        "\ufeff Name , R , G , B ,class_19\n\nsky , 128, 128 ,128, 1\n# comment\nroad,128,64,128,0\n"
    )
    table = read_class_dict(p)
    assert [(c.name, c.colour) for c in table.classes] == [("sky", (128, 128, 128)), ("road", (128, 64, 128))]


def test_read_class_dict_duplicate_colour_names_both_classes(tmp_path: Path) -> None:
    p = tmp_path / "class_dict.csv"
    p.write_text("name,r,g,b\nsky,1,2,3\nroad,4,5,6\nsea,1,2,3\n")
    with pytest.raises(LabelError) as e:
        read_class_dict(p)
    msg = str(e.value)
    assert "'sky'" in msg and "'sea'" in msg and "(1, 2, 3)" in msg and str(p) in msg and "\n" not in msg


def test_read_class_dict_bad_row_names_its_line(tmp_path: Path) -> None:
    p = tmp_path / "class_dict.csv"
    p.write_text("name,r,g,b\nsky,1,2,3\nroad,4,x,6\n")
    with pytest.raises(LabelError, match="line 3"):
        read_class_dict(p)
    p.write_text("name,r,g,b\nsky,1,2,300\n")
    with pytest.raises(LabelError, match="line 2"):
        read_class_dict(p)
    p.write_text("name,r,g,b\nsky,1,2\n")
    with pytest.raises(LabelError, match="line 2"):
        read_class_dict(p)
    p.write_text("label,red,green\nsky,1,2\n")
    with pytest.raises(LabelError, match="header"):
        read_class_dict(p)
    p.write_text("name,r,g,b\n")
    with pytest.raises(LabelError, match="no classes"):
        read_class_dict(p)


def test_read_class_dict_missing_file_is_input_not_found(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError):
        read_class_dict(tmp_path / "nope.csv")


def test_read_palette_reads_the_annotation_tool_json(rgb_masks_root: Path) -> None:
    table = read_palette(rgb_masks_root / "annotation_config.json")
    assert table.num_classes == 7
    assert table.classes[0] == ClassInfo(0, "batang", (1, 1, 1))
    assert table.classes[2] == ClassInfo(2, "aa", (150, 100, 234))


def test_read_palette_accepts_json_list_text_lines_and_csv(tmp_path: Path) -> None:
    j = tmp_path / "pal.json"
    j.write_text(json.dumps([{"name": "sky", "color": [1, 2, 3]}, {"name": "road", "colour": "#0a0b0c"}]))
    assert [c.colour for c in read_palette(j).classes] == [(1, 2, 3), (10, 11, 12)]
    t = tmp_path / "pal.txt"
    t.write_text("# r g b name\n1 2 3 sky blue\n4,5,6\n")
    table = read_palette(t)
    assert [(c.name, c.colour) for c in table.classes] == [("sky blue", (1, 2, 3)), ("class_1", (4, 5, 6))]
    c = tmp_path / "pal.csv"
    c.write_text("name,r,g,b\nsky,1,2,3\n")
    assert read_palette(c).classes == (ClassInfo(0, "sky", (1, 2, 3)),)
    t.write_text("1 2\n")
    with pytest.raises(LabelError, match="line 1"):
        read_palette(t)
    j.write_text("{bad json")
    with pytest.raises(LabelError, match="invalid"):
        read_palette(j)


# --------------------------------------------------------------------------- --classes: names, ids, colours


DATA = Path(__file__).resolve().parents[1] / "data"


def test_read_classes_reads_labelme2voc_class_names(tmp_path: Path) -> None:
    table = read_classes(DATA / "labelme2voc" / "old" / "class_names.txt")
    assert table.num_classes == 21 and table.ignore_index is None
    assert table.names()[:2] == ["_background_", "aeroplane"]
    assert table.names()[16] == "potted plant" and table.names()[20] == "tv/monitor"
    assert all(c.colour is None for c in table.classes) and table.source == "class_names.txt"


@pytest.mark.parametrize(("name", "text"), [
    ("names.txt", "# classes\nbackground\n\ncrack\n"),
    ("ids.txt", "1: crack\n0: background\n"),
    ("rgb.txt", "0 0 0 background\n255 0 0 crack\n"),
    ("table.csv", "name,r,g,b\nbackground,0,0,0\ncrack,255,0,0\n"),
    ("names.csv", "id,name\n1,crack\n0,background\n"),
    ("list.json", '["background", "crack"]'),
    ("objects.json", '{"classes": [{"name": "background"}, {"name": "crack", "color": "#ff0000"}]}'),
    ("mapping.json", '{"background": [0, 0, 0], "crack": [255, 0, 0]}'),
])
def test_read_classes_takes_names_with_optional_ids_and_colours(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    table = read_classes(path)
    assert table.names() == ["background", "crack"]
    if "rgb" in name or "table" in name or "mapping" in name:
        assert table.classes[1].colour == (255, 0, 0)
    assert table.source == name


def test_read_classes_labelme_labels_txt_drops_ignore_and_makes_255_the_ignore_id(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_text("__ignore__\n_background_\ncrack\n")
    table = read_classes(path)
    assert table.names() == ["_background_", "crack"] and table.ignore_index == 255


@pytest.mark.parametrize(("text", "match"), [
    ("", r"names no classes"),
    ("0 a\n2 b\n", r"class ids 0, 2 skip 1: a class table numbers its 2 classes 0\.\.1"),
    ("a\nb\na\n", r"class name 'a' appears twice \(line 1 and line 3\)"),
    ("1 2 3 a\n1 2 3 b\n", r"colour \(1, 2, 3\) appears twice"),
    ("300 0 0 a\n", r"line 1: colour '300,0,0' is not three integers"),
])
def test_read_classes_errors_name_file_and_line(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "c.txt"
    path.write_text(text)
    with pytest.raises(LabelError, match=match) as e:
        read_classes(path)
    assert str(path) in str(e.value)
