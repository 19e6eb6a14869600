"""Every new layout on real files (tests/data, see its README), each tree built in a read-only tmp folder.

DRIVE may not be redistributed: its trees are made from the shared CamVid files by tests/drive_like.py.

The dataset folders are made read-only (chmod) before discovery and conversion: nothing may be written there.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import shardkit
from shardkit.cli import main
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.layouts import discover
from shardkit.conversion.layouts.ade20k import find_base as find_ade_base
from shardkit.conversion.pipeline import convert
from shardkit.errors import LabelError, LayoutError
from tests.drive_like import drive_tree

DATA = Path(__file__).resolve().parents[2] / "data"


def build(root: Path, files: dict[str, Path]) -> Path:
    """Copy real files to ``root/<relative name>``; return root."""
    for rel, src in files.items():
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    return root


def _walk_dirs(root: Path) -> Iterator[Path]:
    yield root
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            yield Path(dirpath) / d


@pytest.fixture
def read_only() -> Iterator[list[Path]]:
    """Folders appended here are made read-only by :func:`freeze` and writable again after the test."""
    frozen: list[Path] = []
    yield frozen
    for root in frozen:
        for d in _walk_dirs(root):
            d.chmod(d.stat().st_mode | stat.S_IWUSR)


def freeze(root: Path, frozen: list[Path]) -> Path:
    for d in _walk_dirs(root):
        for f in d.iterdir():
            if f.is_file():
                f.chmod(stat.S_IRUSR | stat.S_IRGRP)
        d.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    frozen.append(root)
    return root


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every file and folder under root: equal before and after means nothing was written."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in [root, *root.rglob("*")]}


def lip_files(prefix: str = "{split}_images", labels: str = "{split}_segmentations") -> dict[str, Path]:
    lip = DATA / "mmseg" / "pseudo_lip_dataset"
    out = {}
    for split, stem in (("train", "684_2150041"), ("val", "86_185913")):
        out[f"{prefix.format(split=split)}/{stem}.jpg"] = lip / f"{split}_images" / f"{stem}.jpg"
        out[f"{labels.format(split=split)}/{stem}.png"] = lip / f"{split}_segmentations" / f"{stem}.png"
    return out


def pairs_of(found, split: str) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(p.key, p.label.relative_to(found.root).as_posix()) for p in found.splits[split]]


def stored_labels(split_dir: Path) -> list[np.ndarray]:
    from shardkit.read.dataset import Dataset

    ds = Dataset(split_dir)
    return [ds[i][1] for i in range(len(ds))]


# --- DRIVE: split folders above, TIFF images, GIF labels, a shared name part -------------------------------


def test_drive_pairs_1st_manual_by_shared_name_part_not_the_fov_masks(tmp_path: Path, read_only: list[Path],
                                                                      camvid_root: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    root = freeze(drive_tree(tmp_path / "DRIVE", camvid_root), read_only)
    with caplog.at_level(logging.WARNING):
        found = discover(root)
    assert found.layout == "split_dirs" and list(found.splits) == ["test", "training"]
    assert pairs_of(found, "training") == [("training/images/21_training.tif", "training/1st_manual/21_manual1.gif")]
    assert pairs_of(found, "test") == [("test/images/01_test.tif", "test/1st_manual/01_manual1.gif")]
    assert "labels from 1st_manual/, ignoring mask/" in caplog.text


def test_drive_flat_image_and_1st_manual_folders_are_the_generic_layout(tmp_path: Path, read_only: list[Path],
                                                                         camvid_root: Path) -> None:
    d = drive_tree(tmp_path / "made", camvid_root, (("training", "21"),), with_fov_masks=False) / "training"
    root = freeze(build(tmp_path / "drive", {"images/21_training.tif": d / "images/21_training.tif",
                                             "1st_manual/21_manual1.gif": d / "1st_manual/21_manual1.gif"}),
                  read_only)
    found = discover(root)
    assert found.layout == "generic"
    assert pairs_of(found, "all") == [("images/21_training.tif", "1st_manual/21_manual1.gif")]


def test_drive_explicit_templates_pair_tif_with_gif_by_the_shared_part(tmp_path: Path, read_only: list[Path],
                                                                        camvid_root: Path) -> None:
    root = freeze(drive_tree(tmp_path / "DRIVE", camvid_root), read_only)
    found = discover(root, images="{split}/images/{name}_*.tif", labels="{split}/1st_manual/{name}_manual1.gif")
    assert found.layout == "pattern" and list(found.splits) == ["test", "training"]
    assert pairs_of(found, "training") == [("training/images/21_training.tif", "training/1st_manual/21_manual1.gif")]
    # the FOV masks chosen explicitly instead: the templates decide, nothing else
    masks = discover(root, images="{split}/images/{name}.tif", labels="{split}/mask/{name}_mask.gif")
    assert pairs_of(masks, "test") == [("test/images/01_test.tif", "test/mask/01_test_mask.gif")]


# --- ISBI membranes: image/ + label/ (singular), 0/255 masks --------------------------------------------------


def test_membranes_singular_folders_with_split_above(tmp_path: Path, read_only: list[Path]) -> None:
    m = DATA / "isbi-em"
    root = freeze(build(tmp_path / "membrane", {f"train/{k}/{i}.png": m / k / f"{i}.png"
                                                for k in ("image", "label") for i in (0, 1)}), read_only)
    found = discover(root)
    assert found.layout == "split_dirs"
    assert pairs_of(found, "train") == [("train/image/0.png", "train/label/0.png"),
                                        ("train/image/1.png", "train/label/1.png")]


def test_membranes_0_255_masks_are_refused_with_the_flags_that_say_what_255_means(
        tmp_path: Path, read_only: list[Path]) -> None:
    m = DATA / "isbi-em"
    before = build(tmp_path / "membrane", {f"{k}/{i}.png": m / k / f"{i}.png" for k in ("image", "label")
                                           for i in (0, 1)})
    root = freeze(before, read_only)
    state = snapshot(root)
    with pytest.raises(LabelError) as e:
        convert(ConvertConfig(root, tmp_path / "out", workers=1, quiet=True))
    text = str(e.value)
    assert "label values 0 (" in text and "255 (" in text and "found in 2 label files" in text
    # never --ignore-index 255: followed, it would store the whole foreground as ignore (one class left)
    assert "--label-map 255:1 or --threshold 127" in text and "--ignore-index" not in text
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("manifest.json"))
    assert snapshot(root) == state


# --- labelme2voc: class_names.txt gives the classes, never PASCAL's built-in table --------------------------


@pytest.mark.parametrize("export", ["old", "new"])
def test_labelme2voc_export_takes_class_names_txt_and_converts_bit_exactly(
        tmp_path: Path, read_only: list[Path], export: str) -> None:
    src = DATA / "labelme2voc"
    label_dir = "SegmentationClassPNG" if export == "old" else "SegmentationClass"
    stems = ("2011_000003", "2011_000006", "2011_000025")
    files = {f"JPEGImages/{s}.jpg": src / "old" / "JPEGImages" / f"{s}.jpg" for s in stems}
    files |= {f"{label_dir}/{s}.png": src / export / label_dir / f"{s}.png" for s in stems}
    files["class_names.txt"] = src / export / "class_names.txt"
    root = freeze(build(tmp_path / "data_dataset_voc", files), read_only)
    state = snapshot(root)
    summary = convert(ConvertConfig(root, tmp_path / "out", workers=1, quiet=True))
    assert summary.discovery.layout == "labelme2voc" and summary.discovery.label_kind == "palette"
    table = summary.table
    assert table.source == "class_names.txt" and table.ignore_index == 255
    assert table.names()[0] == "_background_" and table.names()[16] == "potted plant"  # not VOC's "pottedplant"
    assert "written by labelme2voc" in summary.table_reason
    manifest = json.loads((tmp_path / "out/all/manifest.json").read_text())
    assert manifest["classes"]["source"] == "class_names.txt" and manifest["source"]["layout"] == "labelme2voc"
    expected = [np.array(Image.open(src / export / label_dir / f"{s}.png")) for s in stems]
    for got, want in zip(stored_labels(tmp_path / "out/all"), expected, strict=True):
        assert np.array_equal(got, want)  # palette indices = class ids, 255 (__ignore__) kept
    assert snapshot(root) == state


def test_voc_layout_without_voc_names_or_folder_uses_the_ids_found_not_pascals_table(
        tmp_path: Path, read_only: list[Path]) -> None:
    """A palette dataset in the VOC tree that is not PASCAL VOC (here labelme's files renamed, no class_names.txt)
    gets its ids from the data, not "aeroplane" for id 1."""
    src = DATA / "labelme2voc"
    files = {}
    for i, s in enumerate(("2011_000003", "2011_000006", "2011_000025")):
        files[f"JPEGImages/crack_{i}.jpg"] = src / "old/JPEGImages" / f"{s}.jpg"
        files[f"SegmentationClass/crack_{i}.png"] = src / "old/SegmentationClassPNG" / f"{s}.png"
    root = freeze(build(tmp_path / "cracks", files), read_only)
    summary = convert(ConvertConfig(root, tmp_path / "out", workers=1, quiet=True, ignore_index=255, dry_run=True))
    assert summary.discovery.layout == "voc"
    assert summary.table.source == "scan:label-values" and summary.table.num_classes == 19  # ids 0..18 found
    assert "aeroplane" not in summary.table.names() and summary.table.ignore_index == 255
    # the same files under PASCAL VOC's own names are PASCAL VOC: its table
    voc = {k.replace("crack_0", "2011_000003").replace("crack_1", "2011_000006").replace("crack_2", "2011_000025"): v
           for k, v in files.items()}
    root2 = freeze(build(tmp_path / "voc", voc), read_only)
    summary2 = convert(ConvertConfig(root2, tmp_path / "out2", workers=1, quiet=True, dry_run=True))
    assert summary2.table.source == "builtin:voc" and "PASCAL VOC image names" in summary2.table_reason


def test_voc_layout_applies_vocs_255_ignore_convention_and_says_so(tmp_path: Path, read_only: list[Path]) -> None:
    """A VOC-layout palette dataset that is not PASCAL VOC converts without --ignore-index 255: 255 (the void
    border) is the ignore id by the format's own convention, logged; the labels are the palette indices."""
    src = DATA / "labelme2voc"
    files, labels = {}, {}
    for i, s in enumerate(("2011_000003", "2011_000006", "2011_000025")):
        files[f"JPEGImages/crack_{i}.jpg"] = src / "old/JPEGImages" / f"{s}.jpg"
        files[f"SegmentationClass/crack_{i}.png"] = labels[f"crack_{i}"] = src / "old/SegmentationClassPNG" / f"{s}.png"
    root = freeze(build(tmp_path / "cracks", files), read_only)
    summary = convert(ConvertConfig(root, tmp_path / "out", workers=1, quiet=True))
    assert summary.table.ignore_index == 255 and summary.table.num_classes == 19
    assert "ignore id 255 from the voc layout's convention" in summary.table_reason
    said = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "cli"), "--workers", "1", "--dry-run"])
    assert said.exit_code == 0 and "ignore id 255 from the voc layout's convention" in said.output
    ds = shardkit.open(tmp_path / "out" / "all")
    assert ds.manifest.classes["ignore_index"] == 255
    for i in range(len(ds)):
        with Image.open(labels[Path(ds.key(i)).stem]) as im:
            assert np.array_equal(ds[i][1], np.array(im))  # 255 kept, as the ignore id
    # the user's ignore id wins, and a value map turns the convention off (it says what 255 becomes)
    given = convert(ConvertConfig(root, tmp_path / "o2", workers=1, quiet=True, ignore_index=0, dry_run=True,
                                  num_classes=256))
    assert given.table.ignore_index == 0 and "convention" not in given.table_reason
    # PASCAL VOC itself keeps its own table and reason
    voc = {k.replace("crack_0", "2011_000003").replace("crack_1", "2011_000006").replace("crack_2", "2011_000025"): v
           for k, v in files.items()}
    summary2 = convert(ConvertConfig(freeze(build(tmp_path / "voc", voc), read_only), tmp_path / "out2", workers=1,
                                     quiet=True, dry_run=True))
    assert summary2.table.source == "builtin:voc" and summary2.table.ignore_index == 255
    assert "convention" not in summary2.table_reason


# --- LIP, mmsegmentation, ADE20K trees ----------------------------------------------------------------------


def test_lip_split_images_and_segmentations_convert_with_the_ids_found(tmp_path: Path,
                                                                        read_only: list[Path]) -> None:
    root = freeze(build(tmp_path / "LIP", lip_files()), read_only)
    state = snapshot(root)
    summary = convert(ConvertConfig(root, tmp_path / "out", workers=1, quiet=True))
    assert summary.discovery.layout == "lip" and list(summary.discovery.splits) == ["train", "val"]
    table = summary.table
    assert table.source == "scan:label-values" and table.ignore_index is None
    assert table.num_classes == 16  # ids 0..15 occur in these two LIP labels (LIP has 20: the scan says so)
    assert "label values found in all 2 label files (ids 0..15" in summary.table_reason
    lip = DATA / "mmseg" / "pseudo_lip_dataset"
    for split, stem in (("train", "684_2150041"), ("val", "86_185913")):
        want = np.array(Image.open(lip / f"{split}_segmentations" / f"{stem}.png"))
        assert np.array_equal(stored_labels(tmp_path / "out" / split)[0], want)
    manifest = json.loads((tmp_path / "out/train/manifest.json").read_text())
    assert manifest["classes"]["source"] == "scan:label-values" and manifest["source"]["layout"] == "lip"
    assert snapshot(root) == state


@pytest.mark.parametrize(("images", "labels", "layout"), [
    ("img_dir/{split}", "ann_dir/{split}", "mmseg"),
    ("images/{split}", "annotations/{split}", "generic"),  # ADE20K: images/training + annotations/training
    ("{split}/img", "{split}/gt", "split_dirs"),
])
def test_split_folder_trees_find_the_same_lip_pairs(tmp_path: Path, read_only: list[Path], images: str,
                                                     labels: str, layout: str) -> None:
    root = freeze(build(tmp_path / "ds", lip_files(images, labels)), read_only)
    found = discover(root)
    assert found.layout == layout and list(found.splits) == ["train", "val"]
    assert [p.key for p in found.splits["val"]] == [f"{images.format(split='val')}/86_185913.jpg"]


def test_mmseg_suffix_pairs_and_split_lists_from_outside_the_read_only_folder(tmp_path: Path,
                                                                               read_only: list[Path]) -> None:
    """mmsegmentation's pseudo_dataset: imgs/00000_img.jpg ↔ gts/00000_gt.png, splits/{train,val}.txt of stems."""
    src = DATA / "mmseg" / "pseudo_dataset"
    files = {f"{k}/{p.name}": p for k in ("imgs", "gts") for p in sorted((src / k).iterdir())}
    root = freeze(build(tmp_path / "pseudo", files), read_only)
    found = discover(root)
    assert found.layout == "generic" and len(found.splits["all"]) == 5
    assert pairs_of(found, "all")[0] == ("imgs/00000_img.jpg", "gts/00000_gt.png")
    lists = {s: src / "splits" / f"{s}.txt" for s in ("train", "val")}  # read where they are: anywhere
    split = discover(root, split_lists=lists)
    assert split.layout == "generic" and {s: len(p) for s, p in split.splits.items()} == {"train": 4, "val": 1}
    assert pairs_of(split, "val") == [("imgs/00004_img.jpg", "gts/00004_gt.png")]


# --- the shared CamVid data keeps CamVid's table; the same layout with other names does not --------------------


def test_segnet_with_camvid_names_keeps_camvid_and_other_names_get_the_ids_found(
        camvid_root: Path, tmp_path: Path, read_only: list[Path]) -> None:
    summary = convert(ConvertConfig(camvid_root, tmp_path / "o1", splits=("val",), dry_run=True))
    assert summary.table.source == "builtin:camvid-segnet" and "CamVid frame names" in summary.table_reason
    names = sorted(p.name for p in (camvid_root / "val").iterdir())[:3]
    files = {f"{k}/scene_{i}.png": camvid_root / k / n for i, n in enumerate(names) for k in ("val", "valannot")}
    root = freeze(build(tmp_path / "renamed", files), read_only)
    other = convert(ConvertConfig(root, tmp_path / "o2", dry_run=True))
    assert other.discovery.layout == "segnet" and other.table.source == "scan:label-values"
    assert "Sky" not in other.table.names()


def test_list_files_with_other_names_no_longer_get_camvids_table(tmp_path: Path, read_only: list[Path]) -> None:
    """Before: any grayscale dataset with list files got 'Sky…Bicyclist', id 11 = ignore, exit 0."""
    files = lip_files("img/{split}", "lbl/{split}")
    root = build(tmp_path / "listed", files)
    (root / "train.txt").write_text("/elsewhere/img/train/684_2150041.jpg /elsewhere/lbl/train/684_2150041.png\n")
    freeze(root, read_only)
    summary = convert(ConvertConfig(root, tmp_path / "out", dry_run=True, layout="listfile"))
    assert summary.discovery.layout == "listfile"
    assert summary.table.source == "scan:label-values" and summary.table.ignore_index is None


# --- the CLI on real data: one command, the table's source on every run, one screen when nothing fits ----------


def test_cli_states_the_class_table_source_on_a_real_run(tmp_path: Path, read_only: list[Path]) -> None:
    root = freeze(build(tmp_path / "LIP", lip_files()), read_only)
    result = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "out"), "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert "class table: 16 classes from the label values found in all 2 label files" in result.output


def test_cli_images_labels_and_split_list_from_a_toml_config(tmp_path: Path, read_only: list[Path],
                                                            camvid_root: Path) -> None:
    root = freeze(drive_tree(tmp_path / "DRIVE", camvid_root), read_only)
    cfg = tmp_path / "drive.toml"
    cfg.write_text('[convert]\nimages = "{split}/images/{name}_*.tif"\n'
                   'labels = "{split}/1st_manual/{name}_manual1.gif"\nnum_classes = 2\n')
    result = CliRunner().invoke(main, ["convert", "--config", str(cfg), str(root), str(tmp_path / "out"),
                                       "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "layout pattern" in result.output and "split training: 1 pairs" in result.output
    assert "classes: 2 from --num-classes 2" in result.output


def test_cli_split_list_flags_from_anywhere(tmp_path: Path, read_only: list[Path]) -> None:
    src = DATA / "mmseg" / "pseudo_dataset"
    root = freeze(build(tmp_path / "pseudo", {f"{k}/{p.name}": p for k in ("imgs", "gts")
                                              for p in sorted((src / k).iterdir())}), read_only)
    result = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "out"), "--dry-run",
                                       "--split-list", f"train={src / 'splits/train.txt'}",
                                       "--split-list", f"val={src / 'splits/val.txt'}"])
    assert result.exit_code == 0, result.output
    assert "split train: 4 pairs" in result.output and "split val: 1 pairs" in result.output


def test_cli_no_layout_is_one_screen_with_what_it_saw_the_closest_layout_and_the_flags(
        tmp_path: Path, read_only: list[Path]) -> None:
    m = DATA / "isbi-em"
    root = freeze(build(tmp_path / "membrane", {f"{k}/{i}.png": m / ("image" if k == "imagez" else "label") / f"{i}.png"
                                                for k in ("imagez", "truth") for i in (0, 1)}), read_only)
    result = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "out")])
    assert result.exit_code == 1 and (result.exception is None or isinstance(result.exception, SystemExit))
    out = result.output
    assert "Traceback" not in out and len(out.splitlines()) <= 12
    assert "saw: imagez/ (2 images), truth/ (2 images)" in out
    assert "closest layout: generic" in out and "imagez/ is not image/" in out
    assert "pair them with --images 'imagez/{name}.png' --labels 'truth/{name}.png'" in out
    with pytest.raises(LayoutError):
        discover(root)


def test_cli_classes_file_names_a_palette_dataset_the_layout_does_not_identify(tmp_path: Path,
                                                                               read_only: list[Path]) -> None:
    """The labelme case of the issue: a palette export whose own names must win (before: PASCAL's, exit 0)."""
    src = DATA / "labelme2voc" / "old"
    files = {}
    for i, s in enumerate(("2011_000003", "2011_000006", "2011_000025")):
        files[f"JPEGImages/site_{i}.jpg"] = src / "JPEGImages" / f"{s}.jpg"
        files[f"SegmentationClass/site_{i}.png"] = src / "SegmentationClassPNG" / f"{s}.png"
    root = freeze(build(tmp_path / "site", files), read_only)
    names = tmp_path / "labels.txt"  # labelme's own labels file: __ignore__ first
    names.write_text("__ignore__\nbackground\n" + "".join(f"defect_{i}\n" for i in range(1, 19)))
    result = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "out"), "--classes", str(names),
                                       "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert f"class table: 19 classes from --classes {names}; ignore id 255" in result.output
    manifest = json.loads((tmp_path / "out/all/manifest.json").read_text())
    assert manifest["classes"]["source"] == "labels.txt" and manifest["classes"]["classes"][1]["name"] == "defect_1"
    for got, s in zip(stored_labels(tmp_path / "out/all"), ("2011_000003", "2011_000006", "2011_000025"),
                      strict=True):
        assert np.array_equal(got, np.array(Image.open(src / "SegmentationClassPNG" / f"{s}.png")))


def test_cli_split_list_table_in_a_toml_config(tmp_path: Path, read_only: list[Path]) -> None:
    src = DATA / "mmseg" / "pseudo_dataset"
    root = freeze(build(tmp_path / "pseudo", {f"{k}/{p.name}": p for k in ("imgs", "gts")
                                              for p in sorted((src / k).iterdir())}), read_only)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[convert]\nnum-classes = 4\n[convert.split_list]\ntrain = "{src / "splits/train.txt"}"\n'
                   f'val = "{src / "splits/val.txt"}"\n')
    result = CliRunner().invoke(main, ["convert", "--config", str(cfg), str(root), str(tmp_path / "out"),
                                       "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "split train: 4 pairs" in result.output and "split val: 1 pairs" in result.output


# --- CVAT "Segmentation mask 1.1": labelmap.txt gives the colours, found in the tree ------------------------


def _labelmap_ids(labelmap: Path, mask: Path) -> np.ndarray:
    """The dataset's own definition, read independently: line k of labelmap.txt (``background`` first) is id k,
    and a pixel is the class whose r,g,b it has."""
    rows = [s.split(":") for s in labelmap.read_text().splitlines() if s.strip() and not s.startswith("#")]
    rows.sort(key=lambda r: r[0] != "background")  # stable: background first, the rest in file order
    rgb = np.array(Image.open(mask).convert("RGB"), np.int64)
    out = np.full(rgb.shape[:2], -1, np.int64)
    for i, row in enumerate(rows):
        colour = [int(v) for v in row[1].split(",")]
        out[(rgb == colour).all(axis=2)] = i
    assert (out >= 0).all()  # every pixel is a label map colour
    return out


def test_cvat_mask_export_takes_labelmap_txt_and_converts_bit_exactly(tmp_path: Path, read_only: list[Path]) -> None:
    """The CVAT export (RGB masks + labelmap.txt) is found without a flag; its colours are the classes, exactly."""
    src = DATA / "cvat-mask"
    stems = ("cheetah_00000044", "cheetah_00000087", "lion_00000075")
    files = {f"JPEGImages/{s}.png": src / "JPEGImages" / f"{s}.png" for s in stems}
    files |= {f"SegmentationClass/{s}.png": src / "SegmentationClass" / f"{s}.png" for s in stems}
    files |= {f"SegmentationObject/{s}.png": src / "SegmentationObject" / f"{s}.png" for s in stems[:2]}
    files["labelmap.txt"] = src / "labelmap.txt"
    root = freeze(build(tmp_path / "task_export", files), read_only)
    state = snapshot(root)
    summary = convert(ConvertConfig(root, tmp_path / "out", workers=1, quiet=True))
    assert summary.discovery.layout == "cvat_mask" and summary.discovery.label_kind == "colour"
    assert list(summary.table.names()) == ["background", "cheetah", "fox", "hyena", "lion", "tiger", "wolf"]
    assert "labelmap.txt of the CVAT" in summary.table_reason and summary.table.ignore_index is None
    expected = [_labelmap_ids(src / "labelmap.txt", src / "SegmentationClass" / f"{s}.png") for s in stems]
    got = stored_labels(tmp_path / "out/all")
    assert [set(np.unique(e)) for e in expected] == [{0, 1}, {0, 1}, {0, 4}]
    for g, want in zip(got, expected, strict=True):
        assert np.array_equal(g, want)
    said = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "cli"), "--workers", "1", "--dry-run"])
    assert said.exit_code == 0 and "labelmap.txt of the CVAT segmentation-mask export" in said.output
    assert snapshot(root) == state



# --- ADE20K full release: deep scene folders, _seg.png with class = R/10*256 + G ---------------------------


def _ade_tree(root: Path) -> Path:
    """The 2016 full release's tree with its two real _seg.png files (tests/data/ade20k); the photos are not in
    the source repository, so each image is a black JPEG of its label's size (only the labels are compared)."""
    src = DATA / "ade20k"
    for split, scene, stem in (("training", "a/aiport_terminal", "ADE_train_00000001"),
                               ("validation", "a/abbey", "ADE_val_00000001")):
        folder = root / "ADE20K_2016_07_26" / "images" / split / scene
        folder.mkdir(parents=True)
        seg = src / f"{stem}_seg.png"
        shutil.copyfile(seg, folder / seg.name)
        with Image.open(seg) as im:
            size = im.size
        Image.new("RGB", size).save(folder / f"{stem}.jpg")
        (folder / f"{stem}_atr.txt").write_text("001 # 0 # 0 # wall # wall # \"\"\n")
    return root


def _ade_ids(seg: Path) -> np.ndarray:
    """The release's own definition (utils_ade20k.loadAde20K): class = (R/10 truncated)*256 + G."""
    with Image.open(seg) as im:
        rgb = np.array(im, np.int64)
    return (rgb[:, :, 0] // 10) * 256 + rgb[:, :, 1]


def test_ade20k_full_release_is_found_in_its_deep_tree_and_decoded_bit_exactly(
        tmp_path: Path, read_only: list[Path]) -> None:
    root = freeze(_ade_tree(tmp_path / "ade"), read_only)
    found = discover(root)
    assert found.layout == "ade20k" and found.label_kind == "ade20k"
    assert {s: len(p) for s, p in found.splits.items()} == {"training": 1, "validation": 1}
    assert found.skipped_types == {".txt": 2}  # the _atr.txt files, named in the log
    top = max(int(_ade_ids(DATA / "ade20k" / f"{s}_seg.png").max()) for s in ("ADE_train_00000001",
                                                                              "ADE_val_00000001"))
    convert(ConvertConfig(root, tmp_path / "out", workers=1, quiet=True, num_classes=top + 1))
    for split, stem in (("training", "ADE_train_00000001"), ("validation", "ADE_val_00000001")):
        (got,) = stored_labels(tmp_path / "out" / split)
        want = _ade_ids(DATA / "ade20k" / f"{stem}_seg.png")
        assert got.dtype == np.uint16 and np.array_equal(got, want)
        assert len(np.unique(want)) > 5 and want.max() > 255  # more than 8 bits of ids, all kept


def test_ade20k_without_names_is_refused_with_the_flags(tmp_path: Path, read_only: list[Path]) -> None:
    """The ids index ADE20K's object names, which the folder does not hold: refused, never numbered by a scan."""
    root = freeze(_ade_tree(tmp_path / "ade"), read_only)
    result = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "out"), "--workers", "1"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "ADE20K's _seg.png class ids" in result.output and "--classes FILE" in result.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.npy"))


def test_ade20k_id_above_the_table_is_an_error_naming_value_and_pixels(tmp_path: Path,
                                                                       read_only: list[Path]) -> None:
    root = freeze(_ade_tree(tmp_path / "ade"), read_only)
    with pytest.raises(LabelError, match=r"2978"):
        convert(ConvertConfig(root, tmp_path / "out", workers=1, quiet=True, num_classes=2000))


def _ade2021_tree(root: Path) -> Path:
    """The 2021 release's tree with two real images' _seg.png and per-image .json (tests/data/ade20k/2021, from the
    release's own sample folder); each photo a black JPEG of its label's size (only the labels are compared)."""
    folder = root / "ADE20K_2021_17_01" / "images" / "ADE" / "training" / "urban" / "street"
    folder.mkdir(parents=True)
    for stem in ("ADE_train_00016869", "ADE_train_00016964"):
        for ext in (".json", "_seg.png"):
            shutil.copyfile(DATA / "ade20k" / "2021" / f"{stem}{ext}", folder / f"{stem}{ext}")
        with Image.open(folder / f"{stem}_seg.png") as im:
            Image.new("RGB", im.size).save(folder / f"{stem}.jpg")
    return root


def test_ade20k_2021_names_from_the_per_image_json(tmp_path: Path, read_only: list[Path]) -> None:
    """Without a flag the 2021 release converts: every class id its _seg.png pixels hold is named as the
    image's .json names that name_ndx (whole objects), and the ids are the files' own (names change no id)."""
    root = freeze(_ade2021_tree(tmp_path / "ade"), read_only)
    result = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "out"), "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert "per-image .json" in result.output and "2 .json" not in result.output  # read, so not "skipped"
    ds = shardkit.open(tmp_path / "out" / "training")
    names = [c.name for c in ds.manifest.classes.classes]
    assert names[0] == "unlabelled"
    folder = DATA / "ade20k" / "2021"
    for i in range(len(ds)):
        stem = Path(ds.key(i)).stem
        want = _ade_ids(folder / f"{stem}_seg.png")
        assert np.array_equal(ds[i][1], want)
        doc = json.loads((folder / f"{stem}.json").read_text())
        named = {o["name_ndx"]: o["name"] for o in doc["annotation"]["object"] if o["parts"]["part_level"] == 0}
        present = set(np.unique(want).tolist()) - {0}
        assert present == set(named) and all(names[v] == named[v] for v in present)
    assert names[312] == "building, edifice" and names[2131] == "road, route"


def test_ade20k_json_naming_one_index_two_ways_is_refused(tmp_path: Path) -> None:
    root = _ade2021_tree(tmp_path / "ade")
    path = next(root.rglob("ADE_train_00016964.json"))
    doc = json.loads(path.read_text())
    for obj in doc["annotation"]["object"]:
        if obj["name_ndx"] == 312:
            obj["name"] = "castle"
    path.write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "out"), "--workers", "1"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "ADE20K object index 312 is 'building, edifice'" in result.output and "'castle'" in result.output


# --- SceneParsing (ADEChallengeData2016): gray ids 0..150 + objectInfo150 (tests/data/sceneparsing) -----------


def _scene_parsing_tree(root: Path, table: str | None = "objectInfo150.txt") -> Path:
    """ADEChallengeData2016's layout with SceneParsing's real sample pairs (validation) and its class table."""
    src = DATA / "sceneparsing"
    files = {f"{kind}/validation/ADE_val_{n}.{ext}": src / kind / f"ADE_val_{n}.{ext}"
             for n in ("00000002", "00000003") for kind, ext in (("images", "jpg"), ("annotations", "png"))}
    if table:
        files[table] = src / table
    return build(root, files)


@pytest.mark.parametrize("table", ["objectInfo150.txt", "objectInfo150.csv"])
def test_scene_parsing_table_names_the_files_ids_with_0_ignored(tmp_path: Path, read_only: list[Path],
                                                                table: str) -> None:
    """objectInfo150 at the root is the table: ids as the files hold them (1 = wall … 150 = flag), 0 "other
    objects" the ignore id, as the benchmark defines it; the labels bit-exact, nothing renumbered."""
    root = freeze(_scene_parsing_tree(tmp_path / "ADEChallengeData2016", table), read_only)
    summary = convert(ConvertConfig(root, tmp_path / "out", workers=1, quiet=True))
    assert summary.discovery.layout == "generic" and table in summary.table_reason
    names = [c.name for c in summary.table.classes]
    assert len(names) == 151 and names[:2] == ["other objects", "wall"] and names[150] == "flag"
    assert names[2] == ("building, edifice" if table.endswith(".txt") else "building;edifice")
    assert summary.table.ignore_index == 0
    got = stored_labels(tmp_path / "out" / "validation")
    for n, label in zip(("00000002", "00000003"), got, strict=True):
        want = np.array(Image.open(DATA / "sceneparsing" / "annotations" / f"ADE_val_{n}.png"))
        assert np.array_equal(label, want)
    assert 103 in np.unique(got[1]) and 0 in np.unique(got[0])


def test_scene_parsing_table_as_classes_file_and_with_reduce_zero_label(tmp_path: Path) -> None:
    """--classes objectInfo150.csv gives the same ids; with --reduce-zero-label (mmsegmentation's reduced ids)
    it is refused naming the way out, and following it (the names alone) gives 0 → 255, v → v - 1 exactly."""
    root = _scene_parsing_tree(tmp_path / "plain", table=None)
    table = DATA / "sceneparsing" / "objectInfo150.csv"
    summary = convert(ConvertConfig(root, tmp_path / "out", workers=1, quiet=True, classes=table))
    assert summary.table.classes[1].name == "wall" and summary.table.ignore_index == 0
    refused = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "no"), "--workers", "1",
                                        "--classes", str(table), "--reduce-zero-label"])
    assert refused.exit_code != 0 and "pass --classes with the names alone, in order" in refused.output
    names = tmp_path / "names.txt"
    names.write_text("".join(line.split(",")[-1] + "\n" for line in table.read_text().splitlines()[1:]))
    res = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "mm"), "--workers", "1",
                                    "--classes", str(names), "--reduce-zero-label"])
    assert res.exit_code == 0, res.output
    for n, label in zip(("00000002", "00000003"), stored_labels(tmp_path / "mm" / "validation"), strict=True):
        raw = np.array(Image.open(DATA / "sceneparsing" / "annotations" / f"ADE_val_{n}.png")).astype(np.int64)
        assert np.array_equal(label, np.where(raw == 0, 255, raw - 1))


def test_other_seg_png_masks_in_a_deep_tree_are_not_taken_for_ade20k(tmp_path: Path) -> None:
    """``<name>_seg.png`` masks of another dataset (not ADE_… names) are never decoded as R/10*256 + G."""
    root = tmp_path / "data"
    folder = root / "images" / "training" / "a"
    folder.mkdir(parents=True)
    shutil.copyfile(DATA / "ade20k" / "ADE_val_00000001_seg.png", folder / "street_seg.png")
    assert find_ade_base(root, frozenset({"images"})) is None
    assert find_ade_base(_ade_tree(tmp_path / "ade"), frozenset({"ADE20K_2016_07_26"})) is not None


@pytest.mark.parametrize("flag", ["--palette", "--class-dict"])
def test_colour_masks_on_an_ids_layout_follow_the_palette_hint_to_exact_ids(
        tmp_path: Path, read_only: list[Path], flag: str) -> None:
    """RGB masks in images/ + masks/ are refused with "pass a class_dict.csv / --palette FILE"; following it
    with the export's labelmap.txt (--palette) or a class_dict.csv kept elsewhere (--class-dict) gives exact ids."""
    src = DATA / "cvat-mask"
    files = {"images/lion_00000075.png": src / "JPEGImages/lion_00000075.png",
             "masks/lion_00000075.png": src / "SegmentationClass/lion_00000075.png"}
    root = freeze(build(tmp_path / "plain", files), read_only)
    refused = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "no"), "--workers", "1"])
    assert refused.exit_code != 0 and "--palette FILE" in refused.output
    table = src / "labelmap.txt"
    if flag == "--class-dict":
        table = tmp_path / "class_dict.csv"
        rows = [s.split(":") for s in (src / "labelmap.txt").read_text().splitlines() if s and s[0] != "#"]
        table.write_text("name,r,g,b\n" + "".join(f"{r[0]},{r[1]}\n" for r in rows))
    result = CliRunner().invoke(main, ["convert", str(root), str(tmp_path / "out"), "--workers", "1", flag,
                                       str(table)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out/all/manifest.json").read_text())
    assert manifest["source"]["label_kind"] == "colour"
    want = _labelmap_ids(src / "labelmap.txt", src / "SegmentationClass/lion_00000075.png")
    assert np.array_equal(stored_labels(tmp_path / "out/all")[0], want) and set(np.unique(want)) == {0, 4}
