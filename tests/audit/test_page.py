"""``shardkit audit``'s page on real CamVid, read as text: every section there, its numbers those of the manifests
and sidecars (recounted here independently), the planted leak and copy found, nothing fetched from outside."""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from scipy import ndimage

import shardkit
from shardkit.audit.page import THUMB_WIDTH
from shardkit.cli import main

from .conftest import SEQUENCE

SECTIONS = ("summary", "classes", "groups", "leaks", "duplicates", "near", "sanity", "tiles", "samples",
            "provenance")


def _section(page: str, name: str) -> str:
    found = re.search(rf'<section id="{name}">(.*?)</section>', page, re.S)
    assert found is not None, f"no section {name}"
    return found.group(1)


def _cells(fragment: str) -> list[list[str]]:
    """The rows of the tables in ``fragment`` as text cells."""
    return [[html.unescape(c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", fragment)]


@pytest.fixture(scope="module")
def page(audited: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    target = tmp_path_factory.mktemp("audit-page") / "report.html"
    got = CliRunner().invoke(main, ["audit", str(audited), "--html", str(target), "--group-by", SEQUENCE,
                                    "--samples", "5"])
    assert got.exit_code == 0, got.output
    assert f"audit report written to {target}" in got.output
    return target.read_text(encoding="utf-8")


def test_every_section_is_there_in_order(page: str) -> None:
    places = [page.index(f'<section id="{s}">') for s in SECTIONS]
    assert places == sorted(places)
    assert all(f'href="#{s}"' in page for s in SECTIONS)  # the navigation links each one


def test_the_page_fetches_nothing_and_runs_nothing(page: str) -> None:
    links = re.findall(r'\b(?:src|href)="([^"]*)"', page)
    assert links and all(v.startswith(("data:", "#")) for v in links), [v[:40] for v in links]
    assert "<script" not in page and "@import" not in page and "url(" not in page


def test_summary_and_class_numbers_are_the_manifests(page: str, audited: Path) -> None:
    summary = _cells(_section(page, "summary"))
    classes = _section(page, "classes")
    for split in ("train", "val"):
        ds = shardkit.open(audited / split)
        m = ds.manifest
        row = next(r for r in summary if r[0] == split)
        assert row[1] == str(m.num_samples) and row[2] == str(len(m.shards))
        part = classes.split(f'id="classes-{split}"')[1].split('<h3 id="classes-')[0]
        table = _cells(part)[1:]
        presence = ds.class_presence()
        assert presence is not None
        assert len(table) == ds.num_classes
        for c, r in enumerate(table):
            assert r[:4] == [str(c), ds.class_names[c], str(m.stats["class_pixels"][c]),
                             f"{100 * m.stats['class_share'][c]:.2f} %"]
            assert r[4] == str(int(presence[:, c].sum()))  # images holding the class, from the bitmaps
        assert part.count("<svg") == 2  # pixel share and images per class, each an inline SVG chart
        assert part.count("<rect") == 4 * ds.num_classes  # a track and a bar per class per chart


def test_the_planted_leak_and_copy_are_found(page: str, audited: Path) -> None:
    groups = _section(page, "groups")
    assert "<b>3</b> groups of 57 samples" in groups  # 0001TP, 0006R0, 0016E5 (the planted copy joins val's)
    leaks = _cells(_section(page, "leaks"))
    assert ["0016E5", "train, val"] in leaks
    dupes = html.unescape(_section(page, "duplicates"))
    assert "1 duplicate image(s) in 1 group(s) among 57 samples, 1 group(s) across splits" in dupes
    assert "2 copies: train:train/0016E5_07959.png = val:val/0016E5_07959.png" in dupes
    train, val = shardkit.open(audited / "train"), shardkit.open(audited / "val")
    planted = next(i for i in range(len(train)) if train.key(i) == "train/0016E5_07959.png")
    pictured = re.findall(r'<img alt="(\w+ #\d+)"', dupes)  # the two copies side by side
    assert pictured == [f"train #{planted}", "val #0"] and val.key(0) == "val/0016E5_07959.png"
    leak_pictures = re.findall(r'<img alt="(\w+ #\d+)"', _section(page, "leaks"))
    first = min(i for i in range(len(train)) if train.key(i).startswith("train/0016E5"))
    assert leak_pictures == [f"train #{first}", "val #0"]  # the shared sequence's first sample in each split


def test_near_duplicates_are_counted_by_kind_as_the_search_finds_them(page: str, audited: Path) -> None:
    """The planted copy is a near-duplicate (0 bits) across splits inside its sequence; the page's counts are those
    of the search over the sidecars' look hashes, each kind in its row."""
    from shardkit.audit.groups import GroupRule
    from shardkit.audit.near import DEFAULT_THRESHOLD, KINDS, near_report
    from shardkit.audit.split import pool

    datasets = [shardkit.open(audited / s) for s in ("train", "val")]
    pooled = pool(datasets, GroupRule.of(SEQUENCE))
    assert pooled.looks is not None
    want = near_report(pooled.split_of, pooled.groups, pooled.looks, DEFAULT_THRESHOLD)
    rows = dict((r[0], int(r[1])) for r in _cells(_section(page, "near"))[1:])
    assert rows == want.counts and rows[KINDS[1]] >= 1 and rows[KINDS[0]] == 0


def test_label_sanity_numbers_are_those_of_the_labels(page: str, audited: Path) -> None:
    sanity = _section(page, "sanity")
    for split in ("train", "val"):
        ds = shardkit.open(audited / split, labels="ids")
        part = sanity.split(f'id="sanity-{split}"')[1].split('<h3 id="sanity-')[0]
        rows = _cells(part)[1:]
        assert len(rows) == 5
        for r in rows:
            i = int(r[0])
            assert r[1] == ds.key(i)
            ids = np.asarray(ds[i][1])
            assert r[2] == f"{100 * float((ids == 11).mean()):.2f} %"  # CamVid's ignore id 11
            counts = np.bincount(ids.ravel(), minlength=12)[:11]
            assert r[3] == f"{int(counts.argmax())} {ds.class_names[int(counts.argmax())]}"
            assert r[4] == f"{100 * counts.max() / ids.size:.2f} %"
            areas = []  # every 8-connected region of each class (scipy, not the OpenCV the page uses)
            for c in np.flatnonzero(counts):
                labelled, _ = ndimage.label(ids == c, structure=np.ones((3, 3)))
                areas += np.bincount(labelled.ravel())[1:].tolist()
            assert r[5] == str(len(areas)) and r[6] == str(sum(a < 16 for a in areas))
        presence = ds.class_presence()
        assert presence is not None
        single = int((presence.sum(axis=1) == 1).sum())
        assert f"one class only (class bitmaps): <b>{single}</b>" in part


def test_the_sample_grid_holds_shows_pictures(page: str, audited: Path) -> None:
    samples = _section(page, "samples")
    uris = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([^"]+)"', samples)
    assert len(uris) == 10  # --samples 5 per split
    for uri in uris:
        picture = cv2.imdecode(np.frombuffer(base64.b64decode(uri), np.uint8), cv2.IMREAD_COLOR)
        assert picture is not None and picture.shape[1] == THUMB_WIDTH
        assert len(np.unique(picture.reshape(-1, 3), axis=0)) > 100  # a photo and its label, not a blank
    assert "train: 5 of 31 samples" in samples and "val: 5 of 26 samples" in samples


def test_tiles_per_source_are_counted(audited_tiles: Path, tmp_path: Path) -> None:
    target = tmp_path / "tiles.html"
    got = CliRunner().invoke(main, ["audit", str(audited_tiles), "--html", str(target), "--samples", "1"])
    assert got.exit_code == 0, got.output
    tiles = _section(target.read_text(encoding="utf-8"), "tiles")
    assert "tiles 180x240; 26 sources, tiles per source min 4, median 4, max 4" in tiles
    groups = _section(target.read_text(encoding="utf-8"), "groups")
    assert "<b>26</b> groups of 104 samples" in groups  # by default the tiles of one source are one group


def test_the_default_page_goes_into_the_output_folder(audited: Path, tmp_path: Path) -> None:
    out = shutil.copytree(audited, tmp_path / "out")
    got = CliRunner().invoke(main, ["audit", str(out), "--samples", "0"])
    assert got.exit_code == 0, got.output
    assert (out / "audit.html").is_file() and "<figure>" not in _section((out / "audit.html").read_text(), "samples")


def test_a_bad_group_rule_is_one_line(audited: Path, tmp_path: Path) -> None:
    got = CliRunner().invoke(main, ["audit", str(audited), "--html", str(tmp_path / "a.html"), "--group-by", "x("])
    assert got.exit_code != 0 and "--group-by 'x(' is not a regular expression" in got.output
    assert not (tmp_path / "a.html").exists()


def test_a_split_from_annotations_shows_its_rasterisation_report(tmp_path: Path) -> None:
    from shardkit.labels.raster import report_lines
    from shardkit.store.manifest import load_manifest

    from ..annotation_trees import coco_tree

    raw = coco_tree(tmp_path / "raw")
    assert CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "out"), "--workers", "1"]).exit_code == 0
    target = tmp_path / "a.html"
    got = CliRunner().invoke(main, ["audit", str(tmp_path / "out"), "--html", str(target), "--samples", "1"])
    assert got.exit_code == 0, got.output
    provenance = html.unescape(_section(target.read_text(encoding="utf-8"), "provenance"))
    folder = next(p.parent for p in (tmp_path / "out").rglob("manifest.json"))
    lines = report_lines(load_manifest(folder).source.extra.get("annotations"))
    assert len(lines) == 3 and "\n".join(lines) in provenance  # the report `shardkit info` prints, all of it
    assert "rasterisation of the annotation sources" in provenance


def test_no_manifest_or_no_folder_to_write_into_is_one_line(audited: Path, tmp_path: Path) -> None:
    got = CliRunner().invoke(main, ["audit", str(tmp_path)])
    assert got.exit_code == 1 and "no manifest.json here or in its sub-folders" in got.output
    got = CliRunner().invoke(main, ["audit", str(audited), "--html", str(tmp_path / "no" / "a.html")])
    assert got.exit_code != 0 and "the folder to write into does not exist" in got.output
    assert "Traceback" not in got.output and not (tmp_path / "no").exists()


def test_only_the_drawn_samples_are_read(audited: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardkit.read.dataset import Dataset

    reads: list[tuple[str, int]] = []
    real = Dataset.__getitem__

    def counted(self: Dataset, i: int) -> object:
        reads.append((self.manifest.split, i))
        return real(self, i)

    monkeypatch.setattr(Dataset, "__getitem__", counted)
    got = CliRunner().invoke(main, ["audit", str(audited), "--html", str(tmp_path / "a.html"), "--samples", "3"])
    assert got.exit_code == 0, got.output
    page = (tmp_path / "a.html").read_text(encoding="utf-8")
    drawn = re.findall(r'<img alt="(\w+) #(\d+)"', page)
    assert sorted(reads) == sorted((s, int(i)) for s, i in drawn)  # one read per picture, no other
    assert len(re.findall("<img", _section(page, "samples"))) == 6  # 3 per split
    # and the planted copy's pair twice: as an exact copy, and as the one near-duplicate pair across splits and
    # groups (no rule: each sample its own group)
    assert len(drawn) == 6 + 2 + 2


def test_a_value_map_the_conversion_recorded_is_on_the_page(tmp_path: Path) -> None:
    data = Path(__file__).resolve().parents[1] / "data" / "isbi-em"  # real 0/255 EM membrane masks
    raw = tmp_path / "raw"
    for sub in ("images", "masks"):
        (raw / sub).mkdir(parents=True)
    for name in ("0.png", "1.png"):
        shutil.copyfile(data / "image" / name, raw / "images" / name)
        shutil.copyfile(data / "label" / name, raw / "masks" / name)
    got = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "out"), "--threshold", "127", "--workers", "1"])
    assert got.exit_code == 0, got.output
    target = tmp_path / "a.html"
    assert CliRunner().invoke(main, ["audit", str(tmp_path / "out"), "--html", str(target)]).exit_code == 0
    page = target.read_text(encoding="utf-8")
    folder = next(p.parent for p in (tmp_path / "out").rglob("manifest.json"))
    recorded = json.loads((folder / "manifest.json").read_text())["preprocessing"]
    assert recorded["threshold"] == 127
    assert "<li><code>threshold</code>: 127</li>" in _section(page, "provenance")
    assert "labels from mask images: no rasterisation report" in _section(page, "provenance")
