"""ADE20K's full-release label encoding: ``<image>_seg.png`` is RGB where the object class is
``(R / 10) * 256 + G`` (R divided by 10 and truncated, as the release's ``utils_ade20k.loadAde20K`` computes it)
and B numbers the instances. Class 0 is unlabelled. The instances are not read: a segmentation label is the class.

The class names: the 2021 release's per-image ``<image>.json`` lists each annotated object
(``annotation.object[]``) with its ``name`` and ``name_ndx``, the object index its ``_seg.png`` pixels hold
(whole objects, ``parts.part_level`` 0; parts are in the ``_parts_N.png`` files, not read). :func:`object_names`
reads them; the release's ``index_ade20k.pkl`` is a pickle and is never read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import LabelError
from ..support.smallfile import loads_bounded, read_guarded
from .classes import MAX_CLASSES, ClassInfo, ClassTable

#: The label file name ending the full release gives every image's class/instance mask.
SEG_SUFFIX = "_seg.png"


def ade20k_class_ids(raw: np.ndarray, path: Path) -> np.ndarray:
    """Class ids (uint16, (H, W)) of a ``_seg.png``'s pixels in OpenCV's BGR(A) order (as
    :func:`~shardkit.images.imageio.decode_label_pixels` gives them); a file that is not 8-bit RGB is refused."""
    if raw.ndim != 3 or raw.shape[2] < 3 or raw.dtype != np.uint8:
        shape = "x".join(map(str, raw.shape))
        raise LabelError(f"ADE20K _seg.png label is {shape} {raw.dtype}, not 8-bit RGB (class = R/10*256 + G)",
                         path=path, fix="point the input at the full release's *_seg.png files, or pass "
                                        "--layout to read the labels as another kind")
    red, green = raw[:, :, 2], raw[:, :, 1]
    return (red // 10).astype(np.uint16) * 256 + green


#: Largest per-image JSON read (the 2021 release's are tens of KiB; one of many thousands of polygons stays far
#: below): a bigger file is refused before it is read.
MAX_JSON_BYTES = 32 << 20
UNLABELLED = "unlabelled"


def _bad(path: Path, problem: str) -> LabelError:
    return LabelError(f"ADE20K per-image JSON: {problem}", path=path,
                      fix="use the release's own .json files (or pass --classes FILE / --num-classes N)")


def object_names(path: Path) -> dict[int, str]:
    """``name_ndx`` → ``name`` of the whole objects (``parts.part_level`` 0) a per-image ``.json`` lists, read
    size-capped with bounded nesting; anything else in the file is not looked at."""
    try:
        doc: Any = loads_bounded(read_guarded(path, "ADE20K per-image JSON", limit=MAX_JSON_BYTES),
                                 "ADE20K per-image JSON")
    except (OSError, ValueError) as exc:
        raise _bad(path, str(exc)) from None
    objects = doc.get("annotation", {}).get("object") if isinstance(doc, dict) else None
    if not isinstance(objects, list):
        raise _bad(path, "no annotation.object list")
    names: dict[int, str] = {}
    for i, obj in enumerate(objects):
        if not isinstance(obj, dict):
            raise _bad(path, f"object {i} is not an object")
        parts = obj.get("parts")
        level = parts.get("part_level", 0) if isinstance(parts, dict) else 0
        if level != 0:
            continue
        ndx, name = obj.get("name_ndx"), obj.get("name")
        if isinstance(ndx, bool) or not isinstance(ndx, int) or not 0 < ndx < MAX_CLASSES or \
                not isinstance(name, str) or not name.strip():
            raise _bad(path, f"object {i} has name_ndx {ndx!r} / name {name!r}, not an index 1..{MAX_CLASSES - 1} "
                             "and a name")
        if names.setdefault(ndx, name) != name:
            raise _bad(path, f"name_ndx {ndx} is named both {names[ndx]!r} and {name!r}")
    return names


def names_table(files: list[Path]) -> tuple[ClassTable, str] | None:
    """The class table the per-image JSONs name (ids 0..the largest ``name_ndx``; 0 unlabelled; an id no file
    names is ``class_<id>``) and the reason, or None when there is none. One index named two ways in two files
    is refused naming both."""
    named: dict[int, tuple[str, Path]] = {}
    for path in files:
        for ndx, name in object_names(path).items():
            first = named.setdefault(ndx, (name, path))
            if first[0] != name:
                raise LabelError(f"ADE20K object index {ndx} is {first[0]!r} in {first[1]} but {name!r} here",
                                 path=path, fix="use one release's .json files (or pass --classes FILE)")
    if not named:
        return None
    top = max(named)
    classes = [ClassInfo(0, UNLABELLED), *(ClassInfo(i, named[i][0] if i in named else f"class_{i}")
                                           for i in range(1, top + 1))]
    reason = (f"the names of {len(named)} ADE20K object indices in {len(files)} per-image .json file(s) "
              f"(name_ndx = the _seg.png class; ids 0..{top}, 0 {UNLABELLED!r}, an index no file names class_<id>)")
    return ClassTable(tuple(classes), None, source="ade20k-json"), reason
