"""Decoding images, fitting image/label pairs to a size, and label encodings."""

from __future__ import annotations

import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from shardkit.errors import ConfigError, DecodeError, InputNotFoundError, LabelError, ShardFormatError
from shardkit.imageio import _jpeg_truncated, _png_plain_8bit, decode_image, decode_label_pixels, read_image_size
from shardkit.preprocess import decode_label_encoding, encode_label, fit_pair, stored_label_shape

RNG = np.random.default_rng(2024)


def write(path: Path, arr: np.ndarray, params: list[int] | None = None) -> Path:
    """Encode ``arr`` (already in OpenCV channel order) by the path's suffix; non-ASCII-path safe."""
    _ok, buf = cv2.imencode(path.suffix, arr, params or [])
    assert _ok
    buf.tofile(path)
    return path


def rgb_image(h: int = 24, w: int = 32) -> np.ndarray:
    return RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)


# --------------------------------------------------------------------------- decode_image


@pytest.mark.parametrize(
    ("suffix", "params"),
    [(".png", []), (".bmp", []), (".tiff", []), (".webp", [cv2.IMWRITE_WEBP_QUALITY, 101])],
)
def test_decode_image_lossless_formats_give_exact_rgb(tmp_path: Path, suffix: str, params: list[int]) -> None:
    rgb = rgb_image()
    p = write(tmp_path / f"img{suffix}", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), params)
    out = decode_image(p)
    assert out.dtype == np.uint8 and out.shape == (24, 32, 3) and out.flags.c_contiguous
    assert np.array_equal(out, rgb)


def test_decode_image_jpeg_is_rgb_ordered(tmp_path: Path) -> None:
    rgb = np.zeros((16, 16, 3), np.uint8)
    rgb[..., 0] = 250  # pure red
    p = write(tmp_path / "img.jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 95])
    out = decode_image(p)
    assert out.shape == (16, 16, 3)
    assert out[..., 0].min() > 240 and out[..., 1:].max() < 10


def test_decode_image_real_camvid_matches_opencv(camvid_root: Path) -> None:
    f = sorted((camvid_root / "train").glob("*.png"))[0]
    out = decode_image(f)
    assert out.shape == (360, 480, 3)
    assert np.array_equal(out, cv2.imread(str(f), cv2.IMREAD_COLOR)[:, :, ::-1])


def test_decode_image_grayscale_is_stacked_to_three_channels(tmp_path: Path) -> None:
    grey = RNG.integers(0, 256, (10, 12), dtype=np.uint8)
    out = decode_image(write(tmp_path / "g.png", grey))
    assert out.shape == (10, 12, 3)
    for c in range(3):
        assert np.array_equal(out[..., c], grey)


def test_decode_image_drops_alpha(tmp_path: Path) -> None:
    rgb = rgb_image(8, 9)
    bgra = np.dstack([cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), np.zeros((8, 9), np.uint8)])
    out = decode_image(write(tmp_path / "a.png", bgra))
    assert np.array_equal(out, rgb)  # colours kept as stored, not blended by the (zero) alpha


def test_decode_image_16bit_keeps_the_high_byte(tmp_path: Path) -> None:
    rgb16 = RNG.integers(0, 65536, (6, 7, 3), dtype=np.uint16)
    out = decode_image(write(tmp_path / "d.png", cv2.cvtColor(rgb16, cv2.COLOR_RGB2BGR)))
    assert out.dtype == np.uint8
    assert np.array_equal(out, (rgb16 >> 8).astype(np.uint8))


def test_decode_image_float_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path / "f.tiff", np.ones((4, 5), np.float32))
    with pytest.raises(DecodeError, match="float32"):
        decode_image(p)


def test_decode_image_non_ascii_path(tmp_path: Path) -> None:
    d = tmp_path / "画像 données"
    d.mkdir()
    rgb = rgb_image(5, 6)
    p = write(d / "ß.png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert np.array_equal(decode_image(p), rgb)


def _truncated(suffix: str) -> bytes:
    _ok, buf = cv2.imencode(suffix, cv2.cvtColor(rgb_image(40, 50), cv2.COLOR_RGB2BGR))
    data = buf.tobytes()
    return data[: int(len(data) * 0.6)]


def test_decode_label_pixels_real_labels_match_opencv_bit_exactly(camvid_root: Path, rgb_masks_root: Path) -> None:
    """The libspng fast path (8-bit gray ids, RGB colour masks) gives OpenCV's IMREAD_UNCHANGED pixels."""
    files = sorted((camvid_root / "trainannot").glob("*.png")) + sorted(rgb_masks_root.rglob("*_color_mask.png"))
    kinds = set()
    for f in files:
        data = np.fromfile(f, np.uint8)
        assert _png_plain_8bit(data), f
        kinds.add(int(data[25]))
        assert np.array_equal(decode_label_pixels(f), cv2.imdecode(data, cv2.IMREAD_UNCHANGED)), f
    assert kinds == {0, 2}, "both gray id maps and RGB colour masks were compared"


def _with_trns(png: bytes, payload: bytes) -> bytes:
    """Insert a tRNS chunk right after IHDR (8-byte signature + 25-byte IHDR chunk)."""
    chunk = len(payload).to_bytes(4, "big") + b"tRNS" + payload
    return png[:33] + chunk + zlib.crc32(chunk[4:]).to_bytes(4, "big") + png[33:]


def test_decode_label_pixels_leaves_transparency_palette_and_16bit_to_opencv(tmp_path: Path) -> None:
    gray = RNG.integers(0, 12, (7, 9), dtype=np.uint8)
    _ok, buf = cv2.imencode(".png", gray)
    cases = {
        "gray.png": (buf.tobytes(), True),
        "trns.png": (_with_trns(buf.tobytes(), b"\x00\x03"), False),
        "deep.png": (cv2.imencode(".png", gray.astype(np.uint16) * 1000)[1].tobytes(), False),
        "bgra.png": (cv2.imencode(".png", np.dstack([gray] * 4))[1].tobytes(), False),
    }
    Image.fromarray(gray, mode="L").convert("P").save(tmp_path / "pal.png")
    cases["pal.png"] = ((tmp_path / "pal.png").read_bytes(), False)
    for name, (content, fast) in cases.items():
        p = tmp_path / name
        p.write_bytes(content)
        data = np.fromfile(p, np.uint8)
        assert _png_plain_8bit(data) is fast, name
        assert np.array_equal(decode_label_pixels(p), cv2.imdecode(data, cv2.IMREAD_UNCHANGED)), name


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("empty.png", b""),
        ("text.png", b"this is not an image\n"),
        ("trunc.png", _truncated(".png")),
        ("trunc.jpg", _truncated(".jpg")),
        ("trunc.webp", _truncated(".webp")),
    ],
)
def test_decode_image_corrupt_files_are_decode_errors(tmp_path: Path, name: str, content: bytes) -> None:
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(DecodeError) as e:
        decode_image(p)
    msg = str(e.value)
    assert str(p) in msg and "cannot decode image" in msg and "fix:" in msg and "\n" not in msg
    if not content:
        assert "0 bytes" in msg


def test_jpeg_without_end_marker_after_the_last_scan_counts_as_truncated() -> None:
    _ok, buf = cv2.imencode(".jpg", rgb_image())
    assert not _jpeg_truncated(buf)
    assert _jpeg_truncated(np.frombuffer(buf.tobytes()[:-100], np.uint8))
    assert not _jpeg_truncated(np.frombuffer(b"\x89PNG....", np.uint8))


def test_decode_image_missing_file_is_input_not_found(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError):
        decode_image(tmp_path / "missing.png")


# --------------------------------------------------------------------------- read_image_size


def test_read_image_size_reads_the_header(tmp_path: Path, camvid_root: Path) -> None:
    assert read_image_size(sorted((camvid_root / "train").glob("*.png"))[0]) == (360, 480)
    p = write(tmp_path / "x.jpg", rgb_image(13, 29))
    assert read_image_size(p) == (13, 29)
    # Only the header is read: a PNG cut after its header still reports its size.
    full = (tmp_path / "x.png").with_suffix(".png")
    write(full, rgb_image(17, 23))
    cut = tmp_path / "cut.png"
    cut.write_bytes(full.read_bytes()[:64])
    assert read_image_size(cut) == (17, 23)


def test_read_image_size_errors(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError):
        read_image_size(tmp_path / "missing.png")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(DecodeError):
        read_image_size(bad)


# --------------------------------------------------------------------------- fit_pair


def pair(h: int, w: int, classes: int = 12, dtype: type = np.uint8) -> tuple[np.ndarray, np.ndarray]:
    return rgb_image(h, w), RNG.integers(0, classes, (h, w)).astype(dtype)


def test_fit_pair_size_mismatch_names_the_label_and_both_sizes() -> None:
    img, _ = pair(10, 20)
    lab = np.zeros((10, 21), np.uint8)
    with pytest.raises(LabelError) as e:
        fit_pair(img, lab, size=None, resize="none", crop="center", pad_label=0, label_path=Path("a/lab.png"))
    msg = str(e.value)
    assert (
        "a/lab.png" in msg
        and "10x21" in msg
        and "10x20" in msg
        and "re-export the label at the image size" in msg
    )


def test_fit_pair_without_size_changes_nothing() -> None:
    img, lab = pair(11, 13)
    out_img, out_lab = fit_pair(img, lab, size=None, resize="none", crop="center", pad_label=255)
    assert np.array_equal(out_img, img) and np.array_equal(out_lab, lab)


def test_fit_pair_exact_resize_hits_the_size() -> None:
    img, lab = pair(36, 48)
    out_img, out_lab = fit_pair(img, lab, size=(20, 30), resize="exact", crop="none", pad_label=255)
    assert out_img.shape == (20, 30, 3) and out_lab.shape == (20, 30)


def test_fit_pair_shorter_covers_the_size_keeping_aspect() -> None:
    img, lab = pair(360, 480)
    out_img, out_lab = fit_pair(img, lab, size=(352, 352), resize="shorter", crop="none", pad_label=255)
    assert out_img.shape == (352, 469, 3) and out_lab.shape == (352, 469)  # 480 * 352/360 = 469.3
    out_img, out_lab = fit_pair(img, lab, size=(352, 352), resize="shorter", crop="center", pad_label=255)
    assert out_img.shape == (352, 352, 3) and out_lab.shape == (352, 352)
    img, lab = pair(100, 50)
    out_img, _ = fit_pair(img, lab, size=(64, 64), resize="shorter", crop="none", pad_label=255)
    assert out_img.shape == (128, 64, 3)


def test_fit_pair_shorter_dims_are_never_below_the_target() -> None:
    for h, w in [(97, 131), (131, 97), (3, 1000), (999, 7), (64, 64)]:
        img, lab = pair(h, w)
        out_img, _ = fit_pair(img, lab, size=(61, 67), resize="shorter", crop="none", pad_label=0)
        assert out_img.shape[0] >= 61 and out_img.shape[1] >= 67
        assert out_img.shape[0] == 61 or out_img.shape[1] == 67


def test_fit_pair_image_uses_area_to_shrink_and_linear_to_enlarge() -> None:
    img, lab = pair(40, 60)
    small, _ = fit_pair(img, lab, size=(20, 30), resize="exact", crop="none", pad_label=0)
    assert np.array_equal(small, cv2.resize(img, (30, 20), interpolation=cv2.INTER_AREA))
    big, _ = fit_pair(img, lab, size=(80, 90), resize="exact", crop="none", pad_label=0)
    assert np.array_equal(big, cv2.resize(img, (90, 80), interpolation=cv2.INTER_LINEAR))


@pytest.mark.parametrize("size", [(17, 23), (50, 70), (100, 41), (7, 200)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_fit_pair_labels_only_hold_ids_from_the_source(size: tuple[int, int], dtype: type) -> None:
    img, lab = pair(37, 53, classes=300 if dtype is np.uint16 else 12, dtype=dtype)
    lab[lab == 5] = 7  # make an id absent so a blend would be caught
    _, out = fit_pair(img, lab, size=size, resize="exact", crop="none", pad_label=0)
    assert out.dtype == dtype
    assert set(np.unique(out).tolist()) <= set(np.unique(lab).tolist())


def test_fit_pair_label_upscale_by_two_is_pixel_replication() -> None:
    img, lab = pair(9, 11)
    _, out = fit_pair(img, lab, size=(18, 22), resize="exact", crop="none", pad_label=0)
    assert np.array_equal(out, np.repeat(np.repeat(lab, 2, axis=0), 2, axis=1))


def test_fit_pair_label_shrink_by_three_samples_block_centres() -> None:
    img, lab = pair(30, 36)
    _, out = fit_pair(img, lab, size=(10, 12), resize="exact", crop="none", pad_label=0)
    assert np.array_equal(out, lab[1::3, 1::3])  # aligned with the image's area average


def tf_crop_or_pad(arr: np.ndarray, th: int, tw: int, fill: int) -> np.ndarray:
    """Reference: tf.image.resize_with_crop_or_pad, written from its definition."""
    h, w = arr.shape[:2]
    off_crop_h, off_pad_h = max((h - th) // 2, 0), max((th - h) // 2, 0)
    off_crop_w, off_pad_w = max((w - tw) // 2, 0), max((tw - w) // 2, 0)
    cropped = arr[off_crop_h : off_crop_h + min(th, h), off_crop_w : off_crop_w + min(tw, w)]
    out = np.full((th, tw, *arr.shape[2:]), fill, arr.dtype)
    out[off_pad_h : off_pad_h + cropped.shape[0], off_pad_w : off_pad_w + cropped.shape[1]] = cropped
    return out


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ((7, 9), (4, 4)),
        ((8, 10), (3, 5)),
        ((5, 5), (8, 9)),
        ((4, 6), (7, 7)),
        ((7, 4), (4, 9)),
        ((3, 11), (6, 2)),
    ],
)
def test_center_crop_or_pad_matches_tensorflow_on_odd_and_even_sizes(
    src: tuple[int, int], dst: tuple[int, int]
) -> None:
    img, lab = pair(*src)
    out_img, out_lab = fit_pair(img, lab, size=dst, resize="none", crop="center", pad_label=255)
    assert np.array_equal(out_img, tf_crop_or_pad(img, *dst, 0))
    assert np.array_equal(out_lab, tf_crop_or_pad(lab, *dst, 255))
    assert out_img.flags.c_contiguous and out_lab.flags.c_contiguous


def test_center_crop_and_pad_offsets_by_hand() -> None:
    lab = np.arange(5, dtype=np.uint8)[None, :].repeat(2, axis=0)
    img = np.dstack([lab] * 3)
    _, out = fit_pair(img, lab, size=(2, 2), resize="none", crop="center", pad_label=9)
    assert out[0].tolist() == [1, 2]  # (5 - 2) // 2 = 1
    _, out = fit_pair(img, lab, size=(2, 8), resize="none", crop="center", pad_label=9)
    assert out[0].tolist() == [9, 0, 1, 2, 3, 4, 9, 9]  # (8 - 5) // 2 = 1 before, 2 after
    out_img, _ = fit_pair(img, lab, size=(2, 8), resize="none", crop="center", pad_label=9)
    assert out_img[0, :, 0].tolist() == [0, 0, 1, 2, 3, 4, 0, 0]


def test_fit_pair_rejects_bad_options() -> None:
    img, lab = pair(4, 4)
    with pytest.raises(ConfigError):
        fit_pair(img, lab, size=(2, 2), resize="fit", crop="center", pad_label=0)
    with pytest.raises(ConfigError):
        fit_pair(img, lab, size=(2, 2), resize="none", crop="random", pad_label=0)
    with pytest.raises(ConfigError):
        fit_pair(img, lab, size=None, resize="exact", crop="center", pad_label=0)
    with pytest.raises(ConfigError, match="pad label 300"):
        fit_pair(img, lab, size=(8, 8), resize="none", crop="center", pad_label=300)


# --------------------------------------------------------------------------- label encodings


@pytest.mark.parametrize("encoding", ["index", "onehot", "packed"])
@pytest.mark.parametrize(("num_classes", "ignore"), [(12, 11), (21, 255), (300, 65535)])
def test_label_encoding_round_trips(encoding: str, num_classes: int, ignore: int) -> None:
    dtype = np.uint8 if max(num_classes - 1, ignore) <= 255 else np.dtype("<u2")
    ids = RNG.integers(0, num_classes, (13, 17)).astype(dtype)
    ids[0, :5] = ignore
    stored = encode_label(ids, encoding, num_classes)
    assert stored.shape == stored_label_shape((13, 17), encoding, num_classes)
    if encoding != "index":
        assert stored.dtype == np.uint8
    back = decode_label_encoding(stored, encoding, num_classes, ignore)
    assert back.dtype == ids.dtype and np.array_equal(back, ids)


@pytest.mark.parametrize("num_classes", [12, 21, 300])
def test_onehot_is_zero_one_and_packed_is_packbits_of_it(num_classes: int) -> None:
    ids = RNG.integers(0, num_classes, (9, 10)).astype(np.uint16)
    ids[0, 0] = 65535  # beyond C: all-zero vector
    onehot = encode_label(ids, "onehot", num_classes)
    assert onehot.shape == (9, 10, num_classes) and set(np.unique(onehot).tolist()) == {0, 1}
    assert onehot[0, 0].sum() == 0
    assert np.array_equal(onehot[1:].argmax(-1), ids[1:])
    packed = encode_label(ids, "packed", num_classes)
    assert packed.shape == (9, 10, (num_classes + 7) // 8)
    assert np.array_equal(packed, np.packbits(onehot, axis=-1))


def test_encode_label_fills_a_given_buffer() -> None:
    ids = RNG.integers(0, 21, (5, 6)).astype(np.uint8)
    for encoding in ("index", "onehot", "packed"):
        buf = np.full(stored_label_shape((5, 6), encoding, 21), 77, np.uint8)
        out = encode_label(ids, encoding, 21, out=buf)
        assert out is buf
        assert np.array_equal(decode_label_encoding(buf, encoding, 21, 255), ids)
    with pytest.raises(ConfigError, match="buffer"):
        encode_label(ids, "onehot", 21, out=np.zeros((5, 6, 20), np.uint8))


def test_encode_label_rejects_bad_input() -> None:
    with pytest.raises(ConfigError):
        encode_label(np.zeros((2, 2), np.uint8), "rle", 3)
    with pytest.raises(LabelError):
        encode_label(np.zeros(4, np.uint8), "index", 3)
    with pytest.raises(ConfigError):
        stored_label_shape((2, 2), "rle", 3)


def test_decode_label_encoding_handles_batches_and_malformed_vectors() -> None:
    ids = RNG.integers(0, 12, (4, 5, 6)).astype(np.uint8)
    batch = np.stack([encode_label(i, "packed", 12) for i in ids])
    assert np.array_equal(encode_label(ids, "packed", 12), batch)
    assert np.array_equal(
        encode_label(ids, "onehot", 12), np.stack([encode_label(i, "onehot", 12) for i in ids])
    )
    assert np.array_equal(decode_label_encoding(batch, "packed", 12, 11), ids)
    empty = np.zeros((2, 2, 12), np.uint8)
    with pytest.raises(ShardFormatError, match="no ignore index"):
        decode_label_encoding(empty, "onehot", 12, None)
    multi = empty.copy()
    multi[0, 0, :2] = 1
    with pytest.raises(ShardFormatError, match="more than one"):
        decode_label_encoding(multi, "onehot", 12, 255)
    with pytest.raises(ShardFormatError, match="channels"):
        decode_label_encoding(empty, "onehot", 13, 255)


def test_libspng_and_opencv_decode_real_pngs_identically(camvid_root: Path, rgb_masks_root: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import shardkit.imageio as tr

    assert tr._spng is not None, "pyspng is a dependency: the fast PNG path must be what the tests exercise"
    files = sorted((camvid_root / "val").glob("*.png"))[:5] + sorted((rgb_masks_root / "train").glob("*.png"))[:5]
    fast = [tr.decode_image(f) for f in files]
    monkeypatch.setattr(tr, "_spng", None)
    slow = [tr.decode_image(f) for f in files]
    for f, a, b in zip(files, fast, slow, strict=True):
        assert a.dtype == b.dtype == np.uint8 and np.array_equal(a, b), f


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P", "I;16"])
def test_libspng_and_opencv_agree_on_every_png_kind(tmp_path: Path, mode: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import shardkit.imageio as tr

    rng = np.random.default_rng(1)
    if mode == "I;16":
        img = Image.fromarray(rng.integers(0, 65535, (7, 9), dtype=np.uint16))
    elif mode == "P":
        img = Image.fromarray(rng.integers(0, 4, (7, 9), dtype=np.uint8), mode="P")
        img.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 9, 9] + [0] * (252 * 3))
    else:
        img = Image.fromarray(rng.integers(0, 256, (7, 9, len(mode)), dtype=np.uint8).squeeze(), mode=mode)
    path = tmp_path / f"x-{mode.replace(';', '')}.png"
    img.save(path)
    fast = tr.decode_image(path)
    monkeypatch.setattr(tr, "_spng", None)
    assert np.array_equal(fast, tr.decode_image(path))
