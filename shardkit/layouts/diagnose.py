"""What to tell a user whose folder matches no layout: what was seen, the closest layout and what differs, and
the flags that pair the files explicitly — one screen."""

from __future__ import annotations

import difflib
from collections import Counter
from pathlib import Path

from .base import Context
from .generic import IMAGE_DIRS, LABEL_DIRS
from .registry import all_layouts
from .scan import is_image, scan, split_ext

_MAX_FOLDERS = 8
_MAX_COUNT = 100_000  # images counted per folder at most (the count is for people)
_DEPTH = 3
_CLOSE = 1.2  # summed similarity of the image and label folder names below which no layout is "close"


def _count(folder: Path) -> tuple[int, Counter[str]]:
    """Images below ``folder`` (a few levels deep, capped) and their extensions."""
    n, exts, level = 0, Counter[str](), [folder]
    for _ in range(_DEPTH):
        nxt = []
        for d in level:
            dirs, files = scan(d)
            for f in files:
                if is_image(f):
                    n += 1
                    exts[split_ext(f)[1]] += 1
            nxt += [d / s for s in dirs]
            if n >= _MAX_COUNT:
                return n, exts
        level = nxt
    return n, exts


def _similar(name: str, wanted: tuple[str, ...]) -> tuple[float, str]:
    """How close ``name`` is to the nearest of ``wanted`` (0..1), and that name (``<split>`` matches anything)."""
    best = (0.0, "")
    for w in wanted:
        low, target = name.lower(), w.lower()
        if target.startswith("<split>"):
            target = target[len("<split>"):]
            low = low[-len(target):] if len(low) > len(target) else low
        best = max(best, (difflib.SequenceMatcher(None, low, target).ratio(), w))
    return best


def _last(folder: str) -> str:
    return folder.rsplit("/", 1)[-1]


def _closest(folders: list[str]) -> str:
    """The layout whose folder names are nearest to ``folders``, and what differs."""
    best: tuple[float, str] = (0.0, "")
    for cls in all_layouts():
        if not cls.auto or not cls.image_dirs or not cls.label_dirs:
            continue
        img = max(((*_similar(_last(f), cls.image_dirs), f) for f in folders), default=(0.0, "", ""))
        lab = max(((*_similar(_last(f), cls.label_dirs), f) for f in folders if f != img[2]),
                  default=(0.0, "", ""))
        diffs = []
        for (score, want, have), role, names in ((img, "image", cls.image_dirs), (lab, "label", cls.label_dirs)):
            if score == 1.0:
                diffs.append(f"{have}/ is its {role} folder")
            elif score >= 0.6:
                diffs.append(f"{have}/ is not {want}/")
            else:
                diffs.append(f"no {role} folder ({', '.join(n + '/' for n in names[:5])}…)")
        total = img[0] + lab[0]
        if total > best[0]:
            best = (total, f"closest layout: {cls.name} ({cls.expected}): {'; '.join(diffs)}")
    if best[0] < _CLOSE:
        return "no layout is close (e.g. generic: images/ + labels/, mmseg: img_dir/ + ann_dir/)"
    return best[1]


def _suggest(counts: list[tuple[str, int, Counter[str]]]) -> str:
    """``--images``/``--labels`` for the two folders with the most images (the more label-like one as labels)."""
    top = [c for c in counts if c[1]][:2]
    if len(top) < 2:
        return ""

    def image_like(c: tuple[str, int, Counter[str]]) -> float:
        return _similar(c[0], IMAGE_DIRS)[0] - _similar(c[0], LABEL_DIRS)[0]

    b, a = sorted(top, key=image_like)
    ext = {name: exts.most_common(1)[0][0] for name, _, exts in top}
    return f"--images '{a[0]}/{{name}}{ext[a[0]]}' --labels '{b[0]}/{{name}}{ext[b[0]]}'"


def no_layout_message(ctx: Context) -> tuple[str, str]:
    """The report of a folder that matches no layout (a few lines) and the fix (the flags to pass)."""
    counts = [(d, *_count(ctx.root / d)) for d in sorted(ctx.dirs)]
    counts.sort(key=lambda c: (-c[1], c[0]))
    root_images = sum(1 for f in ctx.files if is_image(f))
    seen = [f"{d}/ ({n}{'+' if n >= _MAX_COUNT else ''} images)" for d, n, _ in counts[:_MAX_FOLDERS]]
    if len(counts) > _MAX_FOLDERS:
        seen.append(f"and {len(counts) - _MAX_FOLDERS} more folders")
    if root_images:
        seen.append(f"{root_images} images at the top")
    folders = list(ctx.dirs) + [f"{d}/{s}" for d in sorted(ctx.dirs)[:_MAX_FOLDERS]
                                for s in scan(ctx.root / d)[0][:_MAX_FOLDERS]]
    lines = ["no known dataset layout",
             f"  saw: {', '.join(seen) or 'no folders'}",
             f"  {_closest(folders)}",
             "  tried: " + ", ".join(c.name for c in all_layouts() if c.auto)]
    hint = _suggest(counts)
    pair = hint or "--images 'DIR/[{split}/]{name}.EXT' --labels 'DIR/[{split}/]{name}_mask.EXT'"
    fix = (f"pair them with {pair} ({{split}} where split folders are; the label's own ending, e.g. "
           "{name}_mask.png), or --split-list SPLIT=FILE, or rename the folders as the closest layout expects")
    return "\n".join(lines) + "\n ", fix
