"""The annotation-source contract's shared helpers: :func:`sample_digest`, what a sample's fingerprint takes of its
shapes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from shardkit.labels.sources.base import ObjectShapes, SampleShapes, sample_digest


def sample(points: list[float], *, cls: int = 1, files: tuple[str, ...] = (), data: tuple = ()) -> SampleShapes:
    poly = ObjectShapes("7", cls, "polygons", (np.asarray(points, np.float64),))
    extra = (ObjectShapes("8", 2, "maskfile", data),) if data else ()
    return SampleShapes("a.jpg", 40, 50, (poly, *extra), files)


def test_equal_shapes_equal_digests_and_every_part_counts() -> None:
    base = sample([1, 2, 30, 2, 30, 20])
    assert sample_digest(base) == sample_digest(sample([1, 2, 30, 2, 30, 20]))
    changed = [sample([1, 2, 30, 2, 30, 21]), sample([1, 2, 30, 2, 30, 20], cls=3),
               SampleShapes("a.jpg", 41, 50, base.objects), SampleShapes("b.jpg", 40, 50, base.objects),
               SampleShapes("a.jpg", 40, 50, base.objects[::-1] + base.objects),
               SampleShapes("a.jpg", 40, 50, (ObjectShapes("7", 1, "polygons", base.objects[0].data, True),)),
               SampleShapes("a.jpg", 40, 50, (ObjectShapes("7", 1, "polygons", base.objects[0].data, False, 2),)),
               SampleShapes("a.jpg", 40, 50, (ObjectShapes("7", 1, "polygons",
                                                           (np.asarray([1, 2, 30, 2, 30, 20], np.float32),)),))]
    digests = {sample_digest(s) for s in changed}
    assert len(digests) == len(changed) and sample_digest(base) not in digests


def test_a_named_file_counts_by_its_stat_even_when_size_and_mtime_are_kept(tmp_path: Path) -> None:
    mask = tmp_path / "m.png"
    mask.write_bytes(b"\x89PNG one")
    one = sample_digest(sample([1, 2, 30, 2, 30, 20], data=(str(mask),)))
    assert one == sample_digest(sample([1, 2, 30, 2, 30, 20], data=(str(mask),)))
    st = mask.stat()
    mask.write_bytes(b"\x89PNG two")  # same size; mtime put back: the ctime still moves
    os.utime(mask, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert sample_digest(sample([1, 2, 30, 2, 30, 20], data=(str(mask),))) != one


def test_relative_strings_are_never_stat_ed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key or id that happens to name a file in the working folder does not make the digest depend on it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.jpg").write_bytes(b"x")
    one = sample_digest(sample([1, 2, 30, 2, 30, 20]))
    (tmp_path / "a.jpg").write_bytes(b"yy")
    assert sample_digest(sample([1, 2, 30, 2, 30, 20])) == one
