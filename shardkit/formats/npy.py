"""``.npy`` shards: plain NumPy arrays, memory-mappable, readable with ``np.load`` alone.

Fixed size: ``images-<stem>.npy`` (n, H, W, 3) uint8 and ``labels-<stem>.npy`` (n, H, W[, C]),
where ``<stem>`` is ``NNNNN-<12 hex>`` (shard position and input digest).
Variable size: both flattened to 1-D, plus ``shapes-<stem>.npy`` (n, 2) int64 of (H, W);
sample i starts at the sum of the sizes before it. Spec: ``formats/npy.md``.
Batches read from storage are hinted sample by sample (:mod:`shardkit.formats.mapping`).
"""

from __future__ import annotations

import contextlib
import hashlib
import tokenize
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..files.splitfiles import MAX_SIDE
from .base import SampleSpec, ShardFormat, ShardReader, ShardWriter
from .mapping import MappedArray


def _names(stem: str, fixed: bool) -> tuple[str, ...]:
    kinds = ("images", "labels") if fixed else ("images", "labels", "shapes")
    return tuple(f"{kind}-{stem}.npy" for kind in kinds)


class _StreamedArray:
    """One ``.npy`` file written front to back (header, then sample after sample), hashed as it goes.

    Plain sequential writes beat a memory map here (no page fault per 4 KiB); the header is the one
    ``np.save`` writes, so the bytes are those of ``np.save`` of the whole array.
    """

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.path, self.dtype, self.shape = path, dtype, shape
        self.fh = open(path, "wb")  # noqa: SIM115 - closed in finish()
        self.sha = hashlib.sha256()
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(self, header)

    def write(self, data: Any) -> None:
        self.sha.update(data)
        self.fh.write(data)

    def finish(self, count: int) -> str | None:
        """Close; returns the sha256, or None when fewer samples than planned came (file rewritten)."""
        self.fh.close()
        if count == self.shape[0]:
            return self.sha.hexdigest()
        # The header still says the planned count, so the file is shorter than np.load expects: copy the
        # samples that did come, chunk by chunk (a shard of many tiles may be larger than memory), behind the
        # header of the true shape (the bytes np.save writes), then replace the file.
        part = self.path.with_name(self.path.name + ".part")
        with open(self.path, "rb") as src, open(part, "wb") as dst:
            np.lib.format.read_magic(src)
            np.lib.format.read_array_header_1_0(src)
            header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                      "shape": (count, *self.shape[1:])}
            np.lib.format.write_array_header_1_0(dst, header)
            left = count * int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
            while left > 0 and (chunk := src.read(min(left, 1 << 24))):
                dst.write(chunk)
                left -= len(chunk)
        part.replace(self.path)
        return None


class NpyWriter(ShardWriter):
    def __init__(self, directory: Path, stem: str, spec: SampleSpec, planned: int, compression: str,
                 codecs: Any = None) -> None:
        super().__init__(directory, stem, spec, planned, compression)
        self._streams: list[_StreamedArray] = []
        self._images: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        if spec.size is not None:
            img_name, lab_name = self.file_names(stem, spec)
            self._streams = [
                _StreamedArray(self.tmp_path(img_name), spec.stored_image_dtype,
                               (planned, *spec.image_shape(spec.size))),
                _StreamedArray(self.tmp_path(lab_name), spec.stored_label_dtype,
                               (planned, *spec.label_shape(spec.size))),
            ]

    @classmethod
    def file_names(cls, stem: str, spec: SampleSpec) -> tuple[str, ...]:
        return _names(stem, spec.size is not None)

    def add(self, image: np.ndarray, label: np.ndarray, key: str) -> None:
        if self._streams:
            img, lab = self._streams
            img.write(np.ascontiguousarray(image, dtype=img.dtype).data.cast("B"))
            lab.write(np.ascontiguousarray(label, dtype=lab.dtype).data.cast("B"))
        else:
            self._images.append(image)
            self._labels.append(label)
        self.count += 1

    def _finish(self) -> None:
        names = self.file_names(self.stem, self.spec)
        if self._streams:
            for stream, name in zip(self._streams, names, strict=True):
                digest = stream.finish(self.count)
                if digest is not None:
                    self.digests[name] = digest
            self._streams = []
            return
        shapes = np.array([im.shape[:2] for im in self._images], dtype="<i8").reshape(-1, 2)
        flat_img = (np.concatenate([im.ravel() for im in self._images]) if self._images
                    else np.zeros(0, self.spec.stored_image_dtype)).astype(self.spec.stored_image_dtype, copy=False)
        dt = self.spec.stored_label_dtype
        flat_lab = np.concatenate([lb.ravel() for lb in self._labels]) if self._labels else np.zeros(0, dt)
        for arr, name in zip((flat_img, flat_lab.astype(dt, copy=False), shapes), names, strict=True):
            with open(self.tmp_path(name), "wb") as fh:
                np.save(fh, arr, allow_pickle=False)
        self._images, self._labels = [], []

    def abort(self) -> None:
        for stream in self._streams:
            with contextlib.suppress(OSError):  # its last flush may fail as the write did (disk full)
                stream.fh.close()
        super().abort()


class NpyReader(ShardReader):
    """Memory-maps the shard; fixed-size reads are zero-copy views, batches are fancy-index copies."""

    file_counts = (2, 3)

    _images: np.ndarray | None = None
    _labels: np.ndarray | None = None
    _offsets: np.ndarray | None = None
    _plain: tuple[np.ndarray, np.ndarray] | None = None
    _plain_pid: int | None = None
    _maps: tuple[MappedArray | None, MappedArray | None] = (None, None)

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_images", "_labels", "_offsets", "_shapes", "_plain", "_plain_pid", "_maps")

    def _open(self) -> None:
        names = [f.name for f in self.shard.files]
        try:
            self._images = np.load(self.path(names[0]), mmap_mode="r", allow_pickle=False)
            self._labels = np.load(self.path(names[1]), mmap_mode="r", allow_pickle=False)
            if self.spec.size is None:
                shapes = np.load(self.path(names[2]), mmap_mode="r", allow_pickle=False)
                if shapes.dtype.kind not in "iu" or shapes.shape != (len(self), 2):
                    raise self.corrupt(f"sample shapes {shapes.dtype} {shapes.shape} are not ({len(self)}, 2) "
                                       f"integers", names[2])
                self._shapes = np.array(shapes, dtype=np.int64)
                if len(self) and not (self._shapes.min() >= 1 and self._shapes.max() <= MAX_SIDE):
                    raise self.corrupt(f"sample shapes are not in 1..{MAX_SIDE}", names[2])
                self._offsets = self.spec.flat_offsets(self._shapes)
                self.check_shapes_table(self._shapes, names[2])
        except (OSError, ValueError, EOFError, SyntaxError, TypeError, OverflowError, MemoryError,
                tokenize.TokenError) as exc:
            # np.load: a bad magic or header, an object/structured dtype, a shape the file cannot hold
            raise self.corrupt(f"not a readable .npy shard ({type(exc).__name__}: {exc})") from None
        self._check_shapes()
        self._maps = (MappedArray.of(self._images), MappedArray.of(self._labels))

    def prefetch(self, local_indices: Sequence[int] | np.ndarray, cold: bool = True) -> None:
        """Read-around off and ``MADV_WILLNEED`` on exactly the bytes of samples ``local_indices``
        (sorted runs merged); nothing when not ``cold``."""
        idx = self.hint_indices(local_indices, cold)
        if idx is None:
            return
        for k, (arr, m) in enumerate(zip((self._images, self._labels), self._maps, strict=True)):
            if m is None or arr is None:
                continue
            m.set_random()
            if self.spec.size is not None:
                row = arr.nbytes // len(arr)
                begin = idx * row
                end = begin + row
            else:
                assert self._offsets is not None
                begin = self._offsets[idx, k] * arr.itemsize
                end = self._offsets[idx + 1, k] * arr.itemsize
            m.will_need(begin, end)

    def _will_need_one(self, i: int) -> None:
        """``MADV_WILLNEED`` on sample ``i``'s bytes (``read`` calls it: one sample costs one hint)."""
        for k, (arr, m) in enumerate(zip((self._images, self._labels), self._maps, strict=True)):
            if m is None or arr is None:
                continue
            if self.spec.size is not None:
                row = arr.nbytes // len(arr)
                m.will_need_one(i * row, (i + 1) * row)
            else:
                assert self._offsets is not None
                m.will_need_one(int(self._offsets[i, k]) * arr.itemsize, int(self._offsets[i + 1, k]) * arr.itemsize)

    def _check_shapes(self) -> None:
        from ..errors import ShardFormatError

        n = self.shard.num_samples
        assert self._images is not None and self._labels is not None
        images, labels, spec = self._images, self._labels, self.spec
        dtypes_ok = images.dtype == spec.stored_image_dtype and labels.dtype == spec.stored_label_dtype
        fortran = images.flags.f_contiguous and images.ndim > 1 and not images.flags.c_contiguous
        if spec.size is not None:
            ok = images.shape == (n, *spec.image_shape(spec.size)) and labels.shape == (n, *spec.label_shape(spec.size))
        else:
            ok = self._shapes.shape == (n, 2) and self._offsets is not None and (
                images.shape == (self._offsets[-1, 0],) and labels.shape == (self._offsets[-1, 1],)
            )
        if not ok or not dtypes_ok or fortran:
            raise ShardFormatError(
                f"arrays {images.dtype}{images.shape}/{labels.dtype}{labels.shape} disagree with the manifest "
                f"({n} samples of {spec.stored_image_dtype} images and {spec.stored_label_dtype} labels, C order)",
                path=self.path(self.shard.files[0].name),
                fix="re-convert this split",
            )

    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        self.ensure_open()
        assert self._images is not None and self._labels is not None
        if 0 <= i < len(self):
            self._will_need_one(i)
        if self.spec.size is not None:
            return self._images[i], self._labels[i]
        assert self._offsets is not None
        h, w = (int(v) for v in self._shapes[i])
        a0, b0 = self._offsets[i]
        a1, b1 = self._offsets[i + 1]
        return (self._images[a0:a1].reshape(self.spec.image_shape((h, w))),
                self._labels[b0:b1].reshape(self.spec.label_shape((h, w))))

    def fixed_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self.spec.size is None:
            return None
        self.ensure_open()
        if self._plain_pid != self._pid:  # plain ndarray views: indexing a np.memmap runs Python code per view
            images, labels = np.asarray(self._images), np.asarray(self._labels)
            fits = (images.dtype == self.spec.stored_image_dtype and labels.dtype == self.spec.stored_label_dtype
                    and labels.shape == (len(self), *self.spec.label_shape(self.spec.size)))
            self._plain = (images, labels) if fits else None  # else read_batch_into copies (and reports) it
            self._plain_pid = self._pid
        return self._plain

    def read_batch_into(self, local_indices: Sequence[int] | np.ndarray, out_images: np.ndarray,
                        out_labels: np.ndarray) -> None:
        """One copy per array: a slice for consecutive indices, else one fancy-index gather (``np.take``)."""
        if self.spec.size is None:
            super().read_batch_into(local_indices, out_images, out_labels)
            return
        self.ensure_open()
        assert self._images is not None and self._labels is not None
        idx = np.asarray(local_indices, dtype=np.intp)
        n = len(idx)
        if not n:
            return
        if idx.min() < 0 or idx.max() >= len(self):
            raise IndexError(f"local indices {idx.min()}..{idx.max()} out of range for {len(self)} samples")
        first = int(idx[0])
        if int(idx[-1]) - first == n - 1 and (n < 3 or bool(np.all(np.diff(idx) == 1))):
            np.copyto(out_images, self._images[first:first + n])
            np.copyto(out_labels, self._labels[first:first + n])
        else:  # mode="clip" (indices checked above) lets np.take write into ``out`` without a buffer
            np.take(self._images, idx, axis=0, out=out_images, mode="clip")
            np.take(self._labels, idx, axis=0, out=out_labels, mode="clip")



class NpyFormat(ShardFormat):
    """``npy``: plain memory-mappable arrays, the raw fast path (no compression, no codecs)."""

    name = "npy"
    writer = NpyWriter
    reader = NpyReader
    file_patterns = (("images-", ".npy"), ("labels-", ".npy"), ("shapes-", ".npy"))
    versions = (1, 3)  # 3: images of any stored type and band count (version 2 added codecs, which npy has none of)


FORMAT = NpyFormat
