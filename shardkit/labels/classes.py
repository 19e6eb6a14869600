"""The class model: :class:`ClassInfo`, :class:`ClassTable` (both in the typed core,
:mod:`shardkit.files.splitfiles`, which the manifest builds on) and the label kinds.

A :class:`ClassTable` says which class ids exist (and their names and colours), which
stored id means "ignore", and optionally how raw ids are remapped (Cityscapes
labelId → trainId). Everything here is a plain frozen dataclass so it pickles into
worker processes.
"""

from __future__ import annotations

from ..files.splitfiles import _MAX_LISTED, MAX_CLASSES, ClassInfo, ClassTable, Colour, _check_colour

__all__ = ["LABEL_KINDS", "MAX_CLASSES", "_MAX_LISTED", "ClassInfo", "ClassTable", "Colour", "_check_colour"]

LABEL_KINDS = ("ids", "colour", "palette", "cityscapes", "ade20k")
