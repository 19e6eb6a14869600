"""TFRecord shards, read back by TensorFlow itself in the process that converted them.

TensorFlow is imported once per module, *before* any conversion here: the ``tfrecord``
package's protobufs and TensorFlow's cannot share a process, so this also proves that
converting (the writer runs in pool workers) and reading (shardkit parses the records
itself) never import ``tfrecord`` into the caller.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import pickle
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import ShardFormatError
from tests.sample_records import records as sample_records

CROP = (352, 480)
SPEC = Path(__file__).resolve().parents[2] / "formats" / "tfrecord.md"


def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = _crc_table()


def masked_crc32c(data: bytes) -> int:
    """CRC32C (Castagnoli, reflected, table-driven) masked as TFRecord does; independent of crc32c/TF."""
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return ((c >> 15 | c << 17) + 0xA282EAD8) & 0xFFFFFFFF


def copy_split(src: Path, dst: Path) -> Path:
    """A copy of the plain files of split folder ``src`` in ``dst`` (created if missing)."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.is_file():
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


def shard_digests(split_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(split_dir.glob("shard-*"))}


def cropped_source(root: Path, key: str, label_rel: str) -> tuple[np.ndarray, np.ndarray]:
    image = cv2.cvtColor(cv2.imread(str(root / key), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    label = cv2.imread(str(root / label_rel), cv2.IMREAD_UNCHANGED)
    top = (image.shape[0] - CROP[0]) // 2
    return image[top : top + CROP[0]], label[top : top + CROP[0]]


def camvid_val(root: Path, out: Path, **kw) -> Path:
    cfg = ConvertConfig(root, out, format="tfrecord", size=CROP, splits=("val",), shard_size=ShardSize(10),
                        quiet=True, **{"workers": 2, **kw})
    convert(cfg)
    return out / "val"


@pytest.fixture(scope="module")
def camvid_tfr(tf, camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CamVid val through the CLI with one worker, TensorFlow already imported."""
    out = tmp_path_factory.mktemp("tfr")
    args = ["convert", str(camvid_root), str(out), "--format", "tfrecord", "--split", "val",
            "--size", "352x480", "--shard-size", "10", "--workers", "1", "--quiet"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return out / "val"


@pytest.fixture(scope="module")
def camvid_tfr_gz(tf, camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return camvid_val(camvid_root, tmp_path_factory.mktemp("tfrgz"), compression="gzip")


def tf_read_split(split: Path) -> list[dict]:
    """Every record through ``read_tfrecord_split`` exactly as formats/tfrecord.md prints it (TF only)."""
    text = SPEC.read_text(encoding="utf-8").split("## A complete reader", 1)[1]
    module = split.parent / "spec_reader.py"  # a real file: AutoGraph wants the source of ``decode``
    module.write_text(text.split("```python\n", 1)[1].split("```", 1)[0], encoding="utf-8")
    loaded = importlib.util.module_from_spec(importlib.util.spec_from_file_location("spec_reader", module))
    loaded.__loader__.exec_module(loaded)
    return [{"image": image.numpy(), "label": label.numpy(), "key": key.numpy().decode()}
            for image, label, key in loaded.read_tfrecord_split(split)]


@pytest.mark.parametrize("which", ["camvid_tfr", "camvid_tfr_gz"])
def test_tf_data_reads_every_sample_bit_exactly(which: str, request: pytest.FixtureRequest, tf,
                                                camvid_root: Path, validate_manifest) -> None:
    split = request.getfixturevalue(which)
    manifest = validate_manifest(split)
    ds = shardkit.open(split, labels="stored", verify=True)
    records = tf_read_split(split)
    assert len(records) == len(ds) == manifest["num_samples"] == 26
    recs = sample_records(split, manifest)
    for i, rec in enumerate(records):
        sample = recs[i]
        assert rec["key"] == sample["key"]
        image, label = ds[i]
        want_image, want_label = cropped_source(camvid_root, sample["key"], sample["label"])
        for got in (image, rec["image"]):
            np.testing.assert_array_equal(got, want_image)
        for got in (label, rec["label"][..., 0]):
            np.testing.assert_array_equal(got, want_label)
    assert "tfrecord" not in sys.modules


def test_tensorflow_first_then_convert_and_read_in_one_process(tf, camvid_tfr: Path) -> None:
    """The CLI conversion above ran after ``import tensorflow``; reading works next to it."""
    assert "tensorflow" in sys.modules and "tfrecord" not in sys.modules
    ds = shardkit.open(camvid_tfr)
    image, label = ds[len(ds) - 1]
    first = next(iter(tf.data.TFRecordDataset([str(camvid_tfr / ds.manifest.shards[-1].files[0].name)])))
    example = tf.train.Example.FromString(first.numpy())  # TensorFlow's own protobuf classes
    feats = example.features.feature
    assert sorted(feats) == sorted(ds.manifest.format_options["features"])
    assert [feats[k].bytes_list.value[0] for k in ("label/encoding", "label/dtype")] == [b"index", b"uint8"]
    ints = ("image/height", "image/width", "image/channels", "label/channels", "label/num_classes")
    assert [feats[k].int64_list.value[0] for k in ints] == [*CROP, 3, 1, 12]
    start = len(ds) - ds.manifest.shards[-1].num_samples
    np.testing.assert_array_equal(ds[start][0].tobytes(), feats["image/raw"].bytes_list.value[0])
    assert image.shape == (*CROP, 3) and label.shape == CROP


def test_byte_framing_index_and_crc(camvid_tfr: Path) -> None:
    """Walk the files by hand: uint64 LE length, masked CRC32C of it, data, masked CRC32C of data."""
    manifest = json.loads((camvid_tfr / "manifest.json").read_text())
    for shard in manifest["shards"]:
        data_file, index_file = (camvid_tfr / f["name"] for f in shard["files"])
        assert data_file.suffix == ".tfrecord" and index_file.suffix == ".tfindex"
        data, pos, lines = data_file.read_bytes(), 0, []
        while pos < len(data):
            (n,) = struct.unpack_from("<Q", data, pos)
            len_crc, = struct.unpack_from("<I", data, pos + 8)
            data_crc, = struct.unpack_from("<I", data, pos + 12 + n)
            assert len_crc == masked_crc32c(data[pos : pos + 8])
            assert data_crc == masked_crc32c(data[pos + 12 : pos + 12 + n])
            lines.append(f"{pos} {n + 16}\n")
            pos += n + 16
        assert pos == len(data) and len(lines) == shard["num_samples"]
        assert index_file.read_text() == "".join(lines)


def test_gzip_is_one_gzip_stream_indexed_in_uncompressed_offsets(camvid_tfr: Path,
                                                                  camvid_tfr_gz: Path) -> None:
    plain = json.loads((camvid_tfr / "manifest.json").read_text())
    packed = json.loads((camvid_tfr_gz / "manifest.json").read_text())
    opts = packed["format_options"]
    assert opts["compression"] == "gzip" and opts["tf_compression_type"] == "GZIP"
    for a, b in zip(plain["shards"], packed["shards"], strict=True):
        raw = (camvid_tfr_gz / b["files"][0]["name"]).read_bytes()
        assert raw[:2] == b"\x1f\x8b" and len(raw) < a["files"][0]["bytes"]
        assert gzip.decompress(raw) == (camvid_tfr / a["files"][0]["name"]).read_bytes()
        index = (camvid_tfr / a["files"][1]["name"]).read_text()
        assert (camvid_tfr_gz / b["files"][1]["name"]).read_text() == index


def test_bytes_identical_for_one_and_two_workers(camvid_tfr: Path, camvid_tfr_gz: Path, camvid_root: Path,
                                                  tmp_path: Path) -> None:
    assert shard_digests(camvid_val(camvid_root, tmp_path / "a", workers=2)) == shard_digests(camvid_tfr)
    packed = camvid_val(camvid_root, tmp_path / "b", workers=1, compression="gzip")
    assert shard_digests(packed) == shard_digests(camvid_tfr_gz)


def test_the_tfrecord_package_reads_shards_with_their_index(camvid_tfr: Path, camvid_tfr_gz: Path) -> None:
    """In a subprocess (it cannot share this one with TensorFlow): its index tool and reader agree."""
    script = textwrap.dedent("""
        import json, sys
        from pathlib import Path
        sys.modules["tfrecord.torch"] = None  # the package's PyTorch loader, unused here: not imported (2-6 s)
        from tfrecord.reader import tfrecord_iterator
        from tfrecord.tools.tfrecord2idx import create_index
        for split in map(Path, sys.argv[1:]):
            m = json.loads((split / "manifest.json").read_text())
            gz = "gzip" if m["format_options"]["compression"] == "gzip" else None
            for s in m["shards"]:
                data, index = (str(split / f["name"]) for f in s["files"])
                if gz is None:
                    create_index(data, data + ".idx")
                    assert open(data + ".idx").read() == open(index).read()
                n = sum(1 for _ in tfrecord_iterator(data, index, shard=(0, 1), compression_type=gz))
                assert n == s["num_samples"], (n, s)
        print("ok")
    """)
    scratch = camvid_tfr.parent / "scratch"
    scratch.mkdir(exist_ok=True)
    for split in (camvid_tfr, camvid_tfr_gz):  # work on copies: create_index writes next to the data
        copy_split(split, scratch / split.parent.name)
    args = [str(scratch / s.parent.name) for s in (camvid_tfr, camvid_tfr_gz)]
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_writer_imports_the_tfrecord_package_without_pytorch() -> None:
    """Conversion workers load the package's writer and protobufs, not the PyTorch its ``__init__`` pulls in
    (2-6 s per worker); a later ``import tfrecord.torch`` still works. In a fresh interpreter: this one has torch."""
    script = textwrap.dedent("""
        import sys
        from shardkit.formats.tfrecord import _record_writer
        _record_writer()
        assert "tfrecord.example_pb2" in sys.modules and "torch" not in sys.modules, sorted(sys.modules)
        import tfrecord.torch
        assert "torch" in sys.modules
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.parametrize(("encoding", "unknown"), [("onehot", 255), ("index", 300)])
def test_variable_size_round_trip(encoding: str, unknown: int, tf, rgb_masks_root: Path, tmp_path: Path,
                                  validate_manifest) -> None:
    """rgb-masks-mini (sizes differ) as npy and as tfrecord: identical samples; id 300 makes labels uint16."""
    common = {"splits": ("train",), "unknown_as": unknown, "ignore_index": unknown, "workers": 2,
              "quiet": True, "shard_size": ShardSize(samples=5), "label_encoding": encoding}
    convert(ConvertConfig(rgb_masks_root, tmp_path / "npy", format="npy", **common))
    convert(ConvertConfig(rgb_masks_root, tmp_path / "tfr", format="tfrecord", **common))
    split = tmp_path / "tfr" / "train"
    validate_manifest(split)
    want = shardkit.open(tmp_path / "npy" / "train", labels="stored")
    ds = shardkit.open(split, labels="stored")
    records = tf_read_split(split)
    assert len(ds) == len(want) == len(records) > 1 and ds.spec.size is None
    for i, rec in enumerate(records):
        (image, label), (want_image, want_label) = ds[i], want[i]
        tf_label = rec["label"][..., 0] if encoding == "index" else rec["label"]
        for got_image, got_label in ((image, label), (rec["image"], tf_label)):
            np.testing.assert_array_equal(got_image, want_image)
            np.testing.assert_array_equal(got_label, want_label)
            assert got_label.dtype == want_label.dtype
    assert len({ds.readers[0].shape_of(i) for i in range(len(ds.readers[0]))}) > 1
    if unknown == 300:  # the little-endian uint16 path, with values that need the high byte
        assert ds.spec.stored_label_dtype == np.dtype("<u2")
        assert any((ds[i][1] == 300).any() for i in range(len(ds)))


def test_reader_pickles_without_its_buffer(camvid_tfr: Path) -> None:
    reader = shardkit.open(camvid_tfr).readers[0]
    image, _ = reader.read(1)
    clone = pickle.loads(pickle.dumps(reader))
    assert reader.is_open and not clone.is_open
    np.testing.assert_array_equal(clone.read(1)[0], image)
    out_img, out_lab = np.zeros((2, *CROP, 3), np.uint8), np.zeros((2, *CROP), np.uint8)
    clone.read_batch_into([1, 0], out_img, out_lab)  # base class's generic implementation
    np.testing.assert_array_equal(out_img[0], image)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_shard_is_a_one_line_error(damage: str, camvid_tfr: Path, tmp_path: Path) -> None:
    split = copy_split(camvid_tfr, tmp_path / "val")
    manifest = json.loads((split / "manifest.json").read_text())
    entry = manifest["shards"][0]["files"][0]
    path = split / entry["name"]
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[100_000] ^= 0x01  # inside the first record's image bytes
    else:
        del data[-1000:]
        entry["bytes"] = len(data)  # the manifest agrees: only the index check can notice
        (split / "manifest.json").write_text(json.dumps(manifest))
    path.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError) as err:
        shardkit.open(split)[0]
    assert "\n" not in str(err.value)
    assert ("CRC32C" if damage == "flip" else "index") in str(err.value)


@pytest.mark.parametrize("path", ["read", "batch", "batch_other_dtype"])
def test_damage_after_a_first_read_is_still_detected(path: str, camvid_tfr: Path, tmp_path: Path) -> None:
    """Record layouts are kept per process, but every read checks both CRCs again (in place: mmap)."""
    split = copy_split(camvid_tfr, tmp_path / "val")
    ds = shardkit.open(split, labels="stored")
    reader = ds.readers[0]
    want = [tuple(a.copy() for a in reader.read(i)) for i in (0, 1)]
    out_img, out_lab = np.zeros((2, *CROP, 3), np.uint8), np.zeros((2, *CROP), np.uint8)
    if path == "batch_other_dtype":
        out_lab = np.zeros((2, *CROP), np.int32)
    reader.read_batch_into([0, 1], out_img, out_lab)  # layouts known from here on
    for k, (image, label) in enumerate(want):
        np.testing.assert_array_equal(out_img[k], image)
        np.testing.assert_array_equal(out_lab[k], label)
    data = split / ds.manifest.shards[0].files[0].name
    start = int((split / ds.manifest.shards[0].files[1].name).read_text().split()[2])  # record 1
    for offset in (100_000, 40, 676_000):  # image bytes, Example header, label bytes
        with open(data, "r+b") as fh:  # in place: the reader's memory map sees it
            fh.seek(start + offset)
            byte = fh.read(1)
            fh.seek(start + offset)
            fh.write(bytes([byte[0] ^ 0x10]))
        with pytest.raises(ShardFormatError, match="record 1 fails its CRC32C check"):
            if path == "read":
                reader.read(1)
            else:
                reader.read_batch_into([0, 1], out_img, out_lab)
        with open(data, "r+b") as fh:
            fh.seek(start + offset)
            fh.write(byte)
    reader.read_batch_into([1, 0], out_img, out_lab)
    np.testing.assert_array_equal(out_img[0], want[1][0])
    np.testing.assert_array_equal(out_lab[1], want[0][1])


def test_a_variable_size_gzip_stream_is_bounded_by_the_sidecar_sizes(camvid_root: Path, tmp_path: Path) -> None:
    """A gzip shard of variable-size samples inflates to at most its samples at the sizes the sidecar states (plus
    64 KiB of framing per record), not samples x the largest size a manifest may state (1 GiB each): a stream of
    zeros four times that is refused while inflating."""
    from tests.fuzz import camvid_subset, refresh_manifest

    convert(ConvertConfig(camvid_subset(camvid_root, tmp_path / "input", 2), tmp_path / "out", format="tfrecord",
                          compression="gzip", splits=("val",), workers=0, quiet=True, shard_size=ShardSize(samples=2)))
    split = tmp_path / "out" / "val"
    reader = shardkit.open(split).readers[0]
    limit = reader.max_stream_bytes()
    assert limit == 2 * (360 * 480 * 4 + (1 << 16))  # RGB + a uint8 id per pixel, per sample
    (data,) = split.glob("shard-*.tfrecord")
    data.write_bytes(gzip.compress(bytes(4 * limit), 9))
    refresh_manifest(split)
    with pytest.raises(ShardFormatError, match=f"more than the {limit} bytes"):
        shardkit.open(split)[0]
