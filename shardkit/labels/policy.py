"""Which class table a conversion uses, and why: the one rule every run states.

The table comes, first to last, from: a table file the user names (``--classes``, ``--palette``, ``--class-dict``)
or one at the dataset's root (``class_dict.csv``); ``--num-classes N``; the layout's own table, which a layout
gives only where it identifies the dataset (CamVid's SegNet frames, PASCAL VOC, Cityscapes) or the dataset ships
one in a form the layout defines (labelme2voc's ``class_names.txt``); and last the ids found in the label files.
Nothing else: a dataset the layout does not identify never gets another dataset's table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .builtin import CITYSCAPES, CITYSCAPES_LABEL_IDS
from .classes import LABEL_KINDS, MAX_CLASSES, ClassInfo, ClassTable
from .tablefiles import read_class_dict, read_classes, read_palette

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableChoice:
    """A class table and, in words, where it came from (logged by every run, shown by ``--dry-run``)."""

    table: ClassTable
    reason: str

    def line(self) -> str:
        t = self.table
        ignore = "none" if t.ignore_index is None else str(t.ignore_index)
        return f"class table: {t.num_classes} classes from {self.reason}; ignore id {ignore}"


#: Scans the label files' values for a table (given the user's ignore id): see :mod:`.scan`.
Scan = Callable[[int | None], TableChoice]


def choose_class_table(
    label_kind: str,
    *,
    class_dict: Path | None,
    palette: Path | None,
    num_classes: int | None,
    ignore_index: int | None,
    classes: Path | None = None,
    default: TableChoice | None = None,
    scan: Scan | None = None,
    layout: str = "",
) -> TableChoice:
    """The class table for a conversion and the reason for it (the rule in the module docstring).

    - ``colour`` labels need colours: a ``--palette``/``--classes``/class_dict file, else a ConfigError.
    - ``ids`` and ``palette`` labels: a file, else ``--num-classes N`` (names ``class_0..``), else ``default``
      (the layout's), else ``scan`` (the ids in the data), else a ConfigError asking for one of them.
    - ``cityscapes``: the layout's table (the 19 trainIds, or the 34 labelIds); without one, Cityscapes' trainIds.

    A file and ``--num-classes`` must agree on the count. ``ignore_index`` (not None) replaces the table's
    ignore id, and remap entries follow it.
    """
    if label_kind not in LABEL_KINDS:
        raise ConfigError(f"label kind {label_kind!r} is not one of {', '.join(LABEL_KINDS)}")
    if num_classes is not None and not 1 <= num_classes <= MAX_CLASSES:
        raise ConfigError(f"--num-classes {num_classes} must be between 1 and {MAX_CLASSES}")
    if sum(p is not None for p in (classes, palette)) > 1:
        raise ConfigError("--classes and --palette both given", fix="pass one class table file")
    file_choice: TableChoice | None = None
    if classes is not None:
        file_choice = TableChoice(read_classes(classes), f"--classes {classes}")
    elif palette is not None:
        file_choice = TableChoice(read_palette(palette), f"--palette {palette}")
    elif class_dict is not None:
        file_choice = TableChoice(read_class_dict(class_dict), f"the class table file {class_dict}")
    where = f"the {layout} layout" if layout else "this layout"

    def agree(choice: TableChoice) -> TableChoice:
        if num_classes is not None and num_classes != choice.table.num_classes:
            raise ConfigError(
                f"--num-classes {num_classes} disagrees with {choice.table.source}, "
                f"which lists {choice.table.num_classes} classes",
                fix="drop --num-classes or fix the class table",
            )
        return choice

    if label_kind == "colour":
        if file_choice is None and default is not None and all(c.colour is not None for c in default.table.classes):
            file_choice = default  # a colour table the dataset ships in its layout's form (CVAT's labelmap.txt)
        if file_choice is None:
            raise ConfigError(
                "colour masks need a class table",
                fix="put class_dict.csv at the root or pass --palette FILE (or --classes FILE with colours)",
            )
        choice = agree(file_choice)
    elif label_kind == "cityscapes":
        choice = agree(default or TableChoice(CITYSCAPES, "the cityscapes label kind"))
    elif file_choice is not None:
        choice = agree(file_choice)
    elif num_classes is not None:
        table = ClassTable(tuple(ClassInfo(i, f"class_{i}") for i in range(num_classes)), None,
                           source="num-classes")
        choice = TableChoice(table, f"--num-classes {num_classes} (names class_0 … class_{num_classes - 1})")
    elif default is not None:
        choice = default
    elif label_kind == "ade20k":  # the ids in the files are ADE20K's object index: never numbered by a scan
        raise ConfigError("ADE20K's _seg.png class ids ((R/10)*256 + G) index the release's object names, which "
                          "this dataset folder does not hold",
                          fix="keep the 2021 release's per-image .json beside each image (they name the ids), or "
                              "pass --classes FILE naming every id 0..N as 'id name' lines, or --num-classes N "
                              "above every id (names class_0 …)")
    elif scan is not None:
        choice = scan(ignore_index)
    else:
        raise ConfigError(
            f"{where} does not identify the dataset, so its classes are unknown",
            fix="pass --classes FILE (names, optionally colours) or --num-classes N",
        )
    if ignore_index is not None and choice.table.ignore_index != ignore_index:
        choice = TableChoice(choice.table.with_ignore_index(ignore_index),
                             f"{choice.reason}, ignore id {ignore_index} from --ignore-index")
    logger.debug("%s", choice.line())
    return choice


def build_class_table(
    label_kind: str,
    *,
    class_dict: Path | None,
    palette: Path | None,
    layout: str = "",
    num_classes: int | None,
    ignore_index: int | None,
    cityscapes_train_ids: bool = True,
    classes: Path | None = None,
    default: TableChoice | None = None,
) -> ClassTable:
    """The table of :func:`choose_class_table` without the reason (no scan: a caller with label files to scan
    uses that function). ``cityscapes_train_ids`` picks the Cityscapes table where no ``default`` is given."""
    if label_kind == "cityscapes" and default is None:
        table = CITYSCAPES if cityscapes_train_ids else CITYSCAPES_LABEL_IDS
        default = TableChoice(table, "the cityscapes label kind")
    return choose_class_table(label_kind, class_dict=class_dict, palette=palette, num_classes=num_classes,
                              ignore_index=ignore_index, classes=classes, default=default, layout=layout).table
