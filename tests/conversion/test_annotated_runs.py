"""Re-runs of ``shardkit convert`` on annotation sources: an unchanged input takes the no-op fast path; an edited
annotation file (COCO JSON, labelme JSON, CVAT XML, a panoptic PNG, an instance mask) is a change and the run
re-converts with the new labels — also when the file lives outside the input folder, and when an edit keeps its
size and mtime (the rule mask images get: size, mtime, ctime and inode)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import shardkit
from shardkit.cli import main
from tests.annotation_trees import coco_tree, labelme_tree, panoptic_tree
from tests.labels.sources.test_coco import semantic_reference
from tests.labels.sources.test_cvat import reference as cvat_reference
from tests.labels.sources.test_cvat import tree as cvat_tree
from tests.labels.sources.test_cvat import xml as cvat_xml
from tests.labels.sources.test_instances import REAL as DSB
from tests.labels.sources.test_instances import union
from tests.labels.sources.test_labelme import labelme_rule
from tests.labels.sources.test_panoptic import reference as panoptic_reference

pytest.importorskip("pycocotools")
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def run(*args: Any) -> Any:
    res = CliRunner().invoke(main, ["convert", *(str(a) for a in args), "--workers", "1"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res


def unchanged(res: Any) -> bool:
    return "nothing changed" in res.output


def same_stat_edit(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` the file anew, then give it back its old mtime; the size must come out the same (``touch -r``
    after an edit that kept the size): only ctime and inode still tell."""
    st = path.stat()
    write(path)
    assert path.stat().st_size == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def instance_tree(root: Path) -> Path:
    shutil.copytree(DSB, root)
    return root.resolve()


TREES: dict[str, Callable[[Path], Path]] = {
    "coco": coco_tree, "labelme": labelme_tree, "coco-panoptic": panoptic_tree, "instance-masks": instance_tree,
    "cvat": lambda root: cvat_tree(root, cvat_xml())}


@pytest.mark.parametrize("kind", sorted(TREES))
def test_unchanged_rerun_takes_the_fast_path(tmp_path: Path, kind: str) -> None:
    raw = TREES[kind](tmp_path / "raw")
    first = run(raw, tmp_path / "out")
    assert not unchanged(first) and f"annotations: {kind} in" in first.output
    again = run(raw, tmp_path / "out")
    # the replayed lines still say where the labels and the table came from
    assert unchanged(again) and f"annotations: {kind} in" in again.output


def test_edited_labelme_file_is_a_change(tmp_path: Path) -> None:
    raw = labelme_tree(tmp_path / "raw")
    run(raw, tmp_path / "out")
    path = raw / "2011_000003.json"
    doc = json.loads(path.read_text())
    doc["shapes"] = doc["shapes"][1:]
    path.write_text(json.dumps(doc))
    res = run(raw, tmp_path / "out")
    assert not unchanged(res)
    ds = shardkit.open(tmp_path / "out" / "all")
    names = {c.name: c.id for c in ds.manifest.classes.classes} | {"__ignore__": 255}
    (i,) = [i for i in range(len(ds)) if ds.key(i) == "2011_000003.jpg"]
    label = ds[i][1]
    np.testing.assert_array_equal(label, labelme_rule(*label.shape, doc["shapes"], names))


def test_edited_cvat_xml_is_a_change(tmp_path: Path) -> None:
    raw = cvat_tree(tmp_path / "raw", cvat_xml(shapes=""))
    run(raw, tmp_path / "out")
    assert not shardkit.open(tmp_path / "out" / "all")[0][1].any()
    (raw / "annotations.xml").write_text(cvat_xml())
    assert not unchanged(run(raw, tmp_path / "out"))
    np.testing.assert_array_equal(shardkit.open(tmp_path / "out" / "all")[0][1], cvat_reference())


def _stored_png(path: Path, pixels: np.ndarray) -> None:
    """An uncompressed PNG: its size depends only on the picture's shape, so an edit can keep it."""
    Image.fromarray(pixels).save(path, compress_level=0)


def test_panoptic_png_edited_keeping_size_and_mtime_is_a_change(tmp_path: Path) -> None:
    raw = panoptic_tree(tmp_path / "raw")
    png = raw / "panoptic_examples" / "000000142238.png"
    rgb = np.array(Image.open(png))
    _stored_png(png, rgb)
    run(raw, tmp_path / "out")
    doc = json.loads((raw / "panoptic_examples.json").read_text())
    (ann,) = [a for a in doc["annotations"] if a["file_name"] == png.name]
    first = ann["segments_info"][0]
    a = first["id"]
    b = next(s["id"] for s in ann["segments_info"] if s["category_id"] != first["category_id"])
    c = rgb.astype(np.int64)
    ids = c[:, :, 0] + 256 * c[:, :, 1] + 65536 * c[:, :, 2]
    edited = rgb.copy()
    edited[ids == a] = [b % 256, b // 256 % 256, b // 65536]  # one segment's pixels given to another segment
    same_stat_edit(png, lambda p: _stored_png(p, edited))
    assert not unchanged(run(raw, tmp_path / "out"))
    ds = shardkit.open(tmp_path / "out" / "examples")
    (i,) = [i for i in range(len(ds)) if Path(ds.key(i)).stem == png.stem]
    want = panoptic_reference(raw, png.name)
    assert (want != panoptic_reference(panoptic_tree(tmp_path / "orig"), png.name)).any()
    np.testing.assert_array_equal(ds[i][1], want)


def test_instance_mask_edited_keeping_size_and_mtime_is_a_change(tmp_path: Path) -> None:
    raw = instance_tree(tmp_path / "raw")
    folder = sorted((raw / "stage1_train").iterdir())[0]
    mask = sorted((folder / "masks").glob("*.png"))[0]
    bits = np.array(Image.open(mask))
    _stored_png(mask, bits)
    run(raw, tmp_path / "out")
    edited = bits.copy()
    edited[: bits.shape[0] // 2] = 0  # half of the nucleus (and the rest of the top half) cleared
    edited[0, 0] = bits.max()  # the mask stays binary with one object value
    same_stat_edit(mask, lambda p: _stored_png(p, edited))
    assert not unchanged(run(raw, tmp_path / "out"))
    ds = shardkit.open(tmp_path / "out" / "stage1_train")
    (i,) = [i for i in range(len(ds)) if Path(ds.key(i)).parent.parent.name == folder.name]
    want = union(folder)
    assert (want != union(DSB / "stage1_train" / folder.name)).any()
    np.testing.assert_array_equal(ds[i][1], want)


def test_coco_file_outside_the_input_edited_keeping_size_and_mtime(tmp_path: Path) -> None:
    raw = coco_tree(tmp_path / "raw")
    elsewhere = tmp_path / "elsewhere" / "instances_all.json"  # split "all"
    elsewhere.parent.mkdir()
    shutil.move(raw / "annotations.json", elsewhere)
    flag = f"coco:{elsewhere}"
    run(raw, tmp_path / "out", "--annotations", flag)
    assert unchanged(run(raw, tmp_path / "out", "--annotations", flag))
    doc = json.loads(elsewhere.read_text())
    text = json.dumps(doc)
    old = doc["annotations"][0]["category_id"]
    new = next(c["id"] for c in doc["categories"] if len(str(c["id"])) == len(str(old)) and c["id"] != old)
    doc["annotations"][0]["category_id"] = new
    same_stat_edit(elsewhere, lambda p: p.write_text(json.dumps(doc)))
    assert len(json.dumps(doc)) == len(text)
    assert not unchanged(run(raw, tmp_path / "out", "--annotations", flag))
    ds = shardkit.open(tmp_path / "out" / "all")
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i][1], semantic_reference(elsewhere, ds.key(i), {i: i for i in range(21)}))


def test_labelme_folder_outside_the_input_is_watched(tmp_path: Path) -> None:
    """``--annotations labelme:FOLDER`` elsewhere (the photos in the input folder, named by absolute imagePath):
    an edited file in that folder is a change, though no option names it."""
    shapes = labelme_tree(tmp_path / "shapes")
    raw = tmp_path / "raw"
    raw.mkdir()
    for photo in shapes.glob("*.jpg"):
        shutil.move(photo, raw / photo.name)
    for path in shapes.glob("*.json"):
        doc = json.loads(path.read_text())
        doc["imagePath"] = str((raw / doc["imagePath"]).resolve())
        path.write_text(json.dumps(doc))
    flag = f"labelme:{shapes}"
    run(raw, tmp_path / "out", "--annotations", flag)
    assert unchanged(run(raw, tmp_path / "out", "--annotations", flag))
    path = shapes / "2011_000003.json"
    doc = json.loads(path.read_text())
    doc["shapes"] = doc["shapes"][1:]
    path.write_text(json.dumps(doc))
    assert not unchanged(run(raw, tmp_path / "out", "--annotations", flag))
    ds = shardkit.open(tmp_path / "out" / "all")
    names = {c.name: c.id for c in ds.manifest.classes.classes} | {"__ignore__": 255}
    (i,) = [i for i in range(len(ds)) if ds.key(i) == "2011_000003.jpg"]
    np.testing.assert_array_equal(ds[i][1], labelme_rule(*ds[i][1].shape, doc["shapes"], names))


@pytest.mark.parametrize("kind", sorted(TREES))
def test_dry_run_says_source_table_policies_and_counts_and_writes_nothing(tmp_path: Path, kind: str) -> None:
    raw = TREES[kind](tmp_path / "raw")
    before = sorted((p.relative_to(raw), p.stat().st_mtime_ns) for p in raw.rglob("*"))
    res = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "out"), "--dry-run", "--crowd", "drop"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    source = next(ln for ln in lines if ln.startswith("labels drawn from "))
    assert f"from {kind} annotations: " in source
    policies = next(ln for ln in lines if ln.startswith("policies: "))
    overlap = "z-order" if kind == "cvat" else "order"
    assert f"--object-overlap {overlap}, --crowd drop, --on-lost-object warn" in policies
    assert "class table file" not in res.stdout  # (a mask layout's line: no such file is read here)
    counts = {ln.split(":")[0]: ln.split(": ")[1] for ln in lines if ln.startswith("split ")}
    want = {"coco": {"split all": "3 samples"}, "labelme": {"split all": "3 samples"},
            "coco-panoptic": {"split examples": "2 samples"}, "instance-masks": {"split stage1_train": "3 samples"},
            "cvat": {"split all": "1 samples"}}[kind]
    assert counts == want
    assert any(ln.startswith("classes: ") and " from " in ln for ln in lines)  # the table's origin
    assert not (tmp_path / "out").exists()
    assert sorted((p.relative_to(raw), p.stat().st_mtime_ns) for p in raw.rglob("*")) == before


def test_info_and_info_json_give_the_rasterisation_report(tmp_path: Path) -> None:
    """``info`` prints the report of an annotated split; ``info --json`` gives each split's ``source.annotations``
    as the manifest holds it (from a split folder or from the output folder)."""
    raw = TREES["cvat"](tmp_path / "raw")
    run(raw, tmp_path / "out")
    notes = json.loads((tmp_path / "out" / "all" / "manifest.json").read_text())["source"]["annotations"]
    assert notes["report"]["degenerate"] == 1 and notes["report"]["objects"] >= 4
    for where in (tmp_path / "out" / "all", tmp_path / "out"):
        res = CliRunner().invoke(main, ["info", str(where), "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout) == {"all": notes}
    text = CliRunner().invoke(main, ["info", str(tmp_path / "out" / "all")]).stdout
    r = notes["report"]
    assert "annotations: cvat (annotations.xml), overlap z-order, crowd class; classes from " in text
    assert f"{r['objects']} objects in 1 samples: {r['painted_over']} pixels painted over by a later object" in text
    lost = ", ".join(r["lost_ids"])
    assert f"{r['degenerate']} degenerate, {r['lost_objects']} objects with no visible pixel: {lost}" in text


def _as_label_images(split: Path, raw: Path, tree: Path) -> Path:
    """The converted split's labels written as label PNGs beside copies of the same image files (images/ +
    labels/): what exporting the annotations to label images first would give."""
    ds = shardkit.open(split)
    (tree / "images").mkdir(parents=True)
    (tree / "labels").mkdir()
    for i in range(len(ds)):
        name = Path(ds.key(i)).name
        shutil.copy(raw / ds.key(i), tree / "images" / name)
        Image.fromarray(ds[i][1]).save(tree / "labels" / Path(name).with_suffix(".png"))
    return tree


@pytest.mark.parametrize("kind", ["coco", "coco-panoptic"])
def test_tile_cuts_the_rasterised_labels_as_it_cuts_label_images(tmp_path: Path, kind: str) -> None:
    """``--tile`` with an annotation source: the shapes drawn at the full image size, then tiled exactly as the same
    labels given as label images (same tiles, same pixels, same ids); the report is the untiled run's."""
    raw = TREES[kind](tmp_path / "raw")
    split = "examples" if kind == "coco-panoptic" else "all"
    run(raw, tmp_path / "whole")
    masks = _as_label_images(tmp_path / "whole" / split, raw, tmp_path / "masks")
    tile = ("--tile", "160x192", "--overlap", "32x16")
    res = run(raw, tmp_path / "tiled", *tile)
    assert "annotations: " in res.output
    classes = len(shardkit.open(tmp_path / "whole" / split).class_names)  # the ids kept as they are
    run(masks, tmp_path / "oracle", *tile, "--ignore-index", "255", "--num-classes", classes)
    got, want = shardkit.open(tmp_path / "tiled" / split), shardkit.open(tmp_path / "oracle" / "all")
    assert len(got) == len(want) > 3 * 6
    for i in range(len(got)):
        a, b = got.tile(i), want.tile(i)
        assert Path(a.key).name == Path(b.key).with_suffix(Path(a.key).suffix).name and a.values == b.values
        np.testing.assert_array_equal(got[i][0], want[i][0])
        np.testing.assert_array_equal(got[i][1], want[i][1])
    manifest = json.loads((tmp_path / "tiled" / split / "manifest.json").read_text())
    untiled = json.loads((tmp_path / "whole" / split / "manifest.json").read_text())
    assert manifest["source"]["annotations"]["report"] == untiled["source"]["annotations"]["report"]


def test_tile_refuses_an_image_it_would_read_window_by_window(tmp_path: Path) -> None:
    """Shapes are drawn at the whole image's size: an image above --max-pixels (which --tile reads window by
    window for label images) is one line naming it, before anything is written."""
    raw = coco_tree(tmp_path / "raw")
    res = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "out"), "--tile", "128x128",
                                    "--max-pixels", "150000"])
    lines = [ln for ln in res.output.splitlines() if ln.startswith("Error")]
    assert res.exit_code != 0 and len(lines) == 1 and "Traceback" not in res.output
    assert "drawn at the whole image's size" in lines[0] and ".jpg" in lines[0] and "--max-pixels" in lines[0]
    assert not (tmp_path / "out").exists()


def test_cvat_file_outside_the_input_is_read_and_watched(tmp_path: Path) -> None:
    """``--annotations cvat:/elsewhere/annotations.xml``: the images from the input folder; an edit is a change."""
    raw = cvat_tree(tmp_path / "raw", cvat_xml(shapes=""))
    elsewhere = tmp_path / "elsewhere" / "annotations.xml"
    elsewhere.parent.mkdir()
    shutil.move(raw / "annotations.xml", elsewhere)
    flag = f"cvat:{elsewhere}"
    run(raw, tmp_path / "out", "--annotations", flag)
    assert not shardkit.open(tmp_path / "out" / "all")[0][1].any()
    assert unchanged(run(raw, tmp_path / "out", "--annotations", flag))
    elsewhere.write_text(cvat_xml())
    assert not unchanged(run(raw, tmp_path / "out", "--annotations", flag))
    np.testing.assert_array_equal(shardkit.open(tmp_path / "out" / "all")[0][1], cvat_reference())


def test_an_edit_reconverts_only_the_shards_of_the_samples_it_changed(tmp_path: Path) -> None:
    """As for an edited mask image: each sample's shapes are part of its fingerprint, so the other shards are
    reused; for the COCO file (one file for every image) as for one labelme file per image."""
    for kind, edit in (("labelme", "2011_000003.json"), ("coco", "annotations.json")):
        raw = TREES[kind](tmp_path / kind)
        out = tmp_path / f"out-{kind}"
        assert "3 shards planned, 0 reused" in run(raw, out, "--shard-size", 1).output
        doc = json.loads((raw / edit).read_text())
        if kind == "labelme":
            doc["shapes"] = doc["shapes"][1:]
        else:  # one annotation of the second image left out
            second = sorted(doc["images"], key=lambda im: im["file_name"])[1]["id"]
            doc["annotations"].remove(next(a for a in doc["annotations"] if a["image_id"] == second))
        (raw / edit).write_text(json.dumps(doc))
        res = run(raw, out, "--shard-size", 1)
        assert "3 shards planned, 2 reused, 1 to write" in res.output, res.output
        ds = shardkit.open(out / "all")
        if kind == "coco":
            for i in range(len(ds)):
                np.testing.assert_array_equal(ds[i][1], semantic_reference(raw / edit, ds.key(i),
                                                                           {c: c for c in range(21)}))
        else:
            names = {c.name: c.id for c in ds.manifest.classes.classes} | {"__ignore__": 255}
            for i in range(len(ds)):
                shapes = json.loads((raw / ds.key(i)).with_suffix(".json").read_text())["shapes"]
                np.testing.assert_array_equal(ds[i][1], labelme_rule(*ds[i][1].shape, shapes, names))
        report = json.loads((out / "all" / "manifest.json").read_text())["source"]["annotations"]["report"]
        assert report["samples"] == 3  # the reused shards' reports are summed with the new one's


def test_tiled_dask_backend_is_byte_identical(tmp_path: Path) -> None:
    """``--tile`` with an annotation source on a Dask cluster writes the local pool's bytes."""
    pytest.importorskip("distributed")
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert
    from shardkit.store.records import content_digest

    raw = labelme_tree(tmp_path / "raw")
    digests = []
    for backend in ("local", "dask"):
        out = tmp_path / backend
        convert(ConvertConfig(raw, out, shard_size=ShardSize(samples=8), workers=2, backend=backend, quiet=True,
                              tile="200x200", overlap="40x40"))
        digests.append({p.name: content_digest(p) for p in sorted((out / "all").iterdir()) if p.is_file()})
    assert digests[0] == digests[1] and len(digests[0]) >= 4


def test_instance_mask_folders_outside_the_input_are_one_line(tmp_path: Path) -> None:
    """``--annotations instance-masks:FOLDER`` elsewhere: its images are outside the input, refused in one line
    (it was a ValueError traceback)."""
    (tmp_path / "input").mkdir()
    res = CliRunner().invoke(main, ["convert", str(tmp_path / "input"), str(tmp_path / "out"), "--annotations",
                                    f"instance-masks:{instance_tree(tmp_path / 'elsewhere')}"])
    lines = [ln for ln in res.output.splitlines() if ln.startswith("Error")]
    assert res.exit_code == 1 and len(lines) == 1 and "Traceback" not in res.output, res.output
    assert "outside the input folder" in lines[0] and "fix:" in lines[0]
    assert not (tmp_path / "out").exists()
