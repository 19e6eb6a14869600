"""Split folders above the image and label folders: ``<split>/image(s)/`` + ``<split>/label(s)|1st_manual|…/``
(the DRIVE retina set: ``training/images/21_training.tif`` + ``training/1st_manual/21_manual1.gif``)."""

from __future__ import annotations

from .base import Context, Job, Layout
from .generic import IMAGE_DIRS, LABEL_DIRS, choose_label_dir


class SplitDirsLayout(Layout):
    name = "split_dirs"
    expected = "<split>/images/ + <split>/labels/ (or 1st_manual/, masks/, gt/ …)"
    order = 55
    image_dirs = IMAGE_DIRS
    label_dirs = LABEL_DIRS

    def detect(self, ctx: Context) -> dict[str, Job]:
        jobs: dict[str, Job] = {}
        for split in sorted(ctx.dirs):
            where = ctx.root / split
            images, labels = ctx.dir_named(self.image_dirs, where), ctx.dir_named(self.label_dirs, where)
            label = choose_label_dir(labels, where) if images and labels else None
            if images and label:
                jobs[split] = ctx.pairs(where / images[0], where / label)
        return jobs


LAYOUT = SplitDirsLayout
