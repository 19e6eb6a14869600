"""Which class table a conversion uses, from the label kind, the layout and the options."""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import ConfigError
from .builtin import CAMVID_SEGNET, CITYSCAPES, CITYSCAPES_LABEL_IDS, VOC
from .classes import LABEL_KINDS, MAX_CLASSES, ClassInfo, ClassTable
from .tablefiles import read_class_dict, read_palette

logger = logging.getLogger(__name__)


def build_class_table(
    label_kind: str,
    *,
    class_dict: Path | None,
    palette: Path | None,
    layout: str,
    num_classes: int | None,
    ignore_index: int | None,
    cityscapes_train_ids: bool = True,
) -> ClassTable:
    """Choose the class table for a conversion from the label kind, layout and options.

    - ``colour``: ``--palette`` wins over ``class_dict``; neither is a ConfigError.
    - ``ids``: ``--num-classes N`` gives names ``class_0..`` (a class_dict/palette with exactly N
      classes is used instead, for its names; one with another count is a ConfigError); else a
      class_dict/palette supplies names (colours kept for drawing); else segnet/listfile layouts
      are CamVid SegNet; else ConfigError asking for ``--num-classes``.
    - ``palette``: a given class_dict/palette or ``--num-classes`` table, else VOC (ignore 255).
    - ``cityscapes``: the 19 trainIds with the official labelId → trainId remap (ignore 255);
      with ``cityscapes_train_ids=False`` the 34 labelIds stored as they are, ignore = 0
      ("unlabeled"), no remap.

    ``ignore_index`` (not None) replaces the table's ignore id, and remap entries follow it.
    """
    if label_kind not in LABEL_KINDS:
        raise ConfigError(f"label kind {label_kind!r} is not one of {', '.join(LABEL_KINDS)}")
    if num_classes is not None and not 1 <= num_classes <= MAX_CLASSES:
        raise ConfigError(f"--num-classes {num_classes} must be between 1 and {MAX_CLASSES}")
    file_table: ClassTable | None = None
    if palette is not None:
        file_table = read_palette(palette)
    elif class_dict is not None:
        file_table = read_class_dict(class_dict)

    def generic(n: int) -> ClassTable:
        return ClassTable(tuple(ClassInfo(i, f"class_{i}") for i in range(n)), None, source="num-classes")

    def agree(table: ClassTable) -> ClassTable:
        if num_classes is not None and num_classes != table.num_classes:
            raise ConfigError(
                f"--num-classes {num_classes} disagrees with {table.source}, "
                f"which lists {table.num_classes} classes",
                fix="drop --num-classes or fix the class table",
            )
        return table

    if label_kind == "colour":
        if file_table is None:
            raise ConfigError(
                "colour masks need a class table", fix="put class_dict.csv at the root or pass --palette FILE"
            )
        table = agree(file_table)
    elif label_kind == "ids":
        if file_table is not None:
            table = agree(file_table)
        elif num_classes is not None:
            table = generic(num_classes)
        elif layout in ("segnet", "listfile"):
            table = CAMVID_SEGNET
        else:
            raise ConfigError(
                "label ids need the number of classes",
                fix="pass --num-classes N (and --ignore-index V if any)",
            )
    elif label_kind == "palette":
        if file_table is not None:
            table = agree(file_table)
        elif num_classes is not None:
            table = generic(num_classes)
        else:
            table = VOC
    else:  # cityscapes
        table = agree(CITYSCAPES if cityscapes_train_ids else CITYSCAPES_LABEL_IDS)
    if ignore_index is not None:
        table = table.with_ignore_index(ignore_index)
    logger.debug("class table %s: %d classes, ignore %s", table.source, table.num_classes, table.ignore_index)
    return table
