"""Read-ahead hints on memory-mapped arrays: the mapping is found exactly and advice reaches the kernel."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from shardkit.formats.mapping import MappedArray


def _vm_flags(path: Path) -> list[str]:
    """VmFlags of every mapping of ``path`` in this process (``rr``: MADV_RANDOM in force)."""
    flags, inside = [], False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isalnum() and "-" in line.split()[0] and ":" not in line.split()[0]:
            inside = line.endswith(str(path))
        elif inside and line.startswith("VmFlags:"):
            flags.append(line)
    return flags


def test_the_mapping_under_an_np_load_array_is_found_with_its_offset(tmp_path: Path) -> None:
    arr = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
    np.save(tmp_path / "a.npy", arr)
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    m = MappedArray.of(mapped)
    assert m is not None and m.start > 0  # after the .npy header
    assert m.mm[m.start : m.start + arr.nbytes] == arr.tobytes()
    assert MappedArray.of(np.asarray(arr)) is None  # a plain array has no mapping to advise


def test_random_advice_reaches_the_mapping(tmp_path: Path) -> None:
    path = tmp_path / "b.npy"
    np.save(path, np.zeros((64, mmap.PAGESIZE), np.uint8))
    mapped = np.load(path, mmap_mode="r")
    m = MappedArray.of(mapped)
    assert m is not None
    assert _vm_flags(path) and not any(" rr" in f for f in _vm_flags(path))
    m.set_random()
    assert all(" rr" in f for f in _vm_flags(path))  # VM_RAND_READ: no read-around on faults


def test_will_need_asks_for_page_aligned_merged_ranges(tmp_path: Path, monkeypatch) -> None:
    np.save(tmp_path / "c.npy", np.zeros((8, 1000), np.uint8))
    m = MappedArray.of(np.load(tmp_path / "c.npy", mmap_mode="r"))
    assert m is not None
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(MappedArray, "_advise", lambda self, *a: calls.append(a))
    m.will_need(np.array([0, 1000, 5000]), np.array([1000, 2000, 6000]))  # rows 0-1 touch: one range
    page = mmap.PAGESIZE
    starts = [m.start, m.start + 5000]
    ends = [m.start + 2000, m.start + 6000]
    want = [(mmap.MADV_WILLNEED, a - a % page, b - (a - a % page)) for a, b in zip(starts, ends, strict=True)]
    assert calls == want
