"""Every ``fix:`` hint convert prints, followed as a new user would, on real samples of each kind of label.

For each sample set the test builds a dataset tree in a temporary folder, runs ``shardkit convert`` with no
options, collects every hint it prints (the flags after ``fix:``, and a warning's ``re-run with``), runs convert
again with each hint's flags, and so on (three rounds at most). A run that exits 0 must have stored exactly the
labels the dataset means, computed here independently with PIL and numpy from the label files; anything else
must be a refusal (exit 1, one ``Error:`` line, no traceback). A hint with a placeholder (``FILE``, ``N``, ``ID``)
asks for the user's knowledge and is not followed.

Samples (tests/data/README.md and ../shared/data/README.md): Kvasir-SEG JPEG masks, ISBI 0/255 masks,
labelme2voc palette PNGs, mmsegmentation's palette PNGs, CamVid ids, rgb-masks-mini colour masks. No real set
of coded values (0/64/128/192/255) or of sparse palette ids (17, 44, 45) was at hand: those are derived from real
labels (CamVid ids, LIP ids, mmseg ids) by a value map, said at each one.
"""

from __future__ import annotations

import csv
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import shardkit
from shardkit.cli import main

DATA = Path(__file__).resolve().parents[2] / "data"
ROUNDS = 3
_FLAG = re.compile(r"(--[a-z][a-z-]*)(?:[ =]('[^']*'|[^\s;()]+))?")
_NO_VALUE = frozenset({"--reduce-zero-label", "--strict", "--force"})
_PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z_]*(?:=[A-Z_]+)?|.*\b(?:DIR|EXT)\b.*)$")
Expected = Callable[[Path], np.ndarray]


def pil(path: Path, mode: str | None = None) -> np.ndarray:
    with Image.open(path) as im:
        return np.array(im.convert(mode) if mode else im)


def hint_flags(text: str) -> list[tuple[str, ...]]:
    """The flag groups of one hint: flags written next to each other form one group (``--label-map 0:0,50:1
    --ignore-index 255``); ``or``, ``with``, a parenthesis or any word in between starts another. Groups with a
    placeholder value are left out."""
    groups: list[list[str]] = []
    end = -1
    for m in _FLAG.finditer(text):
        flag, value = m.group(1), m.group(2)
        args = [flag]
        if flag not in _NO_VALUE:
            if value is None:
                continue
            value = value.strip("'").rstrip(",.:")
            args.append(value)
        if groups and text[end:m.start()].strip() == "":
            groups[-1] += args
        else:
            groups.append(args)
        end = m.end()
    return [tuple(g) for g in groups
            if not any(_PLACEHOLDER.match(v) for v in g[1::2] if not v.startswith("--"))]


def hints_of(output: str) -> list[str]:
    """Every hint in convert's output: the text after ``fix:``, and after a warning's ``re-run with``."""
    return [m.group(1) for m in re.finditer(r"(?:fix:|re-run with) (.*)$", output, re.MULTILINE)]


@dataclass
class Outcome:
    runs: int = 0
    exact: list[tuple[str, ...]] | None = None  # the flag sets that converted, each with exact labels
    hints: list[str] | None = None  # every hint printed


def stored_labels(out: Path) -> dict[str, np.ndarray]:
    """Image stem → stored label, over every split written."""
    got = {}
    for manifest in sorted(out.glob("*/manifest.json")):
        ds = shardkit.open(manifest.parent)
        for i in range(len(ds)):
            got[Path(ds.key(i)).stem] = np.asarray(ds[i][1])
    return got


def follow(root: Path, tmp: Path, labels: dict[str, Path], expected: Expected,
           first: tuple[str, ...] = ()) -> Outcome:
    """Convert ``root`` with ``first``, then with each hint's flags, for :data:`ROUNDS` rounds; assert every run
    that exits 0 stored exactly ``expected(label)`` for every image stem of ``labels``."""
    outcome = Outcome(exact=[], hints=[])
    assert outcome.exact is not None and outcome.hints is not None
    tried: set[tuple[str, ...]] = set()
    todo = [first]
    for _ in range(ROUNDS):
        nxt: list[tuple[str, ...]] = []
        for flags in todo:
            if flags in tried:
                continue
            tried.add(flags)
            out = tmp / f"out{outcome.runs}"
            outcome.runs += 1
            res = CliRunner().invoke(main, ["convert", str(root), str(out), "--workers", "1", *flags])
            text = res.output
            assert "Traceback" not in text and (res.exception is None or isinstance(res.exception, SystemExit)), \
                (flags, text, res.exception)
            if res.exit_code == 0:
                got = stored_labels(out)
                assert sorted(got) == sorted(labels), (flags, text)
                for stem, label in labels.items():
                    want = expected(label)
                    assert got[stem].shape == want.shape and np.array_equal(got[stem], want), \
                        f"exit 0 with wrong labels for {stem} after {flags}: {text}"
                outcome.exact.append(flags)
            else:
                assert res.exit_code == 1, (flags, text)
                assert sum(line.startswith("Error:") for line in text.splitlines()) == 1, (flags, text)
            for hint in hints_of(text):
                outcome.hints.append(hint)
                for group in hint_flags(hint):
                    nxt.append(tuple(dict.fromkeys((*flags, *group))) if _compatible(flags, group) else group)
        todo = nxt
    return outcome


def _compatible(flags: tuple[str, ...], group: tuple[str, ...]) -> bool:
    """Whether a hint adds to the flags already given (a pairing then a value map) rather than replacing one."""
    given = set(flags[::2]) if flags else set()
    return not given & set(group[::2])


def pairs_tree(root: Path, pairs: Sequence[tuple[Path, Path | np.ndarray]], images: str = "images",
               labels: str = "labels") -> dict[str, Path]:
    """``root/images/<n>.<ext>`` + ``root/labels/<n>.<ext>`` copies (an array label is saved as a PNG);
    stem → label file."""
    (root / images).mkdir(parents=True)
    (root / labels).mkdir(parents=True)
    out = {}
    for n, (image, label) in enumerate(pairs):
        shutil.copyfile(image, root / images / f"{n}{image.suffix}")
        if isinstance(label, np.ndarray):
            dst = root / labels / f"{n}.png"
            Image.fromarray(label).save(dst)
        else:
            dst = root / labels / f"{n}{label.suffix}"
            shutil.copyfile(label, dst)
        out[str(n)] = dst
    return out


KVASIR = sorted((p.parent.parent / "images" / p.name, p) for p in (DATA / "kvasir-seg" / "masks").glob("*.jpg"))
ISBI = [(DATA / "isbi-em" / "image" / f"{i}.png", DATA / "isbi-em" / "label" / f"{i}.png") for i in (0, 1)]
LABELME = sorted((DATA / "labelme2voc" / "old" / "JPEGImages" / f"{p.stem}.jpg", p)
                 for p in (DATA / "labelme2voc" / "old" / "SegmentationClassPNG").glob("*.png"))
MMSEG = sorted((DATA / "mmseg" / "pseudo_dataset" / "imgs" / p.name.replace("_gt.png", "_img.jpg"), p)
               for p in (DATA / "mmseg" / "pseudo_dataset" / "gts").glob("*_gt.png"))
LIP = [(DATA / "mmseg" / "pseudo_lip_dataset" / f"{s}_images" / f"{n}.jpg",
        DATA / "mmseg" / "pseudo_lip_dataset" / f"{s}_segmentations" / f"{n}.png")
       for s, n in (("train", "684_2150041"), ("val", "86_185913"))]


def camvid(shared: Path, n: int = 2) -> list[tuple[Path, Path]]:
    names = sorted(p.name for p in (shared / "camvid-segnet" / "trainannot").glob("*.png"))[:n]
    return [(shared / "camvid-segnet" / "train" / f, shared / "camvid-segnet" / "trainannot" / f) for f in names]


def test_jpeg_masks_are_told_threshold_and_following_it_is_exact(tmp_path: Path) -> None:
    labels = pairs_tree(tmp_path / "kvasir", KVASIR)
    o = follow(tmp_path / "kvasir", tmp_path, labels, lambda p: (pil(p, "L") > 127).astype(np.uint8))
    assert o.exact == [("--threshold", "127")]
    assert not any("--ignore-index" in h or "--num-classes" in h for h in o.hints or [])


def test_jpeg_masks_of_three_levels_are_told_ranges_and_following_them_is_exact(tmp_path: Path) -> None:
    """Derived: LIP's ids as three levels 0/128/255 (background, ids 1-12, ids 13+) saved as JPEG (quality 90);
    no real multi-level JPEG mask set was at hand. Expected: each decoded value's range, from PIL."""
    root = tmp_path / "jpeg3"
    labels = pairs_tree(root, LIP)
    for stem, label in list(labels.items()):
        ids = pil(label)
        Image.fromarray(np.select([ids == 0, ids < 13], [0, 128], 255).astype(np.uint8)).save(
            label.with_suffix(".jpg"), quality=90)
        label.unlink()
        labels[stem] = label.with_suffix(".jpg")
    o = follow(root, tmp_path, labels, lambda p: np.digitize(pil(p, "L"), [65, 192]).astype(np.uint8))
    assert o.exact == [("--label-map", "0-64:0,65-191:1,192-255:2")]


def test_0_255_masks_are_told_a_value_map_and_both_are_exact(tmp_path: Path) -> None:
    labels = pairs_tree(tmp_path / "isbi", ISBI)
    o = follow(tmp_path / "isbi", tmp_path, labels, lambda p: (pil(p) // 255).astype(np.uint8))
    assert sorted(o.exact or []) == [("--label-map", "255:1"), ("--threshold", "127")]
    assert not any("--ignore-index" in h for h in o.hints or [])  # it would store the foreground as ignore


def test_palette_ids_with_the_255_border_are_told_ignore_index_255(tmp_path: Path) -> None:
    labels = pairs_tree(tmp_path / "labelme", LABELME)
    o = follow(tmp_path / "labelme", tmp_path, labels, pil)  # the palette indices, 255 kept as the ignore id
    assert o.exact == [("--ignore-index", "255")]


def test_palette_ids_that_fit_convert_as_they_are(tmp_path: Path) -> None:
    labels = pairs_tree(tmp_path / "mmseg", MMSEG)
    o = follow(tmp_path / "mmseg", tmp_path, labels, pil)
    assert o.exact == [()] and o.runs == 1


def test_camvid_ids_convert_as_they_are(tmp_path: Path, shared_data: Path) -> None:
    labels = pairs_tree(tmp_path / "camvid", camvid(shared_data))
    o = follow(tmp_path / "camvid", tmp_path, labels, pil)
    assert o.exact == [()]


def test_colour_masks_with_an_unlisted_colour_are_never_merged_by_a_hint(tmp_path: Path, shared_data: Path) -> None:
    src = shared_data / "rgb-masks-mini"
    root = tmp_path / "rgb"
    (root / "train").mkdir(parents=True)
    (root / "train_labels").mkdir()
    shutil.copyfile(src / "class_dict.csv", root / "class_dict.csv")
    labels = {}
    for image in sorted((src / "train").glob("*.png"))[:2]:
        shutil.copyfile(image, root / "train" / image.name)
        label = src / "train_labels" / f"{image.stem}_color_mask.png"
        shutil.copyfile(label, root / "train_labels" / label.name)
        labels[image.stem] = root / "train_labels" / label.name
    with (src / "class_dict.csv").open() as fh:
        colours = {(int(r["r"]), int(r["g"]), int(r["b"])): i for i, r in enumerate(csv.DictReader(fh))}

    def expected(path: Path) -> np.ndarray:
        rgb = pil(path, "RGB")
        out = np.full(rgb.shape[:2], -1)
        for colour, i in colours.items():
            out[(rgb == colour).all(axis=2)] = i
        return out  # -1 where the colour is in no class: never equal to a stored label

    o = follow(root, tmp_path, labels, expected)
    assert o.exact == [] and o.hints  # white (255,255,255) is in no class: refused, and no hint merges it
    assert not any("--colour-tolerance" in h for h in o.hints)


def test_coded_values_are_told_a_label_map_never_num_classes_256(tmp_path: Path, shared_data: Path) -> None:
    """Derived: CamVid ids v stored as the codes 0/64/128/192/255 of v % 5 (no real coded set was at hand)."""
    codes = np.array([0, 64, 128, 192, 255], np.uint8)
    pairs = [(image, codes[pil(label) % 5]) for image, label in camvid(shared_data)]
    labels = pairs_tree(tmp_path / "codes", pairs)
    o = follow(tmp_path / "codes", tmp_path, labels,
               lambda p: np.searchsorted(codes, pil(p)).astype(np.uint8))
    assert o.exact == [("--label-map", "0:0,64:1,128:2,192:3,255:4")]
    assert not any("--num-classes" in h or "--ignore-index" in h for h in o.hints or [])


def test_codes_with_a_255_border_get_a_map_and_the_ignore_id(tmp_path: Path) -> None:
    """Derived: mmseg's palette ids 0..3 stored as 0/50/100/150, with a 3-pixel 255 border (ignore)."""
    pairs = []
    for image, label in MMSEG:
        coded = pil(label).astype(np.uint8) * 50
        coded[:3], coded[-3:], coded[:, :3], coded[:, -3:] = 255, 255, 255, 255
        pairs.append((image, coded))
    labels = pairs_tree(tmp_path / "codes", pairs)

    def expected(path: Path) -> np.ndarray:
        v = pil(path)
        return np.where(v == 255, 255, v // 50).astype(np.uint8)

    o = follow(tmp_path / "codes", tmp_path, labels, expected)
    assert o.exact == [("--label-map", "0:0,50:1,100:2,150:3", "--ignore-index", "255")]


def test_sparse_ids_next_to_each_other_are_never_told_to_be_ignored(tmp_path: Path) -> None:
    """Derived: LIP's ids 0, 1, 2, 5, 9, 13, 14, 15 moved up by 30 (0 kept): ids 0, 31, 32, 35, 39, 43, 44, 45,
    sparse ids of a larger table (like ADE20K's 17, 44, 45 in one image); 45 is a class next to 44."""
    pairs = [(image, np.where(pil(label) > 0, pil(label) + 30, 0).astype(np.uint8)) for image, label in LIP]
    labels = pairs_tree(tmp_path / "sparse", pairs)
    o = follow(tmp_path / "sparse", tmp_path, labels, pil)
    assert o.exact == [("--num-classes", "46")]
    assert not any("--ignore-index" in h or "far above" in h for h in o.hints or [])


def test_a_pairing_suggestion_followed_then_its_value_hint_is_exact(tmp_path: Path) -> None:
    labels = pairs_tree(tmp_path / "isbi", ISBI, images="raw", labels="seg")
    o = follow(tmp_path / "isbi", tmp_path, labels, lambda p: (pil(p) // 255).astype(np.uint8))
    pairing = ("--images", "raw/{name}.png", "--labels", "seg/{name}.png")
    assert sorted(o.exact or []) == [(*pairing, "--label-map", "255:1"), (*pairing, "--threshold", "127")]


def test_an_overlay_folder_is_never_suggested_as_labels(tmp_path: Path) -> None:
    """Derived: ISBI's images, its 0/255 labels, and overlays (the label drawn red over the image, as annotation
    tools export them) in a third folder named to sort first and look most like labels."""
    root = tmp_path / "em"
    labels = pairs_tree(root, ISBI, images="raw", labels="seg")
    (root / "annot_vis").mkdir()
    for stem, label in labels.items():
        rgb = np.repeat(pil(root / "raw" / f"{stem}.png")[..., None], 3, axis=2)
        rgb[pil(label) == 0] = (rgb[pil(label) == 0] // 2 + np.array([127, 0, 0])).astype(np.uint8)
        Image.fromarray(rgb).save(root / "annot_vis" / f"{stem}.png")
    o = follow(root, tmp_path, labels, lambda p: (pil(p) // 255).astype(np.uint8))
    assert o.hints and all("--labels 'annot_vis/" not in h for h in o.hints)
    assert ("--images", "raw/{name}.png", "--labels", "seg/{name}.png", "--threshold", "127") in (o.exact or [])


def test_two_folders_of_photos_are_never_suggested_as_images_and_labels(tmp_path: Path, shared_data: Path) -> None:
    """CamVid photos and a copy of them with the same names: no folder holds label-like files."""
    root = tmp_path / "photos"
    labels = {}
    for sub in ("frames", "shots"):
        (root / sub).mkdir(parents=True)
        for image, _ in camvid(shared_data, 3):
            shutil.copyfile(image, root / sub / image.name)
            labels[image.stem] = root / sub / image.name
    o = follow(root, tmp_path, labels, lambda p: np.full(1, -1))
    assert o.exact == [] and o.runs == 1  # nothing followable: no pairing is suggested
    assert o.hints and "--labels 'shots/" not in o.hints[0] and "--labels 'frames/" not in o.hints[0]


@pytest.mark.parametrize("text, groups", [
    ("--label-map 255:1 or --threshold 127", [("--label-map", "255:1"), ("--threshold", "127")]),
    ("--ignore-index 255 --num-classes 46 (or --ignore-index 255 with --classes FILE naming every class)",
     [("--ignore-index", "255", "--num-classes", "46"), ("--ignore-index", "255")]),
    ("pair them with --images 'a/{name}.png' --labels 'b/{name}.png' ({split} …), or --split-list SPLIT=FILE",
     [("--images", "a/{name}.png", "--labels", "b/{name}.png")]),
    ("add it to class_dict.csv, or --unknown-as ID to store it", []),
])
def test_hint_flags_parse_as_a_user_reads_them(text: str, groups: list[tuple[str, ...]]) -> None:
    assert hint_flags(text) == groups
