"""An augmentation pipeline kept as a string in a TOML file is the pipeline ``A.parse`` builds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardkit import augment as A
from shardkit.errors import ConfigError

SPEC = "scale=0.5:2,crop=64x96,hflip,rotate=10,jitter=0.2"


def test_from_toml_is_the_parsed_string_and_draws_the_same(tmp_path: Path) -> None:
    cfg = tmp_path / "train.toml"
    cfg.write_text(f'augment = "{SPEC}"\n[train]\nepochs = 3\naugment = "hflip"\n', encoding="utf-8")
    aug = A.from_toml(cfg)
    assert aug == A.parse(SPEC)
    a = aug.params(7, seed=3, epoch=2, hw=(120, 160))
    b = A.parse(SPEC).params(7, seed=3, epoch=2, hw=(120, 160))
    assert a == b and np.array_equal(a.matrix, b.matrix)
    assert A.from_toml(cfg, key="train.augment") == A.parse("hflip")


@pytest.mark.parametrize(("text", "key", "words"), [
    ('augment = "scale=0.5:2,', "augment", "not valid TOML"),
    ("epochs = 3\n", "augment", "no 'augment'"),
    ("[train]\nepochs = 3\n", "train.augment", "under [train]"),
    ("augment = 3\n", "augment", "is a int, not a pipeline string"),
    ('augment = "spin=3"\n', "augment", "augment: "),
])
def test_from_toml_problems_are_one_config_error_naming_the_file(tmp_path: Path, text: str, key: str,
                                                                  words: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        A.from_toml(cfg, key=key)
    message = str(info.value)
    assert message.startswith(str(cfg)) and words in message and "\n" not in message


def test_from_toml_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the augmentation config"):
        A.from_toml(tmp_path / "nope.toml")
