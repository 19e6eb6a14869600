"""ADE20K's full release: ``[ADE20K_*/]images/[ADE/]<split>/<letter or scene>/…/<name>.jpg`` beside
``<name>_seg.png`` (class = R/10*256 + G, :mod:`shardkit.labels.ade20k`), however deep the scene folders go.

Only ``_seg.png`` files are labels; the part masks (``_parts_N.png``), the 2021 release's instance mask folders
and the 2016 release's ``_atr.txt`` files are counted and named, not read. The 2021 release's per-image ``.json``
files (beside each image) name the classes (:func:`~shardkit.labels.ade20k.names_table`). The 150-class challenge set
(``ADEChallengeData2016``: ``images/`` + ``annotations/``) is the ``generic`` layout's.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import Counter
from pathlib import Path
from typing import ClassVar

from ...labels.ade20k import SEG_SUFFIX, names_table
from ...labels.policy import TableChoice
from ..pairs import PairBuilder
from .base import Context, Discovery, Job, Layout
from .scan import Found, rel_path, split_ext, walk

logger = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("training", "validation")
_PROBE_DEPTH = 4  # scene folders: <letter>/<scene>/[<sub-scene>/] under a split
_PROBE_ENTRIES = 200  # entries looked at per folder while probing for a _seg.png
#: Every full-release file name starts so (ADE_train_…, ADE_val_…, ADE_frame_…): another dataset's ``*_seg.png``
#: masks (gray ids, colours) are never taken for this encoding.
ADE_PREFIX = "ADE_"


def _has_seg(folder: Path, depth: int = _PROBE_DEPTH) -> bool:
    """Whether an ``ADE_…_seg.png`` lies within ``depth`` levels below ``folder`` (the first sub-folders only: a cheap
    probe, not a walk)."""
    try:
        with os.scandir(folder) as it:
            entries = [e for _, e in zip(range(_PROBE_ENTRIES), it, strict=False)]
    except OSError:
        return False
    if any(e.name.startswith(ADE_PREFIX) and e.name.endswith(SEG_SUFFIX) and e.is_file() for e in entries):
        return True
    return depth > 0 and any(_has_seg(Path(e.path), depth - 1) for e in entries[:3] if e.is_dir())


def find_base(root: Path, dirs: frozenset[str]) -> Path | None:
    """The folder holding the split folders: root, or root/[ADE20K_*/]images[/ADE] (``dirs``: root's folders)."""
    candidates = [root, root / "images", root / "images" / "ADE", root / "ADE"]
    candidates += [root / d / "images" / sub for d in sorted(dirs) if d.startswith("ADE20K") for sub in ("", "ADE")]
    for base in candidates:
        if any((base / s).is_dir() and _has_seg(base / s) for s in SPLITS):
            return base
    return None


def ade_split(root: Path, folder: Path) -> Found:
    """Pairs ``<name>.jpg`` ↔ ``<name>_seg.png`` in the same folder, anywhere below ``folder``."""
    skipped: Counter[str] = Counter()
    images: dict[str, str] = {}
    labels: dict[str, str] = {}
    other = 0
    for rel, name, path in walk(folder, skipped=skipped, root=root):
        stem, ext = split_ext(name)
        key = f"{rel}/{stem}" if rel else stem
        if name.endswith(SEG_SUFFIX):
            labels[key[: -len("_seg")]] = path
        elif ext.lower() in (".jpg", ".jpeg"):
            images[key] = path
        else:
            other += 1  # part masks (_parts_N.png), instance masks
    if other:
        skipped["_parts_N.png or instance .png"] += other
    skipped.pop(".json", None)  # the per-image .json files: read for the class names (default_table)
    found = Found(PairBuilder(root), skipped=skipped)
    for key, image in images.items():
        label = labels.pop(key, None)
        if label is None:
            found.images.append(rel_path(root, image))
        else:
            found.pairs.add(rel_path(root, image), image, label)
    found.labels.extend(rel_path(root, p) for p in labels.values())
    return found


class Ade20kLayout(Layout):
    name = "ade20k"
    expected = "[ADE20K_*/]images/[ADE/]{training,validation}/…/<name>.jpg + <name>_seg.png (ADE20K full release)"
    order = 15
    label_kind = "ade20k"
    colour_with_class_dict = False
    image_dirs: ClassVar[tuple[str, ...]] = ("images",)
    label_dirs: ClassVar[tuple[str, ...]] = ()
    takes_label_suffix = False

    def detect(self, ctx: Context) -> dict[str, Job]:
        base = find_base(ctx.root, ctx.dirs)
        if base is None:
            return {}
        return {s: functools.partial(ade_split, ctx.root, base / s) for s in SPLITS if (base / s).is_dir()}

    def default_table(self, found: Discovery, *, cityscapes_train_ids: bool = True) -> TableChoice | None:
        """The names the per-image ``<image>.json`` files give (the 2021 release), or None without any."""
        files = [p for pairs in found.splits.values() for i in range(len(pairs))
                 if (image := pairs.path(i, 0)) and (p := Path(image).with_suffix(".json")).is_file()]
        got = names_table(files)
        return None if got is None else TableChoice(*got)


LAYOUT = Ade20kLayout
