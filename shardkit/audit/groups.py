"""Groups: the samples that must stay in one part of a split because they share a source.

A tile's group is its source image (every tile of a source carries the source's key), a volume slice's its case,
and a plain sample's group is given by a rule on its key: ``--group-by REGEX`` (given here, or recorded by
``convert --group-by``; the first capture group, else the whole match: CamVid's ``(\\w+?)_`` makes a driving
sequence one group), a CSV of ``key,group`` rows (``--groups FILE``), or the sample itself (its key). A key the
rule does not cover is an error naming it, never a group of its own by accident.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, InputNotFoundError
from ..store.groups import compile_group_pattern, key_group, volume_case
from ..store.manifest import Manifest
from ..support.smallfile import read_guarded

if TYPE_CHECKING:
    from ..read.dataset import Dataset

#: bytes of a ``--groups`` CSV read at most
MAX_GROUPS_FILE = 256 << 20


@dataclass(frozen=True)
class GroupRule:
    """How a sample's key names its group: ``kind`` is ``"key"`` (the sample itself; tiles share their source's
    key), ``"regex"`` (``pattern``) or ``"csv"`` (``table``, from ``source``)."""

    kind: str = "key"
    pattern: str | None = None
    source: str | None = None
    table: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, group_by: str | None = None, groups: Path | None = None) -> GroupRule:
        """The rule of ``--group-by REGEX`` or ``--groups FILE`` (not both); the sample itself without either."""
        if group_by is not None and groups is not None:
            raise ConfigError("--group-by and --groups both name the groups", fix="pass one of them")
        if group_by is not None:
            compile_group_pattern(group_by)
            return cls("regex", pattern=group_by)
        if groups is not None:
            return cls("csv", source=str(groups), table=read_group_table(groups))
        return cls()

    def describe(self) -> str:
        if self.kind == "regex":
            return f"--group-by {self.pattern}"
        if self.kind == "csv":
            return f"--groups {self.source} ({len(self.table)} keys)"
        return "each sample its own group (tiles of one source together, slices of one volume case together)"

    def group(self, key: str) -> str:
        """The group of the sample called ``key``."""
        if self.kind == "regex":
            return key_group(compile_group_pattern(self.pattern or ""), key)
        if self.kind == "csv":
            try:
                return self.table[key]
            except KeyError:
                raise ConfigError(f"--groups {self.source} has no row for the key {key!r}",
                                  fix="add a 'key,group' row for every sample (keys as `shardkit info` lists "
                                      "them)") from None
        return key

    def groups(self, keys: Sequence[str]) -> list[str]:
        if self.kind == "regex":  # compiled once
            pattern = compile_group_pattern(self.pattern or "")
            return [key_group(pattern, k) for k in keys]
        return [self.group(k) for k in keys]

    def sample_groups(self, ds: Dataset | Manifest) -> tuple[list[str], list[str]]:
        """(keys, groups) of every sample of a split (its Dataset or manifest: only the sidecars are read). Without
        a rule: the rule the conversion recorded, else a volume split's slices take their case and tiles their
        source (their shared key)."""
        m = ds if isinstance(ds, Manifest) else ds.manifest
        keys = [k for pos in range(len(m.shards)) for k in m.samples.keys(pos)]
        if self.kind == "key":
            recorded = recorded_rule(m)
            if recorded is not None:
                return keys, recorded.groups(keys)
            if m.source.extra.get("volumes") is not None:
                return keys, [volume_case(k) for k in keys]
        return keys, self.groups(keys)


def rule_for(rule: GroupRule, datasets: Sequence[Dataset]) -> GroupRule:
    """``rule``, or where it is the default, the rule the conversion recorded (the splits of one conversion share
    it): what a report should name."""
    if rule.kind == "key" and datasets:
        return recorded_rule(datasets[0].manifest) or rule
    return rule


def recorded_rule(m: Manifest) -> GroupRule | None:
    """The ``--group-by`` rule the conversion recorded in the split's manifest (``source.groups``), if any."""
    got = m.source.extra.get("groups")
    pattern = got.get("group_by") if isinstance(got, dict) else None
    return GroupRule("regex", pattern=pattern) if isinstance(pattern, str) else None


def read_group_table(path: Path) -> dict[str, str]:
    """``key,group`` rows of a CSV (a header row naming ``key`` and ``group`` columns is used when present;
    otherwise the first two columns); a key given two different groups is refused naming both."""
    try:
        text = read_guarded(path, "groups file", limit=MAX_GROUPS_FILE).decode("utf-8")
    except FileNotFoundError:
        raise InputNotFoundError("groups file does not exist", path=path,
                                 fix="pass --groups with a CSV of key,group rows") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text", fix="save the groups file as UTF-8 CSV") from None
    rows = [r for r in csv.reader(io.StringIO(text)) if r and any(c.strip() for c in r)]
    if not rows:
        raise ConfigError(f"{path}: no rows", fix="write one 'key,group' row per sample")
    head = [c.strip().lower() for c in rows[0]]
    k, g = (head.index("key"), head.index("group")) if "key" in head and "group" in head else (0, 1)
    body = rows[1:] if "key" in head and "group" in head else rows
    table: dict[str, str] = {}
    for number, row in enumerate(body, start=2 if body is not rows else 1):
        if len(row) <= max(k, g) or not row[k].strip() or not row[g].strip():
            raise ConfigError(f"{path}: row {number} has no key and group: {','.join(row)[:80]!r}",
                              fix="write 'key,group' on every row")
        key, group = row[k].strip(), row[g].strip()
        if table.setdefault(key, group) != group:
            raise ConfigError(f"{path}: key {key!r} is in group {table[key]!r} and {group!r}",
                              fix="give every key one group")
    return table
