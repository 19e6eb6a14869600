"""The torch devices the augmentation tests run on: the CPU always, CUDA where a GPU is lent (skipped elsewhere)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                reason="needs a CUDA GPU"))]


def cpu_and_torch(aug: Any, images: np.ndarray, labels: np.ndarray, device: str, *, seed: int, epoch: int,
                  ignore_index: int) -> tuple[np.ndarray, np.ndarray, Any, Any]:
    """``aug`` on samples 0..B-1 by the numpy/OpenCV path (arrays) and by the torch path on ``device`` (tensors)."""
    from shardkit.augment.torch import apply_batch

    idx = np.arange(len(images))
    want_img, want_lab = aug(images, labels, idx, seed=seed, epoch=epoch, ignore_index=ignore_index)
    got_img, got_lab = apply_batch(aug, torch.from_numpy(images).to(device), torch.from_numpy(labels).to(device),
                                   idx, seed=seed, epoch=epoch, ignore_index=ignore_index)
    return want_img, want_lab, got_img, got_lab
