"""``shardkit split``: train/val/test lists made from a converted dataset by group, stratified by class presence.

Every sample of the given splits is pooled; its group comes from a :class:`~shardkit.audit.groups.GroupRule`; the
groups are dealt to the parts by :func:`~shardkit.audit.stratify.stratify` over how many of each group's images
contain each class (the class bitmaps in the sidecars: no label is read). The result is one list file per part of
sample keys, one a line — what ``shardkit convert RAW OUT --split-list train=train.txt …`` takes — and a report of
each class's share of images per part. A group is never cut: keys, not samples, are listed, and the samples of one
key are one group's. :func:`leaks` finds the groups that existing splits share.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..read.dataset import Dataset
from ..store.publish import atomic_write_bytes
from .groups import GroupRule
from .stratify import stratify

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pooled:
    """Every sample of some splits: its split, key, group and class presence (None without bitmaps)."""

    splits: list[str]
    split_of: np.ndarray
    keys: list[str]
    groups: list[str]
    presence: np.ndarray | None
    class_names: list[str]
    #: (samples, 8) look hashes, None where a split keeps none (converted before the column)
    looks: np.ndarray | None = None
    unhashed: tuple[str, ...] = ()


def pool(datasets: Sequence[Dataset], rule: GroupRule) -> Pooled:
    """The samples of ``datasets`` (splits of one dataset: their class tables must agree) with their groups."""
    names = datasets[0].class_names
    for ds in datasets[1:]:
        if ds.class_names != names:
            raise ConfigError(f"splits {datasets[0].manifest.split} and {ds.manifest.split} have different class "
                              "tables", fix="split the splits of one conversion together")
    keys: list[str] = []
    groups: list[str] = []
    for ds in datasets:
        k, g = rule.sample_groups(ds)
        keys += k
        groups += g
    split_of = np.concatenate([np.full(len(ds), k) for k, ds in enumerate(datasets)]) if datasets else np.zeros(0)
    presences = [p for p in (ds.class_presence() for ds in datasets) if p is not None]
    presence = np.concatenate(presences) if len(presences) == len(datasets) else None
    looks = [ds.look_hashes() for ds in datasets]
    unhashed = tuple(ds.manifest.split for ds, x in zip(datasets, looks, strict=True) if x is None)
    known = np.concatenate([x for x in looks if x is not None]) if not unhashed and looks else None
    return Pooled([ds.manifest.split for ds in datasets], split_of, keys, groups, presence, names, known, unhashed)


def leaks(pooled: Pooled) -> dict[str, list[str]]:
    """Group → the splits it is in, for the groups found in more than one split."""
    where: dict[str, set[str]] = {}
    for g, s in zip(pooled.groups, pooled.split_of.tolist(), strict=True):
        where.setdefault(g, set()).add(pooled.splits[int(s)])
    return {g: sorted(s) for g, s in where.items() if len(s) > 1}


@dataclass(frozen=True)
class SplitPlan:
    """Each part's sample keys (unique, in the pooled order) and the report."""

    parts: dict[str, list[str]]
    report: dict[str, Any]

    def write(self, folder: Path) -> list[Path]:
        """``<part>.txt`` (a key a line) per part and ``split-report.json``, each written whole or not at all."""
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for part, keys in self.parts.items():
            path = folder / f"{part}.txt"
            atomic_write_bytes(path, "".join(f"{k}\n" for k in keys).encode())
            written.append(path)
        path = folder / "split-report.json"
        atomic_write_bytes(path, (json.dumps(self.report, indent=1) + "\n").encode())
        return [*written, path]

    def lines(self) -> list[str]:
        """The report as text: samples, groups and images per part, then each class's share per part."""
        r = self.report
        parts = list(self.parts)
        out = [f"groups: {r['rule']}; {r['groups']} groups of {r['samples']} samples; seed {r['seed']}"]
        out += [f"  {p}: {r['parts'][p]['samples']} samples ({r['parts'][p]['share']:.1%}), "
                f"{r['parts'][p]['groups']} groups" for p in parts]
        if r.get("classes"):
            width = max(len(c["name"]) for c in r["classes"])
            out.append(f"  {'class'.ljust(width)}  " + "  ".join(p.rjust(8) for p in parts) + "   images")
            for c in r["classes"]:
                out.append(f"  {c['name'].ljust(width)}  " + "  ".join(f"{c['share'][p]:8.1%}" for p in parts)
                           + f"   {c['images']}")
        for warning in r.get("warnings", []):
            out.append(f"warning: {warning}")
        return out


def plan_split(pooled: Pooled, ratios: dict[str, float], seed: int, rule: GroupRule) -> SplitPlan:
    """Deal the pooled groups to the parts of ``ratios`` (stratified), and report the result."""
    names = list(ratios)
    group_names = list(dict.fromkeys(pooled.groups))
    index = {g: k for k, g in enumerate(group_names)}
    member = np.array([index[g] for g in pooled.groups], np.int64)
    sizes = np.bincount(member, minlength=len(group_names))
    n_classes = len(pooled.class_names)
    counts = np.zeros((len(group_names), n_classes), np.int64)
    if pooled.presence is not None:
        np.add.at(counts, member, pooled.presence.astype(np.int64))
    else:
        log.warning("no class bitmaps (more than 256 classes): groups are dealt by size only")
    part_of_group = stratify(counts, sizes, [ratios[p] for p in names], seed)
    part_of = part_of_group[member]
    parts = {p: list(dict.fromkeys(k for k, q in zip(pooled.keys, part_of.tolist(), strict=True) if q == j))
             for j, p in enumerate(names)}
    total = len(pooled.keys)
    report: dict[str, Any] = {
        "rule": rule.describe(), "seed": int(seed), "samples": total, "groups": len(group_names),
        "ratios": ratios, "from_splits": pooled.splits,
        "parts": {p: {"samples": int((part_of == j).sum()), "share": float((part_of == j).sum() / max(total, 1)),
                      "groups": int((part_of_group == j).sum())} for j, p in enumerate(names)},
        "classes": [], "warnings": []}
    empty = [p for j, p in enumerate(names) if not (part_of_group == j).any()]
    if empty:
        report["warnings"].append(f"{', '.join(empty)} got no group: {len(group_names)} group(s) are too few for "
                                  f"these shares (or one group holds most samples); use fewer parts, other shares "
                                  "or a finer --group-by")
    if pooled.presence is not None:
        for c, name in enumerate(pooled.class_names):
            having = pooled.presence[:, c]
            images = int(having.sum())
            if not images:
                continue
            share = {p: float(having[part_of == j].sum() / images) for j, p in enumerate(names)}
            report["classes"].append({"id": c, "name": name, "images": images, "share": share})
            missing = [p for p in names if not share[p] and p not in empty]
            if missing:
                in_groups = len(set(np.asarray(member)[having].tolist()))
                report["warnings"].append(f"class {c} ({name}) is in no image of {', '.join(missing)}: it is in "
                                          f"{images} image(s) of {in_groups} group(s)")
    return SplitPlan(parts, report)
