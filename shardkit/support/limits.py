"""Every limit shardkit holds data to, declared once (docs/hostile-input.md lists them).

Convert, the readers, ``verify`` and ``info`` all take their bounds from here, so a split convert writes is always
one they open: what a reader would refuse (a 1100-band image, a sample over :data:`MAX_PIXELS`), convert refuses
first, before it writes anything. The modules that check a limit keep importing it under the same name
(``splitfiles.MAX_BANDS`` …); this module imports nothing.
"""

from __future__ import annotations

# -- a stored sample: what a manifest or sidecar may declare, and so what convert may store -------------------
#: Most pixels per side of a stored image (and of a tiled source a sidecar records).
MAX_SIDE = 65536
#: Most pixels of one stored image (a 16384 x 16384 image); a reader allocates from this before any check of data.
MAX_PIXELS = 1 << 28
#: Most bands (channels) a stored image may have.
MAX_BANDS = 1024
#: Most classes of a class table (class ids are stored as uint8 or uint16).
MAX_CLASSES = 65536

# -- convert's inputs -------------------------------------------------------------------------------------------
#: Largest image or label (height x width) convert decodes by default (``--max-pixels``), checked from the file
#: header before any decoder runs. 2^24 (4096 x 4096): one worker converting a sample at the limit peaks at
#: 0.5 GB RSS (a colour-mask label, the costliest kind; TFRecord 0.68 GB with TensorFlow loaded), under ~1 GB per
#: worker at default settings (scripts/max_pixels_memory.py; docs/convert.md). 2^28 cost 3.4 GB per worker for one
#: 16384^2 PNG. Never above :data:`MAX_PIXELS` where an image is stored whole.
DEFAULT_MAX_PIXELS = 2**24
#: Largest ``--shard-size``: more samples or bytes than any shard can hold (and than int64 counts).
MAX_SHARD_SAMPLES = 2**31 - 1
MAX_SHARD_BYTES = 2**62

# -- volumes ----------------------------------------------------------------------------------------------------
#: Most voxels of one NIfTI volume decoded by default (``max_voxels``), checked from its header before any voxel is
#: read: 2^28 holds a 512 x 512 x 1024 CT (512 MiB as int16; 2 GiB as float64 after a header's slope).
DEFAULT_MAX_VOXELS = 2**28

# -- tiling -----------------------------------------------------------------------------------------------------
#: Default ``--max-tile-ratio``: most pixels a tiling may store per pixel of its source (of one tile, for a source
#: smaller than the tile), estimated from each source's header before anything is decoded. 16 allows a stride of a
#: quarter of the tile along both axes (75 % overlap); ``--tile 64 --stride 1`` (4096x) is refused.
DEFAULT_MAX_TILE_RATIO = 16.0

# -- stitching predictions (shardkit.images.tiles.stitch)
# ----------------------------------------------------------------
#: Largest source grid stitched by default (pixels of one source).
STITCH_MAX_PIXELS = 1 << 30
#: Most bytes :func:`shardkit.images.tiles.stitch` allocates by default: its output (channels counted) and the rows it
#: works on at a time together; above it, it refuses in one line before allocating. 768 MiB keeps a whole stitch
#: process under 1 GB (a 4096^2 vote at stride 128 peaks at 0.84 GB RSS); 8192^2 x 19 float32 logits (5.1 GB of
#: output alone) need ``max_bytes`` raised.
STITCH_MAX_BYTES = 768 << 20

# -- files a reader reads (sizes checked before anything is read or allocated) --------------------------------------
#: Largest manifest read (about 2 million samples): the JSON is parsed in memory.
MAX_MANIFEST_BYTES = 512 << 20
#: Most memory the parse of a manifest may take, as ``manifest.parse_cost`` estimates it from the bytes before
#: parsing (Python objects cost up to ~30x their JSON: ``[{},{},…]``); a manifest over it is refused unparsed.
MAX_PARSE_BYTES = 512 << 20
#: Largest samples sidecar read (a shard of ~1M samples with long paths).
MAX_SIDECAR_BYTES = 1 << 30
#: Longest key or label path (UTF-8 bytes) a sidecar may hold.
MAX_PATH_BYTES = 4096
