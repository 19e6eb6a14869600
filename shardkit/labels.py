"""Label decoding: class tables, colour masks, VOC palettes, Cityscapes remap.

A :class:`ClassTable` says which class ids exist (and their names and colours), which
stored id means "ignore", and optionally how raw ids are remapped (Cityscapes
labelId → trainId). A :class:`LabelDecoder` turns one label file into a ``(H, W)``
array of stored class ids, bit-exactly: ids are never interpolated or guessed, and
anything that does not map to a class (an id out of range, a colour not in the
table) is reported with its pixel count and a fix, unless the user asked for
``--colour-tolerance`` or ``--unknown-as``.

Everything here is a plain frozen dataclass so it pickles into worker processes.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from .encoding import id_dtype
from .errors import ConfigError, DecodeError, InputNotFoundError, LabelError, ShardFormatError
from .transform import decode_label_pixels, read_bytes

logger = logging.getLogger(__name__)

LABEL_KINDS = ("ids", "colour", "palette", "cityscapes")
MAX_CLASSES = 65536
_MAX_LISTED = 5
_TOLERANCE_HINT = 16  # suggest an exact --colour-tolerance only for near-misses (e.g. anti-aliasing)
_FIX_RANGE = "pass --num-classes, --ignore-index V or --unknown-as ID"

Colour = tuple[int, int, int]


def _check_colour(value: Any, where: str) -> Colour:
    """Validate ``value`` as an (r, g, b) triple of 0..255 ints; raise ConfigError naming ``where``."""
    try:
        rgb = tuple(int(v) for v in value)
        ok = len(rgb) == 3 and all(0 <= v <= 255 for v in rgb) and all(int(v) == v for v in value)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"{where}: colour {value!r} is not three integers 0..255")
    return rgb  # type: ignore[return-value]


@dataclass(frozen=True)
class ClassInfo:
    """One class: stored id, display name, RGB colour (``None`` when the table has no colours)."""

    id: int
    name: str
    colour: Colour | None = None

    def __post_init__(self) -> None:
        if self.colour is not None:
            object.__setattr__(self, "colour", _check_colour(self.colour, f"class {self.id} {self.name!r}"))


@dataclass(frozen=True)
class ClassTable:
    """The classes of a dataset as stored: ids ``0..C-1`` in order, an ignore id, an optional remap.

    ``ignore_index`` may be a real class (CamVid's Unlabelled, 11) or lie outside
    the classes (255). ``remap`` is a 256-entry lookup from raw label values to stored
    ids (Cityscapes labelId → trainId); ``None`` means raw values are stored ids.
    """

    classes: tuple[ClassInfo, ...]
    ignore_index: int | None
    remap: tuple[int, ...] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        classes = tuple(self.classes)
        object.__setattr__(self, "classes", classes)
        if not 1 <= len(classes) <= MAX_CLASSES:
            raise ConfigError(f"a class table needs 1..{MAX_CLASSES} classes, got {len(classes)}")
        for i, c in enumerate(classes):
            if c.id != i:
                raise ConfigError(
                    f"class table {self.source!r}: class {c.name!r} has id {c.id}, expected {i}"
                )
        ig = self.ignore_index
        if ig is not None and not 0 <= ig < MAX_CLASSES:
            raise ConfigError(f"ignore index {ig} must be between 0 and {MAX_CLASSES - 1}")
        if self.remap is not None:
            remap = tuple(int(v) for v in self.remap)
            object.__setattr__(self, "remap", remap)
            if len(remap) != 256:
                raise ConfigError(
                    f"class table {self.source!r}: remap has {len(remap)} entries, expected 256"
                )
            bad = sorted({v for v in remap if not self.is_stored_id(v)})
            if bad:
                raise ConfigError(
                    f"class table {self.source!r}: remap targets {bad[:_MAX_LISTED]} are neither a class "
                    f"(0..{len(classes) - 1}) nor the ignore index {ig}"
                )

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def is_stored_id(self, value: int) -> bool:
        """True for a class id or the ignore index: the values a decoded label may hold."""
        return 0 <= value < self.num_classes or value == self.ignore_index

    def label_dtype(self) -> np.dtype:
        """uint8 when every stored id (the ignore index included) fits a byte, else little-endian uint16."""
        return id_dtype(self.num_classes, self.ignore_index)

    def names(self) -> list[str]:
        return [c.name for c in self.classes]

    def to_json(self) -> dict[str, Any]:
        """The manifest form: plain JSON types only."""
        return {
            "num_classes": self.num_classes,
            "ignore_index": self.ignore_index,
            "source": self.source,
            "classes": [
                {"id": c.id, "name": c.name, "colour": list(c.colour) if c.colour is not None else None}
                for c in self.classes
            ],
            "remap": list(self.remap) if self.remap is not None else None,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClassTable:
        """Inverse of :meth:`to_json`; a malformed dict (a damaged manifest) is a ShardFormatError."""
        try:
            classes = tuple(
                ClassInfo(
                    int(c["id"]), str(c["name"]), None if c.get("colour") is None else tuple(c["colour"])
                )
                for c in d["classes"]
            )
            ig = d.get("ignore_index")
            table = cls(
                classes=classes,
                ignore_index=None if ig is None else int(ig),
                remap=None if d.get("remap") is None else tuple(d["remap"]),
                source=str(d.get("source", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ShardFormatError(f"malformed class table in manifest: {exc!r}") from None
        if "num_classes" in d and d["num_classes"] != table.num_classes:
            raise ShardFormatError(
                f"class table says num_classes={d['num_classes']} but lists {table.num_classes} classes"
            )
        return table

    def with_ignore_index(self, ignore_index: int) -> ClassTable:
        """The same table with another ignore id; remap entries that pointed at the old one follow it."""
        remap = self.remap
        if remap is not None and self.ignore_index is not None:
            remap = tuple(ignore_index if v == self.ignore_index else v for v in remap)
        return dataclasses.replace(self, ignore_index=ignore_index, remap=remap)


# --------------------------------------------------------------------------- built-in tables


def _table(
    names: Sequence[str],
    colours: Sequence[Colour | None],
    ignore: int | None,
    source: str,
    remap: tuple[int, ...] | None = None,
) -> ClassTable:
    classes = tuple(ClassInfo(i, n, c) for i, (n, c) in enumerate(zip(names, colours, strict=True)))
    return ClassTable(classes, ignore, remap=remap, source=source)


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


# --------------------------------------------------------------------------- table files

_HEADER_ALIASES = {
    "name": ("name", "class", "class_name", "classname", "label", "label_name"),
    "r": ("r", "red"),
    "g": ("g", "green"),
    "b": ("b", "blue"),
}


def _read_text(path: Path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputNotFoundError(f"{what} does not exist", path=path, fix="check the path") from None
    except UnicodeDecodeError as exc:
        raise LabelError(
            f"{what} is not UTF-8 text (byte {exc.start})", path=path, fix="save it as UTF-8 CSV"
        ) from None
    except OSError as exc:
        raise LabelError(
            f"cannot read {what}: {exc.strerror or exc}", path=path, fix="fix its permissions"
        ) from None


def _finish_table(entries: list[tuple[str, Colour, str]], path: Path, what: str) -> ClassTable:
    """Build a table from (name, colour, where) entries; duplicate names or colours are a LabelError."""
    if not entries:
        raise LabelError(f"{what} lists no classes", path=path, fix="add one line per class: name,r,g,b")
    seen_colour: dict[Colour, tuple[str, str]] = {}
    seen_name: dict[str, str] = {}
    for name, colour, where in entries:
        if colour in seen_colour:
            other, other_where = seen_colour[colour]
            raise LabelError(
                f"classes {other!r} ({other_where}) and {name!r} ({where}) share colour {colour}",
                path=path,
                fix="give every class its own colour",
            )
        if name in seen_name:
            raise LabelError(
                f"class name {name!r} appears twice ({seen_name[name]} and {where})",
                path=path,
                fix="give every class its own name",
            )
        seen_colour[colour] = (name, where)
        seen_name[name] = where
    if len(entries) > MAX_CLASSES:
        raise LabelError(f"{what} lists {len(entries)} classes, more than {MAX_CLASSES}", path=path)
    classes = tuple(ClassInfo(i, n, c) for i, (n, c, _) in enumerate(entries))
    return ClassTable(classes, None, source=Path(path).name)


def _parse_class_csv(text: str, path: Path) -> ClassTable:
    reader = csv.reader(io.StringIO(text), skipinitialspace=True)
    header: list[str] | None = None
    cols: dict[str, int] = {}
    entries: list[tuple[str, Colour, str]] = []
    for row in reader:
        line = reader.line_num
        fields = [f.strip() for f in row]
        if not any(fields) or fields[0].startswith("#"):
            continue
        if header is None:
            header = [f.lower() for f in fields]
            for key, aliases in _HEADER_ALIASES.items():
                idx = next((header.index(a) for a in aliases if a in header), None)
                if idx is not None:
                    cols[key] = idx
            if len(cols) < 4:
                raise LabelError(
                    f"line {line}: header {','.join(fields)!r} lacks a name, r, g or b column",
                    path=path,
                    fix="make the first line name,r,g,b",
                )
            continue
        need = max(cols.values())
        if len(fields) <= need:
            raise LabelError(
                f"line {line}: {','.join(fields)!r} has {len(fields)} fields, expected name,r,g,b",
                path=path,
                fix="write one class per line as name,r,g,b",
            )
        name = fields[cols["name"]]
        if not name:
            raise LabelError(f"line {line}: empty class name", path=path, fix="name every class")
        try:
            rgb = tuple(int(fields[cols[k]]) for k in "rgb")
            if not all(0 <= v <= 255 for v in rgb):
                raise ValueError
        except ValueError:
            raw = ",".join(fields[cols[k]] for k in "rgb")
            raise LabelError(
                f"line {line}: class {name!r} has colour {raw!r}, not three integers 0..255",
                path=path,
                fix="write r,g,b as integers 0..255",
            ) from None
        entries.append((name, rgb, f"line {line}"))  # type: ignore[arg-type]
    if header is None:
        raise LabelError(
            "class table is empty", path=path, fix="write a header name,r,g,b and one line per class"
        )
    return _finish_table(entries, path, "class table")


def read_class_dict(path: Path) -> ClassTable:
    """Read a ``class_dict.csv`` (``name,r,g,b`` header, one class per row; ids in row order).

    Headers are case-insensitive and may be padded; a BOM, blank lines, ``#`` comment
    lines and extra columns (``class_19`` …) are ignored. No class is made the ignore
    class: pass ``--ignore-index`` for that.
    """
    path = Path(path)
    return _parse_class_csv(_read_text(path, "class table"), path)


def _json_colour(value: Any, where: str, path: Path) -> Colour:
    if isinstance(value, str) and re.fullmatch(r"#?[0-9a-fA-F]{6}", value.strip()):
        h = value.strip().lstrip("#")
        return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)
    try:
        return _check_colour(value, where)
    except ConfigError:
        raise LabelError(
            f"{where}: colour {value!r} is not [r, g, b] with integers 0..255",
            path=path,
            fix="write colours as [r, g, b]",
        ) from None


def _parse_json_palette(obj: Any, path: Path) -> ClassTable:
    """Classes from ``{"labels"|"classes": …}``, ``{name: {"color": …}}``, ``{name: [r,g,b]}``
    or ``[{"name", "color"}]``."""
    while isinstance(obj, dict) and len(obj) >= 1 and any(k in obj for k in ("labels", "classes")):
        obj = obj["labels"] if "labels" in obj else obj["classes"]
    if isinstance(obj, dict):
        items: Iterable[tuple[str | None, Any]] = obj.items()
    elif isinstance(obj, list):
        items = ((None, v) for v in obj)
    else:
        raise LabelError(
            "palette JSON is neither an object nor a list of classes",
            path=path,
            fix='write {"labels": {name: {"color": [r, g, b]}}} or [{"name", "color"}]',
        )
    entries: list[tuple[str, Colour, str]] = []
    for i, (key, value) in enumerate(items):
        where = f"entry {i}" + (f" {key!r}" if key is not None else "")
        if isinstance(value, dict):
            raw = next((value[k] for k in ("color", "colour", "rgb") if k in value), None)
            name = value.get("name", key)
        else:
            raw, name = value, key
        if raw is None:
            raise LabelError(f"{where} has no color", path=path, fix='give every class "color": [r, g, b]')
        entries.append(
            (str(name) if name is not None else f"class_{i}", _json_colour(raw, where, path), where)
        )
    return _finish_table(entries, path, "palette")


def _parse_text_palette(text: str, path: Path) -> ClassTable:
    entries: list[tuple[str, Colour, str]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        parts = re.split(r"[\s,]+", s, maxsplit=3)
        try:
            rgb = tuple(int(p) for p in parts[:3])
            if len(rgb) != 3 or not all(0 <= v <= 255 for v in rgb):
                raise ValueError
        except ValueError:
            raise LabelError(
                f"line {n}: {s!r} is not 'r g b [name]'",
                path=path,
                fix="write one class per line as r g b name",
            ) from None
        name = parts[3].strip() if len(parts) > 3 and parts[3].strip() else f"class_{len(entries)}"
        entries.append((name, rgb, f"line {n}"))  # type: ignore[arg-type]
    return _finish_table(entries, path, "palette")


def read_palette(path: Path) -> ClassTable:
    """Read a ``--palette`` file: class_dict CSV, annotation-tool JSON, or ``r g b [name]`` text lines.

    JSON classes get ids in the order they are listed (any ``"id"`` field in the
    JSON is the tool's own numbering and is not used).
    """
    path = Path(path)
    text = _read_text(path, "palette")
    head = text.lstrip()
    if path.suffix.lower() == ".json" or head.startswith(("{", "[")):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LabelError(
                f"palette JSON is invalid at line {exc.lineno}: {exc.msg}",
                path=path,
                fix="fix the JSON syntax",
            ) from None
        return _parse_json_palette(obj, path)
    first = next((ln for ln in head.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    header = {f.strip().lower() for f in first.split(",")}
    if any(a in header for a in _HEADER_ALIASES["name"]) and any(a in header for a in _HEADER_ALIASES["r"]):
        return _parse_class_csv(text, path)
    return _parse_text_palette(text, path)


def build_class_table(
    label_kind: str,
    *,
    class_dict: Path | None,
    palette: Path | None,
    layout: str,
    num_classes: int | None,
    ignore_index: int | None,
    cityscapes_train_ids: bool = True,
) -> ClassTable:
    """Choose the class table for a conversion from the label kind, layout and options.

    - ``colour``: ``--palette`` wins over ``class_dict``; neither is a ConfigError.
    - ``ids``: ``--num-classes N`` gives names ``class_0..`` (a class_dict/palette with exactly N
      classes is used instead, for its names; one with another count is a ConfigError); else a
      class_dict/palette supplies names (colours kept for drawing); else segnet/listfile layouts
      are CamVid SegNet; else ConfigError asking for ``--num-classes``.
    - ``palette``: a given class_dict/palette or ``--num-classes`` table, else VOC (ignore 255).
    - ``cityscapes``: the 19 trainIds with the official labelId → trainId remap (ignore 255);
      with ``cityscapes_train_ids=False`` the 34 labelIds stored as they are, ignore = 0
      ("unlabeled"), no remap.

    ``ignore_index`` (not None) replaces the table's ignore id, and remap entries follow it.
    """
    if label_kind not in LABEL_KINDS:
        raise ConfigError(f"label kind {label_kind!r} is not one of {', '.join(LABEL_KINDS)}")
    if num_classes is not None and not 1 <= num_classes <= MAX_CLASSES:
        raise ConfigError(f"--num-classes {num_classes} must be between 1 and {MAX_CLASSES}")
    file_table: ClassTable | None = None
    if palette is not None:
        file_table = read_palette(palette)
    elif class_dict is not None:
        file_table = read_class_dict(class_dict)

    def generic(n: int) -> ClassTable:
        return ClassTable(tuple(ClassInfo(i, f"class_{i}") for i in range(n)), None, source="num-classes")

    def agree(table: ClassTable) -> ClassTable:
        if num_classes is not None and num_classes != table.num_classes:
            raise ConfigError(
                f"--num-classes {num_classes} disagrees with {table.source}, "
                f"which lists {table.num_classes} classes",
                fix="drop --num-classes or fix the class table",
            )
        return table

    if label_kind == "colour":
        if file_table is None:
            raise ConfigError(
                "colour masks need a class table", fix="put class_dict.csv at the root or pass --palette FILE"
            )
        table = agree(file_table)
    elif label_kind == "ids":
        if file_table is not None:
            table = agree(file_table)
        elif num_classes is not None:
            table = generic(num_classes)
        elif layout in ("segnet", "listfile"):
            table = CAMVID_SEGNET
        else:
            raise ConfigError(
                "label ids need the number of classes",
                fix="pass --num-classes N (and --ignore-index V if any)",
            )
    elif label_kind == "palette":
        if file_table is not None:
            table = agree(file_table)
        elif num_classes is not None:
            table = generic(num_classes)
        else:
            table = VOC
    else:  # cityscapes
        table = agree(CITYSCAPES if cityscapes_train_ids else CITYSCAPES_LABEL_IDS)
    if ignore_index is not None:
        table = table.with_ignore_index(ignore_index)
    logger.debug("class table %s: %d classes, ignore %s", table.source, table.num_classes, table.ignore_index)
    return table


# --------------------------------------------------------------------------- decoding


def _pack(rgb: np.ndarray) -> np.ndarray:
    """(..., 3) RGB uint8 → (...) uint32 keys r<<16 | g<<8 | b."""
    rgb = rgb.astype(np.uint32)
    return (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]


def _unpack(keys: np.ndarray) -> np.ndarray:
    keys = keys.astype(np.uint32)
    return np.stack([(keys >> 16) & 255, (keys >> 8) & 255, keys & 255], axis=-1).astype(np.int16)


def _fmt_rgb(c: Sequence[int]) -> str:
    return "(" + ",".join(str(int(v)) for v in c) + ")"


@dataclass(frozen=True)
class LabelDecoder:
    """Decodes one label file into ``(H, W)`` stored class ids of ``table.label_dtype()``.

    ``kind`` is the label kind (ids, colour, palette, cityscapes). ``colour_tolerance``
    N maps a colour within N (on every channel) of its nearest class colour to that
    class; ``unknown_as`` maps any remaining unknown colour / out-of-range id to that
    stored id instead of failing.
    """

    kind: str
    table: ClassTable
    colour_tolerance: int = 0
    unknown_as: int | None = None
    # Derived once, small, picklable: sorted colour keys → stored ids (colour / palette-RGB).
    _keys: np.ndarray = field(init=False, repr=False, compare=False)
    _key_ids: np.ndarray = field(init=False, repr=False, compare=False)
    _key_names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in LABEL_KINDS:
            raise ConfigError(f"label kind {self.kind!r} is not one of {', '.join(LABEL_KINDS)}")
        if not 0 <= self.colour_tolerance <= 255:
            raise ConfigError("--colour-tolerance must be between 0 and 255")
        t = self.table
        if self.unknown_as is not None and not t.is_stored_id(self.unknown_as):
            raise ConfigError(
                f"--unknown-as {self.unknown_as} is neither a class id (0..{t.num_classes - 1}) "
                f"nor the ignore index ({t.ignore_index})",
                fix="choose a class id or the --ignore-index value",
            )
        pairs: list[tuple[int, int, str]] = []  # (key, stored id, name)
        if self.kind == "colour":
            for c in t.classes:
                if c.colour is None:
                    raise ConfigError(
                        f"class {c.id} {c.name!r} of {t.source} has no colour, "
                        "so colour masks cannot be decoded",
                        fix="use a class_dict.csv / --palette with name,r,g,b",
                    )
        if self.kind in ("colour", "palette"):
            by_key: dict[int, ClassInfo] = {}
            for c in t.classes:
                if c.colour is None:
                    continue
                key = (c.colour[0] << 16) | (c.colour[1] << 8) | c.colour[2]
                if key in by_key:
                    raise ConfigError(
                        f"classes {by_key[key].name!r} and {c.name!r} of {t.source} share colour {c.colour}",
                        fix="give every class its own colour",
                    )
                by_key[key] = c
                pairs.append((key, c.id, c.name))
            ig = t.ignore_index
            if self.kind == "palette" and t.source.startswith("builtin:voc") and ig is not None and ig < 256:
                key = int(_pack(_VOC_CMAP[ig]))
                if key not in by_key:  # VOC RGB exports draw the void border (224,224,192) for 255
                    pairs.append((key, ig, "ignore"))
        pairs.sort()
        dtype = t.label_dtype()
        object.__setattr__(self, "_keys", np.array([p[0] for p in pairs], dtype=np.uint32))
        object.__setattr__(self, "_key_ids", np.array([p[1] for p in pairs], dtype=dtype))
        object.__setattr__(self, "_key_names", tuple(p[2] for p in pairs))

    # -- entry point

    def decode(self, path: Path) -> np.ndarray:
        """Read one label file and return its stored class ids; errors name the file and the fix."""
        path = Path(path)
        if self.kind == "palette":
            return self._decode_palette(path)
        raw = decode_label_pixels(path)
        if self.kind == "colour":
            return self._map_colours(self._colour_keys(raw, path), path)
        ids = self._as_ids(raw, path)
        if self.table.remap is not None:
            ids = self._apply_remap(ids, path)
        return self._check_range(ids, path)

    # -- ids

    def _as_ids(self, raw: np.ndarray, path: Path) -> np.ndarray:
        """One channel of integer ids: equal-channel RGB collapses, alpha is dropped, colours are refused."""
        if raw.ndim == 3:
            if raw.shape[2] <= 2:  # gray, gray + alpha
                raw = raw[:, :, 0]
            else:
                b, g, r = raw[:, :, 0], raw[:, :, 1], raw[:, :, 2]
                differ = (b != g) | (g != r)
                n = int(np.count_nonzero(differ))
                if n:
                    y, x = np.argwhere(differ)[0]
                    raise LabelError(
                        f"label has colours, not class ids ({n} px where R, G, B differ, e.g. "
                        f"{_fmt_rgb((r[y, x], g[y, x], b[y, x]))} at x={x} y={y})",
                        path=path,
                        fix="pass a class_dict.csv / --palette FILE "
                        "(palette-indexed PNGs like VOC: palette labels)",
                    )
                raw = b
        if raw.dtype not in (np.uint8, np.uint16):
            raise LabelError(
                f"label pixels are {raw.dtype}, not 8- or 16-bit integer class ids",
                path=path,
                fix="re-export the label as an 8- or 16-bit grayscale PNG",
            )
        return np.ascontiguousarray(raw)

    def _apply_remap(self, ids: np.ndarray, path: Path) -> np.ndarray:
        """Raw ids → stored ids through the 256-entry LUT (before any range check)."""
        if ids.dtype != np.uint8:
            counts = np.bincount(ids.ravel())
            big = np.flatnonzero(counts[256:]) + 256
            if big.size:
                raise LabelError(
                    f"label has raw ids above 255 that the {self.table.source} remap cannot map: "
                    f"{self._list_counts(big, counts)}",
                    path=path,
                    fix="use the labelIds PNGs (not instanceIds), or turn the remap off",
                )
            ids = ids.astype(np.uint8)
        lut = np.asarray(self.table.remap, dtype=self.table.label_dtype())
        return lut[ids]

    @staticmethod
    def _list_counts(values: np.ndarray, counts: np.ndarray) -> str:
        order = sorted(values.tolist(), key=lambda v: (-int(counts[v]), v))
        shown = ", ".join(f"{v} ({int(counts[v])} px)" for v in order[:_MAX_LISTED])
        more = len(order) - _MAX_LISTED
        return shown + (f" and {more} more" if more > 0 else "")

    def _check_range(self, ids: np.ndarray, path: Path) -> np.ndarray:
        """Every value must be a class or the ignore id; else error (or ``unknown_as``)."""
        t = self.table
        if ids.size == 0 or int(ids.max()) < t.num_classes:  # the common case, ~15x cheaper than counting
            return ids.astype(t.label_dtype(), copy=False)
        counts = np.bincount(ids.ravel(), minlength=1)
        n = counts.size
        valid = np.zeros(n, dtype=bool)
        valid[: min(t.num_classes, n)] = True
        if t.ignore_index is not None and t.ignore_index < n:
            valid[t.ignore_index] = True
        bad = np.flatnonzero((counts > 0) & ~valid)
        dtype = t.label_dtype()
        if bad.size:
            if self.unknown_as is None:
                ig = f", ignore {t.ignore_index}" if t.ignore_index is not None else ""
                raise LabelError(
                    f"label has ids outside the {t.num_classes} classes (0..{t.num_classes - 1}{ig}): "
                    f"{self._list_counts(bad, counts)}",
                    path=path,
                    fix=_FIX_RANGE,
                )
            lut = np.where(valid, np.arange(n), self.unknown_as).astype(dtype)
            return lut[ids]
        return ids.astype(dtype, copy=False)

    # -- colours

    @staticmethod
    def _colour_keys(raw: np.ndarray, path: Path) -> np.ndarray:
        """BGR(A)/gray uint8 pixels → (H, W) uint32 RGB keys; alpha dropped, gray v read as (v, v, v)."""
        if raw.dtype != np.uint8:
            raise LabelError(
                f"colour mask is {raw.dtype}, not 8-bit",
                path=path,
                fix="re-export the mask as an 8-bit RGB PNG",
            )
        if raw.ndim == 3 and raw.shape[2] <= 2:
            raw = raw[:, :, 0]
        if raw.ndim == 2:
            return raw.astype(np.uint32) * np.uint32(0x010101)
        return _pack(raw[:, :, 2::-1])

    def _map_colours(self, keys: np.ndarray, path: Path) -> np.ndarray:
        """Map colour keys to stored ids with a sorted-key binary search (vectorised over pixels)."""
        h, w = keys.shape
        flat = keys.ravel()
        if self._keys.size == 0:
            raise LabelError(
                f"{self.table.source} has no colours to decode a colour label with",
                path=path,
                fix="pass a class_dict.csv / --palette FILE",
            )
        pos = np.searchsorted(self._keys, flat)
        np.minimum(pos, self._keys.size - 1, out=pos)
        match = self._keys[pos] == flat
        out = self._key_ids[pos]
        if not match.all():
            bad_idx = np.flatnonzero(~match)
            uniq, inverse, counts = np.unique(flat[bad_idx], return_inverse=True, return_counts=True)
            mapped = self._map_unknown(uniq, counts, path)
            out[bad_idx] = mapped[inverse]
        return out.reshape(h, w)

    def _nearest(self, uniq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per unknown colour key: index of the nearest class key (max-abs distance), and that distance."""
        class_rgb = _unpack(self._keys)
        nearest = np.empty(uniq.size, dtype=np.intp)
        dist = np.empty(uniq.size, dtype=np.int16)
        step = max(1, 2_000_000 // max(1, class_rgb.shape[0]))  # bound the (U, K, 3) temporary
        for s in range(0, uniq.size, step):
            u = _unpack(uniq[s : s + step])
            d = np.abs(u[:, None, :] - class_rgb[None, :, :]).max(axis=2)
            nearest[s : s + step] = d.argmin(axis=1)
            dist[s : s + step] = d[np.arange(d.shape[0]), nearest[s : s + step]]
        return nearest, dist

    def _map_unknown(self, uniq: np.ndarray, counts: np.ndarray, path: Path) -> np.ndarray:
        nearest, dist = self._nearest(uniq)
        mapped = np.zeros(uniq.size, dtype=self._key_ids.dtype)
        within = dist <= self.colour_tolerance
        mapped[within] = self._key_ids[nearest[within]]
        left = np.flatnonzero(~within)
        if left.size:
            if self.unknown_as is None:
                raise self._unknown_colour_error(uniq[left], counts[left], nearest[left], dist[left], path)
            mapped[left] = self.unknown_as
        return mapped

    def _unknown_colour_error(
        self, keys: np.ndarray, counts: np.ndarray, nearest: np.ndarray, dist: np.ndarray, path: Path
    ) -> LabelError:
        order = np.lexsort((keys, -counts.astype(np.int64)))
        rgb = _unpack(keys)
        class_rgb = _unpack(self._keys)
        parts = []
        for i in order[:_MAX_LISTED]:
            k = nearest[i]
            parts.append(
                f"{_fmt_rgb(rgb[i])} {int(counts[i])} px, nearest {_fmt_rgb(class_rgb[k])} "
                f"{self._key_names[k]!r} (distance {int(dist[i])})"
            )
        more = keys.size - _MAX_LISTED
        listed = "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
        src = self.table.source or "the class table"
        jpeg = (
            " (JPEG labels are lossy: re-export them as PNG)"
            if path.suffix.lower() in (".jpg", ".jpeg")
            else ""
        )
        target = src if src.endswith((".csv", ".json", ".txt")) else "class_dict.csv"
        need = int(dist.max())
        tol = f"--colour-tolerance {need}" if need <= _TOLERANCE_HINT else "--colour-tolerance N"
        return LabelError(
            f"label has {keys.size} colour(s) not in {src} ({int(counts.sum())} px): {listed}{jpeg}",
            path=path,
            fix=f"add it to {target}, or {tol}, or --unknown-as ID",
        )

    # -- palette PNGs

    def _decode_palette(self, path: Path) -> np.ndarray:
        """Palette-indexed labels via PIL: mode P gives indices directly (OpenCV would expand colours)."""
        data = read_bytes(path, "label")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(io.BytesIO(data.tobytes())) as im:
                    im.load()
                    mode = im.mode
                    arr = np.array(im)
        except (
            UnidentifiedImageError,
            OSError,
            SyntaxError,
            ValueError,
            Image.DecompressionBombError,
        ) as exc:
            raise DecodeError(
                f"cannot decode label: {exc}",
                path=path,
                fix="re-export or remove the file, or --on-error skip",
            ) from None
        if mode in ("RGB", "RGBA"):
            return self._map_colours(_pack(arr[:, :, :3]), path)
        if mode in ("P", "PA", "L", "LA"):
            ids = arr if arr.ndim == 2 else arr[:, :, 0]
        elif mode == "1":
            ids = arr.astype(np.uint8)
        elif mode.startswith("I;16") or (
            mode == "I" and (arr.size == 0 or (arr.min() >= 0 and arr.max() <= 65535))
        ):
            ids = arr.astype(np.uint16)
        else:
            raise LabelError(
                f"palette label has image mode {mode}, not palette indices",
                path=path,
                fix="re-export it as a palette (mode P) or grayscale PNG",
            )
        ids = np.ascontiguousarray(ids)
        if self.table.remap is not None:
            ids = self._apply_remap(ids, path)
        return self._check_range(ids, path)
