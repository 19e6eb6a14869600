"""Keras 3 adapter: a ``keras.utils.PyDataset`` of whole batches (any Keras backend).

Importing this module imports keras (choose the backend first, e.g. ``KERAS_BACKEND=torch``);
``import shardkit`` does not.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from ..errors import ConfigError
from .dataset import Dataset, adapter_dataset
from .options import EpochPlan, OpenOptions, adapter_options, adapter_plan, refuse_unknown
from .recycle import POOL, Part, SharedSlots, normalized, shm_available, sweep_at_exit
from .state import LoaderState

if TYPE_CHECKING:
    from ..augment import Compose
    from ..augment.ops import Normalize

def _in_keras_worker(owner: int) -> bool:
    """Whether this is a process of Keras's ``use_multiprocessing=True`` pool (it names them ``Keras_worker_…``),
    whose batches are pickled back to the ``owner`` process."""
    return os.getpid() != owner and multiprocessing.current_process().name.startswith("Keras_worker_")


def _called_by_keras_reset(depth: int = 6) -> bool:
    """Whether Keras's ``EpochIterator.reset`` is among the callers: the set-up call that ends no epoch (the model
    was built from a first batch, or nothing was read yet). A finished epoch's end comes from the iterator's
    epoch loop instead."""
    frame: FrameType | None = sys._getframe(2)  # skip this function and on_epoch_end
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code.co_name == "reset" and str(frame.f_globals.get("__name__", "")).startswith("keras."):
            return True
        frame = frame.f_back
    return False


class ShardkitPyDataset(keras.utils.PyDataset):
    """Batches ``(x, y)`` of a converted split for ``model.fit``: the batches of ``plan`` (an
    :class:`~shardkit.read.options.EpochPlan`, or a batch size), the split opened with ``options`` (an
    :class:`~shardkit.read.options.OpenOptions`: labels, verify, cache_dir, cache_limit, storage_options, …) or an
    open :class:`~shardkit.read.dataset.Dataset`. The keywords these replaced (``shuffle=``, ``seed=``,
    ``labels=``, …) still work for this release, with a DeprecationWarning.

    ``x``: float32 ``(images - mean) / std`` with the manifest's channel stats
    (``normalize=True``), or the stored uint8 images; channels last ``(B, H, W, 3)``.
    ``y``: class ids ``(B, H, W)`` (``labels="ids"``, for sparse categorical losses),
    ``"onehot"`` / ``"float_onehot"`` ``(B, H, W, C)``. Each epoch is a new shuffle
    (:mod:`shardkit.read.sampling`), split across
    ``rank``/``world_size`` with equal batch counts. ``workers``, ``use_multiprocessing`` and
    ``max_queue_size`` go to ``PyDataset`` (shard files are opened lazily in each worker). Batches stay valid
    when kept, and their memory is reused once they are freed. With ``use_multiprocessing=True`` a worker process
    writes its batch (normalised there) into one of a few ``/dev/shm`` slots (Linux) reused across batches and
    epochs, and the consumer gets arrays over that memory, instead of a pickle of the pixels through a pipe.
    ``augment``: a :mod:`shardkit.augment` pipeline applied to each batch (numpy/OpenCV path) before
    normalising, drawn from ``(seed, epoch, index)``; needs ``labels="ids"``. ``sampling``: ``"uniform"``,
    ``"class-balanced[:T]"`` or ``"repeat-factor[:t]"`` (rare-class sampling; every epoch has the same length).

    Epochs line up with Keras's: ``fit(data, epochs=2)`` trains its first epoch on shardkit epoch ``epoch``
    (0 by default) and its second on ``epoch + 1``, and leaves ``data.epoch`` at ``epoch + 2``, ready for the
    next ``fit``. The epoch advances in :meth:`on_epoch_end` only after an :meth:`on_epoch_begin`, and not when
    Keras's ``EpochIterator.reset`` makes the call: ``fit`` (and ``evaluate``) reset their iterator once while
    setting up, after reading a first batch to build the model, before any epoch. Outside ``fit``, call
    :meth:`set_epoch`. Give ``fit`` another instance as ``validation_data``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Dataset,
        plan: EpochPlan | int | None = None,
        *,
        options: OpenOptions | None = None,
        normalize: bool = True,
        workers: int = 1,
        use_multiprocessing: bool = False,
        max_queue_size: int = 10,
        augment: Compose | None = None,
        **deprecated: Any,
    ) -> None:
        the_plan = adapter_plan("ShardkitPyDataset", plan, deprecated)
        opts = adapter_options("ShardkitPyDataset", options, deprecated)
        refuse_unknown("ShardkitPyDataset", deprecated)
        super().__init__(workers=workers, use_multiprocessing=use_multiprocessing,
                         max_queue_size=max_queue_size)
        if opts.labels == "stored":
            raise ConfigError("labels='stored' is not a training target",
                              fix="use ids, onehot or float_onehot")
        self.dataset = adapter_dataset(path, opts, options)
        self.normalize = normalize
        if augment is not None:
            self.dataset.check_augment(augment)
            if augment.normalizes and normalize:
                raise ConfigError("the augment pipeline normalises already (Normalize); the dataset would "
                                  "normalise twice", fix="pass normalize=False")
        self.plan = the_plan
        self.augment, self.seed = augment, the_plan.seed
        self.sampler = self.dataset.sampler(the_plan, augment=augment)
        self.progress = self.sampler.progress.twin()
        self.progress.begin()
        self._batches: list[np.ndarray] | None = None
        self._in_epoch = False  # on_epoch_begin ran and on_epoch_end has not yet
        self._lock = threading.Lock()
        self._owner = os.getpid()  # the consumer: Keras's worker processes hand it their batches
        POOL.keep = max(POOL.keep, max_queue_size + max(workers, 1) + 2)  # every batch Keras may hold at once
        self._slots = SharedSlots(self._owner, max_queue_size + 2 * max(workers, 1))  # hand-over slots
        if use_multiprocessing and shm_available():
            sweep_at_exit()
        if use_multiprocessing and normalize:  # compiled here once: each epoch's forked workers inherit the kernel
            self._normalizer.numpy(np.zeros((1, 1, 1, self.dataset.spec.image_channels), np.uint8))

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        with self._lock:
            self.sampler.set_epoch(epoch)
            self._batches = None
            self.progress.begin()

    def state_dict(self, batches: int | None = None) -> dict[str, Any]:
        """Where this dataset stands (:mod:`shardkit.read.state`): the epoch and the samples consumed, counting the
        batches up to the last one ``__getitem__`` read in this epoch, or ``batches`` (pass the step Keras reached
        when its workers or processes read ahead)."""
        return self.progress.state_dict(batches)

    def load_state_dict(self, state: dict[str, Any] | LoaderState) -> None:
        """Resume at ``state``: ``len(self)`` is then the batches left in its epoch, read in the same order with the
        same augmentation; the next :meth:`on_epoch_end` moves on to the next epoch from its start. Reads nothing."""
        with self._lock:
            self.progress.load_state_dict(state)
            self._batches = None
            self.progress.begin()

    def __len__(self) -> int:
        return len(self.sampler)

    def batch_indices(self, index: int) -> np.ndarray:
        """Global sample indices of batch ``index`` of the current epoch."""
        with self._lock:
            if self._batches is None:
                self._batches = self.sampler.batches()
            batches = self._batches
        if not 0 <= index < len(batches):
            raise IndexError(f"batch {index} out of range for {len(batches)} batches")
        return batches[index]

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray] | tuple[Part, Part]:
        idx = self.batch_indices(int(index))
        # batches read in order (Keras reads batch 0 twice while building the model): consumed up to this one
        self.progress.batches = max(self.progress.batches, int(index) + 1)
        ds = self.dataset
        if _in_keras_worker(self._owner) and shm_available():
            return self._handed_over(idx)
        if self.augment is not None:
            images, labels = ds.augmented_batch(idx, self.augment, seed=self.seed, epoch=self.epoch)
        else:
            (ishape, idt), (lshape, ldt) = ds.batch_layout(len(idx))
            images, labels = ds.batch(idx, out=(POOL.take(ishape, idt), POOL.take(lshape, ldt)))
        if self.normalize:  # the stored images' buffer goes back to the pool as they are dropped here
            images = normalized(self._normalizer, images)
        return images, labels

    def _handed_over(self, idx: np.ndarray) -> tuple[Part, Part]:
        """A worker process's batch (normalised here, in the worker), written into one of the consumer's reused
        ``/dev/shm`` slots that the pickle names (:class:`~shardkit.read.recycle.ShmBatch`): the consumer gets
        arrays over the slot, no copy, no pickled pixels."""
        ds = self.dataset
        if self.augment is None:  # read straight into the slot (the stored images into scratch when normalised)
            (ishape, idt), (lshape, ldt) = ds.batch_layout(len(idx))
            xdt = np.dtype(np.float32) if self.normalize else idt
            batch = self._slots.batch(((ishape, xdt.str), (lshape, ldt.str)))
            images = POOL.take(ishape, idt) if self.normalize else batch.arrays[0]
            ds.batch(idx, out=(images, batch.arrays[1]))
        else:
            images, labels = ds.augmented_batch(idx, self.augment, seed=self.seed, epoch=self.epoch)
            xdt = np.dtype(np.float32) if self.normalize else images.dtype
            batch = self._slots.batch(((images.shape, xdt.str), (labels.shape, labels.dtype.str)))
            np.copyto(batch.arrays[1], labels)
            if not self.normalize:
                np.copyto(batch.arrays[0], images)
        if self.normalize:
            self._normalizer.numpy(images, batch.arrays[0])
        return Part(batch, 0), Part(batch, 1)

    @functools.cached_property
    def _normalizer(self) -> Normalize:
        return self.dataset.normalizer

    def on_epoch_begin(self) -> None:
        """Keras starts an epoch: the next :meth:`on_epoch_end` moves to the next shardkit epoch."""
        self._in_epoch = True

    def on_epoch_end(self) -> None:
        """Keras ended an epoch: the next one reads shardkit epoch ``epoch + 1``. An end without a begin (Keras's
        set-up call before the first epoch) is ignored, so Keras epoch k trains on shardkit epoch k."""
        began, self._in_epoch = self._in_epoch, False
        if self.use_multiprocessing and shm_available():  # slots of batches a stopped pool wrote that nobody took
            self._slots.reclaim()
        if began and not _called_by_keras_reset():
            self.set_epoch(self.sampler.epoch + 1)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
