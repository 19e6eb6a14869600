"""SegNet-style list files at the root: ``<split>.txt`` with one ``image label`` pair a line (paths are matched
by their tail, so lists written on another machine still work)."""

from __future__ import annotations

import functools

from ...labels.policy import TableChoice
from .base import Context, Discovery, Job, Layout
from .scan import Listings, is_pair_list, read_pair_list
from .segnet import camvid_table


class ListfileLayout(Layout):
    name = "listfile"
    expected = "<split>.txt with 'image label' lines (or --split-list SPLIT=FILE from anywhere)"
    order = 90

    def detect(self, ctx: Context) -> dict[str, Job]:
        listings = Listings(ctx.root)
        return {n[:-4]: functools.partial(read_pair_list, ctx.root, ctx.root / n, listings) for n in ctx.files
                if n.lower().endswith(".txt") and is_pair_list(ctx.root / n)}

    def default_table(self, found: Discovery, *, cityscapes_train_ids: bool = True) -> TableChoice | None:
        return camvid_table(found)  # CamVid's own list files name CamVid frames; any other list file: no table


LAYOUT = ListfileLayout
