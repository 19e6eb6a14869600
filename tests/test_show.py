"""Pictures: ``shardkit show`` (image | coloured label | overlay + legend) and ``shardkit info --plot``."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
from shardkit.show import colourize, ignore_colour, palette, render_class_chart, render_sample

CROP = (352, 480)


@pytest.fixture(scope="module")
def camvid(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("show")
    convert(ConvertConfig(camvid_root, out, format="npy", size=CROP, splits=("val",), workers=2, quiet=True))
    return out / "val"


def _read_rgb(path: Path) -> np.ndarray:
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert bgr is not None, f"{path} is not a readable picture"
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def test_show_cli_draws_image_label_overlay_and_legend(camvid: Path, tmp_path: Path) -> None:
    out = tmp_path / "sample.png"
    result = CliRunner().invoke(main, ["show", str(camvid), "--index", "5", "-o", str(out)])
    assert result.exit_code == 0, result.output
    picture = _read_rgb(out)
    ds = shardkit.open(camvid)
    image, ids = ds[5]
    h, w = CROP
    gap, top = 10, 54  # layout of render_sample with a title line
    assert picture.shape[1] == 3 * w + 4 * gap and picture.shape[0] > top + h + 40  # room for the legend
    assert np.array_equal(picture[top:top + h, gap:gap + w], image)  # the image, untouched
    colours = np.array(ds.class_colours, np.uint8)
    label_panel = picture[top:top + h, 2 * gap + w:2 * gap + 2 * w]
    assert np.array_equal(label_panel, colours[ids])  # the label in class colours
    overlay = picture[top:top + h, 3 * gap + 2 * w:3 * gap + 3 * w].astype(int)
    assert np.abs(overlay - (image.astype(int) + colours[ids]) / 2).max() <= 1
    legend = picture[top + h:]
    assert (legend != 255).any(axis=2).mean() > 0.01  # text and swatches were drawn


def test_show_variable_size_sample_is_enlarged(rgb_masks_root: Path, tmp_path: Path) -> None:
    convert(ConvertConfig(rgb_masks_root, tmp_path / "o", format="lmdb", splits=("val",), workers=1,
                          quiet=True, unknown_as=255, ignore_index=255, label_encoding="packed"))
    out = tmp_path / "s.png"
    result = CliRunner().invoke(main, ["show", str(tmp_path / "o" / "val"), "-i", "-1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    picture = _read_rgb(out)
    assert picture.shape[1] >= 3 * 360  # small images are scaled up so the legend text fits


def test_show_cli_errors(camvid: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(main, ["show", str(camvid), "--index", "26", "-o", str(tmp_path / "x.png")])
    assert bad.exit_code == 2 and "out of range" in bad.output
    missing = runner.invoke(main, ["show", str(camvid), "-o", str(tmp_path / "no" / "x.png")])
    assert missing.exit_code == 1 and "does not exist" in missing.output
    assert not (tmp_path / "x.png").exists()


def test_info_plot_draws_the_class_chart(camvid: Path, tmp_path: Path) -> None:
    out = tmp_path / "classes.png"
    result = CliRunner().invoke(main, ["info", str(camvid), "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert "26 samples" in result.output and "Road" in result.output
    chart = _read_rgb(out)
    assert chart.shape[0] > 12 * 20 and chart.shape[1] > 400
    # the longest bar is Road's (the largest share), drawn in Road's colour
    road = np.all(chart == (128, 64, 128), axis=2).sum()
    pole = np.all(chart == (192, 192, 128), axis=2).sum()
    assert road > 20 * pole > 0


def test_palette_is_deterministic_and_keeps_given_colours() -> None:
    a = palette(40, [(1, 2, 3), None])
    assert np.array_equal(a, palette(40, [(1, 2, 3), None])) and tuple(a[0]) == (1, 2, 3)
    assert len({tuple(c) for c in a}) == 40  # distinct colours for classes without one
    assert ignore_colour(np.array([[1, 1, 1], [100, 100, 32]], np.uint8)) == (255, 255, 255)
    ids = np.array([[0, 1], [255, 1]], np.uint8)
    assert colourize(ids, a[:2], (9, 9, 9))[1, 0].tolist() == [9, 9, 9]


def test_render_functions_without_colours() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)
    ids = rng.integers(0, 3, (40, 50), dtype=np.uint8)
    pic = render_sample(image, ids, ["a", "b", "c"], alpha=0.3)
    assert pic.dtype == np.uint8 and pic.ndim == 3 and pic.shape[1] >= 3 * 360
    chart = render_class_chart(["a", "b"], [0.25, 0.75])
    assert chart.dtype == np.uint8 and chart.shape[2] == 3


AUGMENT = "scale=0.5:2,crop=352x480,hflip,jitter=0.2"


def test_show_augment_draws_one_row_per_epoch(camvid: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    outs = [tmp_path / "a.png", tmp_path / "b.png"]
    for out in outs:
        result = runner.invoke(main, ["show", str(camvid), "--index", "5", "--augment", AUGMENT, "--draws", "4",
                                      "--seed", "0", "-o", str(out)])
        assert result.exit_code == 0, result.output
    assert outs[0].read_bytes() == outs[1].read_bytes()  # same seed: the same picture, byte for byte
    picture = _read_rgb(outs[0])
    h, w = CROP
    gap, top = 10, 54
    row_h = top + h + gap
    assert picture.shape == (4 * row_h, 3 * w + 4 * gap, 3)
    rows = [picture[k * row_h + top:k * row_h + top + h] for k in range(4)]
    assert all(not np.array_equal(rows[a], rows[b]) for a in range(4) for b in range(a + 1, 4))

    # row k is exactly what the augmentation gives for epoch k
    from shardkit import augment as A

    ds = shardkit.open(camvid, labels="ids")
    image, ids = ds[5]
    ignore = 255 if ds.ignore_index is None else ds.ignore_index
    aug_img, aug_ids = A.parse(AUGMENT)([image], [ids], [5], seed=0, epoch=2, ignore_index=ignore)
    assert np.array_equal(rows[2][:, gap:gap + w], aug_img[0])
    pal = palette(len(ds.class_names), ds.class_colours)
    assert np.array_equal(rows[2][:, 2 * gap + w:2 * gap + 2 * w], colourize(aug_ids[0], pal, ignore_colour(pal)))

    other = tmp_path / "c.png"
    result = runner.invoke(main, ["show", str(camvid), "-i", "5", "--augment", AUGMENT, "--draws", "4",
                                  "--seed", "1", "-o", str(other)])
    assert result.exit_code == 0 and other.read_bytes() != outs[0].read_bytes()


def test_show_augment_bad_string_is_a_usage_error(camvid: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.png"
    for bad in ("scale=2", "warp=3", ""):
        result = CliRunner().invoke(main, ["show", str(camvid), "--augment", bad, "-o", str(out)])
        assert result.exit_code == 2, result.output
        assert "augment" in result.output and "Traceback" not in result.output
        assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    assert not out.exists()


def _ink_blocks(region: np.ndarray) -> list[tuple[int, int]]:
    """(first row, height) of each run of rows that hold dark pixels (text, swatch frames)."""
    dark = (region.max(axis=2) < 120).any(axis=1)
    blocks, start = [], None
    for y, d in enumerate([*dark, False]):
        if d and start is None:
            start = y
        elif not d and start is not None:
            blocks.append((start, y - start))
            start = None
    return blocks


def test_show_scales_layout_and_legend_to_a_1080p_sample(camvid: Path) -> None:
    """A 1080x1920 sample: panels drawn at most 960 px wide (not a 5800 px picture), text as large relative to
    the picture as for a 480 px sample, frames around the panels."""
    from shardkit.show import FRAME, MAX_PANEL_SIDE, Layout

    ds = shardkit.open(camvid)
    image, ids = ds[5]
    big = cv2.resize(image, (1920, 1080), interpolation=cv2.INTER_LINEAR)
    big_ids = cv2.resize(ids, (1920, 1080), interpolation=cv2.INTER_NEAREST)
    pictures = {}
    for name, (img, lab) in {"base": (image, ids), "big": (big, big_ids)}.items():
        pictures[name] = render_sample(img, lab, ds.class_names, ds.class_colours, ignore_index=ds.ignore_index)
    lay = Layout(540, MAX_PANEL_SIDE)
    pic = pictures["big"]
    assert pic.shape[1] == lay.width <= 3 * MAX_PANEL_SIDE + 4 * lay.gap
    below = lay.panel_top(False) + lay.panel_h + lay.thickness
    heights = {}
    for name, p in pictures.items():
        first = _ink_blocks(p[below if name == "big" else 30 + CROP[0] + 1:, : p.shape[1] // 3])[0]
        heights[name] = first[1] / p.shape[1]  # the legend heading's height, relative to the picture width
    assert heights["big"] >= 0.8 * heights["base"], heights
    top, t = lay.panel_top(False), lay.thickness
    for k in range(3):  # a frame just outside each panel
        x = lay.panel_x(k)
        assert (pic[top - t, x:x + lay.panel_w] == FRAME).all() and (pic[top:top + lay.panel_h, x - t] == FRAME).all()


def test_white_class_on_white_page_is_framed() -> None:
    from shardkit.show import BG, FRAME, Layout

    ids = np.zeros((400, 500), np.uint8)
    image = np.full((400, 500, 3), 255, np.uint8)
    pic = render_sample(image, ids, ["Void"], [(255, 255, 255)])
    lay = Layout(400, 500)
    top, x = lay.panel_top(False), lay.panel_x(1)
    label = pic[top:top + 400, x:x + 500]
    assert (label == BG).all()  # the class really is white
    t = lay.thickness
    assert (pic[top - t, x:x + 500] == FRAME).all() and (pic[top + 400 + t - 1, x:x + 500] == FRAME).all()
    assert (pic[top:top + 400, x - t] == FRAME).all() and (pic[top:top + 400, x + 500 + t - 1] == FRAME).all()


def test_info_prints_the_ignore_index_and_its_share(camvid: Path, rgb_masks_root: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["info", str(camvid)])
    assert res.exit_code == 0, res.output
    m = shardkit.open(camvid).manifest
    want = m.stats["class_pixels"][11] / m.stats["pixels"]
    assert f"ignore index 11 (Unlabelled): {100 * want:.2f} % of label pixels" in res.output
    convert(ConvertConfig(rgb_masks_root, tmp_path / "o", format="npy", splits=("val",), workers=1, quiet=True,
                          unknown_as=255, ignore_index=255))
    res = CliRunner().invoke(main, ["info", str(tmp_path / "o" / "val")])
    m = shardkit.open(tmp_path / "o" / "val").manifest
    assert m.stats["ignore_pixels"] > 0
    want = m.stats["ignore_pixels"] / m.stats["pixels"]
    assert f"ignore index 255 (no class): {100 * want:.2f} % of label pixels" in res.output, res.output


def test_class_chart_title_says_what_the_shares_count(camvid: Path) -> None:
    from shardkit.show import class_share_basis

    m = shardkit.open(camvid).manifest
    assert class_share_basis(m) == "class share of label pixels, ignore class 11 (Unlabelled) included"
    assert "labelled pixels" not in class_share_basis(m)


def test_show_augment_unknown_op_lists_the_ops(camvid: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["show", str(camvid), "--augment", "scale=0.5:2,flip",
                                       "-o", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert "unknown augment item 'flip'" in result.output and "needs a value" not in result.output
    assert "scale, crop, hflip, rotate, jitter, cutout" in result.output


def test_show_reads_a_split_on_object_storage(camvid_root: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from shardkit.conversion.config import ShardSize
    from shardkit.testing import local_s3, make_bucket

    monkeypatch.setenv("SHARDKIT_CACHE_DIR", str(tmp_path / "cache"))
    with local_s3():
        make_bucket("out")
        convert(ConvertConfig(camvid_root, "s3://out/show", format="npy", size=(90, 120), resize="exact",
                              splits=("val",), workers=1, quiet=True, shard_size=ShardSize(samples=13)))
        out = tmp_path / "remote.png"
        result = CliRunner().invoke(main, ["show", "s3://out/show/val", "-i", "14", "-o", str(out)])
        assert result.exit_code == 0, result.output
    local = tmp_path / "local"
    convert(ConvertConfig(camvid_root, local, format="npy", size=(90, 120), resize="exact", splits=("val",),
                          workers=1, quiet=True, shard_size=ShardSize(samples=13)))
    assert CliRunner().invoke(main, ["show", str(local / "val"), "-i", "14", "-o", str(tmp_path / "l.png")]
                              ).exit_code == 0
    remote, here = _read_rgb(out), _read_rgb(tmp_path / "l.png")
    assert remote.shape == here.shape
    assert np.array_equal(remote[60:], here[60:])  # the same sample drawn (the title names another folder)


def test_info_says_where_the_class_table_came_from(camvid: Path, rgb_masks_root: Path, tmp_path: Path) -> None:
    """The manifest's classes.source, shown by info: CamVid's built-in table, and a class_dict.csv file."""
    res = CliRunner().invoke(main, ["info", str(camvid)])
    assert res.exit_code == 0, res.output
    assert "class table: 12 classes from builtin:camvid-segnet" in res.output, res.output
    convert(ConvertConfig(rgb_masks_root, tmp_path / "o", format="npy", splits=("val",), workers=1, quiet=True,
                          unknown_as=255, ignore_index=255))
    res = CliRunner().invoke(main, ["info", str(tmp_path / "o" / "val")])
    source = shardkit.open(tmp_path / "o" / "val").manifest.classes["source"]
    assert "class_dict.csv" in source and f"classes from {source}" in res.output, res.output



def test_show_draws_the_labels_rasterised_from_annotations(tmp_path: Path) -> None:
    """A split converted from COCO panoptic annotations: the label panel is the stored ids in class colours, the
    void pixels (stored as the ignore id 255) in the no-class colour; nothing else is drawn there."""
    from shardkit.show import Layout
    from tests.annotation_trees import panoptic_tree

    raw = panoptic_tree(tmp_path / "raw")
    convert(ConvertConfig(raw, tmp_path / "out", workers=1, quiet=True))
    split = tmp_path / "out" / "examples"
    ds = shardkit.open(split)
    for index in range(len(ds)):
        out = tmp_path / f"s{index}.png"
        result = CliRunner().invoke(main, ["show", str(split), "--index", str(index), "-o", str(out)])
        assert result.exit_code == 0, result.output
        picture = _read_rgb(out)
        image, ids = ds[index]
        assert (ids == 255).any() and len(np.unique(ids)) > 3  # void and several classes
        h, w = ids.shape
        lay = Layout(h, w)
        top, x = lay.panel_top(True), lay.panel_x(1)
        pal = palette(len(ds.class_names), ds.class_colours)
        want = colourize(ids, pal, ignore_colour(pal))
        assert np.array_equal(picture[top:top + h, x:x + w], want)
        assert np.array_equal(picture[top:top + h, lay.panel_x(0):lay.panel_x(0) + w], image)
