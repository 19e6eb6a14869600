"""Augmentation bounds (issue 24, defect 8): every parameter range-checked at construction with a one-line
ConfigError, the output size bounded for every drawn sample, and the TOML read like ``--config``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from shardkit import augment as A
from shardkit.augment import ops
from shardkit.errors import ConfigError


def one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.mark.parametrize(("text", "says"), [
    ("scale=50:50", "scale lo must be a finite number in [0, 16.0]"),
    ("scale=0.5:1e308", "scale hi"),
    ("cutout=10000000:1x1", "cutout holes must be a count in [0, 1024]"),
    ("cutout=2:100000x1", "cutout hole size"),
    ("crop=100000x100000", "crop height must be an integer in [1, 16384]"),
    ("crop=16384x16384", "crop 16384x16384 would be 16384x16384 pixels"),
    ("rotate=1e308", "rotate degrees must be a finite number in [0, 360.0]"),
    ("rotate=inf", "rotate"),
    ("jitter=1e308", "brightness must be a finite number in [0, 10.0]"),
    ("crop=１０x１０", "expected HxW"),
    ("scale=０.５:2", "scale lo must be a number"),
    ("cutout=１:8x8", "hole count"),
    ("hflip=2", "flip probability must be a finite number in [0, 1]"),
    ("crop=64x64:5", "cat_max_ratio must be a finite number in [0, 1]"),
    ("hflip," * 1000 + "hflip", "characters, more than 4096"),
])
def test_every_string_parameter_is_bounded(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        A.parse(text)
    assert says in one_line(e)


@pytest.mark.parametrize(("make", "says"), [
    (lambda: A.OneHot(10**9), "OneHot num_classes must be an integer in [1, 65536]"),
    (lambda: A.OneHot(True), "OneHot num_classes"),
    (lambda: A.Normalize((0, 0, 0), (1e-45, 1, 1)), "3 stds in [0.001"),
    (lambda: A.Normalize((1e300, 0, 0), (1, 1, 1)), "3 means in"),
    (lambda: A.Normalize("abc", (1, 1, 1)), "Normalize needs"),
    (lambda: A.RandomCrop(True, 5), "crop height must be an integer"),
    (lambda: A.RandomCrop(5, 2.5), "crop width must be an integer"),
    (lambda: A.RandomCrop(10**30, 5), "crop height"),
    (lambda: A.RandomScale(1, float("nan")), "scale hi"),
    (lambda: A.RandomRotate(True), "rotate degrees must be a number"),
    (lambda: A.Cutout(10**30, 4, 4), "cutout holes"),
    (lambda: A.Cutout((0, 2), 4, True), "cutout hole size"),
    (lambda: A.ColorJitter(hue=0.6), "hue must be a finite number in [0, 0.5]"),
    (lambda: A.Compose([A.RandomCrop(4096, 4096), A.OneHot(200)]), "4096x4096 pixels x 200 values"),
])
def test_every_constructor_parameter_is_bounded(make: Callable[[], object], says: str) -> None:
    with pytest.raises(ConfigError) as e:
        make()
    assert says in one_line(e)


def test_the_bounds_keep_ordinary_pipelines() -> None:
    aug = A.parse("scale=0.5:2,crop=512x1024,hflip,rotate=10,jitter=0.2,cutout=0-3:48x48:128:ignore")
    assert aug.out_hw == (512, 1024)
    assert A.Normalize((123.7, 116.3, 103.5), (58.4, 57.1, 57.4)).std == (58.4, 57.1, 57.4)
    assert A.OneHot(150).num_classes == 150 and A.RandomCrop(np.int64(8), 8.0).h == 8


def test_an_output_past_the_bound_is_refused_when_drawn_not_allocated() -> None:
    """Without a crop the output follows the input: scale 16 of a 4096 x 4096 sample would be 65536^2."""
    aug = A.parse("scale=16:16")
    assert aug.params(0, hw=(64, 64)).out_hw == (1024, 1024)
    with pytest.raises(ConfigError) as e:
        aug.params(3, hw=(4096, 4096))
    assert "augmented sample 3 (input 4096x4096) would be 65536x65536 pixels" in one_line(e)
    images = np.zeros((1, 4096, 4096, 3), np.uint8)
    with pytest.raises(ConfigError):
        aug(images, np.zeros((1, 4096, 4096), np.uint8), [0])


def test_normalize_never_gives_inf() -> None:
    norm = A.Normalize((0, 0, 0), (ops.MIN_STD,) * 3)
    out = norm.numpy(np.full((1, 2, 2, 3), 255, np.uint8))
    assert np.isfinite(out).all()


# --------------------------------------------------------------------------- from_toml


def test_from_toml_refuses_a_fifo_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "aug.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError) as e:  # before: blocked for ever opening it
        A.from_toml(fifo)
    assert "not a regular file" in one_line(e)


def test_from_toml_refuses_dev_zero_at_once() -> None:
    with pytest.raises(ConfigError) as e:  # before: read until memory ran out
        A.from_toml("/dev/zero")
    assert "not a regular file" in one_line(e)


def test_from_toml_refuses_a_file_over_the_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shardkit.support.smallfile.MAX_TEXT_BYTES", 100)
    big = tmp_path / "aug.toml"
    big.write_text('augment = "hflip"\n' + "# padding\n" * 20)
    with pytest.raises(ConfigError) as e:
        A.from_toml(big)
    assert "more than the 100" in one_line(e)


@pytest.mark.parametrize("nest", ["[", "{a="])
def test_a_100k_deep_toml_is_one_line(tmp_path: Path, nest: str) -> None:
    deep = tmp_path / "aug.toml"
    deep.write_text("augment = " + nest * 100_000)
    with pytest.raises(ConfigError) as e:  # before: RecursionError
        A.from_toml(deep)
    assert "not valid TOML" in one_line(e)


def test_config_flag_reads_a_deep_toml_as_one_line(tmp_path: Path) -> None:
    """--config shares the reader: a 100k-deep file is a usage error, not a RecursionError traceback."""
    import subprocess

    deep = tmp_path / "c.toml"
    deep.write_text("size = " + "[" * 100_000)
    proc = subprocess.run([sys.executable, "-m", "shardkit", "convert", "--config", str(deep), str(tmp_path),
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "nested too deeply" in proc.stderr
