"""splitfiles: the typed core under the manifest — each part parses its JSON with its own checks and writes it
back unchanged; a loaded manifest holds types, not dicts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from shardkit.errors import UnsafePathError
from shardkit.files.splitfiles import ClassTable, Preprocessing, SampleSpec, Source, SplitStats, member_path
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


def test_member_path_walks_real_paths_only_for_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain shard file (no link, no sub-folder) is checked with one ``lstat``, not two real-path walks
    (opening a split checks every shard file, #42); a link is still resolved, and refused when it leaves."""
    split, outside = tmp_path / "split", tmp_path / "outside.bin"
    split.mkdir()
    outside.write_bytes(b"x")
    (split / "plain.npy").write_bytes(b"x")
    (split / "inside.npy").symlink_to("plain.npy")
    (split / "leaves.npy").symlink_to(outside)
    walks: list[str] = []
    real = os.path.realpath

    def counted(path: Any, *args: Any, **kwargs: Any) -> str:
        walks.append(os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os.path, "realpath", counted)
    assert member_path("plain.npy", split) == split / "plain.npy" and walks == []
    assert member_path("inside.npy", split) == split / "inside.npy" and walks
    with pytest.raises(UnsafePathError, match="outside the dataset folder"):
        member_path("leaves.npy", split)
    (split / "sub").symlink_to(tmp_path)  # a folder link: the walk sees through it
    with pytest.raises(UnsafePathError, match="outside the dataset folder"):
        member_path("sub/outside.bin", split)
