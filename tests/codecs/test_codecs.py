"""Per-array codecs (shardkit/codecs/registry.py, formats/codecs.md) on real CamVid: labels bit-exact through every
codec
and format, images exact through every lossless one, plain-library reads (h5py + hdf5plugin; TensorFlow alone),
one-line usage errors for combinations a format does not take, and hostile frames that claim huge sizes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import lmdb
import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.codecs.registry import ArrayCodecs, CodecDataError, Jpeg, Lz4, Png, Raw, Zstd, parse_codec
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import ConfigError, ShardFormatError
from shardkit.formats.registry import all_formats, get, names

SIZE = (360, 480)
#: (format, image codec, label codec): every codec each format takes, each at least once
COMBOS = [
    ("lmdb", "zstd", "zstd"), ("lmdb", "lz4", "lz4"), ("lmdb", "png", "zstd"), ("lmdb", "jpeg:90", "lz4"),
    ("hdf5", "zstd", "lz4"), ("hdf5", "lz4", "zstd"), ("tfrecord", "png", "raw"), ("tfrecord", "jpeg:90", "raw"),
]


def combo_id(combo: tuple[str, str, str]) -> str:
    return "-".join(combo).replace(":", "")


@pytest.fixture(scope="module")
def reference(camvid_val_npy: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """CamVid val at 360x480 as raw npy: (images, labels, keys) every codec must give back."""
    ds = shardkit.open(camvid_val_npy, labels="stored")
    images, labels = ds.batch(np.arange(len(ds)))
    return images, labels, [ds.key(i) for i in range(len(ds))]


@pytest.fixture(scope="module")
def coded(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("codecs")
    folders = {}
    for combo in COMBOS:
        fmt, image, label = combo
        target = out / combo_id(combo)
        convert(ConvertConfig(camvid_root, target, format=fmt, size=SIZE, splits=("val",), workers=2, quiet=True,
                              shard_size=ShardSize(samples=13), image_codec=image, label_codec=label))
        folders[combo_id(combo)] = target / "val"
    return folders


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_round_trip_labels_bit_exact(coded: dict[str, Path], reference, combo, validate_manifest) -> None:
    _fmt, image_codec, label_codec = combo
    want_images, want_labels, keys = reference
    folder = coded[combo_id(combo)]
    m = validate_manifest(folder)
    assert m["format_version"] == 2
    assert m["format_options"]["codecs"]["image"]["name"] == image_codec.split(":")[0]
    assert m["format_options"]["codecs"]["label"]["name"] == label_codec
    ds = shardkit.open(folder, labels="stored", verify=True)
    assert [ds.key(i) for i in range(len(ds))] == keys
    order = np.random.default_rng(0).permutation(len(ds))  # shuffled: runs across both shards
    images, labels = ds.batch(order)  # decoded on the thread pool into the batch arrays
    assert labels.dtype == want_labels.dtype and np.array_equal(labels, want_labels[order])
    single_image, single_label = ds[5]
    assert np.array_equal(single_label, want_labels[5])
    if image_codec.startswith("jpeg"):
        diff = np.abs(images.astype(np.int16) - want_images[order])
        assert diff.mean() < 3 and not np.array_equal(images, want_images[order])  # lossy, but close
    else:
        assert np.array_equal(images, want_images[order]) and np.array_equal(single_image, want_images[5])
    ids = shardkit.open(folder)  # labels="ids": every adapter reads through these batches
    for batch_images, batch_ids in ids.iter_batches(8, shuffle=True, seed=1):
        assert batch_ids.dtype == want_labels.dtype and batch_images.shape[1:] == (*SIZE, 3)
    res = CliRunner().invoke(main, ["verify", str(folder)])
    assert res.exit_code == 0, res.output


def test_onehot_labels_round_trip_through_zstd(camvid_root: Path, tmp_path: Path, reference) -> None:
    convert(ConvertConfig(camvid_root, tmp_path, format="lmdb", size=SIZE, splits=("val",), workers=1, quiet=True,
                          label_encoding="packed", label_codec="zstd", image_codec="lz4"))
    ds = shardkit.open(tmp_path / "val")  # packed one-hot stored, decoded to ids
    assert np.array_equal(ds.batch(np.arange(len(ds)))[1], reference[1])


def test_thread_count_does_not_change_results(coded: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    folder = coded["lmdb-zstd-zstd"]
    got = []
    for threads in ("1", "3"):
        monkeypatch.setenv("SHARDKIT_DECODE_THREADS", threads)
        got.append(shardkit.open(folder).batch([25, 0, 13, 12, 3]))
    assert all(np.array_equal(a, b) for a, b in zip(got[0], got[1], strict=True))


def test_codec_units_round_trip(reference) -> None:
    images, labels, _ = reference
    wide = (labels.astype(np.uint16) * 300)[:2]  # a <u2 label
    for codec in (Raw(), Zstd(), Zstd(level=19), Lz4()):
        for arr in (images[0], labels[0], wide[1]):
            out = np.empty_like(arr)
            codec.decode_into(codec.encode(arr), out)
            assert np.array_equal(out, arr), codec
    out = np.empty_like(images[0])
    Png().decode_into(Png().encode(images[0]), out)
    assert np.array_equal(out, images[0])
    Jpeg(95).decode_into(Jpeg(95).encode(images[0]), out)
    assert np.abs(out.astype(np.int16) - images[0]).mean() < 2
    assert Zstd(level=9).to_json() == {"name": "zstd", "level": 9} and str(Jpeg(80)) == "jpeg:80"


def test_parse_codec_refuses_lossy_labels_and_unknown_names() -> None:
    assert parse_codec("zstd:9", "image") == Zstd(9) and parse_codec("JPEG:90", "image") == Jpeg(90)
    for text, kind, message in [("jpeg:90", "label", "losslessly"), ("png", "label", "labels"),
                                ("bzip2", "image", "not a codec"), ("jpeg:0", "image", "1..100"),
                                ("lz4:3", "image", "takes no"), ("zstd:99", "label", "1..22")]:
        with pytest.raises(ConfigError, match=message):
            parse_codec(text, kind)


# --------------------------------------------------------------------------- readers without shardkit


def run_alone(code: str, *args: object) -> str:
    """Run ``code`` in a fresh interpreter that must not import shardkit."""
    guard = "import sys\nsys.modules['shardkit'] = None  # any import of shardkit fails\n"
    res = subprocess.run([sys.executable, "-c", guard + textwrap.dedent(code), *map(str, args)],
                         capture_output=True, text=True, timeout=240, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_h5py_and_hdf5plugin_alone_read_a_compressed_shard(coded: dict[str, Path], reference,
                                                           tmp_path: Path) -> None:
    np.savez(tmp_path / "want.npz", images=reference[0], labels=reference[1])
    out = run_alone("""
        import json, sys, h5py, hdf5plugin, numpy as np
        from pathlib import Path
        folder, want = Path(sys.argv[1]), np.load(sys.argv[2])
        m = json.loads((folder / "manifest.json").read_text())
        got_images, got_labels = [], []
        for shard in m["shards"]:
            with h5py.File(folder / shard["files"][0]["name"], "r") as f:
                filters = {f["images"].id.get_create_plist().get_filter(0)[0],
                           f["labels"].id.get_create_plist().get_filter(0)[0]}
                got_images.append(f["images"][()]); got_labels.append(f["labels"][()])
        assert filters == {32015, 32004}, filters  # hdf5plugin's registered Zstd and LZ4 filters
        assert np.array_equal(np.concatenate(got_images), want["images"])
        assert np.array_equal(np.concatenate(got_labels), want["labels"])
        print("ok", len(np.concatenate(got_labels)))
    """, coded["hdf5-zstd-lz4"], tmp_path / "want.npz")
    assert out.split() == ["ok", str(len(reference[1]))]


def test_tensorflow_alone_reads_a_png_tfrecord_shard(coded: dict[str, Path], reference, tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorflow") is None:  # looked up, not imported: only the child needs it
        pytest.skip("tensorflow is not installed")
    np.savez(tmp_path / "want.npz", images=reference[0], labels=reference[1], keys=np.array(reference[2]))
    out = run_alone("""
        import json, sys, numpy as np, tensorflow as tf
        from pathlib import Path
        folder, want = Path(sys.argv[1]), np.load(sys.argv[2])
        m = json.loads((folder / "manifest.json").read_text())
        assert m["format"] == "tfrecord" and m["format_version"] == 2
        feats = m["format_options"]["features"]
        spec = {k: tf.io.FixedLenFeature(v["shape"], {"bytes": tf.string, "int64": tf.int64}[v["type"]])
                for k, v in feats.items()}
        assert feats["image/encoded"]["decode"]["codec"] == "png"
        files = [str(folder / s["files"][0]["name"]) for s in m["shards"]]
        def decode(record):
            f = tf.io.parse_single_example(record, spec)
            image = tf.io.decode_png(f["image/encoded"], channels=3)
            label = tf.io.decode_raw(f["label/raw"], tf.uint8)
            return image, tf.reshape(label, [f["image/height"], f["image/width"]]), f["key"]
        keys = list(want["keys"])
        n = 0
        for image, label, key in tf.data.TFRecordDataset(files).map(decode):
            i = keys.index(key.numpy().decode())
            assert np.array_equal(image.numpy(), want["images"][i]) and np.array_equal(label.numpy(), want["labels"][i])
            n += 1
        print("ok", n)
    """, coded["tfrecord-png-raw"], tmp_path / "want.npz")
    assert out.split()[-2:] == ["ok", str(len(reference[1]))]


# --------------------------------------------------------------------------- usage errors


@pytest.mark.parametrize(("args", "message"), [
    (["--format", "npy", "--image-codec", "zstd"], "--image-codec zstd is not supported by --format npy"),
    (["--format", "lmdb", "--label-codec", "jpeg:90"], "labels are always stored losslessly"),
    (["--format", "tfrecord", "--label-codec", "zstd"], "--label-codec zstd is not supported by --format tfrecord"),
    (["--format", "hdf5", "--image-codec", "png"], "--image-codec png is not supported by --format hdf5"),
    (["--format", "hdf5", "--compression", "gzip", "--label-codec", "zstd"], "both given"),
    (["--format", "lmdb", "--compression", "gzip"], "--compression gzip is not supported by --format lmdb"),
    (["--format", "lmdb", "--image-codec", "webp"], "is not a codec"),
])
def test_bad_codec_combinations_exit_2_with_one_line(camvid_root: Path, tmp_path: Path, args: list[str],
                                                     message: str) -> None:
    res = CliRunner().invoke(main, ["convert", str(camvid_root), str(tmp_path / "out"), "--split", "val", *args])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0] and "fix:" in errors[0], res.output
    assert "Traceback" not in res.output and not (tmp_path / "out").exists()


def test_missing_codec_package_names_the_extra(camvid_root: Path, tmp_path: Path,
                                               coded: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard now fails
    with pytest.raises(ConfigError, match=r'pip install "zstandard>=.*\[codecs\] extra'):
        ConvertConfig(camvid_root, tmp_path, format="lmdb", image_codec="zstd")
    with pytest.raises(ShardFormatError, match=r'pip install "zstandard>=.*\[codecs\] extra'):
        shardkit.open(coded["lmdb-zstd-zstd"])
    ConvertConfig(camvid_root, tmp_path, format="lmdb", image_codec="lz4")  # other codecs unaffected


# --------------------------------------------------------------------------- the registry (formats' own facts)


def test_each_format_states_its_facts_and_the_cli_derives_from_them() -> None:
    assert names()[0] == "npy" and set(names()) == {"npy", "lmdb", "hdf5", "tfrecord"}
    from shardkit.formats.base import SampleSpec

    spec = SampleSpec((4, 6), "index", 5, "|u1")
    for fmt in all_formats():
        assert get(fmt.name) is fmt and fmt.versions[0] == 1
        assert fmt.image_codecs[0] == fmt.label_codecs[0] == "raw" and fmt.compressions[0] == "none"
        files = fmt.file_names("00000-0123456789ab", spec)
        assert files and all(fmt.owns(f) for f in files)
        assert not any(other.owns(f) for other in all_formats() if other is not fmt for f in files
                       if other.file_patterns != fmt.file_patterns)
        assert fmt.version_for("none", ArrayCodecs.parse()) == 1
    assert not get("tfrecord").random_access and get("lmdb").random_access
    params = {p.name: p for p in main.commands["convert"].params}
    assert list(params["format"].type.choices) == list(names())
    assert set(params["compression"].type.choices) == {c for f in all_formats() for c in f.compressions}
    help_text = " ".join(CliRunner().invoke(main, ["convert", "--help"]).output.split())
    assert "tfrecord: png, jpeg" in help_text and "lmdb: zstd, lz4, png, jpeg" in help_text


# --------------------------------------------------------------------------- hostile frames


def patched_record(folder: Path, image: bytes, label: bytes, hw: tuple[int, int] = SIZE) -> Path:
    """Replace sample 0 of the first LMDB shard with (image, label) encoded bytes; fix size and sha256."""
    from shardkit.formats.lmdb import RECORD_HEADER

    m = json.loads((folder / "manifest.json").read_text())
    entry = m["shards"][0]["files"][0]
    path = folder / entry["name"]
    env = lmdb.open(str(path), subdir=False, lock=False, map_size=1 << 30)
    with env.begin(write=True) as txn:
        header = np.array([(*hw, len(image), len(label))], RECORD_HEADER).tobytes()
        txn.put(b"00000000", header + image + label)
    env.close()
    data = path.read_bytes()
    entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(m))
    return path


def zstd_frame_claiming(size: int) -> bytes:
    """A zstd frame whose header says ``size`` decompressed bytes (8-byte field) and holds one empty raw block."""
    return b"\x28\xb5\x2f\xfd" + bytes([0xC0, 0x58]) + size.to_bytes(8, "little") + b"\x01\x00\x00"


@pytest.mark.parametrize("what", ["zstd-huge", "lz4-huge", "png-huge", "zstd-garbage"])
def test_frames_claiming_huge_sizes_are_refused_without_allocating(coded: dict[str, Path], tmp_path: Path,
                                                                   what: str) -> None:
    import shutil

    import lz4.frame
    import zstandard

    split, label_codec = {"zstd-huge": ("lmdb-zstd-zstd", Zstd()), "lz4-huge": ("lmdb-lz4-lz4", Lz4()),
                          "png-huge": ("lmdb-png-zstd", Zstd()), "zstd-garbage": ("lmdb-zstd-zstd", Zstd())}[what]
    source = coded[split]
    folder = tmp_path / "split"
    shutil.copytree(source, folder)
    label = label_codec.encode(np.zeros(SIZE, np.uint8))
    huge = 1 << 40
    if what == "zstd-huge":
        image = zstd_frame_claiming(huge)
        assert zstandard.frame_content_size(image) == huge
    elif what == "lz4-huge":  # content size field patched (its header checksum then fails too: refused either way)
        image = bytearray(lz4.frame.compress(b"\0" * 16, store_size=True))
        image[6:14] = huge.to_bytes(8, "little")
        image = bytes(image)
    elif what == "png-huge":
        image = bytearray(Png().encode(np.zeros((8, 8, 3), np.uint8)))
        image[16:24] = (60000).to_bytes(4, "big") * 2  # IHDR width, height
        image = bytes(image)
    else:
        image = b"\x28\xb5\x2f\xfd" + b"\xff" * 64
    patched_record(folder, image, label)
    ds = shardkit.open(folder)
    tracemalloc.start()
    try:
        with pytest.raises(ShardFormatError, match="sample 0 image"):
            ds.batch([1, 0])
        with pytest.raises(ShardFormatError, match="sample 0 image"):
            ds[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"reading a hostile frame allocated {peak} bytes"
    assert np.array_equal(ds[1][1], shardkit.open(source)[1][1])  # the rest of the shard still reads


def test_codec_decode_checks_exact_sizes() -> None:
    data = Zstd().encode(np.arange(100, dtype=np.uint8))
    for codec, blob in ((Zstd(), data), (Lz4(), Lz4().encode(np.arange(100, dtype=np.uint8)))):
        with pytest.raises(CodecDataError):
            codec.decode_into(blob, np.empty(99, np.uint8))  # the frame says 100
        with pytest.raises(CodecDataError):
            codec.decode_into(blob + blob, np.empty(100, np.uint8))  # a second frame after the first
        with pytest.raises(CodecDataError):
            codec.decode_into(blob[:-4], np.empty(100, np.uint8))  # truncated


@pytest.mark.parametrize("bands", [1, 3, 4])
def test_a_truncated_jpeg_is_refused_not_filled_with_gray(bands: int) -> None:
    """A cut-off JPEG file (or band frame stream, its lengths made to fit) is refused before decoding, as truncated:
    it does not end with the end-of-image marker (libjpeg alone would only warn and fill the rest with gray)."""
    import struct

    from shardkit.codecs.registry import JPEG_FRAME_MAGIC

    img = np.random.default_rng(1).integers(0, 256, (48, 64, bands), dtype=np.uint8)
    data = Jpeg(90).encode(img)
    out = np.empty_like(img)
    Jpeg(90).decode_into(data, out)
    if bands == 4:  # cut the last stream, the frame's lengths made to fit: only the end marker tells
        head = len(JPEG_FRAME_MAGIC) + 12
        first, second = struct.unpack_from("<2I", data, 8)
        bad = JPEG_FRAME_MAGIC + struct.pack("<3I", 2, first, second - 100) + data[head : len(data) - 100]
    else:
        bad = data[: len(data) // 2]
    with pytest.raises(CodecDataError, match="end-of-image marker"):
        Jpeg(90).decode_into(bad, out)


def test_hdf5_lz4_chunk_framing_is_checked_before_decoding() -> None:
    import struct

    import lz4.block

    from shardkit.formats.hdf5 import decode_h5lz4

    arr = np.arange(3000, dtype=np.uint8)
    blocks = [lz4.block.compress(arr[k : k + 1024].tobytes(), store_size=False) for k in range(0, 3000, 1024)]
    chunk = struct.pack(">qi", 3000, 1024) + b"".join(struct.pack(">i", len(b)) + b for b in blocks)
    out = np.empty(3000, np.uint8)
    decode_h5lz4(chunk, out)
    assert np.array_equal(out, arr)
    huge = struct.pack(">qi", 1 << 40, 1024) + chunk[12:]
    for bad in (huge, chunk[:-5], chunk + b"x", chunk[:10], struct.pack(">qi", 3000, 0) + chunk[12:]):
        with pytest.raises(CodecDataError):
            decode_h5lz4(bad, out)


def test_variable_size_record_claiming_a_bigger_sample_is_refused_before_decoding(tmp_path: Path) -> None:
    """A version 2 record's (H, W) must be the manifest's samples[i] before an output is sized from it."""
    import shutil

    golden = Path(__file__).resolve().parents[2] / "formats" / "golden" / "lmdb-zstd" / "train"
    folder = tmp_path / "train"
    shutil.copytree(golden, folder)
    side = 16384  # 805 MB of pixels, if a reader believed it
    patched_record(folder, zstd_frame_claiming(side * side * 3), zstd_frame_claiming(side * side), hw=(side, side))
    ds = shardkit.open(folder)
    tracemalloc.start()
    try:
        with pytest.raises(ShardFormatError, match=f"sample 0 is {side}x{side}, the manifest says 4x6"):
            ds[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20
    assert ds[1][0].shape == (7, 9, 3)


# --------------------------------------------------------------------------- bombs inside a frame or header
def _xxh32(data: bytes) -> int:
    """xxHash32 (seed 0) of fewer than 16 bytes: the LZ4 frame descriptor's checksum."""
    p1, p2, p3, p4, p5, m = 2654435761, 2246822519, 3266489917, 668265263, 374761393, 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & m

    h, i = (p5 + len(data)) & m, 0
    while i + 4 <= len(data):
        h = rotl((h + int.from_bytes(data[i : i + 4], "little") * p3) & m, 17) * p4 & m
        i += 4
    for b in data[i:]:
        h = rotl((h + b * p5) & m, 11) * p1 & m
    h ^= h >> 15
    h = h * p2 & m
    h ^= h >> 13
    h = h * p3 & m
    return h ^ (h >> 16)


def test_lz4_frame_holding_more_than_its_stated_size_stops_at_the_sample() -> None:
    """An LZ4 frame whose header states the sample's size but whose blocks hold 256 MiB is refused after at most
    one byte more than the sample; before, the decompressor grew its buffer to 605 MB first (tracemalloc)."""
    size = 64 * 96 * 3
    frame = bytearray(__import__("lz4.frame").frame.compress(bytes(256 << 20), store_size=True))
    assert (_xxh32(bytes(frame[4:14])) >> 8) & 0xFF == frame[14]  # the descriptor checksum, recomputed below
    frame[6:14] = size.to_bytes(8, "little")
    frame[14] = (_xxh32(bytes(frame[4:14])) >> 8) & 0xFF
    data, out = bytes(frame), np.empty(size, np.uint8)
    tracemalloc.start()
    try:
        with pytest.raises(CodecDataError):
            Lz4().decode_into(data, out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def _jpeg_with_decoy_frame(camvid_root: Path) -> bytes:
    """A real 360x480 JPEG with a fill byte before a comment segment; where a reader that takes ``FF FF`` for a
    marker with a length would jump to, the comment holds a start-of-frame claiming 48x64."""
    import cv2

    _, encoded = cv2.imencode(".jpg", cv2.imread(str(sorted((camvid_root / "val").glob("*.png"))[0])))
    jpeg = bytes(encoded)
    length = 0xFFF0
    comment = bytearray(b"\xff\xfe" + length.to_bytes(2, "big") + bytes(length - 2))
    at = 4 + 0xFEFF - 3  # FF FF FE FF read as marker FF, length 0xFEFF: 4 + 0xFEFF, inside the comment
    decoy = b"\xff\xc0\x00\x11\x08" + (48).to_bytes(2, "big") + (64).to_bytes(2, "big") + b"\x03" + bytes(9)
    comment[at : at + len(decoy)] = decoy
    return jpeg[:2] + b"\xff" + bytes(comment) + jpeg[2:]


def test_jpeg_size_is_read_as_libjpeg_reads_it(camvid_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fill bytes before a marker are skipped as libjpeg skips them, so the decoy frame is not taken for the
    size: the 360x480 image is refused for a 48x64 sample before OpenCV decodes a pixel."""
    import cv2

    from shardkit.codecs.registry import _image_size

    bomb = _jpeg_with_decoy_frame(camvid_root)
    assert cv2.imdecode(np.frombuffer(bomb, np.uint8), cv2.IMREAD_COLOR).shape == (360, 480, 3)  # what libjpeg does
    assert _image_size(bomb) == ("jpeg", 360, 480, 3)
    monkeypatch.setattr(cv2, "imdecode", lambda *a: pytest.fail("decoded before the size was refused"))
    with pytest.raises(CodecDataError, match="360x480"):
        Jpeg().decode_into(bomb, np.empty((48, 64, 3), np.uint8))
    for bad in (bomb[:2] + b"\x00" + bomb[2:],  # a byte libjpeg would skip with a warning
                bomb[:2] + b"\xff\xd8" + bomb[2:],  # a second SOI (libjpeg: an error)
                b"\xff\xd8\xff\xda\x00\x02" + bomb[2:]):  # a scan before any frame
        assert _image_size(bad) == ("?", 0, 0, 0)
