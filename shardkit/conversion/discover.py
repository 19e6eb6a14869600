"""Discovery's old home: the layouts now live in :mod:`shardkit.conversion.layouts` (one class each); this module keeps
the
names other modules and callers import."""

from .layouts import (
    CLASS_DICT_NAMES,
    IMAGE_EXTENSIONS,
    LABEL_SUFFIXES,
    Discovery,
    PairTable,
    SamplePair,
    discover,
    file_types,
    rel_path,
)

__all__ = ["CLASS_DICT_NAMES", "IMAGE_EXTENSIONS", "LABEL_SUFFIXES", "Discovery", "PairTable", "SamplePair",
           "discover", "file_types", "rel_path"]
