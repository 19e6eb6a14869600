"""The input layout contract: what a layout declares (name, expected tree, label kind, default class table) and
what it does (detect its tree, pair images with labels per split).

A layout is a class with class-level facts and two methods; :mod:`.registry` finds every one of them, as
:mod:`shardkit.formats.registry` finds the formats.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ...labels.policy import TableChoice
from ..pairs import PairTable
from .scan import IMAGE_EXTENSIONS, LABEL_SUFFIXES, SHOW, Found, any_image, file_types, match_pairs, split_ext, subdirs


@dataclass(frozen=True)
class Discovery:
    """Everything discovery found: pairs per split (sorted by key, as columns) plus what could not be paired."""

    layout: str
    root: Path
    splits: dict[str, PairTable]
    label_kind: str
    class_dict: Path | None
    unmatched_images: dict[str, tuple[str, ...]]
    unmatched_labels: dict[str, tuple[str, ...]]
    #: files skipped in the image and label folders because their type is not an image shardkit reads:
    #: extension (lower case, "" for none) → count
    skipped_types: dict[str, int] = field(default_factory=dict)
    #: labels drawn from an annotation source (:mod:`shardkit.conversion.annotated`): what the manifest records
    #: of it (source, files, table origin, original ids, policies); None for mask images
    annotations: dict[str, Any] | None = None

    def total(self) -> int:
        """Number of pairs over all splits."""
        return sum(len(pairs) for pairs in self.splits.values())

    def report_lines(self) -> list[str]:
        """A short human summary: layout, pairs per split, unmatched files (first few names)."""
        lines = [f"layout {self.layout} (labels: {self.label_kind}) in {self.root}"]
        notes = self.annotations
        if notes is None:
            lines.append(f"class table file: {self.class_dict or 'none at the root'}")
        else:  # labels drawn from shapes: where they come from and every policy the run applies
            lines += [f"labels drawn from {notes['source']} annotations: {', '.join(notes['files'])}",
                      f"policies: --object-overlap {notes['overlap']}, --crowd {notes['crowd']}, --on-lost-object "
                      f"{notes['on_lost_object']} (the tool's rule: {notes['tool_rule']})"]
        what = "pairs" if notes is None else "samples"
        lines += [f"split {name}: {len(pairs)} {what}" for name, pairs in self.splits.items()]
        for what, table in (("images without a label", self.unmatched_images),
                            ("labels without an image", self.unmatched_labels)):
            for name, missing in table.items():
                more = ", …" if len(missing) > SHOW else ""
                lines.append(f"split {name}: {len(missing)} {what}: {', '.join(missing[:SHOW])}{more}")
        if self.skipped_types:
            lines.append(f"skipped, not a file type shardkit reads: {file_types(self.skipped_types)}")
        return lines


Job = Callable[[], Found]
#: Files at a dataset's root that hold a colour class table (name,r,g,b).
CLASS_DICT_NAMES: tuple[str, ...] = ("class_dict.csv", "classes.csv")


@dataclass(frozen=True)
class Context:
    """The input root's top-level listing and the options every layout detector needs."""

    root: Path
    dirs: frozenset[str]
    files: tuple[str, ...]
    label_suffix: str | None
    #: ``--on-error``: with ``skip``, a volume case missing a modality or its label is kept as a pair (its files
    #: are then refused when resolved, so the case is skipped and recorded) instead of refusing the tree
    on_error: str = "fail"

    def pairs(self, images: Path, labels: Path, default: tuple[str, ...] = LABEL_SUFFIXES) -> Job:
        """A job matching ``images`` to ``labels`` with the user's ``--label-suffix`` or ``default`` (then, without
        a user suffix, by the name part image and label share)."""
        if self.label_suffix is None:
            return functools.partial(match_pairs, self.root, images, labels, default, shared_part=True)
        stem, ext = split_ext(self.label_suffix)
        if ext.lower() in IMAGE_EXTENSIONS:
            return functools.partial(match_pairs, self.root, images, labels, (stem,), ext.lower())
        return functools.partial(match_pairs, self.root, images, labels, (self.label_suffix,))

    def dir_named(self, names: tuple[str, ...], where: Path | None = None) -> list[str]:
        """The sub-folders of ``where`` (default: the root) whose name is one of ``names`` (case-insensitive), in
        the order of ``names``."""
        present = self.dirs if where is None else frozenset(subdirs(where))
        by_lower = {d.lower(): d for d in sorted(present)}
        return [by_lower[n.lower()] for n in names if n.lower() in by_lower]

    @property
    def class_dict(self) -> Path | None:
        """A colour class table at the root (``class_dict.csv``), if any."""
        return next((self.root / f for f in self.files if f.lower() in CLASS_DICT_NAMES), None)


def has_images(folder: Path, labels: bool = False) -> bool:
    """Whether ``folder`` holds image files directly (not only sub-folders); ``labels``: files a label may be
    (:data:`~shardkit.conversion.layouts.scan.LABEL_EXTENSIONS`)."""
    return any_image(folder, labels)


class Layout:
    """One input layout. Subclasses set the class facts and implement :meth:`detect`.

    - ``name``: what ``--layout`` and the manifest's ``source.layout`` call it;
    - ``expected``: the tree it expects, for messages;
    - ``order``: ``--layout auto`` tries layouts in increasing order (most specific first);
    - ``label_kind``: how its labels are read (``ids``, ``colour``, ``palette``, ``cityscapes``);
      ``colour_with_class_dict``: ``ids`` becomes ``colour`` when a ``class_dict.csv`` is at the root;
    - ``image_dirs``/``label_dirs``: the folder names it looks for (the no-match diagnosis compares them with
      what it saw);
    - ``takes_label_suffix``: whether ``--label-suffix`` means anything to it;
    - ``ignore_convention``: the ignore id its format defines (VOC: 255, the void border), with the reason;
    - :meth:`default_table`: a class table ONLY where the layout identifies the dataset (CamVid, VOC,
      Cityscapes) or the dataset ships one in a form the layout defines (labelme2voc's ``class_names.txt``).
    """

    name: ClassVar[str]
    expected: ClassVar[str]
    order: ClassVar[int] = 100
    label_kind: ClassVar[str] = "ids"
    colour_with_class_dict: ClassVar[bool] = True
    image_dirs: ClassVar[tuple[str, ...]] = ()
    label_dirs: ClassVar[tuple[str, ...]] = ()
    takes_label_suffix: ClassVar[bool] = True
    auto: ClassVar[bool] = True  # tried by --layout auto (the explicit pattern layout is not)
    #: the ignore id the layout's format defines for every dataset in it (VOC's 255 border), and why: applied
    #: when neither the user nor the class table gives one, and logged
    ignore_convention: ClassVar[tuple[int, str] | None] = None

    def detect(self, ctx: Context) -> dict[str, Job]:
        """A pairing job per split when ``ctx.root`` has this layout's tree; empty when it has not."""
        raise NotImplementedError

    def kind(self, class_dict: Path | None) -> str:
        """The label kind, given the colour table found at the root (if any)."""
        return "colour" if class_dict is not None and self.colour_with_class_dict else self.label_kind

    def default_table(self, found: Discovery, *, cityscapes_train_ids: bool = True) -> TableChoice | None:
        """The class table this layout knows for ``found`` (with the reason), or None: the user or the data
        must then say what the classes are."""
        return None
