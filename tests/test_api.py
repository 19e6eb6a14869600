"""The public top-level API: what ``import shardkit`` shows and how ``shardkit.open`` is called."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import shardkit


def test_public_names_are_only_the_api() -> None:
    code = "import shardkit; print(' '.join(n for n in dir(shardkit) if not n.startswith('_')))"
    names = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert names - {"annotations"} == {"open"}  # a fresh import: no Any, TYPE_CHECKING or helper modules
    assert set(shardkit.__all__) == {"Dataset", "__version__", "open"}
    assert shardkit.Dataset.__name__ == "Dataset"


def test_open_takes_its_options_by_keyword_and_names_them() -> None:
    params = inspect.signature(shardkit.open).parameters
    names = ["labels", "verify", "label_layout", "cache_dir", "cache_limit", "storage_options"]
    assert list(params) == ["path", *names]
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in names)


def test_open_refuses_an_unknown_option(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError):
        shardkit.open(tmp_path, label="ids")  # type: ignore[call-arg]
