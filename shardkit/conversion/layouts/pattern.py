"""Explicit pairing: ``--images "img/{split}/{name}.tif" --labels "gt/{split}/{name}_mask.gif"``.

Templates are POSIX paths relative to the input folder; ``{split}`` (optional) names the split, ``{name}`` the
name part an image and its label share; ``*``, ``?`` (within a folder) and ``**`` (any folders) are globs. Only
the folder listings under each template's fixed prefix are read; nothing is written anywhere.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError, LayoutError
from ..pairs import PairBuilder
from .base import Context, Job, Layout
from .scan import Found, rel_path, walk

_TOKEN = re.compile(r"\{split\}|\{name\}|\*\*/|\*\*|\*|\?")


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

    @classmethod
    def parse(cls, text: str, option: str) -> Template:
        t = text.strip().replace("\\", "/")
        parts = t.split("/")
        if not t or t.startswith("/") or re.match(r"^[A-Za-z]:", t) or ".." in parts:
            raise ConfigError(f"{option} {text!r} must be a path inside the input folder",
                              fix=f"write it relative to INPUT_DIR, e.g. {option} 'images/{{split}}/{{name}}.png'")
        if t.count("{name}") != 1:
            raise ConfigError(f"{option} {text!r} needs exactly one {{name}} (the name part image and label share)",
                              fix=f"e.g. {option} 'images/{{name}}.png'")
        if t.count("{split}") > 1 or re.search(r"\{(?!split\}|name\})", t):
            raise ConfigError(f"{option} {text!r}: only {{split}} (once) and {{name}} are placeholders")
        fixed = []
        for part in parts[:-1]:
            if _TOKEN.search(part):
                break
            fixed.append(part)
        pattern, pos = [], 0
        for m in _TOKEN.finditer(t):
            pattern.append(re.escape(t[pos : m.start()]))
            pattern.append({"{split}": r"(?P<split>[^/]+)", "{name}": r"(?P<name>[^/]+?)", "**/": r"(?:.*/)?",
                            "**": r".*", "*": r"[^/]*", "?": r"[^/]"}[m.group()])
            pos = m.end()
        pattern.append(re.escape(t[pos:]))
        return cls(t, option, "/".join(fixed), re.compile("".join(pattern)))

    def files(self, root: Path) -> dict[tuple[str, str], str]:
        """(split or "", name) → absolute path of every image file under root that the template matches; two
        files for one (split, name) is a LayoutError naming both."""
        top = root / self.prefix if self.prefix else root
        out: dict[tuple[str, str], str] = {}
        for rel, name, path in walk(top, root=root):
            text = "/".join(p for p in (self.prefix, rel, name) if p)
            m = self.regex.fullmatch(text)
            if m is None:
                continue
            key = (m.group("split") if self.has_split else "", m.group("name"))
            if key in out:
                raise LayoutError(f"{self.option} {self.text!r} matches {rel_path(root, out[key])} and {text} for "
                                  f"name {key[1]!r}", path=root,
                                  fix=f"make {self.option} more specific (one file per name and split)")
            out[key] = path
        return out


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
        if self.images and self.labels and self.labels.has_split and not self.images.has_split:
            raise ConfigError("--labels has {split} but --images has not",
                              fix="put {split} in --images too (or in neither)")

    def detect(self, ctx: Context) -> dict[str, Job]:
        if self.images is None or self.labels is None:
            return {}
        results = pattern_pairs(ctx.root, self.images, self.labels)
        return {split: functools.partial(_given, f) for split, f in results.items()}


LAYOUT = PatternLayout
