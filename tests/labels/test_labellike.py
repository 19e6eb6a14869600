"""Label-like files (shardkit/labels/labellike.py), judged on real files: label kinds are, photos are not."""

from __future__ import annotations

from pathlib import Path

from shardkit.labels.labellike import label_like

DATA = Path(__file__).resolve().parents[1] / "data"


def test_every_real_label_kind_is_label_like(shared_data: Path) -> None:
    kinds = {
        "camvid ids": sorted((shared_data / "camvid-segnet" / "trainannot").glob("*.png"))[:3],
        "colour masks": sorted((shared_data / "rgb-masks-mini" / "train_labels").glob("*.png"))[:3],
        "jpeg masks": sorted((DATA / "kvasir-seg" / "masks").glob("*.jpg")),
        "0/255 masks": sorted((DATA / "isbi-em" / "label").glob("*.png")),
        "1-bit": sorted((DATA / "isbi-em" / "label-1bit").glob("*.png")),
        "palette": sorted((DATA / "labelme2voc" / "old" / "SegmentationClassPNG").glob("*.png")),
        "mmseg palette": sorted((DATA / "mmseg" / "pseudo_dataset" / "gts").glob("*.png"))[:3],
    }
    assert {kind: label_like(files) for kind, files in kinds.items()} == dict.fromkeys(kinds, True)


def test_photos_are_not_label_like(shared_data: Path) -> None:
    kinds = {
        "camvid photos": sorted((shared_data / "camvid-segnet" / "train").glob("*.png"))[:3],
        "gray EM images": sorted((DATA / "isbi-em" / "image").glob("*.png")),
        "jpeg photos": sorted((DATA / "kvasir-seg" / "images").glob("*.jpg")),
        "voc photos": sorted((DATA / "labelme2voc" / "old" / "JPEGImages").glob("*.jpg")),
        "none": [],
    }
    assert {kind: label_like(files) for kind, files in kinds.items()} == dict.fromkeys(kinds, False)


def test_one_photo_among_labels_makes_the_folder_not_label_like(shared_data: Path) -> None:
    labels = sorted((shared_data / "camvid-segnet" / "trainannot").glob("*.png"))[:2]
    assert not label_like([*labels, sorted((shared_data / "camvid-segnet" / "train").glob("*.png"))[0]])


def test_an_unreadable_file_is_not_label_like(tmp_path: Path) -> None:
    bad = tmp_path / "x.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 10)
    assert not label_like([bad])
