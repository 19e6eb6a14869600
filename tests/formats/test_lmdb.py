"""LMDB shards: one record per sample under ``sample_key(i)``, a metadata record, a map that grows."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest

import shardkit
from shardkit.errors import ShardFormatError
from shardkit.formats.base import SampleSpec
from shardkit.formats.lmdb import _MIN_MAP, META_KEY, RECORD_HEADER, sample_key

from .shards import STEM, samples, write_shard


def test_records_are_header_image_label_under_their_index(tmp_path: Path) -> None:
    spec = SampleSpec(None, "index", 300, "<u2")
    data = samples(spec, 3)
    write_shard("lmdb", tmp_path, spec, data)
    env = lmdb.open(str(tmp_path / f"shard-{STEM}.lmdb"), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        assert json.loads(txn.get(META_KEY))["num_samples"] == 3
        for k, (image, label) in enumerate(data):
            raw = txn.get(sample_key(k))
            h, w, n_img, n_lab = np.frombuffer(raw[:RECORD_HEADER.itemsize], RECORD_HEADER)[0]
            assert (h, w, n_img, n_lab) == (*image.shape[:2], image.nbytes, label.nbytes)
            body = raw[RECORD_HEADER.itemsize:]
            assert body == image.tobytes() + label.astype("<u2").tobytes()
    env.close()


def test_a_shard_larger_than_the_first_map_grows_it(tmp_path: Path) -> None:
    spec = SampleSpec((256, 256), "index", 12, "|u1")
    data = samples(spec, 8)  # 8 x 256 KiB > the first 1 MiB map
    assert sum(i.nbytes + lb.nbytes for i, lb in data) > _MIN_MAP
    reader = write_shard("lmdb", tmp_path, spec, data)
    assert all(np.array_equal(reader.read(k)[1], data[k][1]) for k in range(8))


# ---------------------------------------------------------------- damaged shards: one line, never a signal
@pytest.fixture(scope="module")
def camvid_lmdb(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four real CamVid val pairs at 64x96 (records of 24 KiB: on overflow pages), two per shard."""
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert
    from tests.fuzz import camvid_subset

    root = tmp_path_factory.mktemp("camvid-lmdb-damaged")
    convert(ConvertConfig(camvid_subset(camvid_root, root / "input", 4), root / "out", format="lmdb", size=(64, 96),
                          splits=("val",), workers=0, quiet=True, shard_size=ShardSize(samples=2)))
    return root / "out" / "val"


def _damage_node(split: Path, tmp_path: Path, sample: int, edit) -> Path:  # type: ignore[no-untyped-def]
    """A copy of ``split`` whose first shard's leaf node for ``sample`` is changed by ``edit(data, node)``
    (``node``: offset of the node header), with the manifest's sizes and hashes refreshed as an attacker would."""
    import shutil

    from shardkit.formats._lmdb_pages import _current_meta
    from tests.fuzz import refresh_manifest

    out = tmp_path / "val"
    shutil.copytree(split, out)
    path = sorted(out.glob("shard-*.lmdb"))[0]
    data = bytearray(path.read_bytes())
    psize, root = _current_meta(data, len(data))  # two samples and the metadata: the root is the one leaf page
    node = data.find(struct.pack("<H", 8) + sample_key(sample), root * psize, (root + 1) * psize) - 6
    assert node > 0 and data[node + 4] & 1  # an F_BIGDATA node: the value is on overflow pages
    edit(data, node)
    path.write_bytes(bytes(data))
    refresh_manifest(out)
    return out


def _cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardkit", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def _stated_size_past_the_file(data: bytearray, node: int) -> None:
    data[node : node + 4] = struct.pack("<HH", 0xFFFF, 0x00FF)  # the value's size: 16 MiB


def _overflow_page_past_the_end(data: bytearray, node: int) -> None:
    data[node + 16 : node + 24] = struct.pack("<Q", 10**6)  # first overflow page: far past the end of the file


@pytest.mark.parametrize("edit", [_stated_size_past_the_file, _overflow_page_past_the_end])
def test_a_damaged_leaf_node_is_one_line_naming_the_sample_never_a_signal(camvid_lmdb: Path, tmp_path: Path,
                                                                          edit) -> None:
    """py-lmdb copied the stated size out of its map (SIGSEGV) or touched a page past the end of the file
    (SIGBUS); the reader's checked walk makes both a one-line error naming sample 1 — for ``show``, ``verify``
    (exit 1), a single read and a batch — and every other sample still reads."""
    split = _damage_node(camvid_lmdb, tmp_path, 1, edit)
    shown = _cli("show", split, "-i", 1, "-o", tmp_path / "s.png")
    assert shown.returncode == 1 and "Traceback" not in shown.stderr
    assert len(shown.stderr.strip().splitlines()) == 1 and "sample 1" in shown.stderr
    verified = _cli("verify", split)
    assert verified.returncode == 1 and "sample 1" in verified.stdout and "Traceback" not in verified.stderr
    assert _cli("info", split).returncode == 0
    ds = shardkit.open(split)
    with pytest.raises(ShardFormatError, match="sample 1 cannot be found"):
        ds[1]
    with pytest.raises(ShardFormatError):
        ds.batch([0, 1])
    good = shardkit.open(camvid_lmdb)
    for i in (0, 2, 3):
        np.testing.assert_array_equal(ds[i][0], good[i][0])


def test_a_torch_worker_gets_the_error_not_a_dead_process(camvid_lmdb: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from shardkit.read.torch import make_loader

    split = _damage_node(camvid_lmdb, tmp_path, 1, _stated_size_past_the_file)
    loader = make_loader(split, shardkit.EpochPlan(2, shuffle=False), num_workers=1, pin_memory=False,
                         multiprocessing_context="fork")
    with pytest.raises(Exception) as err:  # torch re-raises the worker's error in the parent
        list(loader)
    assert "ShardFormatError" in repr(err.value) or isinstance(err.value, ShardFormatError)
    assert "sample 1" in str(err.value) and "exited unexpectedly" not in str(err.value)
    del torch


def test_a_manifest_claiming_more_samples_than_the_file_holds_allocates_nothing(camvid_lmdb: Path) -> None:
    """The record table (16 bytes per sample) is refused before allocation when the file cannot hold the
    claim; the walk visits each page once and stops at the first key that is not a sample's."""
    from shardkit.formats._lmdb_pages import LmdbLayoutError, read_table

    path = sorted(camvid_lmdb.glob("shard-*.lmdb"))[0]
    data = path.read_bytes()
    with pytest.raises(LmdbLayoutError, match="cannot hold"):
        read_table(data, 10**12)
    table = read_table(data, 2)
    assert (table.ranges >= 0).all() and table.meta is not None and table.problem is None
    short = read_table(data, 1)  # sample 1's key is then not one of the shard's: the walk stops there
    assert short.problem is not None and "not one of the 1 samples" in short.problem


def test_keys_out_of_order_are_not_served_as_each_other(camvid_lmdb: Path, tmp_path: Path) -> None:
    """Two sample keys swapped in a leaf page (flipped key bits): an in-order walk meets them out of order, so
    neither record is served as the other's sample (LMDB's own binary search would have returned them swapped)."""
    def swap(data: bytearray, node: int) -> None:
        page = node - node % 4096
        other = data.find(struct.pack("<H", 8) + sample_key(0), page, page + 4096) + 2  # the key itself
        assert other > page
        data[other : other + 8], data[node + 8 : node + 16] = sample_key(1), sample_key(0)

    split = _damage_node(camvid_lmdb, tmp_path, 1, swap)
    ds = shardkit.open(split)
    for i in (0, 1):
        with pytest.raises(ShardFormatError, match=f"sample {i} cannot be found"):
            ds[i]
    np.testing.assert_array_equal(ds[2][0], shardkit.open(camvid_lmdb)[2][0])
