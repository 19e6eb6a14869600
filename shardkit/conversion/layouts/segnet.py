"""SegNet's CamVid layout: ``<split>/`` + ``<split>annot/`` with the same file names (labels: grayscale ids)."""

from __future__ import annotations

import re

from ...labels.builtin import CAMVID_SEGNET
from ...labels.policy import TableChoice
from .base import Context, Discovery, Job, Layout

#: CamVid's frame names: the four sequences 0001TP, 0006R0, 0016E5 and Seq05VD, then a frame number (a name
#: may carry more around it: ``copy_0001TP_006690``, ``0001TP_006690_L``).
_CAMVID_FRAME = re.compile(r"(?:^|[_\-. ])(0001TP|0006R0|0016E5|Seq05VD)_f?\d{5,6}(?:$|[_\-. ])")


def camvid_table(found: Discovery) -> TableChoice | None:
    """CamVid's SegNet table when every image name of ``found`` holds a CamVid frame name; else None."""
    names = [key.rsplit("/", 1)[-1].rsplit(".", 1)[0] for pairs in found.splits.values() for key in pairs.keys]
    if names and all(_CAMVID_FRAME.search(n) for n in names):
        return TableChoice(CAMVID_SEGNET, f"the {found.layout} layout with CamVid frame names (0001TP_…, Seq05VD_…)")
    return None


class SegnetLayout(Layout):
    name = "segnet"
    expected = "<split>/ + <split>annot/"
    order = 80
    colour_with_class_dict = False

    def detect(self, ctx: Context) -> dict[str, Job]:
        r = ctx.root
        return {d: ctx.pairs(r / d, r / f"{d}annot", ("",)) for d in ctx.dirs if f"{d}annot" in ctx.dirs}

    def default_table(self, found: Discovery, *, cityscapes_train_ids: bool = True) -> TableChoice | None:
        return camvid_table(found)


LAYOUT = SegnetLayout
