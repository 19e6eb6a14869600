"""Grain (JAX) adapter: a random-access data source over a converted split and a sampler drawing shardkit's order.

Importing this module imports grain; ``import shardkit`` does not.

* :class:`ShardkitSource` — Grain's ``RandomAccessDataSource`` protocol (``__len__``, ``__getitem__``, a ``repr``
  carrying the dataset identity, which Grain checks a checkpoint against). Picklable: each worker reopens the
  split's shards. A record key is ``epoch * num_samples + index``, so the source knows each record's epoch and
  augments sample ``index`` from (seed, epoch, index) like every other shardkit path.
* :class:`ShardkitSampler` — Grain's ``Sampler`` protocol: global position ``g`` of the run is sample
  ``order_e[g % T]`` of epoch ``e = first + g // T`` (``order_e`` the epoch's global order evened out for the shard
  count, :mod:`shardkit.read.sampling`). Grain's ``DataLoader`` hands process ``shard_index`` of ``shard_count``
  the positions ``shard_index, shard_index + shard_count, …``: exactly shardkit's rank split.
* :func:`data_loader` — a ``grain.python.DataLoader`` of batches of the plan; checkpoint it with Grain's own
  iterator state (``iterator.get_state()`` / ``set_state``).
* :class:`ShardkitBatchSource` / :func:`batch_loader` — one record per shardkit batch (the batched reads; the fast
  path), any sampling of the plan (uniform, class-balanced, repeat-factor).
* :class:`XY` — a Grain map turning records into ``(x, y)`` for Keras 3 ``model.fit`` (on JAX, or any backend).

Grain reads records on a pool of threads (16 by default), which pays for remote reads but costs a local split a
third of its speed on a small machine (``scripts/bench_grain.py``): the loaders here read a local split in line
(``read_options=grain.ReadOptions(num_threads=0)``) unless ``read_options`` says otherwise.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import grain.python as grain
import numpy as np

from ..errors import ConfigError
from ..files.storage import is_url
from . import sampling
from .dataset import Dataset
from .options import EpochPlan, OpenOptions
from .state import augment_identity, dataset_identity

__all__ = ["XY", "ShardkitBatchSource", "ShardkitSampler", "ShardkitSource", "batch_loader", "data_loader"]


class ShardkitSource:
    """Records ``{"image", "label", "index", "epoch"}`` of a split for ``epochs`` epochs (keys ``epoch * n + i``),
    augmented by ``augment`` (a :mod:`shardkit.augment` pipeline, numpy/OpenCV path) with ``seed``."""

    def __init__(self, path: str | os.PathLike[str], *, options: OpenOptions | None = None, augment: Any = None,
                 seed: int = 0, epochs: int = 1) -> None:
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ConfigError(f"epochs={epochs!r} is not a positive integer")
        self.path, self.options, self.augment, self.seed, self.epochs = path, options, augment, int(seed), epochs
        ds = self._open()
        if augment is not None:
            ds.check_augment(augment)
        self.num_samples = len(ds)
        self.split, self.version = ds.manifest.split, int(ds.version or 0)
        self.identity = dataset_identity(ds.manifest)
        self.shard_sizes = list(ds.shard_sizes)

    def _open(self) -> Dataset:
        ds = self.__dict__.get("_ds")
        if ds is None:
            ds = self.__dict__["_ds"] = Dataset(self.path, self.options)
        return ds

    def __len__(self) -> int:
        return self.num_samples * self.epochs

    def repeat_factors(self, sampling_: str) -> np.ndarray | None:
        """The per-sample repeat factors of ``sampling_`` (None for ``uniform``), from the split's class bitmaps."""
        if sampling.parse_sampling(sampling_)[0] == "uniform":
            return None
        return self._open().repeat_factors(sampling_)

    def read_options(self) -> grain.ReadOptions:
        """Grain's read options for this split: in line for a local split (Grain's thread pool only costs time
        there), Grain's defaults (threads hide latency) for a remote one."""
        return grain.ReadOptions() if is_url(str(self.path)) else grain.ReadOptions(num_threads=0)

    def __getitem__(self, key: int) -> dict[str, np.ndarray]:
        epoch, index = divmod(int(key), self.num_samples)
        ds, idx = self._open(), np.array([index])
        if self.augment is None:
            images, labels = ds.batch(idx)
        else:
            images, labels = ds.augmented_batch(idx, self.augment, seed=self.seed, epoch=epoch)
        return {"image": images[0], "label": labels[0], "index": np.int64(index), "epoch": np.int64(epoch)}

    def __repr__(self) -> str:
        return (f"ShardkitSource(split={self.split!r}, version={self.version}, dataset={self.identity}, "
                f"augment={augment_identity(self.augment) or 'none'}, seed={self.seed}, epochs={self.epochs})")

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_ds", None)  # each worker opens the shards itself
        return state


class ShardkitSampler:
    """The global order of ``plan``'s epochs (``plan.epoch`` on, ``num_epochs`` of them) for Grain, split over
    ``shard_options.shard_count`` processes like shardkit's ranks (``drop_remainder`` or ``plan.drop_last``: the
    tail is dropped, else padded by wrapping around). Any sampling of the plan: ``uniform``, or ``class-balanced``
    / ``repeat-factor`` (the repeat factors from the split's class bitmaps, every epoch the same length)."""

    def __init__(self, source: ShardkitSource, plan: EpochPlan | int, *, num_epochs: int = 1,
                 shard_options: grain.ShardOptions | None = None) -> None:
        p = EpochPlan.of(plan)
        if p.epoch + num_epochs > source.epochs:
            raise ConfigError(f"epochs {p.epoch}..{p.epoch + num_epochs - 1} need a source of at least "
                              f"{p.epoch + num_epochs} epochs, it has {source.epochs}",
                              fix=f"ShardkitSource(..., epochs={p.epoch + num_epochs})")
        shard = shard_options or grain.NoSharding()
        self.plan, self.num_epochs, self.source = p, int(num_epochs), source
        self.world, self.drop_last = shard.shard_count, bool(shard.drop_remainder or p.drop_last)
        self.repeats = source.repeat_factors(p.sampling)
        n = source.num_samples if self.repeats is None else sampling.epoch_length(self.repeats)
        self.per_epoch = sampling.per_rank(n, self.world, self.drop_last) * self.world

    @functools.lru_cache(maxsize=2)  # noqa: B019 - two epochs' orders, for the sampler's lifetime
    def _order(self, epoch: int) -> np.ndarray:
        global_order = self.plan.replace(epoch=epoch, rank=0, world_size=1, drop_last=False, shuffle_mode="global")
        order = sampling.epoch_indices(self.source.shard_sizes, global_order, repeats=self.repeats)
        return sampling.even_out(order, self.world, self.drop_last)

    def __len__(self) -> int:
        return self.per_epoch * self.num_epochs

    def __getitem__(self, index: int) -> grain.RecordMetadata:
        if not 0 <= index < len(self):
            raise IndexError(f"position {index} is not in 0..{len(self) - 1}")
        e, p = divmod(int(index), self.per_epoch)
        epoch = self.plan.epoch + e
        return grain.RecordMetadata(index=index, record_key=epoch * self.source.num_samples
                                    + int(self._order(epoch)[p]))

    def __repr__(self) -> str:
        p = self.plan
        return (f"ShardkitSampler(seed={p.seed}, shuffle={p.shuffle}, sampling={p.sampling}, epoch={p.epoch}, "
                f"num_epochs={self.num_epochs}, shard_count={self.world}, drop_last={self.drop_last}, "
                f"source={self.source!r})")


def _parse_flags(worker_count: int) -> None:
    """Grain's worker processes read absl flags, which only an absl app parses: with workers, take the defaults."""
    if worker_count:
        from absl import flags

        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()


def data_loader(source: ShardkitSource, plan: EpochPlan | int, *, num_epochs: int = 1,
                shard_options: grain.ShardOptions | None = None, worker_count: int = 0,
                operations: tuple[Any, ...] = (), read_options: grain.ReadOptions | None = None) -> grain.DataLoader:
    """A Grain ``DataLoader`` of ``plan``'s batches (``operations`` run per record before batching; Grain's batches
    run on across epoch boundaries); pass ``shard_options=grain.ShardByJaxProcess()`` on several JAX processes.
    ``read_options``: Grain's, by default :meth:`ShardkitSource.read_options` (in line for a local split).
    With ``worker_count`` outside an absl app, absl's flags are marked parsed (their defaults), which Grain's
    worker processes need."""
    p = EpochPlan.of(plan)
    shard = shard_options or grain.NoSharding()
    _parse_flags(worker_count)
    return grain.DataLoader(data_source=source, sampler=ShardkitSampler(source, p, num_epochs=num_epochs,
                                                                        shard_options=shard),
                            operations=[*operations, grain.Batch(p.batch_size, drop_remainder=p.drop_last)],
                            worker_count=worker_count, shard_options=shard,
                            read_options=read_options or source.read_options())


class ShardkitBatchSource(ShardkitSource):
    """Whole batches as Grain records: key ``(epoch * world + rank) * batches + k`` is batch ``k`` of ``rank`` of
    ``world`` in ``epoch`` of ``plan`` — ``Dataset.sampler(plan)``'s batches (any sampling of the plan), read with
    the batched reads, so Grain's per-record cost is paid once per batch. Use with :func:`batch_loader`."""

    def __init__(self, path: str | os.PathLike[str], plan: EpochPlan | int, *, world_size: int = 1,
                 options: OpenOptions | None = None, augment: Any = None, epochs: int = 1) -> None:
        p = EpochPlan.of(plan)
        if p.rank != 0 or p.world_size != 1:
            raise ConfigError(f"the plan's rank {p.rank} of {p.world_size}: Grain's shard options choose the rank",
                              fix="pass world_size=K here and shard_options=grain.ShardOptions(i, K) to batch_loader")
        super().__init__(path, options=options, augment=augment, seed=p.seed, epochs=epochs)
        self.plan, self.world = p, int(world_size)
        self.batches = len(self._sampler(p.epoch, 0))

    def __len__(self) -> int:
        return self.epochs * self.world * self.batches

    def _sampler(self, epoch: int, rank: int) -> sampling.EpochBatchSampler:
        return self._open().sampler(self.plan.replace(epoch=epoch, rank=rank, world_size=self.world))

    @functools.lru_cache(maxsize=8)  # noqa: B019 - a few (epoch, rank) batch lists, for the source's lifetime
    def _batches(self, epoch: int, rank: int) -> list[np.ndarray]:
        return self._sampler(epoch, rank).batches()

    def indices(self, key: int) -> tuple[int, np.ndarray]:
        """(epoch, sample indices) of the batch of record ``key``: ``Dataset.sampler(plan)``'s batch."""
        slot, k = divmod(int(key), self.batches)
        epoch, rank = divmod(slot, self.world)
        return epoch, self._batches(epoch, rank)[k]

    def __getitem__(self, key: int) -> dict[str, np.ndarray]:
        epoch, idx = self.indices(key)
        ds = self._open()
        if self.augment is None:
            images, labels = ds.batch(idx)
        else:
            images, labels = ds.augmented_batch(idx, self.augment, seed=self.seed, epoch=epoch)
        return {"image": images, "label": labels, "index": idx, "epoch": np.full(len(idx), epoch, np.int64)}

    def __repr__(self) -> str:
        return (f"ShardkitBatchSource({super().__repr__()}, batch_size={self.plan.batch_size}, "
                f"shuffle={self.plan.shuffle}, sampling={self.plan.sampling}, drop_last={self.plan.drop_last}, "
                f"world_size={self.world})")



class _BatchSampler:
    """Grain positions over a :class:`ShardkitBatchSource`: position ``g`` of the run is the batch of rank
    ``g % world`` at step ``(g // world) % batches`` of epoch ``first + g // (world * batches)``; Grain hands
    process ``i`` of ``world`` the positions ``i, i + world, …``, so it reads rank ``i``'s batches in order."""

    def __init__(self, source: ShardkitBatchSource, num_epochs: int) -> None:
        first = source.plan.epoch
        if first + num_epochs > source.epochs:
            raise ConfigError(f"epochs {first}..{first + num_epochs - 1} need a source of at least "
                              f"{first + num_epochs} epochs, it has {source.epochs}",
                              fix=f"ShardkitBatchSource(..., epochs={first + num_epochs})")
        self.source, self.num_epochs = source, int(num_epochs)

    def __len__(self) -> int:
        return self.num_epochs * self.source.world * self.source.batches

    def __getitem__(self, index: int) -> grain.RecordMetadata:
        if not 0 <= index < len(self):
            raise IndexError(f"position {index} is not in 0..{len(self) - 1}")
        src = self.source
        e, q = divmod(int(index), src.world * src.batches)
        k, rank = divmod(q, src.world)
        epoch = src.plan.epoch + e
        return grain.RecordMetadata(index=index, record_key=(epoch * src.world + rank) * src.batches + k)

    def __repr__(self) -> str:
        return f"_BatchSampler(num_epochs={self.num_epochs}, source={self.source!r})"


def batch_loader(source: ShardkitBatchSource, *, num_epochs: int = 1, shard_options: grain.ShardOptions | None = None,
                 worker_count: int = 0, operations: tuple[Any, ...] = (),
                 read_options: grain.ReadOptions | None = None) -> grain.DataLoader:
    """A Grain ``DataLoader`` whose records are :class:`ShardkitBatchSource` batches (the batched-read fast path):
    each epoch's batches are ``Dataset.sampler(plan)``'s for this process's rank. ``shard_options.shard_count`` must
    equal the source's ``world_size``. ``operations`` run per batch (e.g. :class:`XY` for Keras);
    ``read_options``: Grain's, by default :meth:`ShardkitSource.read_options` (in line for a local split)."""
    shard = shard_options or grain.NoSharding()
    if shard.shard_count != source.world:
        raise ConfigError(f"shard_count {shard.shard_count} is not the source's world_size {source.world}",
                          fix="make the source with world_size=shard_options.shard_count")
    _parse_flags(worker_count)
    return grain.DataLoader(data_source=source, sampler=_BatchSampler(source, num_epochs), worker_count=worker_count,
                            shard_options=shard, operations=list(operations),
                            read_options=read_options or source.read_options())


class XY(grain.MapTransform):
    """Records to ``(x, y)`` for Keras 3's ``model.fit`` (which takes a Grain ``DataLoader`` on any backend, JAX
    included): ``x`` float32 ``(images - mean) / std`` with the split's channel statistics, exactly as the Keras
    adapter gives them (``normalize=False``: the images as read), ``y`` the labels as stored (class ids)."""

    def __init__(self, source: ShardkitSource, *, normalize: bool = True) -> None:
        if normalize and source.augment is not None and source.augment.normalizes:
            raise ConfigError("the augmentation pipeline normalises already; XY would normalise twice",
                              fix="pass normalize=False")
        self.normalizer = source._open().normalizer if normalize else None

    def map(self, element: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        images = element["image"]
        return (images if self.normalizer is None else self.normalizer.numpy(images)), element["label"]
