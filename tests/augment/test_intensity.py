"""A.VolumeNormalize, the samplewise output op: its tables checked, each sample's row drawn by its global index, the
rule ``(clip(x, lower, upper) - mean) / max(std, 1e-8)`` in float32, and the refusals (the end-to-end check against
nnU-Net on a converted split: tests/read/test_volume_normalize.py)."""

from __future__ import annotations

import numpy as np
import pytest

from shardkit import augment as A
from shardkit.errors import ConfigError


def _op(rows: list[int] | None = None) -> A.VolumeNormalize:
    return A.VolumeNormalize(lower=[[-100.0, -np.inf], [0.0, -np.inf]], upper=[[100.0, np.inf], [50.0, np.inf]],
                             mean=[[10.0, 1.0], [20.0, 2.0]], std=[[5.0, 0.0], [2.0, 4.0]], rows=rows,
                             schemes=("ct", "zscore"))


def test_each_sample_gets_its_rows_values_by_its_index() -> None:
    op = _op(rows=[1, 0, 1])
    images = np.array([[[[-200, 7]]], [[[300, 9]]]], np.int16)  # (2, 1, 1, 2): samples 0 and 1
    got, labels = A.Compose([op])(images, np.zeros((2, 1, 1), np.uint8), [0, 1])
    assert got.dtype == np.float32 and labels.shape == (2, 1, 1)
    # sample 0 → row 1: clip(-200, 0, 50) = 0 → (0 - 20) / 2; band 2: (7 - 2) / 4
    # sample 1 → row 0: clip(300, -100, 100) = 100 → (100 - 10) / 5; band 2: std 0 → 1e-8
    np.testing.assert_array_equal(got[:, 0, 0], np.float32([[-10.0, 1.25], [18.0, (9 - 1) / np.float32(1e-8)]]))
    params = A.Compose([op]).params(2, hw=(1, 1))
    assert params.records[-1].row == 1  # the record a drawn sample keeps: its row, no random draw


def test_tables_and_indices_are_checked() -> None:
    with pytest.raises(ConfigError, match="four \\(rows, bands\\) tables of one shape"):
        A.VolumeNormalize([[0.0]], [[1.0]], [[0.0, 1.0]], [[1.0]])
    with pytest.raises(ConfigError, match="lower <= upper"):
        A.VolumeNormalize([[2.0]], [[1.0]], [[0.0]], [[1.0]])
    with pytest.raises(ConfigError, match="rows must index its tables"):
        A.VolumeNormalize([[0.0]], [[1.0]], [[0.0]], [[1.0]], rows=[0, 1])
    images, labels = np.zeros((1, 2, 2, 2), np.int16), np.zeros((1, 2, 2), np.uint8)
    with pytest.raises(ConfigError, match="knows 3 samples, not sample 7"):
        A.Compose([_op(rows=[0, 1, 0])])(images, labels, [7])
    with pytest.raises(ConfigError, match="statistics for 2 bands, the images 1"):
        A.Compose([_op()])(images[..., :1], labels, [0])
    with pytest.raises(ConfigError, match="must end the pipeline"):
        A.Compose([_op(), A.RandomFlip()])


def test_adding_it_does_not_change_the_other_ops_draws() -> None:
    base = A.parse("scale=0.5:2,crop=8x8,hflip")
    with_op = A.Compose([*base.ops, _op()])
    for i in range(5):
        a, b = base.params(i, seed=3, hw=(16, 16)), with_op.params(i, seed=3, hw=(16, 16))
        assert np.array_equal(a.matrix, b.matrix) and a.records == b.records[:-1]
