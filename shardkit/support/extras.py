"""What to install for an optional feature: the packages of one of shardkit's extras, as ``pip install`` takes them.

The names come from the installed package's metadata (pyproject.toml's ``optional-dependencies``), so the
line works whether shardkit came from a checkout or a wheel: ``pip install "shardkit[codecs]"`` would not (there
is no such package on the index).
"""

from __future__ import annotations

import re


def install_hint(extra: str) -> str:
    """``pip install "zstandard>=0.22" "lz4>=4.3" "hdf5plugin>=4.4" (shardkit's [codecs] extra)``."""
    from importlib import metadata  # ~40 ms (it brings email.*): only when a hint is worded, not at every import

    try:
        requires = metadata.requires("shardkit") or []
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        requires = []
    wanted = []
    for requirement in requires:
        spec, _, marker = (part.strip() for part in requirement.partition(";"))
        only_extra = re.fullmatch(r"""extra\s*==\s*["']([\w.-]+)["']""", marker)
        if only_extra and only_extra.group(1) == extra:
            wanted.append(spec.replace(" ", ""))
    if not wanted:
        return f'pip install -e ".[{extra}]" in a shardkit checkout'
    return "pip install " + " ".join(f'"{w}"' for w in wanted) + f" (shardkit's [{extra}] extra)"
