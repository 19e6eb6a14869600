"""Labels: the class model, built-in tables, table files, the table policy, label decoding.

- :mod:`.classes`: :class:`ClassInfo`, :class:`ClassTable` (ids, names, colours, ignore id, remap).
- :mod:`.builtin`: CamVid SegNet, PASCAL VOC, Cityscapes tables.
- :mod:`.tablefiles`: ``class_dict.csv`` / JSON / text palette parsers.
- :mod:`.policy`: :func:`build_class_table`, which table a conversion uses.
- :mod:`.decode`: :class:`LabelDecoder`, one label file to stored class ids, bit-exactly.
"""

from .builtin import CAMVID_SEGNET, CITYSCAPES, CITYSCAPES_LABEL_IDS, VOC, voc_colormap
from .classes import LABEL_KINDS, MAX_CLASSES, ClassInfo, ClassTable, Colour
from .decode import LabelDecoder
from .policy import build_class_table
from .tablefiles import read_class_dict, read_palette

__all__ = [
    "CAMVID_SEGNET",
    "CITYSCAPES",
    "CITYSCAPES_LABEL_IDS",
    "LABEL_KINDS",
    "MAX_CLASSES",
    "VOC",
    "ClassInfo",
    "ClassTable",
    "Colour",
    "LabelDecoder",
    "build_class_table",
    "read_class_dict",
    "read_palette",
    "voc_colormap",
]
