"""The format registry: a name gives its format (writer, reader, facts); an unknown name says what exists."""

from __future__ import annotations

import pytest

from shardkit.errors import ConfigError
from shardkit.formats.base import ShardReader, ShardWriter
from shardkit.formats.registry import get, names, reader_class, writer_class


def test_the_four_formats_are_found_npy_first() -> None:
    assert names() == ("npy", "hdf5", "lmdb", "tfrecord")


@pytest.mark.parametrize("name", names())
def test_every_format_has_a_writer_a_reader_and_its_facts(name: str) -> None:
    writer, reader = writer_class(name), reader_class(name)
    assert issubclass(writer, ShardWriter) and issubclass(reader, ShardReader)
    fmt = get(name)
    assert fmt.name == name and 1 in fmt.versions


def test_an_unknown_format_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown format 'zip'") as info:
        writer_class("zip")
    assert all(name in (info.value.fix or "") for name in names())
