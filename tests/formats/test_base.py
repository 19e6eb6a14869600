"""formats.base: hashing, and the contract every format keeps (write, publish, read back exactly)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from shardkit.formats.base import HASH_CHUNK, SampleSpec, sha256_file
from shardkit.formats.registry import writer_class

from .shards import STEM, samples, write_shard


@pytest.mark.parametrize("size", [0, 1, 4097, HASH_CHUNK + 3])
def test_sha256_file_mapped_and_chunked_agree_with_hashlib(tmp_path: Path, size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    p = tmp_path / "f.bin"
    p.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    assert sha256_file(p) == sha256_file(p, mapped=True) == want


# --------------------------------------------------------------------------- the writer/reader contract


@pytest.mark.parametrize("fmt", ["npy", "lmdb"])
@pytest.mark.parametrize(("size", "encoding", "dtype"), [((4, 6), "index", "|u1"), (None, "index", "<u2"),
                                                         ((4, 6), "packed", "|u1"), (None, "onehot", "|u1")])
def test_what_a_writer_wrote_a_reader_reads_back_exactly(tmp_path: Path, fmt: str, size: tuple[int, int] | None,
                                                          encoding: str, dtype: str) -> None:
    spec = SampleSpec(size, encoding, 12, dtype)
    data = samples(spec)
    reader = write_shard(fmt, tmp_path, spec, data)
    assert len(reader) == len(data)
    for k, (image, label) in enumerate(data):
        got_image, got_label = reader.read(k)
        assert np.array_equal(got_image, image) and got_image.dtype == np.uint8
        assert np.array_equal(got_label, label) and got_label.dtype == spec.stored_label_dtype
        assert reader.shape_of(k) == image.shape[:2]
    if size is not None:
        order = [4, 0, 2, 2]
        images = np.empty((len(order), *size, 3), np.uint8)
        labels = np.empty((len(order), *spec.label_shape(size)), spec.stored_label_dtype)
        reader.read_batch_into(order, images, labels)
        assert all(np.array_equal(images[j], data[i][0]) and np.array_equal(labels[j], data[i][1])
                   for j, i in enumerate(order))
    reader.verify_hashes()


@pytest.mark.parametrize("fmt", ["npy", "lmdb"])
def test_abort_leaves_nothing_behind(tmp_path: Path, fmt: str) -> None:
    spec = SampleSpec((4, 6), "index", 12, "|u1")
    writer = writer_class(fmt)(tmp_path, STEM, spec, 2, "none")
    writer.add(*samples(spec, 1)[0], "sample-0")
    writer.abort()
    assert list(tmp_path.iterdir()) == []
