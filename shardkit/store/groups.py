"""A sample's group from its key: by a pattern (the rule ``convert --group-by`` records in each split's manifest,
``source.groups``, and ``shardkit split`` / ``audit`` apply, :mod:`shardkit.audit.groups`), or a volume slice's
case."""

from __future__ import annotations

import re

from ..errors import ConfigError

#: the fix of every refusal of a pattern
PATTERN_FIX = "e.g. --group-by '(\\w+?)_' for CamVid's sequence prefix (its first group names the group)"


def volume_case(key: str) -> str:
    """The volume case a slice's key names (keys ``<case>/<axis><index>``): a volume split's sample group."""
    return key.partition("/")[0]


def compile_group_pattern(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled, or a one-line ConfigError."""
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"--group-by {pattern!r} is not a regular expression ({exc})", fix=PATTERN_FIX) from None


def key_group(pattern: re.Pattern[str], key: str) -> str:
    """The group of the sample called ``key``: the pattern's first capture group found in it (``re.search``), else
    its whole match; a key it does not match, or an empty group, is a one-line ConfigError naming the key."""
    found = pattern.search(key)
    if found is None:
        raise ConfigError(f"--group-by {pattern.pattern!r} does not match the key {key!r}",
                          fix="write a pattern every key matches (its first group names the group)")
    value = found.group(1) if pattern.groups else found.group(0)
    if not value:
        raise ConfigError(f"--group-by {pattern.pattern!r} gives an empty group for the key {key!r}",
                          fix="write a pattern whose first group is never empty")
    return value
