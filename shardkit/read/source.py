"""Where a :class:`~shardkit.read.dataset.Dataset`'s shard readers come from: a local folder or a cached remote split.

A Dataset holds one :class:`ShardSource` and asks it for shard ``pos``'s reader on every read; the reader it gets
is always the format's own :class:`~shardkit.formats.base.ShardReader` on local files, so a split on object
storage gets the same fast paths as a local one (npy's memory-mapped ``fixed_arrays`` row gather, LMDB's one
transaction per run, read-ahead hints):

* :class:`LocalShards` opens every shard's reader on open (checking that its files exist with their sizes).
* :class:`CachedShards` fetches a shard through the :class:`~shardkit.read.cache.ShardCache` on its first read in a
  process, pins the local copy, and opens the format's reader on it; nothing is fetched before a sample is read.
  A read-through shard whose folder the cache deletes is forgotten (:meth:`_CachedShard.release`) and fetched
  again on its next read.
* :class:`~shardkit.read.ranges.RangedShards` reads samples of a remote npy or TFRecord split by HTTP range requests, a
  batch at a time (:meth:`ShardSource.gather`); ``OpenOptions.remote_reads`` chooses between the two remote ones.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import IntegrityError
from ..files.splitfiles import ShardInfo
from ..formats.base import SampleSpec, ShardFormat, ShardReader
from ..store.manifest import Manifest

if TYPE_CHECKING:  # the cache (multiprocessing, locks, …) is loaded by a split on object storage only
    from .cache import ShardCache

__all__ = ["CachedShards", "LocalShards", "ShardSource"]


class ShardSource(ABC):
    """The shard readers of one split version. Picklable: readers reopen their files in each process."""

    #: the cache of a split on object storage (None for a local folder)
    cache: ShardCache | None = None

    @abstractmethod
    def reader(self, pos: int) -> ShardReader:
        """The format's reader of shard ``pos`` (manifest order), its files on this machine."""

    def readers(self) -> list[ShardReader]:
        """Every shard's reader (a remote split fetches every shard)."""
        return [self.reader(pos) for pos in range(len(self))]

    def resident(self, pos: int) -> bool:
        """Whether shard ``pos``'s reader is at hand in this process without fetching anything."""
        return True

    @abstractmethod
    def __len__(self) -> int:
        """How many shards."""

    def gather(self, shard: np.ndarray, local: np.ndarray, images: np.ndarray, stored: np.ndarray) -> bool:
        """Read a whole batch (shard positions ``shard``, local indices ``local``) into ``images``/``stored`` and
        return True, for a source that plans a batch's reads together (range reads); False: the Dataset reads it
        run by run through :meth:`reader`."""
        return False

    def release(self) -> None:  # noqa: B027 - nothing to let go of by default
        """Let go of what this process holds beyond the readers' files (pins on cached shards)."""


class LocalShards(ShardSource):
    """A split folder on this machine: every shard's reader opened (and its files checked) now."""

    def __init__(self, folder: Path, fmt: type[ShardFormat], manifest: Manifest, spec: SampleSpec) -> None:
        self.folder = folder
        self._readers = [fmt.open_shard(folder, shard, spec, manifest) for shard in manifest.shards]

    def reader(self, pos: int) -> ShardReader:
        return self._readers[pos]

    def readers(self) -> list[ShardReader]:
        return self._readers

    def __len__(self) -> int:
        return len(self._readers)


class CachedShards(ShardSource):
    """A split on object storage, each shard served from its copy in ``cache`` (fetched on first read)."""

    def __init__(self, cache: ShardCache, fmt: type[ShardFormat], manifest: Manifest, spec: SampleSpec) -> None:
        self.cache = cache
        self._shards = [_CachedShard(cache, fmt, shard, spec, manifest) for shard in manifest.shards]
        sizes = [sum(f.bytes for f in shard.all_files) for shard in manifest.shards]
        if cache.limit is not None and sum(sizes) > cache.limit:  # not all cached: room to read one through
            cache.read_through_room = min(max(sizes, default=0), cache.limit // 2)

    def reader(self, pos: int) -> ShardReader:
        return self._shards[pos].reader()

    def resident(self, pos: int) -> bool:
        return self._shards[pos].resident()

    def __len__(self) -> int:
        return len(self._shards)

    def release(self) -> None:
        for shard in self._shards:
            shard.release()
        if self.cache is not None:  # this process's read-through folders: they count against the limit
            self.cache.release_transient()


class _CachedShard:
    """One shard of a remote split: its local copy's reader in this process, and the pins that keep the copy."""

    def __init__(self, cache: ShardCache, fmt: type[ShardFormat], shard: ShardInfo, spec: SampleSpec,
                 manifest: Manifest) -> None:
        self.cache, self.fmt, self.shard, self.spec, self.manifest = cache, fmt, shard, spec, manifest
        self._pid: int | None = None
        self._reader: ShardReader | None = None
        self._pins: list[int] = []

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pid"], state["_reader"], state["_pins"] = None, None, []
        return state

    def resident(self) -> bool:
        """Whether this process holds the local copy's reader now."""
        return self._reader is not None and self._pid == os.getpid()

    def reader(self) -> ShardReader:
        """The format reader on the local copy (fetching the shard first, once per process). The local files are
        pinned (:meth:`ShardCache.pin`) first, so another process sharing the cache cannot evict them between the
        fetch and the open, nor while they are read."""
        from .cache import unpin  # loaded by now: this shard's cache made this source

        pid = os.getpid()
        if self._reader is not None and self._pid == pid:
            return self._reader
        if self._pid == pid:
            unpin(self._pins)
        self._pins = []  # a forked child's inherited descriptors stay with the parent's lock
        for _ in range(3):
            folder = self.cache.fetch(self.shard, self)
            pins = self.cache.pin(self.shard.all_files, folder)
            if pins is not None:
                break
        else:
            raise IntegrityError("shard files keep disappearing from the cache while being opened",
                                 path=self.cache.directory,
                                 fix="another process is deleting files in this cache_dir; give each job its own "
                                     "cache_dir or a larger cache_limit")
        self._pins = pins
        reader = self.fmt.open_shard(folder, self.shard, self.spec, self.manifest)
        reader.ensure_open()  # a read-through folder may be deleted later: hold its files open now
        reader.expected_hw  # noqa: B018 - and read the sizes from its sidecar now (variable-size splits)
        self._reader, self._pid = reader, pid
        return reader

    def release(self) -> None:
        """Forget the local copy (a read-through shard whose folder is being deleted) and unpin it."""
        from .cache import unpin

        self._reader = None
        if self._pid == os.getpid():
            unpin(self._pins)
        self._pins = []
