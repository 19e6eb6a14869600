"""The COCO instances source: class table from the categories, per-image labels bit-exact with pycocotools'
annToMask loop on a real COCO tree, hostile annotation files refused in one line."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardkit.errors import LabelError, ShardkitError
from shardkit.labels.sources import registry
from shardkit.labels.sources.base import Policies, rasterise
from shardkit.labels.sources.coco import CocoSource
from tests.annotation_trees import coco_tree

pycoco = pytest.importorskip("pycocotools.coco")
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def semantic_reference(path: Path, key: str, stored: dict[int, int]) -> np.ndarray:
    """The semantic mask an independent reading gives: pycocotools' annToMask per object, file order."""
    coco = pycoco.COCO(str(path))
    (iid,) = [i for i, im in coco.imgs.items() if im["file_name"] == key]
    im = coco.imgs[iid]
    out = np.zeros((im["height"], im["width"]), dtype=np.int64)
    for a in coco.loadAnns(coco.getAnnIds(imgIds=iid)):
        out[coco.annToMask(a) > 0] = stored[a["category_id"]]
    return out


def test_real_coco_tree_is_detected_and_bit_exact(tmp_path: Path) -> None:
    root = coco_tree(tmp_path / "coco")
    assert registry.detect(root) == [(CocoSource, root / "annotations.json")]
    notes = CocoSource().read(root, root / "annotations.json")
    assert notes.original_ids == tuple(range(21))  # its category 0 (_background_) is stored 0 itself
    assert notes.table.classes[15].name == "person"
    stored = {cid: i for i, cid in enumerate(notes.original_ids)}
    (samples,) = notes.splits.values()
    assert [s.key for _, s in samples] == [f"JPEGImages/2011_0000{n}.jpg" for n in ("03", "06", "25")]
    for _, sample in samples:
        ids, report = rasterise(CocoSource(), sample, sample.height, sample.width, notes.table,
                                Policies("order", "class"))
        np.testing.assert_array_equal(ids, semantic_reference(root / "annotations.json", sample.key, stored))
        assert report.objects == len(sample.objects) and report.lost == []


def write(tmp_path: Path, edit: Any) -> Path:
    root = coco_tree(tmp_path / "coco")
    doc = json.loads((root / "annotations.json").read_text())
    edit(doc)
    (root / "annotations.json").write_text(json.dumps(doc))
    return root


def test_categories_without_zero_get_a_background(tmp_path: Path) -> None:
    def shift(doc: dict[str, Any]) -> None:
        doc["categories"] = [dict(c, id=c["id"] * 10 + 5) for c in doc["categories"]]
        for a in doc["annotations"]:
            a["category_id"] = a["category_id"] * 10 + 5
    root = write(tmp_path, shift)
    notes = CocoSource().read(root, root / "annotations.json")
    assert notes.original_ids[:3] == (None, 5, 15) and notes.table.classes[0].name == "background"
    _, sample = notes.splits["all"][0]
    ids, _ = rasterise(CocoSource(), sample, sample.height, sample.width, notes.table, Policies("order", "class"))
    stored = {cid: i for i, cid in enumerate(notes.original_ids)}
    np.testing.assert_array_equal(ids, semantic_reference(root / "annotations.json", sample.key, stored))


def _set(path: str, value: Any) -> Any:
    def edit(doc: dict[str, Any]) -> None:
        target: Any = doc
        *parts, last = path.split(".")
        for p in parts:
            target = target[int(p)] if p.isdigit() else target[p]
        target[int(last) if last.isdigit() else last] = value
    return edit


HOSTILE = {
    "unknown category": (_set("annotations.0.category_id", 99), "category id 99"),
    "outside the folder": (_set("images.0.file_name", "../../etc/passwd"), "outside the input folder"),
    "nan coordinate": (_set("annotations.0.segmentation.0.0", float("nan")), "NaN"),
    "huge polygon": (_set("annotations.0.segmentation.0", [0, 0, 5e7, 0, 5e7, 5e7, 0, 5e7]), "steps long"),
    "rle overflow": (_set("annotations.0.segmentation", {"size": [338, 500], "counts": [4294967296, 5]}),
                     "oversized run"),
    "rle short": (_set("annotations.0.segmentation", {"size": [338, 500], "counts": [10, 5]}), "sum to 15"),
    "rle wrong size": (_set("annotations.0.segmentation", {"size": [3, 5], "counts": [15]}), "RLE size"),
    "image id twice": (lambda d: d["images"].append(copy.deepcopy(d["images"][0])), "appears twice"),
    "image named twice": (lambda d: d["images"].append(dict(d["images"][0], id=99)), "referenced twice"),
    "unknown image": (_set("annotations.0.image_id", 77), "image 77"),
    "negative height": (_set("images.0.height", -3), "height"),
    "box-like polygon": (_set("annotations.0.segmentation", [[1, 2, 3, 4]]), "box"),
    "missing image": (_set("images.1.file_name", "JPEGImages/gone.jpg"), "missing"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_annotations_one_line(tmp_path: Path, case: str) -> None:
    edit, words = HOSTILE[case]
    root = write(tmp_path, edit)
    with pytest.raises(LabelError, match=words) as info:
        CocoSource().read(root, root / "annotations.json")
    assert "\n" not in str(info.value) and "fix:" in str(info.value)


def test_deep_json_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "deep"
    root.mkdir()
    (root / "annotations.json").write_text('{"images": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ShardkitError) as info:
        CocoSource().read(root, root / "annotations.json")
    assert "\n" not in str(info.value)


def test_oversized_annotation_file_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardkit.labels.sources.coco as coco

    root = coco_tree(tmp_path / "coco")
    monkeypatch.setattr(coco, "MAX_COCO_BYTES", 1000)
    with pytest.raises(LabelError, match="more than the 1000 allowed") as info:
        CocoSource().read(root, root / "annotations.json")
    assert "\n" not in str(info.value)
