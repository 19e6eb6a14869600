"""The class model: :class:`ClassInfo`, :class:`ClassTable` and the label kinds.

A :class:`ClassTable` says which class ids exist (and their names and colours), which
stored id means "ignore", and optionally how raw ids are remapped (Cityscapes
labelId → trainId). Everything here is a plain frozen dataclass so it pickles into
worker processes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..encoding import id_dtype
from ..errors import ConfigError, ShardFormatError

LABEL_KINDS = ("ids", "colour", "palette", "cityscapes")
MAX_CLASSES = 65536
_MAX_LISTED = 5

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
