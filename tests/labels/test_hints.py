"""Value hints by what the values look like (shardkit/labels/hints.py): each kind of values gets the flags that
mean it, and never the ones that would convert it wrongly (tests/conversion/layouts/test_hints_followed.py follows
them)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardkit.labels.hints import jpeg_fix, read_values

DATA = Path(__file__).resolve().parents[1] / "data"


def counts(values: list[int], px: int = 100) -> np.ndarray:
    out = np.zeros(max(values) + 1, np.int64)
    out[values] = px
    return out


@pytest.mark.parametrize("values, fix", [
    ([0, 255], "--label-map 255:1 or --threshold 127"),
    ([0, 64, 128, 192, 255], "--label-map 0:0,64:1,128:2,192:3,255:4"),
    ([0, 85, 170, 255], "--label-map 0:0,85:1,170:2,255:3"),
    ([0, 63, 127, 191, 255], "--label-map 0:0,63:1,127:2,191:3,255:4"),  # v * 255 // 4, rounded
    ([0, 5, 6, 7, 9, 15, 18, 255], "--ignore-index 255"),  # labelme2voc: ids 0..20 and the 255 border
    ([0, 50, 100, 150, 255], "--label-map 0:0,50:1,100:2,150:3 --ignore-index 255"),
    ([0, 17, 44, 45], "--classes FILE naming every class, or --num-classes 46 (the ids kept as they are)"),
    ([0, 17, 44, 45, 255], "--ignore-index 255 --num-classes 46 (or --ignore-index 255 with --classes FILE"),
    ([0, 1, 2, 3, 65535], "--ignore-index 65535"),
])
def test_each_kind_of_values_gets_the_flags_that_mean_it(values: list[int], fix: str) -> None:
    reading = read_values(counts(values))
    assert reading is not None and reading[1].startswith(fix)


@pytest.mark.parametrize("values", [[0, 17, 44, 45], [0, 200, 250, 255], [0, 64, 128, 192, 255], [0, 255]])
def test_ignore_index_is_never_offered_for_a_class_value(values: list[int]) -> None:
    """45 beside 44, 255 beside 250, 255 as the last of evenly spaced codes or a binary foreground: classes."""
    reading = read_values(counts(values))
    assert reading is not None and "--ignore-index" not in reading[1] and "far above" not in reading[0]


def test_codes_are_never_offered_a_class_count() -> None:
    for values in ([0, 64, 128, 192, 255], [0, 20, 40, 60, 80, 100, 120, 140, 160, 180, 200, 220], [64, 128, 192]):
        reading = read_values(counts(values))
        assert reading is not None and "--num-classes" not in reading[1] and "--label-map" in reading[1]


def test_values_that_fit_get_no_hint_and_a_known_table_is_respected() -> None:
    assert read_values(counts([0, 1, 2, 5])) is None
    assert read_values(counts([0, 1, 2, 5]), num_classes=6) is None
    reading = read_values(counts([0, 1, 11, 255]), num_classes=11, ignore_index=255)  # 11: one past the table
    assert reading is not None and "--num-classes 12" in reading[1]


def test_real_jpeg_masks_get_a_threshold_between_their_levels() -> None:
    for mask in sorted((DATA / "kvasir-seg" / "masks").glob("*.jpg")):
        with Image.open(mask) as im:
            gray = np.array(im.convert("L"))
        assert len(np.unique(gray)) > 2
        assert jpeg_fix(np.bincount(gray.ravel(), minlength=256)).endswith("pass --threshold 127")


def _jpeg(arr: np.ndarray) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    with Image.open(buf) as im:
        return np.bincount(np.array(im).ravel(), minlength=256)


def test_jpeg_of_levels_far_apart_gets_ranges_and_of_ids_one_apart_no_flag() -> None:
    with Image.open(DATA / "mmseg" / "pseudo_lip_dataset" / "train_segmentations" / "684_2150041.png") as im:
        ids = np.array(im)  # ids 0, 2, 5, 13, 14, 15
    assert "no flag reads it exactly" in jpeg_fix(_jpeg(ids))
    three = np.select([ids == 0, ids < 13], [0, 128], 255).astype(np.uint8)
    assert jpeg_fix(_jpeg(three)).endswith("pass --label-map 0-64:0,65-191:1,192-255:2")
