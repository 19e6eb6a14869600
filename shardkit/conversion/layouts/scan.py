"""Folder listings and pairing: the shared tools every input layout uses to find image/label pairs.

Only folder listings are read (one ``os.scandir`` per folder, dict lookups by stem, no decoding), so
100k files take about a second; pairs sorted by key and splits by name keep the plan deterministic.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import DecodeError, InputNotFoundError, LayoutError
from ...support.columns import ColumnBuilder, StringColumn
from ...support.smallfile import read_small_text
from ..pairs import PairBuilder

logger = logging.getLogger(__name__)

#: Extensions of the files discovery treats as images or labels (whether a decoder takes each is the
#: reader's business: a type it refuses is named there, never silently dropped here).
IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".gif", ".ppm",
                              ".pgm", ".pbm", ".pnm", ".npy", ".jp2", ".j2k", ".j2c"})  # .npy: (H, W[, C]) arrays
#: Extensions a label may have: an image's, but not .npy (no label decoder reads arrays; labelme2voc writes
#: SegmentationClass/*.npy beside its label PNGs) nor JPEG 2000 (read as images only).
LABEL_EXTENSIONS = IMAGE_EXTENSIONS - {".npy", ".jp2", ".j2k", ".j2c"}
#: Label name = image stem + one of these (tried in this order; more than one hit is an error).
LABEL_SUFFIXES: tuple[str, ...] = ("_L", "_color_mask", "_mask", "_label", "_labels", "")
#: The usual endings of label stems and image stems around a shared name part (``21_training.tif`` ↔
#: ``21_manual1.gif``, ``00000_img.jpg`` ↔ ``00000_gt.png``): pairs are made on the part left after cutting
#: one of them, when that part names exactly one image and one label.
LABEL_TAGS: tuple[str, ...] = ("_color_mask", "_segmentation", "_labelTrainIds", "_labelIds", "_manual1",
                               "_manual", "_labels", "_label", "_mask", "_annot", "_anno", "_seg", "_gt", "_L",
                               "-mask", "-label", "-gt")
IMAGE_TAGS: tuple[str, ...] = ("_leftImg8bit", "_training", "_train", "_test", "_val", "_image", "_img",
                               "_rgb", "_sat", "-image", "-img")
SHOW = 5


@dataclass
class Found:
    """One split's raw matching result, before sorting and reporting."""

    pairs: PairBuilder
    images: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)  # other file types met, by extension


Job = Callable[[], Found]


#: Files discovery meets but does not read, by extension, and what would read them: said beside their count, so
#: a skipped type is never just a number. Worded to hold whatever annotation sources a version has (its --help
#: lists them).
UNREAD_TYPES: dict[str, str] = {
    **dict.fromkeys((".nii.gz", ".nii", ".nrrd"),
                    "3-D volumes are read in nnU-Net/MSD and per-case-folder trees only (docs/volumes.md)"),
    **dict.fromkeys((".mha", ".mhd", ".dcm", ".img", ".hdr"),
                    "MetaImage, DICOM and Analyze volumes are not read yet (#38): save them as NIfTI or NRRD"),
    ".json": "annotation files (COCO, labelme …) are not mask images; `shardkit convert --help` lists the "
             "annotation sources this version reads",
    ".xml": "annotation files (CVAT, VOC boxes) are not mask images; `shardkit convert --help` lists the "
            "annotation sources this version reads",
    ".txt": "text files (split lists, YOLO boxes, attributes) are not images; pass a split list with --split-list",
    ".csv": "tables are not images; a class table is passed with --classes",
    ".mat": "MATLAB files are not read: save the mask as PNG",
    ".npz": "numpy archives are not read: save each array as .npy (images) or PNG (labels)",
    **dict.fromkeys((".heic", ".heif", ".avif", ".jxl"), "this image type is not read: re-export as PNG or JPEG"),
    **dict.fromkeys((".zip", ".tar", ".tar.gz", ".tgz", ".7z", ".rar"),
                    "archives are not opened: unpack them into the input folder"),
}
_COMPOUND = (".nii.gz", ".tar.gz")


def file_ext(name: str) -> str:
    """A file's extension in lower case as :data:`UNREAD_TYPES` names it (``.nii.gz`` whole)."""
    lower = name.lower()
    return next((c for c in _COMPOUND if lower.endswith(c) and len(lower) > len(c)), split_ext(lower)[1])


def file_types(counts: dict[str, int]) -> str:
    """``{".npy": 3, ".json": 1}`` → ``"3 .npy, 1 .json (annotation files …)"`` (most first; with what would read
    each type :data:`UNREAD_TYPES` knows)."""
    def one(ext: str, n: int) -> str:
        reason = UNREAD_TYPES.get(ext)
        return f"{n} {ext or '(no extension)'}" + (f" ({reason})" if reason else "")
    return ", ".join(one(ext, n) for ext, n in sorted(counts.items(), key=lambda e: (-e[1], e[0])))


def split_ext(name: str) -> tuple[str, str]:
    """``"a.b.PNG"`` → ``("a.b", ".PNG")``; cheaper than building a Path per file."""
    dot = name.rfind(".")
    return (name[:dot], name[dot:]) if dot > 0 else (name, "")


def is_image(name: str) -> bool:
    return split_ext(name)[1].lower() in IMAGE_EXTENSIONS


def scan(folder: Path) -> tuple[list[str], StringColumn]:
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


def subdirs(folder: Path) -> list[str]:
    """Sorted visible sub-folder names of ``folder`` (no file names kept: cheap on a folder of 100k files)."""
    out = []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                try:
                    if not entry.name.startswith(".") and entry.is_dir():
                        out.append(entry.name)
                except OSError:
                    continue
    except (FileNotFoundError, NotADirectoryError):
        pass
    return sorted(out)


def any_image(folder: Path, labels: bool = False) -> bool:
    """Whether ``folder`` holds an image file directly (stops at the first); ``labels``: a file a label may be."""
    try:
        with os.scandir(folder) as it:
            return any(not e.name.startswith(".") and is_image(e.name)
                       and (not labels or Path(e.name).suffix.lower() in LABEL_EXTENSIONS) for e in it)
    except (FileNotFoundError, NotADirectoryError):
        return False


def walk(top: Path, recursive: bool = True, skipped: Counter[str] | None = None, *,
         root: Path | None = None, accept: Callable[[str], bool] | None = None,
         folders: bool = False) -> Iterator[tuple[str, str, str]]:
    """Yield (relative folder, file name, absolute path) for each visible image below ``top`` (``accept``: each
    file whose name it accepts; ``folders``: each folder too, its name ending in ``/``); other files are counted
    by extension in ``skipped``.

    A folder reached again through a symbolic link (two links to one folder), or a link to a folder above
    ``top``, is not walked (again): a loop must not turn six images into hundreds of duplicates. A folder that
    resolves outside the input folder ``root`` (default ``top``) — a link to ``/usr/share``, ``/sys`` or another
    dataset, ``top`` itself included — is not walked either (a warning names it): what a conversion reads stays
    inside the folder it was given. Links to *files* are followed wherever they point (a symlink farm); the file
    is then checked like any other (regular file, size) when it is read.
    """
    stack, seen, top_real = [""], set(), os.path.realpath(top)
    inside = os.path.realpath(root if root is not None else top)
    while stack:
        rel = stack.pop()
        folder = top / rel if rel else top
        real = os.path.realpath(folder)
        if real in seen or top_real.startswith(real.rstrip(os.sep) + os.sep):
            logger.warning("%s: skipped, it is a symbolic link to a folder already read or above it (%s)",
                           folder, real)
            continue
        if real != inside and not real.startswith(inside.rstrip(os.sep) + os.sep):
            logger.warning("%s: not read, it is a symbolic link to %s, outside the input folder %s (shardkit follows "
                           "no folder link out of the input) — fix: to convert what it holds, move or copy it into "
                           "the input folder (or bind-mount it there), or convert it as an input of its own",
                           folder, real, inside, extra={"event": "link_outside", "path": str(folder),
                                                        "target": real})
            continue
        seen.add(real)
        dirs, files = scan(folder)
        prefix = f"{folder}{os.sep}"  # what :func:`join` makes
        if folders:
            for d in dirs:
                yield rel, d + "/", prefix + d
        for name in files:
            if (accept or is_image)(name):
                _check_name(folder, name)
                yield rel, name, prefix + name
            elif skipped is not None:
                skipped[file_ext(name)] += 1
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


_PAIRED = "\0"  # marks a label extension in :func:`match_pairs`'s index once an image claimed that label


def match_pairs(root: Path, image_dir: Path, label_dir: Path, suffixes: tuple[str, ...], label_ext: str = "",
                image_tag: str = "", label_tag: str = "", shared_part: bool = False) -> Found:
    """Pair images with labels in the same relative sub-folder whose stem is image stem + a suffix.

    ``image_tag`` is cut from image stems and ``label_tag`` keeps only labels ending in it (Cityscapes);
    ``label_ext`` (lower case) restricts label extensions when the user's suffix names one. With
    ``shared_part``, the images and labels left over are then paired by their shared name part
    (:func:`shared_part_pairs`).
    """
    # "rel\0stem" -> the label's extension (interned: no object per label), _PAIRED + it once paired, or the
    # extensions of several labels with that stem (an error if an image matches them)
    labels: dict[str, str | list[str]] = {}
    skipped: Counter[str] = Counter()
    for rel, name, _ in walk(label_dir, skipped=skipped if label_dir != image_dir else None, root=root):
        stem, ext = split_ext(name)
        if stem.endswith(label_tag) and (not label_ext or ext.lower() == label_ext):
            k, ext = f"{rel}\0{stem}", sys.intern(ext)
            had = labels.get(k)
            labels[k] = ext if had is None else [*([had] if isinstance(had, str) else had), ext]

    def path_of(k: str, ext: str) -> str:
        rel, stem = k.split("\0")
        return join(label_dir, rel, stem + ext.lstrip(_PAIRED))

    def exts(k: str) -> list[str]:
        v = labels[k]
        return [v] if isinstance(v, str) else v

    found = Found(PairBuilder(root), skipped=skipped)
    loose: list[tuple[str, str, str]] = []  # (rel, stem, path) of each image without a label so far
    for rel, name, path in walk(image_dir, skipped=skipped, root=root):
        stem = split_ext(name)[0]
        if image_tag and stem.endswith(image_tag):
            stem = stem[: -len(image_tag)]
        hits = [(k, e) for s in suffixes if (k := f"{rel}\0{stem}{s}") in labels for e in exts(k)]
        key = rel_path(root, path)
        if not hits:
            loose.append((rel, stem, path))
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
    left = [(k, e) for k in labels for e in exts(k) if not e.startswith(_PAIRED)]
    if shared_part and loose and left:
        paired = shared_part_pairs([(r, s) for r, s, _ in loose], [_rel_stem(k) for k, _ in left])
        for i, j in paired:
            found.pairs.add(rel_path(root, loose[i][2]), loose[i][2], path_of(*left[j]))
        taken_images, taken_labels = {i for i, _ in paired}, {j for _, j in paired}
        loose = [x for i, x in enumerate(loose) if i not in taken_images]
        left = [x for j, x in enumerate(left) if j not in taken_labels]
    found.images = [rel_path(root, path) for _, _, path in loose]
    found.labels = [rel_path(root, path_of(k, e)) for k, e in left]
    return found


def _rel_stem(k: str) -> tuple[str, str]:
    rel, _, stem = k.partition("\0")
    return rel, stem


def _cut(stem: str, tags: tuple[str, ...]) -> str:
    """``stem`` without the first of ``tags`` it ends with (case-insensitive), or ``stem`` itself."""
    low = stem.lower()
    for tag in tags:
        if low.endswith(tag.lower()) and len(stem) > len(tag):
            return stem[: -len(tag)]
    return stem


def shared_part_pairs(images: list[tuple[str, str]], labels: list[tuple[str, str]]) -> list[tuple[int, int]]:
    """Pairs (image index, label index) of (folder, stem) entries whose stems share a name part.

    The part is what is left after cutting one usual image ending (:data:`IMAGE_TAGS`: ``21_training`` → ``21``)
    and one usual label ending (:data:`LABEL_TAGS`: ``21_manual1`` → ``21``); a part named by more than one image
    or more than one label pairs nothing (never a guess between two files).
    """
    def index(entries: list[tuple[str, str]], tags: tuple[str, ...]) -> dict[tuple[str, str], list[int]]:
        out: dict[tuple[str, str], list[int]] = {}
        for i, (rel, stem) in enumerate(entries):
            out.setdefault((rel, _cut(stem, tags)), []).append(i)
        return out

    by_image, by_label = index(images, IMAGE_TAGS), index(labels, LABEL_TAGS)
    return sorted((i[0], j[0]) for part, i in by_image.items() if len(i) == 1
                  and len(j := by_label.get(part, [])) == 1)


def join(top: Path, rel: str, name: str) -> str:
    """The path string of file ``name`` in sub-folder ``rel`` ("" for ``top`` itself), as :func:`walk` makes it."""
    return f"{top / rel if rel else top}{os.sep}{name}"


def content_lines(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, whitespace-separated fields) of each non-blank, non-``#`` line of a text file."""
    for number, line in enumerate(read_small_text(path, "list file", errors="replace").splitlines(), 1):
        text = line.strip()
        if text and not text.startswith("#"):
            yield number, text.split()


def is_pair_list(path: Path) -> bool:
    """True when the first content line of ``path`` reads like ``image label``."""
    try:
        fields = next((f for _, f in content_lines(path)), [])
    except OSError:  # a FIFO, device or huge file named *.txt is not a list file
        return False
    return len(fields) == 2 and all(is_image(f) for f in fields)


class Listings:
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
                self._files[folder] = frozenset(scan(self.root / folder)[1])
            if parts[-1] in self._files[folder]:
                return f"{self._prefix}/{'/'.join(parts[start:])}"  # Path() normalises '/' on Windows
        return None


def read_pair_list(root: Path, listfile: Path, listings: Listings) -> Found:
    """Pairs named by a SegNet-style list file; an unresolvable or repeated line is an error."""
    found, seen = Found(PairBuilder(root)), dict[str, int]()
    for number, fields in content_lines(listfile):
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


def one_file(root: Path, stem: str, paths: list[str]) -> str | None:
    """The single file for ``stem``, None if none; two files for one stem is an error naming both."""
    if len(paths) > 1:
        raise LayoutError(f"stem {stem!r} has {len(paths)} files: {', '.join(rel_path(root, p) for p in paths)}",
                          path=root, fix="remove or rename all but one of them")
    return paths[0] if paths else None


