"""Per-sample records of a split: one sidecar ``.npy`` per shard (manifest version 2), read lazily.

A sidecar ``samples-<stem>.npy`` is a 1-D NumPy array with a packed structured dtype of fixed-width
fields (height, width, fingerprint, pixel hash, optional class bitmap, key and label path): readable with
``numpy.load(path, mmap_mode="r", allow_pickle=False)`` alone. The worker that writes a shard writes
its sidecar, so the converting parent never holds per-sample records, and ``shardkit.open`` parses
none of them. Spec: ``formats/samples.md``.

:class:`SampleTable` is ``Manifest.samples``: a read-only sequence of the same dicts manifest version 1
kept inline, loaded per shard on first touch (a bounded cache). Every sidecar read is checked (regular
file inside the folder, size as the manifest says, dtype and shape exactly as specified, sizes within
bounds) and a bad one is a one-line :class:`~shardkit.errors.ShardFormatError`.
"""

from __future__ import annotations

import hashlib
import threading
import tokenize
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ..errors import ConfigError, IntegrityError, ShardFormatError, ShardkitError
from ..images.looks import LOOK_BYTES
from ..images.tiles import TILE_FIELDS
from ..support.limits import MAX_PATH_BYTES, MAX_SIDECAR_BYTES
from .splitfiles import MAX_PIXELS, MAX_SIDE, check_regular_file, member_path

if TYPE_CHECKING:
    from .splitfiles import ShardInfo

SIDECAR_PREFIX = "samples-"
SIDECAR_SUFFIX = ".npy"
#: Splits with at most this many classes keep a per-sample bitmap of the classes present.
MAX_BITMAP_CLASSES = 256
#: Bytes of sidecar rows :class:`SampleTable` keeps cached (at least one shard's).
CACHE_BYTES = 16 << 20
FINGERPRINT_BYTES = 32
#: Bytes of a sample's pixel hash (:func:`pixel_hash`): the first 16 bytes of a SHA-256.
PIXEL_HASH_BYTES = 16


def pixel_hash(image: np.ndarray) -> bytes:
    """The stored image's pixel hash (formats/samples.md ``pixels``): equal for equal decoded pixels.

    SHA-256 of ``"<H>x<W>x<C>:<dtype.str>\\n"`` then the C-order pixel bytes, first 16 bytes. It hashes the
    pixels as stored (after preprocessing, before any image codec), so a copy of an image re-encoded
    losslessly (other PNG settings, another container) has the same hash; its file fingerprint does not.
    """
    arr = np.ascontiguousarray(image)
    shape = "x".join(str(d) for d in (*arr.shape[:2], arr.shape[2] if arr.ndim == 3 else 1))
    h = hashlib.sha256(f"{shape}:{arr.dtype.str}\n".encode())
    h.update(arr.data)
    return h.digest()[:PIXEL_HASH_BYTES]


def sidecar_name(stem: str) -> str:
    """File name of the sidecar of the shard called ``stem`` (``NNNNN-<12 hex>``)."""
    return f"{SIDECAR_PREFIX}{stem}{SIDECAR_SUFFIX}"


def is_sidecar_name(name: str) -> bool:
    """True for a (final) sidecar file name: what garbage collection may delete."""
    return name.startswith(SIDECAR_PREFIX) and name.endswith(SIDECAR_SUFFIX)


def sidecar_dtype(num_classes: int, key_bytes: int, label_bytes: int, pixels: bool = True,
                  tiles: bool = False, crs_bytes: int = 0, looks: bool = False) -> np.dtype:
    """The packed structured dtype of a sidecar row (formats/samples.md).

    ``pixels=False``: the row of sidecars written before the pixel hash column (still read); ``looks``: the look
    hash column after it (:func:`~shardkit.images.looks.look_hash`; absent in older sidecars). ``tiles``: the
    optional ``tile`` column of tiled conversions (``--tile``; :data:`~shardkit.images.tiles.TILE_FIELDS`).
    ``crs_bytes``: the georeference columns (manifest version 4, GeoTIFF sources): ``crs`` of that width and
    ``transform``, last.
    """
    fields: list[tuple[Any, ...]] = [("height", "<u4"), ("width", "<u4"), ("fingerprint", "|u1", (FINGERPRINT_BYTES,))]
    if pixels:
        fields.append(("pixels", "|u1", (PIXEL_HASH_BYTES,)))
    if looks:
        fields.append(("looks", "|u1", (LOOK_BYTES,)))
    if num_classes <= MAX_BITMAP_CLASSES:
        fields.append(("classes", "|u1", ((num_classes + 7) // 8,)))
    if tiles:
        fields.append(("tile", "<u4", (len(TILE_FIELDS),)))
    fields += [("key", f"|S{key_bytes}"), ("label", f"|S{label_bytes}")]
    if crs_bytes:
        fields += [("crs", f"|S{crs_bytes}"), ("transform", "<f8", (6,))]
    return np.dtype(fields)


def split_fingerprint(shard_digests: Sequence[str]) -> str:
    """``source.fingerprint`` of manifest version 2: sha256 of the shards' fingerprint digests, raw, in order."""
    h = hashlib.sha256()
    for d in shard_digests:
        h.update(bytes.fromhex(d))
    return h.hexdigest()


class SidecarBuilder:
    """Collects one shard's sample records in the worker and writes them as the shard's sidecar."""

    def __init__(self, num_classes: int, georef: bool = False) -> None:
        self.num_classes = num_classes
        #: the split records each sample's georeference (crs and transform columns; NaN/empty where it has none)
        self.georef = georef
        self.geo: list[Any] = []
        self.keys: list[bytes] = []
        self.labels: list[bytes] = []
        self.hw: list[tuple[int, int]] = []
        self.fingerprints: list[bytes] = []
        self.pixels: list[bytes] = []
        self.hashed = True  # every sample added with its pixel hash
        self.looks: list[bytes] = []
        self.looked = True  # every sample added with its look hash
        self.classes: list[Sequence[int]] = []
        self.tiles: list[tuple[int, ...]] = []  # the tile column's values, for tiled conversions (all or none)

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, key: str, label: str | None, height: int, width: int, fingerprint: str,
            classes: Sequence[int], pixels: bytes | None = None, tile: Sequence[int] | None = None,
            geo: Any = None, looks: bytes | None = None) -> None:
        """One written sample: its key and label paths, stored size, 64-hex fingerprint, classes present,
        and its :func:`pixel_hash` (None: unknown, e.g. a shard recorded before pixel hashes; the sidecar then
        has no ``pixels`` column); ``tile``: its provenance (:data:`~shardkit.images.tiles.TILE_FIELDS`), given for
        every
        sample of a tiled shard and for none of another."""
        if (tile is None) != (not self.tiles) and self.keys:
            raise ValueError("a sidecar holds tile provenance for every sample or for none")
        if tile is not None and len(tile) != len(TILE_FIELDS):
            raise ValueError(f"tile provenance {tile!r} is not {len(TILE_FIELDS)} values")
        raw = bytes.fromhex(fingerprint)
        if len(raw) != FINGERPRINT_BYTES:
            raise ValueError(f"fingerprint {fingerprint[:16]!r} is not 64 hex digits")
        if pixels is not None and len(pixels) != PIXEL_HASH_BYTES:
            raise ValueError(f"pixel hash of {len(pixels)} bytes, not {PIXEL_HASH_BYTES}")
        if looks is not None and len(looks) != LOOK_BYTES:
            raise ValueError(f"look hash of {len(looks)} bytes, not {LOOK_BYTES}")
        k, lab = key.encode("utf-8"), (label or "").encode("utf-8")
        if not k or len(k) > MAX_PATH_BYTES or len(lab) > MAX_PATH_BYTES or b"\0" in k + lab:
            raise ValueError(f"sample path {key!r} is empty, longer than {MAX_PATH_BYTES} bytes or holds a NUL")
        self.keys.append(k)
        self.labels.append(lab)
        self.hw.append((height, width))
        self.fingerprints.append(raw)
        if pixels is None:
            self.hashed = False
        else:
            self.pixels.append(bytes(pixels))
        if looks is None:
            self.looked = False
        else:
            self.looks.append(bytes(looks))
        self.classes.append(classes)
        if tile is not None:
            self.tiles.append(tuple(int(v) for v in tile))
        self.geo.append(geo)

    def digest(self) -> str:
        """The shard's fingerprint digest: sha256 of its samples' raw fingerprints in order."""
        return hashlib.sha256(b"".join(self.fingerprints)).hexdigest()

    def array(self) -> np.ndarray:
        """The sidecar rows."""
        crs = [(g[0] if g is not None else "").encode("utf-8")[:MAX_PATH_BYTES] for g in self.geo]
        dtype = sidecar_dtype(self.num_classes, max(map(len, self.keys), default=1),
                              max(max(map(len, self.labels), default=1), 1), pixels=self.hashed,
                              tiles=bool(self.tiles), looks=self.looked and bool(self.looks),
                              crs_bytes=max(max(map(len, crs), default=1), 1) if self.georef else 0)
        rows = np.zeros(len(self.keys), dtype)
        if len(rows):
            rows["height"], rows["width"] = np.asarray(self.hw, np.uint32).T
            rows["fingerprint"] = np.frombuffer(b"".join(self.fingerprints), np.uint8).reshape(-1, FINGERPRINT_BYTES)
            if self.hashed:
                rows["pixels"] = np.frombuffer(b"".join(self.pixels), np.uint8).reshape(-1, PIXEL_HASH_BYTES)
            if "looks" in (dtype.names or ()):
                rows["looks"] = np.frombuffer(b"".join(self.looks), np.uint8).reshape(-1, LOOK_BYTES)
            rows["key"], rows["label"] = self.keys, self.labels
            if self.tiles:
                rows["tile"] = np.asarray(self.tiles, np.uint32).reshape(-1, len(TILE_FIELDS))
            if "classes" in (dtype.names or ()):
                present = np.zeros((len(rows), self.num_classes), np.uint8)
                for j, ids in enumerate(self.classes):
                    present[j, list(ids)] = 1
                rows["classes"] = np.packbits(present, axis=-1, bitorder="big")
            if self.georef:
                rows["crs"] = crs
                rows["transform"] = [g[1] if g is not None else (np.nan,) * 6 for g in self.geo]
        return rows

    def to_bytes(self) -> bytes:
        """The sidecar file's bytes (``.npy`` format 1.0)."""
        return _npy_bytes(self.array())

    def write(self, path: Path) -> str:
        """Write the sidecar to ``path`` and return its sha256; one larger than readers read
        (:data:`~shardkit.support.limits.MAX_SIDECAR_BYTES`) is refused, not written."""
        data = self.to_bytes()
        if len(data) > MAX_SIDECAR_BYTES:
            raise ConfigError(f"a shard's samples sidecar would be {len(data)} bytes ({len(self.keys)} samples), "
                              f"more than the {MAX_SIDECAR_BYTES} its readers read", fix="use a smaller --shard-size")
        with open(path, "wb") as fh:
            fh.write(data)
        return hashlib.sha256(data).hexdigest()


def _npy_bytes(rows: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array(buf, rows, version=(1, 0), allow_pickle=False)
    return buf.getvalue()


def read_sidecar(directory: Path, shard: ShardInfo, num_classes: int,
                 size: tuple[int, int] | None = None) -> np.ndarray:
    """The checked rows of ``shard``'s sidecar in ``directory``; anything off is a one-line ShardFormatError.

    ``size``: the split's fixed (H, W), which every row must have.
    """

    entry = shard.samples
    if entry is None:
        raise ShardFormatError(f"shard {shard.index} names no samples sidecar", path=Path(directory) / "manifest.json",
                               fix="re-convert this split")
    path = member_path(entry.name, Path(directory))

    def bad(problem: str) -> ShardFormatError:
        return ShardFormatError(f"samples sidecar {problem}", path=path,
                                fix="re-convert this split; do not use datasets from untrusted sources")

    try:
        st = check_regular_file(path)
        if st.st_size != entry.bytes:
            raise IntegrityError(f"samples sidecar has {st.st_size} bytes, the manifest says {entry.bytes} "
                                 "(truncated or replaced)", path=path, fix="re-convert this split or restore the file")
        if entry.bytes > MAX_SIDECAR_BYTES:
            raise bad(f"is {entry.bytes} bytes, more than the {MAX_SIDECAR_BYTES} shardkit reads")
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version not in ((1, 0), (2, 0)):
                raise bad(f"has .npy version {version}, not 1.0 or 2.0")
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(fh)
            offset = fh.tell()
            if fortran or shape != (shard.num_samples,):
                raise bad(f"has shape {shape}, expected ({shard.num_samples},) in C order")
            _check_dtype(dtype, num_classes, bad)
            if offset + shard.num_samples * dtype.itemsize != entry.bytes:
                raise bad(f"holds {entry.bytes - offset} data bytes, {shard.num_samples} rows need "
                          f"{shard.num_samples * dtype.itemsize}")
            rows = np.frombuffer(fh.read(entry.bytes - offset), dtype)
    except ShardkitError:
        raise
    except FileNotFoundError:
        raise ShardFormatError("samples sidecar is missing", path=path, fix="re-convert this split") from None
    except OSError as exc:
        raise ShardFormatError(f"samples sidecar cannot be read ({exc.strerror or exc})", path=path,
                               fix="re-convert this split or restore the file") from None
    except (ValueError, TypeError, SyntaxError, tokenize.TokenError, RecursionError, MemoryError,
            OverflowError) as exc:  # a malformed .npy header (numpy parses it with tokenize and literal_eval)
        raise bad(f"is not a valid .npy file ({' '.join(str(exc).split())[:120]})") from None
    if len(rows) != shard.num_samples:
        raise bad(f"has {len(rows)} rows, the shard {shard.num_samples} samples")
    h, w = rows["height"].astype(np.int64), rows["width"].astype(np.int64)
    if len(rows) and (h.min() < 1 or w.min() < 1 or h.max() > MAX_SIDE or w.max() > MAX_SIDE
                      or (h * w).max() > MAX_PIXELS):
        raise bad(f"holds a sample size outside 1..{MAX_SIDE} per side and {MAX_PIXELS} pixels")
    if size is not None and len(rows) and not ((h == size[0]).all() and (w == size[1]).all()):
        raise bad(f"holds a sample size other than the split's fixed {size[0]}x{size[1]}")
    if "tile" in (rows.dtype.names or ()) and len(rows):
        t = rows["tile"].astype(np.int64)
        ty, tx, th, tw, sh, sw = (t[:, k] for k in range(len(TILE_FIELDS)))
        if ((th < 1) | (tw < 1) | (th > h) | (tw > w) | (ty + th > sh) | (tx + tw > sw)).any():
            raise bad("holds a tile region outside its stored sample or its source")
    for field in ("key", "label"):
        try:
            b"\n".join(rows[field].tolist()).decode("utf-8")
        except UnicodeDecodeError:
            raise bad(f"holds a {field} path that is not UTF-8") from None
    return rows


def _check_dtype(dtype: np.dtype, num_classes: int, bad: Callable[[str], ShardFormatError]) -> None:
    """Refuse any dtype but the spec's (field names, order, types, packing; path widths 1..MAX_PATH_BYTES)."""
    names = dtype.names or ()
    widths = []
    for field in ("key", "label"):
        sub = dtype.fields.get(field) if dtype.fields else None
        if sub is None or sub[0].kind != "S" or not 1 <= sub[0].itemsize <= MAX_PATH_BYTES:
            raise bad(f"has dtype {str(dtype)[:120]}, not the specified record")
        widths.append(sub[0].itemsize)
    crs = dtype.fields.get("crs") if dtype.fields else None
    if crs is not None and (crs[0].kind != "S" or not 1 <= crs[0].itemsize <= MAX_PATH_BYTES):
        raise bad(f"has dtype {str(dtype)[:120]}, not the specified record")
    want = sidecar_dtype(num_classes, widths[0], widths[1], pixels="pixels" in names,  # every revision
                         tiles="tile" in names, crs_bytes=crs[0].itemsize if crs is not None else 0,
                         looks="looks" in names)
    if dtype != want or names != want.names:
        raise bad(f"has dtype {str(dtype)[:120]}, not the specified record")


def record(rows: np.ndarray, j: int, num_classes: int, where: Path | None = None) -> dict[str, Any]:
    """Row ``j`` as the manifest version 1 dict (key, label, height, width, fingerprint, classes)."""
    row = rows[j]
    try:
        key, label = bytes(row["key"]).decode("utf-8"), bytes(row["label"]).decode("utf-8")
    except UnicodeDecodeError:
        raise ShardFormatError(f"samples sidecar row {j} holds a path that is not UTF-8", path=where,
                               fix="re-convert this split") from None
    out: dict[str, Any] = {"key": key, "label": label or None, "height": int(row["height"]),
                           "width": int(row["width"]), "fingerprint": bytes(row["fingerprint"]).hex()}
    if "pixels" in (rows.dtype.names or ()):
        out["pixels"] = bytes(row["pixels"]).hex()
    if "looks" in (rows.dtype.names or ()):
        out["looks"] = bytes(row["looks"]).hex()
    if "classes" in (rows.dtype.names or ()):
        bits = np.unpackbits(row["classes"], count=num_classes, bitorder="big")
        out["classes"] = np.flatnonzero(bits).tolist()
    if "tile" in (rows.dtype.names or ()):
        out["tile"] = dict(zip(TILE_FIELDS, (int(v) for v in row["tile"]), strict=True))
    if "crs" in (rows.dtype.names or ()):  # the source's georeference (formats/samples.md), None where it had none
        transform = [float(v) for v in row["transform"]]
        known = all(np.isfinite(transform))
        out["crs"] = bytes(row["crs"]).decode("utf-8", "replace") or None if known else None
        out["transform"] = transform if known else None
    return out


#: Hands out the folder holding a shard's sidecar, kept there while the block runs (a split's byte source).
Sidecars = Callable[["ShardInfo"], AbstractContextManager[Path]]


class SampleTable(Sequence[dict[str, Any]]):
    """``Manifest.samples``: one read-only record per sample, in global index order.

    Version 1 manifests hand their inline list; version 2 tables read each shard's sidecar on first touch
    and keep the rows of recently used shards (at most :data:`CACHE_BYTES`). ``sidecars`` hands out the folder
    holding a shard's sidecar, kept there while it is read (a remote split's byte source,
    :class:`shardkit.store.source.ByteSource`); by default the manifest's folder.
    """

    def __init__(self, shards: Sequence[ShardInfo], num_classes: int, directory: Path | None = None,
                 inline: Sequence[dict[str, Any]] | None = None, size: tuple[int, int] | None = None, *,
                 sidecars: Sidecars | None = None) -> None:
        self.shards = tuple(shards)
        self.num_classes = num_classes
        self.directory = directory
        self.inline = tuple(inline) if inline is not None else None
        self.size = size
        self.sidecars = sidecars
        self.loads = 0  # sidecars read by this process (tests check that opening reads none)
        self._starts = np.array([s.first_index for s in self.shards], np.int64)
        self._total = sum(s.num_samples for s in self.shards)
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # readers' threads share the cache

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = OrderedDict()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.inline) if self.inline is not None else self._total

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SampleTable):
            return NotImplemented
        return (self.inline, self.shards) == (other.inline, other.shards)  # the same records, wherever they lie

    __hash__ = None  # type: ignore[assignment]

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if self.inline is not None:
            return self.inline[i]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples")
        i %= n
        pos = int(np.searchsorted(self._starts, i, side="right")) - 1
        while self.shards[pos].num_samples == 0 or i >= self.shards[pos].first_index + self.shards[pos].num_samples:
            pos += 1  # empty shards share their first_index with the next one
        shard = self.shards[pos]
        return record(self.rows(pos), i - shard.first_index, self.num_classes, self._path(shard))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Every record, shard by shard (only one shard's rows held at a time beyond the cache)."""
        if self.inline is not None:
            yield from self.inline
            return
        for pos, shard in enumerate(self.shards):
            rows = self.rows(pos)
            for j in range(shard.num_samples):
                yield record(rows, j, self.num_classes, self._path(shard))

    def _path(self, shard: ShardInfo) -> Path | None:
        return self._folder() / shard.samples.name if shard.samples is not None else None

    def _folder(self) -> Path:
        if self.directory is None:
            raise ShardFormatError("sample records are not available (no split folder)", path=None,
                                   fix="load the manifest from its split folder")
        return self.directory

    def _read(self, shard: ShardInfo, directory: Path | None) -> np.ndarray:
        """``shard``'s checked sidecar rows: from ``directory``, else from the folder :attr:`sidecars` holds it in
        while it is read, else from the manifest's folder."""
        if directory is None and self.sidecars is not None:
            with self.sidecars(shard) as held:
                return read_sidecar(held, shard, self.num_classes, self.size)
        return read_sidecar(directory or self._folder(), shard, self.num_classes, self.size)

    def rows(self, pos: int, directory: Path | None = None) -> np.ndarray:
        """The checked sidecar rows of the shard at position ``pos`` (cached; ``directory`` overrides)."""
        if self.inline is not None:
            raise TypeError("a version 1 manifest has no sidecars")
        with self._lock:
            hit = self._cache.get(pos)
            if hit is not None:
                self._cache.move_to_end(pos)
                return hit
        shard = self.shards[pos]
        rows = self._read(shard, directory)
        with self._lock:
            self.loads += 1
            self._cache[pos] = rows
            while len(self._cache) > 1 and sum(r.nbytes for r in self._cache.values()) > CACHE_BYTES:
                self._cache.popitem(last=False)
        return rows

    def hw(self, pos: int, directory: Path | None = None) -> np.ndarray:
        """(n, 2) int64 (H, W) of the shard at position ``pos``'s samples."""
        shard = self.shards[pos]
        if self.inline is not None:
            recs = self.inline[shard.first_index : shard.first_index + shard.num_samples]
            return np.array([(r["height"], r["width"]) for r in recs], np.int64).reshape(-1, 2)
        rows = self.rows(pos, directory)
        return np.stack([rows["height"], rows["width"]], axis=1).astype(np.int64).reshape(-1, 2)

    def keys(self, pos: int, directory: Path | None = None) -> list[str]:
        """The keys of the shard at position ``pos``'s samples, from the key column alone (no record is built)."""
        if self.inline is not None:
            return [str(r["key"]) for r in self._inline_records(pos)]
        return [bytes(k).decode("utf-8") for k in self.rows(pos, directory)["key"].tolist()]

    def _inline_records(self, pos: int) -> Sequence[dict[str, Any]]:
        shard = self.shards[pos]
        return (self.inline or ())[shard.first_index : shard.first_index + shard.num_samples]

    def presence(self, pos: int, directory: Path | None = None) -> np.ndarray | None:
        """(n, num_classes) bool: which classes each sample of the shard at ``pos`` contains (its bitmap);
        None where the records keep no bitmap (more than :data:`MAX_BITMAP_CLASSES` classes)."""
        n, c = self.shards[pos].num_samples, self.num_classes
        if self.inline is not None:
            recs = self._inline_records(pos)
            if any("classes" not in r for r in recs):
                return None
            out = np.zeros((n, c), bool)
            for j, r in enumerate(recs):
                ids = np.asarray(r["classes"], np.int64)
                out[j, ids[(ids >= 0) & (ids < c)]] = True
            return out
        rows = self.rows(pos, directory)
        if "classes" not in (rows.dtype.names or ()):
            return None
        return np.unpackbits(rows["classes"], axis=-1, count=c, bitorder="big").astype(bool).reshape(n, c)

    def pixel_hashes(self, pos: int, directory: Path | None = None) -> np.ndarray | None:
        """(n, PIXEL_HASH_BYTES) uint8 pixel hashes of the shard at ``pos``'s samples; None where its records
        keep none (written before the ``pixels`` column)."""
        n = self.shards[pos].num_samples
        if self.inline is not None:
            recs = self._inline_records(pos)
            if any("pixels" not in r for r in recs):
                return None
            return np.frombuffer(bytes.fromhex("".join(str(r["pixels"]) for r in recs)),
                                 np.uint8).reshape(n, PIXEL_HASH_BYTES)
        rows = self.rows(pos, directory)
        if "pixels" not in (rows.dtype.names or ()):
            return None
        return np.asarray(rows["pixels"]).reshape(n, PIXEL_HASH_BYTES)

    def look_hashes(self, pos: int, directory: Path | None = None) -> np.ndarray | None:
        """(n, LOOK_BYTES) uint8 look hashes of the shard at ``pos``'s samples; None where its records keep none
        (written before the ``looks`` column, or manifest version 1)."""
        if self.inline is not None:
            return None
        rows = self.rows(pos, directory)
        if "looks" not in (rows.dtype.names or ()):
            return None
        return np.asarray(rows["looks"]).reshape(self.shards[pos].num_samples, LOOK_BYTES)

    def fingerprint(self) -> str:
        """``source.fingerprint`` recomputed from the records, streamed shard by shard (what verify checks)."""
        if self.inline is not None:
            h = hashlib.sha256()
            for k, rec in enumerate(self.inline):
                h.update((("\n" if k else "") + str(rec.get("fingerprint"))).encode())
            return h.hexdigest()
        return split_fingerprint([hashlib.sha256(self.rows(pos)["fingerprint"].tobytes()).hexdigest()
                                  for pos in range(len(self.shards))])
