"""Label value maps (--label-map, --reduce-zero-label, --threshold) and the label file types, on small synthetic
edge cases (the real data of each kind is in test_real_kinds.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from shardkit.conversion.config import ConvertConfig
from shardkit.errors import ConfigError, DecodeError, LabelError
from shardkit.labels import ClassInfo, ClassTable, LabelDecoder
from shardkit.labels.values import ValueMap, ignore_warning, parse_label_map


def _table(n: int, ignore: int | None = None) -> ClassTable:
    return ClassTable(tuple(ClassInfo(i, f"c{i}") for i in range(n)), ignore, source="test")


def _png(path: Path, arr: np.ndarray, **kw: object) -> Path:
    Image.fromarray(arr).save(path, **kw)
    return path


# ---------------------------------------------------------------- parsing
def test_label_map_forms(tmp_path: Path) -> None:
    assert parse_label_map("255:1,0:0") == ((0, 0, 0), (255, 255, 1))
    assert parse_label_map(" 0-127 : 0 , 128-255:1") == ((0, 127, 0), (128, 255, 1))
    lines = tmp_path / "map.txt"
    lines.write_text("# raw id\n255 1\n7:0   # comment\n")
    assert parse_label_map(str(lines)) == ((7, 7, 0), (255, 255, 1))
    js = tmp_path / "map.json"
    js.write_text(json.dumps({"255": 1, "0-9": 0}))
    assert parse_label_map(str(js)) == ((0, 9, 0), (255, 255, 1))
    for bad in ("255:1,200-255:2", "a:1", "70000:1", "5-3:1", str(tmp_path / "missing.txt")):
        with pytest.raises(ConfigError):
            parse_label_map(bad)


def test_one_value_map_at_a_time_and_config_checks_it_up_front(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="both given"):
        ValueMap(((255, 255, 1),), threshold=127)
    with pytest.raises(ConfigError, match="both given"):
        ConvertConfig(tmp_path, tmp_path / "o", reduce_zero_label=True, threshold=127)
    with pytest.raises(ConfigError, match="SRC:ID"):
        ConvertConfig(tmp_path, tmp_path / "o", label_map="255=>1")


def test_the_manifest_records_the_map_and_fingerprints_follow_it(tmp_path: Path) -> None:
    plain = ConvertConfig(tmp_path, tmp_path / "o").preprocessing()
    assert not {"label_map", "threshold", "reduce_zero_label"} & set(plain)  # old manifests unchanged
    m = tmp_path / "m.txt"
    m.write_text("255:1\n")
    a = ConvertConfig(tmp_path, tmp_path / "o", label_map=str(m)).preprocessing()
    m.write_text("255:2\n")
    b = ConvertConfig(tmp_path, tmp_path / "o", label_map=str(m)).preprocessing()
    assert a["label_map"] == [[255, 255, 1]] and b["label_map"] == [[255, 255, 2]]  # the contents, not the name
    assert ConvertConfig(tmp_path, tmp_path / "o", threshold=127).preprocessing()["threshold"] == 127
    assert ConvertConfig(tmp_path, tmp_path / "o", reduce_zero_label=True).preprocessing()["reduce_zero_label"]


# ---------------------------------------------------------------- the maps on decoded labels
def test_reduce_zero_label_is_mmsegmentations_rule(tmp_path: Path) -> None:
    raw = np.array([[0, 1, 2, 150, 255]], np.uint8)
    vm = ValueMap(reduce_zero_label=True)
    table = vm.adapt_table(_table(150))
    assert table.ignore_index == 255
    got = LabelDecoder("ids", table, values=vm).decode(_png(tmp_path / "a.png", raw))
    # mmseg: label[label == 0] = 255; label -= 1; label[label == 254] = 255
    want = raw.astype(np.int64)
    want[want == 0] = 255
    want = want - 1
    want[want == 254] = 255
    assert np.array_equal(got, want)


def test_threshold_on_a_lossless_label_with_more_than_two_values_is_refused(tmp_path: Path) -> None:
    vm = ValueMap(threshold=127)
    dec = LabelDecoder("ids", vm.adapt_table(_table(2)), values=vm)
    assert np.array_equal(dec.decode(_png(tmp_path / "b.png", np.array([[0, 200]], np.uint8))), [[0, 1]])
    with pytest.raises(LabelError, match=r"binary masks.*3 values"):
        dec.decode(_png(tmp_path / "ids.png", np.array([[0, 1, 2]], np.uint8)))
    with pytest.raises(ConfigError, match="2 classes"):
        vm.adapt_table(_table(5))


def test_threshold_on_a_jpeg_of_grey_levels_is_refused(tmp_path: Path) -> None:
    vm = ValueMap(threshold=127)
    dec = LabelDecoder("ids", vm.adapt_table(_table(2)), values=vm)
    ramp = np.tile(np.arange(0, 256, 4, dtype=np.uint8), (64, 1))  # 64 grey levels: not a mask
    path = tmp_path / "ramp.jpg"
    cv2.imwrite(str(path), ramp)
    with pytest.raises(LabelError, match="binary masks"):
        dec.decode(path)


def test_threshold_reads_colour_jpeg_masks_through_pils_luma(tmp_path: Path) -> None:
    rgb = np.zeros((128, 128, 3), np.uint8)
    rgb[32:96, 32:96] = (250, 120, 60)  # a coloured blob: luma ~153 (> 127)
    path = tmp_path / "c.jpg"
    Image.fromarray(rgb).save(path, quality=90)
    vm = ValueMap(threshold=127)
    got = LabelDecoder("ids", vm.adapt_table(_table(2)), values=vm).decode(path)
    with Image.open(path) as im:
        assert np.array_equal(got, (np.array(im.convert("L")) > 127).astype(np.uint8))


def test_threshold_on_a_jpeg_of_few_class_ids_is_refused(tmp_path: Path) -> None:
    """Ids 0..3 saved as JPEG all lie below T: without the check they would all silently become 0."""
    ids = np.zeros((128, 128), np.uint8)
    ids[:, 32:64], ids[:, 64:96], ids[:, 96:] = 1, 2, 3
    path = tmp_path / "ids.jpg"
    cv2.imwrite(str(path), ids, [cv2.IMWRITE_JPEG_QUALITY, 95])
    vm = ValueMap(threshold=127)
    with pytest.raises(LabelError, match="exactly"):
        LabelDecoder("ids", vm.adapt_table(_table(2)), values=vm).decode(path)


def test_unmapped_values_are_kept_and_range_checked(tmp_path: Path) -> None:
    vm = ValueMap(((255, 255, 1),))
    dec = LabelDecoder("ids", _table(2), values=vm)
    with pytest.raises(LabelError, match="7 \\(1 px\\)"):
        dec.decode(_png(tmp_path / "x.png", np.array([[0, 255, 7]], np.uint8)))


def test_value_maps_do_not_apply_to_colour_masks() -> None:
    table = ClassTable((ClassInfo(0, "a", (0, 0, 0)), ClassInfo(1, "b", (255, 255, 255))), None)
    with pytest.raises(ConfigError, match="colour masks"):
        LabelDecoder("colour", table, values=ValueMap(threshold=127))


def test_ignore_warning_only_when_ignore_outnumbers_the_foreground() -> None:
    t = _table(2, 255)
    assert ignore_warning(t, np.array([900, 0]), 100) is not None
    assert ignore_warning(t, np.array([900, 200]), 100) is None
    camvid_like = _table(12, 11)  # ignore inside: its own class count
    assert ignore_warning(camvid_like, np.array([50] * 11 + [10]), 0) is None


# ---------------------------------------------------------------- file types
@pytest.mark.parametrize(("ext", "kw"), [(".bmp", {}), (".webp", {"lossless": True}), (".pgm", {}), (".tif", {}),
                                         (".gif", {}), (".png", {"bits": 4})])
def test_label_file_types_decode_bit_exactly(tmp_path: Path, ext: str, kw: dict) -> None:
    ids = (np.arange(24 * 20).reshape(24, 20) % 12).astype(np.uint8)
    path = _png(tmp_path / f"l{ext}", ids, **kw)
    with Image.open(path) as im:  # the independent reading
        want = np.array(im)
    if want.ndim == 3:  # WebP has no gray: three equal channels
        want = want[:, :, 0]
    if kw.get("bits") == 4:  # PIL scales a 4-bit gray PNG's samples by 17 to 0..255; the ids are the samples
        want = want // 17
    assert np.array_equal(want, ids)
    assert np.array_equal(LabelDecoder("ids", _table(12)).decode(path), ids)


def test_palette_labels_are_indices_even_with_a_colour_palette(tmp_path: Path) -> None:
    ids = np.array([[0, 1, 2], [2, 1, 0]], np.uint8)
    for ext in (".png", ".gif", ".bmp"):
        im = Image.fromarray(ids, "P")
        im.putpalette([0, 0, 0, 200, 10, 10, 10, 200, 10] + [0] * (253 * 3))
        path = tmp_path / f"p{ext}"
        im.save(path)
        assert np.array_equal(LabelDecoder("ids", _table(3)).decode(path), ids), ext


def _frames(path: Path, n: int, fmt: str) -> Path:
    frames = [Image.fromarray(np.full((8, 8), k, np.uint8)) for k in range(n)]
    frames[0].save(path, format=fmt, save_all=True, append_images=frames[1:])
    return path


@pytest.mark.parametrize(("name", "fmt", "what"), [("a.gif", "GIF", "animated GIF"),
                                                   ("a.tif", "TIFF", "multi-page TIFF")])
def test_several_frames_or_pages_are_refused(tmp_path: Path, name: str, fmt: str, what: str) -> None:
    path = _frames(tmp_path / name, 3, fmt)
    with pytest.raises(DecodeError, match=f"{what} \\(3 "):
        LabelDecoder("ids", _table(3)).decode(path)
    from shardkit.images.imageio import decode_image

    with pytest.raises(DecodeError, match=what):
        decode_image(path)


def test_gif_images_decode_to_rgb(tmp_path: Path) -> None:
    from shardkit.images.imageio import decode_image

    rgb = np.zeros((6, 7, 3), np.uint8)
    rgb[2:4, 3:5] = (200, 30, 10)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="GIF")
    path = tmp_path / "i.gif"
    path.write_bytes(buf.getvalue())
    with Image.open(path) as im:
        assert np.array_equal(decode_image(path), np.array(im.convert("RGB")))


def test_value_maps_in_a_toml_config_and_in_the_dry_run(tmp_path: Path) -> None:
    import shutil

    from click.testing import CliRunner

    from shardkit.cli import main

    data = Path(__file__).resolve().parents[1] / "data" / "isbi-em"
    raw = tmp_path / "raw"
    for sub in ("images", "masks"):
        (raw / sub).mkdir(parents=True)
    shutil.copyfile(data / "image" / "0.png", raw / "images" / "0.png")
    shutil.copyfile(data / "label" / "0.png", raw / "masks" / "0.png")
    config = tmp_path / "c.toml"
    config.write_text('[convert]\nlabel_map = "255:1,0:0"\nworkers = 1\n')
    dry = CliRunner().invoke(main, ["convert", "--config", str(config), str(raw), str(tmp_path / "o"), "--dry-run"])
    assert dry.exit_code == 0 and "label values: --label-map 0:0,255:1" in dry.output
    assert "classes: 2" in dry.output
    res = CliRunner().invoke(main, ["convert", "--config", str(config), str(raw), str(tmp_path / "o"), "-q"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "o" / "all" / "manifest.json").read_text())
    assert manifest["preprocessing"]["label_map"] == [[0, 0, 0], [255, 255, 1]]
    bad = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "o2"), "--threshold", "127",
                                    "--reduce-zero-label"])
    assert bad.exit_code == 2 and "both given" in bad.output


# ---------------------------------------------------------------- no silent merge onto one id or the ignore id
def test_reduce_zero_label_refuses_an_ignore_id_that_a_class_reaches() -> None:
    vm = ValueMap(reduce_zero_label=True)
    with pytest.raises(ConfigError, match=r"raw 1 \(class 0 'c0'\) would become 0 too.*drop --ignore-index 0"):
        vm.adapt_table(_table(3, ignore=0))  # --reduce-zero-label --ignore-index 0: raw 1 -> 0 -> ignored
    with pytest.raises(ConfigError, match=r"raw 256 \(class 255 'c255'\) would become 255 too.*--ignore-index 65535"):
        vm.adapt_table(_table(300))  # 16-bit ids: the default ignore id 255 is a class
    with pytest.raises(ConfigError, match=r"raw 255 \(class 254 'c254'\) would stay 255"):
        vm.adapt_table(_table(255))
    assert vm.adapt_table(_table(254)).ignore_index == 255
    assert vm.adapt_table(_table(300, ignore=65535)).ignore_index == 65535


def test_reduce_zero_label_refuses_a_raw_value_that_would_become_the_ignore_id(tmp_path: Path) -> None:
    raw = np.array([[0, 1, 150, 256, 256]], np.uint16)  # 16-bit labels: raw 256 - 1 = 255, the ignore id
    path = _png(tmp_path / "a.png", raw)
    vm = ValueMap(reduce_zero_label=True)
    dec = LabelDecoder("ids", vm.adapt_table(_table(150)), values=vm)
    with pytest.raises(LabelError, match=r"a\.png: --reduce-zero-label turns raw value 256 \(2 px\) into 255"):
        dec.decode(path)
    wide = LabelDecoder("ids", vm.adapt_table(_table(256, ignore=65535)), values=vm)  # the fix: exact ids
    assert wide.decode(path).tolist() == [[65535, 0, 149, 255, 255]]


def test_a_label_map_refuses_to_merge_a_value_it_does_not_name(tmp_path: Path) -> None:
    path = _png(tmp_path / "m.png", np.array([[0, 1, 255, 255]], np.uint8))
    vm = ValueMap(((255, 255, 1),))  # raw 1 is kept as 1 and raw 255 becomes 1: two raw values, one id
    with pytest.raises(LabelError, match=r"m\.png: --label-map 255:1 maps raw 255 to 1, and raw value 1 \(1 px\)"
                                         r".*fix: name raw 1 in the map: 1:1 if it is the same class"):
        LabelDecoder("ids", _table(3), values=vm).decode(path)
    said = ValueMap(((1, 1, 1), (255, 255, 1)))  # the map says so: both are class 1
    assert LabelDecoder("ids", _table(3), values=said).decode(path).tolist() == [[0, 1, 1, 1]]
    own = ValueMap(((1, 1, 2), (255, 255, 1)))
    assert LabelDecoder("ids", _table(3), values=own).decode(path).tolist() == [[0, 2, 1, 1]]
    to_ignore = ValueMap(((1, 1, 255),))  # a target that is the ignore id: raw 255 is ignore as it stands
    assert LabelDecoder("ids", _table(3, 255), values=to_ignore).decode(path).tolist() == [[0, 255, 255, 255]]
    assert ValueMap(((0, 127, 0), (128, 255, 1))).merges(None) == ()  # ranges naming every value


def test_a_scan_names_the_file_whose_value_a_map_would_merge(tmp_path: Path) -> None:
    from functools import partial

    from shardkit.labels.idscan import scan_label_values

    good = _png(tmp_path / "good.png", np.array([[0, 255]], np.uint8))
    bad = _png(tmp_path / "bad.png", np.array([[0, 1, 255]], np.uint8))
    vm = ValueMap(((255, 255, 1),))
    with pytest.raises(LabelError, match=r"bad\.png: --label-map 255:1 maps raw 255 to 1, and raw value 1 \(1 px\)"):
        scan_label_values([good, bad], max_pixels=1 << 20, value_map=partial(vm.apply, ignore_index=None))


def test_the_choice_names_the_ignore_id_reduce_zero_label_adds() -> None:
    from shardkit.labels.policy import TableChoice

    choice = ValueMap(reduce_zero_label=True).adapt(TableChoice(_table(150), "--num-classes 150"))
    assert choice.table.ignore_index == 255
    assert choice.line().endswith("from --reduce-zero-label (raw 0); ignore id 255")


def test_label_map_files_read_like_class_tables(tmp_path: Path) -> None:
    header = tmp_path / "map.csv"
    header.write_text("raw,id\n255,1\n0,0\n")
    assert parse_label_map(str(header)) == ((0, 0, 0), (255, 255, 1))
    for name, text, match in [("t.json", '{"255": true}', r"target True of '255' is not an integer id"),
                              ("f.json", '{"255": 1.0}', r"target 1\.0 of '255'|'255:1\.0' is not SRC:ID"),
                              ("d.json", "[" * 100_000 + "]" * 100_000, r"nests 100000 levels deep"),
                              ("dup.txt", "1:0\n1:2\n", r"overlap"),
                              ("h.txt", "raw,id\nsrc,dst\n1:0\n", r"'src,dst' is not SRC:ID")]:
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ConfigError, match=match) as e:
            parse_label_map(str(path))
        assert "\n" not in str(e.value)
