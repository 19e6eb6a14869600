"""What changed between two kept versions of a split: samples added, removed and changed (``shardkit diff``).

Samples are matched by key (the image path relative to the input root); a sample whose fingerprint (a
hash of its source files and of the settings that determine its stored bytes) differs between the two
versions is *changed*. Only manifests and samples sidecars are read, never shard data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputNotFoundError
from .store.manifest import Manifest
from .store.source import open_bytes


@dataclass
class SplitDiff:
    """The difference between versions ``old`` and ``new`` of one split; fingerprints as 64 hex digits."""

    split: str
    old: int
    new: int
    added: list[tuple[str, str]] = field(default_factory=list)  # (key, fingerprint)
    removed: list[tuple[str, str]] = field(default_factory=list)
    changed: list[tuple[str, str, str]] = field(default_factory=list)  # (key, old fingerprint, new fingerprint)
    unchanged: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "split": self.split, "from": self.old, "to": self.new, "unchanged": self.unchanged,
            "added": [{"key": k, "fingerprint": f} for k, f in self.added],
            "removed": [{"key": k, "fingerprint": f} for k, f in self.removed],
            "changed": [{"key": k, "from": a, "to": b} for k, a, b in self.changed],
        }

    def lines(self) -> Iterator[str]:
        """The text report: a summary line, then ``+``/``-``/``~`` lines with the first 12 hex of fingerprints."""
        yield (f"{self.split}: version {self.old} → {self.new}: {len(self.added)} added, {len(self.removed)} "
               f"removed, {len(self.changed)} changed, {self.unchanged} unchanged")
        for key, fp in self.added:
            yield f"  + {key}  {fp[:12]}"
        for key, fp in self.removed:
            yield f"  - {key}  {fp[:12]}"
        for key, a, b in self.changed:
            yield f"  ~ {key}  {a[:12]} → {b[:12]}"


def split_versions(location: str | Path, storage_options: dict[str, Any] | None = None) -> tuple[list[int], int]:
    """(the kept version numbers, the current one) of a split folder or split URL; current 0 when the split
    was written before versions existed."""
    with open_bytes(location, storage_options=storage_options, lease=False) as source:
        return source.kept_versions(), source.manifest.version or 0


def _fingerprints(manifest: Manifest) -> dict[str, str]:
    return {str(r["key"]): str(r["fingerprint"]) for r in manifest.samples}


def diff_split(location: str | Path, old: int | None = None, new: int | None = None, *,
               storage_options: dict[str, Any] | None = None) -> SplitDiff:
    """Compare versions ``old`` and ``new`` of one split (``new`` defaults to the current version, ``old`` to
    the kept version just before ``new``)."""
    kept, current = split_versions(location, storage_options)
    new = current if new is None else new
    if not new:
        raise InputNotFoundError("this split has no versions (written before shardkit kept them)",
                                 path=location, fix="re-run convert once; later publishes can then be compared")
    if old is None:
        older = [v for v in kept if v < new]
        if not older:
            raise InputNotFoundError(f"no kept version before version {new}", path=location,
                                     fix="pass --from with one of the kept versions: "
                                         + (", ".join(map(str, kept)) or "none"))
        old = older[-1]
    for v in (old, new):
        if v not in kept:
            raise InputNotFoundError(f"version {v} is not kept (kept: {', '.join(map(str, kept)) or 'none'})",
                                     path=location, fix="choose kept versions; convert --keep-versions N keeps more")
    with (open_bytes(location, old, storage_options=storage_options) as a,
          open_bytes(location, new, storage_options=storage_options) as b):  # each version's sidecars, leased
        before, after = _fingerprints(a.manifest), _fingerprints(b.manifest)
    out = SplitDiff(Path(str(location)).name, old, new)
    for key, fp in after.items():
        if key not in before:
            out.added.append((key, fp))
        elif before[key] != fp:
            out.changed.append((key, before[key], fp))
        else:
            out.unchanged += 1
    out.removed = [(key, fp) for key, fp in before.items() if key not in after]
    return out
