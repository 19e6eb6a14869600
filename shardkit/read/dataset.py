"""The framework-agnostic core reader: ``shardkit.open("out/train")`` → random access to samples.

Only numpy and the format's own library are used. Shard files are opened lazily in
the process that reads them, so a Dataset may be handed to forked or spawned workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..formats.base import SampleSpec, ShardReader
from ..formats.registry import reader_class
from ..manifest import Manifest, load_manifest
from ..transform import decode_label_encoding

LABEL_OUTPUTS = ("ids", "onehot", "float_onehot", "stored")


class Dataset:
    """A converted split. ``ds[i]`` → (image (H, W, 3) uint8, label); ``ds.batch(idx)`` → stacked arrays."""

    def __init__(self, path: str | Path, *, labels: str = "ids", verify: bool = False) -> None:
        if labels not in LABEL_OUTPUTS:
            raise ConfigError(f"labels={labels!r} is not one of {', '.join(LABEL_OUTPUTS)}")
        self.path = Path(path)
        self.manifest: Manifest = load_manifest(self.path)
        self.spec = SampleSpec.from_manifest(self.manifest.sample)
        self.labels = labels
        self.ignore_index: int | None = self.manifest.classes.get("ignore_index")
        cls = reader_class(self.manifest.format)
        self.readers: list[ShardReader] = [
            cls(self.path, shard, self.spec, self.manifest.format_options) for shard in self.manifest.shards
        ]
        self._starts = np.array([s.first_index for s in self.manifest.shards], dtype=np.int64)
        if verify:
            for r in self.readers:
                r.verify_hashes()

    def __len__(self) -> int:
        return self.manifest.num_samples

    @property
    def num_classes(self) -> int:
        return self.spec.num_classes

    def locate(self, i: int) -> tuple[int, int]:
        """Global index → (shard number, local index)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples")
        i %= n
        s = int(np.searchsorted(self._starts, i, side="right") - 1)
        return s, i - int(self._starts[s])

    def key(self, i: int) -> str:
        return str(self.manifest.samples[i]["key"])

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        s, j = self.locate(int(i))
        image, stored = self.readers[s].read(j)
        return image, self.convert_label(stored)

    def convert_label(self, stored: np.ndarray) -> np.ndarray:
        """Stored encoding → the label output asked for."""
        if self.labels == "stored":
            return stored
        enc = self.spec.label_encoding
        if self.labels == "ids":
            if enc == "index":
                return stored
            return decode_label_encoding(stored, enc, self.num_classes, self.ignore_index)
        from ..transform import encode_label

        if enc == "onehot":
            onehot = stored
        else:
            ids = stored if enc == "index" else decode_label_encoding(stored, enc, self.num_classes, self.ignore_index)
            onehot = encode_label(ids, "onehot", self.num_classes)
        return onehot.astype(np.float32) if self.labels == "float_onehot" else onehot

    def batch(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Stacked (images (B, H, W, 3), labels (B, …)) for fixed-size data."""
        if self.spec.size is None:
            raise ConfigError("batch() needs fixed-size samples", fix="convert with --size HxW or read samples one by one")
        items = [self[int(i)] for i in indices]
        return np.stack([a for a, _ in items]), np.stack([b for _, b in items])

    def __iter__(self) -> Any:
        for i in range(len(self)):
            yield self[i]
