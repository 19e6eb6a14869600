"""Class tables read from files: ``class_dict.csv``, JSON and plain-text palettes.

Every problem in a file is a one-line :class:`~shardkit.errors.LabelError` naming the file and the line.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputNotFoundError, LabelError
from ..smallfile import read_small_text
from .classes import MAX_CLASSES, ClassInfo, ClassTable, Colour, _check_colour

_HEADER_ALIASES = {
    "name": ("name", "class", "class_name", "classname", "label", "label_name"),
    "r": ("r", "red"),
    "g": ("g", "green"),
    "b": ("b", "blue"),
}


def _read_text(path: Path, what: str) -> str:
    try:
        return read_small_text(path, what)
    except FileNotFoundError:
        raise InputNotFoundError(f"{what} does not exist", path=path, fix="check the path") from None
    except UnicodeDecodeError as exc:
        raise LabelError(
            f"{what} is not UTF-8 text (byte {exc.start})", path=path, fix="save it as UTF-8 CSV"
        ) from None
    except OSError as exc:
        raise LabelError(
            f"cannot read {what}: {exc.strerror or exc}", path=path, fix="point at a readable regular file"
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
        entries.append((name, rgb, f"line {n}"))
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


_ID_NAME = re.compile(r"^(\d+)\s*[:,\s]\s*(.+)$")
_RGB_NAME = re.compile(r"^(\d+)[\s,]+(\d+)[\s,]+(\d+)(?:[\s,]+(.*))?$")
#: labelme's label files start with this line: class id -1, which labelme2voc writes as 255.
LABELME_IGNORE_NAME = "__ignore__"


def _named_table(entries: list[tuple[int | None, str, Colour | None, str]], path: Path) -> ClassTable:
    """A table from (id or None, name, colour or None, where) entries: ids, when given, must be 0..n-1 once each;
    duplicate names or colours are a LabelError."""
    if not entries:
        raise LabelError("class list names no classes", path=path, fix="write one class name a line")
    ignore = None
    if entries[0][1] == LABELME_IGNORE_NAME:  # labelme's labels.txt: __ignore__ (-1, stored 255), then id 0
        entries, ignore = entries[1:], 255
    ids = [e[0] for e in entries]
    if any(i is not None for i in ids):
        if any(i is None for i in ids) or sorted(ids) != list(range(len(ids))):  # type: ignore[type-var]
            raise LabelError(f"class ids {ids[:8]} are not 0..{len(ids) - 1}, each once", path=path,
                             fix="number the classes 0, 1, 2 … (or leave the ids out: line order gives them)")
        entries = sorted(entries, key=lambda e: e[0])  # type: ignore[arg-type,return-value]
    if len(entries) > MAX_CLASSES:
        raise LabelError(f"class list names {len(entries)} classes, more than {MAX_CLASSES}", path=path)
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


def _json_classes(obj: Any, path: Path) -> ClassTable:
    """``["a", "b"]``, ``{"classes": [...]}``, or any palette JSON shape with colours optional."""
    while isinstance(obj, dict) and any(k in obj for k in ("labels", "classes", "names")):
        obj = next(obj[k] for k in ("labels", "classes", "names") if k in obj)
    entries: list[tuple[int | None, str, Colour | None, str]] = []
    items = list(obj.items()) if isinstance(obj, dict) else list(enumerate(obj)) if isinstance(obj, list) else None
    if items is None:
        raise LabelError("class list JSON is neither a list nor an object", path=path,
                         fix='write ["name", …] or [{"name": …, "color": [r, g, b]}, …]')
    for i, (key, value) in enumerate(items):
        where = f"entry {i}"
        if isinstance(value, str):
            name, raw, cid = value, None, None
        elif isinstance(value, dict):
            name = str(value.get("name", key))
            raw = next((value[k] for k in ("color", "colour", "rgb") if k in value), None)
            cid = value.get("id")
        else:  # {name: [r, g, b]}
            name, raw, cid = str(key), value, None
        colour = None if raw is None else _json_colour(raw, where, path)
        entries.append((int(cid) if isinstance(cid, int) else None, name, colour, where))
    return _named_table(entries, path)


def read_classes(path: Path) -> ClassTable:
    """Read a ``--classes`` file: class names, optionally with ids and colours, as JSON, CSV or text.

    - JSON: ``["sky", "road"]``, ``{"classes": [...]}``, ``[{"name", "color"?, "id"?}]`` or ``{name: [r, g, b]}``;
    - CSV with a header naming a ``name`` column (``r,g,b`` and ``id`` columns optional);
    - text: one class a line as ``name``, ``id name`` (``0: sky``) or ``r g b name``; blank and ``#`` lines skipped.

    Ids are the line order unless the file gives them (then 0..n-1, each once). A first class ``__ignore__``
    (labelme's label files) is dropped and makes 255 the ignore id, as labelme2voc writes it.
    """
    path = Path(path)
    text = _read_text(path, "class list")
    head = text.lstrip("\ufeff").lstrip()
    if path.suffix.lower() == ".json" or head.startswith(("{", "[")):
        try:
            return _json_classes(json.loads(text), path)
        except json.JSONDecodeError as exc:
            raise LabelError(f"class list JSON is invalid at line {exc.lineno}: {exc.msg}", path=path,
                             fix="fix the JSON syntax") from None
    lines = [(n, ln.strip()) for n, ln in enumerate(head.splitlines(), 1)
             if ln.strip() and not ln.strip().startswith("#")]
    header = [f.strip().lower() for f in lines[0][1].split(",")] if lines else []
    entries: list[tuple[int | None, str, Colour | None, str]] = []
    if len(header) > 1 and any(a in header for a in _HEADER_ALIASES["name"]):
        cols = {key: next((header.index(a) for a in aliases if a in header), None)
                for key, aliases in {**_HEADER_ALIASES, "id": ("id", "class_id", "index", "value")}.items()}
        has_rgb = all(cols[k] is not None for k in "rgb")
        for row_number, row in enumerate(csv.reader(io.StringIO("\n".join(ln for _, ln in lines[1:]))), 2):
            fields = [f.strip() for f in row]
            where = f"row {row_number}"
            try:
                name = fields[cols["name"]]  # type: ignore[index]
                colour = tuple(int(fields[cols[k]]) for k in "rgb") if has_rgb else None  # type: ignore[index]
                cid = int(fields[cols["id"]]) if cols["id"] is not None else None
            except (IndexError, ValueError):
                raise LabelError(f"{where}: {','.join(fields)!r} does not fit the header {','.join(header)!r}",
                                 path=path, fix="write one class a row under the header") from None
            if colour is not None and not all(0 <= v <= 255 for v in colour):
                raise LabelError(f"{where}: colour {colour} is not three integers 0..255", path=path)
            entries.append((cid, name, colour, where))  # type: ignore[arg-type]
        return _named_table(entries, path)
    for number, line in lines:
        where = f"line {number}"
        if m := _RGB_NAME.match(line):
            rgb = tuple(int(v) for v in m.group(1, 2, 3))
            if not all(0 <= v <= 255 for v in rgb):
                raise LabelError(f"{where}: colour {rgb} is not three integers 0..255", path=path)
            entries.append((None, (m.group(4) or f"class_{len(entries)}").strip(), rgb, where))  # type: ignore[arg-type]
        elif m := _ID_NAME.match(line):
            entries.append((int(m.group(1)), m.group(2).strip(), None, where))
        else:
            entries.append((None, line, None, where))
    return _named_table(entries, path)
