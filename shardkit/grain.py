"""``shardkit.grain``: the Grain (JAX) adapter under a short name; grain is imported on first use (see
:mod:`shardkit.read.grain`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .read.grain import XY, ShardkitBatchSource, ShardkitSampler, ShardkitSource, batch_loader, data_loader

__all__ = ["XY", "ShardkitBatchSource", "ShardkitSampler", "ShardkitSource", "batch_loader", "data_loader"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from .read import grain as _grain

        return getattr(_grain, name)
    raise AttributeError(f"module 'shardkit.grain' has no attribute {name!r}")
