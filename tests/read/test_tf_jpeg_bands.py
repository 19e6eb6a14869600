"""tf.data decodes ``jpeg`` TFRecord images in-graph for 1..4 bands (shardkit/read/tf.py): a 2- or 4-band band frame
split and checked in-graph, each stream through ``tf.io.decode_jpeg`` with libjpeg's accurate IDCT, so every band
equals the numpy (OpenCV) path bit for bit, as gray and RGB now do too; TensorFlow alone reads the frame from
formats/codecs.md; a damaged frame fails with TensorFlow's error naming what is wrong, never a wrong image."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit.codecs.registry import Jpeg
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from tests.camvid_bands import camvid_bands
from tests.codecs.test_codecs_bands import SMALL, damaged, frame_streams, small_image

N = 5


@pytest.fixture(scope="module")
def splits(tf, camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("tf-jpeg-bands")
    out = {}
    for bands in (1, 2, 3, 4):
        images = camvid_bands(camvid_root, root / f"in{bands}", bands, N)
        convert(ConvertConfig(root / f"in{bands}", root / f"out{bands}", format="tfrecord", image_codec="jpeg:95",
                              splits=("val",), workers=1, quiet=True, shard_size=ShardSize(samples=2)))
        out[bands] = (root / f"out{bands}" / "val", images)
    return out


@pytest.mark.parametrize("bands", [1, 2, 3, 4])
def test_in_graph_bands_equal_the_numpy_path(tf, splits, bands: int) -> None:
    from shardkit.read import tf as stf

    folder, _ = splits[bands]
    core = shardkit.open(folder, labels="stored")
    want_images, want_labels = core.batch(np.arange(len(core)))
    got = [(i.numpy(), lab.numpy()) for i, lab in stf.dataset(folder, shardkit.EpochPlan(2, shuffle=False),
                                                             options=shardkit.OpenOptions(labels="stored"))]
    images = np.concatenate([g[0] for g in got])
    assert images.dtype == np.uint8 and images.shape == (N, 360, 480, bands)
    assert np.array_equal(images, want_images)  # the accurate IDCT: OpenCV's decode, bit for bit
    assert np.array_equal(np.concatenate([g[1] for g in got]), want_labels)


def test_tensorflow_alone_reads_a_band_frame_as_the_spec_says(tf, splits) -> None:
    """formats/codecs.md read with TensorFlow only: the record's image/encoded split as the text says, each stream
    decoded by decode_jpeg, the bands concatenated: the stored image (and the encoder's exact frame)."""
    folder, images = splits[4]
    core = shardkit.open(folder, labels="stored")
    files = sorted(str(p) for p in folder.glob("*.tfrecord"))
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string), "key": tf.io.FixedLenFeature([], tf.string)}
    keys = [core.key(i) for i in range(len(core))]
    seen = 0
    for record in tf.data.TFRecordDataset(files):
        f = tf.io.parse_single_example(record, spec)
        payload, key = f["image/encoded"].numpy(), f["key"].numpy().decode()
        streams = frame_streams(payload)
        bands = [tf.io.decode_jpeg(s, channels=c, dct_method="INTEGER_ACCURATE").numpy()
                 for s, c in zip(streams, (3, 1), strict=True)]
        image = np.concatenate(bands, axis=-1)
        assert payload == Jpeg(95).encode(images[Path(key).stem])
        assert np.array_equal(image, core[keys.index(key)][0])
        seen += 1
    assert seen == N


@pytest.mark.parametrize("what", ["truncated", "header-only", "wrong-magic", "plain-jpeg", "count-3", "count-huge",
                                  "length-overflow", "lengths-overflow-sum", "length-zero", "lengths-longer",
                                  "boundary-shifted", "stream-other-size", "streams-swapped", "two-band-frame",
                                  "stream-garbage"])
def test_damaged_frames_fail_in_graph(tf, camvid_root: Path, what: str) -> None:
    from shardkit.read.tf import _image_decoder

    payload, _ = damaged(camvid_root)[what]
    decode = tf.function(_image_decoder("jpeg", SMALL, 4))
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        decode(tf.constant([payload]))
    frame_level = {"truncated": "do not fill", "header-only": "shorter than its header", "wrong-magic": "not a band",
                   "plain-jpeg": "not a band", "count-3": "need 2 streams", "count-huge": "need 2 streams",
                   "length-overflow": "do not fill", "lengths-overflow-sum": "do not fill",
                   "length-zero": "do not fill", "lengths-longer": "do not fill",
                   "stream-other-size": "stream 1: header says", "streams-swapped": "stream 1: header says",
                   "two-band-frame": "stream 1: header says",
                   "boundary-shifted": "stream 1: does not end with the JPEG end-of-image marker"}
    if what in frame_level:  # the rest fail in extract_jpeg_shape on a stream that is no JPEG: TensorFlow's words
        assert frame_level[what] in str(info.value.message), info.value.message
    good = Jpeg(95).encode(small_image(camvid_root, 4))
    assert np.array_equal(decode(tf.constant([good])).numpy()[0], _numpy_decode(good))


def _numpy_decode(payload: bytes) -> np.ndarray:
    out = np.empty((*SMALL, 4), np.uint8)
    Jpeg(95).decode_into(payload, out)
    return out


def test_a_gray_jpeg_where_rgb_is_stored_fails_in_graph(tf, camvid_root: Path) -> None:
    """As the numpy path refuses it: decode_jpeg(channels=3) alone would give three equal bands."""
    from shardkit.read.tf import _image_decoder

    gray = Jpeg(95).encode(small_image(camvid_root, 1))
    decode = tf.function(_image_decoder("jpeg", SMALL, 3))
    with pytest.raises(tf.errors.InvalidArgumentError, match="jpeg image: header says"):
        decode(tf.constant([gray]))
    rgb = Jpeg(95).encode(small_image(camvid_root, 3))
    out = np.empty((*SMALL, 3), np.uint8)
    Jpeg(95).decode_into(rgb, out)
    assert np.array_equal(decode(tf.constant([rgb])).numpy()[0], out)


def test_a_truncated_jpeg_fails_in_graph_as_truncated(tf, camvid_root: Path) -> None:
    """A cut-off RGB JPEG file is refused by its missing end-of-image marker, as the numpy path refuses it."""
    from shardkit.read.tf import _image_decoder

    rgb = Jpeg(95).encode(small_image(camvid_root, 3))
    decode = tf.function(_image_decoder("jpeg", SMALL, 3))
    with pytest.raises(tf.errors.InvalidArgumentError, match="jpeg image: does not end with the JPEG end-of-image"):
        decode(tf.constant([rgb[:-1]]))
