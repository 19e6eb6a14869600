"""Input layouts: one class per dataset tree (name, expected tree, detector, pairing, label kind, default class
table), discovered like the formats, and :func:`discover`, which finds the one a folder has.

- :mod:`.base`: the :class:`Layout` contract and the detector :class:`Context`;
- :mod:`.scan`: folder listings and pairing by stem, suffix and shared name part;
- :mod:`.registry`: every layout module's ``LAYOUT``, in trial order;
- :mod:`.pattern`: explicit ``--images``/``--labels`` templates; :mod:`.splitlist`: ``--split-list``;
- :mod:`.diagnose`: what a folder that matches no layout is told;
- :mod:`.discover`: :class:`Discovery` and :func:`discover`.
"""

from ..pairs import PairTable, SamplePair
from .base import CLASS_DICT_NAMES, Context, Layout
from .discover import Discovery, discover, layout_ignore, layout_table, with_colour_table
from .registry import all_layouts, get, names
from .scan import IMAGE_EXTENSIONS, LABEL_SUFFIXES, file_types, rel_path

__all__ = ["CLASS_DICT_NAMES", "IMAGE_EXTENSIONS", "LABEL_SUFFIXES", "Context", "Discovery", "Layout", "PairTable",
           "SamplePair", "all_layouts", "discover", "file_types", "get", "layout_ignore",
           "layout_table", "names", "rel_path", "with_colour_table"]
