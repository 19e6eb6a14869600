"""``--split-list SPLIT=FILE``: list files from anywhere (the dataset folder may be read-only).

A list of ``image label`` lines names pairs itself (paths matched by their tail under the input folder, as the
SegNet list files are); a list of one name a line (``00000``, ``images/00000.png``) chooses, per split, among
the pairs the layout found (by image path, stem, or the name part the image shares with its label).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

from ...errors import ConfigError, InputNotFoundError, LayoutError
from ..pairs import PairBuilder
from .base import Context, Job
from .scan import IMAGE_TAGS, Found, Listings, _cut, content_lines, is_pair_list, read_pair_list


def _exists(path: Path) -> Path:
    if not path.is_file():
        raise InputNotFoundError("split list does not exist or is not a file", path=path,
                                 fix="pass --split-list SPLIT=PATH with an existing text file")
    return path


def are_pair_lists(lists: Mapping[str, Path]) -> bool:
    """True when every list names ``image label`` pairs; a mix of pair and name lists is a ConfigError."""
    kinds = {split: is_pair_list(_exists(path)) for split, path in lists.items()}
    if len(set(kinds.values())) > 1:
        raise ConfigError("--split-list files mix 'image label' lines and name lines: "
                          + ", ".join(f"{s}={'pairs' if k else 'names'}" for s, k in sorted(kinds.items())),
                          fix="write every list the same way")
    return all(kinds.values())


def pair_list_jobs(ctx: Context, lists: Mapping[str, Path]) -> dict[str, Job]:
    """One job per split reading its ``image label`` list."""
    listings = Listings(ctx.root)
    return {split: functools.partial(read_pair_list, ctx.root, path, listings) for split, path in lists.items()}


def name_list_jobs(ctx: Context, lists: Mapping[str, Path], base: Mapping[str, Job]) -> dict[str, Job]:
    """One job per split choosing the pairs of ``base`` (every split of the layout found) its list names."""

    @functools.cache
    def index() -> dict[str, list[tuple[str, str, str | None]]]:
        out: dict[str, list[tuple[str, str, str | None]]] = {}
        for job in base.values():
            for p in job().pairs.build():
                entry = (p.key, str(p.image), None if p.label is None else str(p.label))
                stem = p.image.stem
                for name in dict.fromkeys((p.key, stem, _cut(stem, IMAGE_TAGS))):
                    out.setdefault(name, []).append(entry)
        return out

    def select(path: Path) -> Found:
        found, seen = Found(PairBuilder(ctx.root)), dict[str, int]()
        for number, fields in content_lines(path):
            name = fields[0].replace("\\", "/")
            hits = index().get(name) or index().get(name.rsplit("/", 1)[-1].rsplit(".", 1)[0], [])
            if not hits:
                raise InputNotFoundError(f"line {number}: {name!r} names no image/label pair under {ctx.root}",
                                         path=path, fix="correct the line, or check --images/--labels or --layout")
            if len(hits) > 1:
                raise LayoutError(f"line {number}: {name!r} names {len(hits)} pairs: "
                                  f"{', '.join(h[0] for h in hits[:SHOWN])}", path=path,
                                  fix="write the image's path relative to the input folder")
            key, image, label = hits[0]
            if key in seen:
                raise LayoutError(f"lines {seen[key]} and {number} both name {key}", path=path,
                                  fix="remove the duplicate line")
            seen[key] = number
            found.pairs.add(key, image, label)
        return found

    return {split: functools.partial(select, _exists(path)) for split, path in lists.items()}


SHOWN = 5
