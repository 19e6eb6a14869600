"""Per-sample range reads of a split on object storage (``OpenOptions(remote_reads="ranges")``), issue 41.

A shuffled pass over a split larger than the cache downloads whole shards to use a few samples of each; an npy
shard is a plain array, so sample ``j``'s bytes are ``[offset + j·row, offset + (j+1)·row)`` of its object and can
be fetched alone with an HTTP range request; an uncompressed TFRecord shard's index object gives each record's
``offset length`` (fetched whole once per process, bounded by the sample count and checked by its sha256), and each
record is read by the format's own code (framing and both CRC32Cs: every record's bytes, labels included, are
checked). An LMDB shard's B-tree and an HDF5 shard's metadata and chunk index are walked by ranges (:class:`_Pages`,
in :data:`TABLE_UNIT` units, bounded by :data:`TABLE_BYTES`) with the local readers' own checked code, which then
gives each record's or chunk's bytes. What follows is said for npy:

* **Bounds first.** Every range comes from the manifest (object size, sample count, shape and dtype), and is
  checked to lie inside the object before it is requested; nothing is sized from a server's answer. The data
  offset is ``size - n·row``; the ``.npy`` header in front of it is fetched (once per object and process,
  coalesced with sample 0 when that is read) and must declare exactly the manifest's shape and dtype.
* **Coalesced, parallel.** The ranges of one batch are sorted per object and merged where the gap between them is
  at most :data:`GAP_BYTES`; the merged requests run in parallel (:data:`PARALLEL` threads).
* **A small block LRU** in memory, bounded in bytes (:data:`BLOCK_CACHE_BYTES`, at most ``cache_limit``), keeps
  fetched blocks for samples read again soon; nothing is written to the cache folder but the manifest and the
  samples sidecars (small: per-sample records, for the pixel hashes).
* **Every byte checked.** A response of another length than asked (a truncated body, a 200 with the whole
  object instead of a 206) is an :class:`~shardkit.errors.IntegrityError` naming the object. Each object is
  opened once per process (its size must be the manifest's) and later range requests carry its ETag
  (``If-Match`` on S3): an object replaced mid-epoch fails instead of mixing versions. Each image is checked
  (stored losslessly) against its sample's pixel hash in the sidecar (``formats/samples.md``), each npy label
  against its sample's class bitmap there. npy labels have no per-sample hash in shardkit's records: a label object
  replaced by one of the same size *before* a process first opens it, whose samples keep their sets of classes,
  is not detected here (``verify=True`` hashes whole objects); TFRecord labels are covered by the record CRC.

Under ``remote_reads="auto"`` a split larger than ``cache_limit`` is read by :class:`PerBatchShards`, which holds
this source and the whole-shard one and chooses per batch: a sequential pass in whole shards, the rest by ranges.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, IntegrityError, ShardFormatError, ShardkitError
from ..files.samples import pixel_hash
from ..files.splitfiles import MAX_SIDE, ShardFile, ShardInfo
from ..files.storage import Remote
from ..files.storage import storage_error as wrap_error
from ..formats._lmdb_pages import LmdbLayoutError, overflow_problem, read_table_from
from ..formats.base import SampleSpec, ShardFormat, ShardReader
from ..formats.hdf5 import Hdf5Reader, _ChunkTable, chunk_tables
from ..formats.lmdb import LmdbReader
from ..formats.tfrecord import INDEX_LINE_BYTES, TfrecordReader
from ..store.derived import label_counts
from ..store.manifest import Manifest
from .cache import ShardCache
from .source import CachedShards, ShardSource

__all__ = ["PerBatchShards", "RangeStats", "RangedShards", "remote_source"]

log = logging.getLogger(__name__)

#: Ranges of one object at most this far apart are fetched in one request (the gap is read and dropped).
GAP_BYTES = 64 * 1024
#: Bytes of fetched blocks kept in memory per process (at most ``cache_limit``).
BLOCK_CACHE_BYTES = 64 << 20
#: Range requests of one batch in flight at once.
PARALLEL = 8
#: Largest ``.npy`` header accepted (numpy writes 64–128 bytes; version 1.0 allows 64 KiB).
MAX_HEADER = 65536
#: Bytes hashed per request when a ranged split is opened with ``verify=True``.
VERIFY_CHUNK = 8 << 20
#: Bytes fetched at once while an LMDB B-tree or HDF5 metadata is walked by ranges (aligned to this size).
TABLE_UNIT = 4096
#: Most bytes a shard's table walk (LMDB pages, HDF5 metadata and chunk index) may fetch: this much plus
#: :data:`TABLE_BYTES_PER_SAMPLE` per sample; a walk that needs more is a damaged or foreign file.
TABLE_BYTES = 4 << 20
TABLE_BYTES_PER_SAMPLE = 1024


@dataclass
class RangeStats:
    """What this process's range reads cost: requests sent, bytes fetched, bytes of samples handed out."""

    requests: int = 0
    fetched: int = 0
    used: int = 0
    batches: int = 0

    @property
    def amplification(self) -> float:
        """Bytes fetched ÷ bytes of samples used (1.0: nothing fetched that was not used)."""
        return self.fetched / self.used if self.used else 0.0


def ranged_format(fmt: type[ShardFormat], spec: SampleSpec, format_options: dict[str, Any]) -> str | None:
    """Why ``fmt``/``spec`` cannot be read by ranges (None when it can): npy, LMDB, HDF5 and uncompressed
    TFRecord can."""
    if fmt.name in ("npy", "lmdb", "hdf5"):
        return None
    if fmt.name == "tfrecord":
        compressed = format_options.get("compression") not in (None, "none")
        return "a gzip-compressed TFRecord shard has no per-record byte ranges" if compressed else None
    return f"{fmt.name} shards have no per-sample byte ranges in this version"


def remote_source(cache: ShardCache, fmt: type[ShardFormat], manifest: Manifest, spec: SampleSpec,
                  policy: str) -> ShardSource:
    """The source of a split on object storage under ``policy`` (``OpenOptions.remote_reads``), the choice logged.

    ``"auto"``: a split that fits in ``cache_limit`` (or has none), or cannot be read by ranges, is read in whole
    shards through the cache; a larger one that can be (npy, LMDB, HDF5, uncompressed TFRecord) is read by
    :class:`PerBatchShards`, which chooses per batch: whole shards for a sequential pass, ranges otherwise."""
    why_not = ranged_format(fmt, spec, manifest.format_options)
    size = sum(f.bytes for s in manifest.shards for f in s.files)
    if policy == "ranges":
        if why_not is not None:
            raise ConfigError(f"remote_reads='ranges': {why_not}", fix="use remote_reads='shards' (or 'auto')")
        log.info("%s: range reads per sample (remote_reads='ranges')", cache.remote.url)
        return RangedShards(cache, fmt, manifest, spec)
    if policy == "auto" and why_not is None and cache.limit is not None and size > cache.limit:
        log.info("%s: remote_reads='auto' chooses per batch (the split's %d bytes exceed cache_limit %d): a batch "
                 "of consecutive samples in order that starts a shard or goes on from a sequential one reads its "
                 "shards whole through the cache, any other batch (shuffled or sparse) and single samples read "
                 "by ranges", cache.remote.url, size, cache.limit)
        return PerBatchShards(cache, fmt, manifest, spec)
    if policy == "auto":
        log.info("%s: whole shards through the cache (remote_reads='auto': %s)", cache.remote.url,
                 why_not or ("no cache_limit" if cache.limit is None else "the split fits in cache_limit"))
    return CachedShards(cache, fmt, manifest, spec)


class _Object:
    """One object read by ranges in this process: opened once (size checked, its ETag pinned by the handle)."""

    def __init__(self, remote: Remote, f: ShardFile) -> None:
        self.remote, self.file, self.url = remote, f, remote.url_of(f.name)
        fs = remote.fs
        path = remote.path(f.name)
        self.handle: Any = None
        try:
            fs.invalidate_cache(path)  # the size and ETag of the object as it is now, not as listed earlier
            handle = fs.open(path, "rb", cache_type="none")
        except ShardkitError:
            raise
        except Exception as exc:  # botocore/aiohttp/fsspec errors share no base class
            raise _transfer_error(exc, self.url) from None
        if callable(getattr(handle, "_fetch_range", None)):  # buffered remote files (s3fs: If-Match on the ETag)
            self.handle, size = handle, int(getattr(handle, "size", -1))
        else:  # e.g. memory:// — plain ranged reads of the path
            handle.close()
            info = remote.info(f.name)
            size = int(info.get("size") or 0) if info is not None else -1
        if size != f.bytes:
            raise IntegrityError(f"the object is {size if size >= 0 else 'missing'} bytes, the manifest says "
                                 f"{f.bytes}: not read", path=self.url,
                                 fix="the object was changed or removed after conversion; re-open the split or "
                                     "re-convert it")
        self.path = path

    def close(self) -> None:
        if self.handle is not None:
            with contextlib.suppress(Exception):  # closing a read handle sends nothing; whatever it raises
                self.handle.close()

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` (already checked to lie in the object), exactly ``end - start`` of them."""
        try:
            if self.handle is not None:
                data = self.handle._fetch_range(start, end)
            else:
                data = self.remote.fs.cat_file(self.path, start=start, end=end)
        except ShardkitError:
            raise
        except Exception as exc:  # as above
            raise _transfer_error(exc, self.url) from None
        if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) != end - start:
            got = len(data) if isinstance(data, (bytes, bytearray, memoryview)) else type(data).__name__
            raise IntegrityError(f"asked for bytes {start}-{end - 1} ({end - start} bytes), the server sent {got}",
                                 path=self.url, fix="the server or a proxy truncated or ignored the range request; "
                                                    "retry, or read with remote_reads='shards'")
        return bytes(data)


def _transfer_error(exc: BaseException, url: str) -> ShardkitError:
    """A failed range request as one line; a changed object (S3 ``If-Match`` failed: 412) as an IntegrityError."""
    text = str(exc)
    if type(exc).__name__ == "FileExpired" or "PreconditionFailed" in text or "pre-conditions" in text:
        return IntegrityError("the object changed while it was being read (its ETag is not the one opened)",
                              path=url, fix="the split was re-published or overwritten mid-epoch; re-open it")
    return wrap_error(exc, "range read", url)


class _Fetcher:
    """The range requests of one process: coalescing, the parallel pool, the block LRU and the counters."""

    def __init__(self, remote: Remote, block_bytes: int) -> None:
        self.remote, self.block_bytes = remote, block_bytes
        self.stats = RangeStats()
        self._lock = threading.Lock()
        self._objects: dict[str, _Object] = {}
        self._blocks: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._held = 0
        self._pool: ThreadPoolExecutor | None = None

    def open(self, f: ShardFile) -> _Object:
        """Object ``f`` opened in this process (once: its size checked, its ETag pinned)."""
        with self._lock:
            obj = self._objects.get(f.name)
        if obj is None:
            new = _Object(self.remote, f)
            with self._lock:
                obj = self._objects.setdefault(f.name, new)
            if obj is not new:  # another thread opened it meanwhile
                new.close()
        return obj

    def _cached(self, name: str, start: int, end: int) -> bytes | None:
        for (n, a, b), data in self._blocks.items():
            if n == name and a <= start and end <= b:
                self._blocks.move_to_end((n, a, b))
                return data[start - a:end - a]
        return None

    def _keep(self, name: str, start: int, data: bytes) -> None:
        if len(data) > self.block_bytes:
            return
        self._blocks[(name, start, start + len(data))] = data
        self._held += len(data)
        while self._held > self.block_bytes:
            (_, a, b), _ = self._blocks.popitem(last=False)
            self._held -= b - a

    def close(self) -> None:
        """Close the objects' handles, stop the request threads and drop the blocks."""
        with self._lock:
            objects, self._objects = list(self._objects.values()), {}
            self._blocks.clear()
            self._held = 0
        for obj in objects:
            obj.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    @property
    def held(self) -> int:
        """Bytes in the block LRU now."""
        return self._held

    def get(self, wants: Sequence[tuple[ShardFile, int, int]], used: int, *, batch: bool = True) -> list[bytes]:
        """The bytes of each ``(file, start, end)`` (checked against the file's size first); ``used`` bytes of
        them are samples handed out (for the amplification count); ``batch``: counted as a batch read."""
        for f, a, b in wants:
            if not 0 <= a < b <= f.bytes:
                raise ShardFormatError(f"byte range {a}-{b} is outside the object's {f.bytes} bytes",
                                       path=self.remote.url_of(f.name), fix="the manifest is damaged; re-convert")
        out: list[bytes | None] = [None] * len(wants)
        misses: dict[str, list[int]] = {}
        with self._lock:
            for k, (f, a, b) in enumerate(wants):
                out[k] = self._cached(f.name, a, b)
                if out[k] is None:
                    misses.setdefault(f.name, []).append(k)
        requests: list[tuple[ShardFile, int, int, list[int]]] = []
        for ks in misses.values():
            ks.sort(key=lambda k: wants[k][1])
            f = wants[ks[0]][0]
            for k in ks:
                a, b = wants[k][1], wants[k][2]
                if requests and requests[-1][0] is f and a - requests[-1][2] <= GAP_BYTES:
                    last = requests[-1]
                    requests[-1] = (f, last[1], max(last[2], b), [*last[3], k])
                else:
                    requests.append((f, a, b, [k]))
        if requests:
            if len(requests) == 1:
                blocks = [self.open(requests[0][0]).read(requests[0][1], requests[0][2])]
            else:  # objects first opened here are opened in parallel too (one HEAD each)
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(PARALLEL, thread_name_prefix="shardkit-ranges")
                blocks = list(self._pool.map(lambda r: self.open(r[0]).read(r[1], r[2]), requests))
            with self._lock:
                self.stats.requests += len(requests)
                self.stats.fetched += sum(len(d) for d in blocks)
                for (f, a, _, ks), data in zip(requests, blocks, strict=True):
                    for k in ks:
                        out[k] = data[wants[k][1] - a:wants[k][2] - a]
                    self._keep(f.name, a, data)
        with self._lock:
            self.stats.used += used
            self.stats.batches += batch
        return [d if d is not None else b"" for d in out]


#: What a ranged reader asks for: (file, start, end) byte ranges.
Wants = list[tuple[ShardFile, int, int]]


class _Ranged(ShardReader):
    """What every ranged reader shares: no local files, errors naming the object, reads through the source's
    fetcher in two steps (:meth:`plan` the ranges, then turn the fetched bytes into :meth:`samples`), each
    image checked against its sample's pixel hash, and ``verify`` hashing whole objects by ranges."""

    source: RangedShards
    pos: int
    #: which of a shard's files holds its labels (named when a label is refused)
    label_file = 0

    def __init__(self, source: RangedShards, pos: int, shard: ShardInfo, spec: SampleSpec,
                 manifest: Manifest) -> None:
        self.source, self.pos = source, pos
        super().__init__(source.cache_folder, shard, spec, manifest.format_options, manifest.format_version)
        if spec.size is None:  # each sample's (H, W) checked against the manifest's, from the sidecar
            self.hw_source = functools.partial(_sidecar_hw, manifest, pos)

    def check_files(self) -> None:
        """Nothing local: each object's size is checked when this process first opens it (:class:`_Object`)."""

    def corrupt(self, problem: str, name: str | None = None) -> ShardFormatError:
        return ShardFormatError(" ".join(problem.split()),
                                path=self.source.remote.url_of(name or self.shard.files[0].name),
                                fix="the shard is damaged; re-convert this split")

    def plan(self, idx: Sequence[int]) -> tuple[Wants, list[int], int]:
        """The byte ranges samples ``idx`` (local, in range) need, what :meth:`samples` needs to know of them, and
        how many of their bytes are samples (for the amplification count)."""
        raise NotImplementedError

    def samples(self, idx: Sequence[int], data: Sequence[bytes], extra: Sequence[int]
                ) -> list[tuple[np.ndarray, np.ndarray]]:
        """The fetched bytes of :meth:`plan` as (image, stored label) arrays."""
        raise NotImplementedError

    def check_pixels(self, i: int, image: np.ndarray) -> None:
        """Refuse sample ``i`` whose image is not the one its pixel hash in the samples sidecar describes (images
        stored losslessly: a JPEG's decoded pixels differ from those hashed, by design)."""
        hashes = self.source.pixel_hashes(self.pos) if self.codecs.image.lossless else None
        if hashes is not None and pixel_hash(image) != bytes(hashes[i]):
            raise IntegrityError(f"sample {i}'s image bytes do not match its pixel hash in the samples sidecar",
                                 path=self.source.remote.url_of(self.shard.files[0].name),
                                 fix="the object was changed or damaged after conversion; re-convert this split")

    def check_classes(self, i: int, label: np.ndarray) -> None:
        """Refuse sample ``i`` whose label does not hold exactly the classes its sidecar's class bitmap records (no
        per-sample label hash exists; this catches a label replaced by another sample's or damaged, unless it
        keeps the same set of classes)."""
        presence = self.source.presence(self.pos)
        if presence is None:
            return
        counts = label_counts(self.spec, label, self.source.ignore)
        foreign = [v for v in np.flatnonzero(counts[self.spec.num_classes:]).tolist()
                   if v + self.spec.num_classes != self.source.ignore]
        if foreign:  # an id no class has (nor the ignore id): never handed out as a label
            raise IntegrityError(f"sample {i}'s label holds id {foreign[0] + self.spec.num_classes}, which is not "
                                 f"one of its {self.spec.num_classes} classes",
                                 path=self.source.remote.url_of(self.shard.files[self.label_file].name),
                                 fix="the object was changed or damaged after conversion; re-convert this split")
        have = counts[: self.spec.num_classes] > 0
        if not np.array_equal(have, presence[i]):
            raise IntegrityError(f"sample {i}'s label holds classes {np.flatnonzero(have).tolist()}, its samples "
                                 f"sidecar records {np.flatnonzero(presence[i]).tolist()}",
                                 path=self.source.remote.url_of(self.shard.files[self.label_file].name),
                                 fix="the object was changed or damaged after conversion; re-convert this split")

    def fetch(self, idx: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Samples ``idx`` (local, in range) as (image, stored label) arrays."""
        wants, extra, used = self.plan(idx)
        return self.samples(idx, self.source.fetcher.get(wants, used), extra)

    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= i < len(self):
            raise IndexError(f"local index {i} out of range for {len(self)} samples")
        return self.fetch([i])[0]

    def read_batch_into(self, local_indices: Sequence[int] | np.ndarray, out_images: np.ndarray,
                        out_labels: np.ndarray) -> None:
        idx = np.asarray(local_indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"local indices {idx.min()}..{idx.max()} out of range for {len(self)} samples")
        for k, (image, label) in enumerate(self.fetch(idx.tolist())):
            out_images[k], out_labels[k] = image, label

    def fixed_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        return None

    def prefetch(self, local_indices: Sequence[int] | np.ndarray, cold: bool = True) -> None:
        return None

    def verify_hashes(self) -> None:
        """Hash each object whole, by ranges of :data:`VERIFY_CHUNK` bytes, against the manifest's sha256."""
        for f in self.shard.files:
            h = hashlib.sha256()
            obj = self.source.fetcher.open(f)
            for a in range(0, f.bytes, VERIFY_CHUNK):
                h.update(obj.read(a, min(f.bytes, a + VERIFY_CHUNK)))
            if h.hexdigest() != f.sha256:
                raise IntegrityError(f"sha256 {h.hexdigest()[:12]}… differs from the manifest's {f.sha256[:12]}…",
                                     path=self.source.remote.url_of(f.name),
                                     fix="the object is corrupt; re-convert this split")


class RangedNpyReader(_Ranged):
    """One npy shard on object storage: sample ``j`` is row ``j`` of each array (fixed size), or its stretch of the
    flat arrays (variable size: the small ``shapes`` object is fetched whole first, its sha256 checked)."""

    file_counts = (2, 3)
    label_file = 1

    def __init__(self, source: RangedShards, pos: int, shard: ShardInfo, spec: SampleSpec,
                 manifest: Manifest) -> None:
        super().__init__(source, pos, shard, spec, manifest)
        #: per array file: (dtype, the array's shape, byte offset of its data); set on open for variable sizes
        self.layout: list[tuple[np.dtype, tuple[int, ...], int]] = []
        #: per array file: (n + 1,) byte offsets of the samples from the start of the data
        self.bounds: list[np.ndarray] = []
        self._shapes: np.ndarray | None = None
        self._checked: set[int] = set()
        if spec.size is not None:  # fixed size: everything from the manifest, refused now if it cannot fit
            n = shard.num_samples
            self._lay_out([spec.image_shape(spec.size), spec.label_shape(spec.size)],
                          [np.arange(n + 1, dtype=np.int64) * int(np.prod(spec.image_shape(spec.size))),
                           np.arange(n + 1, dtype=np.int64) * int(np.prod(spec.label_shape(spec.size)))], fixed=True)

    def _lay_out(self, sample_shapes: list[tuple[int, ...]], elements: list[np.ndarray], *, fixed: bool) -> None:
        """Set :attr:`layout` and :attr:`bounds` from each array's per-sample element offsets, checking that the
        manifest's object sizes hold exactly those bytes behind an ``.npy`` header."""
        layout, bounds = [], []
        n = self.shard.num_samples
        for f, dtype, shape, el in zip(self.shard.files[:2], (self.spec.stored_image_dtype,
                                                               self.spec.stored_label_dtype),
                                       sample_shapes, elements, strict=True):
            nbytes = el * dtype.itemsize
            offset = f.bytes - int(nbytes[-1])
            if not 10 <= offset <= MAX_HEADER:
                raise self.corrupt(f"the manifest's {f.bytes} bytes cannot hold {n} samples of "
                                   f"{int(nbytes[-1])} bytes behind an .npy header", f.name)
            layout.append((dtype, (n, *shape) if fixed else (int(el[-1]),), offset))
            bounds.append(nbytes)
        self.layout, self.bounds = layout, bounds

    def _open(self) -> None:
        self._checked = set()
        if self.spec.size is not None:
            return
        f = self.shard.files[2]
        if f.bytes > MAX_HEADER + 16 * len(self):
            raise self.corrupt(f"the sizes table is {f.bytes} bytes, more than {len(self)} samples need", f.name)
        raw = self.source.fetcher.get([(f, 0, f.bytes)], 0, batch=False)[0]
        if hashlib.sha256(raw).hexdigest() != f.sha256:
            raise IntegrityError("the sizes table's sha256 differs from the manifest's",
                                 path=self.source.remote.url_of(f.name), fix="re-convert this split")
        try:
            shapes = np.load(io.BytesIO(raw), allow_pickle=False)
        except (ValueError, EOFError, SyntaxError, TypeError, OSError) as exc:
            raise self.corrupt(f"not a readable sizes table ({exc})", f.name) from None
        if shapes.dtype.kind not in "iu" or shapes.shape != (len(self), 2) or (
                len(self) and not (shapes.min() >= 1 and shapes.max() <= MAX_SIDE)):
            raise self.corrupt(f"sample sizes {shapes.dtype}{shapes.shape} are not ({len(self)}, 2) integers in "
                               f"1..{MAX_SIDE}", f.name)
        shapes = np.asarray(shapes, dtype=np.int64)
        self.check_shapes_table(shapes, f.name)
        offsets = self.spec.flat_offsets(shapes)
        self._lay_out([(), ()], [offsets[:, 0], offsets[:, 1]], fixed=False)
        self._shapes = shapes

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_checked"] = set()
        if self.spec.size is None:  # laid out again from the sizes table in the next process
            state["layout"], state["bounds"], state["_shapes"] = [], [], None
        return state

    def _check_header(self, k: int, header: bytes) -> None:
        dtype, shape, offset = self.layout[k]
        f = self.shard.files[k]
        fp = io.BytesIO(header)
        try:
            version = np.lib.format.read_magic(fp)
            if version == (1, 0):
                got_shape, fortran, got_dtype = np.lib.format.read_array_header_1_0(fp, max_header_size=MAX_HEADER)
            elif version == (2, 0):
                got_shape, fortran, got_dtype = np.lib.format.read_array_header_2_0(fp, max_header_size=MAX_HEADER)
            else:
                raise ValueError(f".npy format {version[0]}.{version[1]} (read it with remote_reads='shards')")
        except (ValueError, SyntaxError, TypeError, EOFError) as exc:
            raise self.corrupt(f"not the .npy header of {shape} {dtype.str} ({exc})", f.name) from None
        if got_shape != shape or got_dtype != dtype or fortran or fp.tell() != offset:
            raise self.corrupt(f"the .npy header says {got_dtype.str}{got_shape} with data at byte {fp.tell()}, "
                               f"the manifest {dtype.str}{shape} at byte {offset}", f.name)
        self._checked.add(k)

    def plan(self, idx: Sequence[int]) -> tuple[Wants, list[int], int]:
        """The headers not yet checked in this process (their file numbers as the extra) first, then each sample's
        image and label bytes."""
        self.ensure_open()
        headers = [k for k in (0, 1) if k not in self._checked]
        wants = [(self.shard.files[k], 0, self.layout[k][2]) for k in headers]
        used = 0
        for i in idx:
            for k in (0, 1):
                offset, bounds = self.layout[k][2], self.bounds[k]
                a, b = int(bounds[i]), int(bounds[i + 1])
                wants.append((self.shard.files[k], offset + a, offset + b))
                used += b - a
        return wants, headers, used

    def samples(self, idx: Sequence[int], data: Sequence[bytes], extra: Sequence[int]
                ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Headers checked against the manifest, each image against its pixel hash."""
        for k, header in zip(extra, data, strict=False):
            self._check_header(k, header)
        data = data[len(extra):]
        out = []
        for j, i in enumerate(idx):
            hw = self.spec.size or (int(self._shapes[i, 0]), int(self._shapes[i, 1]))  # type: ignore[index]
            image = np.frombuffer(data[2 * j], self.layout[0][0]).reshape(self.spec.image_shape(hw))
            label = np.frombuffer(data[2 * j + 1], self.layout[1][0]).reshape(self.spec.label_shape(hw))
            self.check_pixels(i, image)
            self.check_classes(i, label)
            out.append((image, label))
        return out


def _sidecar_hw(manifest: Manifest, pos: int, _folder: Path) -> np.ndarray:
    """Shard ``pos``'s (H, W) per sample from its sidecar, wherever the cache keeps it (picklable, unlike a lambda)."""
    return manifest.samples.hw(pos)


class RangedTfrecordReader(_Ranged, TfrecordReader):
    """One uncompressed TFRecord shard on object storage: its index object is fetched whole (bounded, sha256
    checked) on first use in a process; each record is then fetched by range and read by the format's own code
    (framing and both CRC32Cs checked, the Example parsed and checked against the manifest)."""

    def _open(self) -> None:
        data, index = self.shard.files
        if index.bytes > INDEX_LINE_BYTES * len(self):
            raise self.corrupt(f"the index is larger than {len(self)} records need", index.name)
        raw = self.source.fetcher.get([(index, 0, index.bytes)], 0, batch=False)[0] if index.bytes else b""
        if hashlib.sha256(raw).hexdigest() != index.sha256:
            raise IntegrityError("the index object's sha256 differs from the manifest's",
                                 path=self.source.remote.url_of(index.name), fix="re-convert this split")
        try:
            lines = raw.decode("ascii").splitlines()
            table = np.array([[int(x) for x in ln.split()] for ln in lines], np.int64).reshape(-1, 2)
        except ValueError as exc:
            raise self.corrupt(f"cannot read the index ({exc})", index.name) from None
        starts, lengths = table[:, 0], table[:, 1]
        contiguous = np.array_equal(starts, np.cumsum(lengths) - lengths) and not np.any(lengths < 16)
        if len(lengths) != len(self) or not contiguous or int(lengths.sum()) != data.bytes:
            raise self.corrupt(f"the index ({len(lengths)} records, {int(lengths.sum())} bytes) disagrees with the "
                               f"manifest ({len(self)} samples, {data.bytes} bytes)", index.name)
        self._index = table
        self._starts, self._lengths = starts.tolist(), lengths.tolist()
        self._buf, self._view, self._layouts, self._encoded_ends = b"", memoryview(b""), {}, {}

    def plan(self, idx: Sequence[int]) -> tuple[Wants, list[int], int]:
        self.ensure_open()
        wants = [(self.shard.files[0], self._starts[i], self._starts[i] + self._lengths[i]) for i in idx]
        return wants, [], sum(self._lengths[i] for i in idx)

    def samples(self, idx: Sequence[int], data: Sequence[bytes], extra: Sequence[int]
                ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each record read by :class:`TfrecordReader` on its own bytes, then its image checked by pixel hash."""
        out = []
        for i, record in zip(idx, data, strict=True):
            one = object.__new__(type(self))  # this reader's state over one record's bytes, at offset 0 (not
            one.__dict__.update(self.__dict__)  # copy.copy: that goes through __getstate__, which drops it)
            one._buf, one._view, one._layouts, one._encoded_ends = record, memoryview(record), {}, {}
            one._starts, one._lengths = {i: 0}, {i: len(record)}  # read by index, as the lists are
            image, label = TfrecordReader.read(one, i)
            self.check_pixels(i, image)
            out.append((image, label))
        return out


class _Pages:
    """One object's bytes fetched in aligned units of :data:`TABLE_UNIT` as a table walk asks for them (an LMDB
    B-tree, HDF5 metadata), kept for that walk only; the walk's total is bounded (:data:`TABLE_BYTES`)."""

    def __init__(self, reader: _Ranged, f: ShardFile) -> None:
        self.reader, self.file, self.size = reader, f, f.bytes
        self.units: dict[int, bytes] = {}
        self.most = TABLE_BYTES + TABLE_BYTES_PER_SAMPLE * len(reader)

    def need(self, spans: Sequence[tuple[int, int]]) -> None:
        """Fetch the units holding byte spans ``(at, length)`` (clipped to the object) not fetched yet, in one go."""
        unit = TABLE_UNIT
        clipped = [(at, min(at + n, self.size)) for at, n in spans if at >= 0]
        want = sorted({u for at, end in clipped if end > at
                       for u in range(at // unit, (end - 1) // unit + 1)} - self.units.keys())
        if not want:
            return
        if (len(self.units) + len(want)) * unit > self.most:
            raise self.reader.corrupt(f"its tables need more than {self.most} bytes read (a damaged or foreign "
                                      "file)", self.file.name)
        wants = [(self.file, u * unit, min(self.size, (u + 1) * unit)) for u in want]
        for u, data in zip(want, self.reader.source.fetcher.get(wants, 0, batch=False), strict=True):
            self.units[u] = data

    def read(self, at: int, length: int) -> bytes:
        """Bytes ``[at, at + length)`` clipped to the object (as a file read would be)."""
        end = min(self.size, at + max(0, length))
        if at < 0 or end <= at:
            return b""
        self.need([(at, end - at)])
        first, unit = at // TABLE_UNIT, TABLE_UNIT
        data = b"".join(self.units[u] for u in range(first, (end - 1) // unit + 1))
        return data[at - first * unit : end - first * unit]


class _PagesFile(io.RawIOBase):
    """:class:`_Pages` as a read-only file object (what ``h5py.File`` reads HDF5 metadata through); the first
    shardkit error a read met is kept (HDF5 reports it as its own)."""

    def __init__(self, pages: _Pages) -> None:
        super().__init__()
        self.pages, self.pos = pages, 0
        self.error: ShardkitError | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = offset + (0 if whence == io.SEEK_SET else self.pos if whence == io.SEEK_CUR else self.pages.size)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer: Any) -> int:
        """Into HDF5's buffer; a failed request is kept for the caller (without its traceback, whose frames would
        keep views of HDF5's memory alive past its release) and HDF5 sees the end of the file."""
        with memoryview(buffer) as raw, raw.cast("B") as view:
            data = b""
            if self.error is None:
                try:
                    data = self.pages.read(self.pos, len(view))
                except ShardkitError as exc:
                    self.error = exc.with_traceback(None)
            view[: len(data)] = data
        self.pos += len(data)
        return len(data)


class _Pieces:
    """The fetched byte ranges of one plan indexed by their place in the object, as the HDF5 chunk tables
    slice the whole file (``whole[begin:end]``, a uint8 array)."""

    def __init__(self, reader: _Ranged, starts: Sequence[int], data: Sequence[bytes]) -> None:
        self.reader = reader
        self.pieces = {a: np.frombuffer(d, np.uint8) for a, d in zip(starts, data, strict=True)}

    def __getitem__(self, where: slice) -> np.ndarray:
        a, b = int(where.start), int(where.stop)
        piece = self.pieces.get(a)
        if piece is not None and b - a <= len(piece):
            return piece[: b - a]
        for start, piece in self.pieces.items():
            if start <= a and b <= start + len(piece):
                return piece[a - start : b - start]
        raise self.reader.corrupt(f"bytes {a}-{b} were not fetched")  # pragma: no cover - planned together


class RangedLmdbReader(_Ranged, LmdbReader):
    """One LMDB shard on object storage: its B-tree is walked by ranges (the same checked walk as a local read,
    :mod:`shardkit.formats._lmdb_pages`; a branch page's children fetched together), then each record is
    fetched alone, with its overflow page header in front (checked as locally), and decoded and checked by the
    format's own code."""

    def _open(self) -> None:
        f = self.shard.files[0]
        pages = _Pages(self, f)
        try:
            pages.need([(0, 2 * TABLE_UNIT)])  # both meta pages (4 KiB pages) in one request
            table = read_table_from(pages.read, f.bytes, len(self), pages.need)
        except LmdbLayoutError as exc:
            raise self.corrupt(f"not a readable LMDB shard: {exc}") from None
        meta = table.meta
        self.check_meta(pages.read(meta[0], meta[1] - meta[0]) if meta is not None else None, table,
                        self.source.remote.url_of(f.name))
        self._table = table

    def plan(self, idx: Sequence[int]) -> tuple[Wants, list[int], int]:
        """Each record's bytes, with the 16-byte overflow page header in front of it (its length the extra)."""
        self.ensure_open()
        table, f = self._table, self.shard.files[0]
        if table is None:  # pragma: no cover - _open sets it or raises
            raise self.corrupt("the shard is not open")
        wants: Wants = []
        extra: list[int] = []
        used = 0
        for i in idx:
            begin, end = (int(v) for v in table.ranges[i])
            if begin < 0:
                raise self.corrupt(f"sample {i} cannot be found in the LMDB B-tree (the file is damaged: "
                                   f"{table.problem or 'no such record'})")
            head = 16 if table.overflow_page(i) is not None else 0
            wants.append((f, begin - head, end))
            extra.append(head)
            used += end - begin
        return wants, extra, used

    def samples(self, idx: Sequence[int], data: Sequence[bytes], extra: Sequence[int]
                ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each record's overflow page header and record header checked, decoded, then its image checked by pixel
        hash and its label by class bitmap."""
        table, size = self._table, self.shard.files[0].bytes
        out = []
        for i, head, raw in zip(idx, extra, data, strict=True):
            problem = overflow_problem(raw[:head], table, i, size) if head and table is not None else None
            if problem is not None:
                raise self.corrupt(f"sample {i}: {problem}")
            image, label = self.decode_record(memoryview(raw)[head:], i)
            self.check_pixels(i, image)
            self.check_classes(i, label)
            out.append((image, label))
        return out


class RangedHdf5Reader(_Ranged, Hdf5Reader):
    """One HDF5 shard on object storage: h5py reads its metadata (attributes, dataset shapes, the chunk index)
    through ranges of the object, checked as a local open checks them; each sample's chunks are then fetched
    alone and copied (raw) or decoded by shardkit's bounded decoders, as a local read of the memory map is."""

    _source_file: _PagesFile | None = None

    def h5_source(self) -> Any:
        return self._source_file

    def _open(self) -> None:
        pages = _Pages(self, self.shard.files[0])
        pages.need([(0, 3 * TABLE_UNIT)])  # the superblock and the root group's headers: one request, not three
        source = self._source_file = _PagesFile(pages)
        failed: ShardkitError | None = None
        try:
            Hdf5Reader._open(self)
        except ShardkitError as exc:
            failed = source.error or exc  # a failed range request, else what is wrong with the file
        finally:
            if self._file is not None:  # an open that failed half-way: closed here, not at interpreter exit
                with contextlib.suppress(Exception):
                    self._file.close()
                self._file = None
            self._source_file = None
        if failed is not None:
            # raised bare: the chain of HDF5's own exception keeps h5py's frames (its file access property list,
            # which holds this Python file object) alive until the interpreter exits, where freeing them crashed
            # the process (SIGSEGV)
            failed.__context__ = failed.__cause__ = None
            raise failed.with_traceback(None)

    def _open_map(self, f: Any, images: Any, labels: Any) -> None:
        """The chunk tables from HDF5's index (no memory map); the h5py file is closed (samples never go through
        HDF5: its filters are unbounded)."""
        source = self._source_file
        try:
            tables = chunk_tables(f, (images, labels), self.shard.files[0].bytes, self)
        except (OSError, ValueError, RuntimeError, NotImplementedError, AttributeError, TypeError) as exc:
            if source is not None and source.error is not None:
                raise source.error from None
            tables = f"{type(exc).__name__}: {exc}"
        finally:
            with contextlib.suppress(Exception):  # a read-only file: closing sends and writes nothing
                f.close()
            self._file = None
        if isinstance(tables, str):
            raise self.corrupt(f"its chunks cannot be read by ranges: {tables}")
        self._chunks = tables

    def _ranges(self, i: int) -> tuple[list[tuple[int, int]], int]:
        """File byte ranges of sample ``i``'s image and label chunks (raw: exactly its rows), and how many of
        their bytes are the sample's (a compressed chunk shared by samples counts by its share of rows)."""
        chunks, out, used = self._chunks, [], 0
        if chunks is None:  # pragma: no cover - _open sets it or raises
            raise self.corrupt("the shard is not open")
        for k, name in enumerate(("images", "labels")):
            table = chunks[name]
            if self.spec.size is not None:
                a, b = table.sample_range(i)
                if a < 0:
                    raise self.corrupt(f"sample {i} {name}: chunk {i} is missing")
                out.append((a, b))
                used += b - a
                continue
            offsets = self._offsets
            if offsets is None:  # pragma: no cover - set on open for variable sizes
                raise self.corrupt("the shard is not open")
            r0, r1 = int(offsets[i, k]), int(offsets[i + 1, k])
            begins, ends = table.row_ranges(np.array([r0]), np.array([r1]))
            out.extend(zip(begins.tolist(), ends.tolist(), strict=True))
            if isinstance(table, _ChunkTable):  # raw: exactly the sample's rows
                used += int((ends - begins).sum())
                continue
            per = table.per_chunk
            for c in range(r0 // per, (r1 - 1) // per + 1) if r1 > r0 else ():
                rows = min(r1, (c + 1) * per) - max(r0, c * per)
                used += int(table.sizes[c]) * rows // per
        return out, used

    def plan(self, idx: Sequence[int]) -> tuple[Wants, list[int], int]:
        """Each sample's chunk ranges; the extra is each range's start (where :meth:`samples` finds it)."""
        self.ensure_open()
        f = self.shard.files[0]
        wants: Wants = []
        used = 0
        for i in idx:
            spans, n = self._ranges(i)
            wants.extend((f, a, b) for a, b in spans)
            used += n
        return wants, [a for _, a, _ in wants], used

    def samples(self, idx: Sequence[int], data: Sequence[bytes], extra: Sequence[int]
                ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each sample from its chunks (copied or decoded by the chunk tables), its image checked by pixel hash and
        its label by class bitmap."""
        whole: Any = _Pieces(self, extra, data)
        chunks = self._chunks
        if chunks is None:  # pragma: no cover - planned after open
            raise self.corrupt("the shard is not open")
        out = []
        for i in idx:
            if self.spec.size is not None:
                image, label = chunks["images"].sample(whole, i), chunks["labels"].sample(whole, i)
            else:
                offsets, shapes = self._offsets, self._shapes
                if offsets is None or shapes is None:  # pragma: no cover - set on open for variable sizes
                    raise self.corrupt("the shard is not open")
                (a0, b0), (a1, b1) = (int(v) for v in offsets[i]), (int(v) for v in offsets[i + 1])
                hw = (int(shapes[i, 0]), int(shapes[i, 1]))
                image = chunks["images"].rows(whole, a0, a1, i).reshape(self.spec.image_shape(hw))
                label = chunks["labels"].rows(whole, b0, b1, i).reshape(self.spec.label_shape(hw))
            self.check_pixels(i, image)
            self.check_classes(i, label)
            out.append((image, label))
        return out


class RangedShards(ShardSource):
    """A split on object storage read sample by sample with range requests (npy, LMDB, HDF5, uncompressed
    TFRecord): no shard is downloaded; a batch's samples are fetched in coalesced, parallel requests
    (:meth:`gather`)."""

    def __init__(self, cache: ShardCache, fmt: type[ShardFormat], manifest: Manifest, spec: SampleSpec) -> None:
        self.cache = cache
        self.remote = cache.remote
        self.cache_folder = cache.directory
        self.manifest = manifest
        #: the split's ignore id (class bitmaps count labels as the conversion did)
        self.ignore: int | None = manifest.classes.ignore_index
        limit = cache.limit if cache.limit is not None else BLOCK_CACHE_BYTES
        #: bytes of fetched blocks a process keeps in memory
        self.block_bytes = min(BLOCK_CACHE_BYTES, limit)
        fmt.check_version(manifest.format_version, cache.manifest)
        kind: Any = {"npy": RangedNpyReader, "lmdb": RangedLmdbReader, "hdf5": RangedHdf5Reader,
                               "tfrecord": RangedTfrecordReader}[fmt.name]
        self._readers: list[_Ranged] = [kind(self, pos, shard, spec, manifest)
                                        for pos, shard in enumerate(manifest.shards)]
        self._fetcher: _Fetcher | None = None
        self._pid = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fetcher"], state["_pid"] = None, 0
        return state

    @property
    def fetcher(self) -> _Fetcher:
        """This process's fetcher (a forked or spawned worker makes its own: handles and pools do not travel)."""
        if self._fetcher is None or self._pid != os.getpid():
            self._fetcher, self._pid = _Fetcher(self.remote, self.block_bytes), os.getpid()
        return self._fetcher

    @property
    def stats(self) -> RangeStats:
        """This process's request, byte and batch counts."""
        return self.fetcher.stats

    def release(self) -> None:
        """Close this process's object handles and request threads (``Dataset.close``); reads reopen them."""
        if self._fetcher is not None and self._pid == os.getpid():
            self._fetcher.close()

    def presence(self, pos: int) -> np.ndarray | None:
        """Shard ``pos``'s (n, num_classes) class bitmaps (None where the records keep none)."""
        if self.manifest.samples.inline is None and self.manifest.shards[pos].samples is None:
            return None
        return self.manifest.samples.presence(pos)

    def pixel_hashes(self, pos: int) -> np.ndarray | None:
        """Shard ``pos``'s per-sample pixel hashes (its sidecar, fetched into the cache folder once)."""
        if self.manifest.samples.inline is None and self.manifest.shards[pos].samples is None:
            return None
        return self.manifest.samples.pixel_hashes(pos)

    def reader(self, pos: int) -> ShardReader:
        return self._readers[pos]

    def __len__(self) -> int:
        return len(self._readers)

    def gather(self, shard: np.ndarray, local: np.ndarray, images: np.ndarray, stored: np.ndarray) -> bool:
        """Read a batch (shard positions ``shard``, local indices ``local``) into ``images``/``stored``: the ranges
        of every shard it draws from go out as one coalesced, parallel set of requests."""
        parts: list[tuple[_Ranged, list[int], list[int], list[int], int]] = []
        wants: Wants = []
        used = 0
        for pos in np.unique(shard).tolist():
            rows = np.flatnonzero(shard == pos).tolist()
            reader = self._readers[pos]
            idx = local[rows].tolist()
            more, extra, nbytes = reader.plan(idx)
            parts.append((reader, rows, idx, extra, len(more)))
            wants.extend(more)
            used += nbytes
        data = self.fetcher.get(wants, used)
        at = 0
        for reader, rows, idx, extra, count in parts:
            for k, (image, label) in zip(rows, reader.samples(idx, data[at:at + count], extra), strict=True):
                images[k], stored[k] = image, label
            at += count
        return True



class PerBatchShards(ShardSource):
    """A split on object storage read both ways, chosen per batch (``remote_reads="auto"`` for a split larger than
    ``cache_limit``): a sequential batch (:meth:`sequential`) reads its shards whole through the cache
    (:class:`~shardkit.read.source.CachedShards`: one request per shard file, within the cache's bound), any other
    batch by ranges (:class:`RangedShards`: nothing written but manifests and sidecars)."""

    def __init__(self, cache: ShardCache, fmt: type[ShardFormat], manifest: Manifest, spec: SampleSpec) -> None:
        self.cache = cache
        self.whole = CachedShards(cache, fmt, manifest, spec)
        self.ranged = RangedShards(cache, fmt, manifest, spec)
        self.starts = np.array([s.first_index for s in manifest.shards], np.int64)
        #: the split index after this process's last sequential batch (-1: none yet): a DataLoader worker reads
        #: every n-th batch of a sequential pass, so a later one continues it
        self.next_index = -1

    def sequential(self, shard: np.ndarray, local: np.ndarray) -> bool:
        """Whether a batch is a stretch of a sequential pass: its split indices follow each other in order, and
        it starts a shard, begins at or after the end of this process's last sequential batch, or begins in a
        shard held whole."""
        index = self.starts[shard] + local
        if not len(index) or not bool(np.all(np.diff(index) == 1)):
            return False
        return (int(local[0]) == 0 or 0 <= self.next_index <= int(index[0])
                or self.whole.resident(int(shard[0])))

    def reader(self, pos: int) -> ShardReader:
        """The held whole shard's reader when this process holds it, else the ranged one (a single sample)."""
        return self.whole.reader(pos) if self.whole.resident(pos) else self.ranged.reader(pos)

    @property
    def stats(self) -> RangeStats:
        """This process's range request, byte and batch counts (whole shards: ``cache.downloads``)."""
        return self.ranged.stats

    def resident(self, pos: int) -> bool:
        return self.whole.resident(pos)

    def __len__(self) -> int:
        return len(self.ranged)

    def release(self) -> None:
        self.whole.release()
        self.ranged.release()

    def gather(self, shard: np.ndarray, local: np.ndarray, images: np.ndarray, stored: np.ndarray) -> bool:
        """A sequential batch through the whole shards' readers, run by run (each shard fetched once and held);
        any other batch by ranges."""
        if not self.sequential(shard, local):
            return self.ranged.gather(shard, local, images, stored)
        self.next_index = int(self.starts[shard[-1]] + local[-1]) + 1
        cuts = (np.flatnonzero(shard[1:] != shard[:-1]) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, len(shard)], strict=True):
            self.whole.reader(int(shard[a])).read_batch_into(local[a:b], images[a:b], stored[a:b])
        return True
