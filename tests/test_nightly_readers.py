"""A nightly publish never breaks a running reader: readers keep the version they opened (issue 24, defect 4).

Every publish here changes every input image (a marker row whose value is the publish's generation), so a
batch read from the wrong version, or from a mix of versions, is caught pixel by pixel; the expected arrays
come from the source PNGs, not from shardkit. Conversions run with ``--keep-versions 1``: only the readers'
leases keep the versions they opened.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

import shardkit
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert

torch = pytest.importorskip("torch")

SAMPLES = 8
MARK = (slice(0, 1), slice(0, 16))  # row 0, columns 0..15 carry the generation


class Nightly:
    """A raw folder whose images change at every publish, and the output they are published into."""

    def __init__(self, camvid_root: Path, tmp: Path, fmt: str) -> None:
        self.src = camvid_root
        self.raw = tmp / "raw"
        self.out = tmp / "out"
        self.fmt = fmt
        self.names = sorted(p.name for p in (camvid_root / "val").iterdir())[:SAMPLES]
        (self.raw / "val").mkdir(parents=True)
        (self.raw / "valannot").mkdir(parents=True)
        for name in self.names:
            (self.raw / "valannot" / name).write_bytes((camvid_root / "valannot" / name).read_bytes())
        self.generation = 0
        self.generation_of: dict[int, int] = {}  # published version -> generation

    def expected(self, generation: int) -> tuple[np.ndarray, np.ndarray]:
        images = np.stack([cv2.cvtColor(cv2.imread(str(self.src / "val" / n)), cv2.COLOR_BGR2RGB)
                           for n in self.names])
        images[(slice(None), *MARK)] = generation
        labels = np.stack([cv2.imread(str(self.src / "valannot" / n), cv2.IMREAD_UNCHANGED) for n in self.names])
        return images, labels

    def publish(self) -> int:
        """Change every image, convert into the same output (keeping one version), return the new version."""
        self.generation += 1
        for name in self.names:
            image = cv2.imread(str(self.src / "val" / name))
            image[MARK] = self.generation
            cv2.imwrite(str(self.raw / "val" / name), image)
        convert(ConvertConfig(self.raw, self.out, format=self.fmt, shard_size=ShardSize(samples=2), workers=1,
                              keep_versions=1, quiet=True))
        version = json.loads((self.out / "val" / "manifest.json").read_text())["version"]
        self.generation_of[version] = self.generation
        return int(version)


def read_epoch_while_publishing(nightly: Nightly, context: str, publishes_at: set[int]) -> tuple[int, int]:
    """Open the split, read one whole epoch through a 2-worker DataLoader, publishing after the batches in
    ``publishes_at``; every batch must equal the version opened. Returns (version read, version at the end)."""
    from shardkit.read.torch import make_loader

    ds = shardkit.open(nightly.out / "val")
    opened = ds.version
    assert opened is not None
    want_images, want_labels = nightly.expected(nightly.generation_of[opened])
    loader = make_loader(ds, shardkit.EpochPlan(1, shuffle=False), num_workers=2, multiprocessing_context=context,
                         prefetch_factor=1, persistent_workers=False)
    seen = 0
    latest = opened
    for b, (images, labels) in enumerate(loader):
        got_i = images.permute(0, 2, 3, 1).numpy()
        assert np.array_equal(got_i, want_images[seen:seen + len(got_i)]), (opened, seen)
        assert np.array_equal(labels.numpy(), want_labels[seen:seen + len(got_i)]), (opened, seen)
        seen += len(got_i)
        if b in publishes_at:
            latest = nightly.publish()
    assert seen == SAMPLES
    ds.close()
    return opened, latest


@pytest.mark.parametrize("fmt", ["npy", "lmdb"])
def test_forked_loader_reads_whole_epochs_of_the_version_it_opened_while_publishes_land(
        camvid_root: Path, tmp_path: Path, fmt: str) -> None:
    nightly = Nightly(camvid_root, tmp_path, fmt)
    nightly.publish()
    for epoch in range(3):  # two publishes inside each epoch, after most shards are still unopened
        opened, latest = read_epoch_while_publishing(nightly, "fork", {0, 3})
        assert latest == opened + 2, epoch
    # the next reader sees the newest version; the versions no reader holds any more are gone
    ds = shardkit.open(nightly.out / "val")
    assert ds.version == 7 and np.array_equal(ds.batch(list(range(SAMPLES)))[0], nightly.expected(7)[0])
    nightly.publish()
    assert sorted(p.name for p in (nightly.out / "val").glob("manifest-v*.json")) == ["manifest-v7.json",
                                                                                   "manifest-v8.json"]
    ds.close()
    nightly.publish()
    assert sorted(p.name for p in (nightly.out / "val").glob("manifest-v*.json")) == ["manifest-v9.json"]


def test_spawned_workers_read_the_version_their_parent_opened(camvid_root: Path, tmp_path: Path) -> None:
    nightly = Nightly(camvid_root, tmp_path, "npy")
    nightly.publish()
    opened, latest = read_epoch_while_publishing(nightly, "spawn", {0})
    assert (opened, latest) == (1, 2)


def test_open_a_kept_version_and_a_version_that_is_not_kept(camvid_root: Path, tmp_path: Path) -> None:
    nightly = Nightly(camvid_root, tmp_path, "npy")
    nightly.publish()
    held = shardkit.open(nightly.out / "val")  # its lease keeps version 1 through the next publishes
    nightly.publish()
    nightly.publish()
    old = shardkit.open(nightly.out / "val", version=1)
    assert old.version == 1 and np.array_equal(old.batch([0, 7])[0], nightly.expected(1)[0][[0, 7]])
    assert shardkit.open(nightly.out / "val").version == 3
    held.close()
    old.close()
    nightly.publish()  # no lease any more: version 1 and its files go (keep_versions=1)
    with pytest.raises(shardkit.errors.InputNotFoundError, match="version 1 of this split is not kept"):
        shardkit.open(nightly.out / "val", version=1)
