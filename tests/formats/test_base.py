"""The base writer's shared helpers."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from shardkit.formats.base import HASH_CHUNK, sha256_file


@pytest.mark.parametrize("size", [0, 1, 4097, HASH_CHUNK + 3])
def test_sha256_file_mapped_and_chunked_agree_with_hashlib(tmp_path: Path, size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    p = tmp_path / "f.bin"
    p.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    assert sha256_file(p) == sha256_file(p, mapped=True) == want
