"""Real label files of each kind (tests/data, sources in its README), converted as a user would and compared
bit-exactly with an independent reading: PIL, and the dataset's own definition of its classes
(0/255 → 0/1, JPEG masks > 127, palette indices).

Each dataset is copied into an ``images/`` + ``masks/`` folder (the bytes unchanged; only names made to
pair), so these tests are about label values and file types, not about layouts. DRIVE may not be
redistributed: its kinds (TIFF images, GIF masks) are made from the shared CamVid files by tests/drive_like.py.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import shardkit
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
from shardkit.errors import LabelError
from tests.drive_like import TEST_FOREGROUND, drive_file_names, drive_tree

DATA = Path(__file__).resolve().parents[1] / "data"


def _dataset(tmp_path: Path, pairs: list[tuple[Path, Path]]) -> Path:
    """``images/<n>.<ext>`` + ``masks/<n>.<ext>`` copies of ``pairs`` (n = 0, 1, …)."""
    root = tmp_path / "raw"
    for sub in ("images", "masks"):
        (root / sub).mkdir(parents=True)
    for n, (image, label) in enumerate(pairs):
        shutil.copyfile(image, root / "images" / f"{n}{image.suffix}")
        shutil.copyfile(label, root / "masks" / f"{n}{label.suffix}")
    return root


def _convert(root: Path, tmp_path: Path, **options: object) -> shardkit.Dataset:
    out = tmp_path / "out"
    convert(ConvertConfig(root, out, workers=1, quiet=True, **options))  # type: ignore[arg-type]
    return shardkit.open(out / "all")


def _labels(ds: shardkit.Dataset) -> list[np.ndarray]:
    by_key = {ds.key(i): ds[i][1] for i in range(len(ds))}
    return [by_key[k] for k in sorted(by_key, key=lambda k: int(Path(k).stem))]


def _pil(path: Path, mode: str | None = None) -> np.ndarray:
    with Image.open(path) as im:
        return np.array(im.convert(mode) if mode else im)


# ---------------------------------------------------------------- 0/255 PNG masks (ISBI 2012 EM membranes)
ISBI = [(DATA / "isbi-em" / "image" / f"{i}.png", DATA / "isbi-em" / "label" / f"{i}.png") for i in (0, 1)]


@pytest.mark.parametrize("option", [{"label_map": "255:1,0:0"}, {"threshold": 127}])
def test_binary_0_255_png_masks(tmp_path: Path, option: dict) -> None:
    ds = _convert(_dataset(tmp_path, ISBI), tmp_path, **option)
    assert ds.num_classes == 2 and ds.manifest.preprocessing.get(next(iter(option))) is not None
    # the map states the classes, and the table says it came from the map (not from a --num-classes never given)
    flag = "--label-map 0:0,255:1" if "label_map" in option else "--threshold 127"  # the map, sorted
    assert ds.manifest.classes["source"] == flag
    for got, (_, label) in zip(_labels(ds), ISBI, strict=True):
        raw = _pil(label)
        assert set(np.unique(raw)) == {0, 255}
        assert got.dtype == np.uint8 and np.array_equal(got, (raw == 255).astype(np.uint8))


def test_a_0_255_mask_error_names_the_value_map_not_ignore_index(tmp_path: Path) -> None:
    with pytest.raises(LabelError) as err:
        _convert(_dataset(tmp_path, ISBI), tmp_path, num_classes=2)
    text = str(err.value)
    assert "--label-map 255:1" in text and "--threshold 127" in text and "--ignore-index" not in text


def test_ignore_index_that_swallows_the_foreground_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        ds = _convert(_dataset(tmp_path, ISBI), tmp_path, num_classes=2, ignore_index=255)
    warned = [r.getMessage() for r in caplog.records if "ignore id 255" in r.getMessage()]
    assert warned and "--label-map 255:1" in warned[0]
    fg = sum(int((_pil(label) == 255).sum()) for _, label in ISBI)
    assert ds.manifest.stats["ignore_pixels"] == fg > 0


# ---------------------------------------------------------------- a 1-bit PNG
def test_one_bit_png_reads_as_0_1(tmp_path: Path) -> None:
    label = DATA / "isbi-em" / "label-1bit" / "0.png"
    head = label.read_bytes()[:26]
    assert head[24] == 1 and head[25] == 0  # IHDR: bit depth 1, gray
    ds = _convert(_dataset(tmp_path, [(ISBI[0][0], label)]), tmp_path, num_classes=2)
    (got,) = _labels(ds)
    want = _pil(label).astype(np.uint8)  # PIL mode "1": booleans
    assert want.max() == 1 and np.array_equal(got, want)


# ---------------------------------------------------------------- DRIVE kinds: TIFF images, GIF masks
@pytest.fixture
def drive_pairs(tmp_path: Path, camvid_root: Path) -> list[tuple[Path, Path]]:
    """Two DRIVE-style training pairs (TIFF, 0/255 GIF) made from CamVid: DRIVE itself may not be redistributed."""
    root = drive_tree(tmp_path / "DRIVE", camvid_root, (("training", "21"), ("training", "22")))
    return [(root / drive_file_names("training", n)[0], root / drive_file_names("training", n)[1])
            for n in ("21", "22")]


def test_drive_like_files_have_drives_kinds(tmp_path: Path, camvid_root: Path) -> None:
    """The stand-ins are what DRIVE ships: RGB LZW TIFF, gray 0/255 GIF labels and masks, a palette 0/251 GIF."""
    root = drive_tree(tmp_path / "DRIVE", camvid_root)
    kinds = {}
    for path in sorted(root.rglob("*.*")):
        with Image.open(path) as im:
            values = np.unique(np.array(im)).tolist() if im.format == "GIF" else None
            kinds[path.relative_to(root).as_posix()] = (im.format, im.mode, im.info.get("compression"), values)
    assert kinds == {"test/1st_manual/01_manual1.gif": ("GIF", "P", None, [0, TEST_FOREGROUND]),
                     "test/images/01_test.tif": ("TIFF", "RGB", "tiff_lzw", None),
                     "test/mask/01_test_mask.gif": ("GIF", "L", None, [0, 255]),
                     "training/1st_manual/21_manual1.gif": ("GIF", "L", None, [0, 255]),
                     "training/images/21_training.tif": ("TIFF", "RGB", "tiff_lzw", None),
                     "training/mask/21_training_mask.gif": ("GIF", "L", None, [0, 255])}


def test_drive_gif_masks_and_tiff_images(tmp_path: Path, drive_pairs: list[tuple[Path, Path]],
                                         caplog: pytest.LogCaptureFixture) -> None:
    root = _dataset(tmp_path, drive_pairs)
    (root / "masks" / "notes.xml").write_text("<notes/>")  # a file type shardkit does not read
    with caplog.at_level(logging.INFO, logger="shardkit"):
        ds = _convert(root, tmp_path, label_map="255:1")
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "without a label" not in text and "not a file type shardkit reads: 1 .xml" in text
    assert "not read (file type): 1 .xml" in text  # the summary line names it too
    assert len(ds) == 2
    for i, (image, label) in enumerate(drive_pairs):
        img, got = ds[i]
        assert np.array_equal(img, _pil(image, "RGB"))
        assert np.array_equal(got, (_pil(label) == 255).astype(np.uint8))


# ---------------------------------------------------------------- Kvasir-SEG: JPEG masks
KVASIR = sorted((p.parent.parent / "images" / p.name, p) for p in (DATA / "kvasir-seg" / "masks").glob("*.jpg"))


def test_jpeg_masks_need_a_threshold_or_a_map(tmp_path: Path) -> None:
    with pytest.raises(LabelError) as err:
        _convert(_dataset(tmp_path, KVASIR), tmp_path, num_classes=2)
    assert "is a JPEG" in str(err.value) and "--threshold 127" in str(err.value)


@pytest.mark.parametrize("option", [{"threshold": 127}, {"label_map": "0-127:0,128-255:1"}])
def test_jpeg_masks_match_the_standard_threshold(tmp_path: Path, option: dict) -> None:
    ds = _convert(_dataset(tmp_path, KVASIR), tmp_path, **option)
    for got, (_, label) in zip(_labels(ds), KVASIR, strict=True):
        gray = _pil(label, "L")
        assert len(np.unique(gray)) > 2  # compression noise really is there
        assert np.array_equal(got, (gray > 127).astype(np.uint8))


# ---------------------------------------------------------------- labelme2voc: palette PNG ids
LABELME = sorted((DATA / "labelme2voc" / "old" / "JPEGImages" / f"{p.stem}.jpg", p)
                 for p in (DATA / "labelme2voc" / "old" / "SegmentationClassPNG").glob("*.png"))


def test_palette_png_labels_are_ids_outside_the_voc_layout(tmp_path: Path) -> None:
    ds = _convert(_dataset(tmp_path, LABELME), tmp_path, num_classes=21, ignore_index=255)
    for got, (_, label) in zip(_labels(ds), LABELME, strict=True):
        with Image.open(label) as im:
            assert im.mode == "P"
        assert np.array_equal(got, _pil(label))  # the indices, not the palette's colours


def test_palette_labels_give_show_their_own_colours(tmp_path: Path) -> None:
    ds = _convert(_dataset(tmp_path, LABELME), tmp_path, num_classes=21, ignore_index=255)
    with Image.open(LABELME[0][1]) as im:
        pal = im.getpalette("RGB")
    colours = [c["colour"] for c in ds.manifest.classes["classes"]]
    assert colours[15] == pal[45:48] and colours[0] == pal[0:3]  # "person" in labelme's own palette
    from shardkit.show import show_sample

    picture = show_sample(ds.path, 0, tmp_path / "s.png")
    assert picture.is_file()
