"""shardkit.support.smallfile: the one guarded reader of files in split and output folders (and of the files a user
names)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from shardkit.support.smallfile import (
    MAX_JSON_DEPTH,
    checksum,
    json_depth,
    loads_bounded,
    open_regular,
    read_guarded,
    read_json,
)


def _depth(value: Any) -> int:
    if isinstance(value, (list, dict)):
        inner = value.values() if isinstance(value, dict) else value
        return 1 + max((_depth(v) for v in inner), default=0)
    return 0


def _value(rng: random.Random, level: int) -> Any:
    """Random JSON whose strings are made of the characters that confuse a bracket count: brackets, quotes,
    backslashes."""
    text = "".join(rng.choice('[]{}"\\a:,\n') for _ in range(rng.randrange(5)))
    roll = rng.random()
    if level > 6 or roll < 0.3:
        return text
    if roll < 0.6:
        return [_value(rng, level + 1) for _ in range(rng.randrange(4))]
    return {text + str(i): _value(rng, level + 1) for i in range(rng.randrange(4))}


def test_the_nesting_count_is_exact_whatever_the_strings_hold() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        value = _value(rng, 0)
        text = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1]))
        assert json_depth(text) == json_depth(text.encode()) == _depth(value), text


def test_deep_json_is_a_value_error_before_parsing_never_a_recursion_error() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ValueError, match=f"nests more than {MAX_JSON_DEPTH} levels"):
        loads_bounded(deep, "cache")
    with pytest.raises(ValueError, match="nests more than 3 levels"):
        loads_bounded(b'{"a": [[[1]]]}', "cache", max_depth=3)
    assert loads_bounded(b'{"a": "[[[[[[", "b": [[1]]}', "cache", max_depth=3) == {"a": "[[[[[[", "b": [[1]]}
    with pytest.raises(ValueError, match="cache is not valid JSON"):
        loads_bounded(b"{\xff", "cache")


@pytest.mark.timeout(60)
def test_only_regular_files_are_opened_and_a_fifo_never_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    try:
        with pytest.raises(OSError, match=r"not a regular file \(a FIFO\)"):
            read_json(fifo, "cache")
    finally:
        fifo.unlink()
    with pytest.raises(OSError, match=r"not a regular file \(a folder\)"):
        read_guarded(tmp_path, "cache")
    with pytest.raises(OSError, match=r"not a regular file \(a device\)"):
        read_guarded("/dev/zero", "cache")
    with pytest.raises(FileNotFoundError):
        read_guarded(tmp_path / "missing", "cache")


def test_the_size_cap_is_checked_before_reading_and_links_out_of_the_folder_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(1 << 40)  # sparse: a read would take a TiB
    with pytest.raises(OSError, match="is 1099511627776 bytes, more than the 1024 allowed"):
        read_guarded(big, "cache", limit=1024)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.json"
    outside.write_text("{}")
    folder = tmp_path / "split"
    folder.mkdir()
    (folder / "link.json").symlink_to(outside)
    try:
        with pytest.raises(OSError, match="outside"):
            open_regular(folder / "link.json", "cache", inside=folder)
        assert read_json(folder / "link.json", "cache") == {}  # without ``inside`` a link is followed
    finally:
        outside.unlink()


def test_the_checksum_is_of_the_canonical_json() -> None:
    assert checksum({"b": 1, "a": [1, "x"]}) == checksum({"a": [1, "x"], "b": 1})
    assert checksum({"a": 1}) != checksum({"a": 2})
