"""mmsegmentation's converted layout: ``img_dir/[<split>/]`` + ``ann_dir/[<split>/]`` (LoveDA, Potsdam,
Vaihingen, REFUGE, Synapse … as its dataset tools write them)."""

from __future__ import annotations

from .base import Context, Job, Layout
from .generic import split_jobs


class MmsegLayout(Layout):
    name = "mmseg"
    expected = "img_dir/[<split>/] + ann_dir/[<split>/]"
    order = 45
    image_dirs = ("img_dir",)
    label_dirs = ("ann_dir",)

    def detect(self, ctx: Context) -> dict[str, Job]:
        images, labels = ctx.dir_named(self.image_dirs), ctx.dir_named(self.label_dirs)
        if not images or not labels:
            return {}
        return split_jobs(ctx, ctx.root / images[0], ctx.root / labels[0])


LAYOUT = MmsegLayout
