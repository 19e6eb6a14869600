"""Real annotation trees for the annotation-source tests, built in temporary folders from tests/data: the JSON
files are labelme's own examples (tests/data/coco-labelme, tests/data/labelme-examples), the photos the same
PASCAL VOC images already kept once in tests/data/labelme2voc/old/JPEGImages (see tests/data/README.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
PHOTOS = DATA / "labelme2voc" / "old" / "JPEGImages"
#: labelme2voc's own exports of the labelme examples (2023 and before)
VOC_NEW = DATA / "labelme2voc" / "new" / "SegmentationClass"
VOC_OLD = DATA / "labelme2voc" / "old" / "SegmentationClassPNG"


def coco_tree(root: Path) -> Path:
    """labelme2coco's output: ``annotations.json`` + ``JPEGImages/`` (its file_names)."""
    root.mkdir(parents=True)
    shutil.copy(DATA / "coco-labelme" / "annotations.json", root)
    shutil.copytree(PHOTOS, root / "JPEGImages", ignore=shutil.ignore_patterns("*.py"))
    return root.resolve()


def labelme_tree(root: Path) -> Path:
    """labelme's annotated folder: ``<name>.json`` beside ``<name>.jpg``, ``labels.txt``."""
    shutil.copytree(DATA / "labelme-examples", root, ignore=shutil.ignore_patterns("*.py"))
    for photo in PHOTOS.glob("*.jpg"):
        shutil.copy(photo, root)
    return root.resolve()


def panoptic_tree(root: Path) -> Path:
    """panopticapi's sample data in COCO's layout: ``panoptic_examples.json`` beside ``panoptic_examples/``
    (its PNGs) and the photos in ``examples/`` (the split folder)."""
    shutil.copytree(DATA / "coco-panoptic", root)
    return root.resolve()
