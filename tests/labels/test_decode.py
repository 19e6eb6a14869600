"""LabelDecoder: label files to stored class ids, bit-exactly; colour masks, VOC palettes, Cityscapes remap, errors."""

from __future__ import annotations

import pickle
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from shardkit.errors import ConfigError, DecodeError, InputNotFoundError, LabelError
from shardkit.labels import (
    CAMVID_SEGNET,
    CITYSCAPES,
    CITYSCAPES_LABEL_IDS,
    VOC,
    ClassInfo,
    ClassTable,
    LabelDecoder,
    build_class_table,
    read_class_dict,
    voc_colormap,
)

RNG_SEED = 1234


def write_png(path: Path, arr: np.ndarray) -> Path:
    """Write ``arr`` (RGB/RGBA order if 3/4 channels) as PNG, non-ASCII-path safe."""
    if arr.ndim == 3 and arr.shape[2] == 3:
        arr = cv2.cvtColor(arr, cv2.COLOR_RGB2BGR)
    elif arr.ndim == 3 and arr.shape[2] == 4:
        arr = cv2.cvtColor(arr, cv2.COLOR_RGBA2BGRA)
    _ok, buf = cv2.imencode(path.suffix, arr)
    assert _ok
    buf.tofile(path)
    return path


def paint(ids: np.ndarray, colours: list[tuple[int, int, int]]) -> np.ndarray:
    """Colour mask (RGB) drawing each id with ``colours[id]``."""
    return np.asarray(colours, dtype=np.uint8)[ids]


def table_of(
    colours: list[tuple[int, int, int]], ignore: int | None = None, source: str = "test.csv"
) -> ClassTable:
    classes = tuple(ClassInfo(i, f"c{i}", c) for i, c in enumerate(colours))
    return ClassTable(classes, ignore, source=source)


COLOURS = [(0, 0, 0), (128, 64, 128), (244, 35, 232), (70, 70, 70), (0, 0, 142)]



# --------------------------------------------------------------------------- LabelDecoder: construction


def test_decoder_rejects_unknown_as_that_is_not_a_stored_id() -> None:
    with pytest.raises(ConfigError, match="--unknown-as 12"):
        LabelDecoder("ids", CAMVID_SEGNET, unknown_as=12)
    LabelDecoder("ids", CAMVID_SEGNET, unknown_as=11)
    LabelDecoder("palette", VOC, unknown_as=255)
    with pytest.raises(ConfigError):
        LabelDecoder("ids", CAMVID_SEGNET, colour_tolerance=256)
    with pytest.raises(ConfigError):
        LabelDecoder("rgb", CAMVID_SEGNET)


def test_decoder_colour_kind_needs_distinct_colours() -> None:
    with pytest.raises(ConfigError, match="no colour"):
        LabelDecoder("colour", build_class_table("ids", class_dict=None, palette=None, layout="generic",
                                                 num_classes=3, ignore_index=None))  # fmt: skip
    with pytest.raises(ConfigError, match="share colour"):
        LabelDecoder("colour", table_of([(1, 1, 1), (1, 1, 1)]))


def test_tables_and_decoders_pickle_for_worker_processes(tmp_path: Path) -> None:
    for table in (CAMVID_SEGNET, VOC, CITYSCAPES):
        assert pickle.loads(pickle.dumps(table)) == table
    dec = LabelDecoder("colour", table_of(COLOURS), colour_tolerance=3, unknown_as=0)
    back = pickle.loads(pickle.dumps(dec))
    assert back == dec
    ids = np.random.default_rng(RNG_SEED).integers(0, len(COLOURS), (6, 9))
    rgb = paint(ids, COLOURS)
    rgb[0, 0] = (2, 1, 0)  # near (0, 0, 0): the tolerance; and one unknown colour for unknown_as
    rgb[0, 1] = (99, 99, 99)
    mask = write_png(tmp_path / "mask.png", rgb)
    assert np.array_equal(back.decode(mask), dec.decode(mask))



# --------------------------------------------------------------------------- ids


def test_camvid_real_labels_decode_bit_exactly(camvid_root: Path) -> None:
    dec = LabelDecoder("ids", CAMVID_SEGNET)
    files = sorted((camvid_root / "trainannot").glob("*.png")) + sorted(
        (camvid_root / "valannot").glob("*.png")
    )
    assert len(files) == 149
    for f in files:
        ids = dec.decode(f)
        ref = cv2.imread(str(f), cv2.IMREAD_GRAYSCALE)
        assert ids.dtype == np.uint8 and ids.shape == (360, 480)
        assert np.array_equal(ids, ref), f


def test_ids_three_equal_channels_collapse_and_alpha_is_dropped(tmp_path: Path) -> None:
    ids = np.random.default_rng(RNG_SEED).integers(0, 12, (9, 11), dtype=np.uint8)
    rgb = write_png(tmp_path / "rgb.png", np.dstack([ids] * 3))
    rgba = write_png(tmp_path / "rgba.png", np.dstack([ids] * 3 + [np.full_like(ids, 7)]))
    dec = LabelDecoder("ids", CAMVID_SEGNET)
    assert np.array_equal(dec.decode(rgb), ids)
    assert np.array_equal(dec.decode(rgba), ids)


def test_ids_with_colours_is_an_error_pointing_to_class_tables(tmp_path: Path) -> None:
    arr = np.zeros((4, 5, 3), np.uint8)
    arr[1, 2] = (10, 20, 30)
    p = write_png(tmp_path / "colour.png", arr)
    with pytest.raises(LabelError) as e:
        LabelDecoder("ids", CAMVID_SEGNET).decode(p)
    msg = str(e.value)
    assert "colours, not class ids" in msg and str(p) in msg and "class_dict.csv" in msg and "1 px" in msg


def test_ids_out_of_range_lists_values_with_counts(tmp_path: Path) -> None:
    ids = np.zeros((10, 10), np.uint8)
    ids[0, :3] = 12
    ids[1, :7] = 40
    ids[2, :1] = 255
    ids[3, 0] = 11  # the ignore id is fine
    p = write_png(tmp_path / "lab.png", ids)
    with pytest.raises(LabelError) as e:
        LabelDecoder("ids", CAMVID_SEGNET).decode(p)
    msg = str(e.value)
    assert str(p) in msg and "12 classes" in msg
    assert "40 (7 px), 12 (3 px), 255 (1 px)" in msg
    # the fix by what the values look like: 255 far above (ignore), 12 and 40 sparse ids; never --unknown-as,
    # which would store them as one class without saying which
    assert "fix: --ignore-index 255 --num-classes 41" in msg and "--unknown-as" not in msg
    assert "\n" not in msg


def test_ids_out_of_range_lists_at_most_five_values(tmp_path: Path) -> None:
    ids = np.arange(100, 108, dtype=np.uint8).reshape(2, 4)
    p = write_png(tmp_path / "lab.png", ids)
    with pytest.raises(LabelError, match="and 3 more"):
        LabelDecoder("ids", CAMVID_SEGNET).decode(p)


def test_ids_unknown_as_maps_out_of_range_values(tmp_path: Path) -> None:
    ids = np.array([[0, 5, 12], [200, 11, 3]], np.uint8)
    p = write_png(tmp_path / "lab.png", ids)
    out = LabelDecoder("ids", CAMVID_SEGNET, unknown_as=11).decode(p)
    assert out.tolist() == [[0, 5, 11], [11, 11, 3]]


def test_16bit_label_with_valid_ids_is_lossless(tmp_path: Path) -> None:
    rng = np.random.default_rng(RNG_SEED)
    ids = rng.integers(0, 300, (20, 30)).astype(np.uint16)
    p = write_png(tmp_path / "l16.png", ids)
    table = build_class_table("ids", class_dict=None, palette=None, layout="generic", num_classes=300,
                              ignore_index=None)  # fmt: skip
    out = LabelDecoder("ids", table).decode(p)
    assert out.dtype == np.dtype("<u2") and np.array_equal(out, ids)
    small = rng.integers(0, 12, (20, 30)).astype(np.uint16)
    p2 = write_png(tmp_path / "s16.png", small)
    out2 = LabelDecoder("ids", CAMVID_SEGNET).decode(p2)
    assert out2.dtype == np.uint8 and np.array_equal(out2, small)
    small[0, 0] = 1000
    p3 = write_png(tmp_path / "bad16.png", small)
    with pytest.raises(LabelError, match=r"1000 \(1 px\)"):
        LabelDecoder("ids", CAMVID_SEGNET).decode(p3)


def test_label_in_a_non_ascii_path_decodes(tmp_path: Path) -> None:
    d = tmp_path / "données ラベル"
    d.mkdir()
    ids = np.array([[1, 2], [3, 4]], np.uint8)
    p = write_png(d / "étiquette.png", ids)
    assert np.array_equal(LabelDecoder("ids", CAMVID_SEGNET).decode(p), ids)


@pytest.mark.parametrize("content", [b"", b"not a png at all", "truncated"])
def test_undecodable_label_is_a_decode_error_with_a_fix(tmp_path: Path, content: bytes | str) -> None:
    p = tmp_path / "bad.png"
    if content == "truncated":
        _ok, buf = cv2.imencode(".png", np.random.default_rng(0).integers(0, 12, (50, 60), dtype=np.uint8))
        content = buf.tobytes()[: len(buf) // 2]
    p.write_bytes(content)  # type: ignore[arg-type]
    for kind, table in (("ids", CAMVID_SEGNET), ("palette", VOC), ("colour", table_of(COLOURS))):
        with pytest.raises(DecodeError) as e:
            LabelDecoder(kind, table).decode(p)
        msg = str(e.value)
        assert "cannot decode label" in msg and str(p) in msg and "--on-error skip" in msg


def test_unreadable_label_is_a_decode_error_with_the_os_reason(tmp_path: Path, monkeypatch) -> None:
    p = write_png(tmp_path / "lab.png", np.zeros((2, 2), np.uint8))

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(np, "fromfile", denied)
    with pytest.raises(DecodeError, match="Permission denied"):
        LabelDecoder("ids", CAMVID_SEGNET).decode(p)


def test_missing_label_is_input_not_found(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError):
        LabelDecoder("ids", CAMVID_SEGNET).decode(tmp_path / "gone.png")


# --------------------------------------------------------------------------- colour masks


def test_colour_mask_maps_every_pixel_exactly(tmp_path: Path) -> None:
    ids = np.random.default_rng(RNG_SEED).integers(0, len(COLOURS), (37, 53), dtype=np.uint8)
    p = write_png(tmp_path / "mask.png", paint(ids, COLOURS))
    out = LabelDecoder("colour", table_of(COLOURS)).decode(p)
    assert out.dtype == np.uint8 and np.array_equal(out, ids)


def test_colour_mask_alpha_is_dropped_and_grey_reads_as_equal_rgb(tmp_path: Path) -> None:
    ids = np.random.default_rng(RNG_SEED).integers(0, len(COLOURS), (8, 9), dtype=np.uint8)
    rgba = np.dstack([paint(ids, COLOURS), np.full(ids.shape, 128, np.uint8)])
    assert np.array_equal(
        LabelDecoder("colour", table_of(COLOURS)).decode(write_png(tmp_path / "a.png", rgba)), ids
    )
    grey_table = table_of([(0, 0, 0), (70, 70, 70), (200, 200, 200)])
    grey_ids = ids % 3
    grey = np.array([0, 70, 200], np.uint8)[grey_ids]
    assert np.array_equal(
        LabelDecoder("colour", grey_table).decode(write_png(tmp_path / "g.png", grey)), grey_ids
    )


def test_unknown_colour_error_names_file_colour_count_and_nearest(tmp_path: Path) -> None:
    ids = np.zeros((10, 10), np.uint8)
    rgb = paint(ids, COLOURS)
    rgb[0, :4] = (130, 66, 125)  # near class 1 (128,64,128): distance 3
    rgb[1, :2] = (250, 250, 250)
    p = write_png(tmp_path / "mask.png", rgb)
    with pytest.raises(LabelError) as e:
        LabelDecoder("colour", table_of(COLOURS)).decode(p)
    msg = str(e.value)
    assert str(p) in msg and "\n" not in msg
    assert "2 colour(s)" in msg
    assert "(130,66,125) 4 px, nearest (128,64,128) 'c1' (distance 3)" in msg
    assert "(250,250,250) 2 px" in msg
    assert msg.index("(130,66,125)") < msg.index("(250,250,250)")  # most pixels first
    assert "add it to test.csv" in msg and "--colour-tolerance" in msg and "--unknown-as ID" in msg


def test_unknown_colours_list_at_most_five(tmp_path: Path) -> None:
    rgb = np.zeros((1, 8, 3), np.uint8)
    rgb[0, :, 0] = np.arange(1, 9) * 20
    p = write_png(tmp_path / "mask.png", rgb)
    with pytest.raises(LabelError, match=r"8 colour.*and 3 more"):
        LabelDecoder("colour", table_of(COLOURS)).decode(p)


def test_colour_tolerance_maps_near_colours_to_the_nearest_class(tmp_path: Path) -> None:
    ids = np.random.default_rng(RNG_SEED).integers(0, len(COLOURS), (12, 12), dtype=np.uint8)
    rgb = paint(ids, COLOURS)
    rgb[0, 0] = (130, 66, 125)  # within 3 of class 1
    ids[0, 0] = 1
    rgb[0, 1] = (3, 0, 2)  # within 3 of class 0
    ids[0, 1] = 0
    p = write_png(tmp_path / "mask.png", rgb)
    assert np.array_equal(LabelDecoder("colour", table_of(COLOURS), colour_tolerance=3).decode(p), ids)
    with pytest.raises(LabelError, match=r"\(130,66,125\)"):
        LabelDecoder("colour", table_of(COLOURS), colour_tolerance=2).decode(p)


def test_unknown_as_maps_remaining_unknown_colours(tmp_path: Path) -> None:
    ids = np.random.default_rng(RNG_SEED).integers(0, len(COLOURS), (12, 12), dtype=np.uint8)
    rgb = paint(ids, COLOURS)
    rgb[3, 4] = (255, 255, 255)
    rgb[5, 6] = (1, 1, 1)
    p = write_png(tmp_path / "mask.png", rgb)
    out = LabelDecoder("colour", table_of(COLOURS, ignore=255), unknown_as=255).decode(p)
    expected = ids.copy()
    expected[3, 4] = expected[5, 6] = 255
    assert np.array_equal(out, expected)
    out = LabelDecoder("colour", table_of(COLOURS), colour_tolerance=1, unknown_as=4).decode(p)
    expected[3, 4], expected[5, 6] = 4, 0
    assert np.array_equal(out, expected)


def test_jpeg_colour_label_error_mentions_lossy_jpeg(tmp_path: Path) -> None:
    rgb = np.zeros((16, 16, 3), np.uint8)
    rgb[:, 8:] = (128, 64, 128)
    rgb[4:12, 4:12] = (244, 35, 232)
    p = tmp_path / "mask.jpg"
    _ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 50])
    buf.tofile(p)
    with pytest.raises(LabelError, match="JPEG labels are lossy"):
        LabelDecoder("colour", table_of(COLOURS)).decode(p)


def test_real_rgb_masks_contain_an_unlisted_white_that_is_named(rgb_masks_root: Path) -> None:
    table = read_class_dict(rgb_masks_root / "class_dict.csv")
    dec = LabelDecoder("colour", table)
    masks = sorted((rgb_masks_root / "train_labels").glob("*.png"))
    assert masks
    with pytest.raises(LabelError) as e:
        dec.decode(masks[0])
    msg = str(e.value)
    assert str(masks[0]) in msg and "(255,255,255)" in msg and "nearest" in msg and "class_dict.csv" in msg
    white = int(np.all(cv2.imread(str(masks[0]))[:, :, :3] == 255, axis=2).sum())
    assert f"(255,255,255) {white} px" in msg


def test_real_rgb_masks_decode_with_unknown_as(rgb_masks_root: Path) -> None:
    table = read_class_dict(rgb_masks_root / "class_dict.csv").with_ignore_index(255)
    dec = LabelDecoder("colour", table, unknown_as=255)
    masks = sorted(rgb_masks_root.glob("*_labels/*.png"))
    assert len(masks) == 20
    for m in masks:
        rgb = cv2.cvtColor(cv2.imread(str(m)), cv2.COLOR_BGR2RGB)
        out = dec.decode(m)
        assert out.shape == rgb.shape[:2]
        for c in table.classes:
            assert np.array_equal(out == c.id, np.all(rgb == c.colour, axis=2)), (m, c)
        assert set(np.unique(out).tolist()) <= {0, 1, 2, 255}


# --------------------------------------------------------------------------- palette (VOC)


def _voc_png(path: Path, idx: np.ndarray, palette: list[int]) -> Path:
    im = Image.fromarray(idx)
    im.putpalette(palette)
    assert im.mode == "P"
    im.save(path)
    return path


def test_voc_palette_png_decodes_to_indices_not_colours(tmp_path: Path) -> None:
    idx = np.random.default_rng(RNG_SEED).integers(0, 21, (15, 17), dtype=np.uint8)
    idx[0, :3] = 255
    voc = _voc_png(tmp_path / "voc.png", idx, voc_colormap().ravel().tolist())
    out = LabelDecoder("palette", VOC).decode(voc)
    assert out.dtype == np.uint8 and np.array_equal(out, idx)
    # OpenCV would have expanded the palette into colours:
    assert cv2.imread(str(voc), cv2.IMREAD_UNCHANGED).ndim == 3
    # Indices are the truth, whatever colours the palette draws them with.
    odd = _voc_png(tmp_path / "odd.png", idx, np.random.default_rng(1).integers(0, 256, 768).tolist())
    assert np.array_equal(LabelDecoder("palette", VOC).decode(odd), idx)


def test_voc_grey_and_rgb_exports_decode_too(tmp_path: Path) -> None:
    idx = np.random.default_rng(RNG_SEED).integers(0, 21, (15, 17), dtype=np.uint8)
    idx[2, :4] = 255
    grey = tmp_path / "grey.png"
    Image.fromarray(idx).save(grey)
    assert np.array_equal(LabelDecoder("palette", VOC).decode(grey), idx)
    rgb = tmp_path / "rgb.png"
    Image.fromarray(voc_colormap()[idx]).save(rgb)  # void border drawn as (224,224,192)
    assert np.array_equal(LabelDecoder("palette", VOC).decode(rgb), idx)


def test_voc_palette_index_out_of_range_is_a_label_error(tmp_path: Path) -> None:
    idx = np.zeros((4, 4), np.uint8)
    idx[0, 0] = 30
    p = _voc_png(tmp_path / "voc.png", idx, voc_colormap().ravel().tolist())
    with pytest.raises(LabelError, match=r"30 \(1 px\)"):
        LabelDecoder("palette", VOC).decode(p)
    assert LabelDecoder("palette", VOC, unknown_as=255).decode(p)[0, 0] == 255


# --------------------------------------------------------------------------- cityscapes


def test_cityscapes_label_ids_are_remapped_to_train_ids(tmp_path: Path) -> None:
    raw = np.array([[7, 26, 0], [33, 8, 255], [1, 24, 29]], np.uint8)
    p = write_png(tmp_path / "x_gtFine_labelIds.png", raw)
    out = LabelDecoder("cityscapes", CITYSCAPES).decode(p)
    assert out.tolist() == [[0, 13, 255], [18, 1, 255], [255, 11, 255]]
    ids_only = write_png(tmp_path / "y_gtFine_labelIds.png", raw[[0, 2]])
    assert LabelDecoder("cityscapes", CITYSCAPES_LABEL_IDS).decode(ids_only).tolist() == [
        [7, 26, 0],
        [1, 24, 29],
    ]


def test_cityscapes_label_ids_table_rejects_values_above_33(tmp_path: Path) -> None:
    p = write_png(tmp_path / "x.png", np.array([[7, 255]], np.uint8))
    with pytest.raises(LabelError, match=r"255 \(1 px\)"):
        LabelDecoder("cityscapes", CITYSCAPES_LABEL_IDS).decode(p)


def test_cityscapes_instance_ids_above_255_are_refused(tmp_path: Path) -> None:
    p = write_png(tmp_path / "x_instanceIds.png", np.array([[26001, 7]], np.uint16))
    with pytest.raises(LabelError, match=r"26001 \(1 px\)"):
        LabelDecoder("cityscapes", CITYSCAPES).decode(p)


def test_cityscapes_ignore_override_follows_the_remap(tmp_path: Path) -> None:
    table = build_class_table("cityscapes", class_dict=None, palette=None, layout="cityscapes",
                              num_classes=None, ignore_index=19)  # fmt: skip
    p = write_png(tmp_path / "x.png", np.array([[7, 0]], np.uint8))
    assert LabelDecoder("cityscapes", table).decode(p).tolist() == [[0, 19]]
