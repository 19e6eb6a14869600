"""CVAT's "Segmentation mask 1.1" export (Datumaro's VOC export with a label map): ``JPEGImages/`` +
``SegmentationClass/`` (+ ``SegmentationObject/``, ``ImageSets/Segmentation/<subset>.txt``) and ``labelmap.txt``:
RGB masks whose colours are the label map's classes (``name:r,g,b::`` a line, ``background`` id 0)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from ...labels.policy import TableChoice
from ...labels.tablefiles import read_labelmap
from .base import Discovery
from .voc import VocLayout

LABELMAP = "labelmap.txt"


class CvatMaskLayout(VocLayout):
    name = "cvat_mask"
    expected = "JPEGImages/ + SegmentationClass/ + labelmap.txt (CVAT's Segmentation mask 1.1 export)"
    order = 25
    label_kind = "colour"
    label_dirs = ("SegmentationClass",)
    #: CVAT's masks have no void border: every colour is a label map class
    ignore_convention: ClassVar[tuple[int, str] | None] = None

    def accepts(self, base: Path) -> bool:
        return (base / LABELMAP).is_file() and not (base / "class_names.txt").is_file()

    def kind(self, class_dict: Path | None) -> str:
        return self.label_kind

    def default_table(self, found: Discovery, *, cityscapes_train_ids: bool = True) -> TableChoice | None:
        where = self.base(found.root)
        if where is None:
            return None
        path = where[0] / LABELMAP
        return TableChoice(read_labelmap(path), f"{path.relative_to(found.root).as_posix()} of the CVAT "
                                                "segmentation-mask export (exact colours; background id 0)")


LAYOUT = CvatMaskLayout
