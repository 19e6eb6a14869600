"""The synthetic demo dataset: deterministic, exact mask colours, CamVid-32 layout."""

from __future__ import annotations

import csv
from pathlib import Path

import cv2
import numpy as np
import pytest

from shardkit.demo import DEMO_CLASSES, make_demo
from shardkit.errors import OutputError


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _rgb(path: Path) -> np.ndarray:
    bgr = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert bgr is not None and bgr.ndim == 3 and bgr.shape[2] == 3, path
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo(tmp_path_factory.mktemp("demo") / "raw")


def test_layout(demo: Path) -> None:
    for split, count in (("train", 24), ("val", 8)):
        images = sorted((demo / split).glob("*.png"))
        assert len(images) == count
        for image in images:
            assert image.stem.startswith("scene_")
            mask = demo / f"{split}_labels" / f"{image.stem}_L.png"
            assert mask.is_file()
            assert _rgb(image).shape == _rgb(mask).shape == (120, 160, 3)
    assert not [p for p in demo.rglob("*") if "tmp" in p.name]


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path, demo: Path) -> None:
    again = _files(make_demo(tmp_path / "a"))
    assert again == _files(demo)
    other = _files(make_demo(tmp_path / "b", seed=1))
    assert other.keys() == again.keys()
    assert other["train/scene_0001.png"] != again["train/scene_0001.png"]
    assert other["class_dict.csv"] == again["class_dict.csv"]


def test_images_vary_per_sample(demo: Path) -> None:
    first = _rgb(demo / "train_labels" / "scene_0001_L.png")
    assert not np.array_equal(first, _rgb(demo / "train_labels" / "scene_0002_L.png"))


def test_mask_pixels_are_exact_class_colours_and_all_classes_present(demo: Path) -> None:
    palette = {c: i for i, (_, c) in enumerate(DEMO_CLASSES)}
    seen: set[int] = set()
    for split in ("train", "val"):
        for mask in sorted((demo / f"{split}_labels").glob("*_L.png")):
            colours = {tuple(int(v) for v in c) for c in np.unique(_rgb(mask).reshape(-1, 3), axis=0)}
            assert colours <= palette.keys(), f"{mask}: unknown colours {colours - palette.keys()}"
            if split == "train":
                seen |= {palette[c] for c in colours}
    assert seen == set(range(len(DEMO_CLASSES)))


def test_class_dict_round_trips(demo: Path) -> None:
    with (demo / "class_dict.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["name", "r", "g", "b"]
    assert [(n, (int(r), int(g), int(b))) for n, r, g, b in rows[1:]] == list(DEMO_CLASSES)


def test_refuses_foreign_folder_but_overwrites_previous_demo(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(OutputError, match="fix:"):
        make_demo(foreign)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]

    empty = tmp_path / "empty"
    empty.mkdir()
    make_demo(empty, train=3, val=2)
    make_demo(empty, train=2, val=1, seed=5)  # a previous demo is replaced, leftovers removed
    assert len(list((empty / "train").glob("*.png"))) == 2
    assert len(list((empty / "val_labels").glob("*.png"))) == 1
