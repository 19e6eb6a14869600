"""LMDB shards: one record per sample under ``sample_key(i)``, a metadata record, a map that grows."""

from __future__ import annotations

import json
from pathlib import Path

import lmdb
import numpy as np

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
