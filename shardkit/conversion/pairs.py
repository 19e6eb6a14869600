"""A split's image/label pairs as columns: what a conversion's parent holds per sample from discovery to the end.

:class:`PairTable` is a ``Sequence[SamplePair]`` that stores each pair's key and its label's path relative to
the input root as UTF-8 bytes (:mod:`shardkit.support.columns`) — about 60 bytes a pair where a ``SamplePair`` of two
``pathlib.Path`` objects took ~0.5 KB — and makes a ``SamplePair`` only when one is asked for. A slice is a view
(a shard task's samples); pickled, it carries only its own rows.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import numpy as np

from ..support.columns import ColumnBuilder, StringColumn


@dataclass(frozen=True, order=True, slots=True)
class SamplePair:
    """One image and its label; ``key`` (image path relative to the root, POSIX) sorts and names it."""

    key: str
    image: Path
    label: Path | None


def root_prefix(root: Path) -> str:
    """``str(root)`` with one trailing separator: every path of a table is this plus its relative text."""
    return str(root).rstrip(os.sep) + os.sep


class PairTable(Sequence[SamplePair]):
    """Sorted pairs of one split: ``keys``, and the image and label paths relative to ``root``.

    ``images`` is None where each image's relative path is its key (always on POSIX: the key is the image's
    path relative to the root); a label's text is empty where a pair has no label.
    """

    __slots__ = ("_images", "_labels", "_prefix", "keys", "root")

    def __init__(self, root: Path, keys: StringColumn, images: StringColumn | None, labels: StringColumn) -> None:
        if len(labels) != len(keys) or (images is not None and len(images) != len(keys)):
            raise ValueError("pair table columns differ in length")
        self.root = root
        self.keys = keys
        self._images = images
        self._labels = labels
        self._prefix = root_prefix(root)

    def __len__(self) -> int:
        return len(self.keys)

    @overload
    def __getitem__(self, i: int) -> SamplePair: ...
    @overload
    def __getitem__(self, i: slice) -> PairTable: ...
    def __getitem__(self, i: int | slice) -> SamplePair | PairTable:
        if isinstance(i, slice):
            return PairTable(self.root, self.keys[i], None if self._images is None else self._images[i],
                             self._labels[i])
        label = self.path(i, 1)
        return SamplePair(self.keys[i], Path(self._prefix + self.images[i]), None if label is None else Path(label))

    def __iter__(self) -> Iterator[SamplePair]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PairTable):
            return NotImplemented
        return (self.root == other.root and self.keys == other.keys and self._labels == other._labels
                and self.images == other.images)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PairTable({len(self)} pairs under {self.root})"

    def __reduce__(self) -> tuple[type[PairTable], tuple[Path, StringColumn, StringColumn | None, StringColumn]]:
        return PairTable, (self.root, self.keys, self._images, self._labels)

    @property
    def images(self) -> StringColumn:
        """The images' paths relative to the root."""
        return self.keys if self._images is None else self._images

    @property
    def labels(self) -> StringColumn:
        """The labels' paths relative to the root ("" for a pair without a label)."""
        return self._labels

    def path(self, i: int, side: int) -> str | None:
        """The absolute path (as ``str(Path)`` writes it) of pair ``i``'s image (``side`` 0) or label (1)."""
        text = (self.images if side == 0 else self._labels)[i]
        return self._prefix + text if text else None

    def with_root(self, root: Path) -> PairTable:
        """The same relative paths under another root (a worker's private copy of remote inputs)."""
        return PairTable(root, self.keys, self._images, self._labels)

    def files_in_path_order(self) -> Iterator[tuple[str, int, int]]:
        """(absolute path, pair index, side) of every image and label, ordered as ``sorted`` orders the paths."""
        def column(side: int) -> Iterator[tuple[str, int, int]]:
            col = self.images if side == 0 else self._labels
            prefix = self._prefix
            if col.is_sorted():  # the common case: the column's own order
                for i, text in enumerate(col):
                    if text:
                        yield prefix + text, i, side
                return
            order = col.argsort()
            for a in range(0, len(order), 4096):  # not one Python int per pair at once
                for i in order[a : a + 4096].tolist():
                    if text := col[i]:
                        yield prefix + text, i, side

        return heapq.merge(column(0), column(1))


class PairBuilder:
    """Collects the pairs of one split (any order) as columns; :meth:`build` sorts them by key."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._prefix = root_prefix(root)
        self._keys, self._images, self._labels = ColumnBuilder(), ColumnBuilder(), ColumnBuilder()
        self._images_are_keys = True

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: str, image: str, label: str | None) -> int:
        """Add a pair from its key and absolute path strings (both under the root); its index."""
        image_text = self._relative(image)
        if self._images_are_keys and image_text != key:  # not on POSIX: the images get their own column
            self._images_are_keys = False
            for i in range(len(self._keys)):
                self._images.append(self._keys.get(i))
        if not self._images_are_keys:
            self._images.append(image_text)
        self._labels.append("" if label is None else self._relative(label))
        return self._keys.append(key)

    def key(self, i: int) -> str:
        return self._keys.get(i)

    def image(self, i: int) -> str:
        return self._prefix + (self._keys if self._images_are_keys else self._images).get(i)

    def key_of_label(self, label: str) -> str | None:
        """The key of the pair whose label is ``label`` (an absolute path string): a linear search, for errors."""
        text = self._relative(label)
        return next((self._keys.get(i) for i in range(len(self)) if self._labels.get(i) == text), None)

    def _relative(self, path: str) -> str:
        if not path.startswith(self._prefix) or len(path) == len(self._prefix):
            raise ValueError(f"{path} is not inside {self.root}")
        return path[len(self._prefix) :]

    def build(self) -> PairTable:
        """The pairs sorted by key (keys are unique within a split)."""
        keys, images, labels = self._keys.build(), self._images.build(), self._labels.build()
        table = PairTable(self.root, keys, None if self._images_are_keys else images, labels)
        order = keys.argsort()
        if np.array_equal(order, np.arange(len(order))):
            return table
        return PairTable(self.root, keys.take(order), None if self._images_are_keys else images.take(order),
                         labels.take(order))
