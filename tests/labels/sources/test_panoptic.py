"""The COCO panoptic source: panopticapi's real sample data detected and rasterised bit-exactly against an
independent numpy reading of the format (rgb2id, segments_info → category, void 0 → ignore); hostile PNGs and
JSON refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from shardkit.errors import LabelError
from shardkit.labels.sources import registry
from shardkit.labels.sources.base import Policies, rasterise
from shardkit.labels.sources.panoptic import CocoPanopticSource
from tests.annotation_trees import panoptic_tree


def reference(root: Path, png_name: str, crowd: str = "class") -> np.ndarray:
    """panopticapi's reading: rgb2id on the PNG, each segment's pixels its category (contiguous in category id
    order), void and unlisted pixels 255; crowd segments 255 (ignore), their class, or 255 left as void (drop)."""
    doc = json.loads((root / "panoptic_examples.json").read_text())
    stored = {c: i for i, c in enumerate(sorted(c["id"] for c in doc["categories"]))}
    (ann,) = [a for a in doc["annotations"] if a["file_name"] == png_name]
    rgb = np.array(Image.open(root / "panoptic_examples" / png_name), dtype=np.uint32)
    pan = rgb[:, :, 0] + 256 * rgb[:, :, 1] + 256 * 256 * rgb[:, :, 2]
    out = np.full(pan.shape, 255, dtype=np.int64)
    for s in ann["segments_info"]:
        if s["iscrowd"] and crowd != "class":
            continue
        out[pan == s["id"]] = stored[s["category_id"]]
    return out


def test_real_panoptic_sample_is_detected_and_bit_exact(tmp_path: Path) -> None:
    root = panoptic_tree(tmp_path / "pan")
    assert registry.detect(root) == [(CocoPanopticSource, root / "panoptic_examples.json")]
    notes = CocoPanopticSource().read(root, root / "panoptic_examples.json")
    assert len(notes.table.classes) == 133 and notes.table.ignore_index == 255
    assert notes.table.classes[0].name == "person" and notes.original_ids[:2] == (1, 2)
    (split,) = notes.splits
    assert split == "examples"
    samples = notes.splits[split]
    assert [s.key for _, s in samples] == ["examples/000000142238.jpg", "examples/000000439180.jpg"]
    crowded = 0
    for _, sample in samples:
        for crowd in ("drop", "ignore", "class"):  # the report checked below is the last one's (class)
            ids, report = rasterise(CocoPanopticSource(), sample, sample.height, sample.width, notes.table,
                                    Policies("order", crowd))
            expected = reference(root, Path(sample.key).with_suffix(".png").name, crowd)
            np.testing.assert_array_equal(ids, expected)
        assert report.objects == len(sample.objects) and report.lost == [] and report.painted_over == 0
        assert report.unlabelled == int(np.count_nonzero(reference(root, Path(sample.key).with_suffix(".png").name)
                                                         == 255))
        crowded += report.crowd_pixels
        assert 0 < report.unlabelled < sample.height * sample.width  # the sample has void pixels
    assert crowded > 0  # the sample has crowd segments, so the three crowd policies differ


def _edit(root: Path, edit: Any) -> None:
    doc = json.loads((root / "panoptic_examples.json").read_text())
    edit(doc)
    (root / "panoptic_examples.json").write_text(json.dumps(doc))


def _paint(root: Path) -> None:
    notes = CocoPanopticSource().read(root, root / "panoptic_examples.json")
    for _, sample in notes.splits["examples"]:
        rasterise(CocoPanopticSource(), sample, sample.height, sample.width, notes.table, Policies("order", "class"))


def test_segment_missing_from_the_json_is_named_with_its_pixel_count(tmp_path: Path) -> None:
    root = panoptic_tree(tmp_path / "pan")
    doc = json.loads((root / "panoptic_examples.json").read_text())
    dropped = doc["annotations"][0]["segments_info"][3]
    rgb = np.array(Image.open(root / "panoptic_examples" / doc["annotations"][0]["file_name"]), dtype=np.int64)
    count = int(np.count_nonzero(rgb[:, :, 0] + 256 * rgb[:, :, 1] + 65536 * rgb[:, :, 2] == dropped["id"]))
    _edit(root, lambda d: d["annotations"][0]["segments_info"].pop(3))
    with pytest.raises(LabelError) as err:
        _paint(root)
    message = str(err.value)
    assert f"segment id {dropped['id']} ({count} pixels)" in message and "\n" not in message
    assert doc["annotations"][0]["file_name"] in message


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda d: d["annotations"][0]["segments_info"][0].update(category_id=9999), "category id 9999"),
    (lambda d: d["annotations"][0]["segments_info"][0].update(id=2**24), "segment id"),
    (lambda d: d["annotations"][0].update(file_name="../../etc/passwd"), "outside the input folder"),
    (lambda d: d["annotations"][1]["segments_info"].append(d["annotations"][1]["segments_info"][0]), "twice"),
    (lambda d: d["annotations"][0].update(file_name="nothere.png"), "missing"),
    (lambda d: d.update(annotations=[d["annotations"][0], d["annotations"][0]]), "referenced twice"),
])
def test_hostile_json_is_refused_in_one_line(tmp_path: Path, edit: Any, needle: str) -> None:
    root = panoptic_tree(tmp_path / "pan")
    _edit(root, edit)
    with pytest.raises(LabelError) as err:
        _paint(root)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_png_of_the_wrong_size_or_kind_is_refused(tmp_path: Path) -> None:
    root = panoptic_tree(tmp_path / "pan")
    png = root / "panoptic_examples" / "000000142238.png"
    Image.fromarray(np.zeros((10, 10, 3), np.uint8)).save(png)
    with pytest.raises(LabelError, match="10x10"):
        _paint(root)
    Image.fromarray(np.full((427, 640), 7, np.uint8)).save(png)  # gray: read as RGB (7, 7, 7), an unknown id
    with pytest.raises(LabelError, match=f"segment id {7 * 65793} \\(273280 pixels\\)"):
        _paint(root)


def test_policies_other_than_order_are_not_offered() -> None:
    assert CocoPanopticSource.overlaps == ("order",) and CocoPanopticSource.void_is_ignore


def test_png_with_segments_but_none_listed_is_refused(tmp_path: Path) -> None:
    root = panoptic_tree(tmp_path / "pan")
    _edit(root, lambda d: d["annotations"][1].update(segments_info=[]))
    with pytest.raises(LabelError, match="is in the PNG but not in its segments_info"):
        _paint(root)
