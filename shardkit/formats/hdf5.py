"""HDF5 shards: one ``shard-<stem>.h5`` per shard, readable with plain ``h5py`` or ``h5dump``.

Fixed size: ``images`` (n, H, W, 3) uint8 and ``labels`` (n, H, W[, C]), one sample per chunk.
Variable size: ``images`` and ``labels`` flattened to 1-D (samples concatenated in C order),
``shapes`` (n, 2) int64 of (H, W) and ``offsets`` (n + 1, 2) int64 (start of sample i in images
and labels; the last row holds the totals). ``keys`` holds the source keys. Optional lossless
lzf/gzip compression. Files are written with ``libver=("earliest", "v110")`` and
``track_times=False``: the same input gives byte-identical files. Spec: ``formats/hdf5.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .base import SampleSpec, ShardReader, ShardWriter

FORMAT_VERSION = 1
FORMAT_ID = "shardkit-hdf5"
LIBVER = ("earliest", "v110")
FLAT_CHUNK = 1 << 18  # elements per chunk of the 1-D variable-size datasets
GZIP_LEVEL = 4


def _compression(name: str) -> dict[str, Any]:
    if name == "gzip":
        return {"compression": "gzip", "compression_opts": GZIP_LEVEL}
    return {"compression": "lzf"} if name == "lzf" else {}


class Hdf5Writer(ShardWriter):
    format_name = "hdf5"
    format_version = FORMAT_VERSION

    def __init__(self, directory: Path, stem: str, spec: SampleSpec, planned: int, compression: str) -> None:
        super().__init__(directory, stem, spec, planned, compression)
        self._file = h5py.File(self.tmp_files[0], "w", libver=LIBVER, track_order=False)
        self._keys: list[str] = []
        self._shapes: list[tuple[int, int]] = []
        size = spec.size
        img_shape, lab_shape = ((*size, 3), spec.label_shape(size)) if size else (None, None)
        self._images = self._dataset("images", np.uint8, img_shape)
        self._labels = self._dataset("labels", spec.stored_label_dtype, lab_shape)

    def _dataset(self, name: str, dtype: Any, sample: tuple[int, ...] | None) -> Any:
        """Resizable, untimed dataset: one sample per chunk, or 1-D in fixed chunks if ``sample`` is None."""
        shape, chunks = ((self.planned, *sample), (1, *sample)) if sample else ((0,), (FLAT_CHUNK,))
        return self._file.create_dataset(name, shape, dtype, maxshape=(None, *shape[1:]), chunks=chunks,
                                         track_times=False, **_compression(self.compression))

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
            "format": FORMAT_ID, "format_version": FORMAT_VERSION, "num_samples": n,
            "layout": "fixed" if self.spec.size is not None else "flat",
            "label_encoding": self.spec.label_encoding, "num_classes": self.spec.num_classes,
            "label_dtype": self.spec.stored_label_dtype.str, "compression": self.compression,
        })
        f.close()


class Hdf5Reader(ShardReader):
    """One read-only h5py file per process, opened lazily; batches read by hyperslab into caller memory."""

    _file: Any = None
    _offsets: np.ndarray | None = None
    _shapes: np.ndarray | None = None

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_file", "_offsets", "_shapes")

    def _open(self) -> None:
        try:
            self._file = f = h5py.File(self.path(self.shard.files[0].name), "r")
            attrs = {k: f.attrs.get(k) for k in ("format", "format_version", "num_samples")}
            images, labels = f["images"], f["labels"]
            if self.spec.size is None:
                self._shapes, self._offsets = f["shapes"][()], f["offsets"][()]
        except (OSError, KeyError, ValueError) as exc:
            raise self.corrupt(f"cannot open HDF5 shard ({exc})") from None
        n = len(self)
        if attrs != {"format": FORMAT_ID, "format_version": FORMAT_VERSION, "num_samples": n}:
            raise self.corrupt(f"HDF5 attributes {attrs} disagree with the manifest ({n} samples)")
        if self.spec.size is not None:
            size = self.spec.size
            ok = images.shape == (n, *size, 3) and labels.shape == (n, *self.spec.label_shape(size))
        else:
            shapes, offsets = self._shapes, self._offsets
            assert shapes is not None and offsets is not None
            ok = (shapes.shape == (n, 2) and np.array_equal(offsets, self.spec.flat_offsets(shapes))
                  and images.shape == (offsets[-1, 0],) and labels.shape == (offsets[-1, 1],))
        if not ok or images.dtype != np.uint8 or labels.dtype != self.spec.stored_label_dtype:
            raise self.corrupt(f"datasets {images.shape}/{labels.shape} disagree with manifest ({n} samples)")

    def _get(self, name: str, sel: Any, out: np.ndarray | None = None, dest: Any = None) -> np.ndarray:
        """``self._file[name][sel]`` (or straight into ``out[dest]``), with HDF5 errors as one-line errors."""
        try:
            ds = self._file[name]
            if out is None:
                return ds[sel]
            ds.read_direct(out, source_sel=sel, dest_sel=dest)
            return out
        except (OSError, ValueError) as exc:
            raise self.corrupt(f"cannot read {name} {sel} ({exc})") from None

    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        self.ensure_open()
        if self.spec.size is not None:
            return self._get("images", i), self._get("labels", i)
        assert self._offsets is not None and self._shapes is not None
        (a0, b0), (a1, b1) = self._offsets[i], self._offsets[i + 1]
        hw = (int(self._shapes[i, 0]), int(self._shapes[i, 1]))
        return (self._get("images", np.s_[a0:a1]).reshape(*hw, 3),
                self._get("labels", np.s_[b0:b1]).reshape(self.spec.label_shape(hw)))

    def _read_fixed_batch(self, idx: np.ndarray, out_images: np.ndarray, out_labels: np.ndarray) -> bool:
        """Hyperslab reads in ascending index order, one per run of consecutive indices, into ``out_*``."""
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
