"""Explicit pairing: ``--images "img/{split}/{name}.tif" --labels "gt/{split}/{name}_mask.gif"``.

Templates are POSIX paths relative to the input folder; ``{split}`` (optional) names the split, ``{name}`` the
name part an image and its label share; ``*``, ``?`` (within a folder) and ``**`` (any folders) are globs. Only
the folder listings under each template's fixed prefix are read; nothing is written anywhere. Templates of 3-D
volume cases name ``{case}`` (and ``{modality}``) instead of ``{name}`` (:mod:`.casetemplates`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError, LayoutError
from ...volumes.files import is_volume
from ..pairs import PairBuilder
from .base import Context, Job, Layout
from .scan import Found, is_image, rel_path, walk

_TOKEN = re.compile(r"\{split\}|\{name\}|\{case\}|\{modality\}|\*\*/|\*\*|\*|\?")
_GLOBS = {"**/": r"(?:.*/)?", "**": r".*", "*": r"[^/]*", "?": r"[^/]"}


@dataclass(frozen=True)
class Template:
    """One compiled ``--images``/``--labels`` template."""

    text: str
    option: str
    prefix: str  # the folders before the first placeholder or glob ("" = the root)
    regex: re.Pattern[str]

    @property
    def has_split(self) -> bool:
        return "{split}" in self.text

    @property
    def volume(self) -> bool:
        """Whether it names 3-D volume cases (``{case}``) rather than image files (``{name}``)."""
        return "{case}" in self.text

    @property
    def has_modality(self) -> bool:
        return "{modality}" in self.text

    @classmethod
    def parse(cls, text: str, option: str) -> Template:
        t = text.strip().replace("\\", "/")
        parts = t.split("/")
        if not t or t.startswith("/") or re.match(r"^[A-Za-z]:", t) or ".." in parts:
            raise ConfigError(f"{option} {text!r} must be a path inside the input folder",
                              fix=f"write it relative to INPUT_DIR, e.g. {option} 'images/{{split}}/{{name}}.png'")
        if re.search(r"\{(?!split\}|name\}|case\}|modality\})", t) or t.count("{split}") > 1:
            raise ConfigError(f"{option} {text!r}: only {{split}} (once), {{name}} (images) and {{case}}, "
                              "{modality} (volumes) are placeholders")
        if "{case}" in t:
            if "{name}" in t:
                raise ConfigError(f"{option} {text!r} names both {{name}} (image files) and {{case}} (volume cases)",
                                  fix="write {case} for the case of a 3-D volume, {name} for an image's name part")
            if t.count("{modality}") > 1 or (option == "--labels" and "{modality}" in t):
                raise ConfigError(f"{option} {text!r}: {{modality}} goes once, in --images (the label volume is "
                                  "one per case)", fix="e.g. --images '{case}/{case}_{modality}.nii.gz' --labels "
                                                       "'{case}/{case}_seg.nii.gz'")
        elif t.count("{name}") != 1:
            raise ConfigError(f"{option} {text!r} needs exactly one {{name}} (the name part image and label share; "
                              "{case} for 3-D volume cases)", fix=f"e.g. {option} 'images/{{name}}.png'")
        elif "{modality}" in t:
            raise ConfigError(f"{option} {text!r}: {{modality}} is for 3-D volume cases, named by {{case}}",
                              fix=f"write {{case}} in place of {{name}}, e.g. {option} '{{case}}/{{case}}_{{modality}}"
                                  ".nii.gz'")
        return cls(t, option, _prefix(t), _regex(t))

    def filled(self, values: dict[str, str]) -> Template:
        """This template with some placeholders given (``{"case": "p1", "modality": "t1"}``): what is left are its
        globs and the placeholders not given."""
        return type(self)(self.text, self.option, _prefix(self.text, values), _regex(self.text, values))

    def files(self, root: Path) -> dict[tuple[str, str], str]:
        """(split or "", name) → absolute path of every image file under root that the template matches; two
        files for one (split, name) is a LayoutError naming both, a volume file matched one naming it."""
        out: dict[tuple[str, str], str] = {}
        for text, path, is_dir in self.matches(root):
            if is_dir:
                continue
            if is_volume(text):
                raise LayoutError(f"{self.option} {self.text!r} matches the 3-D volume {text}: volume cases are "
                                  "named by {case}, not {name}", path=root,
                                  fix=f"write {self.option} {self.text.replace('{name}', '{case}')!r} (and the other "
                                      "template so), or make it match image files only")
            m = self.regex.fullmatch(text)
            key = (m.group("split") if self.has_split and m else "", m.group("name") if m else "")
            if key in out:
                raise LayoutError(f"{self.option} {self.text!r} matches {rel_path(root, out[key])} and {text} for "
                                  f"name {key[1]!r}", path=root,
                                  fix=f"make {self.option} more specific (one file per name and split)")
            out[key] = path
        return out

    def matches(self, root: Path) -> Iterator[tuple[str, str, bool]]:
        """(relative POSIX path, absolute path, is a folder) of every image file, volume file and folder under root
        the template matches (only the folders under its fixed prefix are listed)."""
        top = root / self.prefix if self.prefix else root
        if self.prefix and not top.is_dir():
            return
        for rel, name, path in walk(top, root=root, accept=_image_or_volume, folders=True):
            text = "/".join(p for p in (self.prefix, rel, name.rstrip("/")) if p)
            is_dir = name.endswith("/")
            if self.regex.fullmatch(text) is not None and not (is_dir and Path(path).is_symlink()):
                yield text, path, is_dir


def _image_or_volume(name: str) -> bool:
    return is_image(name) or is_volume(name)


def _prefix(t: str, values: dict[str, str] | None = None) -> str:
    """The folders of template ``t`` before its first placeholder (one not in ``values``) or glob."""
    fixed = []
    for part in t.split("/")[:-1]:
        for name, value in (values or {}).items():
            part = part.replace("{" + name + "}", value)
        if _TOKEN.search(part):
            break
        fixed.append(part)
    return "/".join(fixed)


def _regex(t: str, values: dict[str, str] | None = None) -> re.Pattern[str]:
    """Template ``t`` as a regular expression over relative POSIX paths: ``{name}`` (shortest), ``{split}``,
    ``{case}`` (longest: ``{case}_{modality}`` splits at the last ``_``; again later: the same text), ``{modality}``
    (shortest) as named groups, a placeholder in ``values`` as that text."""
    pattern, pos, seen = [], 0, set()
    for m in _TOKEN.finditer(t):
        pattern.append(re.escape(t[pos : m.start()]))
        token, name = m.group(), m.group()[1:-1]
        if token in _GLOBS:
            pattern.append(_GLOBS[token])
        elif values is not None and name in values:
            pattern.append(re.escape(values[name]))
        elif name in seen:
            pattern.append(f"(?P={name})")
        else:
            seen.add(name)
            pattern.append(f"(?P<{name}>[^/]+)" if name in ("case", "split") else f"(?P<{name}>[^/]+?)")
        pos = m.end()
    pattern.append(re.escape(t[pos:]))
    return re.compile("".join(pattern))


def pattern_pairs(root: Path, images: Template, labels: Template) -> dict[str, Found]:
    """Pairs per split ("all" without ``{split}``) of the files the two templates match with the same name."""
    image_files, label_files = images.files(root), labels.files(root)
    found: dict[str, Found] = {}
    used: set[tuple[str, str]] = set()
    for (split, name), image in sorted(image_files.items()):
        f = found.setdefault(split or "all", Found(PairBuilder(root)))
        key = (split if labels.has_split else "", name)
        label = label_files.get(key)
        if label is None:
            f.images.append(rel_path(root, image))
            continue
        used.add(key)
        f.pairs.add(rel_path(root, image), image, label)
    for key, label in sorted(label_files.items()):
        if key not in used:
            found.setdefault(key[0] or "all", Found(PairBuilder(root))).labels.append(rel_path(root, label))
    return found


def _given(found: Found) -> Found:
    return found


class PatternLayout(Layout):
    """Not detected: chosen by ``--images`` and ``--labels``."""

    name = "pattern"
    expected = "--images 'DIR/[{split}/]{name}.EXT' --labels 'DIR/[{split}/]{name}SUFFIX.EXT'"
    order = 1000
    auto = False
    takes_label_suffix = False

    def __init__(self, images: str | None = None, labels: str | None = None) -> None:
        if (images is None) != (labels is None):
            given, missing = ("--images", "--labels") if labels is None else ("--labels", "--images")
            raise ConfigError(f"{given} needs {missing}",
                              fix="pass both, e.g. --images 'img/{name}.png' --labels 'gt/{name}.png'")
        self.images = Template.parse(images, "--images") if images is not None else None
        self.labels = Template.parse(labels, "--labels") if labels is not None else None
        if self.images and self.labels and self.images.volume != self.labels.volume:
            raise ConfigError("one of --images/--labels names {case} (3-D volume cases), the other {name} (images)",
                              fix="write {case} in both for volumes (--images '{case}/{case}_{modality}.nii.gz' "
                                  "--labels '{case}/{case}_seg.nii.gz'), {name} in both for images")
        if self.images and self.labels and self.labels.has_split and not self.images.has_split:
            raise ConfigError("--labels has {split} but --images has not",
                              fix="put {split} in --images too (or in neither)")

    def detect(self, ctx: Context) -> dict[str, Job]:
        if self.images is None or self.labels is None:
            return {}
        results = pattern_pairs(ctx.root, self.images, self.labels)
        return {split: functools.partial(_given, f) for split, f in results.items()}


LAYOUT = PatternLayout
