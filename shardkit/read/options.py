"""The reading contract: how a split is opened (:class:`OpenOptions`), what an epoch reads (:class:`EpochPlan`).

Both are frozen, validated on construction and picklable; ``OpenOptions`` is declared here, ``EpochPlan`` beside
the order it plans (:mod:`shardkit.read.sampling`, whose sampler holds it) and named here too.
``shardkit.open``/``Dataset``, ``make_loader``, ``ShardkitTorchDataset``, ``shardkit.tf.dataset``, the Keras
``ShardkitPyDataset`` and the ``CudaPrefetcher`` all take them, so an option added here reaches every adapter (an
s3:// split's ``cache_dir``/``cache_limit``/``storage_options`` included) instead of being restated in seven
signatures.

The adapters' keywords that these objects replaced (``shuffle=``, ``seed=``, ``labels=``, …) still work for one
release with a ``DeprecationWarning`` naming the replacement (:func:`fold_deprecated`).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..codecs import encoding
from ..errors import ConfigError
from .sampling import EpochPlan

#: ``remote_reads`` values (:mod:`shardkit.read.ranges`)
REMOTE_READS = ("auto", "ranges", "shards")

__all__ = ["EpochPlan", "OpenOptions", "adapter_options", "adapter_plan", "fold_deprecated", "refuse_unknown"]

LABEL_LAYOUTS = ("channels_last", "channels_first")


@dataclass(frozen=True)
class OpenOptions:
    """How a split is opened: what :func:`shardkit.open` and every adapter take as ``options=``.

    ``labels``: ``"ids"`` (H, W) class ids, ``"onehot"`` (H, W, C) uint8, ``"float_onehot"`` float32, or
    ``"stored"`` (the stored encoding as is). ``label_layout``: ``"channels_last"`` or ``"channels_first"``
    one-hot; None lets the reader choose (channels last; the PyTorch adapters follow their ``layout``).
    ``verify``: check every shard's sha256 on open. For a split on object storage (``s3://…``) shards are cached
    whole in ``cache_dir`` (default ``$SHARDKIT_CACHE_DIR`` or ``~/.cache/shardkit``), at most ``cache_limit``
    bytes (``"20GB"``, or a byte count), with ``storage_options`` for fsspec (endpoint, credentials).
    ``version=N`` opens the kept publish N of the split instead of the current one. ``remote_reads``: how a split
    on object storage is read — ``"shards"`` whole shards through the cache, ``"ranges"`` sample by sample with
    range requests (npy, LMDB, HDF5, uncompressed TFRecord; :mod:`shardkit.read.ranges`), ``"auto"`` (default)
    whole shards for a split that fits in ``cache_limit`` (or has none) or cannot be read by ranges, else chosen
    per batch: a sequential pass (consecutive samples in order) in whole shards through the cache, shuffled or
    sparse batches by ranges (the rule is logged on open).
    """

    labels: str = "ids"
    verify: bool = False
    label_layout: str | None = None
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | str | None = None
    storage_options: Mapping[str, Any] | None = field(default=None, hash=False)  # a dict: not hashable
    version: int | None = None
    remote_reads: str = "auto"

    def __post_init__(self) -> None:
        if self.labels not in encoding.READER_OUTPUTS:
            raise ConfigError(f"labels={self.labels!r} is not one of {', '.join(encoding.READER_OUTPUTS)}")
        if self.label_layout is not None and self.label_layout not in LABEL_LAYOUTS:
            raise ConfigError(f"label_layout={self.label_layout!r} is not channels_last or channels_first")
        if self.remote_reads not in REMOTE_READS:
            raise ConfigError(f"remote_reads={self.remote_reads!r} is not one of {', '.join(REMOTE_READS)}")
        if self.cache_limit is not None:
            from .cache import parse_limit  # the shard cache (multiprocessing, locks): not for every local open

            parse_limit(self.cache_limit)  # a bad limit is refused now, also for a split that is local after all
        if self.version is not None and (isinstance(self.version, bool) or not isinstance(self.version, int)
                                         or self.version < 1):
            raise ConfigError(f"version={self.version!r} is not a publish number (1, 2, …)")
        if self.storage_options is not None:  # a private copy: the caller's dict may change afterwards
            if not isinstance(self.storage_options, Mapping):
                raise ConfigError(f"storage_options must be a mapping, not {type(self.storage_options).__name__}")
            object.__setattr__(self, "storage_options", dict(self.storage_options))

    def replace(self, **changes: Any) -> OpenOptions:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def channels_first(self) -> bool:
        return self.label_layout == "channels_first"


T = TypeVar("T", OpenOptions, EpochPlan)


def fold_deprecated(where: str, given: dict[str, Any], base: T, names: tuple[str, ...] | None = None,
                    *, argument: str, stacklevel: int = 3) -> T:
    """Move the deprecated keywords of ``given`` that are fields of ``base``'s class (or ``names``) into a copy of
    ``base``, with one ``DeprecationWarning`` naming the replacement; they are removed from ``given``."""
    fields = names if names is not None else tuple(f.name for f in dataclasses.fields(base))
    moved = {k: given.pop(k) for k in list(given) if k in fields}
    if not moved:
        return base
    cls = type(base).__name__
    listed = ", ".join(f"{k}=" for k in moved)
    warnings.warn(f"{where}: {listed} {'is' if len(moved) == 1 else 'are'} deprecated and will be removed in the next "
                  f"release; pass {argument}=shardkit.{cls}(…) instead", DeprecationWarning, stacklevel=stacklevel)
    return base.replace(**moved)


def adapter_plan(where: str, plan: EpochPlan | int | None, given: dict[str, Any]) -> EpochPlan:
    """An adapter's ``plan`` argument with its deprecated sampling keywords (``batch_size=``, ``shuffle=``, …)
    folded in (removed from ``given``; a DeprecationWarning at the adapter's caller)."""
    if plan is None:
        if "batch_size" not in given:
            raise TypeError(f"{where}() missing its plan: an EpochPlan or a batch size")
        plan = int(given["batch_size"])  # still in given: folded below, with its warning
    elif "batch_size" in given:
        raise TypeError(f"{where}() got two batch sizes: plan and batch_size=")
    return fold_deprecated(where, given, EpochPlan.of(plan), argument="plan", stacklevel=4)


def adapter_options(where: str, options: OpenOptions | None, given: dict[str, Any]) -> OpenOptions:
    """An adapter's ``options`` argument with its deprecated ``labels=``/``verify=`` folded in (removed from
    ``given``; a DeprecationWarning at the adapter's caller)."""
    return fold_deprecated(where, given, options or OpenOptions(), ("labels", "verify"), argument="options",
                           stacklevel=4)


def refuse_unknown(where: str, given: dict[str, Any]) -> None:
    """The TypeError Python gives for an unexpected keyword, for what is left of ``given``."""
    if given:
        raise TypeError(f"{where}() got an unexpected keyword argument {next(iter(given))!r}")
