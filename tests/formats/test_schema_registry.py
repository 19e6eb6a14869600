"""formats/manifest.schema.json and the format registry state the same facts.

The schema lists formats, compressions and codecs by hand; the registry is what the code writes and accepts. For
every format and every (compression, image codec, label codec) the codecs module knows, the schema accepts the
manifest header that format would write exactly when the format's own ``check_options`` accepts the options.
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import jsonschema
import pytest

from shardkit.codecs.registry import CODECS, IMAGE, LABEL, ArrayCodecs, parse_codec
from shardkit.errors import ConfigError
from shardkit.formats.base import SampleSpec
from shardkit.formats.registry import all_formats, get, names

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "formats" / "manifest.schema.json").read_text(encoding="utf-8"))
BASE = json.loads((ROOT / "formats" / "golden" / "manifest2-npy-fixed" / "train" / "manifest.json")
                  .read_text(encoding="utf-8"))
COMPRESSIONS = sorted({c for fmt in all_formats() for c in fmt.compressions} | {"zip"})


def _codec(name: str, kind: str):
    try:
        return parse_codec(name, kind)
    except ConfigError:
        return None


def _header(fmt_name: str, compression: str, image: str, label: str) -> tuple[dict, bool] | None:
    """The manifest ``fmt_name`` would write with these options, and whether the format accepts them."""
    image_codec, label_codec = _codec(image, IMAGE), _codec(label, LABEL)
    if image_codec is None or label_codec is None:
        return None  # refused before any format sees it
    fmt = get(fmt_name)
    codecs = ArrayCodecs(image_codec, label_codec)
    try:
        fmt.check_options(compression, codecs)
        accepted = True
    except ConfigError:
        accepted = False
    spec = SampleSpec.from_manifest(BASE["sample"])
    manifest = copy.deepcopy(BASE)
    manifest["format"] = fmt_name
    manifest["format_version"] = fmt.version_for(compression, codecs)
    manifest["format_options"] = fmt.format_options(spec, compression, codecs) if accepted else (
        {"compression": compression} | ({} if codecs.raw else {"codecs": codecs.to_json()}))
    manifest["preprocessing"] = {**manifest["preprocessing"], "compression": compression}
    return manifest, accepted


def test_the_schema_lists_the_registered_formats() -> None:
    assert sorted(SCHEMA["properties"]["format"]["enum"]) == sorted(names())


@pytest.mark.parametrize("fmt", names())
def test_the_schema_accepts_exactly_what_the_format_writes(fmt: str) -> None:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    disagree, checked = [], 0
    for compression, image, label in itertools.product(COMPRESSIONS, CODECS, CODECS):
        case = _header(fmt, compression, image, label)
        if case is None:
            continue
        manifest, accepted = case
        checked += 1
        if validator.is_valid(manifest) != accepted:
            disagree.append((compression, image, label, "format accepts" if accepted else "format refuses"))
    assert checked > 10 and not disagree
