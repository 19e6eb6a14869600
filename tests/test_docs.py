"""The documentation says what the code does: the augmentation grammar page's tables against parse()."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shardkit import augment as A
from shardkit.augment.ops import PARSE_KEYS
from shardkit.errors import ConfigError

PAGE = (Path(__file__).resolve().parents[1] / "docs" / "augment-grammar.md").read_text()


def _rows(section: str) -> list[list[str]]:
    body = PAGE.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in body.splitlines()
            if ln.startswith("| `")]


def test_grammar_table_lists_every_item_parse_knows() -> None:
    items = {row[0].strip("`") for row in _rows("Grammar")}
    assert items == set(PARSE_KEYS)


@pytest.mark.parametrize("row", _rows("Grammar"), ids=lambda r: r[1])
def test_each_documented_form_builds_the_documented_op(row: list[str]) -> None:
    example = {"scale=LO:HI": "scale=0.5:2", "crop=HxW": "crop=64x96", "crop=HxW:R": "crop=64x96:0.75",
               "hflip": "hflip", "hflip=P": "hflip=0.3", "rotate=DEG": "rotate=10", "jitter=V": "jitter=0.2",
               "jitter=B:C[:S[:H]]": "jitter=0.2:0.1:0.3:0.05", "gamma=LO:HI": "gamma=0.8:1.2",
               "cutout=N:HxW[:FILL][:ignore]": "cutout=1-3:8x8:128:ignore"}
    op_name = row[2].strip("`").split("(")[0]
    for form in re.findall(r"`([^`]+)`", row[1]):
        (op,) = A.parse(example[form]).ops
        assert type(op).__name__ == op_name, (form, op)


@pytest.mark.parametrize("row", _rows("Errors"), ids=lambda r: r[0])
def test_each_documented_error_message_is_the_one_raised(row: list[str]) -> None:
    text = "" if "(empty)" in row[0] else row[0].strip("`")
    with pytest.raises(ConfigError) as err:
        A.parse(text)
    assert str(err.value).startswith(row[1].strip("`"))
