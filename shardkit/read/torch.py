"""PyTorch adapters: a map-style Dataset, a whole-batch DataLoader helper and a CUDA prefetcher.

Importing this module imports torch; ``import shardkit`` does not.

* :class:`ShardkitTorchDataset` — ``ds[i]`` gives one sample, ``ds[[i, j, …]]`` a whole batch
  read with the core's batched reads. Shard files are opened lazily in each worker (LMDB
  environments and HDF5 files are never pickled), so it works with ``num_workers > 0`` under
  fork and spawn and with ``persistent_workers=True``.
* :func:`make_loader` — a ``DataLoader`` whose sampler yields lists of indices
  (:class:`~shardkit.read.sampling.EpochBatchSampler`) with ``batch_size=None``: one worker
  task reads one whole batch straight into shared memory, so batches, not samples, cross the
  process boundary.
* :class:`~shardkit.read.prefetch.CudaPrefetcher` (re-exported here) — prepares the next
  batch on the GPU while the current one is used.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import logging
import os
import sys
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info

from ..augment.ops import BatchSpec, OneHot
from ..errors import ConfigError
from . import sampling
from .dataset import Dataset, adapter_dataset
from .options import EpochPlan, OpenOptions, adapter_options, adapter_plan, refuse_unknown
from .prefetch import LAYOUTS, PREFETCH_LABELS, CudaPrefetcher
from .recycle import leased_together

if TYPE_CHECKING:
    from ..augment import Compose

__all__ = ["PREFETCH_LABELS", "BufferReuse", "CudaPrefetcher", "EpochPlan", "OpenOptions", "RingLoader",
           "ShardkitLoader", "ShardkitTorchDataset", "StatefulRingLoader", "make_loader"]

log = logging.getLogger(__name__)



def _empty(shape: tuple[int, ...], dtype: np.dtype, shared: bool) -> torch.Tensor:
    """An uninitialised CPU tensor; in shared memory when it is going to leave a worker process."""
    tdtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    if not shared:
        return torch.empty(shape, dtype=tdtype)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    try:  # allocate straight in shared memory, as default_collate does in workers (no extra copy)
        storage = torch.UntypedStorage._new_shared(nbytes)
        strides = [int(np.prod(shape[d + 1:])) for d in range(len(shape))]  # C order
        return torch.empty(0, dtype=tdtype).set_(storage, 0, shape, strides)
    except (AttributeError, RuntimeError, TypeError):  # pragma: no cover - older torch
        return torch.empty(shape, dtype=tdtype).share_memory_()


class ShardkitTorchDataset(torch.utils.data.Dataset):
    """Map-style dataset over a converted split.

    ``ds[i]`` → (image uint8, label) tensors of one sample; ``ds[[i, j, …]]`` → a stacked batch.
    ``layout``: ``"NCHW"`` (images (…, 3, H, W), one-hot labels (…, C, H, W); zero-copy views
    with channels-last strides, ``torch.channels_last`` for batches) or ``"NHWC"``. ``options``: how the split
    is opened (:class:`~shardkit.read.options.OpenOptions`: labels, verify, cache_dir, cache_limit,
    storage_options, …; one-hot labels follow ``layout`` unless it sets ``label_layout``); or pass an open
    :class:`~shardkit.read.dataset.Dataset`. ``with_indices`` appends the global indices.
    ``buffers`` > 0 reads main-process batches into that many reused tensors (a batch stays
    valid until ``buffers`` more were read); worker batches read through this dataset get fresh shared memory
    (:func:`make_loader` hands its workers a ring of shared-memory slots instead).
    """

    def __init__(self, path: str | os.PathLike[str] | Dataset, *, options: OpenOptions | None = None,
                 layout: str = "NCHW", with_indices: bool = False, buffers: int = 0, augment: Compose | None = None,
                 seed: int = 0, **deprecated: Any) -> None:
        opts = adapter_options("ShardkitTorchDataset", options, deprecated)
        refuse_unknown("ShardkitTorchDataset", deprecated)
        if layout not in LAYOUTS:
            raise ConfigError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
        if opts.label_layout is None:  # one-hot labels in the layout of the images
            opts = opts.replace(label_layout="channels_first" if layout == "NCHW" else "channels_last")
        self.dataset = adapter_dataset(path, opts, options)
        self.layout = layout
        self.with_indices = with_indices
        self.buffers = buffers
        self.augment, self.seed = augment, int(seed)
        if augment is not None:
            self.dataset.check_augment(augment)
        self._ring: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._ring_pos = 0
        self.pin = False  # reused main-process buffers in pinned memory (set by make_loader)

    def __len__(self) -> int:
        return len(self.dataset)

    def sampler(self, plan: EpochPlan | int, **fields: Any) -> sampling.EpochBatchSampler:
        """The batch sampler of ``plan`` for ``DataLoader(self, batch_size=None, sampler=…)``, with a loader state
        that knows this dataset's augmentation: torchdata's ``StatefulDataLoader`` saves and restores it."""
        return self.dataset.sampler(plan, augment=self.augment, **fields)

    @property
    def labels(self) -> str:
        return self.dataset.labels

    def _arrange(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Channels-last storage → the requested layout (a view, no copy). One-hot labels made by a pipeline's
        ``A.OneHot`` keep the layout that op was given."""
        if self.layout == "NCHW":
            images = images.movedim(-1, -3)
            own = self.augment is not None and self.augment.one_hot
            if labels.ndim == images.ndim and not self.dataset.channels_first and not own:  # (…, H, W, C) → (…, C, …)
                labels = labels.movedim(-1, -3)
        return images, labels

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, ...]:
        if isinstance(index, (int, np.integer)) or (isinstance(index, torch.Tensor) and index.ndim == 0):
            i = int(index)
            image, label = self.dataset[i]
            img, lab = torch.from_numpy(np.array(image)), torch.from_numpy(np.array(label))
            img, lab = self._arrange(img, lab)
            return (img, lab, torch.tensor(i % len(self))) if self.with_indices else (img, lab)
        return self.get_batch(index)

    def _buffers(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        shared = get_worker_info() is not None
        if shared or self.buffers <= 0:
            return self._fresh(b, shared)
        if not self._ring or self._ring[0][0].shape[0] < b:
            fresh = [self._fresh(b, False) for _ in range(self.buffers)]
            self._ring = [(i.pin_memory(), lab.pin_memory()) if self.pin else (i, lab) for i, lab in fresh]
        out = self._ring[self._ring_pos % len(self._ring)]
        self._ring_pos += 1
        return out[0][:b], out[1][:b]

    def _fresh(self, b: int, shared: bool) -> tuple[torch.Tensor, torch.Tensor]:
        (ishape, idt), (lshape, ldt) = self.dataset.batch_layout(b)
        return _empty(ishape, idt, shared), _empty(lshape, ldt, shared)

    def ring_layout(self, b: int) -> tuple[tuple[tuple[int, ...], np.dtype], ...] | None:
        """((images shape, dtype), (labels shape, dtype)) of the batches of ``b`` samples this dataset gives, to size
        the slots of a shared-memory ring; None when they cannot be known ahead (an augmentation whose output
        follows the input size, on a split of mixed sizes). Augmented: the pipeline's final crop (or the split's
        size), the pipeline's output spec for the split's bands and dtype (float32 images after ``A.Normalize``),
        the ``A.OneHot`` encoding's labels. A batch that comes out otherwise still arrives whole (:class:`_Ring`
        hands it over in fresh memory instead: a copy into a new shared-memory segment per batch)."""
        aug = self.augment
        if aug is None:
            return self.dataset.batch_layout(b)
        hw = aug.out_hw or self.dataset.spec.size
        if hw is None:
            return None
        out = aug.output_spec(BatchSpec(channels=self.dataset.bands, image_dtype=self.dataset.image_dtype.name))
        images = ((b, *hw, out.channels), np.dtype(out.image_dtype))
        hot = [op for op in aug.ops if isinstance(op, OneHot)]
        if hot:
            enc = hot[-1].encoding(255 if self.dataset.ignore_index is None else int(self.dataset.ignore_index))
            return images, (enc.batch_shape((b, *hw)), np.dtype(enc.dtype))
        return images, ((b, *self.dataset.label_shape(hw)), self.dataset.label_dtype)

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A whole batch read straight into (shared-memory, in workers) tensors."""
        idx = np.asarray(indices.tolist() if isinstance(indices, torch.Tensor) else indices, dtype=np.int64)
        if self.augment is not None:  # drawn from (seed, epoch, index): the sampler's batch carries its epoch
            epoch = int(getattr(indices, "epoch", 0))
            # fresh arrays: writing them straight into new shared memory (out=) cost more CPU than the
            # worker's hand-over copy (measured: scripts/bench_augment.py, docs/augment-bench.md)
            arrays = self.dataset.augmented_batch(idx, self.augment, seed=self.seed, epoch=epoch)
            images, labels = self._arrange(torch.from_numpy(arrays[0]), torch.from_numpy(arrays[1]))
            if self.with_indices:
                return images, labels, torch.from_numpy(np.where(idx < 0, idx + len(self), idx))
            return images, labels
        images, labels = self._buffers(len(idx))
        self.dataset.batch(idx, out=(images.numpy(), labels.numpy()))
        images, labels = self._arrange(images, labels)
        if self.with_indices:
            return images, labels, torch.from_numpy(np.where(idx < 0, idx + len(self), idx))
        return images, labels

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_ring"], state["_ring_pos"] = [], 0
        return state


@dataclass(frozen=True)
class BufferReuse:
    """make_loader's opt-in reused batch memory (``reuse_buffers=BufferReuse(keep=…)``; ``True`` is the default one).

    A yielded batch stays valid until ``keep`` more batches were yielded. With workers and ``shared_ring`` the
    workers write batches into a ring of shared-memory buffers allocated once (a :class:`RingLoader`); with
    ``shared_ring=False`` every worker batch gets fresh shared memory. Without workers batches are read into
    ``keep + 1`` reused (pinned) buffers.
    """

    keep: int = 2
    shared_ring: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 0:
            raise ConfigError(f"keep must be a non-negative integer, got {self.keep!r}")


#: DataLoader keywords make_loader passes on (the rest of its options are shardkit's).
DATALOADER_KEYWORDS = ("pin_memory", "persistent_workers", "prefetch_factor", "multiprocessing_context")


def make_loader(
    source: str | os.PathLike[str] | Dataset,
    plan: EpochPlan | int | None = None,
    num_workers: int = 0,
    *,
    options: OpenOptions | None = None,
    layout: str = "NCHW",
    augment: Compose | None = None,
    with_indices: bool = False,
    reuse_buffers: bool | BufferReuse = False,
    auto_epoch: bool = True,
    **dataloader: Any,
) -> ShardkitLoader | StatefulRingLoader:
    """A ``DataLoader`` that reads whole batches per worker task, for the batches of ``plan``.

    ``plan``: an :class:`~shardkit.read.options.EpochPlan` (batch size, shuffle, seed, epoch, rank, world size,
    drop_last, shuffle mode, buffer, sampling) or a bare batch size. ``options``: how ``source`` (a split folder
    or URL) is opened (:class:`~shardkit.read.options.OpenOptions`: labels, verify, cache_dir, cache_limit,
    storage_options, …); or pass an open :class:`~shardkit.read.dataset.Dataset` as ``source``.

    Every rank gets the same number of batches (see :mod:`shardkit.read.sampling`). The epoch
    advances after each full pass (``auto_epoch``), or set it with ``loader.sampler.set_epoch(e)``.
    ``loader.state_dict()`` / ``loader.load_state_dict(state)``: where the loader stands (epoch, samples consumed
    by all ranks, the dataset and order it reads), for an exact resume with the same or another number of ranks
    and workers (:mod:`shardkit.read.state`, docs/resume.md).
    ``dataloader``: the DataLoader keywords ``pin_memory`` (default: whether CUDA is available),
    ``persistent_workers`` (default ``num_workers > 0``), ``prefetch_factor`` and ``multiprocessing_context``.
    Workers run OpenCV at one thread (:func:`one_opencv_thread`; this process's own count is kept).

    By default every batch is memory of its own while it lives, so batches stay valid when kept
    (``batches = list(loader)``). Without workers that is fresh tensors. With workers batches (augmented or not) go
    through a ring of shared-memory buffers allocated (and, in each worker, page-mapped) once, which costs far less
    than a new shared-memory segment per batch (measured on CamVid 360x480, batch 32: 27 ms a batch in fresh shared
    pages against 3 ms read into a mapped slot; 2 workers went from 0.18x to about 1x ``reuse_buffers=True``,
    scripts/bench_loader.py): each worker reads or augments straight into a free slot, and the batch is yielded as
    views of that slot, which hold it while they (or any view of them) live; a slot is taken again only after.
    When every slot is held (batches kept), the next batches come in their own shared memory. With
    ``pin_memory`` each batch is copied out into fresh pinned memory instead (torch's caching host allocator
    recycles it once freed), and its slot is free at once.

    ``reuse_buffers=True`` (or a :class:`BufferReuse`) opts into the faster reused-buffer path: without
    workers, batches are read into ``keep + 1`` reused buffers; with workers and ``shared_ring`` (the default)
    workers write batches into the ring and only a slot number crosses the process boundary (a
    :class:`RingLoader`). A yielded batch is then valid only until ``keep`` (default 2) more batches were
    yielded — copy it to keep it longer. ``BufferReuse(shared_ring=False)`` gives every worker batch fresh
    shared memory, augmented or not.

    ``augment``: a :mod:`shardkit.augment` pipeline run by the numpy/OpenCV path inside the workers on
    each whole batch, drawn from ``(seed, epoch, index)`` (the epoch travels with each batch from the
    sampler), so batches are the same for any ``num_workers``; it needs ``labels="ids"`` and takes
    splits of mixed sample sizes when it ends in a crop. Augmented batches are memory of their own (fresh, or a
    ring slot held as above), unless ``reuse_buffers=True`` with workers: then they are ring views reused in turn.

    The keywords this signature replaced (``batch_size=``, ``shuffle=``, ``seed=``, ``epoch=``, ``drop_last=``,
    ``rank=``, ``world_size=``, ``shuffle_mode=``, ``buffer_size=``, ``sampling=``, ``labels=``, ``verify=``,
    ``keep=``, ``shared_ring=``) still work for this release, with a DeprecationWarning.
    """
    given = dict(dataloader)
    if isinstance(num_workers, bool):  # the old third positional parameter was shuffle
        given["shuffle"], num_workers = num_workers, 0
    the_plan = adapter_plan("make_loader", plan, given)
    opts = adapter_options("make_loader", options, given)
    memory, moved = _buffer_reuse(reuse_buffers, given)
    kwargs = {k: given.pop(k) for k in DATALOADER_KEYWORDS if k in given}
    refuse_unknown("make_loader", given)
    pin_memory, kwargs = _dataloader_keywords(kwargs, num_workers)
    # Without workers, batches are read in this process into a ring of keep + 1 reused buffers
    # (a fresh 21 MB tensor per batch costs ~30 % of the throughput): same validity contract as the ring.
    # Only with reuse_buffers: kept batches would otherwise be overwritten silently.
    buffers = memory.keep + 1 if num_workers == 0 and memory is not None and augment is None else 0  # augmented: fresh
    dataset = ShardkitTorchDataset(source, options=options if isinstance(source, Dataset) else opts, layout=layout,
                                   with_indices=with_indices, buffers=buffers, augment=augment, seed=the_plan.seed)
    sampler = dataset.dataset.sampler(the_plan, augment=augment)
    sampler.auto_epoch = auto_epoch
    ring_opts = memory if memory is not None else dataclasses.replace(BufferReuse(), **moved)
    slot_layout = dataset.ring_layout(the_plan.batch_size) if num_workers > 0 and ring_opts.shared_ring else None
    if slot_layout is not None:
        return _ring_loader(dataset, slot_layout, sampler, num_workers, kwargs, ring_opts,
                            reused=memory is not None, pin_memory=pin_memory)
    if num_workers == 0 and memory is not None:  # the reused buffers themselves are pinned: no pinned allocation
        dataset.pin, pin_memory = pin_memory, False
    return _with_state(ShardkitLoader(dataset, batch_size=None, sampler=sampler, num_workers=num_workers,
                                      pin_memory=pin_memory, **kwargs), sampler)


def _buffer_reuse(reuse_buffers: bool | BufferReuse, given: dict[str, Any]) -> tuple[BufferReuse | None,
                                                                                     dict[str, Any]]:
    """make_loader's ``reuse_buffers`` as a :class:`BufferReuse` (None: not reused), with the deprecated ``keep=`` and
    ``shared_ring=`` moved out of ``given`` (a DeprecationWarning at make_loader's caller); returns them too."""
    memory = BufferReuse() if reuse_buffers is True else reuse_buffers or None
    moved: dict[str, Any] = {k: given.pop(k) for k in ("keep", "shared_ring") if k in given}
    if moved:
        warnings.warn(f"make_loader: {', '.join(f'{k}=' for k in moved)} deprecated and will be removed in the next "
                      "release; pass reuse_buffers=BufferReuse(…) instead", DeprecationWarning, stacklevel=3)
        if memory is not None:
            memory = dataclasses.replace(memory, **moved)
    return memory, moved


def _dataloader_keywords(kwargs: dict[str, Any], num_workers: int) -> tuple[Any, dict[str, Any]]:
    """``pin_memory`` (default: whether CUDA is available) and the keywords the DataLoader gets: with workers,
    ``persistent_workers`` (default True), ``prefetch_factor`` and ``multiprocessing_context`` when given, and
    one OpenCV thread per worker; none without workers."""
    pin_memory = kwargs.pop("pin_memory", None)
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    persistent_workers = kwargs.pop("persistent_workers", None)
    if kwargs.get("prefetch_factor") is None:
        kwargs.pop("prefetch_factor", None)
    if kwargs.get("multiprocessing_context") is None:
        kwargs.pop("multiprocessing_context", None)
    if num_workers == 0:
        return pin_memory, {}
    kwargs["persistent_workers"] = num_workers > 0 if persistent_workers is None else persistent_workers
    kwargs["worker_init_fn"] = one_opencv_thread  # spawned workers; forked ones: see _opencv_single_threaded
    return pin_memory, kwargs


def _ring_loader(dataset: ShardkitTorchDataset, slot_layout: Any, sampler: sampling.EpochBatchSampler,
                 num_workers: int, kwargs: dict[str, Any], ring_opts: BufferReuse, *, reused: bool,
                 pin_memory: Any) -> StatefulRingLoader:
    """Workers read (or augment) batches into a ring of shared-memory slots; only slot numbers cross to this process.
    ``reused``: slots reused in turn (``reuse_buffers``), else each yielded batch holds its slot while it lives."""
    in_flight = num_workers * kwargs.get("prefetch_factor", 2)
    # reuse_buffers: slots reused in turn (in flight + keep + 1 spare). Else each yielded batch holds its slot
    # while it lives: in flight, the batch being handed over, the one the loop still holds, 1 spare.
    ring = _Ring(dataset, slot_layout, slots=in_flight + (max(ring_opts.keep, 1) + 1 if reused else 3))
    pool = _SlotPool(len(ring.slots)) if not reused and not pin_memory else None
    slotted = _SlotSampler(sampler, len(ring.slots), pool)
    loader = DataLoader(ring, batch_size=None, sampler=slotted, num_workers=num_workers, pin_memory=False, **kwargs)
    return _with_state(StatefulRingLoader(loader, ring, pin_memory=pin_memory, keep=ring_opts.keep,
                                          copy=not reused, pool=pool), sampler)


def one_opencv_thread(_worker_id: int = 0) -> int:
    """A DataLoader ``worker_init_fn``: OpenCV at one thread in this worker (the workers are the parallelism; with
    OpenCV's pool each of 2 workers ran 2 threads on 2 cores and a warp took 0.85 ms instead of 0.42). Set only
    where OpenCV is not at one thread yet, i.e. a fresh (spawned) process whose pool never started: a worker forked
    while the parent's pool had threads must not touch it (``setNumThreads`` there joins threads the fork did not
    copy, and hung), so :func:`_opencv_single_threaded` sets the parent to one thread around the fork. Returns
    OpenCV's thread count now (0 without OpenCV)."""
    try:
        import cv2
    except ImportError:  # pragma: no cover - OpenCV is a dependency; a reader without it has nothing to set
        return 0
    if cv2.getNumThreads() != 1:
        cv2.setNumThreads(1)
    return int(cv2.getNumThreads())


@contextlib.contextmanager
def _opencv_single_threaded(workers: int) -> Iterator[None]:
    """OpenCV at one thread in this process while ``workers`` DataLoader workers start, so forked ones inherit a
    pool without threads (see :func:`one_opencv_thread`); this process's own count restored after. Nothing to
    do without workers, or when OpenCV was not imported here (workers then start it fresh)."""
    cv2 = sys.modules.get("cv2") if workers > 0 else None
    before = cv2.getNumThreads() if cv2 is not None else 1
    if cv2 is not None and before != 1:
        cv2.setNumThreads(1)
    try:
        yield
    finally:
        if cv2 is not None and before != 1:
            cv2.setNumThreads(before)


def _started(loader: DataLoader) -> Iterator[Any]:
    """``iter(loader)``, its workers (if it starts them now) forked with OpenCV at one thread."""
    with _opencv_single_threaded(loader.num_workers):
        return iter(loader)


#: Linux's ``MADV_POPULATE_WRITE`` (5.14+): map a range's pages writable now, in one call, without writing them.
_MADV_POPULATE_WRITE = 23


def _populate(t: torch.Tensor) -> None:
    """Map the pages of shared-memory tensor ``t`` into this process now, writable: one ``madvise`` instead of a
    page fault at the first write to each 4 KB page (~1.6 µs each here: a worker's first pass over a ring of 150 MB
    cost 60 ms in faults, 33 ms populated). A hint: elsewhere, or where the kernel refuses it, pages fault as before."""
    if not sys.platform.startswith("linux") or t.numel() == 0:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        start = t.data_ptr() - t.data_ptr() % 4096
        libc.madvise(start, t.data_ptr() + t.numel() * t.element_size() - start, _MADV_POPULATE_WRITE)
    except (OSError, AttributeError):  # pragma: no cover - no libc to call
        pass


def _copy_out(t: torch.Tensor, pin: bool) -> torch.Tensor:
    """``t`` copied into fresh memory: pinned, or a numpy allocation (large ones get transparent huge pages
    where the kernel offers them on request, so the fresh pages cost little).
    ``np.copyto``: one plain memcpy (torch's ``copy_`` fans out to its intra-op thread pool)."""
    if pin:
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        np.copyto(out.numpy(), t.numpy())
        return out
    return torch.from_numpy(t.numpy().copy())


class _Ring(torch.utils.data.Dataset):
    """Worker side: write batch ``indices`` into shared-memory slot ``slot``; return only (slot, n, indices) (the
    global indices as a list of ints).

    Augmented batches are augmented by the worker and copied into the slot; one whose shape or dtype the
    slot does not have (an output that follows its input's size) is returned whole instead, in fresh
    shared memory as without a ring: (-1, n, indices, images, labels)."""

    def __init__(self, dataset: ShardkitTorchDataset, layout: tuple[tuple[tuple[int, ...], np.dtype], ...],
                 slots: int) -> None:
        self.dataset = dataset
        (ishape, idt), (lshape, ldt) = layout
        self.slots = [(_empty(ishape, idt, True), _empty(lshape, ldt, True)) for _ in range(slots)]
        self._mapped_in: int | None = None  # the process that mapped every slot's pages (see _populate)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, list[int]]) -> tuple[Any, ...]:
        slot, indices = item
        if self._mapped_in != os.getpid():  # a worker's first batch: map the whole ring at once
            self._mapped_in = os.getpid()
            for pair in self.slots:
                for t in pair:
                    _populate(t)
        idx = np.asarray(indices, dtype=np.int64)
        ds = self.dataset
        ids = np.where(idx < 0, idx + len(self), idx).tolist()  # ints: a tensor would get a shm segment of its own
        if slot < 0:  # no free slot (every one held by a batch still alive): the batch in its own memory
            if ds.augment is None:
                images, labels = ds._fresh(len(idx), shared=True)
                ds.dataset.batch(idx, out=(images.numpy(), labels.numpy()))
                return -1, len(idx), ids, images, labels
            got = ds.dataset.augmented_batch(idx, ds.augment, seed=ds.seed, epoch=int(getattr(indices, "epoch", 0)))
            return -1, len(idx), ids, torch.from_numpy(got[0]), torch.from_numpy(got[1])
        images, labels = self.slots[slot]
        if ds.augment is None:
            ds.dataset.batch(idx, out=(images.numpy(), labels.numpy()))
            return slot, len(idx), ids
        epoch = int(getattr(indices, "epoch", 0))  # the sampler's batch carries its epoch
        dst = images.numpy()[: len(idx)], labels.numpy()[: len(idx)]
        got = ds.dataset.augmented_batch(idx, ds.augment, seed=ds.seed, epoch=epoch, out=dst)  # warped into the slot
        if any(a.shape != d.shape or a.dtype != d.dtype for a, d in zip(got, dst, strict=True)):
            return -1, len(idx), ids, torch.from_numpy(got[0]), torch.from_numpy(got[1])
        for a, d in zip(got, dst, strict=True):
            if a is not d:  # an output op's result (float32 images, one-hot labels): copied in
                np.copyto(d, a)
        return slot, len(idx), ids


class _SlotPool:
    """Which ring slots are free, when each yielded batch holds its slot for as long as it lives (make_loader's
    default for worker batches): no copy out of the ring, and a batch stays valid however long it is kept.

    The sampler takes a free slot as it sends a batch to a worker (-1 when every slot is held: the worker then hands
    that batch over in its own memory). :meth:`lease` hands a received slot to the arrays yielded from it; the slot
    is free again once the last of them (and every view of them) is gone. Slots of batches sent but never yielded,
    which the DataLoader drops when a new pass starts (its workers finish them first), are :meth:`reclaim`-ed as
    the :class:`RingLoader` starts that pass. Deque appends and pops are atomic, so a release from any thread needs
    no lock."""

    def __init__(self, slots: int) -> None:
        self.free: deque[int] = deque(range(slots))
        self.sent: set[int] = set()

    def take(self) -> int:
        try:
            slot = self.free.popleft()
        except IndexError:
            return -1
        self.sent.add(slot)
        return slot

    def reclaim(self) -> None:
        """A new pass begins: the workers finished (or were shut down with) every batch of the last one."""
        self.free.extend(sorted(self.sent))
        self.sent.clear()

    def lease(self, slot: int, tensors: Sequence[torch.Tensor], n: int) -> list[torch.Tensor]:
        """The first ``n`` samples of each slot tensor, as new tensors that hold ``slot`` until all are gone."""
        self.sent.discard(slot)
        free = functools.partial(self.free.append, slot)
        return [torch.from_numpy(a) for a in leased_together([t.numpy()[:n] for t in tensors], free)]


class _SlotSampler:
    """Pairs each batch of the inner sampler with a ring slot: the next in turn (the counter runs on across epochs),
    or with a :class:`_SlotPool`, a free one."""

    def __init__(self, inner: sampling.EpochBatchSampler, slots: int, pool: _SlotPool | None = None) -> None:
        self.inner = inner
        self.slots = slots
        self.pool = pool
        self.counter = 0

    def __iter__(self) -> Iterator[tuple[int, list[int]]]:
        pool = self.pool
        for indices in self.inner:
            yield (self.counter % self.slots if pool is None else pool.take()), indices
            self.counter += 1

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:  # set_epoch, epoch, auto_epoch … of the inner sampler
        return getattr(self.__dict__["inner"], name)


class RingLoader:
    """Iterates a DataLoader whose workers fill a shared-memory ring; yields views of ring slots.

    A batch is valid until ``keep`` more batches were yielded (the ring has room for every
    batch in flight plus ``keep``). With ``pin_memory`` each batch is copied once into one of
    ``keep + 1`` pinned buffers, so host→device copies can be asynchronous.

    ``copy=True``: batches stay valid when kept. With a ``pool`` (:class:`_SlotPool`) each batch is yielded as
    views of its slot that hold the slot while they live (no copy); without one (``pin_memory``) it is copied out
    into fresh pinned memory, and the slot is free for the next batch at once.
    """

    def __init__(self, loader: DataLoader, ring: _Ring, *, pin_memory: bool, keep: int, copy: bool = False,
                 pool: _SlotPool | None = None) -> None:
        self.loader = loader
        self.ring = ring
        self.dataset = ring.dataset
        self.sampler = loader.sampler
        self.keep = keep
        self.copy = copy
        self.pin = pin_memory
        self.pool = pool
        self._pinned: list[tuple[torch.Tensor, torch.Tensor]] = []
        if pin_memory and not copy:
            self._pinned = [tuple(t.pin_memory() for t in ring.slots[0]) for _ in range(keep + 1)]  # type: ignore[misc]
        self._count = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:  # persistent_workers, num_workers, _iterator … of the DataLoader
        return getattr(self.__dict__["loader"], name)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        if self.pool is not None:  # the DataLoader drops the last pass's unyielded batches as this one starts
            self.pool.reclaim()
        for slot, n, indices, *whole in _started(self.loader):
            if whole:  # a batch the slots had no room for, in its own memory
                images, labels = (t.pin_memory() for t in whole) if self.pin else whole
            elif self.pool is not None:
                images, labels = self.pool.lease(int(slot), self.ring.slots[int(slot)], int(n))
            else:
                images, labels = self.ring.slots[int(slot)]
                images, labels = images[:n], labels[:n]
            if self.copy and not whole and self.pool is None:
                images, labels = _copy_out(images, self.pin), _copy_out(labels, self.pin)
            elif self._pinned and not whole:
                pinned = self._pinned[self._count % len(self._pinned)]
                # np.copyto: one plain memcpy. torch's copy_ fans out to the intra-op thread pool,
                # which measured 5x slower (11 vs 2 ms per 10.8 MB batch) while a model trained on the GPU.
                np.copyto(pinned[0][:n].numpy(), images.numpy())
                np.copyto(pinned[1][:n].numpy(), labels.numpy())
                images, labels = pinned[0][:n], pinned[1][:n]
            self._count += 1
            images, labels = self.dataset._arrange(images, labels)
            if self.dataset.with_indices:
                yield images, labels, torch.tensor(indices, dtype=torch.int64)
            else:
                yield images, labels
            del images, labels, whole  # not held while the next batch is fetched: the consumer decides


class _Stateful:
    """``state_dict()`` / ``load_state_dict()`` of a loader (:mod:`shardkit.read.state`): the torch stateful
    protocol that torchdata's ``StatefulDataLoader`` and Lightning call, or a dict saved beside a checkpoint. Each
    yielded batch counts as consumed; restoring moves the sampler, reading nothing."""

    progress: Any  # a shardkit.read.state.Progress

    def state_dict(self) -> dict[str, Any]:
        return self.progress.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.progress.load_state_dict(state)

    def __iter__(self) -> Iterator[Any]:
        return self.progress.counted(super().__iter__())  # type: ignore[misc]


class ShardkitLoader(_Stateful, DataLoader):
    """make_loader's ``DataLoader``, with a loader state; its workers start with OpenCV at one thread."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator, not _BaseDataLoaderIter
        with _opencv_single_threaded(self.num_workers):
            return super().__iter__()


class StatefulRingLoader(_Stateful, RingLoader):
    """make_loader's :class:`RingLoader`, with a loader state."""


def _with_state(loader: Any, sampler: sampling.EpochBatchSampler) -> Any:
    loader.progress = sampler.progress.twin()
    return loader
