"""The suite is hermetic: a ``SHARDKIT_*`` variable in the caller's environment changes no test's outcome (#43).
Run this file with one set (``SHARDKIT_BOGUS=1 python -m pytest tests/test_hermetic.py``) to see it hold."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.cli import main
from tests.conftest import TEST_DATA_ENV, remove_callers_variables


def test_no_variable_of_the_caller_reaches_a_test() -> None:
    assert [n for n in os.environ if n.startswith("SHARDKIT_") and n != TEST_DATA_ENV] == []


def test_the_callers_variables_are_removed_and_put_back_but_the_data_path_is_kept(tmp_path: Path) -> None:
    convert_missing = ["convert", str(tmp_path / "missing"), str(tmp_path / "out")]
    with pytest.MonkeyPatch.context() as caller:  # what a caller's shell could hold
        for name, value in {"SHARDKIT_BOGUS": "1", "SHARDKIT_FORMAT": "tfrecord", TEST_DATA_ENV: str(tmp_path)}.items():
            caller.setenv(name, value)
        res = CliRunner().invoke(main, convert_missing)
        assert "SHARDKIT_BOGUS is not a shardkit setting" in res.output  # what made one-line-error tests fail
        with pytest.MonkeyPatch.context() as suite:
            remove_callers_variables(suite)
            assert "SHARDKIT_BOGUS" not in os.environ and "SHARDKIT_FORMAT" not in os.environ
            assert os.environ[TEST_DATA_ENV] == str(tmp_path)
            res = CliRunner().invoke(main, convert_missing)
            assert res.exit_code != 0 and "is not a shardkit setting" not in res.output
            assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1, res.output
        assert os.environ["SHARDKIT_BOGUS"] == "1" and os.environ["SHARDKIT_FORMAT"] == "tfrecord"  # put back
