"""Per-case folders of volumes (BraTS): ``<case>/<case>_<modality>.nii.gz`` + ``<case>/<case>_seg.nii.gz``; one
sample source per case, modalities in name order or ``--modalities`` order (:mod:`.volumes`, docs/volumes.md)."""

from __future__ import annotations

from .base import Context, Job, Layout
from .volumes import case_jobs, detect


class CaseFoldersLayout(Layout):
    name = "case-folders"
    expected = "<case>/<case>_<modality>.nii.gz + <case>/<case>_seg.nii.gz (one folder per case)"
    order = 96
    colour_with_class_dict = False
    takes_label_suffix = False

    def detect(self, ctx: Context) -> dict[str, Job]:
        # --modalities: ordered at plan time
        found = detect(ctx.root, on_error=ctx.on_error) if "imagesTr" not in ctx.dirs else None
        return {} if found is None or found.kind != self.name else case_jobs(found)


LAYOUT = CaseFoldersLayout
