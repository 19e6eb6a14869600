"""Class table files: class_dict.csv, JSON and text palettes, and their one-line errors."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardkit.errors import InputNotFoundError, LabelError
from shardkit.labels import MAX_CLASSES, ClassInfo, read_class_dict, read_palette
from shardkit.labels.tablefiles import _COLUMNS, LABELME_IGNORE_NAME, read_classes

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


# --------------------------------------------------------------------------- every shape read exactly as written


_ALIASES = {a for aliases in _COLUMNS.values() for a in aliases}
_NAMES = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters=',\t"#'),
                 min_size=1, max_size=12).map(str.strip).filter(
    lambda s: bool(s) and not s[0].isdigit() and s.lower() not in _ALIASES and s != LABELME_IGNORE_NAME)


def _write_shape(shape: str, table: list[tuple[int, str, tuple[int, int, int]]], order: list[int],
                 path: Path) -> tuple[Path, bool]:
    """``table`` (id, name, colour; in id order) written in ``shape``, rows in ``order`` where the shape gives ids;
    the path written and whether the shape carries colours."""
    shuffled = [table[i] for i in order]
    rows: list[list[object]]
    if shape in ("csv-header", "tsv-header", "csv-no-header"):
        delimiter = "\t" if shape.startswith("tsv") else ","
        buf = io.StringIO()
        writer = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
        rows = [["id", "name", "r", "g", "b"]] if "no-header" not in shape else []
        rows += [[i, n, *c] for i, n, c in shuffled] if "no-header" not in shape else [[i, n] for i, n, _ in shuffled]
        writer.writerows(rows)
        path = path.with_suffix(".tsv" if delimiter == "\t" else ".csv")
        path.write_text(buf.getvalue())
        return path, "no-header" not in shape
    if shape == "one-column-header":
        path.with_suffix(".csv").write_text("class_name\n" + "".join(f"{n}\n" for _, n, _ in table))
        return path.with_suffix(".csv"), False
    if shape == "one-column":
        path.with_suffix(".csv").write_text("".join(f"{n}\n" for _, n, _ in table))
        return path.with_suffix(".csv"), False
    if shape == "json-objects":
        path = path.with_suffix(".json")
        objects = [{"id": i if i % 2 else str(i), "name": n, "color": list(c)} for i, n, c in shuffled]
        path.write_text(json.dumps(objects))
        return path, True
    if shape in ("json-id2label", "hf-config"):
        obj: object = {str(i): n for i, n, _ in shuffled}
        if shape == "hf-config":
            obj = {"model_type": "x", "id2label": obj, "label2id": {n: i for i, n, _ in shuffled}}
        path = path.with_suffix(".json")
        path.write_text(json.dumps(obj))
        return path, False
    if shape == "text-names":
        path.with_suffix(".txt").write_text("# classes\n" + "".join(f"{n}\n" for _, n, _ in table))
        return path.with_suffix(".txt"), False
    if shape == "text-ids":
        path.with_suffix(".txt").write_text("".join(f"{i}: {n}\n" for i, n, _ in shuffled))
        return path.with_suffix(".txt"), False
    assert shape == "text-palette"
    path.with_suffix(".txt").write_text("".join(f"{c[0]} {c[1]} {c[2]} {n}\n" for _, n, c in table))
    return path.with_suffix(".txt"), True


SHAPES = ("csv-header", "tsv-header", "csv-no-header", "one-column-header", "one-column", "json-objects",
          "json-id2label", "hf-config", "text-names", "text-ids", "text-palette")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from(SHAPES), data=st.data())
def test_every_shape_round_trips_a_shuffled_table(tmp_path: Path, shape: str, data: st.DataObject) -> None:
    names = data.draw(st.lists(_NAMES, min_size=1, max_size=20, unique=True), label="names")
    colours = data.draw(st.lists(st.tuples(*[st.integers(0, 255)] * 3), min_size=len(names), max_size=len(names),
                                 unique=True), label="colours")
    order = data.draw(st.permutations(range(len(names))), label="order")
    table = [(i, n, c) for i, (n, c) in enumerate(zip(names, colours, strict=True))]
    path, with_colour = _write_shape(shape, table, list(order), tmp_path / f"classes-{shape}")
    got = read_classes(path)
    assert [(c.id, c.name, c.colour) for c in got.classes] == [(i, n, c if with_colour else None)
                                                               for i, n, c in table]
    assert got.ignore_index is None


# --------------------------------------------------------------------------- refused in one line


@pytest.mark.parametrize(("name", "text", "match"), [
    ("float.json", '[{"id": 1.0, "name": "road"}, {"id": 0, "name": "sky"}]', r"entry 0: class id 1\.0 is not"),
    ("half.json", '[{"id": 1.5, "name": "road"}]', r"class id 1\.5 is not"),
    ("word.json", '[{"id": "x", "name": "road"}]', r"class id 'x' is not"),
    ("bool.json", '[{"id": true, "name": "road"}]', r"class id True is not"),
    ("negative.json", '[{"id": -1, "name": "road"}]', r"class id -1 is not"),
    ("big.json", '{"70000": "road"}', r"class id '70000' is not"),
    ("mixed.json", '[{"id": 0, "name": "sky"}, {"name": "road"}]', r"entry 1 \('road'\) has no id while entry 0"),
    ("mixedkeys.json", '{"0": "sky", "road": [1, 2, 3]}', r"keys '0' \(an id\) and 'road' \(a name\) are mixed"),
    ("sparse.json", '{"0": "sky", "10": "tree", "2": "car"}',
     r"class ids 0, 2, 10 skip 1, 3, 4, 5, 6, …: .*--label-map 2:1,10:2"),
    ("dupid.json", '[{"id": 0, "name": "sky"}, {"id": "0", "name": "road"}]', r"class id 0 appears twice"),
    ("dupname.json", '{"0": "sky", "1": "sky"}', r"class name 'sky' appears twice"),
    ("nul.json", '["sky", "ro\\u0000ad"]', r"entry 1: class name 'ro\\x00ad' holds the control character"),
    ("tab.json", '["sky", "ro\\tad"]', r"control character '\\t'"),
    ("noname.json", '[{"id": 0, "color": [1, 2, 3]}]', r'entry 0 has no "name"'),
    ("number.json", '[5]', r"entry 0: 5 is not a class"),
    ("disagree.json", '{"0": {"id": 1, "name": "sky"}}', r"key '0' and \"id\": 1 disagree"),
    ("boolcolour.json", '{"sky": [true, 0, 0]}', r"colour \[True, 0, 0\] is not"),
    ("nul.txt", "sky\nro\x00ad\n", r"line 2: class name 'ro\\x00ad' holds the control character"),
    ("colourline.txt", "sky\n1 2 3\ncar\n", r"line 2: '1 2 3' reads as 'r g b name' but line 1 as 'name'"),
    ("idline.txt", "0 sky\n1 road\n2 3 4 car\n", r"line 3: '2 3 4 car' reads as 'r g b name' but line 1 as 'id name'"),
    ("both.txt", "1,2,3,4\n5,6,7,8\n", r"every line reads as name,r,g,b and as r g b name"),
    ("comma.csv", "name\nperson, rider\n", r"line 2: 'person, rider' has 2 fields, the header 1"),
    ("dupid.csv", "id,name\n0,sky\n0,road\n", r"class id 0 appears twice \(line 2 'sky' and line 3 'road'\)"),
    ("dupname.tsv", "name\nsky\nsky\n", r"class name 'sky' appears twice \(line 2 and line 3\)"),
    ("badid.csv", "id,name\n0.5,sky\n", r"line 2: class id '0\.5' is not"),
])
def test_bad_class_files_are_refused_in_one_line(tmp_path: Path, name: str, text: str, match: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(LabelError, match=match) as e:
        read_classes(path)
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value) and "fix: " in str(e.value)


def test_a_header_row_is_never_a_class(tmp_path: Path) -> None:
    for header in ("name", "class_name", "Class", "label", "name\tr\tg\tb"):
        path = tmp_path / ("c.tsv" if "\t" in header else "c.csv")
        rows = "sky\t1\t2\t3\nroad\t4\t5\t6\n" if "\t" in header else "sky\nroad\n"
        path.write_text(f"{header}\n{rows}")
        assert read_classes(path).names() == ["sky", "road"], header
    quoted = tmp_path / "q.csv"
    quoted.write_text('name\n"person, rider"\nsky\n')
    assert read_classes(quoted).names() == ["person, rider", "sky"]


def test_the_id2label_and_label2id_shapes_keep_their_ids(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"id2label": {"2": "tree", "0": "sky", "3": "car", "1": "road"},
                                "label2id": {"tree": 2, "sky": 0, "car": 3, "road": 1}, "num_labels": 4}))
    assert read_classes(path).names() == ["sky", "road", "tree", "car"]
    path.write_text(json.dumps({"tree": 2, "sky": 0, "car": 3, "road": 1}))
    assert read_classes(path).names() == ["sky", "road", "tree", "car"]


def test_the_class_cap_applies_before_the_file_is_parsed_whole(tmp_path: Path) -> None:
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as fh:  # 100 MB (sparse): refused from its size, before a byte is read
        fh.truncate(100_000_000)
    with pytest.raises(LabelError, match=r"100000000 bytes, more than the 16777216 bytes"):
        read_classes(huge)
    many = tmp_path / "many.json"
    many.write_text(json.dumps([f"c{i}" for i in range(MAX_CLASSES + 1)]))
    with pytest.raises(LabelError, match=f"more than {MAX_CLASSES} classes"):
        read_classes(many)
    values = tmp_path / "values.json"
    values.write_text("[" + ",".join(["{}"] * (2 << 20)) + "]")
    with pytest.raises(LabelError, match="more than 1048576"):
        read_classes(values)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(LabelError, match="nests 100000 levels deep"):
        read_classes(deep)
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"c{i}\n" for i in range(MAX_CLASSES + 3)))
    with pytest.raises(LabelError, match=f"more than {MAX_CLASSES} classes \\(line {MAX_CLASSES + 3}\\)"):
        read_classes(lines)
    full = tmp_path / "full.json"
    full.write_text(json.dumps({str(i): f"c{i}" for i in range(MAX_CLASSES)}))
    assert read_classes(full).num_classes == MAX_CLASSES


def test_class_dict_and_palette_files_refuse_control_characters_and_too_many_classes(tmp_path: Path) -> None:
    csv_path = tmp_path / "class_dict.csv"
    csv_path.write_text("name,r,g,b\nsky,1,2,3\nro\x00ad,4,5,6\n")
    with pytest.raises(LabelError, match=r"line 3: class name 'ro\\x00ad' holds the control character"):
        read_class_dict(csv_path)
    pal = tmp_path / "pal.txt"
    pal.write_text("".join(f"{i % 256} {i // 256 % 256} {i // 65536} c{i}\n" for i in range(MAX_CLASSES + 3)))
    with pytest.raises(LabelError, match=f"palette lists more than {MAX_CLASSES} classes"):
        read_palette(pal)
    js = tmp_path / "pal.json"
    js.write_text(json.dumps([{"name": "sky\x07", "color": [1, 2, 3]}]))
    with pytest.raises(LabelError, match=r"entry 0: class name 'sky\\x07' holds the control character"):
        read_palette(js)


def test_sparse_ids_are_refused_with_fixes_that_keep_every_id(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"0": "background", "1": "crack", "255": "ignore"}))
    with pytest.raises(LabelError, match=r"fix: if 255 \('ignore'\) marks pixels to ignore, drop it from the file "
                                         r"and pass --ignore-index 255; else list every id 0\.\.255"):
        read_classes(path)
    path.write_text(json.dumps({str(2 * i): f"c{i}" for i in range(20)}))
    with pytest.raises(LabelError, match=r"pass a --label-map file of their 19 OLD:NEW lines \(2:1, 4:2, 6:3 …\)"):
        read_classes(path)


# --------------------------------------------------------------------------- CVAT labelmap.txt

CVAT_LABELMAP = Path(__file__).resolve().parents[1] / "data" / "cvat-mask" / "labelmap.txt"


@pytest.mark.parametrize("reader", [read_classes, read_palette])
def test_cvat_labelmap_reads_names_and_colours_not_garbled_names(reader: Any) -> None:
    """The real CVAT label map: names without ``:r,g,b::``, colours as written, ids in line order."""
    table = reader(CVAT_LABELMAP)
    assert [(c.id, c.name, c.colour) for c in table.classes] == [
        (0, "background", (0, 0, 0)), (1, "cheetah", (224, 64, 64)), (2, "fox", (160, 96, 64)),
        (3, "hyena", (7, 73, 80)), (4, "lion", (32, 128, 224)), (5, "tiger", (112, 192, 192)),
        (6, "wolf", (102, 178, 138))]
    assert table.source == "labelmap.txt" and table.ignore_index is None


def test_cvat_labelmap_background_is_id_0_wherever_listed(tmp_path: Path) -> None:
    """CVAT numbers ``background`` 0: a map listing it second still gives it id 0 (and parts/actions are ignored)."""
    path = tmp_path / "labelmap.txt"
    path.write_text("# label:color_rgb:parts:actions\nDNA:255,255,255:nucleus:dividing\nbackground:0,0,0::\n")
    table = read_classes(path)
    assert [(c.name, c.colour) for c in table.classes] == [("background", (0, 0, 0)), ("DNA", (255, 255, 255))]


def test_cvat_labelmap_duplicate_colour_is_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "labelmap.txt"
    path.write_text("background:0,0,0::\ncat:1,2,3::\ndog:1,2,3::\n")
    with pytest.raises(LabelError, match="share colour"):
        read_palette(path)
