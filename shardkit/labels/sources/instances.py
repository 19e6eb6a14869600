"""Per-instance mask folders (microscopy; Kaggle Data Science Bowl 2018 / BBBC038): one folder per image,
``<id>/images/<id>.png`` beside ``<id>/masks/*.png``, each mask one object (nonzero pixels), found at the input
root or one split folder below it (``stage1_train/<id>/…`` → split ``stage1_train``).

Classes: every mask is one ``object`` (background 0, object 1: the union of the instances) — or, where
``masks/`` holds sub-folders, one class per sub-folder name (sorted), each mask in it an object of that class.
Masks are painted in file-name order (they are not meant to overlap; overlaps are counted in the report). A
mask must be two-valued (0 and one other value) and the image's size: anything else is refused in one line.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ...errors import LabelError
from ...images.imageio import check_pixels, decode_image, regular_stat
from ...support.limits import MAX_PIXELS
from ..classes import ClassInfo, ClassTable
from ..raster import Region
from .base import Annotations, AnnotationSource, ObjectShapes, SampleShapes, file_stamp, sorted_unique

MASK_EXTS = (".png", ".tif", ".tiff", ".bmp")
IGNORE = 255


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in MASK_EXTS and p.is_file()
                  and not p.is_symlink())


def _is_sample(folder: Path) -> bool:
    images, masks = folder / "images", folder / "masks"
    return images.is_dir() and masks.is_dir() and len(_files(images)) == 1


def _sample_dirs(root: Path) -> dict[str, list[Path]]:
    """split → its sample folders: the root's own sub-folders (split ``all``), or one split level below."""
    subs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    here = [p for p in subs if _is_sample(p)]
    if here:
        return {"all": here}
    out = {}
    for split in subs:
        found = [p for p in sorted(split.iterdir()) if p.is_dir() and _is_sample(p)]
        if found:
            out[split.name] = found
    return out


class InstanceMasksSource(AnnotationSource):
    name = "instance-masks"
    expected = "<id>/images/<id>.png + <id>/masks/*.png (one binary mask per object), at the root or in <split>/"
    overlap = "order"
    crowd = "class"
    overlaps = ("order", "area", "ignore")
    tool_rule = "each mask one object, painted in file-name order (masks are not meant to overlap)"

    def detect(self, root: Path) -> Path | None:
        return root if _sample_dirs(root) else None

    def read(self, root: Path, where: Path) -> Annotations:
        splits = _sample_dirs(where)
        if not splits:
            raise LabelError("no <id>/images/ + <id>/masks/ folders here", path=where,
                             fix="point the input at the folder of per-image folders")
        class_dirs = sorted({d.name for folders in splits.values() for f in folders
                             for d in (f / "masks").iterdir() if d.is_dir()})
        names = ["background", *(class_dirs or ["object"])]
        stored = {n: i for i, n in enumerate(names)}
        digest = hashlib.sha256()
        out: dict[str, tuple[tuple[Path, SampleShapes], ...]] = {}
        for split, folders in splits.items():
            samples = []
            for folder in folders:
                (image,) = _files(folder / "images")
                masks = [(m, "object") for m in _files(folder / "masks")] + [
                    (m, d) for d in class_dirs if (folder / "masks" / d).is_dir()
                    for m in _files(folder / "masks" / d)]
                objects = []
                for m, cls in masks:
                    digest.update(f"{m.relative_to(where).as_posix()}\0{file_stamp(m, 'mask')}\0".encode())
                    objects.append(ObjectShapes(m.relative_to(folder).as_posix(), stored[cls], "maskfile",
                                                (str(m),)))
                if not image.resolve().is_relative_to(root.resolve()):
                    raise LabelError(f"image {image.name} is outside the input folder {root}", path=folder,
                                     fix="point the input at the folder that holds the per-image folders")
                key = image.resolve().relative_to(root.resolve()).as_posix()
                h, w = _size(image)
                samples.append((image.resolve(), SampleShapes(key, h, w, tuple(objects))))
            out[split] = sorted_unique(samples, where)
        origin = ("the masks/ sub-folder names (sorted, 0 = background)" if class_dirs
                  else "instance masks (0 = background, 1 = object: the union of the masks)")
        table = ClassTable(tuple(ClassInfo(i, n) for i, n in enumerate(names)), IGNORE, source="instance masks")
        original: list[int | str | None] = [None, *class_dirs] if class_dirs else [None, None]
        return Annotations(self.name, root, (where,), table, tuple(original), out, origin, digest.hexdigest())

    def region(self, obj: ObjectShapes, h: int, w: int) -> tuple[Region, bool, bool]:
        path = Path(obj.data[0])
        regular_stat(path, "mask")
        check_pixels(path, MAX_PIXELS, "mask")
        mask = decode_image(path)
        if mask.shape[:2] != (h, w):
            raise LabelError(f"mask is {mask.shape[0]}x{mask.shape[1]} (HxW) but its image is {h}x{w}", path=path,
                             fix="re-export the mask at the image size")
        values = np.unique(mask)
        if values.size > 2 or (values.size == 2 and values[0] != 0):
            raise LabelError(f"mask has {values.size} values ({', '.join(map(str, values[:5].tolist()))}…), not "
                             "0 and one object value", path=path, fix="export binary masks (0 = background)")
        region = Region.of(np.any(mask != 0, axis=2) if mask.ndim == 3 else mask != 0)
        return region, False, not region.mask.size


def _size(image: Path) -> tuple[int, int]:
    """An image's (height, width) from its header."""
    header = check_pixels(image, MAX_PIXELS, "image")
    return int(header.height), int(header.width)


SOURCE = InstanceMasksSource
