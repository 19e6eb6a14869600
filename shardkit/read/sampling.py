"""Which samples a rank reads in an epoch, and in which order: pure functions of the options, numpy only.

Two shuffles:

* **global** (random-access formats: npy, LMDB, HDF5): one permutation of all samples.
  Ranks take every ``world_size``-th sample (``order[rank::world_size]``, like
  ``torch.utils.data.DistributedSampler``).
* **shard-then-buffer** (sequential formats: TFRecord): the shard order is permuted, the
  shards are concatenated into one stream, each rank takes one contiguous part of that stream
  (so it reads whole shards, plus at most two partial ones), and pushes it through a shuffle
  buffer of ``buffer_size`` samples (what ``tf.data.Dataset.shuffle`` does).

Every rank gets exactly the same number of samples: without ``drop_last`` the order is
padded by wrapping around to its start (a few samples are seen twice), with ``drop_last`` the
tail is dropped. Within an epoch, ranks are disjoint apart from that padding. Randomness comes
only from ``numpy.random.Generator(PCG64(SeedSequence([seed, epoch])))``: the same seed and
epoch give the same order on any machine, and every rank computes the same global order.

**Rare-class sampling** repeats samples by per-sample factors ``r(i)`` from the classes each one contains
(its bitmap in the samples sidecar; no label is read), two ways (docs/class-imbalance.md says which when):

* ``sampling="class-balanced"`` (the default rare-class sampler): DAFormer's rare class sampling (Hoyer et
  al. 2022). A class of pixel frequency ``f(c)`` is drawn with ``P(c) = softmax((1 - f(c)) / T)``, then a
  sample uniformly among the ``N(c)`` samples holding it: ``r(i) = n * sum over its classes of P(c) / N(c)``
  (``sum r = n``). ``"class-balanced:T"`` sets the temperature (default 0.01, DAFormer's).
* ``sampling="repeat-factor"``: LVIS's repeat-factor sampling (Gupta et al. 2019): a class in a fraction
  ``f(c)`` of the samples has ``r(c) = max(1, sqrt(t / f(c)))``, a sample ``r(i) = max`` over its classes
  (1 with none). ``"repeat-factor:t"`` sets the threshold (default 0.3).

An epoch holds ``L = ceil(sum r(i))`` draws; sample ``i`` appears ``floor`` or ``ceil`` of ``r(i) L / sum r``
times (systematic sampling, so every epoch has the same length), and the list is permuted once; ranks then
split it as above. The ignore class never counts.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError

DEFAULT_BUFFER = 1024
SHUFFLE_MODES = ("auto", "global", "buffer")
SAMPLING_MODES = ("uniform", "class-balanced", "repeat-factor")
#: DAFormer's rare-class-sampling temperature T (its published default).
DEFAULT_TEMPERATURE = 0.01
#: LVIS's repeat-factor threshold t: classes present in fewer than this fraction of samples are repeated.
DEFAULT_REPEAT_THRESHOLD = 0.3


def parse_sampling(text: str) -> tuple[str, float | None]:
    """``"uniform"`` → ("uniform", None); ``"class-balanced[:T]"`` / ``"repeat-factor[:t]"`` → (mode, parameter)."""
    mode, _, value = str(text).partition(":")
    if mode not in SAMPLING_MODES or (mode == "uniform" and value):
        raise ConfigError(f"sampling={text!r} is not one of uniform, class-balanced[:T], repeat-factor[:t]",
                          fix="e.g. sampling='class-balanced' or 'repeat-factor:0.1'")
    if mode == "uniform":
        return mode, None
    try:
        param = float(value) if value else DEFAULT_TEMPERATURE if mode == "class-balanced" else DEFAULT_REPEAT_THRESHOLD
    except ValueError:
        raise ConfigError(f"sampling={text!r}: {value!r} is not a number") from None
    if mode == "class-balanced" and not param > 0:
        raise ConfigError(f"sampling={text!r}: the temperature must be positive")
    if mode == "repeat-factor" and not 0.0 < param <= 1.0:
        raise ConfigError(f"sampling={text!r}: the threshold must be in (0, 1]")
    return mode, param


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The one random generator of an epoch: PCG64 seeded by the SeedSequence of ``(seed, epoch)``."""
    if seed < 0 or epoch < 0:
        raise ConfigError(f"seed ({seed}) and epoch ({epoch}) must be non-negative integers")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(epoch)])))


def check_partition(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is not in 0..world_size-1 (world_size {world_size})")


@dataclass(frozen=True)
class EpochPlan:
    """Which batches an epoch reads, and in which order: what every adapter takes as ``plan=``.

    ``batch_size`` samples per batch; ``shuffle`` with ``seed``; ``epoch`` the first epoch read (later passes
    read the next ones); ``rank`` of ``world_size`` (every rank gets the same number of batches; the tail
    wraps around, or is dropped with ``drop_last``). ``shuffle_mode``: ``"auto"`` (global for random-access
    formats, shard-then-buffer for sequential ones), ``"global"`` or ``"buffer"`` (through a buffer of
    ``buffer_size`` samples). ``sampling``: ``"uniform"``, ``"class-balanced[:T]"`` or ``"repeat-factor[:t]"``
    (:mod:`shardkit.read.sampling`). The order is a pure function of the plan and the split's shard sizes.
    """

    batch_size: int
    shuffle: bool = True
    seed: int = 0
    epoch: int = 0
    drop_last: bool = False
    rank: int = 0
    world_size: int = 1
    shuffle_mode: str = "auto"
    buffer_size: int = DEFAULT_BUFFER
    sampling: str = "uniform"

    def __post_init__(self) -> None:
        for name in ("batch_size", "seed", "epoch", "rank", "world_size", "buffer_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name}={value!r} is not an integer")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.seed < 0 or self.epoch < 0:
            raise ConfigError(f"seed ({self.seed}) and epoch ({self.epoch}) must be non-negative integers")
        check_partition(self.rank, self.world_size)
        if self.shuffle_mode not in SHUFFLE_MODES:
            raise ConfigError(f"shuffle_mode={self.shuffle_mode!r} is not one of {', '.join(SHUFFLE_MODES)}")
        if self.buffer_size < 1:
            raise ConfigError(f"buffer_size must be at least 1, got {self.buffer_size}")
        parse_sampling(self.sampling)

    def replace(self, **changes: Any) -> EpochPlan:
        """A copy with ``changes`` (validated again): e.g. ``plan.replace(epoch=plan.epoch + 1)``."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def of(cls, plan: EpochPlan | int, **fields: Any) -> EpochPlan:
        """``plan`` itself, or ``EpochPlan(batch_size=plan)`` for a bare batch size; ``fields`` (its field names:
        ``shuffle=``, ``seed=``, …) applied to it."""
        if isinstance(plan, bool) or not isinstance(plan, (EpochPlan, int)):
            raise ConfigError(f"expected an EpochPlan or a batch size, got {type(plan).__name__}",
                              fix="pass shardkit.EpochPlan(batch_size=…, shuffle=…, seed=…)")
        if isinstance(plan, int):
            return cls(batch_size=plan, **fields)
        return plan.replace(**fields) if fields else plan


def per_rank(n: int, world_size: int, drop_last: bool) -> int:
    """Samples every rank gets: ``ceil(n / world)`` (padded) or ``n // world`` (tail dropped)."""
    return n // world_size if drop_last else -(-n // world_size)


def even_out(order: np.ndarray, world_size: int, drop_last: bool) -> np.ndarray:
    """Trim ``order`` (drop_last) or pad it by wrapping around so its length divides by ``world_size``."""
    n = len(order)
    total = per_rank(n, world_size, drop_last) * world_size
    if total <= n:
        return order[:total]
    if n == 0:
        raise ConfigError("cannot pad an empty dataset across ranks")
    reps = -(-total // n)
    return np.tile(order, reps)[:total]


def resume_order(order: np.ndarray, start: int, world_size: int, drop_last: bool) -> np.ndarray:
    """The global positions ``start, start + 1, …`` of ``order`` that ranks still read, evened out for ``world_size``.

    Position ``p`` holds ``order[p % n]``: with ``start == 0`` this is :func:`even_out` (padding wraps around to the
    start of ``order``). After a resume at ``start`` (the samples of positions below it were consumed) the rest,
    ``n - start`` positions, is evened out for the *new* world size the same way, so the same world size reads the
    same positions as an uninterrupted run, and any world size reads every unconsumed sample. Costs no read.
    """
    n = len(order)
    if start <= 0:
        return even_out(order, world_size, drop_last)
    total = per_rank(max(n - int(start), 0), world_size, drop_last) * world_size
    return order[np.arange(int(start), int(start) + total) % n] if total else order[:0]


def class_repeat_factors(images: np.ndarray, num_images: int, threshold: float,
                         valid: np.ndarray | None = None) -> np.ndarray:
    """LVIS's per-class repeat factor ``r(c) = max(1, sqrt(t / f(c)))``, ``f(c) = images[c] / num_images``.

    Classes that are not ``valid`` (the ignore class) or in no image get 1: they never raise a sample's factor.
    A sample's factor is the max over its classes (:func:`sample_repeat_factors` with ``combine="max"``).
    """
    counts = np.asarray(images, np.float64)
    f = counts / max(int(num_images), 1)
    r = np.ones(len(counts), np.float64)
    ok = f > 0 if valid is None else (f > 0) & np.asarray(valid, bool)
    r[ok] = np.maximum(1.0, np.sqrt(threshold / f[ok]))
    return r


def rare_class_factors(class_pixels: np.ndarray, images: np.ndarray, num_images: int, temperature: float,
                       valid: np.ndarray | None = None) -> np.ndarray:
    """DAFormer's rare class sampling as per-class terms ``n P(c) / N(c)``: a sample's factor is their sum over
    its classes (:func:`sample_repeat_factors` with ``combine="sum"``).

    ``P(c) = softmax((1 - f(c)) / T)`` over the classes with pixels and samples (not the ignore class),
    ``f(c)`` = pixels of ``c`` / pixels of those classes, ``N(c)`` = samples holding ``c``.
    """
    pixels = np.asarray(class_pixels, np.float64)
    held = np.asarray(images, np.float64)
    ok = (pixels > 0) & (held > 0) & (np.ones(len(pixels), bool) if valid is None else np.asarray(valid, bool))
    out = np.zeros(len(pixels), np.float64)
    if not ok.any():
        return out
    f = pixels[ok] / pixels[ok].sum()
    logits = (1.0 - f) / temperature
    p = np.exp(logits - logits.max())
    p /= p.sum()
    out[ok] = num_images * p / held[ok]
    return out


def sample_repeat_factors(presence: np.ndarray, class_factors: np.ndarray, combine: str = "max") -> np.ndarray:
    """Each sample's ``r(i)`` from the classes its (n, C) bool ``presence`` row holds: the ``max`` of their
    factors (1 with none; LVIS) or their ``sum`` (rare class sampling)."""
    if not len(presence):
        return np.zeros(0, np.float64)
    if combine == "sum":
        return presence.astype(np.float64) @ class_factors
    return np.where(presence, class_factors[None, :], 1.0).max(axis=1)


def epoch_length(repeats: np.ndarray) -> int:
    """Draws per class-balanced epoch: ``ceil(sum r(i))`` (the same every epoch)."""
    return int(np.ceil(np.sum(repeats) - 1e-9)) if len(repeats) else 0


def repeated_indices(repeats: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Sample indices, each ``floor`` or ``ceil`` of ``r(i) L / sum r`` times (``L`` = :func:`epoch_length`), in
    index order: systematic sampling over a random order of the samples, so the total is exactly ``L`` and each
    sample's expected count is exactly ``r(i) L / sum r``."""
    r = np.asarray(repeats, np.float64)
    n, length = len(r), epoch_length(r)
    if not n or not length:
        return np.zeros(0, np.int64)
    scaled = r * (length / r.sum())
    perm = rng.permutation(n)
    ends = np.minimum(np.floor(np.cumsum(scaled[perm]) + rng.random()), length).astype(np.int64)
    ends[-1] = length
    counts = np.empty(n, np.int64)
    counts[perm] = np.diff(ends, prepend=0)
    return np.repeat(np.arange(n, dtype=np.int64), counts)


def shard_stream(shard_sizes: Sequence[int] | np.ndarray, *, shuffle: bool,
                 rng: np.random.Generator | None) -> np.ndarray:
    """Global indices shard by shard, shards in (permuted) order, each shard's samples in stored order."""
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if len(sizes) else sizes
    shards = rng.permutation(len(sizes)) if shuffle and rng is not None else np.arange(len(sizes))
    parts = [np.arange(starts[s], starts[s] + sizes[s], dtype=np.int64) for s in shards]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def buffer_shuffle(stream: np.ndarray, buffer_size: int, rng: np.random.Generator) -> np.ndarray:
    """Stream ``stream`` through a shuffle buffer like ``tf.data.Dataset.shuffle``.

    The buffer is filled with the first ``buffer_size`` items; each further item replaces a
    uniformly chosen buffer slot whose item is emitted; the rest of the buffer is emitted in
    random order at the end. ``buffer_size >= len(stream)`` is a full permutation.
    """
    if buffer_size < 1:
        raise ConfigError(f"buffer_size must be at least 1, got {buffer_size}")
    n = len(stream)
    b = min(buffer_size, n)
    if b <= 1:
        return stream.copy()
    buf = stream[:b].copy()
    out = np.empty(n, dtype=stream.dtype)
    slots = rng.integers(0, b, size=n - b)
    for k, (slot, item) in enumerate(zip(slots.tolist(), stream[b:].tolist(), strict=True)):
        out[k] = buf[slot]
        buf[slot] = item
    out[n - b:] = buf[rng.permutation(b)]
    return out


def epoch_indices(shard_sizes: Sequence[int], plan: EpochPlan, *, repeats: np.ndarray | None = None,
                  start: int = 0) -> np.ndarray:
    """The global sample indices ``plan.rank`` reads in ``plan.epoch``, in reading order.

    ``plan.shuffle_mode``: ``"global"`` (random access) or ``"buffer"`` (shard-then-buffer, sequential formats;
    ``"auto"`` is resolved by :meth:`shardkit.read.dataset.Dataset.sampler`, which knows the format). Every rank
    gets :func:`per_rank` samples. ``repeats``: per-sample repeat factors (class-balanced sampling, global mode
    only): the epoch is :func:`repeated_indices`, permuted when ``plan.shuffle``. ``start``: global positions
    already consumed this epoch (a resumed loader, :func:`resume_order`); in buffer mode, where each rank reads
    its own stream, the rank skips ``start // world_size`` of its samples.
    """
    shuffle, seed, epoch, rank, world_size = plan.shuffle, plan.seed, plan.epoch, plan.rank, plan.world_size
    drop_last, mode = plan.drop_last, plan.shuffle_mode
    if start < 0:
        raise ConfigError(f"start must be non-negative, got {start}")
    if mode not in ("global", "buffer"):
        raise ConfigError(f"shuffle mode {mode!r} is not one of global, buffer")
    n = int(np.sum(shard_sizes)) if len(shard_sizes) else 0
    rng = epoch_rng(seed, epoch)
    if repeats is not None:
        if mode != "global":
            raise ConfigError("class-balanced sampling draws one global order", fix="use shuffle_mode='global'")
        if len(repeats) != n:
            raise ConfigError(f"{len(repeats)} repeat factors for {n} samples")
        drawn = repeated_indices(repeats, rng)
        order = rng.permutation(drawn) if shuffle else drawn
        return resume_order(order, start, world_size, drop_last)[rank::world_size]
    if mode == "global":
        order = rng.permutation(n).astype(np.int64, copy=False) if shuffle else np.arange(n, dtype=np.int64)
        return resume_order(order, start, world_size, drop_last)[rank::world_size]
    stream = even_out(shard_stream(shard_sizes, shuffle=shuffle, rng=rng), world_size, drop_last)
    k = len(stream) // world_size
    mine = stream[rank * k:(rank + 1) * k]
    skip = int(start) // world_size
    if not shuffle:
        return mine[skip:]
    # Each rank's buffer draws from its own stream, derived from (seed, epoch, rank): reproducible per rank.
    rank_seed = np.random.SeedSequence([int(seed), int(epoch), 1, int(rank)])
    rank_rng = np.random.Generator(np.random.PCG64(rank_seed))
    return buffer_shuffle(mine, plan.buffer_size, rank_rng)[skip:]


def stream_ranges(shard_sizes: Sequence[int], plan: EpochPlan) -> list[tuple[int, int, int]]:
    """``plan.rank``'s part of the shard stream as ``(shard, first local index, count)`` runs, in order.

    The samples are those of :func:`epoch_indices` in buffer mode before its shuffle buffer: a sequential reader
    (``tf.data.TFRecordDataset(file).skip(first).take(count)``) streams them and applies its own shuffle buffer.
    """
    rank, world_size = plan.rank, plan.world_size
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if len(sizes) else sizes
    stream = even_out(shard_stream(sizes, shuffle=plan.shuffle, rng=epoch_rng(plan.seed, plan.epoch)), world_size,
                      plan.drop_last)
    k = len(stream) // world_size
    mine = stream[rank * k:(rank + 1) * k]
    if not len(mine):
        return []
    shard = np.searchsorted(starts, mine, side="right") - 1
    breaks = np.flatnonzero((np.diff(mine) != 1) | (np.diff(shard) != 0)) + 1
    out = []
    for a, b in zip([0, *breaks.tolist()], [*breaks.tolist(), len(mine)], strict=True):
        s = int(shard[a])
        out.append((s, int(mine[a] - starts[s]), b - a))
    return out


def split_batches(indices: np.ndarray, batch_size: int, *, drop_last: bool = False,
                  sort: bool = True) -> list[np.ndarray]:
    """Cut ``indices`` into batches of ``batch_size`` (the last may be short unless ``drop_last``).

    ``sort`` orders each batch's indices ascending: the batch holds the same samples, and reads
    run through each shard in order (contiguous slices, fewer seeks).
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
    n = len(indices)
    stop = n - n % batch_size if drop_last else n
    out = [indices[a:min(a + batch_size, stop)] for a in range(0, stop, batch_size)]
    return [np.sort(b) for b in out] if sort else out


def num_batches(num_samples: int, batch_size: int, drop_last: bool) -> int:
    return num_samples // batch_size if drop_last else -(-num_samples // batch_size)


class EpochBatch(list[int]):
    """One batch's indices (a plain list) that also carries the epoch it was drawn for, so a worker that
    augments it draws from (seed, epoch, index) without being told the epoch separately."""

    def __init__(self, indices: list[int], epoch: int) -> None:
        super().__init__(indices)
        self.epoch = int(epoch)


@dataclass
class EpochBatchSampler:
    """Yields lists of global indices, one list per batch, for the current epoch of ``plan`` (framework-free).

    ``plan``: the :class:`EpochPlan` it reads, its ``shuffle_mode`` resolved (``"global"`` or ``"buffer"``:
    :meth:`shardkit.read.dataset.Dataset.sampler` resolves ``"auto"`` by the format); ``plan.epoch`` is the epoch
    the next pass reads (:meth:`set_epoch` moves it, ``auto_epoch`` advances it after each full pass).
    Usable as ``torch.utils.data.DataLoader(dataset, batch_size=None, sampler=this)``: each list
    reaches a worker as one task, which reads the whole batch with the core's batched reads.
    Call :meth:`set_epoch` before each epoch (as with ``DistributedSampler``). ``start``: global positions of this
    epoch already consumed (set by a loader state, :mod:`shardkit.read.state`); a new epoch starts at 0 again.
    """

    shard_sizes: Sequence[int]
    plan: EpochPlan
    auto_epoch: bool = False
    #: per-sample repeat factors: class-balanced sampling (:func:`sample_repeat_factors`); None: each sample once
    repeats: np.ndarray | None = None
    start: int = 0
    #: a :class:`shardkit.read.state.Progress` counting the batches this sampler hands out (set by
    #: ``Dataset.sampler``): it makes :meth:`state_dict` / :meth:`load_state_dict` torch's stateful protocol for a
    #: sampler, which torchdata's ``StatefulDataLoader`` snapshots as each batch is handed to a worker
    progress: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.plan, EpochPlan):
            raise ConfigError(f"expected an EpochPlan, got {type(self.plan).__name__}",
                              fix="make the sampler with shardkit.open(split).sampler(plan)")
        if self.plan.shuffle_mode not in ("global", "buffer"):
            raise ConfigError(f"shuffle mode {self.plan.shuffle_mode!r} is not one of global, buffer",
                              fix="make the sampler with shardkit.open(split).sampler(plan): it resolves 'auto'")
        self.shard_sizes = [int(s) for s in self.shard_sizes]
        if self.repeats is not None:
            self.repeats = np.asarray(self.repeats, np.float64)
            if len(self.repeats) != sum(self.shard_sizes):
                raise ConfigError(f"{len(self.repeats)} repeat factors for {sum(self.shard_sizes)} samples")

    @property
    def epoch(self) -> int:
        """The epoch the next pass reads (``plan.epoch``)."""
        return self.plan.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.plan = self.plan.replace(epoch=int(epoch))

    def __getattr__(self, name: str) -> Any:
        """The plan's fields as the sampler's own attributes (``sampler.seed``; ``mode`` for ``shuffle_mode``), as
        they were before the sampler held its plan: deprecated, read them from ``sampler.plan``."""
        field_name = "shuffle_mode" if name == "mode" else name
        if field_name in _PLAN_FIELDS and "plan" in self.__dict__:
            warnings.warn(f"EpochBatchSampler.{name} is deprecated and will be removed in the next release; read "
                          f"sampler.plan.{field_name}", DeprecationWarning, stacklevel=2)
            return getattr(self.plan, field_name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next (from its start, unless it is the epoch a loader state resumes)."""
        if int(epoch) != self.plan.epoch:
            self.start = 0
        self.epoch = int(epoch)

    @property
    def epoch_samples(self) -> int:
        """Global positions per epoch before evening out: the samples, or the class-balanced draws."""
        return sum(self.shard_sizes) if self.repeats is None else epoch_length(self.repeats)

    @property
    def samples_per_rank(self) -> int:
        """Samples each rank reads in this pass: the same every epoch, also when class-balanced (fewer in the
        rest of a resumed epoch)."""
        p = self.plan
        if p.shuffle_mode == "buffer":
            return per_rank(self.epoch_samples, p.world_size, p.drop_last) - self.start // p.world_size
        return per_rank(max(self.epoch_samples - self.start, 0), p.world_size, p.drop_last)

    def indices(self) -> np.ndarray:
        return epoch_indices(self.shard_sizes, self.plan, repeats=self.repeats, start=self.start)

    def batches(self) -> list[np.ndarray]:
        return split_batches(self.indices(), self.plan.batch_size, drop_last=self.plan.drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.epoch
        progress = self.progress
        if progress is not None:
            progress.begin()
        for b in self.batches():
            if progress is not None:
                progress.step()
            yield EpochBatch(b.tolist(), epoch)
        if self.epoch == epoch:  # the pass ran to its end: the next one reads an epoch from its start
            self.start = 0
        if self.auto_epoch:
            self.epoch += 1

    def __len__(self) -> int:
        return num_batches(self.samples_per_rank, self.plan.batch_size, self.plan.drop_last)

    def state_dict(self) -> dict[str, Any]:
        """The loader state after the batches this sampler handed out in its current pass
        (:mod:`shardkit.read.state`)."""
        if self.progress is None:
            raise ConfigError("this sampler keeps no loader state (it was not made by Dataset.sampler)",
                              fix="make it with shardkit.open(split).sampler(plan)")
        return dict(self.progress.state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state``: the next pass reads the rest of its epoch."""
        if self.progress is None:
            raise ConfigError("this sampler keeps no loader state (it was not made by Dataset.sampler)",
                              fix="make it with shardkit.open(split).sampler(plan)")
        self.progress.load_state_dict(state)


_PLAN_FIELDS = frozenset(f.name for f in dataclasses.fields(EpochPlan))
