"""The public top-level API: what ``import shardkit`` shows and how ``shardkit.open`` is called."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import shardkit
from shardkit.errors import ConfigError


def test_public_names_are_only_the_api() -> None:
    code = "import shardkit; print(' '.join(n for n in dir(shardkit) if not n.startswith('_')))"
    names = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert names == {"convert", "open"}  # a fresh import: no Any, TYPE_CHECKING, annotations or helper modules
    classes = ("ConvertConfig", "ConvertSummary", "Dataset", "EpochPlan", "OpenOptions")
    assert set(shardkit.__all__) == {*classes, "__version__", "convert", "open"}
    assert all(getattr(shardkit, n).__name__ == n for n in classes)


def test_open_takes_an_openoptions_or_its_fields_by_keyword() -> None:
    params = inspect.signature(shardkit.open).parameters
    names = [f.name for f in dataclasses.fields(shardkit.OpenOptions)]  # declared once: the keywords are its fields
    assert names == ["labels", "verify", "label_layout", "cache_dir", "cache_limit", "storage_options", "version",
                     "remote_reads"]
    assert list(params) == ["path", "options", *names]
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in names)
    assert all(params[n].default == getattr(shardkit.OpenOptions(), n) for n in names)


def test_open_with_options_equals_open_with_keywords(camvid_val_npy: Path) -> None:
    by_keywords = shardkit.open(camvid_val_npy, labels="onehot", label_layout="channels_first")
    by_options = shardkit.open(camvid_val_npy, shardkit.OpenOptions(labels="onehot", label_layout="channels_first"))
    assert by_options.options == by_keywords.options
    assert by_options.batch([0, 5])[1].shape == by_keywords.batch([0, 5])[1].shape == (2, 11, 360, 480)
    with pytest.raises(ConfigError, match="not both"):
        shardkit.open(camvid_val_npy, shardkit.OpenOptions(), labels="onehot")


def test_open_refuses_an_unknown_option(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError):
        shardkit.open(tmp_path, label="ids")  # type: ignore[call-arg]


@pytest.mark.parametrize(("variant", "labels"), [("npy-fixed", "ids"), ("npy-variable", "onehot"),
                                               ("lmdb", "ids"), ("lmdb", "float_onehot")])
def test_reading_imports_no_image_decoder(variant: str, labels: str) -> None:
    """The numpy core reader (open, index, batch) loads neither OpenCV nor PIL nor libspng, whatever the stored
    label encoding (index, packed, one-hot) and the label output."""
    golden = Path(__file__).resolve().parents[1] / "formats" / "golden" / variant / "train"
    code = ("import sys, shardkit; ds = shardkit.open(sys.argv[1], labels=sys.argv[2]); ds[0]; "
            "ds.batch([0]) if ds.spec.size else None; "
            "print(' '.join(m for m in ('cv2', 'PIL', 'pyspng') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(golden), labels], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == [], f"the reader imported {out.stdout.strip()}"


def test_convert_takes_the_clis_strings_and_returns_the_summary(tmp_path: Path) -> None:
    from shardkit.demo import make_demo

    raw = make_demo(tmp_path / "raw", train=3, val=1, size=(48, 64))
    summary = shardkit.convert(raw, tmp_path / "out", size="32x40", shard_size="2", splits="train", workers="1",
                               quiet=True)
    assert isinstance(summary, shardkit.ConvertSummary)
    assert (summary.samples, summary.shards) == (3, 2)
    ds = shardkit.open(tmp_path / "out" / "train")
    assert ds[0][0].shape == (32, 40, 3)
    assert not (tmp_path / "out" / "val").exists()


def test_convert_accepts_a_config_and_refuses_bad_options(tmp_path: Path) -> None:
    cfg = shardkit.ConvertConfig(tmp_path / "raw", tmp_path / "out")
    with pytest.raises(ConfigError, match="no other arguments"):
        shardkit.convert(cfg, size="32x40")
    with pytest.raises(ConfigError, match="sise"):
        shardkit.convert(tmp_path / "raw", tmp_path / "out", sise="32x40")
    with pytest.raises(ConfigError, match="HEIGHTxWIDTH"):
        shardkit.convert(tmp_path / "raw", tmp_path / "out", size="32 by 40")
