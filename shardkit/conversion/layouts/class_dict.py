"""The CamVid-with-colours layout: ``<split>/`` + ``<split>_labels/`` (``<stem>_L.png`` …), usually with a
``class_dict.csv`` at the root (labels: colour masks)."""

from __future__ import annotations

from .base import Context, Job, Layout


class ClassDictLayout(Layout):
    name = "class_dict"
    expected = "<split>/ + <split>_labels/ (+ class_dict.csv)"
    order = 70
    label_kind = "colour"

    def detect(self, ctx: Context) -> dict[str, Job]:
        r = ctx.root
        return {d: ctx.pairs(r / d, r / f"{d}_labels") for d in ctx.dirs if f"{d}_labels" in ctx.dirs}


LAYOUT = ClassDictLayout
