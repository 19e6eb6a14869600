"""Per-instance mask folders: real Data Science Bowl 2018 samples (the union of their masks, by an independent
reading with PIL), class sub-folders, and masks that are not binary or not the image's size refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import PIL.Image
import pytest

from shardkit.errors import LabelError
from shardkit.labels.sources import registry
from shardkit.labels.sources.base import Policies, rasterise
from shardkit.labels.sources.instances import InstanceMasksSource

REAL = Path(__file__).resolve().parents[2] / "data" / "dsb2018"


def union(folder: Path) -> np.ndarray:
    """The semantic mask DSB's definition gives: a pixel is a nucleus when any of its masks is nonzero."""
    masks = [np.array(PIL.Image.open(p)) for p in sorted((folder / "masks").glob("*.png"))]
    return np.any(np.stack(masks) > 0, axis=0).astype(np.uint8)


def test_real_dsb_samples_are_the_union_of_their_masks(tmp_path: Path) -> None:
    root = tmp_path / "dsb"
    shutil.copytree(REAL, root)
    root = root.resolve()
    assert registry.detect(root) == [(InstanceMasksSource, root)]
    notes = InstanceMasksSource().read(root, root)
    assert [c.name for c in notes.table.classes] == ["background", "object"] and list(notes.splits) == ["stage1_train"]
    samples = notes.splits["stage1_train"]
    assert len(samples) == 3 and sum(len(s.objects) for _, s in samples) == 9
    for image, sample in samples:
        ids, report = rasterise(InstanceMasksSource(), sample, sample.height, sample.width, notes.table,
                                Policies("order", "class"))
        np.testing.assert_array_equal(ids, union(image.parent.parent))
        assert report.painted_over == 0 and report.lost == []  # DSB's masks do not overlap


def test_class_subfolders_and_bad_masks(tmp_path: Path) -> None:
    root = tmp_path / "cells"
    sample = root / "s1"
    (sample / "images").mkdir(parents=True)
    PIL.Image.new("L", (8, 6)).save(sample / "images" / "s1.png")
    for cls, box in (("nucleus", (1, 1, 3, 3)), ("membrane", (4, 2, 7, 5))):
        (sample / "masks" / cls).mkdir(parents=True)
        m = np.zeros((6, 8), np.uint8)
        m[box[1] : box[3], box[0] : box[2]] = 255
        PIL.Image.fromarray(m).save(sample / "masks" / cls / "a.png")
    notes = InstanceMasksSource().read(root.resolve(), root.resolve())
    assert [c.name for c in notes.table.classes] == ["background", "membrane", "nucleus"]
    (_, s), = notes.splits["all"]
    ids, _ = rasterise(InstanceMasksSource(), s, 6, 8, notes.table, Policies("order", "class"))
    assert ids[1, 1] == 2 and ids[2, 4] == 1 and ids[0, 0] == 0
    noisy = np.zeros((6, 8), np.uint8)
    noisy[0, :3] = (0, 128, 255)
    PIL.Image.fromarray(noisy).save(sample / "masks" / "nucleus" / "a.png")
    with pytest.raises(LabelError, match="3 values"):
        rasterise(InstanceMasksSource(), s, 6, 8, notes.table, Policies("order", "class"))
    PIL.Image.new("L", (5, 5)).save(sample / "masks" / "nucleus" / "a.png")
    with pytest.raises(LabelError, match="image is 6x8"):
        rasterise(InstanceMasksSource(), s, 6, 8, notes.table, Policies("order", "class"))
