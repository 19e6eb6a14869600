"""PASCAL VOC: ``JPEGImages/`` + ``SegmentationClass/`` (+ ``ImageSets/Segmentation/<split>.txt``), at the root,
in ``VOC*/`` or in ``VOC*/VOC*/`` (labels: palette-indexed PNGs, whose indices are the class ids)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from ...errors import InputNotFoundError, LayoutError
from ...labels.builtin import VOC
from ...labels.policy import TableChoice
from ..pairs import PairBuilder
from .base import Context, Discovery, Job, Layout, has_images
from .scan import Found, content_lines, one_file, rel_path, scan, split_ext, subdirs, walk

_Index = tuple[dict[str, list[str]], dict[str, list[str]]]  # (images, labels) by stem
_VOC_STEM = re.compile(r"\d{4}_\d{6}")  # 2007_000032: every PASCAL VOC image
_VOC_FOLDER = re.compile(r"VOC(\d{4}|devkit)", re.IGNORECASE)  # VOC2012/, VOCdevkit/


def voc_split(root: Path, index: Callable[[], _Index], listfile: Path | None, label_dir: str) -> Found:
    """Pairs for the stems of one ImageSets file, or (``listfile`` None) every labelled image."""
    images, labels = index()
    found, seen = Found(PairBuilder(root)), dict[str, int]()
    lines = content_lines(listfile) if listfile else ((0, [s]) for s in sorted(labels))
    for number, fields in lines:
        stem = fields[0]
        if stem in seen:
            raise LayoutError(f"lines {seen[stem]} and {number} both name {stem!r}", path=listfile,
                              fix="remove the duplicate line")
        seen[stem] = number
        image, label = one_file(root, stem, images.get(stem, [])), one_file(root, stem, labels.get(stem, []))
        if image and label:
            found.pairs.add(rel_path(root, image), image, label)
        elif label:
            found.labels.append(rel_path(root, label))
        elif image:
            found.images.append(rel_path(root, image))
        else:
            raise InputNotFoundError(f"line {number}: no image or label named {stem!r}", path=listfile,
                                     fix=f"add it to JPEGImages/ and {label_dir}/ or remove the line")
    return found


class VocLayout(Layout):
    name = "voc"
    expected = "JPEGImages/ + SegmentationClass/ (+ ImageSets/Segmentation/<split>.txt)"
    order = 30
    label_kind = "palette"
    colour_with_class_dict = False
    image_dirs = ("JPEGImages",)
    label_dirs: ClassVar[tuple[str, ...]] = ("SegmentationClass", "SegmentationClassPNG")
    takes_label_suffix = False
    ignore_convention: ClassVar[tuple[int, str] | None] = (
        255, "the voc layout's convention (PASCAL VOC's palette PNGs mark the void border and pixels to ignore "
             "with 255)")

    def base(self, root: Path) -> tuple[Path, str] | None:
        """The folder holding JPEGImages/ and a label folder with images (root, root/VOC*, root/VOC*/VOC*), and
        that label folder's name (the first of :attr:`label_dirs` holding images: labelme2voc's
        SegmentationClass/ may hold only .npy files beside SegmentationClassPNG/)."""
        level = [root]
        for _ in range(3):
            hits = [(d, lab) for d in level if (d / "JPEGImages").is_dir() for lab in self.label_dirs
                    if (d / lab).is_dir() and self.accepts(d) and has_images(d / lab, labels=True)]
            hits = [h for i, h in enumerate(hits) if h[0] not in (x[0] for x in hits[:i])]  # one per folder
            if len(hits) > 1:
                raise LayoutError(f"several VOC folders: {', '.join(rel_path(root, h[0]) for h in hits)}",
                                  path=root, fix="point the input at one of them")
            if hits:
                return hits[0]
            level = [d / n for d in level for n in subdirs(d) if n.upper().startswith("VOC")]
        return None

    def accepts(self, base: Path) -> bool:
        """Whether a folder with JPEGImages/ and a label folder is this layout's (labelme2voc's have
        class_names.txt, CVAT's mask exports labelmap.txt: those layouts claim them)."""
        return not (base / "class_names.txt").is_file() and not (base / "labelmap.txt").is_file()

    def detect(self, ctx: Context) -> dict[str, Job]:
        found = self.base(ctx.root)
        if found is None:
            return {}
        base, label_dir = found

        @functools.cache
        def index() -> _Index:  # files by stem, as lists so that duplicate stems can be reported
            out: _Index = ({}, {})
            for table, folder in zip(out, ("JPEGImages", label_dir), strict=True):
                for _, name, path in walk(base / folder, recursive=False, root=ctx.root):
                    table.setdefault(split_ext(name)[0], []).append(path)
            return out

        sets = base / "ImageSets" / "Segmentation"
        lists = [n for n in scan(sets)[1] if n.lower().endswith(".txt")]
        if not lists:
            return {"all": functools.partial(voc_split, ctx.root, index, None, label_dir)}
        return {n[:-4]: functools.partial(voc_split, ctx.root, index, sets / n, label_dir) for n in lists}

    def default_table(self, found: Discovery, *, cityscapes_train_ids: bool = True) -> TableChoice | None:
        """PASCAL VOC's 21 classes only for PASCAL VOC itself: a VOC*/ folder or VOC image names throughout."""
        where = self.base(found.root)
        in_voc_folder = where is not None and any(
            _VOC_FOLDER.match(p.name) for p in (where[0], *where[0].parents) if p.is_relative_to(found.root))
        stems = [k.rsplit("/", 1)[-1].rsplit(".", 1)[0] for pairs in found.splits.values() for k in pairs.keys]
        if in_voc_folder or (stems and all(_VOC_STEM.fullmatch(s) for s in stems)):
            why = "a VOC2012/ or VOCdevkit/ folder" if in_voc_folder else "PASCAL VOC image names (2007_000032 …)"
            return TableChoice(VOC, f"the voc layout with {why}")
        return None


LAYOUT = VocLayout
