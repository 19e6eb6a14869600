"""An image folder beside a label folder, with or without split sub-folders:
``image(s)|img(s)/[<split>/]`` + ``label(s)|mask(s)|annotation(s)|gt|…/[<split>/]`` (ADE20K's
``images/training`` + ``annotations/training`` among them)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import ClassVar

from .base import Context, Job, Layout, has_images
from .scan import subdirs

logger = logging.getLogger(__name__)

IMAGE_DIRS: tuple[str, ...] = ("images", "image", "imgs", "img")
#: Label folder names, best first: ``mask(s)`` last, because in some sets (DRIVE) ``mask/`` holds the
#: field-of-view masks beside the real labels.
LABEL_DIRS: tuple[str, ...] = ("annotations", "annotation", "labels", "label", "gt", "gts", "groundtruth",
                               "ground_truth", "segmentations", "segmentation", "1st_manual", "manual",
                               "masks", "mask")


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


LAYOUT = GenericLayout
