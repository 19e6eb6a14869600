"""What every shard format shares: temp-name writing, fsync, hashing, readers' checks.

A format module only says how samples become bytes (writer) and bytes become samples
(reader). Everything else — temporary names, sha256, size limits, path safety, lazy
per-process opening — lives here, once; fsync and renaming are :mod:`shardkit.store.publish`'s.
The sample spec (:class:`~shardkit.files.splitfiles.SampleSpec`, importable from here too) is in the typed core under
both the formats and the manifest.
"""

from __future__ import annotations

import os
import secrets
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..codecs.registry import RAW, ArrayCodecs, CodecDataError
from ..errors import ConfigError, IntegrityError, ShardFormatError, ShardkitError
from ..files.samples import sidecar_name
from ..files.splitfiles import (  # noqa: F401  (IMAGE_* and MAX_BANDS: re-exported)
    IMAGE_CHANNEL_KINDS,
    IMAGE_DTYPES,
    MAX_BANDS,
    TMP_MARK,
    SampleSpec,
    ShardFile,
    ShardInfo,
    check_regular_file,
    fsync_file,
    member_path,
)
from ..support.smallfile import HASH_CHUNK  # noqa: F401  (re-exported)
from ..support.smallfile import sha256_of as sha256_file  # the one file hash, under the name its callers use


@dataclass(frozen=True)
class WrittenFile:
    """A finished shard file under its temporary name, with what the manifest will say about it."""

    final_name: str
    tmp_name: str
    bytes: int
    sha256: str

    def info(self) -> ShardFile:
        return ShardFile(self.final_name, self.bytes, self.sha256)


class ShardWriter(ABC):
    """Writes one shard into ``directory`` under temporary names; the parent renames them later.

    Subclasses implement :meth:`add` and :meth:`_finish` and list their files in
    :meth:`file_names`; they write only to :meth:`tmp_path` names. ``stem`` is
    ``NNNNN-<12 hex>``: the shard's position and a digest of its inputs and options, so a
    name never holds two different contents (what makes resume and incremental runs safe).
    """

    #: True when the writer's library must not be imported into the converting process (it would clash
    #: with one the caller may import, e.g. ``tfrecord``'s protobufs vs TensorFlow's): the pool then runs
    #: every task in a worker process, even with one worker.
    needs_subprocess: ClassVar[bool] = False
    #: What the writer's library raises when the output fails (disk full, I/O error): the worker turns these
    #: into one OutputError line. LMDB raises ``lmdb.Error``, h5py ``RuntimeError``, besides ``OSError``.
    write_errors: ClassVar[tuple[type[Exception], ...]] = (OSError,)

    def __init__(self, directory: Path, stem: str, spec: SampleSpec, planned: int, compression: str,
                 codecs: ArrayCodecs = RAW) -> None:
        self.directory = Path(directory)
        self.stem = stem
        self.spec = spec
        self.planned = planned
        self.compression = compression
        self.codecs = codecs
        self.count = 0
        # host + pid + random: two attempts at one shard (a Dask retry on another machine) never share a temp file
        self.digests: dict[str, str] = {}  # sha256 of files hashed while written (else read back in close)
        self._token = f"{TMP_MARK}{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"

    @classmethod
    @abstractmethod
    def file_names(cls, stem: str, spec: SampleSpec) -> tuple[str, ...]:
        """Final file names of the shard called ``stem`` (``NNNNN-<key>``), relative to the split folder."""

    @classmethod
    def format_options(cls, spec: SampleSpec, compression: str, codecs: ArrayCodecs = RAW) -> dict[str, Any]:
        """Format-specific facts the manifest carries: compression, and the codecs when any is not raw."""
        coded = not codecs.raw or not spec.legacy_image  # version 2 and 3 name their codecs, raw ones too
        return {"compression": compression, **({"codecs": codecs.to_json()} if coded else {})}

    @staticmethod
    def tmp_glob(final_name: str) -> str:
        """Glob pattern of every temporary name ``final_name`` may have while written (any attempt)."""
        return f".{final_name}{TMP_MARK}*"

    def tmp_path(self, final_name: str) -> Path:
        return self.directory / f".{final_name}{self._token}"

    @property
    def tmp_files(self) -> tuple[Path, ...]:
        """Temporary paths of this shard's files, in :meth:`file_names` order."""
        return tuple(self.tmp_path(name) for name in self.file_names(self.stem, self.spec))

    @abstractmethod
    def add(self, image: np.ndarray, label: np.ndarray, key: str) -> None:
        """Append one sample (image (H, W, C) of the spec's image dtype, label already encoded)."""

    def stored(self, image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """C-contiguous (image, label) in the stored dtypes, shapes checked against the spec."""
        if np.dtype(image.dtype).newbyteorder("<") != self.spec.stored_image_dtype.newbyteorder("<"):
            raise ValueError(f"image of {image.dtype} does not fit the spec's {self.spec.image_dtype}")
        img = np.ascontiguousarray(image, dtype=self.spec.stored_image_dtype)
        lab = np.ascontiguousarray(label, dtype=self.spec.stored_label_dtype)
        hw = (int(img.shape[0]), int(img.shape[1]))
        fits = img.shape == self.spec.image_shape(hw) and lab.shape == self.spec.label_shape(hw)
        if not fits or self.spec.size not in (None, hw):
            raise ValueError(f"sample shapes {img.shape}/{lab.shape} do not fit the spec {self.spec}")
        return img, lab

    @abstractmethod
    def _finish(self) -> None:
        """Flush and close every temporary file."""

    def close(self, sync: bool = True) -> tuple[WrittenFile, ...]:
        """Finish, hash and (``sync``) fsync the temporary files; nothing is visible under a final name yet."""
        self._finish()
        written = []
        for name in self.file_names(self.stem, self.spec):
            tmp = self.tmp_path(name)
            if sync:
                fsync_file(tmp)
            digest = self.digests.get(name) or sha256_file(tmp, mapped=True)  # our own temporary file
            written.append(WrittenFile(name, tmp.name, tmp.stat().st_size, digest))
        return tuple(written)

    def abort(self) -> None:
        """Remove whatever temporary files exist (after an error)."""
        for name in self.file_names(self.stem, self.spec):
            for p in self.directory.glob(self.tmp_glob(name)):
                p.unlink(missing_ok=True)


class ShardReader(ABC):
    """Serves the samples of one shard. Opens files lazily and reopens after a fork (per process id)."""

    #: How many files a shard of this format has: (fixed-size split, variable-size split).
    file_counts: ClassVar[tuple[int, int]] = (1, 1)

    def __init__(self, directory: Path, shard: ShardInfo, spec: SampleSpec, format_options: dict[str, Any],
                 format_version: int = 1) -> None:
        self.directory = Path(directory)
        self.shard = shard
        self.spec = spec
        self.format_options = format_options
        self.format_version = format_version
        self.codecs = RAW
        if format_version >= 2:  # version 2: format_options.codecs is required (formats/codecs.md)
            try:
                self.codecs = ArrayCodecs.from_json(format_options.get("codecs"))
            except ValueError as exc:
                raise ShardFormatError(f"manifest format_options.codecs is invalid ({exc})",
                                       path=self.directory / "manifest.json", fix="re-convert this split") from None
            try:
                self.codecs.check_available()
            except ConfigError as exc:
                raise ShardFormatError(f"cannot decode this split: {exc}", path=self.directory / "manifest.json",
                                       fix=exc.fix) from None
            why = self.codecs.image.cannot_store(spec.stored_image_dtype, spec.image_channels)
            if why is not None:  # e.g. jpeg claimed for 5 bands: refused here, before any record is read
                raise ShardFormatError(f"manifest format_options.codecs.image does not fit sample.image ({why})",
                                       path=self.directory / "manifest.json", fix="re-convert this split")
        self._pid: int | None = None
        want = self.file_counts[spec.size is None]
        if len(shard.files) != want:
            raise ShardFormatError(
                f"manifest lists {len(shard.files)} files for shard {shard.index}, this format has {want}",
                path=self.directory / "manifest.json",
                fix="re-convert this split; do not use manifests from untrusted sources")
        #: (n, 2) (H, W) of each local sample from the manifest (variable-size splits), loaded on first use
        #: from ``hw_source`` (set by ``open_shard``: the manifest's records, read from this reader's folder)
        self._expected_hw: np.ndarray | None = None
        self.hw_source: Callable[[Path], np.ndarray] | None = None
        self.check_files()

    def __len__(self) -> int:
        return self.shard.num_samples

    def path(self, name: str) -> Path:
        return member_path(name, self.directory)

    @property
    def local_directory(self) -> Path:
        """The folder holding this shard's files on this machine (a remote split's cache copy)."""
        return self.directory

    @property
    def expected_hw(self) -> np.ndarray | None:
        """(n, 2) (H, W) of each local sample as the manifest says (variable-size splits; None when unknown)."""
        source = getattr(self, "hw_source", None)
        if self._expected_hw is None and source is not None:
            self._expected_hw = source(self.directory)
        return self._expected_hw

    @expected_hw.setter
    def expected_hw(self, value: np.ndarray | None) -> None:
        self._expected_hw = value

    def check_files(self) -> None:
        """Every file exists with the size the manifest states (cheap; hashes only in verify)."""
        for f in self.shard.files:
            p = self.path(f.name)
            try:
                size = check_regular_file(p).st_size
            except FileNotFoundError:
                raise ShardFormatError("shard file is missing", path=p, fix="re-convert this split") from None
            except ShardkitError:  # UnsafePathError is an OSError too
                raise
            except OSError as exc:  # a symlink loop, a name too long, no permission
                raise ShardFormatError(f"shard file cannot be opened ({exc.strerror or exc})", path=p,
                                       fix="re-convert this split or restore the file") from None
            if size != f.bytes:
                raise IntegrityError(
                    f"shard file has {size} bytes, the manifest says {f.bytes} (truncated or replaced)",
                    path=p,
                    fix="re-convert this split or restore the file",
                )

    def corrupt(self, problem: str, name: str | None = None) -> ShardFormatError:
        """The one-line error for a malformed, truncated or corrupt shard file (raise it)."""
        return ShardFormatError(" ".join(problem.split()), path=self.path(name or self.shard.files[0].name),
                                fix="the shard is damaged; re-convert this split")

    def check_hw(self, i: int, h: int, w: int) -> None:
        """Refuse sample ``i`` whose stored (H, W) is not the manifest's (before anything is sized from it)."""
        if self.spec.size not in (None, (h, w)):
            raise self.corrupt(f"sample {i} is {h}x{w}, the manifest says {self.spec.size[0]}x{self.spec.size[1]}")
        hw = self.expected_hw
        if hw is not None and 0 <= i < len(hw) and (int(hw[i, 0]), int(hw[i, 1])) != (h, w):
            raise self.corrupt(f"sample {i} is {h}x{w}, the manifest says {int(hw[i, 0])}x{int(hw[i, 1])}")

    def check_shapes_table(self, shapes: np.ndarray, name: str) -> None:
        """Refuse a variable-size shard's own (n, 2) sizes table where it disagrees with the manifest's samples."""
        hw = self.expected_hw
        if hw is not None and hw.shape == shapes.shape and not np.array_equal(hw, shapes):
            i = int(np.flatnonzero((hw != shapes).any(axis=1))[0])
            raise self.corrupt(f"sample {i} is {int(shapes[i, 0])}x{int(shapes[i, 1])}, the manifest says "
                               f"{int(hw[i, 0])}x{int(hw[i, 1])}", name)

    def decode_into(self, codec_kind: str, data: Any, out: np.ndarray, i: int) -> None:
        """Decode sample ``i``'s image or label bytes into ``out`` with this split's codec; damage → one-line error."""
        codec = self.codecs.image if codec_kind == "image" else self.codecs.label
        try:
            codec.decode_into(data, out)
        except CodecDataError as exc:
            raise self.corrupt(f"sample {i} {codec_kind}: {exc}") from None

    def verify_hashes(self) -> None:
        """Hash every file of the shard, its samples sidecar included, against the manifest."""
        for f in self.shard.all_files:
            p = self.path(f.name)
            digest = sha256_file(p)
            if digest != f.sha256:
                raise IntegrityError(
                    f"sha256 {digest[:12]}… differs from the manifest's {f.sha256[:12]}…",
                    path=p,
                    fix="the file is corrupt; re-convert this split",
                )

    def ensure_open(self) -> None:
        """Open (or reopen in a new process) the underlying files; never carried across fork/pickle."""
        pid = os.getpid()
        if self._pid != pid:
            self._open()
            self._pid = pid

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pid"] = None
        for k in self._handle_attrs():
            state[k] = None
        return state

    @property
    def is_open(self) -> bool:
        """True while this object holds open file handles (after a read in this process); never once pickled."""
        return any(getattr(self, k, None) is not None for k in self._handle_attrs())

    def _handle_attrs(self) -> Sequence[str]:
        """Attributes holding open handles, dropped when pickled (spawned workers reopen lazily)."""
        return ()

    @abstractmethod
    def _open(self) -> None:
        """Open files for reading in this process."""

    @abstractmethod
    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Local sample ``i`` → (image (H, W, C) in the stored dtype, stored label)."""

    def fixed_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(images (n, H, W, C), stored labels (n, …)) as plain arrays over the files, opened in this process.

        Only formats that store fixed-size samples uncompressed in memory-mappable arrays return them
        (``None`` otherwise): a batch is then gathered with one row copy per sample, with no per-shard set-up.
        """
        return None

    def prefetch(self, local_indices: Sequence[int] | np.ndarray, cold: bool = True) -> None:
        """Tell the OS that samples ``local_indices`` are read next and may not be cached (a hint: no
        effect by default; nothing when not ``cold``).

        Memory-mapped formats ask the kernel for exactly their bytes (:mod:`shardkit.formats.mapping`),
        so that a batch is read from storage in a few large, queued requests.
        """
        return None

    def hint_indices(self, local_indices: Sequence[int] | np.ndarray, cold: bool) -> np.ndarray | None:
        """What a :meth:`prefetch` should hint: ``local_indices`` as a flat int64 array (this shard opened), or
        None when not ``cold``, empty or out of range (no hints; the read itself reports a bad index)."""
        if not cold:
            return None
        self.ensure_open()
        idx = np.asarray(local_indices, dtype=np.int64).reshape(-1)
        return idx if len(idx) and idx.min() >= 0 and idx.max() < len(self) else None

    def read_batch_into(self, local_indices: Sequence[int] | np.ndarray, out_images: np.ndarray,
                        out_labels: np.ndarray) -> None:
        """Read samples ``local_indices`` into ``out_images[k]``/``out_labels[k]`` (fixed-size data).

        Formats with a faster path for fixed-size shards implement :meth:`_read_fixed_batch`;
        otherwise (and for variable-size data) this is one :meth:`read` per sample.
        """
        idx = np.asarray(local_indices, dtype=np.int64).reshape(-1)
        if self.spec.size is not None and len(idx):
            self.ensure_open()
            if self._read_fixed_batch(idx, out_images, out_labels):
                return
        for k, i in enumerate(idx.tolist()):
            out_images[k], out_labels[k] = self.read(i)

    def _read_fixed_batch(self, idx: np.ndarray, out_images: np.ndarray, out_labels: np.ndarray) -> bool:
        """Fill ``out_*`` for a fixed-size shard (already open) and return True, or return False."""
        return False

    def shape_of(self, i: int) -> tuple[int, int]:
        """(H, W) of local sample ``i``: from the spec, a ``_shapes`` table the reader loaded, or a read."""
        if self.spec.size is not None:
            return self.spec.size
        self.ensure_open()
        shapes = getattr(self, "_shapes", None)
        if shapes is not None:
            return int(shapes[i, 0]), int(shapes[i, 1])
        h, w = self.read(i)[0].shape[:2]
        return int(h), int(w)


@dataclass(frozen=True)
class TfRecordLayout:
    """What ``shardkit.tf`` needs to read a format's files with TensorFlow's own ops (no Python per sample)."""

    compression_type: str  # tf.data.TFRecordDataset(compression_type=…)
    features: dict[str, str]  # feature key → "bytes" / "int64" (tf.io.FixedLenFeature spec)
    image_key: str  # feature holding the image
    image_codec: str  # "raw" (decode_raw), "png" or "jpeg" (decode_png / decode_jpeg)
    label_key: str  # feature holding the stored label, raw little-endian


class ShardFormat:
    """The facts of one shard format, in one place: the registry lists these, and the CLI choices, config
    checks, cleanup of stale and temporary files, and readers all derive from them.

    A format module defines one subclass and exposes it as ``FORMAT``; adding a format touches that module,
    its spec in ``formats/``, the schema's format enum and ``scripts/make_golden.py``.
    """

    name: ClassVar[str]
    writer: ClassVar[type[ShardWriter]]
    reader: ClassVar[type[ShardReader]]
    #: format versions its reader implements; the writer writes :meth:`version_for` of them
    versions: ClassVar[tuple[int, ...]] = (1,)
    #: False for formats read front to back (shuffled shard-then-buffer; TFRecord)
    random_access: ClassVar[bool] = True
    #: ``--compression`` values (whole-shard compression) it takes; "none" first
    compressions: ClassVar[tuple[str, ...]] = ("none",)
    #: per-array codec names it takes for images and for labels; "raw" first
    image_codecs: ClassVar[tuple[str, ...]] = ("raw",)
    label_codecs: ClassVar[tuple[str, ...]] = ("raw",)
    #: ``(prefix, suffix)`` of every shard file name it writes (``images-`` ``.npy``, ``shard-`` ``.lmdb``)
    file_patterns: ClassVar[tuple[tuple[str, str], ...]]

    @classmethod
    def file_names(cls, stem: str, spec: SampleSpec) -> tuple[str, ...]:
        return cls.writer.file_names(stem, spec)

    @classmethod
    def published_names(cls, stem: str, spec: SampleSpec) -> tuple[str, ...]:
        """Every file a converted shard publishes: the format's files, then its samples sidecar."""
        return (*cls.file_names(stem, spec), sidecar_name(stem))

    @classmethod
    def tf_records(cls, format_options: dict[str, Any], version: int) -> TfRecordLayout | None:
        """How TensorFlow reads this format's files natively (``tf.data.TFRecordDataset``), or None."""
        return None

    @classmethod
    def owns(cls, name: str) -> bool:
        """True for a (final) shard file name this format writes: what garbage collection may delete."""
        return not name.startswith(".") and any(name.startswith(p) and name.endswith(s)
                                                for p, s in cls.file_patterns)

    @classmethod
    def tmp_glob(cls, final_name: str) -> str:
        return cls.writer.tmp_glob(final_name)

    @classmethod
    def check_options(cls, compression: str, codecs: ArrayCodecs) -> None:
        """ConfigError (exit 2, one line) unless this format can write ``compression`` with ``codecs``."""
        if compression not in cls.compressions:
            takes = ", ".join(c for c in cls.compressions if c != "none") or "none"
            raise ConfigError(f"--compression {compression} is not supported by --format {cls.name}",
                              fix=f"{cls.name} takes --compression {takes}" if len(cls.compressions) > 1
                              else "drop --compression (or choose per-array codecs with --image-codec/--label-codec)")
        for kind, codec, allowed in (("image", codecs.image, cls.image_codecs),
                                     ("label", codecs.label, cls.label_codecs)):
            if codec.name not in allowed:
                raise ConfigError(f"--{kind}-codec {codec} is not supported by --format {cls.name}",
                                  fix=f"{cls.name} stores {kind}s as {', '.join(allowed)}")
        codecs.check_available()

    @classmethod
    def check_image(cls, spec: SampleSpec, codecs: ArrayCodecs) -> None:
        """ConfigError (exit 2, one line) unless this format and ``codecs.image`` can store the spec's images,
        and unless the format reads the version they need (:meth:`version_for`)."""
        why = codecs.image.cannot_store(spec.stored_image_dtype, spec.image_channels)
        if why is not None:
            raise ConfigError(f"--image-codec {codecs.image}: {why}",
                              fix="use --image-codec zstd, lz4 or raw (they store any type and band count), or "
                                  "--bands / --image-dtype to make the images fit")
        version = cls.version_for("none", codecs, spec)
        if version not in cls.versions:  # pragma: no cover - every format reads version 3
            raise ConfigError(f"--format {cls.name} cannot store {spec.image_dtype} images of "
                              f"{spec.image_channels} bands")

    @classmethod
    def version_for(cls, compression: str, codecs: ArrayCodecs, spec: SampleSpec | None = None) -> int:
        """The format version a dataset with these options is written in: the lowest that can say it, 1 unless a
        codec needs version 2, or images other than (H, W, 3) uint8 RGB need version 3."""
        if spec is not None and not spec.legacy_image:
            return 3
        return 1 if codecs.raw else 2

    @classmethod
    def format_options(cls, spec: SampleSpec, compression: str, codecs: ArrayCodecs) -> dict[str, Any]:
        return cls.writer.format_options(spec, compression, codecs)

    @classmethod
    def open_shard(cls, directory: Path, shard: ShardInfo, spec: SampleSpec, manifest: Any) -> ShardReader:
        """The reader of one shard of ``manifest`` (a :class:`~shardkit.store.manifest.Manifest`), version checked."""
        cls.check_version(manifest.format_version, Path(directory) / "manifest.json")
        reader = cls.reader(directory, shard, spec, manifest.format_options, manifest.format_version)
        if spec.size is None:  # variable size: each sample's (H, W) from the manifest bounds what a record may claim
            shards = manifest.shards
            pos = shard.index if 0 <= shard.index < len(shards) and shards[shard.index] is shard else \
                next(k for k, s in enumerate(shards) if s == shard)
            reader.hw_source = partial(manifest.samples.hw, pos)  # read on first use, from its folder
        return reader

    @classmethod
    def check_version(cls, version: int, where: Path) -> None:
        if version not in cls.versions:
            known = ", ".join(map(str, cls.versions))
            raise ShardFormatError(f"{cls.name} format version {version} is not supported (this shardkit reads "
                                   f"version {known})", path=where,
                                   fix="re-convert with this shardkit version or upgrade shardkit")
