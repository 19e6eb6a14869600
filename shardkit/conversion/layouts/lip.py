"""LIP's layout: ``<split>_images/`` + ``<split>_segmentations/`` (or ``_labels/``, ``_masks/``,
``_annotations/``)."""

from __future__ import annotations

from .base import Context, Job, Layout

_IMAGES = ("_images", "_imgs")
_LABELS = ("_segmentations", "_labels", "_masks", "_annotations")


class LipLayout(Layout):
    name = "lip"
    expected = "<split>_images/ + <split>_segmentations/ (or <split>_labels/, <split>_masks/)"
    order = 60
    image_dirs = tuple(f"<split>{s}" for s in _IMAGES)
    label_dirs = tuple(f"<split>{s}" for s in _LABELS)

    def detect(self, ctx: Context) -> dict[str, Job]:
        by_lower = {d.lower(): d for d in sorted(ctx.dirs)}
        jobs: dict[str, Job] = {}
        for low, name in by_lower.items():
            tag = next((t for t in _IMAGES if low.endswith(t) and len(low) > len(t)), None)
            if tag is None:
                continue
            split = name[: -len(tag)]
            label = next((by_lower[f"{split.lower()}{t}"] for t in _LABELS if f"{split.lower()}{t}" in by_lower),
                         None)
            if label is not None:
                jobs[split] = ctx.pairs(ctx.root / name, ctx.root / label)
        return jobs


LAYOUT = LipLayout
