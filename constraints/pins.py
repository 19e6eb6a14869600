"""Pin every package the test and docs install needs, so that pip resolves it without backtracking.

    python constraints/pins.py              # rewrites constraints/dev.txt from this environment
    python constraints/pins.py --check      # exit 1, naming them, if a needed package is not pinned

The packages are shardkit's own requirements plus its ``dev`` and ``docs`` extras (read from
``pyproject.toml``), followed through the installed packages' own requirements (``Requires-Dist``, markers
evaluated for this interpreter and the extras asked for) until nothing new turns up. Each is pinned to the
installed version (a local label such as ``+cpu`` is dropped, so ``torch==2.13.0`` takes the local CPU wheel
where one lies in ``--find-links`` and the plain wheel elsewhere). A package left unpinned lets pip try every
release of it and of everything that depends on it: that is how ``pip install -e ".[dev]"`` came to backtrack
through 60 aiobotocore and 57 moto releases for 24 minutes.

Users' extras stay loose in ``pyproject.toml``; only the tests' and docs' environment is pinned here.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
CONSTRAINTS = ROOT / "constraints" / "dev.txt"
EXTRAS = ("dev", "docs")
# installers, as `pip freeze` leaves them out: a venv brings its own, and pinning them would downgrade pip or
# setuptools in an environment that has newer ones (they depend on nothing, so leaving them free costs no search)
TOOLING = frozenset({"pip", "setuptools", "wheel", "distribute"})
HEADER = """\
# Every package the test and docs install needs, pinned (written by `python constraints/pins.py` from a
# working environment; Python 3.11, Linux x86-64). README's second command names this file:
#   pip install -c constraints/dev.txt -e ".[dev]" && python -m pytest
# With every package pinned pip has nothing to search, so it resolves in seconds (unpinned, pip 23.2 backtracked
# for over 24 minutes). torch==2.13.0 takes the local CPU wheel where one lies in pip's find-links.
# tests/test_packaging.py checks that nothing the dev and docs extras need is missing here.
"""


def project_requirements(extras: tuple[str, ...] = EXTRAS) -> list[Requirement]:
    """shardkit's dependencies plus those of ``extras``, as pyproject.toml declares them."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    project = tomllib.loads(PYPROJECT.read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return [r for r in reqs if canonicalize_name(r.name) != "shardkit"]


def _applies(req: Requirement, extras: set[str]) -> bool:
    """Whether a requirement's marker holds here, for a parent installed with ``extras``."""
    if req.marker is None:
        return True
    env = default_environment()
    return any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""}))


def closure(roots: list[Requirement]) -> tuple[dict[str, str], list[str]]:
    """{canonical name: installed version} of every package ``roots`` need here, and the names not installed."""
    found: dict[str, str] = {}
    missing: list[str] = []
    todo: list[tuple[Requirement, set[str]]] = [(r, set()) for r in roots]
    seen_extras: dict[str, set[str]] = {}
    while todo:
        req, parent_extras = todo.pop()
        if not _applies(req, parent_extras):
            continue
        name = canonicalize_name(req.name)
        if name in TOOLING:
            continue
        wanted = set(req.extras)
        if name in found and wanted <= seen_extras.get(name, set()):
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if name not in missing:
                missing.append(name)
            continue
        found[name] = dist.version
        seen_extras[name] = seen_extras.get(name, set()) | wanted
        todo += [(Requirement(r), seen_extras[name]) for r in dist.requires or []]
    return found, missing


def public_version(version: str) -> str:
    """``2.13.0+cpu`` → ``2.13.0``: the pin then matches the local wheel and the index's one alike."""
    return version.split("+", 1)[0]


def read_pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    """{canonical name: version} of the ``name==version`` lines of a constraints file."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = re.fullmatch(r"\s*([A-Za-z0-9._-]+)==([^\s;#]+)\s*(#.*)?", line)
        if m:
            pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


def problems(pins: dict[str, str], roots: list[Requirement]) -> list[str]:
    """What would let pip search: a package ``roots`` need that ``pins`` leave free, or a pin the project's
    own requirement refuses (pip would then fail outright)."""
    out = []
    needed, missing = closure(roots)
    for name in sorted(set(needed) | set(missing)):
        if name not in pins:
            out.append(f"{name} is needed by the dev/docs install but not pinned in {CONSTRAINTS.name}")
    for req in roots:
        pin = pins.get(canonicalize_name(req.name))
        if pin is not None and req.specifier and not req.specifier.contains(pin, prereleases=True):
            out.append(f"{req.name}=={pin} is pinned but pyproject.toml asks {req}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="check constraints/dev.txt instead of writing it")
    args = parser.parse_args(argv)
    roots = project_requirements()
    if args.check:
        found = problems(read_pins(), roots)
        for p in found:
            print(p, file=sys.stderr)  # noqa: T201
        return 1 if found else 0
    needed, missing = closure(roots)
    if missing:
        print(f"not installed here, cannot pin: {', '.join(missing)}", file=sys.stderr)  # noqa: T201
        return 1
    lines = [f"{name}=={public_version(v)}" for name, v in sorted(needed.items())]
    CONSTRAINTS.write_text(HEADER + "\n".join(lines) + "\n")
    print(f"{len(lines)} pins written to {CONSTRAINTS}", file=sys.stderr)  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
