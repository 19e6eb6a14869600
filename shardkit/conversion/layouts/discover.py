"""Find the layout of a dataset folder (or use the one forced) and pair its images and labels per split.

Nothing is ever written into the input folder: list files and pairing templates may live anywhere
(``--split-list``, ``--images``/``--labels``), so a read-only dataset converts as it is.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from ...errors import ConfigError, InputNotFoundError, LayoutError, ShardkitError
from ...labels.policy import TableChoice
from ..pairs import PairTable
from .base import Context, Discovery, Job, Layout
from .casetemplates import CaseTemplatesLayout
from .diagnose import no_layout_message
from .pattern import PatternLayout
from .registry import all_layouts, get
from .scan import SHOW, Found, file_types, scan
from .splitlist import are_pair_lists, name_list_jobs, pair_list_jobs

logger = logging.getLogger(__name__)


def layout_table(found: Discovery, *, cityscapes_train_ids: bool = True) -> TableChoice | None:
    """The class table ``found``'s layout knows for it (where the layout identifies the dataset), else None."""
    return get(found.layout)().default_table(found, cityscapes_train_ids=cityscapes_train_ids)


def with_colour_table(found: Discovery, table: Path | None) -> Discovery:
    """``found`` with the label kind a colour table file the user names (``--palette``, ``--class-dict``) gives
    it: ``ids`` labels become colour masks where the layout does so for a ``class_dict.csv`` at the root."""
    if table is None or found.class_dict is not None:
        return found
    kind = get(found.layout)().kind(Path(table))
    if kind != found.label_kind:
        logger.info("%s: labels read as colour masks (%s is a colour table)", found.root, table)
    return replace(found, label_kind=kind)


def layout_ignore(found: Discovery) -> tuple[int, str] | None:
    """The ignore id ``found``'s layout format defines (VOC's 255) and why, else None."""
    return get(found.layout).ignore_convention


def _check_lists_agree(ctx: Context, folders: Mapping[str, Job], results: dict[str, PairTable]) -> None:
    """Folders win over list files only when every list file names exactly its folders' pairs."""
    fix = "choose one with --layout segnet (folders) or --layout listfile (list files)"
    for split, job in sorted(get("listfile")().detect(ctx).items()):
        if split not in folders:
            raise LayoutError(f"{split}.txt has no {split}/ + {split}annot/ folders", path=ctx.root, fix=fix)
        if split not in results:
            continue
        try:
            table = job().pairs.build()
        except ShardkitError as exc:
            raise LayoutError(f"list file and folders disagree: {exc}", path=ctx.root, fix=fix) from exc
        if table == results[split]:  # both sorted by key, the image's path: equal tables, equal pair sets
            continue
        listed = {(p.image, p.label) for p in table}
        held = {(p.image, p.label) for p in results[split]}
        if listed != held:
            raise LayoutError(f"{split}.txt names {len(listed)} pairs, {split}/ + {split}annot/ hold "
                              f"{len(held)}, {len(listed ^ held)} differ", path=ctx.root, fix=fix)


def _check_unmatched(root: Path, images: dict[str, tuple[str, ...]], labels: dict[str, tuple[str, ...]],
                     strict: bool) -> None:
    """Warn about (or with ``strict``, refuse) images without labels and labels without images."""
    parts = []
    for what, table in (("images without a label", images), ("labels without an image", labels)):
        names = [n for missing in table.values() for n in missing]
        if names:
            parts.append(f"{len(names)} {what} (first: {', '.join(names[:SHOW])})")
    if parts and strict:
        raise LayoutError("; ".join(parts), path=root, fix="add the missing files or drop --strict")
    if parts:
        logger.warning("%s: %s", root, "; ".join(parts))


def _choose(ctx: Context, layout: str, pattern: PatternLayout | None) -> tuple[Layout, dict[str, Job]]:
    """The layout to use and its jobs per split: the pattern, the forced one, or the first that fits."""
    if pattern is not None:
        if layout not in ("auto", "pattern", pattern.name):
            raise ConfigError(f"--layout {layout} and --images/--labels both given", fix="pass only one of them")
        return pattern, pattern.detect(ctx)
    if layout != "auto":
        chosen = get(layout)()
        if not chosen.auto:
            raise ConfigError(f"--layout {layout} needs --images and --labels")
        jobs = chosen.detect(ctx)
        if not jobs:
            raise LayoutError(f"layout {layout} forced but not found (tried {layout})", path=ctx.root,
                              fix=f"expected {chosen.expected}, or pass another --layout")
        return chosen, jobs
    found = [(cls(), jobs) for cls in all_layouts() if cls.auto and (jobs := cls().detect(ctx))]
    if not found:
        message, fix = no_layout_message(ctx)
        raise LayoutError(message, path=ctx.root, fix=fix)
    chosen, jobs = found[0]
    others = [c.name for c, _ in found[1:] if not (chosen.name == "segnet" and c.name == "listfile")]
    if others:
        logger.warning("%s: using layout %s; it also looks like %s (pass --layout to choose)",
                       ctx.root, chosen.name, ", ".join(others))
    return chosen, jobs


def discover(root: Path, *, layout: str = "auto", label_suffix: str | None = None,
             splits: tuple[str, ...] = (), strict: bool = False, images: str | None = None,
             labels: str | None = None, split_lists: Mapping[str, Path] | None = None,
             on_error: str = "fail") -> Discovery:
    """Find the layout of ``root`` (or use the one forced, or the ``images``/``labels`` templates) and pair its
    images and labels per split; ``split_lists`` (split → list file anywhere) then decide the splits."""
    if layout != "auto":
        get(layout)  # an unknown name is a ConfigError before anything is read
    pattern = PatternLayout(images, labels) if images is not None or labels is not None else None
    if pattern is not None and pattern.images is not None and pattern.images.volume:  # volume cases: {case}
        pattern = CaseTemplatesLayout(images, labels)
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        what = "input is not a folder" if root.exists() else "input folder does not exist"
        raise InputNotFoundError(what, path=root, fix="point the input at the dataset folder")
    dirs, files = scan(root)
    ctx = Context(root, frozenset(dirs), tuple(files), label_suffix, on_error)
    if not dirs and not files:
        expected = "; ".join(f"{c.name}: {c.expected}" for c in all_layouts())
        raise LayoutError("input folder is empty", path=root, fix=f"point the input at a dataset: {expected}")
    chosen: Layout
    if split_lists and pattern is None and layout in ("auto", "listfile") and are_pair_lists(split_lists):
        chosen, jobs = get("listfile")(), pair_list_jobs(ctx, split_lists)
    elif split_lists:
        chosen, base = _choose(ctx, layout, pattern)
        jobs = name_list_jobs(ctx, split_lists, base)
    else:
        chosen, jobs = _choose(ctx, layout, pattern)
    unknown = [s for s in splits if s not in jobs]
    if unknown:
        raise ConfigError(f"unknown split {', '.join(unknown)} in {root}",
                          fix=f"choose --splits from the available ones: {', '.join(sorted(jobs))}")
    if label_suffix is not None and not chosen.takes_label_suffix:
        logger.warning("label suffix %r is ignored by the %s layout", label_suffix, chosen.name)
    results: dict[str, Found] = {s: jobs[s]() for s in sorted(splits or jobs)}
    tables = {s: r.pairs.build() for s, r in results.items()}
    if layout == "auto" and chosen.name == "segnet" and not split_lists:
        _check_lists_agree(ctx, jobs, tables)
    class_dict = ctx.class_dict
    kind = chosen.kind(class_dict)
    images_left = {s: tuple(sorted(r.images)) for s, r in results.items() if r.images}
    labels_left = {s: tuple(sorted(r.labels)) for s, r in results.items() if r.labels}
    _check_unmatched(root, images_left, labels_left, strict)
    skipped = dict(sum((r.skipped for r in results.values()), Counter()))
    if skipped:
        logger.warning("%s: skipped, not a file type shardkit reads: %s", root, file_types(skipped))
    pairs = {s: t for s, t in tables.items() if len(t)}
    if not pairs:
        raise LayoutError(f"layout {chosen.name} found no image/label pairs in split(s) {', '.join(results)}",
                          path=root, fix=f"expected {chosen.expected} with matching names, or pass "
                                         "--images/--labels templates")
    for s in sorted(set(results) - set(pairs)):
        logger.warning("%s: split %s has no image/label pairs; skipped", root, s)
    result = Discovery(chosen.name, root, pairs, kind, class_dict, images_left, labels_left, skipped)
    logger.info("%s: layout %s, %d pairs in %d splits", root, chosen.name, result.total(), len(pairs))
    return result
