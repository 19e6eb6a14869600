"""The torch devices the augmentation tests run on: the CPU always, CUDA where a GPU is lent (skipped elsewhere)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                reason="needs a CUDA GPU"))]
