"""Cityscapes: ``leftImg8bit/<split>/<city>/`` + ``gtFine/<split>/<city>/*_gtFine_labelIds.png``."""

from __future__ import annotations

import functools

from ...labels.builtin import CITYSCAPES, CITYSCAPES_LABEL_IDS
from ...labels.policy import TableChoice
from .base import Context, Discovery, Job, Layout
from .scan import match_pairs, subdirs


class CityscapesLayout(Layout):
    name = "cityscapes"
    expected = "leftImg8bit/<split>/<city>/ + gtFine/<split>/<city>/"
    order = 10
    label_kind = "cityscapes"
    colour_with_class_dict = False
    image_dirs = ("leftImg8bit",)
    label_dirs = ("gtFine",)
    takes_label_suffix = False

    def detect(self, ctx: Context) -> dict[str, Job]:
        if not {"leftImg8bit", "gtFine"} <= ctx.dirs:
            return {}
        r = ctx.root
        return {s: functools.partial(match_pairs, r, r / "leftImg8bit" / s, r / "gtFine" / s, ("_gtFine_labelIds",),
                                     image_tag="_leftImg8bit", label_tag="_gtFine_labelIds")
                for s in subdirs(r / "leftImg8bit")}

    def default_table(self, found: Discovery, *, cityscapes_train_ids: bool = True) -> TableChoice | None:
        if cityscapes_train_ids:
            return TableChoice(CITYSCAPES, "the cityscapes layout: the 19 trainIds (labelId → trainId remap)")
        return TableChoice(CITYSCAPES_LABEL_IDS, "the cityscapes layout: the 34 labelIds as stored")


LAYOUT = CityscapesLayout
