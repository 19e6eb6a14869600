"""The reference implementations in tests/reference are unedited copies of their sources (git blob hashes)."""

from __future__ import annotations

import hashlib
from pathlib import Path

REFERENCE = Path(__file__).parent / "reference"
BLOBS = {"labelme_shape.py": "375c7bd2ca0856c63ebe9b24fa4ab9248e58e2b3"}


def test_reference_copies_are_byte_for_byte() -> None:
    for name, blob in BLOBS.items():
        data = (REFERENCE / name).read_bytes()
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob, name
