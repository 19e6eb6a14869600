"""Prepare the next batch on the GPU while the current one trains: :class:`CudaPrefetcher`.

On CUDA a background thread takes each batch from the loader, copies it on a side stream and
converts it there (normalise, widen or expand labels to one-hot), so the host work of
loading overlaps the training step instead of preceding it. Without CUDA the same
conversions run synchronously on the CPU.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ConfigError
from .dataset import Dataset
from .options import EpochPlan, refuse_unknown

if TYPE_CHECKING:
    from ..augment import Compose

LAYOUTS = ("NCHW", "NHWC")
PREFETCH_LABELS = ("ids", "onehot", "float_onehot", None)
_END = object()


def _fold_seed(plan: EpochPlan | None, deprecated: dict[str, Any]) -> EpochPlan | None:
    """``plan`` with the deprecated ``seed=`` of ``deprecated`` moved into it (a DeprecationWarning at the
    CudaPrefetcher's caller)."""
    if "seed" not in deprecated:
        return plan
    seed = deprecated.pop("seed")
    warnings.warn("CudaPrefetcher: seed= is deprecated and will be removed in the next release; pass "
                  "plan=shardkit.EpochPlan(…) instead", DeprecationWarning, stacklevel=3)
    return (plan or EpochPlan(1)).replace(seed=int(seed)) if seed is not None else plan


def _resolve_device(device: str | torch.device | None) -> torch.device:
    """The device batches go to: CUDA when available unless given; a CUDA device named with its index (the
    background thread needs an explicit one); CUDA asked for without CUDA is a ConfigError."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    out = torch.device(device)
    if out.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device is CUDA but torch.cuda.is_available() is False", fix="use device='cpu'")
    if out.type == "cuda" and out.index is None:
        out = torch.device("cuda", torch.cuda.current_device())
    return out


class CudaPrefetcher:
    """Iterate a loader of ``(images uint8, label ids, …)`` batches with the next batch already on the device.

    On CUDA a background thread takes the next batch from the loader, copies it on a side
    stream (``non_blocking``: pin the loader's memory for a truly asynchronous copy) and
    converts it there — images to float ``(x - mean) / std`` (0–255 scale stats, from the
    manifest by default), labels to int64 ids or expanded to one-hot — while the caller's
    step runs. The caller's stream waits for that batch's conversion only, and the tensors
    are ``record_stream``-ed so their memory is not reused early. At most one prepared batch
    waits in the queue, one more is being prepared. Before taking another batch from the
    loader the thread waits until the previous batch's copy has run, because shardkit's
    loaders refill a few reused pinned buffers. An error in the loader is raised in the
    caller; leaving the loop early stops the thread. The first batch of each pass is taken
    in the caller's thread, so that DataLoader workers are never forked from the background
    thread. Without CUDA (or with ``device="cpu"``) the same conversions run synchronously.

    ``labels``: ``"ids"`` (int64), ``"onehot"`` (uint8), ``"float_onehot"`` (float32) or None
    (labels moved unchanged). ``augment``: a :mod:`shardkit.augment` pipeline applied to each batch on
    the device before normalising (the loader must yield indices: ``make_loader(..., with_indices=True)``,
    labels ``"ids"``); parameters come from ``(seed, epoch, index)`` — ``seed`` and the epoch from the
    loader's sampler by default, ``plan``'s (an :class:`~shardkit.read.options.EpochPlan`) seed when given (its epoch
    when the loader has no sampler) — so they equal the CPU path's. (``seed=`` still works for this release, with a
    DeprecationWarning.) ``memory_format`` applies to 4-D NCHW image outputs
    (``torch.contiguous_format`` by default; None keeps the loader's strides).
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: str | torch.device | None = None,
        *,
        normalize: bool = True,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        labels: str | None = "ids",
        num_classes: int | None = None,
        layout: str | None = None,
        dtype: torch.dtype = torch.float32,
        memory_format: torch.memory_format | None = torch.contiguous_format,
        augment: Compose | None = None,
        plan: EpochPlan | None = None,
        ignore_index: int | None = None,
        **deprecated: Any,
    ) -> None:
        plan = _fold_seed(plan, deprecated)
        refuse_unknown("CudaPrefetcher", deprecated)
        if labels not in PREFETCH_LABELS:
            raise ConfigError(f"labels={labels!r} is not one of ids, onehot, float_onehot, None")
        self.loader = loader
        self.device = _resolve_device(device)
        self.use_cuda = self.device.type == "cuda"
        source = getattr(loader, "dataset", None)
        core = getattr(source, "dataset", None)  # a ShardkitTorchDataset wraps the core reader
        core = core if isinstance(core, Dataset) else None
        self.layout = layout or (getattr(source, "layout", "NCHW") if core is not None else "NCHW")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout={self.layout!r} is not one of {', '.join(LAYOUTS)}")
        if labels in ("onehot", "float_onehot") and core is not None and core.labels != "ids":
            raise ConfigError(f"the prefetcher expands ids to one-hot, but the loader yields "
                              f"labels={core.labels!r}", fix="make the loader with labels='ids'")
        self.labels = labels
        self.augment = augment
        sampler = getattr(loader, "sampler", None)
        self.plan = plan
        self.seed = int(plan.seed if plan is not None else getattr(getattr(sampler, "plan", None), "seed", 0))
        if ignore_index is None:
            ignore_index = core.ignore_index if core is not None else None
        self.ignore_index = 255 if ignore_index is None else int(ignore_index)
        if augment is not None and core is not None and not getattr(source, "with_indices", False):
            raise ConfigError("augmenting on the device needs each batch's sample indices",
                                  fix="make the loader with make_loader(..., with_indices=True)")
        if num_classes is None and core is not None:
            num_classes = core.num_classes
        self.num_classes = num_classes
        if labels in ("onehot", "float_onehot") and self.num_classes is None:
            raise ConfigError("one-hot expansion needs num_classes", fix="pass num_classes=")
        self.normalize = normalize
        self.dtype = dtype
        self.memory_format = memory_format
        if augment is not None:
            if augment.normalizes and normalize:
                raise ConfigError("the augment pipeline normalises already (Normalize); the prefetcher would "
                                  "normalise twice", fix="pass normalize=False")
            if augment.one_hot and labels is not None:
                raise ConfigError(f"the augment pipeline ends in OneHot; the prefetcher's labels={labels!r} "
                                  f"expects ids", fix="pass labels=None")
        self._converters(mean, std, core)

    def _converters(self, mean: Sequence[float] | None, std: Sequence[float] | None, core: Dataset | None) -> None:
        """The normalising and one-hot steps this prefetcher runs: the pipeline ops A.Normalize / A.OneHot, run by
        the torch backend (mean and std from the split's manifest unless given)."""
        from ..augment.ops import Normalize, OneHot
        from ..augment.torch import TorchNormalize, TorchOneHot

        self._normalizer: TorchNormalize | None = None
        if self.normalize:
            if mean is None or std is None:
                if core is None:
                    raise ConfigError("normalising needs mean and std", fix="pass mean=, std= (0-255 scale)")
                mean = core.mean.tolist() if mean is None else mean
                std = core.std.tolist() if std is None else std
            self._normalizer = TorchNormalize(Normalize(mean, std), self.device, dtype=self.dtype,
                                              channels_first=self.layout == "NCHW")
        self._onehot: TorchOneHot | None = None
        if self.labels in ("onehot", "float_onehot"):
            assert self.num_classes is not None
            op = OneHot(self.num_classes, "float32" if self.labels == "float_onehot" else "uint8",
                        channels_first=self.layout == "NCHW")
            self._onehot = TorchOneHot(op, self.device, self.ignore_index)

    #: batches yielded in the current pass (None before one): the loader's state counts these, not those read ahead
    _yielded: int | None = None

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        sampler = getattr(self.loader, "sampler", None)
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def _epoch(self) -> int:
        """The epoch the loader's sampler is about to serve (parameters are drawn from it); without a sampler,
        the plan's."""
        default = self.plan.epoch if self.plan is not None else 0
        return int(getattr(getattr(self.loader, "sampler", None), "epoch", default))

    def _move(self, batch: Sequence[Any]) -> tuple[Any, ...]:
        """Copy one batch to the device (asynchronously from pinned memory); non-tensors pass through."""
        return tuple(t.to(self.device, non_blocking=True) if isinstance(t, torch.Tensor) else t for t in batch)

    def _convert(self, batch: Sequence[Any], epoch: int = 0, indices: Any = None) -> tuple[Any, ...]:
        """Convert one batch already on the device: augment, normalise images, expand or widen labels.
        ``indices``: the batch's sample indices still on the host, when the caller has them (reading them
        back from the device would wait for the copy)."""
        x, y, *rest = batch
        batched = x.ndim == 4
        if self.augment is not None:
            if not rest:
                raise ConfigError("augmenting on the device needs each batch's sample indices",
                                  fix="make the loader with make_loader(..., with_indices=True)")
            from ..augment.torch import apply_batch

            nchw = self.layout == "NCHW"
            x, y = apply_batch(self.augment, x, y, rest[-1] if indices is None else indices, seed=self.seed,
                               epoch=epoch, ignore_index=self.ignore_index, channels_first=nchw)
        fmt = self.memory_format if batched and self.layout == "NCHW" else None
        if self._normalizer is not None:
            x = self._normalizer(x, fmt)
        elif fmt is not None:
            x = x.contiguous(memory_format=fmt)
        if self.labels == "ids":
            y = y.long()
        elif self._onehot is not None:  # the ignore id (no channel) and ids ≥ C → all zero
            y = self._onehot(y, fmt)
        return (x, y, *rest)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state (:mod:`shardkit.read.state`) counting the batches this prefetcher yielded, not the
        ones it took ahead from the loader."""
        progress = getattr(self.loader, "progress", None)
        if progress is None:
            raise ConfigError(f"the loader ({type(self.loader).__name__}) keeps no shardkit loader state",
                              fix="prefetch a loader made by shardkit.read.torch.make_loader")
        return dict(progress.state_dict(self._yielded))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the loader at ``state`` (its ``load_state_dict``)."""
        load = getattr(self.loader, "load_state_dict", None)
        if load is None:
            raise ConfigError(f"the loader ({type(self.loader).__name__}) keeps no shardkit loader state",
                              fix="prefetch a loader made by shardkit.read.torch.make_loader")
        load(state)
        self._yielded = None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        self._yielded = 0
        for batch in self._batches():
            self._yielded += 1
            yield batch

    def _batches(self) -> Iterator[tuple[torch.Tensor, ...]]:
        epoch = self._epoch()
        if not self.use_cuda:
            for batch in self.loader:
                yield self._convert(self._move(batch), epoch)
            return
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))  # mean/std/classes were made on it
        it = iter(self.loader)
        try:
            first = next(it)  # here, not in the thread: a DataLoader may fork its workers now
        except StopIteration:
            return
        ready: queue.Queue[Any] = queue.Queue(maxsize=1)
        stop = threading.Event()
        thread = threading.Thread(target=self._produce, args=(first, it, stream, ready, stop, epoch),
                                  name="shardkit-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = ready.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                batch, converted = item
                current = torch.cuda.current_stream(self.device)
                current.wait_event(converted)
                for t in batch:
                    if isinstance(t, torch.Tensor) and t.is_cuda:
                        t.record_stream(current)
                yield batch
        finally:
            stop.set()
            while thread.is_alive():  # unblock a put; drop what was prepared
                with contextlib.suppress(queue.Empty):
                    ready.get(timeout=0.05)
            thread.join()

    def _produce(self, first: Any, it: Iterator[Any], stream: torch.cuda.Stream, ready: queue.Queue[Any],
                 stop: threading.Event, epoch: int) -> None:
        """Background thread: prepare batches on ``stream`` and put ``(batch, converted event)`` on ``ready``."""

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    pass
            return False

        try:
            torch.cuda.set_device(self.device)
            batch = first
            while True:
                with torch.cuda.stream(stream):
                    moved = self._move(batch)
                    copied = torch.cuda.Event()
                    copied.record(stream)
                    out = self._convert(moved, epoch, indices=batch[-1] if len(batch) > 2 else None)
                    converted = torch.cuda.Event()
                    converted.record(stream)
                if not put((out, converted)):
                    return
                del batch, moved, out
                copied.synchronize()  # the loader may now refill the pinned buffer that copy read
                try:
                    batch = next(it)
                except StopIteration:
                    put(_END)
                    return
        except BaseException as exc:  # handed to the caller, who raises it
            put(exc)
