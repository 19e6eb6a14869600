"""The labelme source: labels.txt or the names found, every shape type drawn by labelme's rule (PIL ImageDraw
calls made as labelme's shape_to_mask makes them), real examples against labelme2voc's own PNGs."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import PIL.ImageDraw
import pytest

from shardkit.errors import LabelError
from shardkit.labels.sources import registry
from shardkit.labels.sources.base import Policies, rasterise
from shardkit.labels.sources.labelme import LabelmeSource
from tests.annotation_trees import DATA, VOC_NEW, VOC_OLD, labelme_tree
from tests.reference import labelme_shape


def labelme_rule(h: int, w: int, shapes: list[dict[str, Any]], ids: dict[str, int]) -> np.ndarray:
    """labelme's own ``shapes_to_label`` (``tests/reference/labelme_shape.py``, a byte-for-byte copy of labelme
    7.1.0's ``labelme/_utils/shape.py``), with each ``mask`` shape's base64 PNG decoded as labelme's ``LabelFile``
    decodes it (``img_b64_to_arr(...).astype(bool)``); ``__ignore__`` → labelme2voc's 255 via ``ids``."""
    decoded = []
    for s in shapes:
        shape = {**s, "shape_type": s.get("shape_type"), "group_id": s.get("group_id")}
        if s.get("shape_type") == "mask":
            shape["mask"] = np.array(PIL.Image.open(io.BytesIO(base64.b64decode(s["mask"])))).astype(bool)
        decoded.append(shape)
    cls, _ = labelme_shape.shapes_to_label((h, w), decoded, ids)
    return cls


def test_real_examples_follow_labelme(tmp_path: Path) -> None:
    root = labelme_tree(tmp_path / "lm")
    assert registry.detect(root) == [(LabelmeSource, root)]
    notes = LabelmeSource().read(root, root)
    assert notes.table.ignore_index == 255 and notes.table.classes[0].name == "_background_"
    assert notes.table.classes[15].name == "person"  # labelme2voc's ids: line number - 1
    names = {c.name: c.id for c in notes.table.classes} | {"__ignore__": 255}
    differ, differ_old = [], []
    for image, sample in notes.splits["all"]:
        ids, _ = rasterise(LabelmeSource(), sample, sample.height, sample.width, notes.table,
                           Policies("order", "class"))
        doc = json.loads(image.with_suffix(".json").read_text())
        np.testing.assert_array_equal(ids, labelme_rule(sample.height, sample.width, doc["shapes"], names))
        differ.append(int((np.array(PIL.Image.open(VOC_NEW / f"{image.stem}.png")) != ids).sum()))
        differ_old.append(int((np.array(PIL.Image.open(VOC_OLD / f"{image.stem}.png")) != ids).sum()))
    # labelme2voc's own exports (made with other labelme and Pillow versions): the older one equal everywhere,
    # the 2023 one differs at one polygon-edge pixel of 2011_000006 (of 187,500)
    assert differ_old == [0, 0, 0] and differ == [0, 1, 0]


def tree(tmp_path: Path, shapes: list[dict[str, Any]], labels: str | None = None, h: int = 40, w: int = 50) -> Path:
    root = tmp_path / "lm"
    root.mkdir()
    PIL.Image.new("RGB", (w, h)).save(root / "a.png")
    doc = {"version": "5.4.1", "shapes": shapes, "imagePath": "a.png", "imageHeight": h, "imageWidth": w,
           "imageData": None}
    (root / "a.json").write_text(json.dumps(doc))
    if labels is not None:
        (root / "labels.txt").write_text(labels)
    return root


def shape(label: str, kind: str, points: list[list[float]]) -> dict[str, Any]:
    return {"label": label, "points": points, "shape_type": kind, "group_id": None, "flags": {}}


def test_every_shape_type_by_labelme_rule(tmp_path: Path) -> None:
    shapes = [shape("road", "polygon", [[1.2, 1.7], [30.5, 3.1], [20.2, 25.9]]),
              shape("car", "rectangle", [[40.7, 30.2], [25.1, 20.9]]),
              shape("sign", "circle", [[10, 30], [14.5, 33]]),
              shape("lane", "line", [[0, 39], [49, 20]]),
              shape("lane", "linestrip", [[2, 2], [25, 15], [48, 3]]),
              shape("sign", "point", [[45.5, 5.5]]),
              shape("car", "oriented_rectangle", [[5, 10], [15, 5], [20, 15], [10, 20]])]
    root = tree(tmp_path, shapes)  # no labels.txt: _background_, then the names sorted
    notes = LabelmeSource().read(root, root)
    assert [c.name for c in notes.table.classes] == ["_background_", "car", "lane", "road", "sign"]
    (_, sample), = notes.splits["all"]
    ids, report = rasterise(LabelmeSource(), sample, 40, 50, notes.table, Policies("order", "class"))
    names = {c.name: c.id for c in notes.table.classes}
    np.testing.assert_array_equal(ids, labelme_rule(40, 50, shapes, names))
    assert report.objects == 7 and set(np.unique(ids)) == {0, 1, 2, 3, 4}


def test_labels_txt_and_unknown_label(tmp_path: Path) -> None:
    root = tree(tmp_path, [shape("cat", "polygon", [[1, 1], [9, 1], [5, 8]])], "__ignore__\n_background_\ndog\n")
    with pytest.raises(LabelError, match="label 'cat'") as info:
        LabelmeSource().read(root, root)
    assert "labels.txt" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("points", "kind", "words"), [
    ([[1, 1], [2, 2]], "polygon", "2 points"), ([[1, 1]], "circle", "1 points"),
    ([[float("nan"), 1], [2, 2], [3, 1]], "polygon", "NaN"), ([[1, 1], [2, 2], [3, 1]], "ellipse", "ellipse")])
def test_bad_shapes_are_refused(tmp_path: Path, points: list[list[float]], kind: str, words: str) -> None:
    root = tree(tmp_path, [shape("a", kind, points)])
    with pytest.raises(LabelError, match=words):
        LabelmeSource().read(root, root)


def test_missing_image_without_embedded_data_is_refused(tmp_path: Path) -> None:
    root = labelme_tree(tmp_path / "lm")
    (root / "2011_000025.jpg").unlink()
    with pytest.raises(LabelError, match=r"no image file '2011_000025\.jpg' beside it and no embedded imageData"):
        LabelmeSource().read(root, root)
    doc = json.loads((root / "2011_000025.json").read_text())
    doc["imageData"] = "not base64!"
    (root / "2011_000025.json").write_text(json.dumps(doc))
    with pytest.raises(LabelError, match="imageData is not base64"):
        LabelmeSource().read(root, root)


TUTORIAL = DATA / "labelme-tutorial"


def tutorial_tree(root: Path, with_image: bool = True) -> Path:
    """labelme's tutorial file (imageData = the bytes of apc2016_obj3.jpg; its imagePath names the JSON itself),
    with or without the image file beside it."""
    root.mkdir()
    shutil.copy(TUTORIAL / "apc2016_obj3.json", root)
    if with_image:
        shutil.copy(TUTORIAL / "apc2016_obj3.jpg", root)
    return root.resolve()


def test_embedded_image_data_when_no_image_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Without the image file the embedded imageData is the image (keyed as the file would be), and the run says
    so; with the file the file is read (imagePath names the JSON itself: never taken for the image)."""
    root = tutorial_tree(tmp_path / "with")
    ((image, sample),) = LabelmeSource().read(root, root).splits["all"]
    assert image == root / "apc2016_obj3.jpg" and sample.key == "apc2016_obj3.jpg" and not sample.embedded
    bare = tutorial_tree(tmp_path / "bare", with_image=False)
    with caplog.at_level("WARNING"):
        ((image, sample),) = LabelmeSource().read(bare, bare).splits["all"]
    assert image == bare / "apc2016_obj3.json" and sample.key == "apc2016_obj3.jpg"
    assert sample.embedded == (TUTORIAL / "apc2016_obj3.jpg").read_bytes()
    assert "image embedded in each (imageData) was used (first: apc2016_obj3.json)" in caplog.text


def test_image_path_from_another_machine_and_outside(tmp_path: Path) -> None:
    """An absolute imagePath from the annotator's machine falls back to the file beside the JSON; a path that
    leaves the input folder with nothing beside is refused, never read."""
    root = tree(tmp_path, [shape("a", "polygon", [[1, 1], [9, 1], [5, 8]])])
    doc = json.loads((root / "a.json").read_text())
    doc["imagePath"] = "C:\\Users\\me\\data\\a.png"
    (root / "a.json").write_text(json.dumps(doc))
    (image, _), = LabelmeSource().read(root.resolve(), root.resolve()).splits["all"]
    assert image == (root / "a.png").resolve()
    doc["imagePath"] = "../../secret.png"
    (root / "a.json").write_text(json.dumps(doc))
    (root / "a.png").unlink()
    with pytest.raises(LabelError, match="outside the input folder"):
        LabelmeSource().read(root.resolve(), root.resolve())


def test_deep_labelme_json_is_one_line(tmp_path: Path) -> None:
    root = tree(tmp_path, [])
    (root / "a.json").write_text('{"shapes": [], "imagePath": ' + "[" * 50_000 + "]" * 50_000 + "}")
    with pytest.raises(LabelError) as info:
        LabelmeSource().read(root, root)
    assert "\n" not in str(info.value)


def test_real_primitives_every_shape_type_and_a_mask(tmp_path: Path) -> None:
    """labelme's own examples/primitives: rectangle, circle, polygon, line, point, linestrip (fractional points)
    and a mask shape (a base64 PNG patch), against labelme's rule."""
    root = tmp_path / "prim"
    shutil.copytree(DATA / "labelme-primitives", root)
    notes = LabelmeSource().read(root.resolve(), root.resolve())
    (_, sample), = notes.splits["all"]
    doc = json.loads((root / "primitives.json").read_text())
    assert {s["shape_type"] for s in doc["shapes"]} >= {"mask", "linestrip", "circle", "point", "line"}
    ids, report = rasterise(LabelmeSource(), sample, sample.height, sample.width, notes.table,
                            Policies("order", "class"))
    names = {c.name: c.id for c in notes.table.classes}
    np.testing.assert_array_equal(ids, labelme_rule(sample.height, sample.width, doc["shapes"], names))
    assert report.lost == [] and (ids == names["octagon"]).sum() > 1000
