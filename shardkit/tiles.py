"""The public path of tiling's reader-side helpers: ``shardkit.tiles.stitch`` and the tile provenance types.

They live in :mod:`shardkit.images.tiles`; this module keeps the name users and their code already use."""

from .images.tiles import (
    Tile,
    Tiling,
    by_source,
    coverage,
    grid_starts,
    owned_box,
    stitch,
    stitch_split,
    weight_window,
)

__all__ = ["Tile", "Tiling", "by_source", "coverage", "grid_starts", "owned_box", "stitch", "stitch_split",
           "weight_window"]
