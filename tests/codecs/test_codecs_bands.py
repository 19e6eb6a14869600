"""``jpeg`` for uint8 images of 2 and 4 bands (shardkit/codecs/registry.py ``Jpeg``, formats/codecs.md "band frame"), on
real CamVid made multi-band (4: R, G, B, gray; 2: R, gray): every band within JPEG loss of its source and equal,
bit for bit, to decoding its stream alone; labels exact; gray and RGB still one plain JPEG file, as before; every
damaged frame refused in one line before a decoder sees it, without allocating what it claims."""

from __future__ import annotations

import json
import shutil
import struct
import tracemalloc
from pathlib import Path

import cv2
import lmdb
import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.codecs.registry import CodecDataError, Jpeg
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import ShardFormatError
from tests.camvid_bands import band_stack, camvid_bands
from tests.codecs.test_codecs import patched_record

N = 8  # CamVid val pairs per split: three shards of up to 3
BANDS = (4, 2)
FORMATS = ("lmdb", "tfrecord")
#: The lowest PSNR (dB) of a band over the 8 images at quality 95, measured: 38.32 in the RGB stream (blue: 4:2:0
#: chroma), 44.64 in a gray stream (all 26 val images: 37.63 and 44.17). Bounds a little below what was measured.
MIN_PSNR = {"rgb": 38.0, "gray": 44.0}


@pytest.fixture(scope="module")
def sources(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("bands-in")
    return {b: (root / f"in{b}", camvid_bands(camvid_root, root / f"in{b}", b, N)) for b in BANDS}


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Path]:
    root = tmp_path_factory.mktemp("bands-out")
    out = {}
    for fmt in FORMATS:
        for b in BANDS:
            target = root / f"{fmt}-{b}"
            convert(ConvertConfig(sources[b][0], target, format=fmt, image_codec="jpeg:95", splits=("val",),
                                  workers=1, quiet=True, shard_size=ShardSize(samples=3)))
            out[fmt, b] = target / "val"
    return out


def frame_streams(payload: bytes) -> list[bytes]:
    """The JPEG streams of a band frame, split as formats/codecs.md says (written from the text, not shardkit)."""
    assert payload[:4] == b"SKJP"
    (count,) = struct.unpack_from("<I", payload, 4)
    lengths = struct.unpack_from(f"<{count}I", payload, 8)
    start, streams = 8 + 4 * count, []
    for length in lengths:
        streams.append(payload[start : start + length])
        start += length
    assert start == len(payload)
    return streams


def decode_alone(stream: bytes) -> np.ndarray:
    """One stream by OpenCV alone: (H, W, 3) RGB or (H, W, 1) gray."""
    got = cv2.imdecode(np.frombuffer(stream, np.uint8), cv2.IMREAD_UNCHANGED)
    return got[:, :, None] if got.ndim == 2 else cv2.cvtColor(got, cv2.COLOR_BGR2RGB)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def png_ids(camvid_root: Path, stem: str) -> np.ndarray:
    return cv2.imread(str(camvid_root / "valannot" / f"{stem}.png"), cv2.IMREAD_UNCHANGED)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bands", BANDS)
def test_bands_round_trip_within_jpeg_loss_and_equal_to_each_stream(converted, sources, camvid_root: Path, fmt: str,
                                                                     bands: int, validate_manifest) -> None:
    folder = converted[fmt, bands]
    m = validate_manifest(folder)
    assert m["format_version"] == 3 and m["sample"]["image"]["shape"][2] == bands
    assert m["sample"]["image"]["dtype"] == "|u1" and m["format_options"]["codecs"]["image"] == {
        "name": "jpeg", "quality": 95}
    ds = shardkit.open(folder, labels="stored", verify=True)
    images, labels = ds.batch(np.random.default_rng(0).permutation(len(ds)))  # on the thread pool, across shards
    order = np.random.default_rng(0).permutation(len(ds))
    src = sources[bands][1]
    assert images.shape == (N, 360, 480, bands) and images.dtype == np.uint8
    kinds = ["rgb"] * 3 + ["gray"] if bands == 4 else ["gray", "gray"]
    for image, label, i in zip(images, labels, order, strict=True):
        stem = Path(ds.key(int(i))).stem
        want = src[stem]
        for k, kind in enumerate(kinds):
            assert psnr(image[..., k], want[..., k]) >= MIN_PSNR[kind], (stem, k)
        assert not np.array_equal(image, want)  # lossy indeed
        alone = np.concatenate([decode_alone(s) for s in frame_streams(Jpeg(95).encode(want))], axis=-1)
        assert np.array_equal(image, alone)  # each band is its stream's own decode, bit for bit
        assert np.array_equal(label.reshape(360, 480), png_ids(camvid_root, stem))  # labels never lossy
        assert np.array_equal(ds[int(i)][0], image)
    res = CliRunner().invoke(main, ["verify", str(folder)])
    assert res.exit_code == 0, res.output


def test_lmdb_stores_exactly_the_band_frame(converted, sources) -> None:
    """The record's image bytes are the frame of the streams OpenCV writes for the RGB and gray parts."""
    from shardkit.formats.lmdb import RECORD_HEADER

    folder = converted["lmdb", 4]
    ds = shardkit.open(folder)
    m = json.loads((folder / "manifest.json").read_text())
    env = lmdb.open(str(folder / m["shards"][0]["files"][0]["name"]), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        value = txn.get(b"00000000")
    env.close()
    h, w, ni, _nl = (int(v) for v in np.frombuffer(value, RECORD_HEADER, count=1)[0])
    payload = value[16 : 16 + ni]
    want = sources[4][1][Path(ds.key(0)).stem]
    quality = [cv2.IMWRITE_JPEG_QUALITY, 95]
    rgb = bytes(cv2.imencode(".jpg", np.ascontiguousarray(want[..., 2::-1]), quality)[1])
    gray = bytes(cv2.imencode(".jpg", np.ascontiguousarray(want[..., 3]), quality)[1])
    assert (h, w) == (360, 480) and frame_streams(payload) == [rgb, gray]
    assert payload == b"SKJP" + struct.pack("<3I", 2, len(rgb), len(gray)) + rgb + gray


def test_gray_and_rgb_stay_one_plain_jpeg_file(camvid_root: Path) -> None:
    """1 and 3 bands: byte for byte the single JFIF file of OpenCV's encoder, as before the band frame."""
    rgb = cv2.imread(str(sorted((camvid_root / "val").glob("*.png"))[0]), cv2.IMREAD_COLOR)[:, :, ::-1]
    for q in (95, 60):
        for image, bgr in ((rgb, rgb[..., ::-1]), (band_stack(rgb, 1), band_stack(rgb, 1))):
            data = Jpeg(q).encode(image)
            assert data == bytes(cv2.imencode(".jpg", np.ascontiguousarray(bgr), [cv2.IMWRITE_JPEG_QUALITY, q])[1])
            assert data[:2] == b"\xff\xd8"
            out = np.empty_like(image)
            Jpeg(q).decode_into(data, out)
            assert np.array_equal(out, decode_alone(data))


def test_codec_takes_uint8_of_one_to_four_bands_only() -> None:
    jpeg = Jpeg(90)
    assert all(jpeg.cannot_store(np.uint8, c) is None for c in (1, 2, 3, 4))
    for dtype, c in ((np.uint8, 5), (np.uint8, 8), (np.uint16, 4), (np.float32, 3)):
        why = jpeg.cannot_store(dtype, c)
        assert why is not None and "\n" not in why and "1, 2, 3, 4" in why


# --------------------------------------------------------------------------- damaged frames

SMALL = (48, 64)


def small_image(camvid_root: Path, bands: int) -> np.ndarray:
    rgb = cv2.imread(str(sorted((camvid_root / "val").glob("*.png"))[1]), cv2.IMREAD_COLOR)[:, :, ::-1]
    return band_stack(cv2.resize(rgb, SMALL[::-1], interpolation=cv2.INTER_AREA), bands)


def reframe(streams: list[bytes], count: int | None = None, lengths: list[int] | None = None,
            magic: bytes = b"SKJP") -> bytes:
    lens = lengths if lengths is not None else [len(s) for s in streams]
    n = len(lens)
    return magic + struct.pack(f"<{1 + n}I", n if count is None else count, *lens) + b"".join(streams)


def damaged(camvid_root: Path) -> dict[str, tuple[bytes, str]]:
    """Each way a 4-band frame can be wrong → (payload, what the one-line error says)."""
    image = small_image(camvid_root, 4)
    rgb, gray = frame_streams(Jpeg(95).encode(image))
    good = reframe([rgb, gray])
    other_size = bytes(cv2.imencode(".jpg", np.zeros((32, 64, 3), np.uint8))[1])
    two_band = Jpeg(95).encode(small_image(camvid_root, 2))
    huge = 0xFFFFFFFF
    return {
        "truncated": (good[:-100], "do not fill"),
        "header-only": (good[:10], "shorter than"),
        "wrong-magic": (b"SKJQ" + good[4:], "not a band frame"),
        "plain-jpeg": (rgb, "not a band frame"),
        "count-3": (reframe([rgb, gray], count=3), "has 3 streams"),
        "count-huge": (reframe([rgb, gray], count=huge), f"has {huge} streams"),
        "length-overflow": (reframe([rgb, gray], lengths=[huge, len(gray)]), "do not fill"),
        "lengths-overflow-sum": (reframe([rgb, gray], lengths=[huge, len(rgb) + len(gray) - huge + (1 << 32)]),
                                 "do not fill"),
        "length-zero": (reframe([rgb, gray], lengths=[0, len(rgb) + len(gray)]), "do not fill"),
        "lengths-longer": (reframe([rgb, gray], lengths=[len(rgb) + 1, len(gray)]), "do not fill"),
        "boundary-shifted": (reframe([rgb, gray], lengths=[len(rgb) - 5, len(gray) + 5]), "stream 1 data does not end"),
        "stream-other-size": (reframe([other_size, gray]), "stream 1 header says jpeg 32x64x3"),
        "streams-swapped": (reframe([gray, rgb]), "stream 1 header says jpeg 48x64x1, expected jpeg 48x64x3"),
        "two-band-frame": (two_band, "stream 1 header says jpeg 48x64x1"),
        "stream-garbage": (reframe([b"\xff\xd8" + b"\x00" * 40, gray]), "stream 1 header says ?"),
    }


@pytest.mark.parametrize("what", ["truncated", "header-only", "wrong-magic", "plain-jpeg", "count-3", "count-huge",
                                  "length-overflow", "lengths-overflow-sum", "length-zero", "lengths-longer",
                                  "boundary-shifted", "stream-other-size", "streams-swapped", "two-band-frame",
                                  "stream-garbage"])
def test_damaged_band_frames_are_refused_in_one_line_before_decoding(camvid_root: Path, what: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    payload, says = damaged(camvid_root)[what]
    decoded = []
    real = cv2.imdecode
    monkeypatch.setattr(cv2, "imdecode", lambda *a: decoded.append(1) or real(*a))
    tracemalloc.start()
    try:
        with pytest.raises(CodecDataError) as info:
            Jpeg(95).decode_into(payload, np.empty((*SMALL, 4), np.uint8))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert says in message and "\n" not in message, message
    assert not decoded, "a decoder saw a frame that fails its checks"
    assert peak < 1 << 20, f"refusing a damaged frame allocated {peak} bytes"


def test_a_damaged_record_fails_verify_in_one_line(converted, tmp_path: Path) -> None:
    folder = tmp_path / "split"
    shutil.copytree(converted["lmdb", 4], folder)
    image = Jpeg(95).encode(band_stack(np.zeros((360, 480, 3), np.uint8), 4))
    rgb, gray = frame_streams(image)
    patched_record(folder, reframe([rgb, gray], count=3), np.zeros((360, 480), np.uint8).tobytes(), (360, 480))
    res = CliRunner().invoke(main, ["verify", str(folder)])
    assert res.exit_code != 0 and "Traceback" not in res.output
    problem = [line for line in res.output.splitlines() if "sample 0 image" in line]
    assert len(problem) == 1 and "jpeg band frame has 3 streams, 4 bands need 2" in problem[0], res.output
    with pytest.raises(ShardFormatError, match="sample 0 image: jpeg band frame has 3 streams"):
        shardkit.open(folder)[0]
    assert shardkit.open(folder)[1][0].shape == (360, 480, 4)  # the rest of the shard still reads


@pytest.mark.parametrize(("field", "value", "says"), [("dtype", "<u2", "not uint16 with 4"),
                                                      ("shape", [360, 480, 5], "not uint8 with 5")])
def test_a_manifest_whose_jpeg_cannot_hold_its_images_is_refused_on_open(converted, tmp_path: Path, field: str,
                                                                         value: object, says: str) -> None:
    folder = tmp_path / "split"
    shutil.copytree(converted["lmdb", 4], folder)
    m = json.loads((folder / "manifest.json").read_text())
    m["sample"]["image"][field] = value
    if field == "shape":  # one statistic per band, so that only the codec is what does not fit
        m["stats"].update({k: [*v, v[-1]] for k, v in m["stats"].items() if k.startswith("image_")})
    (folder / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ShardFormatError, match=r"codecs\.image does not fit") as info:
        shardkit.open(folder)
    assert says in str(info.value)
