"""Hostile inputs to the readers: kept loader batches, HDF5 external storage and links, symlinked shards,
oversized or malformed manifest numbers, and CLI output on all of them (one line, no traceback)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import ShardFormatError, ShardkitError, UnsafePathError
from shardkit.files.samples import MAX_PATH_BYTES
from shardkit.store.manifest import inline_manifest, load_manifest

CROP = (64, 96)


@pytest.fixture(scope="module")
def camvid_splits(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A few CamVid val samples as npy, hdf5 and lmdb splits, 3 samples per shard."""
    out = tmp_path_factory.mktemp("hostile")
    splits = {}
    for fmt in ("npy", "hdf5", "lmdb"):
        convert(ConvertConfig(camvid_root, out / fmt, format=fmt, size=CROP, splits=("val",), workers=1,
                              quiet=True, shard_size=ShardSize(samples=3)))
        splits[fmt] = out / fmt / "val"
    return splits


def invoke(*args: object):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("workers", [0, 2])
def test_kept_loader_batches_stay_valid(camvid_splits: dict[str, Path], workers: int) -> None:
    torch = pytest.importorskip("torch")
    from shardkit.read.torch import make_loader

    core = shardkit.open(camvid_splits["npy"])
    loader = make_loader(camvid_splits["npy"], shardkit.EpochPlan(2, shuffle=True), num_workers=workers, layout="NHWC",
                         with_indices=True, pin_memory=False, multiprocessing_context="fork" if workers else None)
    batches = list(loader)
    assert sum(len(ix) for _, _, ix in batches) == len(core)
    for images, labels, idx in batches:
        want_images, want_labels = core.batch(idx.numpy())
        assert isinstance(images, torch.Tensor)
        assert np.array_equal(images.numpy(), want_images)
        assert np.array_equal(labels.numpy(), want_labels)


# --- HDF5: nothing that reads data from outside the shard file -------------------------------------------


def _copy_split(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _refresh_manifest(split: Path) -> None:
    """Recompute every file's size and sha256 in the manifest, as an attacker would."""
    path = split / "manifest.json"
    m = json.loads(path.read_text())
    for shard in m["shards"]:
        for f in shard["files"]:
            data = (split / f["name"]).read_bytes()
            f["bytes"], f["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    path.write_text(json.dumps(m))


def _set_byte(split: Path, shard: Path, offset: int, value: int) -> None:
    """Change one byte of a shard file (a fuzzing find) and refresh the manifest, as an attacker would."""
    data = bytearray(shard.read_bytes())
    data[offset] = value
    shard.write_bytes(bytes(data))
    _refresh_manifest(split)


def _external_storage(f: h5py.File, secret: Path) -> None:
    data = f["images"][()]
    secret.write_bytes(data.tobytes())
    del f["images"]
    f.create_dataset("images", shape=data.shape, dtype=data.dtype, external=[(str(secret), 0, data.nbytes)])


def _external_link(f: h5py.File, secret: Path) -> None:
    with h5py.File(secret, "w") as s:
        s.create_dataset("labels", data=f["labels"][()])
    del f["labels"]
    f["labels"] = h5py.ExternalLink(str(secret), "/labels")


def _soft_link(f: h5py.File, secret: Path) -> None:
    f.move("labels", "hidden")
    f["labels"] = h5py.SoftLink("/hidden")


def _virtual(f: h5py.File, secret: Path) -> None:
    data = f["images"][()]
    with h5py.File(secret, "w") as s:
        s.create_dataset("images", data=data)
    layout = h5py.VirtualLayout(shape=data.shape, dtype=data.dtype)
    layout[...] = h5py.VirtualSource(str(secret), "images", shape=data.shape)
    del f["images"]
    f.create_virtual_dataset("images", layout)


@pytest.mark.parametrize("attack", [_external_storage, _external_link, _soft_link, _virtual],
                         ids=["external-storage", "external-link", "soft-link", "virtual"])
def test_hdf5_refuses_data_from_outside_the_file(camvid_splits: dict[str, Path], tmp_path: Path,
                                                 attack: Callable[[h5py.File, Path], None]) -> None:
    split = _copy_split(camvid_splits["hdf5"], tmp_path / "out" / "val")
    shard = sorted(split.glob("*.h5"))[0]
    with h5py.File(shard, "a") as f:
        attack(f, tmp_path / "secret.bin")
    _refresh_manifest(split)
    with pytest.raises(ShardkitError, match=re.escape(shard.name)):
        ds = shardkit.open(split)
        ds[0]
    result = invoke("verify", split)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    problems = [ln for ln in result.output.splitlines() if ln.startswith("  - ")]
    assert len(problems) == 1 and "refusing HDF5 shard" in problems[0] and shard.name in problems[0]


# --- shard files: regular files inside the dataset folder only -------------------------------------------


@pytest.mark.parametrize("fmt", ["npy", "hdf5"])
def test_symlinked_shard_outside_the_folder_is_refused(camvid_splits: dict[str, Path], tmp_path: Path,
                                                       fmt: str) -> None:
    split = _copy_split(camvid_splits[fmt], tmp_path / "out" / "val")
    name = json.loads((split / "manifest.json").read_text())["shards"][0]["files"][0]["name"]
    outside = tmp_path / "elsewhere.bin"
    shutil.move(split / name, outside)  # same bytes: the manifest's size and sha256 still match
    (split / name).symlink_to(outside)
    with pytest.raises(UnsafePathError, match="outside the dataset folder"):
        shardkit.open(split)[0]
    result = invoke("verify", split)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "outside the dataset folder" in result.output


def test_symlink_inside_the_folder_is_allowed(camvid_splits: dict[str, Path], tmp_path: Path) -> None:
    split = _copy_split(camvid_splits["npy"], tmp_path / "out" / "val")
    name = json.loads((split / "manifest.json").read_text())["shards"][0]["files"][0]["name"]
    shutil.move(split / name, split / "moved.bin")
    (split / name).symlink_to("moved.bin")
    ds = shardkit.open(split)
    want = shardkit.open(camvid_splits["npy"])
    assert np.array_equal(ds[0][0], want[0][0])


def test_shard_that_is_not_a_regular_file_is_refused(camvid_splits: dict[str, Path], tmp_path: Path) -> None:
    split = _copy_split(camvid_splits["npy"], tmp_path / "out" / "val")
    path = split / "manifest.json"
    m = json.loads(path.read_text())
    name = m["shards"][0]["files"][0]["name"]
    (split / name).unlink()
    (split / name).mkdir()
    m["shards"][0]["files"][0]["bytes"] = (split / name).stat().st_size
    path.write_text(json.dumps(m))
    with pytest.raises(UnsafePathError, match="not a regular file"):
        shardkit.open(split)


# --- manifest numbers: typed and bounded before anything is allocated from them --------------------------


def _set(*keys: object, value: object) -> Callable[[dict], None]:
    def mutate(m: dict) -> None:
        node = m
        for k in keys[:-1]:
            node = node[k]  # type: ignore[index]
        node[keys[-1]] = value  # type: ignore[index]

    return mutate


HOSTILE_MANIFESTS = {
    "num-classes-3e8": _set("sample", "label", "num_classes", value=300_000_000),
    "num-classes-2e9": _set("sample", "label", "num_classes", value=2_000_000_000),
    "num-classes-string": _set("sample", "label", "num_classes", value="12"),
    "num-classes-zero": _set("sample", "label", "num_classes", value=0),
    "class-id-string": _set("classes", "classes", 3, "id", value="3"),
    "class-id-float": _set("classes", "classes", 3, "id", value=1.5),
    "class-id-out-of-range": _set("classes", "classes", 3, "id", value=10**12),
    "class-name-list": _set("classes", "classes", 3, "name", value=["x"]),
    "image-shape-huge": _set("sample", "image", "shape", value=[10**6, 10**6, 3]),
    "image-shape-string": _set("sample", "image", "shape", value=["64", 96, 3]),
    "sample-height-huge": _set("samples", 0, "height", value=10**9),
    "sample-width-none": _set("samples", 0, "width", value=None),
    "label-encoding-unknown": _set("sample", "label", "encoding", value="rle"),
    "class-id-dtype-unknown": _set("sample", "label", "class_id_dtype", value="<f8"),
    "ignore-index-string": _set("classes", "ignore_index", value="x"),
    "class-share-strings": _set("stats", "class_share", value=["a"]),
    "unknown-format": _set("format", value="parquet"),
    "num-samples-infinity": _set("num_samples", value=float("inf")),
    "num-samples-nan": _set("num_samples", value=float("nan")),
    "format-version-infinity": _set("format_version", value=float("inf")),
    "shard-index-infinity": _set("shards", 0, "index", value=float("-inf")),
    "shard-bytes-string": _set("shards", 0, "files", 0, "bytes", value="55424"),
    "shard-files-object": _set("shards", 0, "files", value={"name": "x"}),
    "shards-object": _set("shards", value={"a": 1}),
    "tool-string": _set("tool", value="shardkit"),
    "tool-list": _set("tool", value=[1]),
    "sample-key-missing": _set("samples", 0, "key", value=None),
    "image-mean-1000-values": _set("stats", "image_mean", value=[1.0] * 1000),
    "image-std-empty": _set("stats", "image_std", value=[]),
}


def _hostile_split(camvid_splits: dict[str, Path], tmp_path: Path, case: str) -> Path:
    split = _copy_split(camvid_splits["npy"], tmp_path / "out" / "val")
    path = split / "manifest.json"
    if case == "nested-200000":
        path.write_text('{"schema": "shardkit.manifest", "x": ' + "[" * 200_000 + "]" * 200_000 + "}")
    elif case == "integer-100000-digits":  # past Python's int-from-text digit limit: a plain ValueError
        text = path.read_text()
        path.write_text(text.replace('"num_samples": ', '"num_samples": ' + "9" * 100_000 + ', "x": ', 1))
    else:
        if case.startswith("sample-"):  # inline records: a manifest version 1 (what older shardkit wrote)
            m = inline_manifest(load_manifest(split)).to_json()
        else:
            m = json.loads(path.read_text())
        HOSTILE_MANIFESTS[case](m)
        path.write_text(json.dumps(m))
    return split


@pytest.mark.parametrize("case", [*HOSTILE_MANIFESTS, "nested-200000", "integer-100000-digits"])
def test_hostile_manifest_is_one_clear_error(camvid_splits: dict[str, Path], tmp_path: Path, case: str) -> None:
    split = _hostile_split(camvid_splits, tmp_path, case)
    with pytest.raises(ShardFormatError) as exc_info:
        shardkit.open(split)
    assert "manifest" in str(exc_info.value) and "\n" not in str(exc_info.value)
    for cmd in (["info", split], ["show", split, "-o", tmp_path / "s.png"], ["verify", split]):
        result = invoke(*cmd)
        assert result.exit_code == 1, (cmd, result.output)
        assert "Traceback" not in result.output
        if cmd[0] == "verify":
            assert len([ln for ln in result.output.splitlines() if ln.startswith("  - ")]) == 1, result.output
        else:
            assert len([ln for ln in result.output.splitlines() if ln.startswith("Error:")]) == 1, result.output


def test_info_on_the_output_root_shows_every_split(camvid_splits: dict[str, Path], tmp_path: Path) -> None:
    for fmt in ("npy", "hdf5"):
        _copy_split(camvid_splits[fmt], tmp_path / "out" / fmt)
    result = invoke("info", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "format npy" in result.output and "format hdf5" in result.output


# --- manifests and shards that only fail once files are opened -----------------------------------------


def _check_one_line_everywhere(split: Path, tmp_path: Path, match: str) -> None:
    """``open`` + ``ds[0]`` and ``batch`` raise one ShardkitError matching ``match``; info/show/verify exit 1
    with one line and no traceback."""
    for read in (lambda ds: ds[0], lambda ds: ds.batch(np.arange(len(ds))), lambda ds: ds.batch([1, 0])):
        with pytest.raises(ShardkitError, match=match) as exc_info:
            read(shardkit.open(split))
        assert "\n" not in str(exc_info.value)
    for cmd in (["show", split, "-o", tmp_path / "s.png"], ["verify", split]):
        result = invoke(*cmd)
        assert result.exit_code == 1, (cmd, result.output)
        assert "Traceback" not in result.output
        assert any(part in result.output for part in match.split("|")), result.output


@pytest.mark.parametrize(("case", "mutate"), [
    ("files-missing", _set("shards", 0, "files", value=[])),
    ("variable-size-claimed-for-fixed-shards", _set("sample", "image", "shape", value=[None, None, 3])),
], ids=["files-missing", "variable-size-claimed"])
def test_shard_file_count_is_checked(camvid_splits: dict[str, Path], tmp_path: Path, case: str,
                                     mutate: Callable[[dict], None]) -> None:
    split = _copy_split(camvid_splits["npy"], tmp_path / "out" / "val")
    m = json.loads((split / "manifest.json").read_text())
    mutate(m)
    (split / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ShardFormatError, match="files for shard 0, this format has"):
        shardkit.open(split)
    result = invoke("verify", split)
    assert result.exit_code == 1 and "Traceback" not in result.output and "this format has" in result.output


@pytest.mark.parametrize("encoding", ["onehot", "packed"])
def test_label_encoding_that_lies_about_the_arrays(camvid_splits: dict[str, Path], tmp_path: Path,
                                                   encoding: str) -> None:
    split = _copy_split(camvid_splits["npy"], tmp_path / "out" / "val")
    m = json.loads((split / "manifest.json").read_text())
    m["sample"]["label"]["encoding"] = encoding
    (split / "manifest.json").write_text(json.dumps(m))
    _check_one_line_everywhere(split, tmp_path, "disagree with the manifest")


def _npy_with_header(header: dict, body: bytes) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + body


NPY_ATTACKS: dict[str, Callable[[bytes], bytes]] = {
    "object-dtype": lambda data: _npy_with_header({"descr": "|O", "fortran_order": False, "shape": (3, 64, 96, 3)},
                                                  data[128:]),
    "fortran-order": lambda data: _npy_with_header({"descr": "|u1", "fortran_order": True,
                                                    "shape": (3, 64, 96, 3)}, data[128:]),
    "float64": lambda data: _npy_with_header({"descr": "<f8", "fortran_order": False, "shape": (3, 64, 96, 3)},
                                             data[128:] * 8),
    "shape-1e12-samples": lambda data: _npy_with_header({"descr": "|u1", "fortran_order": False,
                                                         "shape": (10**12, 64, 96, 3)}, data[128:]),
    "header-garbage": lambda data: b"\x93NUMPY\x01\x00\xff\xff" + b"{" * 65535,
    "header-code": lambda data: b"\x93NUMPY\x01\x00\x40\x00" + b"__import__('os').getpid()".ljust(63) + b"\n",
    "v3-header-2GiB": lambda data: b"\x93NUMPY\x03\x00\xff\xff\xff\x7f ",
}


@pytest.mark.parametrize("attack", sorted(NPY_ATTACKS))
@pytest.mark.parametrize("which", [0, 1], ids=["images", "labels"])
def test_hostile_npy_header_is_one_clear_error(camvid_splits: dict[str, Path], tmp_path: Path, attack: str,
                                               which: int) -> None:
    """An npy shard with a header np.load rejects, or one it accepts but that is not what the manifest says."""
    split = _copy_split(camvid_splits["npy"], tmp_path / "out" / "val")
    name = json.loads((split / "manifest.json").read_text())["shards"][0]["files"][which]["name"]
    (split / name).write_bytes(NPY_ATTACKS[attack]((split / name).read_bytes()))
    _refresh_manifest(split)
    _check_one_line_everywhere(split, tmp_path, "disagree with the manifest|not a readable .npy shard")


@pytest.mark.parametrize("fmt", ["npy", "hdf5"])
def test_shard_symlink_loop_is_one_clear_error(camvid_splits: dict[str, Path], tmp_path: Path, fmt: str) -> None:
    split = _copy_split(camvid_splits[fmt], tmp_path / "out" / "val")
    name = json.loads((split / "manifest.json").read_text())["shards"][0]["files"][0]["name"]
    (split / name).unlink()
    (split / name).symlink_to(name)
    with pytest.raises(ShardFormatError, match="cannot be opened"):
        shardkit.open(split)
    result = invoke("verify", split)
    assert result.exit_code == 1 and "Traceback" not in result.output and "cannot be opened" in result.output


def test_manifest_symlinked_outside_the_folder_is_refused(camvid_splits: dict[str, Path], tmp_path: Path) -> None:
    split = _copy_split(camvid_splits["npy"], tmp_path / "out" / "val")
    outside = tmp_path / "elsewhere.json"
    shutil.move(split / "manifest.json", outside)
    (split / "manifest.json").symlink_to(outside)
    with pytest.raises(UnsafePathError, match="outside the dataset folder"):
        shardkit.open(split)
    for cmd in ("info", "verify"):
        result = invoke(cmd, split)
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert "outside the dataset folder" in result.output


def test_oversized_manifest_is_refused_before_reading(camvid_splits: dict[str, Path], tmp_path: Path) -> None:
    """A (sparse) manifest larger than MAX_MANIFEST_BYTES is refused from its size, never read into memory."""
    from shardkit.store.manifest import MAX_MANIFEST_BYTES

    split = _copy_split(camvid_splits["npy"], tmp_path / "out" / "val")
    with open(split / "manifest.json", "r+b") as fh:
        fh.truncate(MAX_MANIFEST_BYTES + 1)
    with pytest.raises(ShardFormatError, match="more than the"):
        shardkit.open(split)


# --- HDF5 and TFRecord shards that claim more than they hold ----------------------------------------------


def _hdf5_images_group(f: h5py.File) -> None:
    del f["images"]
    f.create_group("images")


def _hdf5_num_samples_array(f: h5py.File) -> None:
    f.attrs["num_samples"] = np.array([3, 3])


def _hdf5_one_chunk_bomb(f: h5py.File) -> None:
    """The whole images dataset in one gzip chunk: any one-sample read decompresses every sample."""
    data = f["images"][()]
    del f["images"]
    f.create_dataset("images", data=data, chunks=data.shape, compression="gzip")


HDF5_ATTACKS = {"images-is-a-group": (_hdf5_images_group, "not both datasets"),
                "num-samples-array": (_hdf5_num_samples_array, "disagree with the manifest"),
                "one-chunk-for-all-samples": (_hdf5_one_chunk_bomb, "larger than one sample")}


@pytest.mark.parametrize("attack", sorted(HDF5_ATTACKS))
def test_hostile_hdf5_structure_is_one_clear_error(camvid_splits: dict[str, Path], tmp_path: Path,
                                                   attack: str, monkeypatch: pytest.MonkeyPatch) -> None:
    mutate, words = HDF5_ATTACKS[attack]
    if attack == "one-chunk-for-all-samples":  # the bound is one sample or FLAT_CHUNK bytes, whichever is more
        monkeypatch.setattr("shardkit.formats.hdf5.FLAT_CHUNK", 1)
    split = _copy_split(camvid_splits["hdf5"], tmp_path / "out" / "val")
    shard = sorted(split.glob("*.h5"))[0]
    with h5py.File(shard, "a") as f:
        mutate(f)
    _refresh_manifest(split)
    _check_one_line_everywhere(split, tmp_path, words)


@pytest.fixture(scope="module")
def tfrecord_gzip_split(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hostile-tfrecord")
    convert(ConvertConfig(camvid_root, out, format="tfrecord", compression="gzip", size=CROP, splits=("val",),
                          workers=1, quiet=True, shard_size=ShardSize(samples=3)))
    return out / "val"


def test_tfrecord_gzip_bomb_is_refused_while_decompressing(tfrecord_gzip_split: Path, tmp_path: Path) -> None:
    """A 3-sample gzip shard that inflates to 400 MB: refused once it passes what 3 samples need, without
    ever holding the 400 MB (decompression stops at the bound)."""
    import zlib

    split = _copy_split(tfrecord_gzip_split, tmp_path / "out" / "val")
    shard = sorted(split.glob("*.tfrecord"))[0]
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    shard.write_bytes(b"".join(co.compress(zeros) for _ in range(400)) + co.flush())
    _refresh_manifest(split)
    _check_one_line_everywhere(split, tmp_path, "decompresses to more than")


def test_tfrecord_gzip_shard_still_reads(tfrecord_gzip_split: Path, camvid_splits: dict[str, Path]) -> None:
    ds, want = shardkit.open(tfrecord_gzip_split), shardkit.open(camvid_splits["npy"])
    images, labels = ds.batch(np.arange(len(ds)))
    assert np.array_equal(images, want.batch(np.arange(len(want)))[0])
    assert np.array_equal(labels, want.batch(np.arange(len(want)))[1])


def test_hdf5_with_a_damaged_heap_is_one_clear_error(camvid_splits: dict[str, Path], tmp_path: Path) -> None:
    """One byte of the root group's local heap changed (found by fuzzing): h5py raises RuntimeError
    ("bad heap free list") while visiting links, which must become the shard's one-line error."""
    split = _copy_split(camvid_splits["hdf5"], tmp_path / "out" / "val")
    shard = sorted(split.glob("*.h5"))[0]
    _set_byte(split, shard, 696, 107)
    with h5py.File(shard, "r") as f, pytest.raises(RuntimeError):  # the damage this test is about
        f.visit_links(lambda name: None)
    _check_one_line_everywhere(split, tmp_path, "cannot open HDF5 shard")


def test_lmdb_with_a_damaged_btree_is_one_clear_error(camvid_splits: dict[str, Path], tmp_path: Path) -> None:
    """One byte of shard 1's B-tree changed (found by fuzzing): LMDB's own ``txn.get`` raises MDB_PAGE_NOTFOUND;
    shardkit's checked walk of the tree names the sample whose node is damaged, in one line, for single reads,
    batches and ``verify`` alike."""
    import lmdb

    split = _copy_split(camvid_splits["lmdb"], tmp_path / "out" / "val")
    shard = sorted(split.glob("shard-00001-*.lmdb"))[0]
    _set_byte(split, shard, 12258, 88)
    env = lmdb.open(str(shard), subdir=False, readonly=True, lock=False)
    with env.begin() as txn, pytest.raises(lmdb.Error):  # the damage this test is about
        for k in range(3):
            txn.get(b"%08d" % k)
    env.close()
    ds = shardkit.open(split)
    with pytest.raises(ShardFormatError, match="cannot be found in the LMDB B-tree"):
        for i in range(3, 6):
            ds[i]
    with pytest.raises(ShardFormatError, match="cannot be found in the LMDB B-tree"):
        shardkit.open(split).batch(np.arange(6))
    result = invoke("verify", split)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "cannot be found in the LMDB B-tree" in result.output


def test_npy_header_that_does_not_tokenize_is_one_clear_error(camvid_splits: dict[str, Path],
                                                              tmp_path: Path) -> None:
    """A '}' in the header's space padding (found by fuzzing): np.load raises tokenize.TokenError."""
    split = _copy_split(camvid_splits["npy"], tmp_path / "out" / "val")
    name = json.loads((split / "manifest.json").read_text())["shards"][0]["files"][1]["name"]
    _set_byte(split, split / name, 93, ord("}"))
    _check_one_line_everywhere(split, tmp_path, "not a readable .npy shard")


@pytest.mark.parametrize("fmt", ["npy", "hdf5", "lmdb"])
def test_tf_dataset_on_a_damaged_shard_fails_at_construction(camvid_splits: dict[str, Path], tmp_path: Path,
                                                              fmt: str) -> None:
    """A truncated shard (size and sha256 refreshed) used to surface mid-epoch as a TensorFlow
    InvalidArgumentError wrapping our message, with a traceback; now it is our one-line error up front."""
    pytest.importorskip("tensorflow")
    import shardkit.tf

    split = _copy_split(camvid_splits[fmt], tmp_path / "out" / "val")
    name = json.loads((split / "manifest.json").read_text())["shards"][0]["files"][0]["name"]
    (split / name).write_bytes((split / name).read_bytes()[:1000])
    _refresh_manifest(split)
    with pytest.raises(ShardkitError) as exc_info:
        shardkit.tf.dataset(split, 2)
    assert name in str(exc_info.value) and "\n" not in str(exc_info.value)


# --- samples sidecars (manifest version 2): checked like shard files, one line, nothing big allocated ----


def _sidecar_rows(split: Path) -> tuple[Path, np.ndarray]:
    name = json.loads((split / "manifest.json").read_text())["shards"][0]["samples"]["name"]
    return split / name, np.load(split / name, allow_pickle=False)


def _rewrite_sidecar(split: Path, data: bytes, *, refresh: bool = True) -> None:
    """Replace shard 0's sidecar with ``data``; ``refresh``: fix its size and sha256 in the manifest (an attacker)."""
    path = split / "manifest.json"
    m = json.loads(path.read_text())
    entry = m["shards"][0]["samples"]
    (split / entry["name"]).write_bytes(data)
    if refresh:
        entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
        path.write_text(json.dumps(m))


def _npy(rows: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, rows, allow_pickle=True)
    return buf.getvalue()


def _with_field(rows: np.ndarray, name: str, dtype: str) -> np.ndarray:
    fields = [(n, dtype if n == name else rows.dtype.fields[n][0]) for n in rows.dtype.names]
    out = np.zeros(rows.shape, fields)
    for n in rows.dtype.names:
        out[n] = rows[n] if n != name else rows[n].astype(dtype) if rows.dtype.fields[n][0].kind != "S" else rows[n]
    return out


def _bad_values(rows: np.ndarray, field: str, value: object) -> np.ndarray:
    rows = rows.copy()
    rows[field][0] = value
    return rows


HOSTILE_SIDECARS: dict[str, Callable[[np.ndarray], bytes]] = {
    "not-npy": lambda rows: b"not a numpy file at all" * 10,
    "truncated-header": lambda rows: _npy(rows)[:20],
    "object-dtype": lambda rows: _npy(np.array([{"key": "x"}] * len(rows), dtype=object)),
    "plain-uint8": lambda rows: _npy(np.zeros(len(rows) * rows.dtype.itemsize, np.uint8)),
    "height-float": lambda rows: _npy(_with_field(rows, "height", "<f8")),
    "height-big-endian": lambda rows: _npy(_with_field(rows, "height", ">u4")),
    "key-too-wide": lambda rows: _npy(_with_field(rows, "key", f"S{MAX_PATH_BYTES + 1}")),
    "key-unicode": lambda rows: _npy(_with_field(rows, "key", "<U8")),
    "extra-row": lambda rows: _npy(np.concatenate([rows, rows[:1]])),
    "two-dimensional": lambda rows: _npy(rows.reshape(-1, 1)),
    "height-huge": lambda rows: _npy(_bad_values(rows, "height", 4_000_000_000)),
    "height-zero": lambda rows: _npy(_bad_values(rows, "height", 0)),
    "height-not-the-fixed-size": lambda rows: _npy(_bad_values(rows, "height", CROP[0] + 1)),
    "key-not-utf8": lambda rows: _npy(_bad_values(rows, "key", b"\xff\xfe")),
    "trailing-bytes": lambda rows: _npy(rows) + b"\0" * 64,
    "header-claims-1e12-rows": lambda rows: _npy(rows).replace(
        f"'shape': ({len(rows)},)".encode(), f"'shape': ({10**12},)".encode().ljust(len(f"'shape': ({len(rows)},)"))),
}


@pytest.mark.parametrize("case", list(HOSTILE_SIDECARS))
def test_hostile_sidecar_is_one_clear_error(camvid_splits: dict[str, Path], tmp_path: Path, case: str) -> None:
    """A sidecar whose size and sha256 an attacker put into the manifest is still refused in one line."""
    split = _copy_split(camvid_splits["npy"], tmp_path / "out" / "val")
    path, rows = _sidecar_rows(split)
    _rewrite_sidecar(split, HOSTILE_SIDECARS[case](rows))
    ds = shardkit.open(split)  # a fixed-size split: opening reads no sidecar
    with pytest.raises(ShardFormatError) as exc_info:
        ds.key(0)
    assert path.name in str(exc_info.value) and "\n" not in str(exc_info.value)
    result = invoke("verify", split)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    problems = [ln for ln in result.output.splitlines() if ln.startswith("  - ")]
    assert len(problems) == 1 and path.name in problems[0], result.output


def test_a_truncated_sidecar_is_refused_by_its_size(camvid_splits: dict[str, Path], tmp_path: Path) -> None:
    split = _copy_split(camvid_splits["npy"], tmp_path / "out" / "val")
    path, _ = _sidecar_rows(split)
    _rewrite_sidecar(split, path.read_bytes()[:-1], refresh=False)
    with pytest.raises(ShardkitError, match="truncated or replaced"):
        shardkit.open(split).key(0)


def test_a_sidecar_with_the_wrong_hash_fails_verify(camvid_splits: dict[str, Path], tmp_path: Path) -> None:
    split = _copy_split(camvid_splits["npy"], tmp_path / "out" / "val")
    path, rows = _sidecar_rows(split)
    _rewrite_sidecar(split, _npy(_bad_values(rows, "fingerprint", 7)), refresh=False)  # same size, other bytes
    assert shardkit.open(split).key(0) == rows["key"][0].decode()  # a read checks sizes, not hashes
    result = invoke("verify", split)
    assert result.exit_code == 1 and path.name in result.output and "sha256" in result.output


@pytest.mark.parametrize("kind", ["symlink-outside", "directory"])
def test_a_sidecar_outside_the_folder_or_not_a_file_is_refused(camvid_splits: dict[str, Path], tmp_path: Path,
                                                               kind: str) -> None:
    split = _copy_split(camvid_splits["npy"], tmp_path / "out" / "val")
    path, _ = _sidecar_rows(split)
    if kind == "symlink-outside":
        shutil.move(path, tmp_path / "elsewhere.npy")  # same bytes: size and sha256 still match
        path.symlink_to(tmp_path / "elsewhere.npy")
    else:
        path.unlink()
        path.mkdir()
    with pytest.raises(UnsafePathError):
        shardkit.open(split).key(0)
    result = invoke("verify", split)
    assert result.exit_code == 1 and "Traceback" not in result.output


def test_a_hostile_sidecar_of_a_variable_size_split_fails_the_read_of_its_shard_only(
        camvid_root: Path, tmp_path: Path) -> None:
    """Variable size: a shard's sizes come from its sidecar when that shard is first read, checked then (LMDB
    bounds each record's claimed size by them)."""
    out = tmp_path / "var"
    convert(ConvertConfig(camvid_root, out, format="lmdb", splits=("val",), workers=1, quiet=True,
                          shard_size=ShardSize(samples=9)))
    split = out / "val"
    path, rows = _sidecar_rows(split)
    _rewrite_sidecar(split, _npy(_bad_values(rows, "width", 70_000)))
    ds = shardkit.open(split)
    assert ds.manifest.samples.loads == 0  # opening read no sidecar
    with pytest.raises(ShardFormatError, match=re.escape(path.name)):
        ds[0]
    image, _ = ds[len(ds) - 1]  # another shard is fine
    assert image.shape[2] == 3


@pytest.mark.parametrize("fmt", ["npy", "hdf5"])
def test_a_shard_sizes_table_that_disagrees_with_the_samples_records_is_refused(
        camvid_root: Path, tmp_path: Path, fmt: str) -> None:
    """npy and HDF5 variable-size shards carry their own (H, W) table; a sample whose table entry differs from its
    record (here 480x360 for a 360x480 sample: the same pixel count, so every array length still adds up) is
    refused when its shard is first read, naming the sample and both sizes."""
    out = tmp_path / fmt
    convert(ConvertConfig(camvid_root, out, format=fmt, splits=("val",), workers=1, quiet=True,
                          shard_size=ShardSize(samples=9)))
    split = out / "val"
    _, rows = _sidecar_rows(split)
    h, w = int(rows["height"][0]), int(rows["width"][0])
    rows = _bad_values(_bad_values(rows, "height", w), "width", h)
    _rewrite_sidecar(split, _npy(rows))
    ds = shardkit.open(split)
    with pytest.raises(ShardFormatError, match=f"sample 0 is {h}x{w}, the manifest says {w}x{h}"):
        ds[0]
    image, _ = ds[len(ds) - 1]  # another shard is fine
    assert image.shape[2] == 3


# --- fuzzing: flipped bits and truncations in every format's files, sidecars and manifests -----------------


@pytest.fixture(scope="module")
def fuzz_splits(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from tests.fuzz import build_splits

    return list(build_splits(camvid_root, tmp_path_factory.mktemp("fuzz")).values())


def test_damaged_files_never_kill_hang_or_traceback(fuzz_splits: list[Path]) -> None:
    """55 seeded cases (5 per split: npy, LMDB, HDF5 and TFRecord; fixed and variable size; raw, gzip, LZF, zstd,
    lz4, PNG and JPEG): one file of the split damaged, then open, every sample, a batch, ``info``, ``show`` and
    ``verify``, in a child process whose address space is limited to its size after imports plus 1 GiB. No case
    may end in a signal, a traceback, a multi-line error or a MemoryError. ``scripts/fuzz_shards.py`` runs more."""
    from tests.fuzz import run

    outcome = run(fuzz_splits, seed=2024, cases=5 * len(fuzz_splits))
    assert outcome.cases == 5 * len(fuzz_splits)
    assert not outcome.failures, "\n\n".join(outcome.failures[:5])
    assert sum(outcome.errors.values()) > outcome.cases // 2  # the damage was met, and refused in one line


def test_a_manifest_too_costly_to_parse_is_refused_unparsed(camvid_splits: dict[str, Path], tmp_path: Path) -> None:
    """A 12 MB manifest of empty objects under an unknown key would take ~300 MB once parsed (25x its size); the
    parse cost is estimated from its bytes and, over the limit, refused before ``json.loads`` runs. A small one is
    read into a buffer of its own size, not one of the 512 MiB a manifest may have."""
    import tracemalloc

    from shardkit.store import manifest as manifest_module

    split = _copy_split(camvid_splits["npy"], tmp_path / "split")
    m = json.loads((split / "manifest.json").read_text())
    m["future_key"] = {"note": "unknown keys are ignored"}
    (split / "manifest.json").write_text(json.dumps(m))
    tracemalloc.start()
    try:
        assert load_manifest(split).num_samples == m["num_samples"]  # an unknown key: ignored
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20
    m["future_key"] = [{}] * 4_000_000
    (split / "manifest.json").write_text(json.dumps(m, separators=(",", ":")))
    assert manifest_module.parse_cost((split / "manifest.json").read_bytes()) > manifest_module.MAX_PARSE_BYTES
    with pytest.raises(ShardFormatError, match="to parse") as err:
        load_manifest(split)
    assert "\n" not in str(err.value)


def test_hdf5_datatype_damaged_into_one_numpy_lacks_is_one_line(fuzz_splits: list[Path], tmp_path: Path) -> None:
    """Found by ``scripts/fuzz_shards.py --seed 99`` (case 150): bit flips turn a dataset's datatype into an HDF5
    time type, and h5py's ``.dtype`` raised TypeError, a traceback; it is the shard's one-line error."""
    import numpy as np

    from tests.fuzz import mutate

    (src,) = [p for p in fuzz_splits if p.parent.name == "hdf5-fixed-zstd"]
    split = _copy_split(src, tmp_path / "split")
    assert "[88, 16936, 12311, 904, 16400]" in mutate(split, np.random.default_rng([99, 150]))
    ds = shardkit.open(split)
    with pytest.raises(ShardFormatError) as err:
        for i in range(len(ds)):
            ds[i]
    assert "\n" not in str(err.value)


def test_a_damaged_codecs_entry_in_the_manifest_is_one_line_for_info(fuzz_splits: list[Path], tmp_path: Path) -> None:
    """Found by ``scripts/fuzz_shards.py --seed 5``: a flipped bit in ``format_options.codecs`` (``"label"`` no
    longer a key) made ``info`` print a KeyError traceback; the manifest's codecs are checked when it is loaded."""
    (src,) = [p for p in fuzz_splits if p.parent.name == "hdf5-fixed-zstd"]
    split = _copy_split(src, tmp_path / "split")
    m = json.loads((split / "manifest.json").read_text())
    m["format_options"]["codecs"]["lab\u00e5l"] = m["format_options"]["codecs"].pop("label")
    (split / "manifest.json").write_text(json.dumps(m))
    for command in ("info", "verify"):
        result = invoke(command, split)
        assert result.exit_code == 1 and "Traceback" not in result.output and "codecs" in result.output
    with pytest.raises(ShardFormatError, match=r"format_options\.codecs is invalid"):
        load_manifest(split)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("swap", ["fifo", "deep-json"])
def test_every_file_of_a_split_folder_swapped_for_a_fifo_or_deep_json_is_one_line_never_a_hang(
        camvid_splits: dict[str, Path], tmp_path: Path, swap: str) -> None:
    """Each file in turn — manifest, kept version, shard files, sidecars, shard records, fingerprint cache — replaced
    by a FIFO (a reader that opened it would wait forever) or by 100,000-deep JSON (a RecursionError): open, info
    and verify end in exit 0 or one clean line, never a traceback or a hang."""
    src = camvid_splits["npy"]
    names = sorted(p.name for p in src.iterdir() if p.is_file() and not p.name.startswith(".lease-"))
    assert {"manifest.json", "manifest-v1.json", ".fingerprints.json"} <= set(names)
    assert any(n.startswith(".shard-") for n in names) and any(n.startswith("samples-") for n in names)
    for name in names:
        split = _copy_split(src, tmp_path / name.strip(".") / "val")
        (split / name).unlink()
        if swap == "fifo":
            os.mkfifo(split / name)
        else:
            (split / name).write_text("[" * 100_000 + "]" * 100_000)
        try:
            try:
                ds = shardkit.open(split)
                ds[0]
                ds.close()
            except ShardkitError as exc:
                assert "\n" not in str(exc), (name, str(exc))
            for args in (["info", split], ["verify", split]):
                res = CliRunner().invoke(main, [str(a) for a in args])
                assert res.exception is None or isinstance(res.exception, SystemExit), (name, args, res.exception)
                assert "Traceback" not in res.output and res.exit_code in (0, 1), (name, args, res.output)
                if res.exit_code:
                    assert len(res.output.strip().splitlines()) == 1 or args[0] == "verify", (name, res.output)
        finally:
            (split / name).unlink()
