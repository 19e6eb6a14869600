"""labelme2voc's export: ``JPEGImages/`` + ``SegmentationClassPNG/`` (older labelme) or ``SegmentationClass/``
(since 2023) with ``class_names.txt``: palette PNGs whose indices are the line numbers of class_names.txt (from
0, ``_background_``); 255 marks ``__ignore__`` (labelme's -1)."""

from __future__ import annotations

from pathlib import Path

from ...labels.policy import TableChoice
from ...labels.tablefiles import read_classes
from .base import Discovery
from .voc import VocLayout

LABELME_IGNORE = 255  # labelme2voc writes __ignore__ (-1) as 255 into its uint8 PNGs


class LabelmeLayout(VocLayout):
    name = "labelme2voc"
    expected = "JPEGImages/ + SegmentationClassPNG/ (or SegmentationClass/) + class_names.txt"
    order = 20
    label_dirs = ("SegmentationClassPNG", "SegmentationClass")

    def accepts(self, base: Path) -> bool:
        return (base / "class_names.txt").is_file()

    def default_table(self, found: Discovery, *, cityscapes_train_ids: bool = True) -> TableChoice | None:
        where = self.base(found.root)
        if where is None:
            return None
        names = where[0] / "class_names.txt"
        table = read_classes(names).with_ignore_index(LABELME_IGNORE)
        return TableChoice(table, f"{names.relative_to(found.root).as_posix()} written by labelme2voc "
                                  f"(ids in line order, {LABELME_IGNORE} = __ignore__)")


LAYOUT = LabelmeLayout
