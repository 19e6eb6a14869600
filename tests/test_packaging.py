"""Packaging and installation: the dev install is fully pinned (so pip cannot backtrack), the version lives in one
place, the extras and every documented ``pip install`` line name what exists."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import shardkit
from shardkit.support.tomlcompat import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def pins_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pins", ROOT / "constraints" / "pins.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_constraints_pin_every_package_the_dev_and_docs_install_needs() -> None:
    """README's second command resolves at once only if nothing it needs is left free: every requirement of
    shardkit, of its dev and docs extras, and of what those need in turn (as installed here) has a ``==`` pin,
    and each pin satisfies pyproject's own requirement."""
    pins = pins_module()
    table = pins.read_pins()
    assert len(table) > 100 and table["torch"] == "2.13.0"
    assert pins.problems(table, pins.project_requirements()) == []


def test_a_missing_pin_is_caught() -> None:
    pins = pins_module()
    table = pins.read_pins()
    del table["aiobotocore"]  # what let pip try 60 releases of it
    table["numpy"] = "1.26.4"  # below pyproject's numpy>=2.0
    found = pins.problems(table, pins.project_requirements())
    assert any(p.startswith("aiobotocore is needed") for p in found), found
    assert any(p.startswith("numpy==1.26.4 is pinned but pyproject.toml asks numpy>=2.0") for p in found), found


def test_readme_and_ci_run_the_same_pinned_command() -> None:
    command = 'pip install -c constraints/dev.txt -e ".[dev]" && python -m pytest'
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"\n{command}\n" in readme
    assert f"\n{command}\n" in ci and "PIP_CONSTRAINT" not in ci


def test_version_is_written_in_one_place() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "shardkit._version.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", shardkit.__version__)
    assert (ROOT / "shardkit" / "py.typed").is_file() and "py.typed" in PYPROJECT["tool"]["setuptools"][
        "package-data"]["shardkit"]
    assert project["license"] == "Apache-2.0" and (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert any(c.startswith("Programming Language :: Python :: 3.1") for c in project["classifiers"])


def test_keras_extra_brings_a_backend() -> None:
    keras = PYPROJECT["project"]["optional-dependencies"]["keras"]
    assert any(r.startswith("keras") for r in keras) and any(r.startswith("tensorflow") for r in keras)


def test_every_documented_install_line_names_an_existing_extra() -> None:
    """No ``pip install "shardkit[...]"`` (there is no such package on the index); every ``.[extra]`` exists."""
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "formats").glob("*.md"))]
    lines = [(p.name, ln) for p in docs for ln in p.read_text().splitlines() if "pip install" in ln]
    assert len(lines) > 10
    for name, line in lines:
        assert not re.search(r"pip install [\"']?shardkit\[", line), (name, line)
        for group in re.findall(r"\.\[([a-z,]+)\]", line):
            assert set(group.split(",")) <= extras, (name, line)


def test_project_urls_are_declared() -> None:
    """The index page's links (#27). The project has no public home yet: the URLs are placeholders on the reserved
    ``.invalid`` domain, never a guessed address someone else could own; replace them before the first upload."""
    urls = PYPROJECT["project"]["urls"]
    assert set(urls) == {"Homepage", "Documentation", "Changelog", "Issues"}
    assert all(re.fullmatch(r"https://[a-z0-9.-]+/\S*", url) for url in urls.values()), urls
    assert urls["Changelog"].endswith("/CHANGELOG.md") and (ROOT / "CHANGELOG.md").is_file()
