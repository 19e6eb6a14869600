"""HDF5 shards: one ``shard-<stem>.h5`` per shard, readable with plain ``h5py`` or ``h5dump``.

Fixed size: ``images`` (n, H, W, 3) uint8 and ``labels`` (n, H, W[, C]), one sample per chunk.
Variable size: ``images`` and ``labels`` flattened to 1-D (samples concatenated in C order),
``shapes`` (n, 2) int64 of (H, W) and ``offsets`` (n + 1, 2) int64 (start of sample i in images
and labels; the last row holds the totals). ``keys`` holds the source keys. Optional lossless
lzf/gzip compression (``--compression``, format version 1), or per-array codecs (format version 2):
zstd and lz4 through the standard registered HDF5 filters of ``hdf5plugin`` (ids 32015, 32004), so
``h5py`` + ``import hdf5plugin`` read them without shardkit. Files are written with ``libver=("earliest", "v110")`` and
``track_times=False``: the same input gives byte-identical files. Spec: ``formats/hdf5.md``.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..codecs.registry import (
    RAW,
    ArrayCodecs,
    Codec,
    CodecDataError,
    Zstd,
    inflate_into,
    lzf_decode_into,
    require,
    run_parallel,
)
from ..errors import ConfigError, ShardFormatError
from .base import SampleSpec, ShardFormat, ShardReader, ShardWriter
from .mapping import MappedArray

FORMAT_ID = "shardkit-hdf5"
LIBVER = ("earliest", "v110")
FLAT_CHUNK = 1 << 18  # elements per chunk of the 1-D variable-size datasets
GZIP_LEVEL = 4
#: registered HDF5 filter id of each codec (hdf5plugin's Zstd and LZ4 filters; formats/hdf5.md)
FILTER_IDS: dict[str, int] = {"zstd": 32015, "lz4": 32004}


def _compression(name: str) -> dict[str, Any]:
    if name == "gzip":
        return {"compression": "gzip", "compression_opts": GZIP_LEVEL}
    return {"compression": "lzf"} if name == "lzf" else {}


def _filter(codec: Codec) -> dict[str, Any]:
    """h5py ``create_dataset`` keywords of a codec: hdf5plugin's registered Zstd / LZ4 filters, or none."""
    if codec.name == "raw":
        return {}
    plugin = require("hdf5plugin", codec.name)
    if codec.name == "zstd":
        return dict(plugin.Zstd(clevel=codec.config["level"]))
    if codec.name == "lz4":
        return dict(plugin.LZ4(nbytes=0))
    raise ValueError(f"codec {codec} has no HDF5 filter")  # pragma: no cover - refused by Hdf5Format


def register_filters(codecs: ArrayCodecs) -> None:
    """Make HDF5 find the filters a version 2 shard uses (importing ``hdf5plugin`` registers them)."""
    if not codecs.raw:
        require("hdf5plugin", "zstd/lz4 in HDF5")


class Hdf5Writer(ShardWriter):
    write_errors = (OSError, RuntimeError)  # h5py: "Can't synchronously write data", "Unable to flush raw data"

    def __init__(self, directory: Path, stem: str, spec: SampleSpec, planned: int, compression: str,
                 codecs: ArrayCodecs = RAW) -> None:
        super().__init__(directory, stem, spec, planned, compression, codecs)
        self._file = h5py.File(self.tmp_files[0], "w", libver=LIBVER, track_order=False)
        self._fd = int(self._file.id.get_vfd_handle())  # the sec2 driver's descriptor, for abort
        st = os.fstat(self._fd)
        self._fd_identity = (st.st_dev, st.st_ino)
        self._closing = self._closed = False
        self._keys: list[str] = []
        self._shapes: list[tuple[int, int]] = []
        size = spec.size
        img_shape, lab_shape = (spec.image_shape(size), spec.label_shape(size)) if size else (None, None)
        self._images = self._dataset("images", spec.stored_image_dtype, img_shape, codecs.image)
        self._labels = self._dataset("labels", spec.stored_label_dtype, lab_shape, codecs.label)

    def _dataset(self, name: str, dtype: Any, sample: tuple[int, ...] | None, codec: Codec) -> Any:
        """Resizable, untimed dataset: one sample per chunk, or 1-D in fixed chunks if ``sample`` is None."""
        shape, chunks = ((self.planned, *sample), (1, *sample)) if sample else ((0,), (FLAT_CHUNK,))
        filters = _filter(codec) if not self.codecs.raw else _compression(self.compression)
        return self._file.create_dataset(name, shape, dtype, maxshape=(None, *shape[1:]), chunks=chunks,
                                         track_times=False, **filters)

    @classmethod
    def file_names(cls, stem: str, spec: SampleSpec) -> tuple[str, ...]:
        return (f"shard-{stem}.h5",)

    def add(self, image: np.ndarray, label: np.ndarray, key: str) -> None:
        img, lab = self.stored(image, label)
        if self.spec.size is not None:
            self._images[self.count] = img
            self._labels[self.count] = lab
        else:
            for ds, arr in ((self._images, img), (self._labels, lab)):
                start = ds.shape[0]
                ds.resize((start + arr.size,))
                ds[start:] = arr.ravel()
            self._shapes.append((img.shape[0], img.shape[1]))
        self._keys.append(key)
        self.count += 1

    def _finish(self) -> None:
        f, n = self._file, self.count
        if self.spec.size is not None:
            self._images.resize(n, axis=0)
            self._labels.resize(n, axis=0)
        else:
            shapes = np.array(self._shapes, dtype="<i8").reshape(-1, 2)
            f.create_dataset("shapes", data=shapes, track_times=False)
            f.create_dataset("offsets", data=self.spec.flat_offsets(shapes), track_times=False)
        keys = np.array(self._keys, dtype=object)
        f.create_dataset("keys", data=keys, dtype=h5py.string_dtype(), track_times=False)
        f.attrs.update({
            "format": FORMAT_ID, "format_version": Hdf5Format.version_for(self.compression, self.codecs, self.spec),
            "num_samples": n, "layout": "fixed" if self.spec.size is not None else "flat",
            "label_encoding": self.spec.label_encoding, "num_classes": self.spec.num_classes,
            "label_dtype": self.spec.stored_label_dtype.str, "compression": self.compression,
        })
        if not self.codecs.raw:
            f.attrs.update({"image_codec": str(self.codecs.image), "label_codec": str(self.codecs.label)})
        f.flush()  # a full disk fails here, with the file still whole enough for abort to close it (a failed
        self._closing = True  # close leaves HDF5 half-closed: calling into it again crashes the process)
        f.close()
        self._closed = True

    def abort(self) -> None:
        """Close the file before removing it. HDF5 flushes its caches on close (and when a dataset object is
        freed): after a failed write (disk full) that flush fails again, and the file left open crashed the
        process (SIGSEGV) at exit. So its descriptor is first pointed at ``/dev/null`` (the file is abandoned
        anyway): the last flushes succeed into nothing and the close is clean."""
        with contextlib.suppress(OSError):  # the descriptor taken at open: HDF5's own handles may be half-closed
            st = os.fstat(self._fd)  # still our file's (once closed, the number may name another file)
            if not self._closed and (st.st_dev, st.st_ino) == self._fd_identity:
                null = os.open(os.devnull, os.O_RDWR)
                try:
                    os.dup2(null, self._fd)
                finally:
                    os.close(null)
        if not self._closing:
            with contextlib.suppress(Exception):
                self._images = self._labels = None
                self._file.close()
        super().abort()


def _nfilters(ds: Any) -> int:
    """How many filters (compression) a dataset's chunks pass through; 0 for contiguous storage."""
    return int(ds.id.get_create_plist().get_nfilters())


def _plain(value: Any) -> Any:
    """An HDF5 attribute as a plain str or int to compare (an array or anything else: its repr, never equal)."""
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, (str, np.str_)):
        return str(value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    return repr(value)[:80]


def _foreign_storage(f: Any) -> str | None:
    """What in ``f`` points outside the file (soft/external link, external raw storage, virtual dataset), or None."""
    names: list[str] = []
    f.visit_links(names.append)  # every link once, without following any
    links = [(name, f.get(name, getlink=True)) for name in names]
    for name, link in links:
        if isinstance(link, h5py.ExternalLink):
            return f"{name!r} is an external link to {link.filename}:{link.path}"
        if isinstance(link, h5py.SoftLink):
            return f"{name!r} is a soft link to {link.path}"
    for name, _link in links:
        obj = f.get(name)
        if isinstance(obj, h5py.Dataset):
            if obj.is_virtual:
                return f"dataset {name!r} is a virtual dataset"
            if obj.id.get_create_plist().get_external_count() > 0:
                return f"dataset {name!r} uses external raw storage"
    return None


class Hdf5Reader(ShardReader):
    """One read-only h5py file per process, opened lazily; uncompressed chunks copied from a memory map.

    An uncompressed shard (no filters: ``compression="none"``) stores every chunk as raw bytes in the
    file. At open the reader looks up each chunk's byte offset once (``chunk_iter``/``get_chunk_info``),
    checks it, and from then on reads straight from a read-only memory map of the file: ``read`` returns
    zero-copy read-only views, batches are one ``memcpy`` per sample into the caller's arrays. Compressed
    shards, or anything the checks do not accept, use h5py (hyperslab reads into caller memory).
    """

    _file: Any = None
    _offsets: np.ndarray | None = None
    _shapes: np.ndarray | None = None
    _map: np.ndarray | None = None  # the whole file, read-only uint8 (memory map); None: h5py path
    _chunks: dict[str, _ChunkTable] | None = None  # "images"/"labels" → where each chunk's bytes are
    _mapping: MappedArray | None = None  # the mmap under _map, for read-ahead hints

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_file", "_offsets", "_shapes", "_map", "_chunks", "_mapping")

    @property
    def direct(self) -> bool:
        """True when this process reads samples from the memory map rather than through h5py."""
        self.ensure_open()
        return self._map is not None

    def _open(self) -> None:
        self._map = self._chunks = self._mapping = None
        register_filters(self.codecs)
        try:
            self._file = f = h5py.File(self.h5_source(), "r")
            foreign = _foreign_storage(f)
            if foreign is not None:
                f.close()
                self._file = None
                raise ShardFormatError(
                    f"refusing HDF5 shard: {foreign}, which reads data from outside this file",
                    path=self.corrupt("").path,
                    fix="shardkit never writes links or external storage; do not use shards from untrusted "
                        "sources; re-convert this split")
            attrs = {k: _plain(f.attrs.get(k)) for k in ("format", "format_version", "num_samples")}
            images, labels = f["images"], f["labels"]
            if not isinstance(images, h5py.Dataset) or not isinstance(labels, h5py.Dataset):
                raise self.corrupt("'images' and 'labels' are not both datasets")
            if self.spec.size is None:
                sh, off, n = f["shapes"], f["offsets"], len(self)
                if not (isinstance(sh, h5py.Dataset) and isinstance(off, h5py.Dataset)
                        and sh.shape == (n, 2) and off.shape == (n + 1, 2)  # checked before reading them
                        and sh.dtype.kind in "iu" and off.dtype.kind in "iu"
                        and not _nfilters(sh) and not _nfilters(off)):  # HDF5's filters are unbounded
                    raise self.corrupt(f"'shapes'/'offsets' are not uncompressed ({n}, 2)/({n + 1}, 2) integer "
                                       "datasets")
                self._shapes, self._offsets = sh[()], off[()]
        except ShardFormatError:
            raise
        except (OSError, KeyError, ValueError, RuntimeError) as exc:  # RuntimeError: a damaged heap or B-tree
            raise self.corrupt(f"cannot open HDF5 shard ({exc})") from None
        try:
            self._check_datasets(attrs, images, labels)
        except (OSError, ValueError, RuntimeError, TypeError) as exc:  # a damaged datatype or dataspace
            raise self.corrupt(f"cannot read the HDF5 datasets' shapes and types ({type(exc).__name__}: {exc})") \
                from None
        self._open_map(f, images, labels)

    def h5_source(self) -> Any:
        """What ``h5py.File`` opens: the shard's path (a range reader gives a file object)."""
        return str(self.path(self.shard.files[0].name))

    def _check_datasets(self, attrs: dict[str, Any], images: Any, labels: Any) -> None:
        """The root attributes and the datasets' shapes, dtypes and chunk sizes against the manifest."""
        n = len(self)
        if attrs != {"format": FORMAT_ID, "format_version": self.format_version, "num_samples": n}:
            raise self.corrupt(f"HDF5 attributes {attrs} disagree with the manifest ({n} samples)")
        if self.spec.size is not None:
            size = self.spec.size
            ok = images.shape == (n, *self.spec.image_shape(size)) and labels.shape == (n, *self.spec.label_shape(size))
        else:
            shapes, offsets = self._shapes, self._offsets
            assert shapes is not None and offsets is not None
            ok = (shapes.shape == (n, 2) and np.array_equal(offsets, self.spec.flat_offsets(shapes))
                  and images.shape == (offsets[-1, 0],) and labels.shape == (offsets[-1, 1],))
            if ok:
                self.check_shapes_table(shapes, self.shard.files[0].name)
        if not ok or images.dtype != self.spec.stored_image_dtype or labels.dtype != self.spec.stored_label_dtype:
            raise self.corrupt(f"datasets {images.shape}/{labels.shape} disagree with manifest ({n} samples)")
        for ds in (images, labels):  # a read decompresses whole chunks: one chunk must not outweigh a sample
            chunk, limit = ds.chunks, max(ds.dtype.itemsize * FLAT_CHUNK, ds.nbytes // max(n, 1))
            if chunk is not None and int(np.prod(chunk, dtype=np.int64)) * ds.dtype.itemsize > limit:
                raise self.corrupt(f"dataset {ds.name!r} has chunks of {chunk}, larger than one sample "
                                   f"(a read would decompress all of it)")

    def _open_map(self, f: Any, images: Any, labels: Any) -> None:
        """Memory-map the file and index its chunks. Uncompressed datasets whose table a check refuses keep the
        h5py path (HDF5 copies a raw chunk of its declared size); compressed ones are only ever decoded here,
        bounded by the declared chunk (HDF5's own filters are not), so for them any refusal is an error."""
        problem = self._map_tables(f, images, labels)
        try:
            filtered = bool(_nfilters(images) or _nfilters(labels))
        except (OSError, ValueError, RuntimeError, TypeError):
            filtered = True  # cannot tell: never hand it to HDF5's filters
        if problem is not None and filtered:
            raise self.corrupt(f"its compressed chunks cannot be read safely: {problem}")

    def _map_tables(self, f: Any, images: Any, labels: Any) -> str | None:
        """Set up the memory-mapped path, or say why not."""
        try:
            with open(self.path(self.shard.files[0].name), "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size == 0:
                    return "the file is empty"
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            whole = np.frombuffer(mm, np.uint8)
            tables = chunk_tables(f, (images, labels), size, self)
            if isinstance(tables, str):
                return tables
            for ds in (images, labels):
                table = tables[ds.name.lstrip("/")]
                if isinstance(table, _ChunkTable) and not table.spot_check(ds, whole):
                    return f"{ds.name!r} chunks are not where HDF5 says"
        except (OSError, ValueError, RuntimeError, NotImplementedError, AttributeError, TypeError) as exc:
            return f"{type(exc).__name__}: {exc}"
        self._map, self._chunks, self._mapping = whole, tables, MappedArray(mm, 0)
        return None

    def prefetch(self, local_indices: Sequence[int] | np.ndarray, cold: bool = True) -> None:
        """Read-around off and ``MADV_WILLNEED`` on exactly the file bytes of the chunks that hold samples
        ``local_indices`` (raw or coded, sorted, touching ranges merged), when they are read from the memory map;
        nothing when not ``cold`` or on the h5py path (HDF5 reads exactly what it needs itself)."""
        idx = self.hint_indices(local_indices, cold)
        mapping, chunks = self._mapping, self._chunks
        if idx is None or mapping is None or chunks is None:
            return
        if self.spec.size is not None:
            parts = [chunks[name].row_ranges(idx, idx + 1) for name in ("images", "labels")]
        else:
            assert self._offsets is not None
            parts = [chunks[name].row_ranges(self._offsets[idx, k], self._offsets[idx + 1, k])
                     for k, name in enumerate(("images", "labels"))]
        begin, end = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        order = np.argsort(begin, kind="stable")
        mapping.set_random()
        mapping.will_need(begin[order], end[order])

    def _get(self, name: str, sel: Any, out: np.ndarray | None = None, dest: Any = None) -> np.ndarray:
        """``self._file[name][sel]`` (or straight into ``out[dest]``), with HDF5 errors as one-line errors."""
        try:
            ds = self._file[name]
            if out is None:
                return ds[sel]
            ds.read_direct(out, source_sel=sel, dest_sel=dest)
            return out
        except (OSError, ValueError, RuntimeError) as exc:
            raise self.corrupt(f"cannot read {name} {sel} ({exc})") from None

    def _will_need_one(self, i: int) -> None:
        """``MADV_WILLNEED`` on sample ``i``'s chunk bytes (``read`` calls it, as npy's does: a single read from
        storage then comes in one request instead of the kernel's read-around of every page it touches)."""
        mapping, chunks = self._mapping, self._chunks
        if mapping is None or chunks is None:
            return
        for k, name in enumerate(("images", "labels")):
            if self.spec.size is not None:
                begin, end = chunks[name].sample_range(i)
                mapping.will_need_one(begin, end)
            else:
                assert self._offsets is not None
                r = self._offsets[i : i + 2, k]
                mapping.will_need(*chunks[name].row_ranges(r[:1], r[1:]))

    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        self.ensure_open()
        if 0 <= i < len(self):
            self._will_need_one(i)
        chunks, whole = self._chunks, self._map
        if self.spec.size is not None:
            if chunks is not None and whole is not None:
                return chunks["images"].sample(whole, i), chunks["labels"].sample(whole, i)
            return self._get("images", i), self._get("labels", i)
        assert self._offsets is not None and self._shapes is not None
        (a0, b0), (a1, b1) = (int(v) for v in self._offsets[i]), (int(v) for v in self._offsets[i + 1])
        hw = (int(self._shapes[i, 0]), int(self._shapes[i, 1]))
        if chunks is not None and whole is not None:
            image, label = chunks["images"].rows(whole, a0, a1, i), chunks["labels"].rows(whole, b0, b1, i)
        else:
            image, label = self._get("images", np.s_[a0:a1]), self._get("labels", np.s_[b0:b1])
        return image.reshape(self.spec.image_shape(hw)), label.reshape(self.spec.label_shape(hw))

    def _read_fixed_batch(self, idx: np.ndarray, out_images: np.ndarray, out_labels: np.ndarray) -> bool:
        """From the map: one copy per sample. Else hyperslab reads, one per run of consecutive indices."""
        chunks, whole = self._chunks, self._map
        if chunks is not None and whole is not None:
            if idx.min() < 0 or idx.max() >= len(self):
                raise IndexError(f"local indices {idx.min()}..{idx.max()} out of range for {len(self)} samples")
            jobs: list[Any] = []
            for name, out in (("images", out_images), ("labels", out_labels)):
                table = chunks[name]
                if isinstance(table, _FilteredChunks):
                    jobs += table.jobs(whole, idx, out)
                else:
                    table.gather(whole, idx, out)
            run_parallel(jobs)  # version 2: every coded chunk decoded on the thread pool into its slot
            return True
        order = np.argsort(idx, kind="stable")
        k = 0
        while k < len(order):
            run = 1  # extend while both the sample and the output slot are consecutive
            while (k + run < len(order) and idx[order[k + run]] == idx[order[k]] + run
                   and order[k + run] == order[k] + run):
                run += 1
            src, dst = np.s_[idx[order[k]] : idx[order[k]] + run], np.s_[order[k] : order[k] + run]
            self._get("images", src, out_images, dst)
            self._get("labels", src, out_labels, dst)
            k += run
        return True


def chunk_tables(f: Any, datasets: Sequence[Any], size: int, reader: ShardReader) -> dict[str, Any] | str:
    """Where each chunk of ``datasets`` (images, labels) lies in the file of ``size`` bytes (a
    :class:`_ChunkTable` per raw dataset, a :class:`_FilteredChunks` per compressed one, by name), or why not."""
    if f.id.get_create_plist().get_userblock() != 0:
        return "it has a user block (shardkit writes none)"
    tables: dict[str, Any] = {}
    for ds in datasets:
        if _nfilters(ds):
            table: Any = _FilteredChunks.build(ds, size, reader)
            if isinstance(table, str):
                return table
        else:
            table = _ChunkTable.build(ds, size)
            if table is None:
                return f"{ds.name!r} chunks are not raw, whole and inside the file"
        tables[ds.name.lstrip("/")] = table
    return tables


def _chunk_infos(ds: Any) -> list[Any]:
    """Every stored chunk's info (offset in the dataset, byte offset and size in the file, filter mask)."""
    infos: list[Any] = []
    try:
        ds.id.chunk_iter(infos.append)
    except (AttributeError, NotImplementedError, RuntimeError):  # HDF5 before 1.12.3 / 1.14
        infos = [ds.id.get_chunk_info(j) for j in range(ds.id.get_num_chunks())]
    return infos


#: Filters whose chunks shardkit decodes itself, bounded by the chunk's size (:class:`_FilteredChunks`).
DEFLATE, LZF = 1, 32000
DECODED_FILTERS = (DEFLATE, LZF, FILTER_IDS["zstd"], FILTER_IDS["lz4"])


class _FilteredChunks:
    """Where each compressed chunk of a dataset chunked along axis 0 lies, and its decoding by shardkit's own
    bounded decoders, never by HDF5's filters.

    HDF5's deflate filter doubles its buffer until the stream ends and h5py's LZF filter retries with ever
    larger buffers, so a 507 KB chunk that inflates to 2 GiB was served as an image (and an LZF one took
    455 s). Here every chunk (gzip: :func:`~shardkit.codecs.registry.inflate_into`; LZF:
    :func:`~shardkit.codecs.registry.lzf_decode_into`; zstd: one frame of the declared size; lz4: :func:`decode_h5lz4`)
    is decoded from the memory map into exactly the declared chunk's bytes and refused the moment it would
    produce more: nothing larger than one declared chunk is ever allocated. Fixed size: one sample per chunk,
    decoded straight into the caller's array (batches on the decoding thread pool); variable size: the chunks
    a sample's rows touch, each decoded into one chunk-sized buffer.
    """

    def __init__(self, offsets: np.ndarray, sizes: np.ndarray, masks: np.ndarray, per_chunk: int, length: int,
                 row_shape: tuple[int, ...], dtype: np.dtype, filter_id: int, reader: ShardReader,
                 kind: str) -> None:
        self.offsets, self.sizes, self.masks = offsets, sizes, masks
        self.per_chunk, self.length, self.row_shape, self.dtype = per_chunk, length, row_shape, dtype
        self.filter_id, self.reader, self.kind = filter_id, reader, kind
        self.row_nbytes = int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
        self.chunk_nbytes = per_chunk * self.row_nbytes

    @classmethod
    def build(cls, ds: Any, file_size: int, reader: ShardReader) -> _FilteredChunks | str:
        """The table of ``ds``, or what makes it unreadable this way (a one-filter chunked dataset whose chunks
        are whole rows, each stored inside the file and no larger than its data could compress to)."""
        dcpl = ds.id.get_create_plist()
        if ds.chunks is None or dcpl.get_layout() != h5py.h5d.CHUNKED or ds.external or ds.is_virtual:
            return f"{ds.name!r} is not a chunked dataset"
        filters = [dcpl.get_filter(k)[0] for k in range(dcpl.get_nfilters())]
        if len(filters) != 1 or filters[0] not in DECODED_FILTERS or tuple(ds.chunks[1:]) != tuple(ds.shape[1:]):
            return f"{ds.name!r} has filters {filters} or chunks {ds.chunks} shardkit does not write"
        fid = int(filters[0])
        if fid in FILTER_IDS.values():
            require("hdf5plugin", "zstd/lz4 in HDF5")
        dtype, per, length = np.dtype(ds.dtype), int(ds.chunks[0]), int(ds.shape[0])
        row_shape = tuple(int(v) for v in ds.shape[1:])
        nbytes = per * int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
        most = nbytes + nbytes // 64 + 4096  # the largest any of these codecs makes a chunk of nbytes
        count = -(-length // per)
        offsets, sizes, masks = np.full(count, -1, np.int64), np.zeros(count, np.int64), np.zeros(count, np.int64)
        for info in _chunk_infos(ds):
            first, *rest = info.chunk_offset
            if first % per or any(rest) or not 0 <= first // per < count:
                continue  # not a chunk of the current extent: never read
            if (info.byte_offset is None or not 0 < info.size <= most or info.filter_mask not in (0, 1)
                    or not 0 <= info.byte_offset <= file_size - info.size):
                return f"{ds.name!r} chunk {first // per} lies outside the file or is larger than its data"
            offsets[first // per], sizes[first // per], masks[first // per] = info.byte_offset, info.size, \
                info.filter_mask
        kind = "image" if ds.name.lstrip("/") == "images" else "label"
        return cls(offsets, sizes, masks, per, length, row_shape, dtype, fid, reader, kind)

    def _decode_chunk(self, whole: np.ndarray, c: int, dst: np.ndarray, i: int) -> None:
        """Chunk ``c`` (holding sample ``i``'s bytes) decoded into ``dst`` (flat uint8 of the chunk's size)."""
        begin, size = int(self.offsets[c]), int(self.sizes[c])
        try:
            if begin < 0:
                raise CodecDataError(f"chunk {c} is missing")
            data = whole[begin : begin + size]
            if self.masks[c] & 1:  # the filter was skipped for this chunk (it did not shrink): stored as is
                if size != dst.size:
                    raise CodecDataError(f"unfiltered chunk {c} has {size} bytes, expected {dst.size}")
                dst[:] = data
            elif self.filter_id == DEFLATE:
                inflate_into(data, dst)
            elif self.filter_id == LZF:
                lzf_decode_into(data, dst)
            elif self.filter_id == FILTER_IDS["lz4"]:
                decode_h5lz4(data, dst)
            else:
                _ZSTD.decode_into(data, dst)
        except CodecDataError as exc:
            raise self.reader.corrupt(f"sample {i} {self.kind}: {exc}") from None

    def sample_range(self, i: int) -> tuple[int, int]:
        """File byte range ``[begin, end)`` of sample ``i``'s chunk (one sample per chunk)."""
        begin = int(self.offsets[i])
        return begin, begin + int(self.sizes[i])

    def row_ranges(self, r0: np.ndarray, r1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """File byte ranges ``[begin, end)`` of every stored chunk that rows ``[r0[k], r1[k])`` touch."""
        begins: list[int] = []
        ends: list[int] = []
        per = self.per_chunk
        for a, b in zip(np.asarray(r0).tolist(), np.asarray(r1).tolist(), strict=True):
            for c in range(a // per, (b - 1) // per + 1) if b > a else ():
                if self.offsets[c] >= 0:
                    begins.append(int(self.offsets[c]))
                    ends.append(int(self.offsets[c] + self.sizes[c]))
        return np.array(begins, np.int64), np.array(ends, np.int64)

    def _into(self, whole: np.ndarray, i: int, out: np.ndarray) -> None:
        """Sample ``i`` (one per chunk) decoded straight into ``out`` (or through a buffer when ``out`` is not a
        C-contiguous array of the stored dtype)."""
        direct = out.flags.c_contiguous and out.flags.writeable and out.dtype == self.dtype
        if direct and out.nbytes == self.chunk_nbytes:
            self._decode_chunk(whole, i, out.reshape(-1).view(np.uint8), i)
        else:
            out[...] = self.sample(whole, i)

    def sample(self, whole: np.ndarray, i: int) -> np.ndarray:
        out = np.empty(self.row_shape, self.dtype)
        self._decode_chunk(whole, i, out.reshape(-1).view(np.uint8), i)
        return out

    def rows(self, whole: np.ndarray, r0: int, r1: int, i: int) -> np.ndarray:
        """Rows ``[r0, r1)`` (sample ``i``'s) assembled from the chunks they touch, each decoded once."""
        out = np.empty((max(0, r1 - r0), *self.row_shape), self.dtype)
        if r1 <= r0:
            return out
        buf = np.empty(self.chunk_nbytes, np.uint8)
        chunk = buf.view(self.dtype).reshape(self.per_chunk, *self.row_shape)
        for c in range(r0 // self.per_chunk, (r1 - 1) // self.per_chunk + 1):
            self._decode_chunk(whole, c, buf, i)
            a, b = max(r0, c * self.per_chunk), min(r1, (c + 1) * self.per_chunk)
            out[a - r0 : b - r0] = chunk[a - c * self.per_chunk : b - c * self.per_chunk]
        return out

    def jobs(self, whole: np.ndarray, idx: np.ndarray, out: np.ndarray) -> list[Any]:
        """One decode per sample, ``out[k]`` ← chunk ``idx[k]`` (indices checked by the caller)."""
        return [functools.partial(self._into, whole, i, out[k]) for k, i in enumerate(idx.tolist())]


_ZSTD = Zstd()


def decode_h5lz4(data: Any, out: np.ndarray) -> None:
    """One chunk of HDF5's LZ4 filter (32004) into ``out``: an 8-byte big-endian total size, a 4-byte block size,
    then per block a 4-byte big-endian stored size and the LZ4 block (stored as is when it did not shrink).
    Every size is checked against ``out`` before anything is decompressed."""
    block = require("lz4.block", "lz4")
    dst = out.reshape(-1).view(np.uint8)
    buf = memoryview(data)
    if len(buf) < 12:
        raise CodecDataError("lz4 chunk is shorter than its header")
    total, block_size = struct.unpack(">qi", buf[:12])
    if total != dst.size or block_size <= 0:
        raise CodecDataError(f"lz4 chunk says {total} bytes in blocks of {block_size}, expected {dst.size}")
    pos, done = 12, 0
    while done < total:
        if pos + 4 > len(buf):
            raise CodecDataError("lz4 chunk is truncated")
        (stored,) = struct.unpack(">i", buf[pos : pos + 4])
        want = min(block_size, total - done)
        pos += 4
        if not 0 < stored <= len(buf) - pos:
            raise CodecDataError("lz4 chunk block runs past its end")
        piece = buf[pos : pos + stored]
        if stored == want:
            dst[done : done + want] = np.frombuffer(piece, np.uint8)
        else:
            try:
                raw = block.decompress(piece, uncompressed_size=want)
            except Exception as exc:  # lz4.block.LZ4BlockError
                raise CodecDataError(f"lz4 block does not decode ({exc})") from None
            if len(raw) != want:
                raise CodecDataError(f"lz4 block decodes to {len(raw)} bytes, expected {want}")
            dst[done : done + want] = np.frombuffer(raw, np.uint8)
        pos, done = pos + stored, done + want
    if pos != len(buf):
        raise CodecDataError("lz4 chunk has bytes after its last block")


class _ChunkTable:
    """Byte offsets of the chunks of one uncompressed dataset chunked along axis 0 only.

    Chunk ``j`` holds rows ``[j * per_chunk, (j + 1) * per_chunk)`` (one sample for the fixed layout,
    ``FLAT_CHUNK`` elements for the flat one) as C-order bytes at ``offsets[j]`` in the file.
    """

    def __init__(self, offsets: np.ndarray, per_chunk: int, row_shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.offsets = offsets
        self.per_chunk = per_chunk
        self.row_shape = row_shape
        self.dtype = dtype
        self.row_nbytes = int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize

    @classmethod
    def build(cls, ds: Any, file_size: int) -> _ChunkTable | None:
        """The table of ``ds``, or None unless every chunk is raw (no filters), whole and inside the file."""
        dcpl = ds.id.get_create_plist()
        if ds.chunks is None or dcpl.get_layout() != h5py.h5d.CHUNKED or dcpl.get_nfilters() != 0:
            return None
        if ds.external or ds.is_virtual or tuple(ds.chunks[1:]) != tuple(ds.shape[1:]):
            return None
        dtype, rows = np.dtype(ds.dtype), int(ds.chunks[0])
        chunk_nbytes = rows * int(np.prod(ds.shape[1:], dtype=np.int64)) * dtype.itemsize
        count = -(-int(ds.shape[0]) // rows)
        offsets = np.full(count, -1, np.int64)
        for info in _chunk_infos(ds):
            first, *rest = info.chunk_offset
            if first % rows or any(rest) or first // rows >= count:
                continue  # not a chunk of the current extent (never written by shardkit)
            if (info.filter_mask != 0 or info.size != chunk_nbytes or info.byte_offset is None
                    or not 0 <= info.byte_offset <= file_size - chunk_nbytes):
                return None
            offsets[first // rows] = info.byte_offset
        if (offsets < 0).any():  # an unwritten chunk reads as fill values: leave that to HDF5
            return None
        return cls(offsets, rows, tuple(int(v) for v in ds.shape[1:]), dtype)

    def sample_range(self, i: int) -> tuple[int, int]:
        """File byte range ``[begin, end)`` of row ``i`` of a one-row-per-chunk dataset (a fixed-layout sample)."""
        begin = int(self.offsets[i])
        return begin, begin + self.row_nbytes

    def row_ranges(self, r0: np.ndarray, r1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """File byte ranges ``[begin, end)`` holding rows ``[r0[k], r1[k])`` for every ``k``: one per sample with
        one row per chunk, else one per chunk a sample's rows touch."""
        if self.per_chunk == 1 and np.array_equal(r1 - r0, np.ones_like(r0)):
            begin = self.offsets[r0]
            return begin, begin + self.row_nbytes
        begins: list[int] = []
        ends: list[int] = []
        per = self.per_chunk
        for a, b in zip(np.asarray(r0).tolist(), np.asarray(r1).tolist(), strict=True):
            for c in range(a // per, (b - 1) // per + 1) if b > a else ():
                start = int(self.offsets[c])
                begins.append(start + (max(a, c * per) - c * per) * self.row_nbytes)
                ends.append(start + (min(b, (c + 1) * per) - c * per) * self.row_nbytes)
        return np.array(begins, np.int64), np.array(ends, np.int64)

    def spot_check(self, ds: Any, whole: np.ndarray) -> bool:
        """The first and last rows read through h5py equal the mapped bytes (guards the offsets' meaning)."""
        n = int(ds.shape[0])
        return n == 0 or all(np.array_equal(ds[r : r + 1], self.rows(whole, r, r + 1)) for r in {0, n - 1})

    def _view(self, whole: np.ndarray, chunk: int, r0: int, r1: int) -> np.ndarray:
        """Rows ``[r0, r1)`` of chunk ``chunk`` (relative rows), a read-only view of the map."""
        start = int(self.offsets[chunk]) + r0 * self.row_nbytes
        return whole[start : start + (r1 - r0) * self.row_nbytes].view(self.dtype).reshape(r1 - r0, *self.row_shape)

    def sample(self, whole: np.ndarray, i: int) -> np.ndarray:
        """Row ``i`` of a one-row-per-chunk dataset (a sample of the fixed layout): a read-only view."""
        start = int(self.offsets[i])
        return whole[start : start + self.row_nbytes].view(self.dtype).reshape(self.row_shape)

    def rows(self, whole: np.ndarray, r0: int, r1: int, i: int = -1) -> np.ndarray:
        """Rows ``[r0, r1)`` (of sample ``i``): a view when they lie in one chunk, else a copy assembled from
        each chunk."""
        if r1 <= r0:
            return np.empty((0, *self.row_shape), self.dtype)
        first, last = r0 // self.per_chunk, (r1 - 1) // self.per_chunk
        if first == last:
            return self._view(whole, first, r0 - first * self.per_chunk, r1 - first * self.per_chunk)
        out = np.empty((r1 - r0, *self.row_shape), self.dtype)
        for c in range(first, last + 1):
            a, b = max(r0, c * self.per_chunk), min(r1, (c + 1) * self.per_chunk)
            out[a - r0 : b - r0] = self._view(whole, c, a - c * self.per_chunk, b - c * self.per_chunk)
        return out

    def gather(self, whole: np.ndarray, idx: np.ndarray, out: np.ndarray) -> None:
        """``out[k] = row idx[k]`` for a one-row-per-chunk dataset: one memcpy per sample (indices checked)."""
        offsets, nbytes = self.offsets[idx].tolist(), self.row_nbytes
        if out.flags.c_contiguous and out.dtype == self.dtype:
            raw = out.reshape(len(idx), -1).view(np.uint8)
            for k, start in enumerate(offsets):
                raw[k] = whole[start : start + nbytes]
        else:  # unusual output (strided or another dtype): let NumPy convert
            for k, start in enumerate(offsets):
                out[k] = whole[start : start + nbytes].view(self.dtype).reshape(self.row_shape)


class Hdf5Format(ShardFormat):
    """``hdf5``: one HDF5 file per shard; lzf/gzip (version 1) or zstd/lz4 hdf5plugin filters (version 2)."""

    name = "hdf5"
    writer = Hdf5Writer
    reader = Hdf5Reader
    versions = (1, 2, 3)
    compressions = ("none", "lzf", "gzip")
    image_codecs = ("raw", "zstd", "lz4")
    label_codecs = ("raw", "zstd", "lz4")
    file_patterns = (("shard-", ".h5"),)

    @classmethod
    def check_options(cls, compression: str, codecs: ArrayCodecs) -> None:
        super().check_options(compression, codecs)
        if compression != "none" and not codecs.raw:
            raise ConfigError(f"--compression {compression} and per-array codecs both given",
                              fix="choose one: --compression lzf/gzip, or --image-codec/--label-codec zstd/lz4")
        if not codecs.raw:
            require("hdf5plugin", "zstd/lz4 in HDF5")


FORMAT = Hdf5Format
