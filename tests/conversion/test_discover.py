"""Discovery: every layout on tiny synthetic trees (empty files: discovery never decodes) and on real data."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from shardkit.conversion.layouts import LABEL_SUFFIXES, Discovery, SamplePair, discover
from shardkit.errors import ConfigError, InputNotFoundError, LayoutError
from shardkit.labels.classes import LABEL_KINDS


def touch(root: Path, *names: str) -> None:
    """Create empty files (and their folders) under ``root``."""
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def keys(found: Discovery, split: str) -> list[str]:
    return [p.key for p in found.splits[split]]


def labels(found: Discovery, split: str) -> list[str]:
    return [p.label.relative_to(found.root).as_posix() for p in found.splits[split] if p.label]


# --- segnet and list files -------------------------------------------------------------------------------


def test_segnet_pairs_same_names_in_annot_folders_sorted_by_key(tmp_path: Path) -> None:
    touch(tmp_path, "train/b.png", "train/a.png", "trainannot/a.png", "trainannot/b.png",
          "val/c.png", "valannot/c.png")
    found = discover(tmp_path)
    assert found.layout == "segnet"
    assert found.label_kind == "ids"
    assert list(found.splits) == ["train", "val"]
    assert keys(found, "train") == ["train/a.png", "train/b.png"]
    assert labels(found, "train") == ["trainannot/a.png", "trainannot/b.png"]
    pair = found.splits["val"][0]
    assert pair == SamplePair("val/c.png", tmp_path / "val/c.png", tmp_path / "valannot/c.png")
    assert pair.image.is_absolute()
    assert found.total() == 3
    assert found.class_dict is None


def test_listfile_resolves_foreign_absolute_paths_by_tail(tmp_path: Path) -> None:
    touch(tmp_path, "data/img/a.png", "data/img/b.png", "data/lbl/a.png", "data/lbl/b.png")
    (tmp_path / "train.txt").write_text(
        "/home/bob/ds/data/img/b.png /home/bob/ds/data/lbl/b.png\n"
        "\n"
        "C:\\ds\\data\\img\\a.png C:\\ds\\data\\lbl\\a.png\n"
    )
    found = discover(tmp_path)
    assert found.layout == "listfile"
    assert keys(found, "train") == ["data/img/a.png", "data/img/b.png"]
    assert labels(found, "train") == ["data/lbl/a.png", "data/lbl/b.png"]


def test_listfile_prefers_the_longest_matching_tail(tmp_path: Path) -> None:
    touch(tmp_path, "x.png", "train/x.png", "annot/x.png")
    (tmp_path / "train.txt").write_text("/far/away/train/x.png /far/away/annot/x.png\n")
    found = discover(tmp_path, layout="listfile")
    assert keys(found, "train") == ["train/x.png"]


def test_listfile_never_resolves_outside_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    touch(root, "a.png", "b.png")
    touch(tmp_path, "secret.png")
    (root / "train.txt").write_text("../secret.png b.png\n")
    with pytest.raises(InputNotFoundError, match=r"secret\.png"):
        discover(root, layout="listfile")


def test_listfile_line_matching_nothing_names_file_line_and_path(tmp_path: Path) -> None:
    touch(tmp_path, "img/a.png", "lbl/a.png")
    (tmp_path / "val.txt").write_text("/x/img/a.png /x/lbl/a.png\n/x/img/gone.png /x/lbl/gone.png\n")
    with pytest.raises(InputNotFoundError, match=r"val\.txt.*line 2.*/x/img/gone\.png"):
        discover(tmp_path)


def test_listfile_naming_one_image_twice_is_a_layout_error(tmp_path: Path) -> None:
    touch(tmp_path, "img/a.png", "lbl/a.png", "lbl/b.png")
    (tmp_path / "train.txt").write_text("img/a.png lbl/a.png\nimg/a.png lbl/b.png\n")
    with pytest.raises(LayoutError, match=r"lines 1 and 2.*img/a\.png.*remove the duplicate"):
        discover(tmp_path)


def test_listfile_line_without_two_fields_is_a_layout_error(tmp_path: Path) -> None:
    touch(tmp_path, "img/a.png", "lbl/a.png")
    (tmp_path / "train.txt").write_text("img/a.png lbl/a.png\nimg/a.png\n")
    with pytest.raises(LayoutError, match=r"line 2: expected 'image label'"):
        discover(tmp_path)


def test_folders_win_over_agreeing_list_files_and_listfile_can_be_forced(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "trainannot/a.png")
    (tmp_path / "train.txt").write_text("/SegNet/CamVid/train/a.png /SegNet/CamVid/trainannot/a.png\n")
    auto = discover(tmp_path)
    forced = discover(tmp_path, layout="listfile")
    assert (auto.layout, forced.layout) == ("segnet", "listfile")
    assert auto.splits == forced.splits


def test_folders_and_disagreeing_list_files_are_ambiguous(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "train/b.png", "trainannot/a.png", "trainannot/b.png")
    (tmp_path / "train.txt").write_text("/SegNet/train/a.png /SegNet/trainannot/a.png\n")
    with pytest.raises(LayoutError, match=r"train\.txt names 1 pairs.*--layout segnet"):
        discover(tmp_path)
    assert discover(tmp_path, layout="segnet").total() == 2
    assert discover(tmp_path, layout="listfile").total() == 1


def test_text_files_that_are_not_pair_lists_are_ignored(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "trainannot/a.png")
    (tmp_path / "notes.txt").write_text("some notes about this data\n")
    assert discover(tmp_path).layout == "segnet"


# --- class_dict ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", LABEL_SUFFIXES)
def test_class_dict_matches_every_known_label_suffix(tmp_path: Path, suffix: str) -> None:
    touch(tmp_path, "train/a.jpg", "train/b.jpg", f"train_labels/a{suffix}.png",
          f"train_labels/b{suffix}.png")
    found = discover(tmp_path)
    assert found.layout == "class_dict"
    assert found.label_kind == "colour"
    assert keys(found, "train") == ["train/a.jpg", "train/b.jpg"]
    assert labels(found, "train") == [f"train_labels/a{suffix}.png", f"train_labels/b{suffix}.png"]


def test_class_dict_reports_class_table_at_root(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "train_labels/a_L.png", "class_dict.csv")
    found = discover(tmp_path)
    assert found.class_dict == tmp_path / "class_dict.csv"
    assert found.label_kind == "colour"


def test_given_label_suffix_replaces_the_known_ones(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "train_labels/a_gt.png", "train_labels/a_L.png")
    found = discover(tmp_path, label_suffix="_gt")
    assert labels(found, "train") == ["train_labels/a_gt.png"]
    assert found.unmatched_labels == {"train": ("train_labels/a_L.png",)}


def test_given_label_suffix_with_extension_also_fixes_the_extension(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "train_labels/a_gt.png", "train_labels/a_gt.bmp")
    found = discover(tmp_path, label_suffix="_gt.bmp")
    assert labels(found, "train") == ["train_labels/a_gt.bmp"]


def test_image_matching_two_labels_is_a_layout_error_naming_both(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "train_labels/a_L.png", "train_labels/a_mask.png")
    with pytest.raises(LayoutError, match=r"a_L\.png.*a_mask\.png.*--label-suffix"):
        discover(tmp_path)


# --- cityscapes ------------------------------------------------------------------------------------------


def test_cityscapes_pairs_label_ids_and_ignores_other_gtfine_files(tmp_path: Path) -> None:
    touch(tmp_path,
          "leftImg8bit/train/aachen/aachen_000000_000019_leftImg8bit.png",
          "leftImg8bit/train/bonn/bonn_000001_000019_leftImg8bit.png",
          "leftImg8bit/val/lindau/lindau_000000_000019_leftImg8bit.png",
          "gtFine/train/aachen/aachen_000000_000019_gtFine_labelIds.png",
          "gtFine/train/aachen/aachen_000000_000019_gtFine_color.png",
          "gtFine/train/aachen/aachen_000000_000019_gtFine_instanceIds.png",
          "gtFine/train/aachen/aachen_000000_000019_gtFine_polygons.json",
          "gtFine/train/bonn/bonn_000001_000019_gtFine_labelIds.png",
          "gtFine/val/lindau/lindau_000000_000019_gtFine_labelIds.png")
    found = discover(tmp_path)
    assert found.layout == "cityscapes"
    assert found.label_kind == "cityscapes"
    assert keys(found, "train") == ["leftImg8bit/train/aachen/aachen_000000_000019_leftImg8bit.png",
                                    "leftImg8bit/train/bonn/bonn_000001_000019_leftImg8bit.png"]
    assert labels(found, "val") == ["gtFine/val/lindau/lindau_000000_000019_gtFine_labelIds.png"]
    assert found.unmatched_labels == {} and found.unmatched_images == {}


def test_cityscapes_split_without_gtfine_is_reported_and_skipped(tmp_path: Path) -> None:
    touch(tmp_path, "leftImg8bit/train/a/a_1_leftImg8bit.png", "gtFine/train/a/a_1_gtFine_labelIds.png",
          "leftImg8bit/test/b/b_1_leftImg8bit.png")
    found = discover(tmp_path)
    assert list(found.splits) == ["train"]
    assert found.unmatched_images == {"test": ("leftImg8bit/test/b/b_1_leftImg8bit.png",)}


# --- voc -------------------------------------------------------------------------------------------------


def make_voc(base: Path) -> None:
    touch(base, "JPEGImages/2007_000001.jpg", "JPEGImages/2007_000002.jpg", "JPEGImages/2007_000003.jpg",
          "JPEGImages/2008_000009.jpg",
          "SegmentationClass/2007_000001.png", "SegmentationClass/2007_000002.png",
          "SegmentationClass/2007_000003.png")
    (base / "ImageSets/Segmentation").mkdir(parents=True)
    (base / "ImageSets/Segmentation/train.txt").write_text("2007_000002\n2007_000001\n")
    (base / "ImageSets/Segmentation/val.txt").write_text("2007_000003\n")


def test_voc_uses_only_stems_listed_in_imagesets(tmp_path: Path) -> None:
    make_voc(tmp_path)
    found = discover(tmp_path)
    assert found.layout == "voc"
    assert found.label_kind == "palette"
    assert keys(found, "train") == ["JPEGImages/2007_000001.jpg", "JPEGImages/2007_000002.jpg"]
    assert labels(found, "val") == ["SegmentationClass/2007_000003.png"]
    assert found.unmatched_images == {}  # 2008_000009 has no label but is in no split file


def test_voc_root_may_be_vocdevkit_two_levels_up(tmp_path: Path) -> None:
    make_voc(tmp_path / "VOCdevkit/VOC2012")
    found = discover(tmp_path)
    assert found.layout == "voc"
    assert keys(found, "val") == ["VOCdevkit/VOC2012/JPEGImages/2007_000003.jpg"]


def test_voc_without_imagesets_is_one_split_of_labelled_images(tmp_path: Path) -> None:
    touch(tmp_path, "JPEGImages/a.jpg", "JPEGImages/b.jpg", "SegmentationClass/a.png",
          "SegmentationClass/z.png")
    found = discover(tmp_path)
    assert keys(found, "all") == ["JPEGImages/a.jpg"]
    assert found.unmatched_labels == {"all": ("SegmentationClass/z.png",)}
    assert found.unmatched_images == {}


def test_voc_split_stem_with_no_files_names_list_file_and_line(tmp_path: Path) -> None:
    make_voc(tmp_path)
    (tmp_path / "ImageSets/Segmentation/val.txt").write_text("2007_000003\n2099_000404\n")
    with pytest.raises(InputNotFoundError, match=r"val\.txt.*line 2.*2099_000404"):
        discover(tmp_path)


# --- generic / ADE ---------------------------------------------------------------------------------------


def test_generic_ade_style_keeps_split_folder_names(tmp_path: Path) -> None:
    touch(tmp_path, "images/training/ADE_train_1.jpg", "annotations/training/ADE_train_1.png",
          "images/validation/ADE_val_1.jpg", "annotations/validation/ADE_val_1.png")
    found = discover(tmp_path)
    assert found.layout == "generic"
    assert found.label_kind == "ids"
    assert list(found.splits) == ["training", "validation"]
    assert labels(found, "training") == ["annotations/training/ADE_train_1.png"]


@pytest.mark.parametrize("label_dir", ["annotations", "labels", "masks"])
def test_generic_without_split_folders_is_split_all_with_mirrored_subfolders(tmp_path: Path,
                                                                             label_dir: str) -> None:
    touch(tmp_path, "images/a.png", "images/sub/b.jpg", f"{label_dir}/a_mask.png", f"{label_dir}/sub/b.png")
    found = discover(tmp_path)
    assert keys(found, "all") == ["images/a.png", "images/sub/b.jpg"]
    assert labels(found, "all") == [f"{label_dir}/a_mask.png", f"{label_dir}/sub/b.png"]


def test_generic_with_class_dict_means_colour_labels(tmp_path: Path) -> None:
    touch(tmp_path, "images/a.png", "masks/a.png", "class_dict.csv")
    found = discover(tmp_path)
    assert (found.label_kind, found.class_dict) == ("colour", tmp_path / "class_dict.csv")


# --- files, extensions, duplicates, unmatched ------------------------------------------------------------


def test_extensions_are_case_insensitive_and_hidden_or_other_files_ignored(tmp_path: Path) -> None:
    touch(tmp_path, "train/A.JPG", "train/b.TIFF", "train/c.webp", "train/.d.png", "train/notes.json",
          "train/.cache/e.png", "trainannot/A.png", "trainannot/b.png", "trainannot/c.png",
          "trainannot/.d.png", "trainannot/Thumbs.db")
    found = discover(tmp_path)
    assert keys(found, "train") == ["train/A.JPG", "train/b.TIFF", "train/c.webp"]
    assert found.unmatched_images == {} and found.unmatched_labels == {}


def test_two_images_with_one_stem_are_a_layout_error_naming_both(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.jpg", "train/a.png", "trainannot/a.png")
    with pytest.raises(LayoutError, match=r"train/a\.jpg and train/a\.png.*fix: remove or rename"):
        discover(tmp_path)


def test_unmatched_files_are_reported_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    touch(tmp_path, "train/a.png", "train/b.png", "trainannot/a.png", "trainannot/z.png")
    with caplog.at_level(logging.WARNING, logger="shardkit.conversion.layouts.discover"):
        found = discover(tmp_path)
    assert keys(found, "train") == ["train/a.png"]
    assert found.unmatched_images == {"train": ("train/b.png",)}
    assert found.unmatched_labels == {"train": ("trainannot/z.png",)}
    assert "1 images without a label (first: train/b.png)" in caplog.text
    assert "1 labels without an image (first: trainannot/z.png)" in caplog.text
    report = "\n".join(found.report_lines())
    assert "layout segnet" in report and "split train: 1 pairs" in report and "train/b.png" in report


def test_strict_refuses_unmatched_files_with_the_fix(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "train/b.png", "trainannot/a.png")
    with pytest.raises(LayoutError, match=r"1 images without a label.*train/b\.png.*drop --strict"):
        discover(tmp_path, strict=True)


def test_report_lists_only_the_first_five_unmatched_names(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "trainannot/a.png", *(f"train/n{i}.png" for i in range(7)))
    found = discover(tmp_path)
    line = next(x for x in found.report_lines() if "without a label" in x)
    assert "7 images without a label" in line and "n4.png" in line and "n5.png" not in line


# --- splits, forced layout, bad input --------------------------------------------------------------------


def test_split_restriction_keeps_only_named_splits(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "trainannot/a.png", "val/b.png", "val/c.png", "valannot/b.png")
    found = discover(tmp_path, splits=("train",), strict=True)  # val's unmatched c.png is not looked at
    assert list(found.splits) == ["train"]


def test_unknown_split_is_a_config_error_listing_available(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "trainannot/a.png", "val/b.png", "valannot/b.png")
    with pytest.raises(ConfigError, match=r"unknown split test.*train, val"):
        discover(tmp_path, splits=("test",))


def test_forced_layout_that_does_not_fit_names_expected_folders(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "trainannot/a.png")
    with pytest.raises(LayoutError, match=r"layout voc forced.*JPEGImages/"):
        discover(tmp_path, layout="voc")


def test_forced_layout_picks_among_several_matches(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "trainannot/a.png", "train_labels/a_L.png")
    assert discover(tmp_path).layout == "class_dict"
    assert labels(discover(tmp_path, layout="segnet"), "train") == ["trainannot/a.png"]


def test_unknown_layout_name_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'coco' is not one of"):
        discover(tmp_path, layout="coco")


def test_missing_input_folder_is_input_not_found(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError, match=r"does not exist"):
        discover(tmp_path / "nope")


def test_empty_input_folder_is_a_layout_error(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    with pytest.raises(LayoutError, match=r"input folder is empty.*<split>annot/"):
        discover(tmp_path)


def test_unrecognisable_folder_names_layouts_tried_and_fix(tmp_path: Path) -> None:
    touch(tmp_path, "photos/a.png", "README.md")
    with pytest.raises(LayoutError) as e:
        discover(tmp_path)
    text = str(e.value)
    assert "saw: photos/ (1 images)" in text and "no layout is close" in text
    assert "tried: cityscapes, ade20k, labelme2voc, cvat_mask, voc, mmseg, generic" in text
    assert "--images" in text


def test_layout_with_no_pairs_at_all_is_a_layout_error(tmp_path: Path) -> None:
    touch(tmp_path, "train/a.png", "trainannot/b.png")
    with pytest.raises(LayoutError, match=r"no image/label pairs"):
        discover(tmp_path)


def test_discovery_cost_is_folder_listings_not_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4,000 files are found from a handful of folder listings, none per file (that is what keeps it fast)."""
    (tmp_path / "train").mkdir()
    (tmp_path / "train_labels").mkdir()
    for i in range(2_000):
        (tmp_path / f"train/{i:06d}.jpg").touch()
        (tmp_path / f"train_labels/{i:06d}_L.png").touch()
    listings: list[str] = []
    real = os.scandir

    def counting_scandir(path: Any = ".") -> Any:
        listings.append(str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", counting_scandir)
    found = discover(tmp_path)
    assert found.total() == 2_000
    assert 0 < len(listings) <= 10, listings


# --- real data -------------------------------------------------------------------------------------------


def test_real_camvid_is_segnet_with_123_train_and_26_val(camvid_root: Path) -> None:
    found = discover(camvid_root)
    assert found.layout == "segnet" and found.label_kind == "ids"
    assert {s: len(p) for s, p in found.splits.items()} == {"train": 123, "val": 26}
    assert found.unmatched_images == {} and found.unmatched_labels == {}
    first = found.splits["train"][0]
    assert first.key == "train/0001TP_006690.png"
    assert first.label == camvid_root.resolve() / "trainannot/0001TP_006690.png"


def test_real_camvid_list_files_resolve_foreign_paths_to_the_same_pairs(camvid_root: Path) -> None:
    listed = discover(camvid_root, layout="listfile")
    assert listed.layout == "listfile"
    assert listed.splits == discover(camvid_root).splits
    assert discover(camvid_root, layout="listfile", splits=("val",)).total() == 26


def test_real_rgb_masks_is_class_dict_with_color_mask_labels(rgb_masks_root: Path) -> None:
    found = discover(rgb_masks_root)
    assert found.layout == "class_dict" and found.label_kind == "colour"
    assert found.class_dict == rgb_masks_root.resolve() / "class_dict.csv"
    assert {s: len(p) for s, p in found.splits.items()} == {"test": 5, "train": 10, "val": 5}
    assert all(p.label and p.label.name == f"{p.image.stem}_color_mask.png"
               for pairs in found.splits.values() for p in pairs)


# --- the new layouts (synthetic trees; real samples: tests/conversion/layouts/test_real_layouts.py)
# ------------------------


@pytest.mark.parametrize(("images", "labels"), [
    ("images", "labels"), ("image", "label"), ("imgs", "masks"), ("img", "mask"), ("Images", "Annotations"),
    ("images", "annotation"), ("img", "gt"), ("images", "gts"), ("images", "1st_manual"),
])
def test_generic_takes_singular_and_plural_folder_names(tmp_path: Path, images: str, labels: str) -> None:
    touch(tmp_path, f"{images}/a.png", f"{labels}/a.png")
    found = discover(tmp_path)
    assert found.layout == "generic" and keys(found, "all") == [f"{images}/a.png"]


@pytest.mark.parametrize("tag", ["_mask", "_label", "_gt", "_manual1", "_segmentation", "_seg", "-mask", ""])
def test_labels_pair_by_stem_with_the_usual_suffix_variants(tmp_path: Path, tag: str) -> None:
    touch(tmp_path, "images/p01.jpg", "images/p02.jpg", f"masks/p01{tag}.png", f"masks/p02{tag}.png")
    found = discover(tmp_path)
    assert labels(found, "all") == [f"masks/p01{tag}.png", f"masks/p02{tag}.png"]


def test_a_shared_name_part_pairs_only_one_to_one(tmp_path: Path) -> None:
    touch(tmp_path, "images/21_training.tif", "images/22_training.tif", "images/23_training.tif",
          "images/23_test.tif", "labels/21_manual1.gif", "labels/22_manual1.gif", "labels/23_manual1.gif")
    found = discover(tmp_path)
    assert labels(found, "all") == ["labels/21_manual1.gif", "labels/22_manual1.gif"]
    # 23: two images share the part "23", so neither is paired by it: both reported, never a guess
    assert found.unmatched_images == {"all": ("images/23_test.tif", "images/23_training.tif")}
    assert found.unmatched_labels == {"all": ("labels/23_manual1.gif",)}


def test_a_given_label_suffix_turns_the_shared_part_pairing_off(tmp_path: Path) -> None:
    touch(tmp_path, "images/21_training.tif", "labels/21_manual1.gif")
    with pytest.raises(LayoutError, match="no image/label pairs"):
        discover(tmp_path, label_suffix="_x")


def test_mmseg_img_dir_ann_dir_with_and_without_splits(tmp_path: Path) -> None:
    touch(tmp_path / "a", "img_dir/train/1.png", "img_dir/val/2.png", "ann_dir/train/1.png", "ann_dir/val/2.png")
    found = discover(tmp_path / "a")
    assert found.layout == "mmseg" and list(found.splits) == ["train", "val"]
    touch(tmp_path / "b", "img_dir/1.png", "ann_dir/1.png")
    assert list(discover(tmp_path / "b").splits) == ["all"]


@pytest.mark.parametrize("labels_dir", ["segmentations", "labels", "masks", "annotations"])
def test_lip_split_prefixed_folders(tmp_path: Path, labels_dir: str) -> None:
    touch(tmp_path, "train_images/1.jpg", f"train_{labels_dir}/1.png", "val_images/2.jpg", f"val_{labels_dir}/2.png")
    found = discover(tmp_path)
    assert found.layout == "lip" and list(found.splits) == ["train", "val"]
    assert labels(found, "val") == [f"val_{labels_dir}/2.png"]


def test_split_folders_above_image_and_label_folders(tmp_path: Path) -> None:
    touch(tmp_path, "training/images/1.png", "training/labels/1.png", "test/images/2.png", "test/labels/2.png",
          "docs/readme.png")
    found = discover(tmp_path)
    assert found.layout == "split_dirs" and list(found.splits) == ["test", "training"]


def test_labelme2voc_claims_voc_trees_with_class_names_txt(tmp_path: Path) -> None:
    touch(tmp_path, "JPEGImages/a.jpg", "SegmentationClassPNG/a.png", "SegmentationClass/a.npy", "class_names.txt")
    found = discover(tmp_path)
    assert found.layout == "labelme2voc" and found.label_kind == "palette"
    assert labels(found, "all") == ["SegmentationClassPNG/a.png"]
    (tmp_path / "class_names.txt").unlink()  # then it is a VOC tree: the label folder is the one with images
    found = discover(tmp_path)
    assert found.layout == "voc" and labels(found, "all") == ["SegmentationClassPNG/a.png"]


def test_layouts_are_declared_classes_discovered_like_formats() -> None:
    from shardkit.conversion.layouts import all_layouts, get
    from shardkit.conversion.layouts.base import Layout

    classes = all_layouts()
    assert all(issubclass(c, Layout) for c in classes)
    assert [c.name for c in classes if c.auto][:5] == ["cityscapes", "ade20k", "labelme2voc", "cvat_mask", "voc"]
    assert {"mmseg", "generic", "split_dirs", "lip", "class_dict", "segnet", "listfile", "pattern"} <= {
        c.name for c in classes}
    for c in classes:
        assert c.expected and c.label_kind in LABEL_KINDS and get(c.name) is c


def test_the_manifest_schema_lists_every_layout() -> None:
    import json

    from shardkit.conversion.layouts import names
    from shardkit.labels.sources import registry

    schema = json.loads((Path(__file__).resolve().parents[2] / "formats/manifest.schema.json").read_text())
    # every mask layout, and every annotation source the labels may be drawn from instead
    assert set(schema["$defs"]["source"]["properties"]["layout"]["enum"]) == set(names()) | set(registry.names())


def test_a_label_folder_without_images_is_passed_over(tmp_path: Path) -> None:
    touch(tmp_path, "images/a.png", "labels/a.txt", "masks/a.png")  # labels/: YOLO boxes, not masks
    found = discover(tmp_path)
    assert found.layout == "generic" and labels(found, "all") == ["masks/a.png"]
