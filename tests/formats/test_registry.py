"""The format registry: a name gives its writer and reader classes; an unknown name says what exists."""

from __future__ import annotations

import pytest

from shardkit.config import FORMATS
from shardkit.errors import ConfigError
from shardkit.formats.base import ShardReader, ShardWriter
from shardkit.formats.registry import reader_class, writer_class


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_has_a_writer_and_a_reader(name: str) -> None:
    writer, reader = writer_class(name), reader_class(name)
    assert issubclass(writer, ShardWriter) and issubclass(reader, ShardReader)
    assert writer.format_name == name and writer.format_version >= 1


def test_an_unknown_format_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown format 'zip'") as info:
        writer_class("zip")
    assert all(name in (info.value.fix or "") for name in FORMATS)
