"""ConvertConfig: the CLI's spellings accepted from Python, every contradiction a ConfigError, frozen options."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardkit.conversion.config import ConvertConfig, ShardSize, parse_size
from shardkit.errors import ConfigError


def cfg(**options: object) -> ConvertConfig:
    return ConvertConfig(Path("raw"), Path("out"), **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "hw"), [("352x480", (352, 480)), (" 4 X 6 ", (4, 6)), ("7,9", (7, 9)),
                                          ("2×3", (2, 3)), (None, None), ("", None)])
def test_parse_size_reads_height_by_width(text: str | None, hw: tuple[int, int] | None) -> None:
    assert parse_size(text) == hw


@pytest.mark.parametrize("text", ["352", "0x480", "352x", "a x b", "-1x4", "3.5x4"])
def test_parse_size_refuses_anything_else_with_a_fix(text: str) -> None:
    with pytest.raises(ConfigError, match="HEIGHTxWIDTH") as info:
        parse_size(text)
    assert info.value.fix and "352x480" in info.value.fix


@pytest.mark.parametrize(("text", "want"), [("500", ShardSize(samples=500)), (12, ShardSize(samples=12)),
                                            ("256MB", ShardSize(nbytes=256_000_000)),
                                            ("1GiB", ShardSize(nbytes=2**30)), ("1.5kB", ShardSize(nbytes=1500))])
def test_shard_size_is_a_sample_count_or_bytes(text: str | int, want: ShardSize) -> None:
    assert ShardSize.parse(text) == want


@pytest.mark.parametrize("text", ["0", "-3", "many", "12 apples", "1e999MB", 0])
def test_shard_size_refuses_nonsense(text: str | int) -> None:
    with pytest.raises(ConfigError):
        ShardSize.parse(text)


def test_python_callers_may_use_the_clis_strings() -> None:
    c = cfg(size="352x480", shard_size="256MB", splits="train, val", class_dict="raw/classes.csv",
            num_classes="12", ignore_index="255", workers="3", max_pixels="1000000")
    assert c.size == (352, 480)
    assert c.shard_size == ShardSize(nbytes=256_000_000)
    assert c.splits == ("train", "val")
    assert c.class_dict == Path("raw/classes.csv")
    assert (c.num_classes, c.ignore_index, c.workers, c.max_pixels) == (12, 255, 3, 1_000_000)
    assert cfg(size=[4, 6], splits=["a"]).size == (4, 6)
    assert cfg(shard_size=7).shard_size == ShardSize(samples=7)


@pytest.mark.parametrize("options", [{"size": "big"}, {"size": (4,)}, {"size": (0, 4)}, {"size": (4.5, 6)},
                                     {"size": 3}, {"shard_size": 2.5}, {"shard_size": "lots"},
                                     {"num_classes": "twelve"}, {"format": "zip"}, {"resize": "exact"},
                                     {"crop": "left"}, {"label_encoding": "rle"}, {"on_error": "retry"},
                                     {"scheduler": "tcp://x:1"}, {"class_dict": "a.csv", "palette": "b.json"},
                                     {"colour_tolerance": 256}, {"workers": -1}, {"max_pixels": 0},
                                     {"size": "400x400", "max_pixels": 1000},
                                     {"format": "npy", "compression": "gzip"},
                                     {"format": "tfrecord", "compression": "lzf"}])
def test_every_bad_option_is_a_config_error(options: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        cfg(**options)


def test_object_storage_urls_are_kept_as_urls_and_file_urls_become_paths() -> None:
    c = ConvertConfig("s3://bucket/raw", "file:///tmp/out")  # type: ignore[arg-type]
    assert c.input_url == "s3://bucket/raw" and c.output_url is None and c.output == Path("/tmp/out")


def test_preprocessing_holds_what_changes_stored_bytes_only() -> None:
    base = cfg(size="8x8")
    assert base.preprocessing()["size"] == [8, 8]
    for change in ({"size": (8, 9)}, {"crop": "none"}, {"label_encoding": "onehot"}, {"ignore_index": 3},
                   {"colour_tolerance": 2}, {"unknown_as": 1}):
        assert base.replace(**change).preprocessing() != base.preprocessing(), change
    for same in ({"workers": 3}, {"quiet": True}, {"force": True}, {"shard_size": ShardSize(samples=2)}):
        assert base.replace(**same).preprocessing() == base.preprocessing(), same


def test_config_is_frozen_and_replace_validates_again() -> None:
    c = cfg()
    with pytest.raises(AttributeError):
        c.size = (1, 1)  # type: ignore[misc]
    assert c.replace(size="2x3").size == (2, 3)
    with pytest.raises(ConfigError):
        c.replace(resize="shorter")


def test_workers_zero_means_every_usable_core() -> None:
    assert cfg(workers=0).effective_workers() >= 1
    assert cfg(workers=5).effective_workers() == 5
