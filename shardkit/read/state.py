"""A loader's position, small and constant in size: which dataset, which order, which epoch, how far into it.

Every adapter (``make_loader`` and the torch Dataset's sampler, the Keras ``ShardkitPyDataset``, the
``CudaPrefetcher``) exposes ``state_dict()`` / ``load_state_dict()`` through :class:`Progress`. A state is a plain
dict of ints, strings and bools (:meth:`LoaderState.to_dict`): save it beside a model checkpoint, or let
torchdata's ``StatefulDataLoader`` / Lightning call the methods.

Resuming is exact because the global order of an epoch and each sample's augmentation are pure functions of
(seed, epoch, sample index) (:mod:`shardkit.read.sampling`, :mod:`shardkit.augment.seeding`). ``consumed`` counts
positions of the epoch's global order (:func:`~shardkit.read.sampling.resume_order`) that all ranks together
took; a resumed loader reads positions ``consumed, consumed + 1, …`` split over its own ranks and batch size, so
nothing consumed is read again and restoring costs no read (O(1) in the samples consumed).

The rule where exactness is impossible: with ``drop_last`` the tail an epoch drops is what does not fill the
ranks evenly; resumed with another global batch size (``batch_size * world_size``) mid-epoch, the tail is
counted from the rest of the epoch at the new size, so it may drop other (and a different number of) samples
than an uninterrupted run would have; the loader logs a warning naming both sizes. Shard-then-buffer order
(TFRecord, ``shuffle_mode="buffer"``) gives each rank its own stream: it resumes with the same world size and
batch size only.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ResumeError
from .sampling import EpochBatchSampler, EpochPlan, num_batches

if TYPE_CHECKING:
    from ..store.manifest import Manifest

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The ``kind`` of a shardkit loader state dict (a state of another kind, or version, is refused).
STATE_KIND = "shardkit.loader_state/1"


def dataset_identity(manifest: Manifest) -> str:
    """A short hash of what a split version holds: its sample count and every shard file's name and sha256 (the
    manifest's content, wherever the split lies: local or cached from object storage)."""
    files = [[f.name, f.sha256] for shard in manifest.shards for f in shard.all_files]
    text = json.dumps([manifest.split, manifest.num_samples, files], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def augment_identity(augment: Any) -> str:
    """A short hash of an augmentation pipeline's ops and their parameters (``""`` for none)."""
    return "" if augment is None else hashlib.sha256(repr(augment).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class LoaderState:
    """Where a loader stands: the dataset (``split``, publish ``version``, content hash ``dataset``), the order
    (``seed``, ``shuffle``, ``sampling``, ``mode``, ``buffer_size``), the augmentation hash, and the position:
    ``epoch`` and the global positions of it ``consumed`` by all ranks. ``batch_size``, ``world_size`` and
    ``drop_last`` record the layout it was saved under (a resume may change them, see the module docs)."""

    split: str
    version: int
    dataset: str
    augment: str
    seed: int
    shuffle: bool
    sampling: str
    mode: str
    buffer_size: int
    epoch: int
    consumed: int
    batch_size: int
    world_size: int
    drop_last: bool

    @classmethod
    def of(cls, plan: EpochPlan, epoch: int, consumed: int, *, split: str, version: int, dataset: str,
           augment: str) -> LoaderState:
        """The state of a loader reading ``plan`` (its ``shuffle_mode`` resolved) at ``consumed`` global positions
        of ``epoch``: the plan saved whole but for its ``rank``, which a resume may change."""
        return cls(split=split, version=version, dataset=dataset, augment=augment, seed=plan.seed,
                   shuffle=plan.shuffle, sampling=plan.sampling, mode=plan.shuffle_mode, buffer_size=plan.buffer_size,
                   epoch=epoch, consumed=consumed, batch_size=plan.batch_size, world_size=plan.world_size,
                   drop_last=plan.drop_last)

    @property
    def order(self) -> tuple[int, bool, str, str]:
        """What makes an epoch's global order (seed, shuffle, sampling, mode): a resume keeps all four."""
        return self.seed, self.shuffle, self.sampling, self.mode

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON-able), tagged with :data:`STATE_KIND`."""
        return {"kind": STATE_KIND, **{name: getattr(self, name) for name in _FIELDS}}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> LoaderState:
        """Parse a dict from :meth:`to_dict`; a ResumeError naming the first field that is missing or wrong."""
        if not isinstance(state, Mapping) or state.get("kind") != STATE_KIND:
            got = state.get("kind") if isinstance(state, Mapping) else type(state).__name__
            raise ResumeError(f"not a shardkit loader state (kind {got!r}, expected {STATE_KIND!r})",
                              fix="pass the dict a shardkit loader's state_dict() returned")
        values: dict[str, Any] = {}
        for f in fields(cls):
            want = {"int": int, "str": str, "bool": bool}[str(f.type)]
            value = state.get(f.name)
            if want is int:
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            else:
                ok = isinstance(value, want)
            if not ok:
                kind = f"non-negative {want.__name__}" if want is int else want.__name__
                raise ResumeError(f"loader state field {f.name!r} is {value!r}, not a {kind}",
                                  fix="pass the dict a shardkit loader's state_dict() returned")
            values[f.name] = value
        return cls(**values)


_FIELDS = tuple(f.name for f in fields(LoaderState))


class Progress:
    """Batches handed to the consumer in the current pass of a sampler, and the state they make.

    The adapter calls :meth:`begin` as a pass starts and :meth:`step` for each batch it yields (not when a worker
    reads it: workers read ahead, and those batches were not consumed)."""

    def __init__(self, sampler: EpochBatchSampler, *, split: str, version: int, dataset: str,
                 augment: str = "") -> None:
        self.sampler = sampler
        self.split, self.version, self.dataset, self.augment = split, int(version), dataset, augment
        self._pass: tuple[int, int, int, int] | None = None  # epoch, start, samples per rank, batches of the pass
        self.batches = 0

    @classmethod
    def of(cls, sampler: EpochBatchSampler, manifest: Manifest, augment: Any = None) -> Progress:
        """The progress of ``sampler`` over the split version of ``manifest``, augmented by ``augment``."""
        return cls(sampler, split=manifest.split, version=int(manifest.version or 0),
                   dataset=dataset_identity(manifest), augment=augment_identity(augment))

    def twin(self) -> Progress:
        """A new count of the same sampler and identity: a loader counts the batches it yields, the sampler those
        it hands out (ahead, to workers)."""
        return Progress(self.sampler, split=self.split, version=self.version, dataset=self.dataset,
                        augment=self.augment)

    def begin(self) -> None:
        s = self.sampler
        self._pass = (s.epoch, s.start, s.samples_per_rank, len(s))
        self.batches = 0

    def step(self) -> None:
        self.batches += 1

    def counted(self, batches: Iterable[T]) -> Iterator[T]:
        """``batches`` (one pass), counting each one as it is yielded."""
        self.begin()
        for batch in batches:
            self.step()
            yield batch

    def position(self, batches: int | None = None) -> tuple[int, int]:
        """(epoch, global positions of it consumed) after ``batches`` (default: those counted) of the current pass;
        a finished pass is the start of the next epoch."""
        s = self.sampler
        if self._pass is None:
            return s.epoch, s.start
        epoch, start, per_rank, total = self._pass
        done = self.batches if batches is None else batches
        if done >= total:
            return epoch + 1, 0
        return epoch, start + min(done * s.plan.batch_size, per_rank) * s.plan.world_size

    def state(self, batches: int | None = None) -> LoaderState:
        """The state after ``batches`` yielded batches of this pass (default: those counted; a wrapper that reads
        ahead, like the CudaPrefetcher, passes the number it yielded itself)."""
        epoch, consumed = self.position(batches)
        return LoaderState.of(self.sampler.plan, epoch, consumed, split=self.split, version=self.version,
                              dataset=self.dataset, augment=self.augment)

    def state_dict(self, batches: int | None = None) -> dict[str, Any]:
        return self.state(batches).to_dict()

    def load_state_dict(self, state: Mapping[str, Any] | LoaderState) -> None:
        """Move the sampler to ``state``'s position (the rest of its epoch next), refusing a state from another
        dataset version, split, augmentation or order in one line naming both. Reads nothing."""
        st = state if isinstance(state, LoaderState) else LoaderState.from_dict(state)
        mine = self.state()
        for what, theirs, ours in (
                ("split", st.split, mine.split),
                ("dataset version", f"{st.version} ({st.dataset})", f"{mine.version} ({mine.dataset})"),
                ("augmentation", st.augment or "none", mine.augment or "none"),
                ("order (seed, shuffle, sampling, mode)", st.order, mine.order)):
            if theirs != ours:
                raise ResumeError(f"the loader state is from {what} {theirs}, this loader reads {what} {ours}",
                                  fix="resume with the loader the state was saved from, or start this one afresh")
        s, p = self.sampler, self.sampler.plan
        if st.mode == "buffer" and (st.world_size, st.batch_size, st.buffer_size) != (
                p.world_size, p.batch_size, p.buffer_size):
            raise ResumeError(f"a shard-then-buffer loader state (world size {st.world_size}, batch size "
                              f"{st.batch_size}, buffer {st.buffer_size}) resumes only with the same ones, this loader "
                              f"has {p.world_size}, {p.batch_size}, {p.buffer_size}",
                              fix="resume with the same ranks and batch size, or use shuffle_mode='global'")
        if st.consumed > s.epoch_samples:
            raise ResumeError(f"the loader state has consumed {st.consumed} of an epoch of {s.epoch_samples} samples",
                              fix="pass a state this loader's dataset wrote")
        if st.consumed and p.drop_last and st.batch_size * st.world_size != p.batch_size * p.world_size:
            rest = s.epoch_samples - st.consumed
            kept = num_batches(rest // p.world_size, p.batch_size, True) * p.batch_size * p.world_size
            log.warning("resuming epoch %d at sample %d of %d with a global batch of %d (saved with %d): drop_last "
                        "drops the last %d of the %d samples left, counted at the new size", st.epoch, st.consumed,
                        s.epoch_samples, p.batch_size * p.world_size, st.batch_size * st.world_size, rest - kept, rest)
        s.epoch, s.start = st.epoch, st.consumed
        self._pass, self.batches = None, 0
        log.info("resumed at epoch %d, sample %d of %d", st.epoch, st.consumed, s.epoch_samples)
