"""``shardkit convert`` on annotation sources end to end: a real COCO tree and a real labelme tree, found without
a flag, read back with shardkit.open bit-exact against the reference rules; policies and the report in the
manifest; hostile annotations one line with nothing written; an edited annotation file is a change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import shardkit
from shardkit.cli import main
from tests.annotation_trees import DATA, coco_tree, labelme_tree, panoptic_tree
from tests.labels.sources.test_coco import semantic_reference
from tests.labels.sources.test_cvat import reference as cvat_reference
from tests.labels.sources.test_cvat import tree as cvat_tree
from tests.labels.sources.test_cvat import xml as cvat_xml
from tests.labels.sources.test_labelme import labelme_rule, tutorial_tree
from tests.labels.sources.test_panoptic import reference as panoptic_reference

pytest.importorskip("pycocotools")
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def run(*args: Any) -> Any:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_coco_tree_converts_bit_exact(tmp_path: Path) -> None:
    raw = coco_tree(tmp_path / "raw")
    res = run("convert", raw, tmp_path / "out", "--workers", "1")
    assert res.exit_code == 0, res.output
    ds = shardkit.open(tmp_path / "out" / "all")
    assert len(ds) == 3
    stored = {i: i for i in range(21)}
    for i in range(len(ds)):
        _, label = ds[i]
        np.testing.assert_array_equal(label, semantic_reference(raw / "annotations.json", ds.key(i), stored))
    manifest = json.loads((tmp_path / "out" / "all" / "manifest.json").read_text())
    notes = manifest["source"]["annotations"]
    assert manifest["source"]["layout"] == "coco" and notes["overlap"] == "order" and notes["crowd"] == "class"
    assert notes["original_ids"] == list(range(21))
    report = notes["report"]
    assert report["samples"] == 3 and report["objects"] == 12 and report["lost_objects"] == 0
    assert report["unlabelled"] == int(sum((ds[i][1] == 0).sum() for i in range(3)))
    info = run("info", tmp_path / "out" / "all")
    assert "annotations: coco" in info.output and "painted over" in info.output
    # the no-op path: unchanged input, nothing to do; an edited annotation file is a change
    again = run("convert", raw, tmp_path / "out", "--workers", "1")
    assert "nothing changed" in again.output
    doc = json.loads((raw / "annotations.json").read_text())
    doc["annotations"] = [a for a in doc["annotations"] if a["id"] != doc["annotations"][0]["id"]]
    (raw / "annotations.json").write_text(json.dumps(doc))
    res = run("convert", raw, tmp_path / "out", "--workers", "1")
    assert res.exit_code == 0
    ds = shardkit.open(tmp_path / "out" / "all")
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i][1], semantic_reference(raw / "annotations.json", ds.key(i), stored))


def test_labelme_tree_converts_bit_exact(tmp_path: Path) -> None:
    raw = labelme_tree(tmp_path / "raw")
    res = run("convert", raw, tmp_path / "out", "--workers", "1", "--object-overlap", "area")
    assert res.exit_code == 0, res.output
    ds = shardkit.open(tmp_path / "out" / "all")
    names = {c.name: c.id for c in ds.manifest.classes.classes} | {"__ignore__": 255}
    extra = json.loads((tmp_path / "out" / "all" / "manifest.json").read_text())["source"]
    assert extra["annotations"]["overlap"] == "area"
    res = run("convert", raw, tmp_path / "order", "--workers", "1")
    ds = shardkit.open(tmp_path / "order" / "all")
    for i in range(len(ds)):
        doc = json.loads((raw / ds.key(i)).with_suffix(".json").read_text())
        h, w = ds[i][1].shape
        np.testing.assert_array_equal(ds[i][1], labelme_rule(h, w, doc["shapes"], names))


def test_labelme_embedded_image_converts_as_the_file(tmp_path: Path) -> None:
    """labelme's tutorial JSON with its image file removed converts to the same samples (keys, image and label
    arrays) as with it, says it used the embedded image, and its labels follow labelme's rule."""
    tutorial = DATA / "labelme-tutorial"
    out = {}
    for name, with_image in (("file", True), ("embedded", False)):
        raw = tutorial_tree(tmp_path / f"raw-{name}", with_image)
        res = run("convert", raw, tmp_path / name, "--workers", "1")
        assert res.exit_code == 0, res.output
        out[name] = (shardkit.open(tmp_path / name / "all"), res.output)
    (file_ds, _), (embedded_ds, said) = out["file"], out["embedded"]
    assert "image embedded in each (imageData) was used" in said
    assert [file_ds.key(i) for i in range(len(file_ds))] == [embedded_ds.key(0)] == ["apc2016_obj3.jpg"]
    for a, b in zip(file_ds[0], embedded_ds[0], strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    names = {c.name: c.id for c in embedded_ds.manifest.classes.classes}
    assert next(iter(names)) == "_background_" and len(names) == 5
    doc = json.loads((tutorial / "apc2016_obj3.json").read_text())
    np.testing.assert_array_equal(embedded_ds[0][1], labelme_rule(907, 1210, doc["shapes"], names))
    again = run("convert", tmp_path / "raw-embedded", tmp_path / "embedded", "--workers", "1")
    assert "nothing changed" in again.output  # the unchanged JSON (which holds the image) costs a stat
    # the embedded image's header is held to --max-pixels before it is decoded, as a file's is
    res = CliRunner().invoke(main, ["convert", str(tmp_path / "raw-embedded"), str(tmp_path / "small"),
                                    "--max-pixels", "1000"])
    assert res.exit_code != 0 and not (tmp_path / "small").exists()
    assert "apc2016_obj3.json: image is 907x1210 = 1097470 pixels, more than --max-pixels 1000" in res.output


def test_labelme_embedded_image_that_is_no_image_is_one_line(tmp_path: Path) -> None:
    raw = tutorial_tree(tmp_path / "raw", with_image=False)
    doc = json.loads((raw / "apc2016_obj3.json").read_text())
    doc["imageData"] = "AAAA"  # base64 of three zero bytes
    (raw / "apc2016_obj3.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "out"), "--workers", "1"])
    assert res.exit_code != 0 and "Traceback" not in res.output and not (tmp_path / "out").exists()
    assert "apc2016_obj3.json: its embedded imageData (no image file lies beside it): cannot decode" in res.output


def test_hostile_annotation_file_one_line_nothing_written(tmp_path: Path) -> None:
    raw = coco_tree(tmp_path / "raw")
    doc = json.loads((raw / "annotations.json").read_text())
    doc["annotations"][3]["category_id"] = 4242
    (raw / "annotations.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "out")])
    lines = [ln for ln in res.output.splitlines() if ln.startswith("Error")]
    assert res.exit_code == 1 and len(lines) == 1 and "4242" in lines[0] and "Traceback" not in res.output
    assert not (tmp_path / "out").exists()


def test_lost_object_error(tmp_path: Path) -> None:
    raw = coco_tree(tmp_path / "raw")
    doc = json.loads((raw / "annotations.json").read_text())
    first = doc["annotations"][0]
    hidden = dict(first, id=999, segmentation=[[200, 200, 210, 200, 210, 210, 200, 210]], category_id=5)
    cover = dict(first, id=1000, segmentation=[[190, 190, 220, 190, 220, 220, 190, 220]], category_id=9)
    doc["annotations"] += [hidden, cover]
    (raw / "annotations.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "out"), "--on-lost-object", "error",
                                    "--workers", "1"])
    assert res.exit_code == 1 and "999" in res.output and "no visible pixel" in res.output
    res = run("convert", raw, tmp_path / "out2", "--workers", "1")
    report = json.loads((tmp_path / "out2" / "all" / "manifest.json").read_text())["source"][
        "annotations"]["report"]
    assert report["lost_objects"] == 1 and report["lost_ids"] == ["999"]
    res = run("convert", raw, tmp_path / "out3", "--workers", "1", "--object-overlap", "area")
    assert json.loads((tmp_path / "out3" / "all" / "manifest.json").read_text())["source"][
        "annotations"]["report"]["lost_objects"] == 0


def test_dask_backend_is_byte_identical(tmp_path: Path) -> None:
    """The shapes travel with each shard task: a Dask cluster writes the same bytes as the local pool."""
    pytest.importorskip("distributed")
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert
    from shardkit.store.records import content_digest

    raw = coco_tree(tmp_path / "raw")
    embedded = tutorial_tree(tmp_path / "embedded", with_image=False)  # the image only in labelme's imageData
    for root, files in ((raw, 4), (embedded, 2)):
        digests = []
        for backend in ("local", "dask"):
            out = tmp_path / f"{root.name}-{backend}"
            convert(ConvertConfig(root, out, shard_size=ShardSize(samples=1), workers=2, backend=backend,
                                  quiet=True))
            digests.append({p.name: content_digest(p) for p in sorted((out / "all").iterdir()) if p.is_file()})
        assert digests[0] == digests[1] and len(digests[0]) >= files


def test_instance_mask_folders_convert(tmp_path: Path) -> None:
    from tests.labels.sources.test_instances import REAL, union

    res = run("convert", REAL, tmp_path / "out", "--workers", "1")
    assert res.exit_code == 0, res.output
    ds = shardkit.open(tmp_path / "out" / "stage1_train")
    assert len(ds) == 3
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i][1], union(REAL / Path(ds.key(i)).parent.parent))


def test_image_size_unlike_the_annotations_is_refused_before_writing(tmp_path: Path) -> None:
    raw = coco_tree(tmp_path / "raw")
    doc = json.loads((raw / "annotations.json").read_text())
    doc["images"][2]["height"] += 1
    (raw / "annotations.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "out")])
    lines = [ln for ln in res.output.splitlines() if ln.startswith("Error")]
    name = doc["images"][2]["file_name"]
    assert res.exit_code == 1 and len(lines) == 1 and name in lines[0] and "(HxW)" in lines[0]
    assert not (tmp_path / "out").exists()


def test_coco_panoptic_tree_converts_bit_exact(tmp_path: Path) -> None:
    raw = panoptic_tree(tmp_path / "raw")
    res = run("convert", raw, tmp_path / "out", "--workers", "1")
    assert res.exit_code == 0, res.output
    ds = shardkit.open(tmp_path / "out" / "examples")
    assert len(ds) == 2 and ds.manifest.classes.classes[0].name == "person"
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i][1], panoptic_reference(raw, Path(ds.key(i)).with_suffix(".png").name))
    notes = json.loads((tmp_path / "out" / "examples" / "manifest.json").read_text())["source"]["annotations"]
    assert notes["crowd"] == "class" and notes["report"]["objects"] == 50 and notes["report"]["lost_objects"] == 0
    assert notes["report"]["unlabelled"] == int(sum((ds[i][1] == 255).sum() for i in range(2)))
    # an edited panoptic PNG is a change: one segment's pixels recoloured to another listed segment's id
    png = raw / "panoptic_examples" / "000000142238.png"
    rgb = np.array(Image.open(png))
    doc = json.loads((raw / "panoptic_examples.json").read_text())
    a, b = (s["id"] for s in doc["annotations"][0]["segments_info"][:2])
    c = rgb.astype(np.int64)
    ids = c[:, :, 0] + 256 * c[:, :, 1] + 65536 * c[:, :, 2]
    rgb[ids == a] = [b % 256, b // 256 % 256, b // 65536]
    Image.fromarray(rgb).save(png)
    res = run("convert", raw, tmp_path / "out", "--workers", "1")
    assert res.exit_code == 0 and "nothing changed" not in res.output, res.output
    ds = shardkit.open(tmp_path / "out" / "examples")
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i][1], panoptic_reference(raw, Path(ds.key(i)).with_suffix(".png").name))


def test_cvat_xml_converts_bit_exact_by_z_order(tmp_path: Path) -> None:
    raw = cvat_tree(tmp_path / "raw", cvat_xml())
    res = run("convert", raw, tmp_path / "out", "--workers", "1")
    assert res.exit_code == 0, res.output
    ds = shardkit.open(tmp_path / "out" / "all")
    np.testing.assert_array_equal(ds[0][1], cvat_reference())
    notes = json.loads((tmp_path / "out" / "all" / "manifest.json").read_text())["source"]["annotations"]
    assert notes["overlap"] == "z-order" and notes["report"]["degenerate"] == 1
