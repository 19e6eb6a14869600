"""Store: a split folder as a whole — the typed manifest, publishing versions, shard records for no-op re-runs,
the split folder that owns every name in it, statistics, duplicates and the columns ``verify`` recomputes.
Above the formats (it writes through them), below conversion and the readers."""
