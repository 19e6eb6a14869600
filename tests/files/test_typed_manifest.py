"""The manifest's typed parts are read as types: what reports a split's facts (``shardkit info``, the class chart,
the audit's facts, the Croissant metadata, a Dataset's class names, colours, mean and std) never reads the class
table, statistics, source or preprocessing through their dict view (``JsonView``, which rebuilds a part's whole JSON
on every access), and says what the JSON says."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.audit.croissant import write_croissant
from shardkit.audit.facts import split_facts
from shardkit.cli import main
from shardkit.files.splitfiles import ClassTable, JsonView, Preprocessing, SampleSpec, Source, SplitStats
from shardkit.show import class_share_basis, plot_classes

#: The parts read as types here (a sample's stored shape, 3-D patches' depth included: ``SampleSpec.image_dims``).
TYPED = (ClassTable, SplitStats, Source, Preprocessing, SampleSpec)


def _refuse_dict_view(monkeypatch: pytest.MonkeyPatch, *types: type[JsonView]) -> None:
    def refuse(self: JsonView, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a dict-style read of the typed {type(self).__name__}")

    for cls in types:
        for name in ("__getitem__", "__iter__", "__len__", "__contains__", "get", "keys", "items", "values"):
            monkeypatch.setattr(cls, name, refuse)


def test_a_splits_facts_are_read_from_the_typed_manifest(camvid_val_npy: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    doc = json.loads((camvid_val_npy / "manifest.json").read_text())
    classes, stats = doc["classes"]["classes"], doc["stats"]
    ds = shardkit.open(camvid_val_npy)
    keys = [ds.key(i) for i in range(len(ds))]
    _refuse_dict_view(monkeypatch, *TYPED)

    assert ds.class_names == [c["name"] for c in classes]
    assert ds.class_colours == [tuple(c["colour"]) if c["colour"] else None for c in classes]
    assert ds.mean.tolist() == np.float32(stats["image_mean"]).tolist()
    assert ds.std.tolist() == np.float32(stats["image_std"]).tolist()

    ignore = doc["classes"]["ignore_index"]
    share = stats["class_pixels"][ignore] / stats["pixels"]
    assert class_share_basis(ds.manifest) == (f"class share of label pixels, ignore class {ignore} "
                                              f"({classes[ignore]['name']}) included")
    assert plot_classes(camvid_val_npy, tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"

    facts = split_facts(ds, None, keys)
    assert (facts.ignore_index, facts.class_source) == (ignore, doc["classes"]["source"])
    assert facts.ignore_share == pytest.approx(share)

    path, _ = write_croissant([(ds.manifest, camvid_val_npy)], tmp_path / "croissant.json", "camvid")
    meta = json.loads(path.read_text())
    data = next(r for r in meta["recordSet"] if r["@id"] == "classes")["data"]
    assert [(d["classes/id"], d["classes/name"]) for d in data] == [(c["id"], c["name"]) for c in classes]
    assert f"images [360, 480, 3] |u1, labels {doc['sample']['label']['encoding']} |u1" in meta["description"]

    res = CliRunner().invoke(main, ["info", str(camvid_val_npy)])
    assert res.exit_code == 0, res.output
    assert f"image 360x480x3 uint8; label {doc['sample']['label']['encoding']} uint8" in res.output
    assert f"class table: {len(classes)} classes from {doc['classes']['source']}" in res.output
    for c in classes:
        assert f"  {c['id']:>3} {c['name']:<20} {100 * stats['class_share'][c['id']]:6.2f} %" in res.output
    assert f"ignore index {ignore} ({classes[ignore]['name']}): {100 * share:.2f} % of label pixels" in res.output

    res = CliRunner().invoke(main, ["info", str(camvid_val_npy), "--class-weights", "median_frequency"])
    assert res.exit_code == 0, res.output
    for c in classes:
        assert re.search(rf"^ +{c['id']} {re.escape(c['name'])} ", res.output, re.MULTILINE), c
