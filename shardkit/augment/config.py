"""An augmentation pipeline kept in a TOML file, as its string form: ``augment = "scale=0.5:2,crop=512x1024,hflip"``.

The string is the one :func:`~shardkit.augment.parse` reads (and ``shardkit show --augment`` takes), so a
training config, the CLI and Python name the same pipeline, and the same seed gives the same batches
from each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..support.tomlcompat import load_small_toml
from .ops import Compose, parse


def from_toml(path: str | Path, key: str = "augment") -> Compose:
    """The pipeline written as a string at ``key`` of the TOML file ``path``.

    ``key`` may be dotted to reach into tables: ``"train.augment"`` reads ``[train] augment = "…"``.
    Any problem (missing file, bad TOML, no such key, not a string, a bad pipeline) is one ConfigError
    naming the file.
    """
    path = Path(path)
    try:  # read as --config is: a regular file of bounded size (a FIFO or /dev/zero refused at once)
        data: Any = load_small_toml(path, "augmentation config")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{exc.__class__.__name__}: {exc}"
        raise ConfigError(f"cannot read the augmentation config ({reason})", path=path,
                          fix="check the path: a regular TOML file") from None
    except ValueError as exc:  # tomllib.TOMLDecodeError, or nesting too deep
        first = (str(exc).splitlines() or [""])[0][:200]
        raise ConfigError(f"not valid TOML ({first})", path=path, fix="fix the file's syntax") from None
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            raise ConfigError(f"no {key!r} in the file", path=path,
                              fix=f'add e.g. {key.split(".")[-1]} = "scale=0.5:2,crop=512x1024,hflip"'
                              + (f" under [{key.rsplit('.', 1)[0]}]" if "." in key else ""))
        data = data[part]
    if not isinstance(data, str):
        raise ConfigError(f"{key!r} is a {type(data).__name__}, not a pipeline string", path=path,
                          fix='write it as a string, e.g. "scale=0.5:2,crop=512x1024,hflip"')
    try:
        return parse(data)
    except ConfigError as exc:
        raise ConfigError(f"{key}: {exc.problem}", path=path, fix=exc.fix) from None
