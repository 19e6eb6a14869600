"""An image folder beside a label folder, with or without split sub-folders:
``image(s)|img(s)/[<split>/]`` + ``label(s)|mask(s)|annotation(s)|gt|…/[<split>/]`` (ADE20K's
``images/training`` + ``annotations/training`` among them: its ``objectInfo150.txt``/``.csv`` at the root is the class
table, ids 1..150 as the files hold them and 0 "other objects" the ignore id)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import ClassVar

from ...labels.policy import TableChoice
from ...labels.tablefiles import read_classes
from .base import Context, Discovery, Job, Layout, has_images
from .scan import subdirs

logger = logging.getLogger(__name__)

IMAGE_DIRS: tuple[str, ...] = ("images", "image", "imgs", "img")
#: Label folder names, best first: ``mask(s)`` last, because in some sets (DRIVE) ``mask/`` holds the
#: field-of-view masks beside the real labels.
LABEL_DIRS: tuple[str, ...] = ("annotations", "annotation", "labels", "label", "gt", "gts", "groundtruth",
                               "ground_truth", "segmentations", "segmentation", "1st_manual", "manual",
                               "masks", "mask")
#: SceneParsing's class table files (ADEChallengeData2016 ships objectInfo150.txt at its root)
OBJECT_INFO = ("objectInfo150.txt", "objectInfo150.csv")


def _holds_images(folder: Path) -> bool:
    """Images in ``folder`` or in one of its sub-folders (a label folder of YOLO .txt files holds none)."""
    return has_images(folder) or any(has_images(folder / d) for d in subdirs(folder))


def choose_label_dir(found: list[str], where: Path) -> str | None:
    """The first candidate label folder that holds images, with a warning naming the other candidates."""
    usable = [d for d in found if _holds_images(where / d)]
    if len(usable) > 1:
        logger.warning("%s: labels from %s/, ignoring %s (pass --images and --labels to choose)", where, usable[0],
                       ", ".join(f"{d}/" for d in usable[1:]))
    return usable[0] if usable else None


def split_jobs(ctx: Context, images: Path, labels: Path) -> dict[str, Job]:
    """One split ``all`` when ``images`` holds images itself; else one split per sub-folder of it."""
    splits = subdirs(images)
    if not splits or has_images(images):
        return {"all": ctx.pairs(images, labels)}
    return {s: ctx.pairs(images / s, labels / s) for s in splits}


class GenericLayout(Layout):
    name = "generic"
    expected = "images/[<split>/] + labels/[<split>/] (or image/, img(s)/ + masks/, annotations/, gt/ …)"
    order = 50
    image_dirs: ClassVar[tuple[str, ...]] = IMAGE_DIRS
    label_dirs: ClassVar[tuple[str, ...]] = LABEL_DIRS

    def detect(self, ctx: Context) -> dict[str, Job]:
        images, labels = ctx.dir_named(self.image_dirs), ctx.dir_named(self.label_dirs)
        if not images or not labels:
            return {}
        label = choose_label_dir(labels, ctx.root)
        return split_jobs(ctx, ctx.root / images[0], ctx.root / label) if label else {}

    def default_table(self, found: Discovery, *, cityscapes_train_ids: bool = True) -> TableChoice | None:
        """SceneParsing's objectInfo150 table when the root holds it (ADEChallengeData2016), else None."""
        for name in OBJECT_INFO:
            if (found.root / name).is_file():
                return TableChoice(read_classes(found.root / name),
                                   f"{name} at the root (SceneParsing's 150 classes as the files number them, 1..150; "
                                   "0 'other objects' is the ignore id, unevaluated by the benchmark)")
        return None


LAYOUT = GenericLayout
