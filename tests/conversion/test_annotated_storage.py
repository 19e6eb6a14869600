"""Annotation sources with the input on object storage (moto's S3 server on 127.0.0.1, as in
tests/test_object_storage.py): COCO, labelme and CVAT trees convert from a bucket exactly as from a local folder, an
edited annotation object is a change; sources whose workers read label files (COCO panoptic, instance masks) are
refused in one line with nothing written."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.files.storage import Remote
from tests.annotation_trees import coco_tree, labelme_tree, panoptic_tree
from tests.labels.sources.test_coco import semantic_reference
from tests.labels.sources.test_cvat import tree as cvat_tree
from tests.labels.sources.test_cvat import xml as cvat_xml

pytest.importorskip("pycocotools")
pytest.importorskip("moto")
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    from shardkit.testing import local_s3, make_bucket

    with local_s3() as endpoint:
        make_bucket("raw")
        yield endpoint


def upload(local: Path, url: str) -> str:
    remote = Remote(url)
    for p in sorted(local.rglob("*")):
        if p.is_file():
            remote.upload(p, p.relative_to(local).as_posix())
    return url


def convert(*args: Any) -> Any:
    return CliRunner().invoke(main, ["convert", *(str(a) for a in args), "--workers", "1"])


TREES: dict[str, Callable[[Path], Path]] = {"coco": coco_tree, "labelme": labelme_tree,
                                            "cvat": lambda root: cvat_tree(root, cvat_xml())}


@pytest.mark.parametrize("kind", sorted(TREES))
def test_annotated_tree_in_a_bucket_converts_as_the_local_one(s3: str, tmp_path: Path, kind: str) -> None:
    raw = TREES[kind](tmp_path / "raw")
    url = upload(raw, f"s3://raw/{kind}")
    local = convert(raw, tmp_path / "local")
    assert local.exit_code == 0, local.output
    res = convert(url, tmp_path / "remote")
    assert res.exit_code == 0, res.output
    assert f"annotations: {kind} in" in res.output
    a, b = shardkit.open(tmp_path / "local" / "all"), shardkit.open(tmp_path / "remote" / "all")
    assert len(a) == len(b) > 0 and a.class_names == b.class_names
    for i in range(len(a)):
        assert a.key(i) == b.key(i)
        np.testing.assert_array_equal(a[i][0], b[i][0])
        np.testing.assert_array_equal(a[i][1], b[i][1])
    notes = [json.loads((tmp_path / out / "all" / "manifest.json").read_text())["source"]["annotations"]
             for out in ("local", "remote")]
    assert notes[0] == notes[1]  # the same files (relative), digest, table origin, policies and report


def test_edited_annotation_object_is_a_change(s3: str, tmp_path: Path) -> None:
    raw = coco_tree(tmp_path / "raw")
    url = upload(raw, "s3://raw/coco-edit")
    flag = ("--annotations", "coco:annotations.json")  # relative to the input URL
    assert convert(url, tmp_path / "out", *flag).exit_code == 0
    doc = json.loads((raw / "annotations.json").read_text())
    doc["annotations"] = doc["annotations"][1:]
    (raw / "annotations.json").write_text(json.dumps(doc))
    Remote(url).upload(raw / "annotations.json", "annotations.json")
    res = convert(url, tmp_path / "out", *flag)
    assert res.exit_code == 0, res.output
    assert "1 shards planned, 0 reused" in res.output
    ds = shardkit.open(tmp_path / "out" / "all")
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i][1], semantic_reference(raw / "annotations.json", ds.key(i),
                                                                   {i: i for i in range(21)}))


def test_panoptic_in_a_bucket_is_one_line_nothing_written(s3: str, tmp_path: Path) -> None:
    url = upload(panoptic_tree(tmp_path / "raw"), "s3://raw/panoptic")
    res = convert(url, tmp_path / "out")
    lines = [ln for ln in res.output.splitlines() if ln.startswith("Error")]
    assert res.exit_code != 0 and len(lines) == 1 and "Traceback" not in res.output, res.output
    assert "coco-panoptic annotations are not read from object storage" in lines[0] and "fix:" in lines[0]
    assert not (tmp_path / "out").exists()


def test_staging_folder_behind_a_symbolic_link(s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing's skeleton under a linked $SHARDKIT_STAGING_DIR (macOS's /tmp is one): the annotation source
    resolves its image paths, and their sizes are still read from the bucket."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setenv("SHARDKIT_STAGING_DIR", str(tmp_path / "link"))
    url = upload(coco_tree(tmp_path / "raw"), "s3://raw/coco-linked")
    res = convert(url, tmp_path / "out")
    assert res.exit_code == 0, res.output
    assert len(shardkit.open(tmp_path / "out" / "all")) == 3
