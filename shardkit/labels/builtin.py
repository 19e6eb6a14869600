"""Built-in class tables: CamVid (SegNet), PASCAL VOC, Cityscapes (trainIds and labelIds)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .classes import ClassInfo, ClassTable, Colour


def _table(
    names: Sequence[str],
    colours: Sequence[Colour | None],
    ignore: int | None,
    source: str,
    remap: tuple[int, ...] | None = None,
) -> ClassTable:
    classes = tuple(ClassInfo(i, n, c) for i, (n, c) in enumerate(zip(names, colours, strict=True)))
    return ClassTable(classes, ignore, remap=remap, source=source)


def with_palette_colours(table: ClassTable, palette: Sequence[Sequence[int]] | None) -> ClassTable:
    """``table`` with the label files' own palette as its class colours (for ``show``), when it has none:
    class ``k`` gets palette entry ``k``. Ids, names and the ignore id are unchanged."""
    if not palette or any(c.colour is not None for c in table.classes):
        return table
    classes = tuple(ClassInfo(c.id, c.name, tuple(palette[c.id]) if c.id < len(palette) else None)  # type: ignore[arg-type]
                    for c in table.classes)
    return dataclasses.replace(table, classes=classes)


def voc_colormap(n: int = 256) -> np.ndarray:
    """The standard PASCAL VOC colormap, ``(n, 3)`` uint8 RGB (index 255 is the void colour 224,224,192)."""
    cmap = np.zeros((n, 3), dtype=np.uint8)
    for i in range(n):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        cmap[i] = (r, g, b)
    return cmap


_VOC_CMAP = voc_colormap()

CAMVID_SEGNET: ClassTable = _table(
    [
        "Sky",
        "Building",
        "Pole",
        "Road",
        "Pavement",
        "Tree",
        "SignSymbol",
        "Fence",
        "Car",
        "Pedestrian",
        "Bicyclist",
        "Unlabelled",
    ],
    [
        (128, 128, 128),
        (128, 0, 0),
        (192, 192, 128),
        (128, 64, 128),
        (60, 40, 222),
        (128, 128, 0),
        (192, 128, 128),
        (64, 64, 128),
        (64, 0, 128),
        (64, 64, 0),
        (0, 128, 192),
        (0, 0, 0),
    ],
    11,
    "builtin:camvid-segnet",
)

VOC: ClassTable = _table(
    [
        "background",
        "aeroplane",
        "bicycle",
        "bird",
        "boat",
        "bottle",
        "bus",
        "car",
        "cat",
        "chair",
        "cow",
        "diningtable",
        "dog",
        "horse",
        "motorbike",
        "person",
        "pottedplant",
        "sheep",
        "sofa",
        "train",
        "tvmonitor",
    ],
    [tuple(int(v) for v in _VOC_CMAP[i]) for i in range(21)],  # type: ignore[misc]
    255,
    "builtin:voc",
)

# Official Cityscapes labels (cityscapesScripts labels.py): labelId, name, trainId, colour.
_CITYSCAPES_LABELS: tuple[tuple[int, str, int, Colour], ...] = (
    (0, "unlabeled", 255, (0, 0, 0)),
    (1, "ego vehicle", 255, (0, 0, 0)),
    (2, "rectification border", 255, (0, 0, 0)),
    (3, "out of roi", 255, (0, 0, 0)),
    (4, "static", 255, (0, 0, 0)),
    (5, "dynamic", 255, (111, 74, 0)),
    (6, "ground", 255, (81, 0, 81)),
    (7, "road", 0, (128, 64, 128)),
    (8, "sidewalk", 1, (244, 35, 232)),
    (9, "parking", 255, (250, 170, 160)),
    (10, "rail track", 255, (230, 150, 140)),
    (11, "building", 2, (70, 70, 70)),
    (12, "wall", 3, (102, 102, 156)),
    (13, "fence", 4, (190, 153, 153)),
    (14, "guard rail", 255, (180, 165, 180)),
    (15, "bridge", 255, (150, 100, 100)),
    (16, "tunnel", 255, (150, 120, 90)),
    (17, "pole", 5, (153, 153, 153)),
    (18, "polegroup", 255, (153, 153, 153)),
    (19, "traffic light", 6, (250, 170, 30)),
    (20, "traffic sign", 7, (220, 220, 0)),
    (21, "vegetation", 8, (107, 142, 35)),
    (22, "terrain", 9, (152, 251, 152)),
    (23, "sky", 10, (70, 130, 180)),
    (24, "person", 11, (220, 20, 60)),
    (25, "rider", 12, (255, 0, 0)),
    (26, "car", 13, (0, 0, 142)),
    (27, "truck", 14, (0, 0, 70)),
    (28, "bus", 15, (0, 60, 100)),
    (29, "caravan", 255, (0, 0, 90)),
    (30, "trailer", 255, (0, 0, 110)),
    (31, "train", 16, (0, 80, 100)),
    (32, "motorcycle", 17, (0, 0, 230)),
    (33, "bicycle", 18, (119, 11, 32)),
    # license plate has labelId -1: as a uint8 pixel that is 255, which the LUT sends to 255 anyway.
)


def _cityscapes_train_table() -> ClassTable:
    lut = [255] * 256
    train: dict[int, tuple[str, Colour]] = {}
    for label_id, name, train_id, colour in _CITYSCAPES_LABELS:
        lut[label_id] = train_id
        if train_id != 255:
            train[train_id] = (name, colour)
    ids = sorted(train)
    return _table(
        [train[i][0] for i in ids], [train[i][1] for i in ids], 255, "builtin:cityscapes", tuple(lut)
    )


CITYSCAPES: ClassTable = _cityscapes_train_table()

#: The 34 raw Cityscapes labelIds stored as they are (``cityscapes_train_ids=False``).
#: Ignore is labelId 0 "unlabeled" — like CamVid's Unlabelled, a real id that is ignored.
CITYSCAPES_LABEL_IDS: ClassTable = _table(
    [n for _, n, _, _ in _CITYSCAPES_LABELS],
    [c for _, _, _, c in _CITYSCAPES_LABELS],
    0,
    "builtin:cityscapes-labelids",
)
