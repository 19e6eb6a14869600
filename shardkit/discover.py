"""Find image/label pairs per split in a dataset folder, for every supported layout.

Only folder listings are read (one ``os.scandir`` per folder, dict lookups by stem, no decoding), so
100k files take about a second; pairs sorted by key and splits by name keep the plan deterministic.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .columns import ColumnBuilder, StringColumn
from .errors import ConfigError, DecodeError, InputNotFoundError, LayoutError, ShardkitError
from .pairs import PairBuilder, PairTable, SamplePair
from .smallfile import read_small_text

__all__ = ["LABEL_SUFFIXES", "LAYOUTS", "Discovery", "PairTable", "SamplePair", "discover", "file_types", "rel_path"]

logger = logging.getLogger(__name__)

#: Layout names in the order ``layout="auto"`` tries them (most specific first).
LAYOUTS: tuple[str, ...] = ("cityscapes", "voc", "generic", "class_dict", "segnet", "listfile")
#: What shardkit.imageio decodes (GIF: single frame; TIFF: single page; PPM/PGM/PBM: netpbm).
IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".gif", ".ppm", ".pgm",
                              ".pbm", ".pnm"})
#: Label name = image stem + one of these (tried in this order; more than one hit is an error).
LABEL_SUFFIXES: tuple[str, ...] = ("_L", "_color_mask", "_mask", "_label", "_labels", "")
CLASS_DICT_NAMES: tuple[str, ...] = ("class_dict.csv", "classes.csv")
EXPECTED: dict[str, str] = {
    "cityscapes": "leftImg8bit/<split>/<city>/ + gtFine/<split>/<city>/",
    "voc": "JPEGImages/ + SegmentationClass/ (+ ImageSets/Segmentation/<split>.txt)",
    "generic": "images/[<split>/] + annotations/ (or labels/, masks/)",
    "class_dict": "<split>/ + <split>_labels/",
    "segnet": "<split>/ + <split>annot/",
    "listfile": "<split>.txt with 'image label' lines",
}
_SHOW = 5


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

    def total(self) -> int:
        """Number of pairs over all splits."""
        return sum(len(pairs) for pairs in self.splits.values())

    def report_lines(self) -> list[str]:
        """A short human summary: layout, pairs per split, unmatched files (first few names)."""
        lines = [f"layout {self.layout} (labels: {self.label_kind}) in {self.root}",
                 f"class table file: {self.class_dict or 'none (a built-in table or the label ids are used)'}"]
        lines += [f"split {name}: {len(pairs)} pairs" for name, pairs in self.splits.items()]
        for what, table in (("images without a label", self.unmatched_images),
                            ("labels without an image", self.unmatched_labels)):
            for name, missing in table.items():
                more = ", …" if len(missing) > _SHOW else ""
                lines.append(f"split {name}: {len(missing)} {what}: {', '.join(missing[:_SHOW])}{more}")
        if self.skipped_types:
            lines.append(f"skipped, not a file type shardkit reads: {file_types(self.skipped_types)}")
        return lines


def file_types(counts: dict[str, int]) -> str:
    """``{".npy": 3, ".json": 1}`` → ``"3 .npy, 1 .json"`` (most first)."""
    return ", ".join(f"{n} {ext or '(no extension)'}" for ext, n in sorted(counts.items(), key=lambda e: (-e[1], e[0])))


@dataclass
class _Found:
    """One split's raw matching result, before sorting and reporting."""

    pairs: PairBuilder
    images: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)  # other file types met, by extension


_Job = Callable[[], _Found]
_VocIndex = tuple[dict[str, list[str]], dict[str, list[str]]]  # (images, labels) by stem


def _split_ext(name: str) -> tuple[str, str]:
    """``"a.b.PNG"`` → ``("a.b", ".PNG")``; cheaper than building a Path per file."""
    dot = name.rfind(".")
    return (name[:dot], name[dot:]) if dot > 0 else (name, "")


def _is_image(name: str) -> bool:
    return _split_ext(name)[1].lower() in IMAGE_EXTENSIONS


def _scan(folder: Path) -> tuple[list[str], StringColumn]:
    """Sorted visible (sub-folder names, file names) of ``folder``; empty when it does not exist.

    File names are a column: a flat folder of 100k images listed as ``str`` objects took ~7 MB."""
    dirs: list[str] = []
    files = ColumnBuilder()
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if not entry.name.startswith("."):
                    try:
                        is_dir = entry.is_dir()
                    except OSError:  # a symbolic link loop: a "file" here, reported by name when it is read
                        is_dir = False
                    if is_dir:
                        dirs.append(entry.name)
                    else:
                        files.append(entry.name)
    except (FileNotFoundError, NotADirectoryError):
        pass
    names = files.build()
    return sorted(dirs), names.take(names.argsort())


def _walk(top: Path, recursive: bool = True, skipped: Counter[str] | None = None) -> Iterator[tuple[str, str, str]]:
    """Yield (relative folder, file name, absolute path) for each visible image below ``top``; other files
    are counted by extension in ``skipped``.

    A folder reached again through a symbolic link (two links to one folder), or a link to a folder above
    ``top``, is not walked (again): a loop must not turn six images into hundreds of duplicates.
    """
    stack, seen, top_real = [""], set(), os.path.realpath(top)
    while stack:
        rel = stack.pop()
        folder = top / rel if rel else top
        real = os.path.realpath(folder)
        if real in seen or top_real.startswith(real.rstrip(os.sep) + os.sep):
            logger.warning("%s: skipped, it is a symbolic link to a folder already read or above it (%s)",
                           folder, real)
            continue
        seen.add(real)
        dirs, files = _scan(folder)
        prefix = f"{folder}{os.sep}"  # what :func:`_join` makes
        for name in files:
            if _is_image(name):
                _check_name(folder, name)
                yield rel, name, prefix + name
            elif skipped is not None:
                skipped[_split_ext(name)[1].lower()] += 1
        if recursive:
            stack.extend(f"{rel}/{d}" if rel else d for d in reversed(dirs))


def _check_name(folder: Path, name: str) -> None:
    """Refuse a file name that is not valid UTF-8: it could not be written to the manifest (JSON)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise DecodeError(f"file name {name!r} is not valid UTF-8", path=folder,
                          fix="rename the file (shardkit records every name in the manifest as UTF-8)") from None


def rel_path(root: Path, path: str | Path) -> str:
    """``path`` relative to ``root`` with POSIX separators (a string test, no stat); outside ``root``: whole."""
    text, prefix = str(path), str(root).rstrip(os.sep) + os.sep
    if text.startswith(prefix):
        return text[len(prefix):].replace(os.sep, "/")
    return Path(path).as_posix()


_PAIRED = "\0"  # marks a label extension in :func:`_match`'s index once an image claimed that label


def _match(root: Path, image_dir: Path, label_dir: Path, suffixes: tuple[str, ...], label_ext: str = "",
           image_tag: str = "", label_tag: str = "") -> _Found:
    """Pair images with labels in the same relative sub-folder whose stem is image stem + a suffix.

    ``image_tag`` is cut from image stems and ``label_tag`` keeps only labels ending in it (Cityscapes);
    ``label_ext`` (lower case) restricts label extensions when the user's suffix names one.
    """
    # "rel\0stem" -> the label's extension (interned: no object per label), _PAIRED + it once paired, or the
    # extensions of several labels with that stem (an error if an image matches them)
    labels: dict[str, str | list[str]] = {}
    skipped: Counter[str] = Counter()
    for rel, name, _ in _walk(label_dir, skipped=skipped if label_dir != image_dir else None):
        stem, ext = _split_ext(name)
        if stem.endswith(label_tag) and (not label_ext or ext.lower() == label_ext):
            k, ext = f"{rel}\0{stem}", sys.intern(ext)
            had = labels.get(k)
            labels[k] = ext if had is None else [*([had] if isinstance(had, str) else had), ext]

    def path_of(k: str, ext: str) -> str:
        rel, stem = k.split("\0")
        return _join(label_dir, rel, stem + ext.lstrip(_PAIRED))

    def exts(k: str) -> list[str]:
        v = labels[k]
        return [v] if isinstance(v, str) else v

    found = _Found(PairBuilder(root), skipped=skipped)
    for rel, name, path in _walk(image_dir, skipped=skipped):
        stem = _split_ext(name)[0]
        if image_tag and stem.endswith(image_tag):
            stem = stem[: -len(image_tag)]
        hits = [(k, e) for s in suffixes if (k := f"{rel}\0{stem}{s}") in labels for e in exts(k)]
        key = rel_path(root, path)
        if not hits:
            found.images.append(key)
            continue
        if len(hits) > 1:
            raise LayoutError(f"image {key} matches {len(hits)} labels: "
                              f"{', '.join(rel_path(root, path_of(*h)) for h in hits)}",
                              path=root, fix="remove the extra labels or choose one with --label-suffix")
        k, ext = hits[0]
        label = path_of(k, ext)
        if ext.startswith(_PAIRED):
            raise LayoutError(f"label {rel_path(root, label)} matches two images: "
                              f"{found.pairs.key_of_label(label)} and {key}",
                              path=root, fix="remove or rename one of the images (one image per stem)")
        labels[k] = sys.intern(_PAIRED + ext)
        found.pairs.add(key, path, label)
    found.labels = [rel_path(root, path_of(k, e)) for k in labels for e in exts(k) if not e.startswith(_PAIRED)]
    return found


def _join(top: Path, rel: str, name: str) -> str:
    """The path string of file ``name`` in sub-folder ``rel`` ("" for ``top`` itself), as :func:`_walk` makes it."""
    return f"{top / rel if rel else top}{os.sep}{name}"


def _content_lines(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, whitespace-separated fields) of each non-blank, non-``#`` line of a text file."""
    for number, line in enumerate(read_small_text(path, "list file", errors="replace").splitlines(), 1):
        text = line.strip()
        if text and not text.startswith("#"):
            yield number, text.split()


def _is_pair_list(path: Path) -> bool:
    """True when the first content line of ``path`` reads like ``image label``."""
    try:
        fields = next((f for _, f in _content_lines(path)), [])
    except OSError:  # a FIFO, device or huge file named *.txt is not a list file
        return False
    return len(fields) == 2 and all(_is_image(f) for f in fields)


class _Listings:
    """File names per folder under root, listed once each, for resolving list-file paths by tail."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._prefix = str(root).rstrip(os.sep)
        self._files: dict[str, frozenset[str]] = {}

    def resolve(self, raw: str) -> str | None:
        """The file under root matching the LONGEST tail of ``raw`` (a possibly foreign path)."""
        parts = [p for p in raw.replace("\\", "/").split("/") if p not in ("", ".")]
        if ".." in parts:  # never climb out of root: only tails after the last ".." are candidates
            parts = parts[len(parts) - parts[::-1].index(".."):]
        for start in range(len(parts)):
            folder = "/".join(parts[start:-1])
            if folder not in self._files:
                self._files[folder] = frozenset(_scan(self.root / folder)[1])
            if parts[-1] in self._files[folder]:
                return f"{self._prefix}/{'/'.join(parts[start:])}"  # Path() normalises '/' on Windows
        return None


def _read_pair_list(root: Path, listfile: Path, listings: _Listings) -> _Found:
    """Pairs named by a SegNet-style list file; an unresolvable or repeated line is an error."""
    found, seen = _Found(PairBuilder(root)), dict[str, int]()
    for number, fields in _content_lines(listfile):
        if len(fields) != 2:
            raise LayoutError(f"line {number}: expected 'image label', got {len(fields)} fields",
                              path=listfile, fix="write one 'IMAGE LABEL' pair per line")
        image, label = listings.resolve(fields[0]), listings.resolve(fields[1])
        if image is None or label is None:
            raw = fields[0] if image is None else fields[1]
            raise InputNotFoundError(f"line {number}: {raw} matches no file under {root}", path=listfile,
                                     fix="add the file or correct the line (paths match by their tail)")
        if image in seen:
            raise LayoutError(f"lines {seen[image]} and {number} both name image {rel_path(root, image)}",
                              path=listfile, fix="remove the duplicate line")
        seen[image] = number
        found.pairs.add(rel_path(root, image), image, label)
    return found


def _one(root: Path, stem: str, paths: list[str]) -> str | None:
    """The single file for ``stem``, None if none; two files for one stem is an error naming both."""
    if len(paths) > 1:
        raise LayoutError(f"stem {stem!r} has {len(paths)} files: {', '.join(rel_path(root, p) for p in paths)}",
                          path=root, fix="remove or rename all but one of them")
    return paths[0] if paths else None


def _voc_split(root: Path, index: Callable[[], _VocIndex], listfile: Path | None) -> _Found:
    """Pairs for the stems of one ImageSets file, or (``listfile`` None) every labelled image."""
    images, labels = index()
    found, seen = _Found(PairBuilder(root)), dict[str, int]()
    lines = _content_lines(listfile) if listfile else ((0, [s]) for s in sorted(labels))
    for number, fields in lines:
        stem = fields[0]
        if stem in seen:
            raise LayoutError(f"lines {seen[stem]} and {number} both name {stem!r}", path=listfile,
                              fix="remove the duplicate line")
        seen[stem] = number
        image, label = _one(root, stem, images.get(stem, [])), _one(root, stem, labels.get(stem, []))
        if image and label:
            found.pairs.add(rel_path(root, image), image, label)
        elif label:
            found.labels.append(rel_path(root, label))
        elif image:
            found.images.append(rel_path(root, image))
        else:
            raise InputNotFoundError(f"line {number}: no image or label named {stem!r}", path=listfile,
                                     fix="add it to JPEGImages/ and SegmentationClass/ or remove the line")
    return found


@dataclass(frozen=True)
class _Ctx:
    """The input root's top-level listing and the options every layout detector needs."""

    root: Path
    dirs: frozenset[str]
    files: tuple[str, ...]
    label_suffix: str | None

    def pairs(self, images: Path, labels: Path, default: tuple[str, ...] = LABEL_SUFFIXES) -> _Job:
        """A job matching ``images`` to ``labels`` with the user's ``--label-suffix`` or ``default``."""
        if self.label_suffix is None:
            return functools.partial(_match, self.root, images, labels, default)
        stem, ext = _split_ext(self.label_suffix)
        if ext.lower() in IMAGE_EXTENSIONS:
            return functools.partial(_match, self.root, images, labels, (stem,), ext.lower())
        return functools.partial(_match, self.root, images, labels, (self.label_suffix,))


def _segnet(ctx: _Ctx) -> dict[str, _Job]:
    r = ctx.root
    return {d: ctx.pairs(r / d, r / f"{d}annot", ("",)) for d in ctx.dirs if f"{d}annot" in ctx.dirs}


def _class_dict(ctx: _Ctx) -> dict[str, _Job]:
    r = ctx.root
    return {d: ctx.pairs(r / d, r / f"{d}_labels") for d in ctx.dirs if f"{d}_labels" in ctx.dirs}


def _cityscapes(ctx: _Ctx) -> dict[str, _Job]:
    if not {"leftImg8bit", "gtFine"} <= ctx.dirs:
        return {}
    r = ctx.root
    return {s: functools.partial(_match, r, r / "leftImg8bit" / s, r / "gtFine" / s, ("_gtFine_labelIds",),
                                 image_tag="_leftImg8bit", label_tag="_gtFine_labelIds")
            for s in _scan(r / "leftImg8bit")[0]}


def _generic(ctx: _Ctx) -> dict[str, _Job]:
    label_dirs = [d for d in ("annotations", "labels", "masks") if d in ctx.dirs]
    if "images" not in ctx.dirs or not label_dirs:
        return {}
    if len(label_dirs) > 1:
        logger.warning("%s: labels from %s/, ignoring %s", ctx.root, label_dirs[0], ", ".join(label_dirs[1:]))
    images, labels = ctx.root / "images", ctx.root / label_dirs[0]
    subdirs, files = _scan(images)
    if any(_is_image(f) for f in files):
        return {"all": ctx.pairs(images, labels)}
    return {s: ctx.pairs(images / s, labels / s) for s in subdirs}


def _find_voc(root: Path) -> Path | None:
    """The VOC folder (holding JPEGImages/ + SegmentationClass/): root, root/VOC*, or root/VOC*/VOC*."""
    level = [root]
    for _ in range(3):
        hits = [d for d in level if (d / "JPEGImages").is_dir() and (d / "SegmentationClass").is_dir()]
        if len(hits) > 1:
            raise LayoutError(f"several VOC folders: {', '.join(rel_path(root, h) for h in hits)}", path=root,
                              fix="point the input at one of them")
        if hits:
            return hits[0]
        level = [d / n for d in level for n in _scan(d)[0] if n.upper().startswith("VOC")]
    return None


def _voc(ctx: _Ctx) -> dict[str, _Job]:
    base = _find_voc(ctx.root)
    if base is None:
        return {}

    @functools.cache
    def index() -> _VocIndex:  # files by stem, as lists so that duplicate stems can be reported
        found: _VocIndex = ({}, {})
        for table, folder in zip(found, ("JPEGImages", "SegmentationClass"), strict=True):
            for _, name, path in _walk(base / folder, recursive=False):
                table.setdefault(_split_ext(name)[0], []).append(path)
        return found

    sets = base / "ImageSets" / "Segmentation"
    lists = [n for n in _scan(sets)[1] if n.lower().endswith(".txt")]
    if not lists:
        return {"all": functools.partial(_voc_split, ctx.root, index, None)}
    return {n[:-4]: functools.partial(_voc_split, ctx.root, index, sets / n) for n in lists}


def _listfile(ctx: _Ctx) -> dict[str, _Job]:
    listings = _Listings(ctx.root)
    return {n[:-4]: functools.partial(_read_pair_list, ctx.root, ctx.root / n, listings) for n in ctx.files
            if n.lower().endswith(".txt") and _is_pair_list(ctx.root / n)}


_DETECTORS: dict[str, Callable[[_Ctx], dict[str, _Job]]] = {
    "cityscapes": _cityscapes, "voc": _voc, "generic": _generic,
    "class_dict": _class_dict, "segnet": _segnet, "listfile": _listfile,
}


def _check_lists_agree(ctx: _Ctx, folders: dict[str, _Job], results: dict[str, PairTable]) -> None:
    """Folders win over list files only when every list file names exactly its folders' pairs."""
    fix = "choose one with --layout segnet (folders) or --layout listfile (list files)"
    for split, job in sorted(_listfile(ctx).items()):
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
            parts.append(f"{len(names)} {what} (first: {', '.join(names[:_SHOW])})")
    if parts and strict:
        raise LayoutError("; ".join(parts), path=root, fix="add the missing files or drop --strict")
    if parts:
        logger.warning("%s: %s", root, "; ".join(parts))


def discover(root: Path, *, layout: str = "auto", label_suffix: str | None = None,
             splits: tuple[str, ...] = (), strict: bool = False) -> Discovery:
    """Find the layout of ``root`` (or use the one forced) and pair its images and labels per split."""
    if layout != "auto" and layout not in _DETECTORS:
        raise ConfigError(f"layout {layout!r} is not one of auto, {', '.join(LAYOUTS)}")
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        what = "input is not a folder" if root.exists() else "input folder does not exist"
        raise InputNotFoundError(what, path=root, fix="point the input at the dataset folder")
    dirs, files = _scan(root)
    ctx = _Ctx(root, frozenset(dirs), tuple(files), label_suffix)
    expected = "; ".join(f"{k}: {v}" for k, v in EXPECTED.items())
    if not dirs and not files:
        raise LayoutError("input folder is empty", path=root, fix=f"point the input at a dataset: {expected}")
    auto = layout == "auto"
    if auto:
        found = {name: jobs for name in LAYOUTS if (jobs := _DETECTORS[name](ctx))}
        if not found:
            raise LayoutError(f"no known dataset layout (tried {', '.join(LAYOUTS)})", path=root,
                              fix=f"pass --layout NAME or arrange the folder as one of: {expected}")
        layout, jobs = next(iter(found.items()))
        others = [n for n in found if n != layout and not (layout == "segnet" and n == "listfile")]
        if others:
            logger.warning("%s: using layout %s; it also looks like %s (pass --layout to choose)",
                           root, layout, ", ".join(others))
    else:
        jobs = _DETECTORS[layout](ctx)
        if not jobs:
            raise LayoutError(f"layout {layout} forced but not found (tried {layout})", path=root,
                              fix=f"expected {EXPECTED[layout]}, or pass another --layout")
    unknown = [s for s in splits if s not in jobs]
    if unknown:
        raise ConfigError(f"unknown split {', '.join(unknown)} in {root}",
                          fix=f"choose --splits from the available ones: {', '.join(sorted(jobs))}")
    if label_suffix is not None and layout in ("cityscapes", "voc"):
        logger.warning("label suffix %r is ignored by the %s layout", label_suffix, layout)
    results = {s: jobs[s]() for s in sorted(splits or jobs)}
    tables = {s: r.pairs.build() for s, r in results.items()}
    if auto and layout == "segnet":
        _check_lists_agree(ctx, jobs, tables)
    class_dict = next((root / f for f in files if f.lower() in CLASS_DICT_NAMES), None)
    kind = {"segnet": "ids", "class_dict": "colour", "cityscapes": "cityscapes", "voc": "palette"}.get(
        layout, "colour" if class_dict else "ids")
    images = {s: tuple(sorted(r.images)) for s, r in results.items() if r.images}
    labels = {s: tuple(sorted(r.labels)) for s, r in results.items() if r.labels}
    _check_unmatched(root, images, labels, strict)
    skipped = dict(sum((r.skipped for r in results.values()), Counter()))
    if skipped:
        logger.warning("%s: skipped, not a file type shardkit reads: %s", root, file_types(skipped))
    pairs = {s: t for s, t in tables.items() if len(t)}
    if not pairs:
        raise LayoutError(f"layout {layout} found no image/label pairs in split(s) {', '.join(results)}",
                          path=root, fix=f"expected {EXPECTED[layout]} with matching names, or pass --layout")
    for s in sorted(set(results) - set(pairs)):
        logger.warning("%s: split %s has no image/label pairs; skipped", root, s)
    result = Discovery(layout, root, pairs, kind, class_dict, images, labels, skipped)
    logger.info("%s: layout %s, %d pairs in %d splits", root, layout, result.total(), len(pairs))
    return result
