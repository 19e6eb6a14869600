"""Whether a thread's batches come from storage: decides if per-sample read-ahead hints are worth their cost.

Hints for memory-mapped shards (:mod:`shardkit.formats.mapping`) make reads from storage many times
faster but cost a page-cache walk per sample when the data is cached (about 6-8 % of a warm batched
read). The cheap signal is the kernel's count of blocks the process read from storage
(``getrusage`` ``ru_inblock``: page-cache misses, read-ahead included): a batch is hinted when anything was
read from storage while the same thread read its previous batch, and the first batch always is.
"""

from __future__ import annotations

try:
    import resource
except ImportError:  # not a Unix: no counter, always hint
    resource = None  # type: ignore[assignment]

# The whole process, not the reading thread: compressed chunks are decoded (and so read from the mapping) by the
# codec thread pool, whose page faults a per-thread count would miss; a warm batch would then switch the hints
# off for good. Counting the other threads' storage reads too errs towards hinting, which costs little.
_WHO = getattr(resource, "RUSAGE_SELF", 0)


def blocks_read() -> int:
    """512-byte blocks this process read from storage (its threads' page-cache misses, read-ahead included)."""
    return resource.getrusage(_WHO).ru_inblock if resource is not None else -1


class StorageReads:
    """Tracks whether the last read bracketed by :meth:`begin`/:meth:`end` came from storage."""

    __slots__ = ("_mark", "cold")

    def __init__(self) -> None:
        self.cold = True  # nothing known yet: hint the first batch
        self._mark = 0

    def begin(self) -> bool:
        """Start a read; returns whether to hint it (the previous one read from storage)."""
        self._mark = blocks_read()
        return self.cold

    def end(self) -> None:
        mark = blocks_read()
        self.cold = mark < 0 or mark != self._mark
