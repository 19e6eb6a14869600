"""nnU-Net v2 / Medical Segmentation Decathlon volumes: ``dataset.json`` + ``imagesTr/<case>_<CCCC>.nii.gz`` (or
MSD's own ``imagesTr/<case>.nii.gz``, modalities on a 4th axis) + ``labelsTr/<case>.nii.gz`` (+ ``imagesTs/``); one
sample source per case (:mod:`.volumes`, docs/volumes.md)."""

from __future__ import annotations

from ...labels.policy import TableChoice
from .base import Context, Discovery, Job, Layout
from .volumes import case_jobs, dataset_table, detect


class NnunetLayout(Layout):
    name = "nnunet"
    expected = "dataset.json + imagesTr/<case>_0000.nii.gz + labelsTr/<case>.nii.gz (+ imagesTs/)"
    order = 95  # after the image layouts: none of them reads volume files
    colour_with_class_dict = False
    image_dirs = ("imagesTr",)
    label_dirs = ("labelsTr",)
    takes_label_suffix = False

    def detect(self, ctx: Context) -> dict[str, Job]:
        if "imagesTr" not in ctx.dirs:
            return {}
        found = detect(ctx.root, on_error=ctx.on_error)
        return {} if found is None or found.kind not in ("nnunet", "msd") else case_jobs(found)

    def default_table(self, found: Discovery, *, cityscapes_train_ids: bool = True) -> TableChoice | None:
        return dataset_table(found.root)


LAYOUT = NnunetLayout
