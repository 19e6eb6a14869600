"""preprocess: fit image/label pairs to a size (labels nearest only), label encodings."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from shardkit.errors import ConfigError, LabelError, ShardFormatError
from shardkit.images.preprocess import decode_label_encoding, encode_label, fit_pair, stored_label_shape

RNG = np.random.default_rng(2024)


def rgb_image(h: int = 24, w: int = 32) -> np.ndarray:
    return RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)


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
