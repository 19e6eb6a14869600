"""The framework-agnostic core reader: ``shardkit.open("out/train")`` → random access to samples.

Only numpy and the format's own library are used. Shard files are opened lazily in
the process that reads them, so a Dataset may be handed to forked or spawned workers.

Reading a batch costs as few I/O calls as the format allows: the indices are cut into runs
that fall in one shard, and each run is one ``ShardReader.read_batch_into`` call writing
straight into the caller's (or a reused) output buffer: a memory-mapped slice or fancy-index
copy for npy, one transaction for LMDB, hyperslabs for HDF5. Label outputs other than the
stored encoding are produced vectorised into the output buffer.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..codecs import encoding
from ..codecs.onehot import hot_channels
from ..errors import ConfigError, IntegrityError
from ..files.splitfiles import ShardInfo
from ..formats.base import SampleSpec, ShardReader
from ..formats.registry import get
from ..images.tiles import Tile
from ..store.manifest import Manifest
from ..store.stats import ENET_K, ClassFrequencies, class_weights, presence_contradiction, split_frequencies
from . import sampling as _sampling
from .options import EpochPlan, OpenOptions
from .residency import StorageReads
from .source import LocalShards, ShardSource, split_bytes
from .state import Progress

if TYPE_CHECKING:  # both import what a local split needs none of (the cache: multiprocessing, locks, …)
    from ..augment.ops import Normalize
    from ..store.source import ByteSource
    from .cache import ShardCache

log = logging.getLogger(__name__)

#: The fix of a split whose derived columns contradict its data.
_VERIFY_FIX = ("run shardkit verify on this split to list what disagrees, then re-convert it with --force; do not use "
               "datasets from untrusted sources")
#: Runs of at least this many samples of one shard are gathered with one np.take, shorter ones row by row.
TAKE_RUN = 8


Batch = tuple[np.ndarray, np.ndarray]


class Dataset:
    """A converted split. ``ds[i]`` → (image (H, W, C) in its stored type, label); ``ds.batch(idx)`` → stacked
    arrays. Images are (H, W, 3) uint8 RGB unless the split stores another type or band count
    (:attr:`image_dtype`, :attr:`bands`).

    Opened with ``options``, an :class:`~shardkit.read.options.OpenOptions`, or its fields as keywords
    (``Dataset(path, labels="onehot")``). ``labels``: ``"ids"`` (H, W) class ids, ``"onehot"`` (H, W, C) uint8,
    ``"float_onehot"`` (H, W, C) float32, or ``"stored"`` (the stored encoding as is). ``label_layout=
    "channels_first"`` gives one-hot outputs as (C, H, W). ``verify=True`` checks every
    shard's sha256 against the manifest on open. Arrays from ``ds[i]`` may be read-only views
    of the shard (zero-copy); arrays from :meth:`batch` are the caller's.

    ``path`` may be an fsspec URL (``s3://bucket/out/train``): shards are then fetched whole on first use
    into a local cache (``cache_dir``, at most ``cache_limit`` bytes such as ``"20GB"``; see
    :mod:`shardkit.read.cache`), with ``storage_options`` for fsspec (endpoint, credentials), and served by
    the format's own readers on the cached copies (:mod:`shardkit.read.source`) — or, for a split larger than
    ``cache_limit`` (``remote_reads``), read sample by sample with range requests for shuffled or sparse batches
    (:mod:`shardkit.read.ranges`).

    A Dataset is a snapshot: it reads the version of the split it opened (``version=N`` opens the kept
    publish ``manifest-v<N>.json``; by default the current one) until it is opened again, whatever a
    convert publishes meanwhile; its worker processes (forked or spawned) read the same version. On a local
    folder it takes a reader lease on that version (formats/manifest.md, "Versions"), so a publish does not
    remove its files while this process lives.
    """

    def __init__(self, path: str | os.PathLike[str], options: OpenOptions | None = None, **fields: Any) -> None:
        try:
            opts = options if options is not None else OpenOptions(**fields)
        except TypeError as exc:  # an unknown keyword: named the way Python names it
            raise TypeError(f"Dataset() {str(exc).split('() ', 1)[-1]}") from None
        if options is not None and fields:
            raise ConfigError(f"pass either options= or the keywords {', '.join(fields)}, not both",
                              fix="put them into the OpenOptions: options.replace(...)")
        #: how this split was opened (:class:`~shardkit.read.options.OpenOptions`)
        self.options = opts
        label_layout = opts.label_layout or "channels_last"
        # channels_first one-hot ((…, C, H, W)) is what PyTorch wants; both layouts are built by
        # shardkit.codecs.onehot (without numba, channels_first is ~2x faster to build).
        self.label_layout = label_layout
        #: where this split's bytes come from (:class:`~shardkit.store.source.ByteSource`): the local folder (and
        #: the reader lease on its version), or the split on object storage with its cache
        self.byte_source: ByteSource = split_bytes(path, opts)
        #: the cache of a split on object storage (None for a local folder)
        self.cache: ShardCache | None = cast("ShardCache | None", self.byte_source.files)
        self.path = self.byte_source.folder
        #: the split's typed manifest (:class:`~shardkit.store.manifest.Manifest`; formats/manifest.md): sample
        #: spec, class table, shards, stats, the version read
        self.manifest: Manifest = self.byte_source.manifest
        self.spec = SampleSpec.from_manifest(self.manifest.sample)
        self.labels = labels = opts.labels
        #: the class id a loss must skip (``nn.CrossEntropyLoss(ignore_index=...)``, Keras ``ignore_class=``):
        #: CamVid's 11 (Unlabelled), often 255; None when the split has none
        self.ignore_index: int | None = self.manifest.classes.ignore_index
        #: The label encoding this reader outputs (``labels=`` as an encoding; the stored one for
        #: ``"stored"``, and for ``"ids"`` of index storage: then labels are read as they are).
        self.output: encoding.LabelEncoding = encoding.reader_output(
            labels, self.spec.encoding, self.spec.label_dtype, channels_first=label_layout == "channels_first",
            ignore_index=self.ignore_index)
        #: the format's facts (:class:`~shardkit.formats.base.ShardFormat`): versions, access pattern, …
        self.format_info = get(self.manifest.format)
        self.format_info.check_version(self.manifest.format_version, self.path / "manifest.json")
        #: the shard readers (:mod:`shardkit.read.source`): each the format's own reader on local files, a remote
        #: split's fetched through its cache (the same fast paths), or range reads
        if self.cache is not None:  # imported here: a local split never loads the object-storage modules
            from .ranges import remote_source

            self.source: ShardSource = remote_source(self.cache, self.format_info, self.manifest, self.spec,
                                                     opts.remote_reads)
        else:
            self.source = LocalShards(self.path, self.format_info, self.manifest, self.spec)
        self._starts = np.array([s.first_index for s in self.manifest.shards], dtype=np.int64)
        self._local = threading.local()
        self._sizes: Counter[tuple[int, int]] | None = None
        self._freqs: ClassFrequencies | None = None
        self._repeats: dict[tuple[str, float], np.ndarray] = {}
        if opts.verify:
            for r in self.readers:
                r.verify_hashes()

    @property
    def readers(self) -> list[ShardReader]:
        """Every shard's reader, in manifest order (a split on object storage fetches every shard)."""
        return self.source.readers()

    # ------------------------------------------------------------------ facts
    def __len__(self) -> int:
        """The number of samples in the split (of the version opened)."""
        return self.manifest.num_samples

    @property
    def version(self) -> int | None:
        """The publish number of the split version this reader reads (None for a split written before
        versions existed)."""
        return self.manifest.version

    def close(self) -> None:
        """Give up this reader's lease on its version (also done when the Dataset is garbage-collected or
        the process exits) and, for a split on object storage, its pins on cached shards (so that other
        splits may evict them) and its read-through folders; reading afterwards still works while the version
        is kept."""
        self.source.release()
        self.byte_source.close()

    @property
    def location(self) -> str:
        """The split's URL (object storage) or local folder."""
        return self.byte_source.location

    def __repr__(self) -> str:
        size = "x".join(map(str, self.spec.size)) if self.spec.size else "variable size"
        return (f"<shardkit.Dataset {self.location} {self.manifest.format} {len(self)} samples {size} "
                f"labels={self.labels}>")

    @property
    def num_classes(self) -> int:
        """Class ids ``0 .. num_classes-1`` of the class table, the ignore class included when its id is one of
        them (CamVid: 12, ignore 11). The output size of a model trained on ``labels="ids"``; a one-hot target
        has :attr:`onehot_channels` channels instead."""
        return self.spec.num_classes

    @property
    def onehot_channels(self) -> int:
        """Channels of the one-hot outputs (and of a model's logits): the classes less the ignore class when
        its id is one of them (CamVid: 11 of 12; :mod:`shardkit.codecs.onehot`)."""
        return hot_channels(self.num_classes, self.ignore_index)

    @property
    def format(self) -> str:
        """The shard format: ``"npy"``, ``"lmdb"``, ``"hdf5"`` or ``"tfrecord"``."""
        return self.manifest.format

    @property
    def random_access(self) -> bool:
        """False for formats read front to back (TFRecord): they get the shard-then-buffer shuffle."""
        return self.format_info.random_access

    @property
    def shard_sizes(self) -> list[int]:
        """Samples in each shard, in manifest order."""
        return [s.num_samples for s in self.manifest.shards]

    @property
    def class_names(self) -> list[str]:
        """The class names by id (``class_names[i]`` names id ``i``), from the manifest's class table."""
        return self.manifest.classes.names()  # in id order (ClassTable checks it)

    @property
    def class_colours(self) -> list[tuple[int, int, int] | None]:
        """RGB colour of each class id (None where the source gave none)."""
        out: list[tuple[int, int, int] | None] = [None] * self.num_classes
        for c in self.manifest.classes.classes:
            if 0 <= c.id < self.num_classes and c.colour:
                out[c.id] = c.colour
        return out

    @property
    def image_dtype(self) -> np.dtype:
        """The element type of the stored images (native byte order): uint8, uint16, int16 or float32."""
        return self.spec.stored_image_dtype.newbyteorder("=")

    @property
    def bands(self) -> int:
        """Channels (bands) of each stored image: 3 for RGB."""
        return self.spec.image_channels

    @property
    def mean(self) -> np.ndarray:
        """Per-band image mean on the stored values' scale (0–255 for uint8), over source pixels (not
        padding), from the manifest's stats: one value per band."""
        mean = self.manifest.stats.image_mean
        return np.asarray([0.0] * self.bands if mean is None else mean, dtype=np.float32)

    @property
    def std(self) -> np.ndarray:
        """Per-band image standard deviation on the stored values' scale (never 0): one value per band."""
        std = np.asarray([1.0] * self.bands if self.manifest.stats.image_std is None else self.manifest.stats.image_std,
                         dtype=np.float32)
        return np.where(std > 0, std, 1.0).astype(np.float32)

    @property
    def label_dtype(self) -> np.dtype:
        """dtype of the label output asked for."""
        return self.output.dtype

    def label_shape(self, hw: tuple[int, int]) -> tuple[int, ...]:
        """Shape of one label output of height/width ``hw``."""
        return self.output.shape(hw)

    @property
    def channels_first(self) -> bool:
        """True when one-hot label outputs are (…, C, H, W)."""
        return self.output.channels_first

    def key(self, i: int) -> str:
        """Sample ``i``'s key: its image path relative to the input root (``train/0001TP_006690.png``), what the
        adapters' ``with_keys`` yield (formats/samples.md)."""
        return str(self.manifest.samples[i]["key"])

    def tile(self, i: int) -> Tile:
        """Sample ``i``'s provenance in a split converted with ``--tile``: its source key and region
        (:class:`~shardkit.images.tiles.Tile`; what :func:`shardkit.images.tiles.stitch` takes). A ConfigError
        otherwise."""
        tile = Tile.from_record(self.manifest.samples[i])
        if tile is None:
            raise ConfigError(f"sample {i} of {self.location} is not a tile: the split was converted without --tile",
                              fix="convert with --tile HxW to store tiles with their provenance")
        return tile

    def tiles(self) -> list[Tile]:
        """Every sample's :meth:`tile`, in order (reads each shard's sidecar once)."""
        return [self.tile(i) for i in range(len(self))]

    def locate(self, i: int) -> tuple[int, int]:
        """Global index → (shard number, local index)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples")
        i %= n
        s = int(np.searchsorted(self._starts, i, side="right") - 1)
        return s, i - int(self._starts[s])

    # ------------------------------------------------------------------ samples
    def __getitem__(self, i: int | slice) -> Batch:
        """Sample ``i`` (negative counts from the end) as ``(image, label)``; a slice ``ds[a:b]`` (any step) is
        the stacked batch :meth:`batch` reads for those indices, as numpy slices an array. The arrays of npy
        shards are read-only views of the memory-mapped files: ``np.array(x)`` copies one to write into."""
        if isinstance(i, slice):
            return self.batch(range(len(self))[i])
        try:
            k = operator.index(i)
        except TypeError:
            raise TypeError(f"a Dataset index is an integer or a slice (ds[5], ds[0:8]), not {type(i).__name__}; "
                            "read a list of indices with ds.batch([...])") from None
        s, j = self.locate(k)
        image, stored = self.source.reader(s).read(j)
        return self._as_sample_shape(image, self.convert_label(stored))

    def _as_sample_shape(self, images: np.ndarray, labels: np.ndarray) -> Batch:
        """3-D samples (volume patches, ``spec.depth``) as (…, D, H, W, C) / (…, D, H, W) views of their stored
        (…, D * H, W, …) arrays (the same bytes); 2-D samples as they are."""
        volume = self.spec.volume_shape
        if volume is None:
            return images, labels
        d, h, _ = volume
        lead = images.ndim - 3  # 0 for one sample, 1 for a batch

        def split(a: np.ndarray) -> np.ndarray:  # the first (D * H, W) axis pair after the batch axis → (D, H, W)
            at = next(k for k in range(lead, a.ndim - 1) if a.shape[k] == d * h and a.shape[k + 1] == volume[2])
            return a.reshape(*a.shape[:at], d, h, *a.shape[at + 1:])

        return split(images), split(labels)

    def require_2d(self, what: str) -> None:
        """A one-line ConfigError when this split holds 3-D samples and ``what`` (an adapter, augmentation) takes
        2-D ones only: refused, never flattened."""
        volume = self.spec.volume_shape
        if volume is not None:
            raise ConfigError(f"{self.location} holds 3-D patch samples ({'x'.join(map(str, volume))} voxels, "
                              f"{self.bands} bands); {what} takes 2-D samples only",
                              fix="read 3-D samples with ds[i], ds.batch(indices) or ds.iter_batches(...), or "
                                  "convert the volumes into slices (--slices) for 2-D training")

    def __iter__(self) -> Iterator[Batch]:
        """Every sample ``(image, label)`` in order, as ``ds[i]`` reads it."""
        for i in range(len(self)):
            yield self[i]

    def convert_label(self, stored: np.ndarray) -> np.ndarray:
        """Stored encoding (one sample or a batch) → the label output asked for, in a new array if needed."""
        if self.output is self.spec.encoding:
            return stored
        out = np.empty(self.output.batch_shape(self.spec.encoding.lead_shape(stored.shape)), self.output.dtype)
        self._convert_into(stored, out)
        return out

    def _convert_into(self, stored: np.ndarray, out: np.ndarray) -> None:
        """Vectorised stored → output conversion, written into ``out`` (no per-class loop)."""
        encoding.transcode_into(self.spec.encoding, self.output, stored, out, self.ignore_index)

    # ------------------------------------------------------------------ batches
    def require_fixed_size(self) -> tuple[int, int]:
        """The (H, W) every sample of this split has; a ConfigError when sizes differ (batching needs one), or when
        the samples are 3-D (:meth:`require_2d`: what asks for (H, W) takes 2-D samples).
        """
        self.require_2d("a reader of (H, W) samples")
        return self._fixed_size()

    def _fixed_size(self) -> tuple[int, int]:
        """The stored (H, W) every sample of this split has ((D * H, W) for 3-D samples); a ConfigError when sizes
        differ (batching needs one).

        A split converted without ``--size`` whose samples happen to share one size (e.g. CamVid's
        360x480) batches as it is, read sample by sample into the batch.
        """
        if self.spec.size is not None:
            return self.spec.size
        sizes = self.sample_sizes()
        if len(sizes) == 1:
            return next(iter(sizes))
        common = ", ".join(f"{h}x{w} ({n})" for (h, w), n in sizes.most_common(3))
        raise ConfigError(
            f"batching needs samples of one size, but this split's {len(self)} samples have {len(sizes)} sizes "
            f"(e.g. {common})",
            fix="augment with a pipeline that ends in a crop (augment='…,crop=HxW'), read samples one by one with "
            "ds[i], or convert with --size HxW")

    def sample_sizes(self) -> Counter[tuple[int, int]]:
        """How many samples of each (H, W) the split holds (from the manifest; sidecars read shard by shard)."""
        if self._sizes is None:  # counted aside, then published whole: another thread never sees a partial count
            sizes: Counter[tuple[int, int]] = Counter()
            if self.spec.size is not None:  # fixed size: no record needed
                sizes.update({self.spec.size: len(self)} if len(self) else {})
            else:
                for pos in range(len(self.manifest.shards)):
                    sizes.update(map(tuple, self.manifest.samples.hw(pos).tolist()))
            self._sizes = sizes
        return self._sizes

    def batch_layout(self, batch_size: int) -> tuple[tuple[tuple[int, ...], np.dtype], ...]:
        """((images shape, dtype), (labels shape, dtype)) of a batch of ``batch_size`` samples (3-D samples:
        (B, D, H, W, C) and (B, D, H, W, …))."""
        (ishape, idt), (lshape, ldt) = self._stored_layout(batch_size)
        volume = self.spec.volume_shape
        if volume is not None:
            ishape, lshape = (batch_size, *volume, *ishape[3:]), (batch_size, *volume, *lshape[3:])
        return (ishape, idt), (lshape, ldt)

    def _stored_layout(self, batch_size: int) -> tuple[tuple[tuple[int, ...], np.dtype], ...]:
        hw = self._fixed_size()
        return (((batch_size, *self.spec.image_shape(hw)), self.image_dtype),
                ((batch_size, *self.label_shape(hw)), self.label_dtype))

    def empty_batch(self, batch_size: int) -> Batch:
        """Fresh (images, labels) output arrays for ``batch_size`` samples, to pass as ``out=``."""
        (ishape, idt), (lshape, ldt) = self.batch_layout(batch_size)
        return np.empty(ishape, idt), np.empty(lshape, ldt)

    def _empty_stored(self, batch_size: int) -> Batch:
        (ishape, idt), (lshape, ldt) = self._stored_layout(batch_size)
        return np.empty(ishape, idt), np.empty(lshape, ldt)

    def _indices(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise ConfigError(f"batch indices must be a flat sequence of integers, not {idx.dtype} "
                              f"{idx.shape}")
        idx = idx.astype(np.int64, copy=False)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            bad = int(idx[(idx < -n) | (idx >= n)][0])
            raise IndexError(f"sample {bad} out of range for {n} samples")
        return np.where(idx < 0, idx + n, idx)

    def _check_out(self, out: Batch, b: int, hw: tuple[int, int]) -> Batch:
        try:
            images, labels = out
        except (TypeError, ValueError):
            raise ConfigError("out= must be a pair (images, labels) from empty_batch()") from None
        want = (((b, *self.spec.image_shape(hw)), self.image_dtype), ((b, *self.label_shape(hw)), self.label_dtype))
        for arr, (shape, dtype), what in zip((images, labels), want, ("images", "labels"), strict=True):
            if (not isinstance(arr, np.ndarray) or arr.ndim != len(shape) or arr.shape[0] < b
                    or arr.shape[1:] != shape[1:] or arr.dtype != dtype or not arr.flags.c_contiguous
                    or not arr.flags.writeable):
                got = f"{arr.shape} {arr.dtype}" if isinstance(arr, np.ndarray) else type(arr).__name__
                raise ConfigError(f"out {what} is {got}, expected a writable C-contiguous ({b}+, "
                                  f"{', '.join(map(str, shape[1:]))}) {dtype} array",
                                  fix="allocate it with ds.empty_batch(batch_size)")
        return images[:b], labels[:b]

    def _scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A per-thread reusable array of at least ``shape`` (stored labels awaiting conversion)."""
        buf = getattr(self._local, "buf", None)
        need = int(np.prod(shape)) * dtype.itemsize
        if buf is None or buf.nbytes < need:
            buf = self._local.buf = np.empty(need, np.uint8)
        return buf[:need].view(dtype).reshape(shape)

    def read_stored_into(self, indices: np.ndarray, images: np.ndarray, stored: np.ndarray) -> None:
        """Read validated global ``indices`` into ``images``/``stored`` (stored labels).

        A run is a stretch of consecutive positions whose samples lie in the same shard. Shards that
        expose plain arrays (:meth:`ShardReader.fixed_arrays`, npy) are gathered row by row — a
        shuffled batch of a split with many shards has runs of one or two samples, and a per-run
        call with its checks cost up to a fifth of the copy time — and long runs in one ``np.take``;
        other formats get one ``read_batch_into`` per run (sorted batches give one run per shard). A remote
        split's runs are read shard by shard, so that a shard read through is fetched once per batch.
        """
        if not len(indices):
            return
        shard = np.searchsorted(self._starts, indices, side="right") - 1
        local = indices - self._starts[shard]
        if self.source.gather(shard, local, images, stored):  # range reads: the batch's requests planned together
            return
        cuts = (np.flatnonzero(shard[1:] != shard[:-1]) + 1).tolist()
        rows = local.tolist()
        runs = list(zip([0, *cuts], [*cuts, len(indices)], strict=True))
        remote = self.source.cache is not None
        if remote:  # each shard's runs together: a read-through shard is fetched once per batch, not once a run
            runs.sort(key=lambda run: int(shard[run[0]]))
        reads = self._storage_reads()
        reader_of = self.source.reader
        if reads.begin():  # the last batch read from storage: queue all of this one's reads first
            for a, b in runs:
                if not remote or self.source.resident(int(shard[a])):  # hints never fetch a remote shard
                    reader_of(int(shard[a])).prefetch(local[a:b])
        for a, b in runs:
            reader = reader_of(int(shard[a]))
            arrays = reader.fixed_arrays()
            if arrays is None:
                reader.read_batch_into(local[a:b], images[a:b], stored[a:b])
            elif b - a >= TAKE_RUN:  # local indices are in range: derived from validated global ones
                np.take(arrays[0], local[a:b], axis=0, out=images[a:b], mode="clip")
                np.take(arrays[1], local[a:b], axis=0, out=stored[a:b], mode="clip")
            else:
                src_images, src_labels = arrays
                for k in range(a, b):
                    images[k] = src_images[rows[k]]
                    stored[k] = src_labels[rows[k]]
        reads.end()

    def _storage_reads(self) -> StorageReads:
        """This thread's :class:`~shardkit.read.residency.StorageReads` (whether to hint the next batch)."""
        reads = getattr(self._local, "reads", None)
        if reads is None:
            reads = self._local.reads = StorageReads()
        return reads

    def batch(self, indices: Sequence[int] | np.ndarray, out: Batch | None = None) -> Batch:
        """Stacked (images (B, H, W, C) in the stored type, labels (B, …)) of fixed-size samples, in ``indices`` order.

        ``out`` = (images, labels) arrays with room for at least B samples (a previous call's result)
        are filled and returned as views ``[:B]``: reusing them saves one allocation per batch.
        Without ``out`` fresh arrays are returned.
        """
        hw = self._fixed_size()
        idx = self._indices(indices)
        b = len(idx)
        if out is not None and self.spec.volume_shape is not None:  # 3-D out arrays: their stored-shape views
            out = self._stored_views(out)
        images, labels = self._check_out(out, b, hw) if out is not None else self._empty_stored(b)
        if self.output is self.spec.encoding:  # labels read as stored
            self.read_stored_into(idx, images, labels)
        else:
            stored = self._scratch((b, *self.spec.label_shape(hw)), self.spec.stored_label_dtype)
            self.read_stored_into(idx, images, stored)
            self._convert_into(stored, labels)
        return self._as_sample_shape(images, labels)

    def _stored_views(self, out: Batch) -> Batch:
        """3-D ``out`` arrays (from :meth:`empty_batch`) as the (B, D * H, W, …) arrays samples are stored as."""
        try:
            images, labels = out
            d, h, _ = self.spec.volume_shape  # type: ignore[misc]
            return (images.reshape(images.shape[0], d * h, *images.shape[3:]),
                    labels.reshape(labels.shape[0], d * h, *labels.shape[3:]))
        except (TypeError, ValueError, AttributeError):
            raise ConfigError("out= must be a pair (images, labels) from empty_batch()") from None

    def normalize(self, images: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``(images - mean) / std`` as float32 (channels last), written into ``out`` when given."""
        return self.normalizer.numpy(images, out)

    @property
    def normalizer(self) -> Normalize:
        """This split's normalisation as a pipeline op: ``A.Normalize(ds.mean, ds.std)``."""
        from ..augment.ops import Normalize

        return Normalize(self.mean, self.std)

    # ------------------------------------------------------------------ class balance
    def class_frequencies(self) -> ClassFrequencies:
        """Per-class pixel counts, and image pixels and images per class, from the manifest and the samples
        sidecars: no label is read (a remote split downloads only its sidecars). Cached."""
        if self._freqs is None:
            self._freqs = split_frequencies(self.manifest)
        return self._freqs

    def class_weights(self, method: str = "median_frequency", *, k: float = ENET_K) -> np.ndarray:
        """Loss weights, float32 of ``num_classes``: ``"median_frequency"``, ``"inverse"``, ``"inverse_sqrt"`` or
        ``"enet"`` (formulae: :func:`shardkit.store.stats.class_weights`, docs/class-imbalance.md). The ignore class and
        classes without pixels get 0. E.g. ``torch.nn.CrossEntropyLoss(weight=torch.from_numpy(w))``."""
        return class_weights(method, self.class_frequencies(), k=k)

    def repeat_factors(self, sampling: str = "class-balanced") -> np.ndarray:
        """Each sample's repeat factor (float64) for ``sampling`` (``"class-balanced[:T]"``: DAFormer's rare class
        sampling; ``"repeat-factor[:t]"``: LVIS; :mod:`shardkit.read.sampling`), from the manifest's class pixel
        counts and the class bitmaps in the sidecars; a ConfigError where the split keeps none (more than 256
        classes)."""
        mode, param = _sampling.parse_sampling(sampling)
        if mode == "uniform" or param is None:
            return np.ones(len(self), np.float64)
        if (mode, param) not in self._repeats:
            freqs = self.class_frequencies()
            if freqs.images is None:
                raise ConfigError(f"sampling={sampling!r} needs the per-sample class bitmap, which splits of more "
                                  f"than 256 classes ({self.num_classes} here) do not keep",
                                  fix="use sampling='uniform' (and class weights: ds.class_weights('enet'))")
            why = presence_contradiction(freqs)
            if why is not None:  # zeroed or forged bitmaps: refused, not an epoch of nothing or of the wrong samples
                raise IntegrityError(f"sampling={sampling!r} cannot trust this split's class bitmaps: {why}",
                                     path=self.byte_source.manifest_path, fix=_VERIFY_FIX)
            if mode == "repeat-factor":
                per_class = _sampling.class_repeat_factors(freqs.images, freqs.num_images, param, freqs.valid())
            else:
                per_class = _sampling.rare_class_factors(freqs.class_pixels, freqs.images, freqs.num_images, param,
                                                         freqs.valid())
            combine = "max" if mode == "repeat-factor" else "sum"

            present = cast(np.ndarray, self.class_presence(missing_as_absent=True))  # never None with the flag
            ends = np.cumsum(self.shard_sizes).tolist()  # per shard, as the factors have always been computed
            repeats = np.concatenate([_sampling.sample_repeat_factors(present[a:b], per_class, combine)
                                      for a, b in zip([0, *ends[:-1]], ends, strict=True)] or [np.zeros(0)])
            if len(repeats) and not _sampling.epoch_length(repeats):
                raise IntegrityError(f"sampling={sampling!r} would draw 0 samples per epoch: no sample's class bitmap "
                                     "holds a class with pixels that counts (the ignore class never does)",
                                     path=self.byte_source.manifest_path, fix=_VERIFY_FIX)
            self._repeats[(mode, param)] = repeats
        return self._repeats[(mode, param)]

    def _sidecar_column(self, read: Callable[[Any, int], np.ndarray | None],
                        missing: Callable[[ShardInfo], np.ndarray] | None, empty: np.ndarray) -> np.ndarray | None:
        """One sidecar column over the whole split, shard by shard: ``read(table, pos)`` per shard (a remote split's
        sidecars held through its byte source); a shard that keeps none gives ``missing(shard)``, or without
        ``missing`` the whole answer is None."""
        parts = []
        for pos, shard in enumerate(self.manifest.shards):
            got = read(self.manifest.samples, pos)
            if got is None:
                if missing is None:
                    return None
                got = missing(shard)
            parts.append(got)
        return np.concatenate(parts) if parts else empty

    def look_hashes(self) -> np.ndarray | None:
        """(samples, 8) uint8: each sample's look hash (formats/samples.md ``looks``: 64 bits that stay nearly
        equal when an image is re-encoded or resized), from the sidecars; None where a shard keeps none (converted
        before the column)."""
        return self._sidecar_column(lambda table, pos: table.look_hashes(pos), None,
                                    np.zeros((0, 8), np.uint8))

    def class_presence(self, *, missing_as_absent: bool = False) -> np.ndarray | None:
        """(samples, num_classes) bool: which classes each sample's label contains, from the class bitmaps in the
        sidecars (no label is read; a remote split downloads only its sidecars). None where the split keeps no
        bitmap (more than 256 classes), or, with ``missing_as_absent``, those shards' rows all False."""
        absent = (lambda shard: np.zeros((shard.num_samples, self.num_classes), bool)) if missing_as_absent else None
        return self._sidecar_column(lambda table, pos: table.presence(pos), absent,
                                    np.zeros((0, self.num_classes), bool))

    # ------------------------------------------------------------------ epochs
    def sampler(self, plan: EpochPlan | int, *, augment: Any = None, **fields: Any) -> _sampling.EpochBatchSampler:
        """The batch index sampler of ``plan`` (an :class:`~shardkit.read.options.EpochPlan`, or a batch size with
        the plan's fields as keywords: ``ds.sampler(8, shuffle=False)``) that :meth:`iter_batches` uses (see
        :mod:`shardkit.read.sampling`).

        ``shuffle_mode``: ``"auto"`` (global for random-access formats, shard-then-buffer for
        sequential ones), ``"global"`` or ``"buffer"``. ``sampling``: ``"uniform"`` (each sample once per
        epoch), ``"class-balanced[:T]"`` or ``"repeat-factor[:t]"`` (repeat factors from the classes each sample
        contains, :meth:`repeat_factors`; always one global order, for every format).

        The sampler has ``state_dict()`` / ``load_state_dict()`` (:mod:`shardkit.read.state`; torchdata's
        ``StatefulDataLoader`` calls them): ``augment``, the pipeline the batches go through, is part of the state
        so that a state of another pipeline is refused.
        """
        p = EpochPlan.of(plan, **fields)
        shuffle_mode = p.shuffle_mode
        repeats = None
        if _sampling.parse_sampling(p.sampling)[0] != "uniform":
            if shuffle_mode == "buffer":
                raise ConfigError(f"sampling={p.sampling!r} draws one global order; shuffle_mode='buffer' cannot "
                                  "repeat samples", fix="leave shuffle_mode='auto' (or 'global')")
            repeats = self.repeat_factors(p.sampling)
            shuffle_mode = "global"
        mode = shuffle_mode if shuffle_mode != "auto" else "global" if self.random_access else "buffer"
        sampler = _sampling.EpochBatchSampler(self.shard_sizes, p.replace(shuffle_mode=mode), repeats=repeats)
        sampler.progress = Progress.of(sampler, self.manifest, augment)
        return sampler

    def iter_batches(self, plan: EpochPlan | int, *, buffers: int = 2, with_indices: bool = False,
                     augment: Any = None, **fields: Any) -> Iterator[Any]:
        """Yield one epoch of ``(images, labels)`` batches of ``plan`` (an :class:`~shardkit.read.options.EpochPlan`,
        or a batch size with the plan's fields as keywords: ``ds.iter_batches(32, seed=0, epoch=3)``).

        Every rank gets the same number of samples and batches (padded by wrapping around, or
        the tail dropped with ``drop_last``); each batch's indices are sorted so reads run
        through each shard in order. Output arrays come from a ring of ``buffers`` reused
        buffers: a yielded batch stays valid until ``buffers`` more have been yielded (copy it
        to keep it longer; ``buffers=0`` allocates fresh arrays per batch). ``with_indices``
        yields ``(indices, images, labels)``.

        ``augment``: a :class:`shardkit.augment.Compose` applied to every batch with this
        split's ignore index (255 if it has none) and the plan's ``seed``/``epoch``: each sample's draws
        depend on (seed, epoch, index) only. Augmented batches are fresh arrays. Splits whose
        samples differ in size batch only through a pipeline ending in a crop (samples are
        then read one by one).

        ``sampling="class-balanced"`` (DAFormer's rare class sampling; ``"class-balanced:T"`` sets its temperature)
        or ``"repeat-factor[:t]"`` (LVIS): samples holding rare classes are read more often, from the class
        bitmaps the split keeps (:mod:`shardkit.read.sampling`); every epoch has the same length on every rank.
        """
        p = EpochPlan.of(plan, **fields)
        if augment is None:
            self._fixed_size()
        else:
            self.check_augment(augment)
        if buffers < 0:
            raise ConfigError(f"buffers must be >= 0, got {buffers}")
        sampler = self.sampler(p)
        ring = [self.empty_batch(p.batch_size) for _ in range(buffers)] if augment is None else []
        for k, idx in enumerate(sampler.batches()):
            if augment is not None:
                images, labels = self.augmented_batch(idx, augment, seed=p.seed, epoch=p.epoch)
            else:
                images, labels = self.batch(idx, out=ring[k % buffers] if ring else None)
            yield (idx, images, labels) if with_indices else (images, labels)

    def check_augment(self, augment: Any) -> None:
        """Refuse a pipeline this split cannot feed: it needs 2-D samples, id labels, and samples of one size or a
        final crop."""
        self.require_2d("augmentation (its ops are 2-D)")
        if self.labels != "ids":
            raise ConfigError(f"augment needs id labels, but this Dataset gives labels={self.labels!r}",
                              fix="open the split with labels='ids' (expand to one-hot afterwards, e.g. "
                                  "CudaPrefetcher(labels=…))")
        if self.spec.size is None and augment.out_hw is None:
            self.require_fixed_size()

    def augmented_batch(self, indices: Sequence[int] | np.ndarray, augment: Any, *, seed: int,
                        epoch: int, out: Batch | None = None) -> Batch:
        """Samples ``indices`` read and augmented, with this split's ignore index (255 if none): into ``out``
        when the batch fits it (see :meth:`shardkit.augment.Compose.__call__`; e.g. a shared-memory ring slot),
        else fresh arrays.

        npy samples are warped straight from their memory-mapped views (only the pages a crop maps to
        are read; no copy of whole samples), as are splits whose samples differ in size (the pipeline
        then ends in a crop); other fixed-size splits are read in one batched call."""
        self.check_augment(augment)
        idx = self._indices(indices)
        images: Any
        labels: Any
        if self.spec.size is None or self.format == "npy":
            images, labels = zip(*(self[int(i)] for i in idx), strict=True) if len(idx) else ((), ())
        else:
            images, labels = self.batch(idx)
        ignore = 255 if self.ignore_index is None else int(self.ignore_index)
        if out is None:
            return augment(images, labels, idx, seed=seed, epoch=epoch, ignore_index=ignore)
        return augment(images, labels, idx, seed=seed, epoch=epoch, ignore_index=ignore, out=out)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_local", None)
        state["_freqs"], state["_repeats"] = None, {}  # the sampler's, in the parent: workers read batches only
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()


def adapter_dataset(source: str | os.PathLike[str] | Dataset, opts: OpenOptions,
                    options: OpenOptions | None) -> Dataset:
    """The Dataset a reader adapter reads: ``source`` itself when it is one — then an ``options`` argument is a
    ConfigError, as it would be silently ignored — else ``source`` opened with ``opts``. A split of 3-D samples is
    refused (:meth:`Dataset.require_2d`): the adapters arrange and normalise (H, W, C) samples."""
    if isinstance(source, Dataset):
        if options is not None:
            raise ConfigError("options= opens a split, but this one is an open Dataset already",
                              fix="pass the split's path with options=, or open the Dataset with them")
        dataset = source
    else:
        dataset = Dataset(source, opts)
    dataset.require_2d("this reader adapter")
    return dataset
