"""Class tables read from files: ``class_dict.csv``, JSON and plain-text palettes, ``--classes`` lists.

A table is read exactly as written or refused: every problem in a file is a one-line
:class:`~shardkit.errors.LabelError` naming the file and the line or entry. Files are bounded before they are
parsed (:data:`MAX_TABLE_BYTES`, JSON nesting and value counts) and the class cap applies while rows are read.
"""

from __future__ import annotations

import csv
import json
import logging
import re
from collections.abc import Iterable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputNotFoundError, LabelError
from ..support.smallfile import json_shape, read_small_text
from .classes import MAX_CLASSES, ClassInfo, ClassTable, Colour, _check_colour

logger = logging.getLogger(__name__)

#: Largest class table file read: 65,536 classes of 256 bytes each. A bigger file is refused before it is read.
MAX_TABLE_BYTES = 16 << 20
#: JSON table files: deepest nesting, and most values (containers and commas), counted before parsing.
MAX_TABLE_DEPTH = 64
MAX_TABLE_VALUES = 16 * MAX_CLASSES
_ID_ALIASES = ("id", "class_id", "classid", "index", "value", "label_id", "train_id", "trainid")
_HEADER_ALIASES = {
    "name": ("name", "class", "class_name", "classname", "label", "label_name", "category", "category_name"),
    "r": ("r", "red"),
    "g": ("g", "green"),
    "b": ("b", "blue"),
}
_COLUMNS = {**_HEADER_ALIASES, "id": _ID_ALIASES}
_DIGITS = re.compile(r"[0-9]{1,6}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_TOO_MANY_FIX = "a class table lists each class once: pass the file of the dataset's classes"
#: SceneParsing's ``objectInfo150.{csv,txt}`` (ADEChallengeData2016): a first column ``Idx`` numbering the classes
#: 1..150 as the label files hold them; raw 0 is "other objects", which the benchmark does not evaluate.
OBJECT_INFO_ID = "idx"
OTHER_OBJECTS = "other objects"


def _refuse_size(size: int, what: str, path: Path) -> LabelError:
    return LabelError(f"{what} is {size} bytes, more than the {MAX_TABLE_BYTES} bytes a table of {MAX_CLASSES} "
                      "classes needs", path=path, fix=_TOO_MANY_FIX)


def read_table_text(path: Path, what: str) -> str:
    """The text of a class table or label map file: a regular UTF-8 file of at most :data:`MAX_TABLE_BYTES`
    (its size checked before a byte is read), else a one-line LabelError / InputNotFoundError."""
    path = Path(path)
    try:
        size = path.stat().st_size
        text = None if size > MAX_TABLE_BYTES else read_small_text(path, what)
    except FileNotFoundError:
        raise InputNotFoundError(f"{what} does not exist", path=path, fix="check the path") from None
    except UnicodeDecodeError as exc:
        raise LabelError(f"{what} is not UTF-8 text (byte {exc.start})", path=path,
                         fix="save it as UTF-8 text") from None
    except OSError as exc:
        raise LabelError(f"cannot read {what}: {exc.strerror or exc}", path=path,
                         fix="point at a readable regular file") from None
    if text is None or len(text) > MAX_TABLE_BYTES:  # grew since the stat
        raise _refuse_size(size if text is None else len(text), what, path)
    return text


def load_table_json(text: str, what: str, path: Path) -> Any:
    """``json.loads`` of a table file, after its nesting depth and value count are bounded (counted on the
    bytes, strings excluded: a 100,000-deep or a million-value file is refused before a Python object is
    built)."""
    depth, values = json_shape(text)
    if depth > MAX_TABLE_DEPTH:
        raise LabelError(f"{what} JSON nests {depth} levels deep, more than {MAX_TABLE_DEPTH}", path=path,
                         fix='write a list of classes: ["sky", …] or [{"id": 0, "name": "sky"}, …]')
    if values > MAX_TABLE_VALUES:
        raise LabelError(f"{what} JSON holds about {values} values, more than {MAX_TABLE_VALUES} "
                         f"({MAX_CLASSES} classes of a few fields)", path=path, fix=_TOO_MANY_FIX)
    try:
        return json.loads(text)
    except RecursionError:  # not reached after the depth count; kept so no parse ends in a traceback
        raise LabelError(f"{what} JSON nests too deeply", path=path, fix="fix the JSON") from None
    except json.JSONDecodeError as exc:
        raise LabelError(f"{what} JSON is invalid at line {exc.lineno}: {exc.msg}", path=path,
                         fix="fix the JSON syntax") from None
    except ValueError as exc:  # the integer digit limit
        raise LabelError(f"{what} JSON is invalid: {exc}", path=path, fix="fix the JSON") from None


def _content_lines(text: str, what: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line number, stripped line) of every line that is not blank or a ``#`` comment; refused once more
    lines than a table of :data:`MAX_CLASSES` classes (a header and labelme's ``__ignore__`` besides) holds."""
    count = 0
    for number, line in enumerate(StringIO(text, newline=None), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        count += 1
        if count > MAX_CLASSES + 2:
            raise LabelError(f"{what} lists more than {MAX_CLASSES} classes (line {number})", path=path,
                             fix=_TOO_MANY_FIX)
        yield number, s


def _check_count(count: int, what: str, path: Path, spare: int = 0) -> None:
    """Refuse more than :data:`MAX_CLASSES` classes (``spare``: entries that may still be dropped, labelme's
    ``__ignore__``), as soon as an entry past the cap is read."""
    if count > MAX_CLASSES + spare:
        raise LabelError(f"{what} lists more than {MAX_CLASSES} classes", path=path, fix=_TOO_MANY_FIX)


def _check_name(name: Any, where: str, path: Path) -> str:
    """A class name as written (surrounding spaces dropped): a non-empty string without control characters."""
    if not isinstance(name, str):
        raise LabelError(f"{where}: class name {name!r} is not a string", path=path,
                         fix="write every class name as text")
    name = name.strip()
    if not name:
        raise LabelError(f"{where}: empty class name", path=path, fix="name every class")
    if m := _CONTROL.search(name):
        raise LabelError(f"{where}: class name {name!r} holds the control character {m.group()!r}", path=path,
                         fix="remove control characters (NUL, tabs, line breaks) from class names")
    return name


def _parse_id(value: Any, where: str, path: Path) -> int:
    """A class id as written: a JSON integer or a string of digits, 0..MAX_CLASSES-1; anything else (1.5, 1.0,
    true, -1, "x") is refused naming the entry."""
    text = value.strip() if isinstance(value, str) else None
    ok = (isinstance(value, int) and not isinstance(value, bool)) or (text is not None and _DIGITS.fullmatch(text))
    if not ok or not 0 <= int(value) < MAX_CLASSES:
        raise LabelError(f"{where}: class id {value!r} is not a whole number 0..{MAX_CLASSES - 1}", path=path,
                         fix='write ids as integers (0, 1, 2 …) or strings of digits ("0")')
    return int(value)


def _split(line: str, delimiter: str) -> list[str]:
    return [f.strip() for f in next(csv.reader([line], delimiter=delimiter, skipinitialspace=True), [])]


def _header_columns(fields: list[str]) -> dict[str, int] | None:
    """The columns of a header row (name, r, g, b, id; case-insensitive aliases), or None when ``fields`` is
    not a header: a header names a name column and holds no number."""
    header = [f.lower() for f in fields]
    if not any(a in header for a in _HEADER_ALIASES["name"]) or any(_DIGITS.fullmatch(h) for h in header):
        return None
    cols: dict[str, int] = {}
    for key, aliases in _COLUMNS.items():
        idx = next((header.index(a) for a in aliases if a in header), None)
        if idx is not None:
            cols[key] = idx
    return cols


def _rgb(fields: Iterable[str], where: str, path: Path) -> Colour:
    raw = list(fields)
    try:
        rgb = tuple(int(v) for v in raw)
        if len(rgb) != 3 or not all(0 <= v <= 255 for v in rgb):
            raise ValueError
    except ValueError:
        raise LabelError(f"{where}: colour {','.join(raw)!r} is not three integers 0..255", path=path,
                         fix="write r,g,b as integers 0..255") from None
    return rgb


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
    _check_count(len(entries), what, path)
    classes = tuple(ClassInfo(i, n, c) for i, (n, c, _) in enumerate(entries))
    return ClassTable(classes, None, source=Path(path).name)


def _parse_class_csv(text: str, path: Path) -> ClassTable:
    lines = _content_lines(text, "class table", path)
    first = next(lines, None)
    if first is None:
        raise LabelError(
            "class table is empty", path=path, fix="write a header name,r,g,b and one line per class"
        )
    fields = _split(first[1], ",")
    cols = _header_columns(fields) or {}
    if not all(k in cols for k in ("name", "r", "g", "b")):
        raise LabelError(
            f"line {first[0]}: header {','.join(fields)!r} lacks a name, r, g or b column",
            path=path,
            fix="make the first line name,r,g,b",
        )
    need = max(cols[k] for k in ("name", "r", "g", "b"))
    entries: list[tuple[str, Colour, str]] = []
    for line, s in lines:
        fields = _split(s, ",")
        if not any(fields):
            continue
        if len(fields) <= need:
            raise LabelError(
                f"line {line}: {','.join(fields)!r} has {len(fields)} fields, expected name,r,g,b",
                path=path,
                fix="write one class per line as name,r,g,b",
            )
        name = _check_name(fields[cols["name"]], f"line {line}", path)
        rgb = _rgb((fields[cols[k]] for k in "rgb"), f"line {line}: class {name!r}", path)
        entries.append((name, rgb, f"line {line}"))
    return _finish_table(entries, path, "class table")


def read_class_dict(path: Path) -> ClassTable:
    """Read a ``class_dict.csv`` (``name,r,g,b`` header, one class per row; ids in row order).

    Headers are case-insensitive and may be padded; a BOM, blank lines, ``#`` comment
    lines and extra columns (``class_19`` …) are ignored. No class is made the ignore
    class: pass ``--ignore-index`` for that.
    """
    path = Path(path)
    return _parse_class_csv(read_table_text(path, "class table"), path)


def _json_colour(value: Any, where: str, path: Path) -> Colour:
    if isinstance(value, str) and re.fullmatch(r"#?[0-9a-fA-F]{6}", value.strip()):
        h = value.strip().lstrip("#")
        return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)
    try:
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise ConfigError("not a list of integers")
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
        _check_count(i + 1, "palette", path)
        where = f"entry {i}" + (f" {key!r}" if key is not None else "")
        if isinstance(value, dict):
            raw = next((value[k] for k in ("color", "colour", "rgb") if k in value), None)
            name = value.get("name", key)
        else:
            raw, name = value, key
        if raw is None:
            raise LabelError(f"{where} has no color", path=path, fix='give every class "color": [r, g, b]')
        name = _check_name(name, where, path) if name is not None else f"class_{i}"
        entries.append((name, _json_colour(raw, where, path), where))
    return _finish_table(entries, path, "palette")


def _parse_text_palette(text: str, path: Path) -> ClassTable:
    entries: list[tuple[str, Colour, str]] = []
    for n, s in _content_lines(text, "palette", path):
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
        entries.append((_check_name(name, f"line {n}", path), rgb, f"line {n}"))
    return _finish_table(entries, path, "palette")


def read_palette(path: Path) -> ClassTable:
    """Read a ``--palette`` file: class_dict CSV, annotation-tool JSON, CVAT's ``labelmap.txt`` or ``r g b [name]`` text
    lines.

    JSON classes get ids in the order they are listed (any ``"id"`` field in the
    JSON is the tool's own numbering and is not used).
    """
    path = Path(path)
    text = read_table_text(path, "palette")
    if is_labelmap(text):
        return read_labelmap(path, text)
    head = text.lstrip()
    if path.suffix.lower() == ".json" or head.startswith(("{", "[")):
        return _parse_json_palette(load_table_json(text, "palette", path), path)
    first = next(_content_lines(text, "palette", path), (0, ""))[1]
    cols = _header_columns(_split(first, ","))
    if cols is not None and "r" in cols:
        return _parse_class_csv(text, path)
    return _parse_text_palette(text, path)


#: labelme's label files start with this line: class id -1, which labelme2voc writes as 255.
LABELME_IGNORE_NAME = "__ignore__"
#: One entry of a ``--classes`` file: (id or None, name, colour or None, where).
_Entry = tuple[int | None, str, Colour | None, str]
_MAX_SHOWN = 5


def _shown(values: list[int]) -> str:
    return ", ".join(map(str, values[:_MAX_SHOWN])) + (", …" if len(values) > _MAX_SHOWN else "")


def _named_table(entries: list[_Entry], path: Path) -> ClassTable:
    """A table from ``--classes`` entries: ids, when given, on every entry and 0..n-1 once each (kept as written,
    never renumbered); duplicate names or colours are a LabelError."""
    if not entries:
        raise LabelError("class list names no classes", path=path, fix="write one class name a line")
    ignore = None
    if entries[0][1] == LABELME_IGNORE_NAME and entries[0][0] is None:  # labelme's labels.txt: __ignore__ (-1,
        entries, ignore = entries[1:], 255  # stored 255), then id 0
    _check_count(len(entries), "class list", path)
    with_id = [e for e in entries if e[0] is not None]
    if with_id and len(with_id) != len(entries):
        bare = next(e for e in entries if e[0] is None)
        raise LabelError(f"{bare[3]} ({bare[1]!r}) has no id while {with_id[0][3]} ({with_id[0][1]!r}) has id "
                         f"{with_id[0][0]}", path=path,
                         fix="give every class its id, or none (then the order in the file gives them)")
    if with_id:
        by_id: dict[int, _Entry] = {}
        for e in entries:
            cid = int(e[0])  # type: ignore[arg-type]
            if cid in by_id:
                raise LabelError(f"class id {cid} appears twice ({by_id[cid][3]} {by_id[cid][1]!r} and {e[3]} "
                                 f"{e[1]!r})", path=path, fix="give every class its own id")
            by_id[cid] = e
        ids = sorted(by_id)
        if ids[-1] != len(ids) - 1:
            missing = sorted(set(range(ids[-1] + 1)) - set(ids))
            pairs = [f"{old}:{new}" for new, old in enumerate(ids) if old != new]
            label_map = (f"--label-map {','.join(pairs)}" if len(pairs) <= 8 else
                         f"a --label-map file of their {len(pairs)} OLD:NEW lines ({', '.join(pairs[:3])} …)")
            fix = (f"list every id 0..{ids[-1]} (name the unused ones, e.g. unused_{missing[0]}), or number them "
                   f"0..{len(ids) - 1} in this order and pass {label_map}")
            top = ids[-1]
            if top in (255, 65535) and ids[:-1] == list(range(len(ids) - 1)):  # the usual ignore ids
                fix = (f"if {top} ({by_id[top][1]!r}) marks pixels to ignore, drop it from the file and pass "
                       f"--ignore-index {top}; else {fix}")
            raise LabelError(f"class ids {_shown(ids)} skip {_shown(missing)}: a class table numbers its "
                             f"{len(ids)} classes 0..{len(ids) - 1}", path=path, fix=fix)
        entries = [by_id[i] for i in ids]
    seen: dict[object, str] = {}
    for _, name, colour, where in entries:
        for key, what in ((("name", name), f"class name {name!r}"), (("colour", colour), f"colour {colour}")):
            if key[1] is None:
                continue
            if key in seen:
                raise LabelError(f"{what} appears twice ({seen[key]} and {where})", path=path,
                                 fix="give every class its own name and colour")
            seen[key] = where
    classes = tuple(ClassInfo(i, name, colour) for i, (_, name, colour, _) in enumerate(entries))
    return ClassTable(classes, ignore, source=path.name)


_JSON_FORMS = ('write ["sky", …], [{"id": 0, "name": "sky", "color": [r, g, b]}, …], {"0": "sky", …} '
               '(id2label) or {"sky": [r, g, b], …}')


def _json_entry(value: Any, key: str | None, key_id: int | None, where: str, path: Path) -> _Entry:
    """One class of a JSON class list: ``value`` under ``key`` (an object's key; ``key_id`` when the keys are
    ids, the ``id2label`` shape) or a list item (``key`` None)."""
    cid: int | None = key_id
    colour: Colour | None = None
    name: Any
    if isinstance(value, str) and (key is None or key_id is not None):
        name = value
    elif isinstance(value, dict):
        if "name" not in value and (key is None or key_id is not None):
            raise LabelError(f"{where} has no \"name\"", path=path, fix=_JSON_FORMS)
        name = value.get("name", key)
        raw = next((value[k] for k in ("color", "colour", "rgb") if k in value), None)
        colour = None if raw is None else _json_colour(raw, where, path)
        id_key = next((k for k in ("id", "class_id") if k in value), None)
        if id_key is not None:
            cid = _parse_id(value[id_key], where, path)
            if key_id is not None and cid != key_id:
                raise LabelError(f"{where}: key {key!r} and \"{id_key}\": {value[id_key]!r} disagree", path=path,
                                 fix="write each class's id once")
    elif key is not None and key_id is None and isinstance(value, int) and not isinstance(value, bool):
        name, cid = key, _parse_id(value, where, path)  # {"sky": 0}: the label2id shape
    elif key is not None and key_id is None and isinstance(value, list | str):
        name, colour = key, _json_colour(value, where, path)  # {name: [r, g, b]}
    else:
        raise LabelError(f"{where}: {value!r} is not a class", path=path, fix=_JSON_FORMS)
    return cid, _check_name(name, where, path), colour, where


def _json_classes(obj: Any, path: Path) -> ClassTable:
    """``["a", "b"]``, ``{"classes"|"labels"|"names"|"id2label": …}``, objects with optional ids and colours,
    ``{"0": "a"}`` (id2label), ``{"a": 0}`` (label2id) or ``{name: [r, g, b]}``."""
    while isinstance(obj, dict):
        wrap = next((k for k in ("id2label", "classes", "labels", "names", "label2id") if k in obj), None)
        if wrap is None:
            break
        obj = obj[wrap]
    entries: list[_Entry] = []
    if isinstance(obj, list):
        for i, value in enumerate(obj):
            _check_count(i + 1, "class list", path, spare=1)
            entries.append(_json_entry(value, None, None, f"entry {i}", path))
    elif isinstance(obj, dict):
        keys = [k for k in obj if _DIGITS.fullmatch(k.strip())]
        if keys and len(keys) != len(obj):
            other = next(k for k in obj if not _DIGITS.fullmatch(k.strip()))
            raise LabelError(f"keys {keys[0]!r} (an id) and {other!r} (a name) are mixed", path=path,
                             fix=_JSON_FORMS)
        for i, (key, value) in enumerate(obj.items()):
            _check_count(i + 1, "class list", path, spare=1)
            where = f"entry {i} {key!r}"
            key_id = _parse_id(key, where, path) if keys else None
            entries.append(_json_entry(value, key, key_id, where, path))
    else:
        raise LabelError("class list JSON is neither a list nor an object", path=path, fix=_JSON_FORMS)
    return _named_table(entries, path)


#: CVAT's and Datumaro's ``labelmap.txt`` (the "Segmentation mask 1.1" / VOC export): ``name:r,g,b:parts:actions``
#: a line, under a ``# label:color_rgb:parts:actions`` comment; the class named ``background`` is id 0.
_LABELMAP = re.compile(r"^([^:]*\S)\s*:\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*:[^:]*:[^:]*$")
LABELMAP_BACKGROUND = "background"


def is_labelmap(text: str) -> bool:
    """Whether ``text`` is a CVAT/Datumaro ``labelmap.txt``: every content line ``name:r,g,b:parts:actions``."""
    lines = [s for line in text.splitlines()[: MAX_CLASSES + 8] if (s := line.strip()) and not s.startswith("#")]
    return bool(lines) and all(_LABELMAP.match(s) for s in lines)


def read_labelmap(path: Path, text: str | None = None) -> ClassTable:
    """A CVAT/Datumaro ``labelmap.txt`` as a colour table: ids in line order, except that ``background`` is id 0
    wherever it is listed (CVAT and Datumaro number it 0; moving it is logged). Parts and actions are not classes
    and are ignored."""
    path = Path(path)
    text = read_table_text(path, "label map") if text is None else text
    entries: list[tuple[str, Colour, str]] = []
    for n, s in _content_lines(text, "label map", path):
        m = _LABELMAP.match(s)
        if m is None:
            raise LabelError(f"line {n}: {s!r} is not name:r,g,b:parts:actions", path=path,
                             fix="write one class a line as name:r,g,b:: (CVAT's labelmap.txt)")
        name = _check_name(m.group(1), f"line {n}", path)
        entries.append((name, _rgb(m.group(2, 3, 4), f"line {n}: class {name!r}", path), f"line {n}"))
    first = next((i for i, e in enumerate(entries) if e[0] == LABELMAP_BACKGROUND), 0)
    if first:
        logger.info("%s: class %r (%s) is id 0, as CVAT numbers it; the classes before it move up by one", path,
                    LABELMAP_BACKGROUND, entries[first][2])
        entries.insert(0, entries.pop(first))
    return _finish_table(entries, path, "label map")


# The shapes of a headerless text line, richest first: r g b [name]; name,r,g,b; id name (0: sky); a name.
_RGB_NAME = re.compile(r"^(\d+)[\s,]+(\d+)[\s,]+(\d+)(?:[\s,]+(.*))?$")
_NAME_RGB = re.compile(r"^(.*?\S)\s*[,\t]\s*(\d+)\s*[,\t]\s*(\d+)\s*[,\t]\s*(\d+)$")
_ID_NAME = re.compile(r"^(\d+)\s*[:,\s]\s*(.+)$")
_SHAPES = {"r g b name": 3, "name,r,g,b": 3, "id name": 2, "name": 1}


def _line_shapes(line: str) -> dict[str, re.Match[str] | None]:
    """Every shape ``line`` can be read as (a plain name always)."""
    shapes: dict[str, re.Match[str] | None] = {}
    for shape, pattern in (("r g b name", _RGB_NAME), ("name,r,g,b", _NAME_RGB), ("id name", _ID_NAME)):
        if m := pattern.match(line):
            shapes[shape] = m
    shapes["name"] = None
    return shapes


def _text_entries(lines: list[tuple[int, str]], path: Path) -> list[_Entry]:
    """Entries of a headerless text file, every line read in the one shape the whole file has; a line that
    also reads as a richer shape than the file's (``1 2 3`` among names: a colour or a name?) is refused."""
    shapes = [(n, s, _line_shapes(s)) for n, s in lines]
    common = set(_SHAPES).intersection(*(sh.keys() for _, _, sh in shapes))
    rank = max(_SHAPES[s] for s in common)
    best = [s for s in common if _SHAPES[s] == rank]
    if len(best) > 1:
        raise LabelError(f"every line reads as {' and as '.join(sorted(best))}", path=path,
                         fix="add a header line (r,g,b,name or name,r,g,b) so each column is named")
    shape = best[0]
    for n, s, sh in shapes:
        richer = next((x for x in sh if _SHAPES[x] > rank), None)
        if richer is not None:
            other = next(m for m, _, o in shapes if richer not in o)
            raise LabelError(f"line {n}: {s!r} reads as '{richer}' but line {other} as '{shape}'", path=path,
                             fix="write the file as JSON ([\"name\", …]) or CSV with a header (name / id,name / "
                             "name,r,g,b) so every line reads one way")
    entries: list[_Entry] = []
    for n, s, sh in shapes:
        where, m = f"line {n}", sh[shape]
        if m is None:
            entries.append((None, _check_name(s, where, path), None, where))
        elif shape == "id name":
            entries.append((_parse_id(m.group(1), where, path), _check_name(m.group(2), where, path), None, where))
        else:
            rgb, name = (m.group(1, 2, 3), m.group(4)) if shape == "r g b name" else (m.group(2, 3, 4), m.group(1))
            colour = _rgb(rgb, where, path)
            entries.append((None, _check_name(name or f"class_{len(entries)}", where, path), colour, where))
    return entries


def _csv_entries(lines: Iterator[tuple[int, str]], cols: dict[str, int], delimiter: str, width: int,
                 path: Path) -> list[_Entry]:
    """Entries of the rows under a header (its columns ``cols``, ``width`` fields)."""
    has_rgb = all(k in cols for k in "rgb")
    entries: list[_Entry] = []
    for number, line in lines:
        where = f"line {number}"
        fields = _split(line, delimiter)
        if len(fields) < width or any(fields[width:]):
            raise LabelError(f"{where}: {line!r} has {len(fields)} fields, the header {width}", path=path,
                             fix="write one class a row under the header (quote a name holding the delimiter)")
        name = _check_name(fields[cols["name"]], where, path)
        colour = _rgb((fields[cols[k]] for k in "rgb"), where, path) if has_rgb else None
        cid = _parse_id(fields[cols["id"]], where, path) if "id" in cols else None
        entries.append((cid, name, colour, where))
    return entries


def _object_info_table(entries: list[_Entry], path: Path) -> ClassTable:
    """SceneParsing's objectInfo150 table: its ``Idx`` ids (1..n, each once) kept as the label files hold them,
    and id 0 "other objects" as the ignore id, as the benchmark defines it (its README: "0 refers to 'other
    objects'. We do not consider those pixels in our evaluation"). Nothing is renumbered: mmsegmentation's
    reduced ids (--reduce-zero-label: 0 → 255, v → v - 1) need a table of the names alone, in order."""
    _check_count(len(entries) + 1, "class list", path)
    ids = sorted(int(e[0]) for e in entries if e[0] is not None)
    if ids != list(range(1, len(entries) + 1)):
        raise LabelError(f"the Idx column holds {ids[:3]}…{ids[-3:]}, not 1..{len(entries)} once each", path=path,
                         fix="pass SceneParsing's objectInfo150 file as released (Idx 1..150)")
    by_id = {int(e[0]): e for e in entries}  # type: ignore[arg-type]
    names = [OTHER_OBJECTS, *(by_id[i][1] for i in range(1, len(entries) + 1))]
    if len(set(names)) != len(names):
        raise LabelError("a class name appears twice", path=path, fix="list each class once")
    logger.info("%s: SceneParsing's objectInfo table: ids 1..%d as the label files hold them, 0 = %r is the "
                "ignore id (the benchmark does not evaluate it)", path, len(entries), OTHER_OBJECTS)
    return ClassTable(tuple(ClassInfo(i, n) for i, n in enumerate(names)), 0, source=path.name)


def read_classes(path: Path) -> ClassTable:
    """Read a ``--classes`` file: class names, optionally with ids and colours, as JSON, CSV/TSV or text.

    - JSON: ``["sky", "road"]``, ``{"classes"|"labels"|"names": [...]}``, ``[{"name", "color"?, "id"?}]``,
      ``{"0": "sky"}`` (``id2label``, also under an ``"id2label"`` key, as in a model's config.json),
      ``{"sky": 0}`` (``label2id``) or ``{name: [r, g, b]}``; ids are JSON integers or strings of digits;
    - CSV/TSV with a header naming a ``name`` column (aliases ``class``, ``class_name``, ``label`` …; ``r,g,b``
      and ``id`` columns optional), one column included: a header row is never a class;
    - text: one class a line as ``name``, ``id name`` (``0: sky``), ``r g b [name]`` or ``name,r,g,b``, the
      same shape on every line (a line that reads two ways is refused); blank and ``#`` lines skipped;
    - CVAT's ``labelmap.txt`` (``name:r,g,b::`` lines): :func:`read_labelmap`.

    Ids are the order in the file unless the file gives them (then on every class, 0..n-1 once each: never
    renumbered). SceneParsing's ``objectInfo150`` (a first column ``Idx``, ids 1..150) keeps its ids, with 0
    "other objects" as the ignore id (:func:`_object_info_table`). A first class ``__ignore__`` (labelme's label
    files) is dropped and makes 255 the ignore id, as labelme2voc writes it. Names are non-empty, without control
    characters, each once.
    """
    path = Path(path)
    text = read_table_text(path, "class list")
    if is_labelmap(text):
        return read_labelmap(path, text)
    head = text.lstrip()
    if path.suffix.lower() == ".json" or head.startswith(("{", "[")):
        return _json_classes(load_table_json(text, "class list", path), path)
    lines = _content_lines(text, "class list", path)
    first = next(lines, None)
    if first is None:
        raise LabelError("class list names no classes", path=path, fix="write one class name a line")
    delimiter = "\t" if path.suffix.lower() == ".tsv" or "\t" in first[1] else ","
    fields = _split(first[1], delimiter)
    cols = _header_columns(fields)
    if cols is not None:
        logger.info("%s: line %d %r is the header (columns %s)", path, first[0], first[1], ", ".join(sorted(cols)))
        if "id" not in cols and fields[0].lower() == OBJECT_INFO_ID:
            return _object_info_table(_csv_entries(lines, {**cols, "id": 0}, delimiter, len(fields), path), path)
        return _named_table(_csv_entries(lines, cols, delimiter, len(fields), path), path)
    return _named_table(_text_entries([first, *lines], path), path)
