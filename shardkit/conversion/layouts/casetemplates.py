"""3-D volume cases named by templates: ``--images "{case}/{case}_{modality}.nii.gz" --labels
"{case}/{case}_seg.nii.gz"`` for a tree no volume layout detects.

``{case}`` (any number of times, the same text each time) names the case, ``{modality}`` (``--images`` only, at
most once) a modality, ``{split}`` the split, as in :mod:`.pattern` (whose globs they share). A match is a volume
file (NIfTI, NRRD) or, for ``--images``, a folder read as a DICOM series; a matched image file is refused (one
template reads volumes or images, not both). Modalities stack as bands in ``--modalities`` order, else in name
order. A case missing a modality or its label is kept as a pair here and refused (or, with ``--on-error skip``,
skipped and recorded) when its files are resolved (:func:`template_case_images`), like an unreadable file.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path

from ...errors import LayoutError
from ...volumes.files import is_volume
from ..pairs import PairBuilder
from .base import Context, Job
from .pattern import _TOKEN, PatternLayout, Template
from .scan import Found, rel_path
from .volumes import Case, VolumeLayout

log = logging.getLogger(__name__)


def _volume_match(template: Template, text: str, is_dir: bool, root: Path) -> None:
    """Refuse, in one line, a match a volume template cannot read: an image file, or a folder as a label."""
    if not is_dir and not is_volume(text):
        raise LayoutError(f"{template.option} {template.text!r} matches the image file {text}: a template with "
                          "{case} reads 3-D volumes (NIfTI, NRRD, DICOM series folders), not images", path=root,
                          fix=f"make {template.option} match volume files only (e.g. end it in .nii.gz), or name "
                              "images with {name}")
    if is_dir and template.option == "--labels":
        raise LayoutError(f"--labels {template.text!r} matches the folder {text}/: label volumes are read from NIfTI "
                          "or NRRD files", path=root, fix="save the label volume as .nii.gz on the images' grid")


def template_cases(root: Path, images: Template, labels: Template,
                   modalities: Sequence[str] | None = None) -> tuple[VolumeLayout, dict[str, list[str]]]:
    """The cases the two templates name (per split: ``all`` without ``{split}``), and per split the label files no
    case's images match. Every matched file is a case's modality or its label; nothing is decoded."""
    label_of: dict[tuple[str, str], str] = {}
    for text, path, is_dir in labels.matches(root):
        _volume_match(labels, text, is_dir, root)
        m = labels.regex.fullmatch(text)
        key = (m["split"] if m and labels.has_split else "", m["case"] if m else "")
        if key in label_of:
            raise LayoutError(f"--labels {labels.text!r} matches {rel_path(root, label_of[key])} and {text} for "
                              f"case {key[1]!r}", path=root, fix="make --labels more specific (one file per case)")
        label_of[key] = path
    taken = set(label_of.values())
    files: dict[tuple[str, str], dict[str, str]] = {}
    for text, path, is_dir in images.matches(root):
        if path in taken:  # {case}/{case}_{modality}.nii.gz matches the label {case}/{case}_seg.nii.gz too
            continue
        _volume_match(images, text, is_dir, root)
        m = images.regex.fullmatch(text)
        if m is None:
            continue
        got = files.setdefault((m["split"] if images.has_split else "", m["case"]), {})
        modality = m["modality"] if images.has_modality else "image"
        if modality in got:
            raise LayoutError(f"--images {images.text!r} matches {rel_path(root, got[modality])} and {text} for case "
                              f"{m['case']!r}" + (f", modality {modality!r}" if images.has_modality else ""),
                              path=root, fix="make --images more specific (one volume per case and modality)")
        got[modality] = path
    if modalities and not images.has_modality:
        raise LayoutError(f"--modalities given, but --images {images.text!r} has no {{modality}}", path=root,
                          fix="put {modality} in --images where the modality's name is, or leave out --modalities")
    order = tuple(modalities) if modalities else tuple(sorted({m for got in files.values() for m in got}))
    splits: dict[str, list[Case]] = {}
    for (split, case), got in sorted(files.items()):
        label = label_of.get((split if labels.has_split else "", case))
        first = next((got[m] for m in order if m in got), min(got.values()))
        splits.setdefault(split or "all", []).append(Case(case, (Path(first),), None if label is None else Path(label)))
    cased = {(split if labels.has_split else "", case) for split, case in files}
    unmatched: dict[str, list[str]] = {}
    for key, label in sorted(label_of.items()):
        if key not in cased:
            unmatched.setdefault(key[0] or "all", []).append(rel_path(root, label))
    return VolumeLayout("case-templates", root, order, None, {s: tuple(c) for s, c in splits.items()}), unmatched


def template_case_images(images: str, root: Path, key: str, first: Path, modalities: tuple[str, ...]) -> tuple[
        Path, ...]:
    """A case's volumes in band order, from ``--images`` filled with its case, split (that of ``first``, the
    file discovery paired) and each modality; a LayoutError (one line) when one is missing or matched twice."""
    template = Template.parse(images, "--images")
    m = template.regex.fullmatch(rel_path(root, first))
    if m is None or m["case"] != key:
        raise LayoutError(f"case {key!r}: {rel_path(root, first)} is not matched by --images {images!r} any more",
                          path=root, fix="re-run when the input is stable")
    values = {"case": key, **({"split": m["split"]} if template.has_split else {})}
    out = []
    for modality in modalities if template.has_modality else ("image",):
        given = {**values, "modality": modality} if template.has_modality else values
        text = template.text
        for name, value in given.items():
            text = text.replace("{" + name + "}", value)
        if _TOKEN.search(text) is None:  # nothing left to match: one stat
            path = root / text
            found = [str(path)] if (path.is_file() and is_volume(path.name)) or (
                path.is_dir() and not path.is_symlink()) else []
        else:
            found = [p for t, p, d in template.filled(given).matches(root) if d or is_volume(t)]
        if len(found) != 1:
            what = f"modality {modality!r} " if template.has_modality else ""
            raise LayoutError(f"case {key!r} has {len(found) or 'no'} {what}volume{'s' * (len(found) > 1)} matching "
                              f"--images {images!r} ({text})", path=root,
                              fix="give every case one volume per modality" + (
                                  " (or choose the modalities with --modalities)" if template.has_modality else "")
                              + ", or pass --on-error skip to leave such cases out")
        out.append(Path(found[0]))
    return tuple(out)


def _job(root: Path, cases: tuple[Case, ...], labels: list[str]) -> Found:
    builder = PairBuilder(root)
    for case in cases:
        builder.add(case.key, str(case.images[0]), None if case.label is None else str(case.label))
    return Found(builder, labels=labels)


class CaseTemplatesLayout(PatternLayout):
    """Not detected: chosen by ``--images``/``--labels`` templates that name ``{case}``."""

    name = "case-templates"
    expected = ("--images 'DIR/[{split}/]{case}/{case}_{modality}.nii.gz' "
                "--labels 'DIR/[{split}/]{case}/{case}_seg.nii.gz'")
    order = 1001
    colour_with_class_dict = False

    def detect(self, ctx: Context) -> dict[str, Job]:
        if self.images is None or self.labels is None:
            return {}
        found, unmatched = template_cases(ctx.root, self.images, self.labels)
        if not found.splits:
            what = "the label volumes" if unmatched else "no volume file or folder"
            raise LayoutError(f"--images {self.images.text!r} matches no volume file or series folder ("
                              f"--labels {self.labels.text!r} matches {what})", path=ctx.root,
                              fix="write the templates relative to the input folder, e.g. --images "
                                  "'{case}/{case}_{modality}.nii.gz' --labels '{case}/{case}_seg.nii.gz'")
        unlabelled = next((c for cases in found.splits.values() for c in cases if c.label is None), None)
        if unlabelled is not None and ctx.on_error != "skip":  # as the detected trees refuse it (dry runs too)
            raise LayoutError(f"case {unlabelled.key!r} has no label volume matching --labels {self.labels.text!r}",
                              path=unlabelled.images[0],
                              fix="add its label volume, or pass --on-error skip to leave such cases out")
        splits = set(found.splits) | set(unmatched)
        return {s: functools.partial(_job, ctx.root, found.splits.get(s, ()), unmatched.get(s, [])) for s in splits}


LAYOUT = CaseTemplatesLayout
