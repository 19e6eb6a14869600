"""Label encodings (shardkit.codecs.encoding): every class id round-trips bit-exactly through index, onehot and packed,
for uint8 and uint16 ids; packed bits are where the spec (formats/) says; reader outputs and transcoding."""

from __future__ import annotations

import numpy as np
import pytest

from shardkit.codecs import encoding
from shardkit.codecs.encoding import Index, OneHot, Packed
from shardkit.errors import ConfigError, LabelError, ShardFormatError
from shardkit.formats.base import SampleSpec

# (num_classes, ignore index): uint8 ids, an ignore id past the classes, uint16 ids (> 256 classes)
CASES = [(12, 255), (12, 11), (256, None), (300, 65535), (9, None)]


def _every_id(num_classes: int, ignore: int | None) -> np.ndarray:
    """A (B, H, W) batch holding every class id (and the ignore id) at least once, in a shuffled order."""
    ids = list(range(num_classes)) + ([ignore] if ignore is not None and ignore >= num_classes else [])
    dtype = encoding.id_dtype(num_classes, ignore)
    flat = np.array(ids * 3, dtype=dtype)
    np.random.default_rng(num_classes).shuffle(flat)
    n = len(flat) - len(flat) % 6
    return flat[:n].reshape(2, 3, -1)


@pytest.mark.parametrize(("num_classes", "ignore"), CASES)
@pytest.mark.parametrize("name", encoding.NAMES)
def test_every_class_id_round_trips_bit_exactly(name: str, num_classes: int, ignore: int | None) -> None:
    ids = _every_id(num_classes, ignore)
    enc = encoding.stored(name, num_classes, ids.dtype)
    stored = enc.encode(ids)
    assert stored.shape == enc.batch_shape(ids.shape) == (*ids.shape[:-2], *enc.shape(ids.shape[-2:]))
    assert stored.dtype == enc.dtype == (ids.dtype if name == "index" else np.uint8)
    back = enc.decode(stored, ignore)
    assert back.dtype == ids.dtype  # uint8 stays uint8, uint16 stays uint16
    assert np.array_equal(back, ids)
    out = np.zeros(ids.shape, ids.dtype)
    enc.decode_into(stored, out, ignore)
    assert np.array_equal(out, ids)
    for k in range(ids.shape[0]):  # per sample = the batch's slice
        assert np.array_equal(enc.encode(ids[k]), stored[k])


@pytest.mark.parametrize("num_classes", [1, 8, 9, 12, 16, 300])
def test_packed_bits_are_the_big_bit_order_one_hot(num_classes: int) -> None:
    ids = np.arange(num_classes, dtype=encoding.id_dtype(num_classes, None)).reshape(1, -1)
    packed = Packed(num_classes).encode(ids)
    assert packed.shape == (1, num_classes, (num_classes + 7) // 8)
    for k in range(num_classes):
        want = np.zeros(packed.shape[-1], np.uint8)
        want[k // 8] = 0x80 >> (k % 8)  # bit 7 - k % 8 of byte k // 8
        assert np.array_equal(packed[0, k], want)
    onehot = (ids[..., None] == np.arange(num_classes)).astype(np.uint8)
    assert np.array_equal(packed, np.packbits(onehot, axis=-1, bitorder="big"))
    assert not Packed(num_classes).encode(np.full((2, 2), 255 if num_classes < 255 else 65535)).any()


def test_one_hot_layouts_and_dtypes() -> None:
    ids = _every_id(12, 255)
    want = (ids[..., None] == np.arange(12)).astype(np.uint8)  # 255 → all zero
    assert np.array_equal(OneHot(12).encode(ids), want)
    cf = OneHot(12, np.float32, channels_first=True)
    got = cf.encode(ids)
    assert got.dtype == np.float32 and got.shape == (2, 12, *ids.shape[1:])
    assert np.array_equal(got, np.moveaxis(want, -1, -3).astype(np.float32))
    assert np.array_equal(cf.decode(got, 255), ids)
    assert cf.lead_shape(got.shape) == ids.shape and OneHot(12).lead_shape(want.shape) == ids.shape


def test_malformed_one_hot_and_bad_arguments_are_errors() -> None:
    hot = OneHot(4).encode(np.array([[0, 1], [2, 3]], np.uint8))
    multi = hot.copy()
    multi[0, 0, 2] = 1
    with pytest.raises(ShardFormatError, match="more than one"):
        OneHot(4).decode(multi, 255)
    empty = np.zeros_like(hot)
    with pytest.raises(ShardFormatError, match="no ignore index"):
        OneHot(4).decode(empty, None)
    assert (OneHot(4).decode(empty, 9) == 9).all()
    with pytest.raises(ShardFormatError, match="channels"):
        OneHot(5).decode(hot, 255)
    with pytest.raises(ConfigError, match="rle"):
        encoding.stored("rle", 3, np.uint8)
    with pytest.raises(LabelError):
        OneHot(3).encode(np.zeros(4, np.uint8))
    with pytest.raises(ConfigError, match="output buffer"):
        OneHot(3).encode(np.zeros((2, 2), np.uint8), out=np.zeros((2, 2, 4), np.uint8))


def test_id_dtype_rule() -> None:
    assert encoding.id_dtype(12, 255) == np.uint8
    assert encoding.id_dtype(256, None) == np.uint8
    assert encoding.id_dtype(257, None) == np.dtype("<u2")
    assert encoding.id_dtype(12, 256) == np.dtype("<u2")


@pytest.mark.parametrize("name", encoding.NAMES)
def test_sample_spec_facts_come_from_the_encoding(name: str) -> None:
    spec = SampleSpec((4, 5), name, 12, "|u1")
    channels = {"index": None, "onehot": 12, "packed": 2}[name]
    assert spec.label_channels == channels
    assert spec.label_shape((4, 5)) == ((4, 5) if channels is None else (4, 5, channels))
    assert spec.stored_label_dtype == np.uint8
    lab = spec.to_manifest()["label"]
    assert lab["bitorder"] == ("big" if name == "packed" else None)
    assert lab["shape"] == [4, 5] + ([] if channels is None else [channels])
    assert SampleSpec((4, 5), "index", 300, "<u2").stored_label_dtype == np.dtype("<u2")


@pytest.mark.parametrize("stored_as", encoding.NAMES)
@pytest.mark.parametrize("labels", encoding.READER_OUTPUTS)
@pytest.mark.parametrize("channels_first", [False, True])
def test_transcoding_equals_decoding_then_encoding(stored_as: str, labels: str, channels_first: bool) -> None:
    ids = _every_id(12, 255)
    src = encoding.stored(stored_as, 12, ids.dtype)
    dst = encoding.reader_output(labels, src, ids.dtype, channels_first=channels_first)
    if labels == "stored" or (labels == "ids" and stored_as == "index"):
        assert dst is src  # read as stored, no conversion
    stored = src.encode(ids)
    out = np.empty(dst.batch_shape(ids.shape), dst.dtype)
    encoding.transcode_into(src, dst, stored, out, 255)
    want = stored if labels == "stored" else dst.encode(ids)
    assert out.dtype == want.dtype and np.array_equal(out, want)
    with pytest.raises(ConfigError):
        encoding.reader_output("logits", src, ids.dtype)


def test_by_name_helpers_keep_their_old_import_path() -> None:
    from shardkit.images.preprocess import decode_label_encoding, encode_label, stored_label_shape

    ids = _every_id(12, 255)
    assert stored_label_shape((3, 4), "packed", 12) == (3, 4, 2)
    assert np.array_equal(decode_label_encoding(encode_label(ids, "packed", 12), "packed", 12, 255), ids)
    assert encode_label(ids, "index", 12) is ids  # no copy
    assert Index(12, np.uint8) == encoding.stored("index", 12, np.uint8) != OneHot(12)
