"""Which names in a split folder shardkit owns: what clean-up, on a local disk or in a bucket, may delete.

A split folder holds, besides the manifest and its kept versions, shard files (named by their format), samples
sidecars and shard records; anything else (a user's notes, another tool's files) is never deleted.
"""

from __future__ import annotations

from .formats.registry import all_formats
from .records import RECORD_PREFIX
from .samples import is_sidecar_name


def owned(name: str) -> bool:
    """A file name shardkit writes into a split folder: a shard record, a shard file or a samples sidecar."""
    return name.startswith(RECORD_PREFIX) or is_shard_name(name) or is_sidecar_name(name)


def is_shard_name(name: str) -> bool:
    """A final shard file name of any format (a split folder may hold an earlier run's other format)."""
    return any(fmt.owns(name) for fmt in all_formats())
