"""splitfiles: the typed core under the manifest — each part parses its JSON with its own checks and writes it
back unchanged; a loaded manifest holds types, not dicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardkit.files.splitfiles import ClassTable, Preprocessing, SampleSpec, Source, SplitStats
from shardkit.store.manifest import MANIFEST_NAME, load_manifest
from shardkit.store.publish import manifest_text


def test_a_loaded_manifest_holds_types_and_writes_its_file_back_byte_for_byte(camvid_val_npy: Path) -> None:
    m = load_manifest(camvid_val_npy)
    assert isinstance(m.sample, SampleSpec) and m.sample.size == (360, 480) and m.sample.num_classes == 12
    assert isinstance(m.classes, ClassTable) and m.classes.ignore_index == 11
    assert isinstance(m.stats, SplitStats) and sum(m.stats.class_pixels or ()) > 0
    assert isinstance(m.source, Source) and m.source.pairs == 26 and m.source.layout == "segnet"
    assert isinstance(m.preprocessing, Preprocessing) and m.preprocessing["size"] == [360, 480]
    assert manifest_text(m) == (camvid_val_npy / MANIFEST_NAME).read_text()
    # the dict reading of earlier versions still works
    assert m.classes["ignore_index"] == 11 and m.stats.get("image_mean") == list(m.stats.image_mean or ())


def test_keys_a_part_does_not_know_are_kept_and_written_back() -> None:
    """What a later version adds to source or stats (tiles' provenance, per-band statistics) survives a read."""
    stats = {"pixels": 4, "class_pixels": [1, 3], "band_mean": [1.5, 2.5], "ignore_pixels": 0}
    assert SplitStats.from_json(stats).to_json() == stats
    source = {"layout": "generic", "pairs": 2, "tiles": {"size": [8, 8]}, "unmatched_images": ["a.png"]}
    parsed = Source.from_json(source)
    assert parsed.extra == {"tiles": {"size": [8, 8]}} and parsed.unmatched_images == ("a.png",)
    assert json.dumps(parsed.to_json(), sort_keys=True) == json.dumps(source, sort_keys=True)


@pytest.mark.parametrize(("part", "bad", "problem"), [
    (SplitStats.from_json, {"image_mean": [1.0, 2.0]}, "one per image channel"),
    (SplitStats.from_json, {"class_share": ["a"]}, "not a list of numbers"),
    (SplitStats.from_json, {"pixels": "many"}, "not a number"),
    (Source.from_json, {"root": 3}, "source.root is not a string"),
    (Source.from_json, {"unmatched_labels": "x"}, "not a list of strings"),
    (SampleSpec.from_json, {"image": {"shape": [10**6, 10**6, 3]},
                            "label": {"num_classes": 2, "encoding": "index", "class_id_dtype": "|u1"}}, "image shape"),
    (SampleSpec.from_json, {"image": {"shape": [4, 4, 3]},
                            "label": {"num_classes": 0, "encoding": "index", "class_id_dtype": "|u1"}}, "num_classes"),
])
def test_each_part_checks_itself(part: object, bad: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        part(bad)  # type: ignore[operator]


def test_a_class_table_from_a_manifest_must_list_the_samples_classes() -> None:
    table = {"classes": [{"id": 0, "name": "a", "colour": None}, {"id": 1, "name": "b", "colour": [1, 2, 3]}],
             "ignore_index": None, "num_classes": 2, "source": "x", "remap": None}
    parsed = ClassTable.from_manifest(table, 2)
    assert parsed.to_json() == table
    with pytest.raises(ValueError, match="classes lists 2 classes, the sample has 3"):
        ClassTable.from_manifest(table, 3)
    with pytest.raises(ValueError, match="colour"):
        ClassTable.from_manifest({**table, "classes": [{"id": 0, "name": "a", "colour": [1, 2]}]}, 2)
    swapped = {**table, "classes": table["classes"][::-1]}
    with pytest.raises(ValueError, match="class table is invalid"):
        ClassTable.from_manifest(swapped, 2)
