"""``python -m shardkit`` and the ``shardkit`` console script (shardkit/__main__.py): a bare ``--version`` is
answered before click and the commands are imported, in the words click's version option uses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import shardkit
from shardkit.cli import main

ROOT = Path(shardkit.__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)


def test_version_says_what_click_says_without_importing_click() -> None:
    res = _python("import sys\nsys.argv = ['shardkit', '--version']\nfrom shardkit.__main__ import run\nrun()\n"
                  "print(sorted(m for m in sys.modules if m.split('.')[0] == 'click' or m == 'shardkit.cli'))")
    version, loaded = res.stdout.splitlines()
    assert version == CliRunner().invoke(main, ["--version"]).output.strip()
    assert loaded == "[]"


def test_anything_else_goes_to_the_click_command() -> None:
    res = _python("import sys\nsys.argv = ['shardkit', 'info', '--help']\nfrom shardkit.__main__ import run\n"
                  "try:\n    run()\nexcept SystemExit as e:\n    print('exit', e.code)")
    assert "Summarise a converted split" in res.stdout and res.stdout.strip().endswith("exit 0")


def test_the_console_script_is_the_fast_entry_point() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'shardkit = "shardkit.__main__:run"' in text
