"""Where a :class:`~shardkit.read.dataset.Dataset`'s shard readers come from: a local folder or a cached remote split.

A Dataset opens its split through one :class:`~shardkit.store.source.ByteSource` (:func:`split_bytes`: the folder
and its reader lease, or the split on object storage with its :class:`~shardkit.read.cache.ShardCache`), which
parses the manifest once and hands out the sample records' sidecars. For the shard data it holds one
:class:`ShardSource` and asks it for shard ``pos``'s reader on every read; the reader it gets is always the format's
own :class:`~shardkit.formats.base.ShardReader` on local files, so a split on object storage gets the same fast
paths as a local one (npy's memory-mapped ``fixed_arrays`` row gather, LMDB's one transaction per run, read-ahead
hints):

* :class:`LocalShards` opens every shard's reader on open (checking that its files exist with their sizes).
* :class:`CachedShards` holds a shard through the cache (:meth:`ShardCache.hold`: fetched, verified and pinned) on
  its first read in a process, and opens the format's reader on the held copy; nothing is fetched before a sample is
  read. A read-through shard whose folder the cache deletes has its hold closed: it is fetched again on its next read.
* :class:`~shardkit.read.ranges.RangedShards` reads samples of a remote npy, LMDB, HDF5 or TFRecord split by HTTP
  range requests, a batch at a time (:meth:`ShardSource.gather`); ``OpenOptions.remote_reads`` chooses between the
  two remote ones, or (``"auto"``) :class:`~shardkit.read.ranges.PerBatchShards` holds both and chooses per batch.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..files.splitfiles import ShardInfo
from ..files.storage import is_url
from ..formats.base import SampleSpec, ShardFormat, ShardReader
from ..store.manifest import Manifest
from ..store.source import ByteSource, Hold, open_bytes

if TYPE_CHECKING:  # the cache (multiprocessing, locks, …) is loaded by a split on object storage only
    from .cache import ShardCache
    from .options import OpenOptions

__all__ = ["CachedShards", "LocalShards", "ShardSource", "split_bytes"]


def split_bytes(path: str | os.PathLike[str], opts: OpenOptions) -> ByteSource:
    """The :class:`~shardkit.store.source.ByteSource` a reader opens ``path`` with: a local folder (with a reader
    lease), or a split on object storage through its bounded :class:`~shardkit.read.cache.ShardCache`."""
    files = None
    if is_url(path):  # imported here: a local split never loads the object-storage modules
        from .cache import ShardCache

        files = ShardCache(os.fspath(path), cache_dir=opts.cache_dir, limit=opts.cache_limit,
                           storage_options=opts.storage_options)
    return open_bytes(path, opts.version, files=files)


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
        cache.leave_room([sum(f.bytes for f in shard.all_files) for shard in manifest.shards])

    def reader(self, pos: int) -> ShardReader:
        return self._shards[pos].reader()

    def resident(self, pos: int) -> bool:
        return self._shards[pos].resident()

    def __len__(self) -> int:
        return len(self._shards)

    def release(self) -> None:
        for shard in self._shards:  # the read-through folders go with the byte source (Dataset.close)
            shard.release()


#: Taken while a shard of a remote split is fetched and its reader opened: fetching another shard may drop this
#: process's read-through slot (its folder deleted), so a reader on another thread (tf.data's parallel map, Keras
#: threads) could find its files gone between the fetch and the open. Once open, its files are held by descriptor.
_OPENING = threading.Lock()


def _new_opening_lock() -> None:
    """A forked child starts with the lock free (a thread of the parent may have held it at the fork)."""
    global _OPENING
    _OPENING = threading.Lock()


os.register_at_fork(after_in_child=_new_opening_lock)


class _CachedShard:
    """One shard of a remote split: its local copy's reader in this process, built on the cache's :class:`Hold`
    (the copy pinned while held); a read-through copy whose folder the cache deleted closes its hold, and the shard
    is fetched again on its next read."""

    def __init__(self, cache: ShardCache, fmt: type[ShardFormat], shard: ShardInfo, spec: SampleSpec,
                 manifest: Manifest) -> None:
        self.cache, self.fmt, self.shard, self.spec, self.manifest = cache, fmt, shard, spec, manifest
        self._held: Hold | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_held": None}

    def resident(self) -> bool:
        """Whether this process holds the local copy's reader now."""
        held = self._held
        return held is not None and held.open and held.kept is not None and held.owned

    def reader(self) -> ShardReader:
        """The format reader on the local copy (fetching the shard first, once per process while it is held)."""
        if self.resident():
            return cast(ShardReader, self._held.kept)  # type: ignore[union-attr]
        with _OPENING:  # no other thread of this process drops the read-through slot before the files are open
            if self.resident():  # another thread opened it meanwhile
                return cast(ShardReader, self._held.kept)  # type: ignore[union-attr]
            self.release()
            held = self.cache.hold(self.shard)
            try:
                reader = self.fmt.open_shard(held.folder, self.shard, self.spec, self.manifest)
                reader.ensure_open()  # a read-through folder may be deleted later: hold its files open now
                reader.expected_hw  # noqa: B018 - and read the sizes from its sidecar now (variable-size splits)
            except BaseException:
                held.close()
                raise
            held.kept, self._held = reader, held
            return reader

    def release(self) -> None:
        """Forget the local copy and unpin it."""
        if self._held is not None:
            self._held.close()
        self._held = None
