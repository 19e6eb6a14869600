"""The class model: ClassTable counts, dtype, JSON round trip, validation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardkit.errors import ConfigError, ShardFormatError
from shardkit.labels import CAMVID_SEGNET, CITYSCAPES, CITYSCAPES_LABEL_IDS, VOC, ClassInfo, ClassTable

# --------------------------------------------------------------------------- ClassTable


def test_class_table_counts_classes_and_picks_the_smallest_dtype() -> None:
    assert CAMVID_SEGNET.num_classes == 12
    assert CAMVID_SEGNET.label_dtype() == np.uint8
    assert VOC.label_dtype() == np.uint8  # ignore 255 still fits a byte
    big = ClassTable(tuple(ClassInfo(i, f"c{i}", None) for i in range(300)), 255)
    assert big.label_dtype() == np.dtype("<u2")
    small_ignore_big = ClassTable(tuple(ClassInfo(i, f"c{i}", None) for i in range(12)), 256)
    assert small_ignore_big.label_dtype() == np.dtype("<u2")
    assert np.dtype("<u2").byteorder in ("<", "=")


def test_class_table_json_round_trip_is_plain_json() -> None:
    for table in (CAMVID_SEGNET, VOC, CITYSCAPES, CITYSCAPES_LABEL_IDS):
        d = json.loads(json.dumps(table.to_json()))
        assert set(d) == {"num_classes", "ignore_index", "source", "classes", "remap"}
        assert d["classes"][0].keys() == {"id", "name", "colour"}
        assert ClassTable.from_json(d) == table
    assert CAMVID_SEGNET.to_json()["remap"] is None
    assert CITYSCAPES.to_json()["remap"][7] == 0


def test_class_table_from_json_rejects_a_damaged_dict() -> None:
    d = CAMVID_SEGNET.to_json()
    with pytest.raises(ShardFormatError):
        ClassTable.from_json({"classes": [{"id": 0}]})
    with pytest.raises(ShardFormatError, match="num_classes=13"):
        ClassTable.from_json({**d, "num_classes": 13})


def test_class_table_validates_ids_ignore_and_remap() -> None:
    with pytest.raises(ConfigError, match="expected 0"):
        ClassTable((ClassInfo(1, "a", None),), None)
    with pytest.raises(ConfigError, match="ignore index"):
        ClassTable((ClassInfo(0, "a", None),), -1)
    with pytest.raises(ConfigError, match="256"):
        ClassTable((ClassInfo(0, "a", None),), 255, remap=(0, 1))
    with pytest.raises(ConfigError, match="remap targets"):
        ClassTable((ClassInfo(0, "a", None),), 255, remap=(7,) * 256)
    with pytest.raises(ConfigError, match="colour"):
        ClassInfo(0, "a", (1, 2, 300))
