"""A conversion from and/or to object storage, staged through local folders.

Input on object storage (``RemoteSource``): the parent lists the bucket once and lays the listing out
as a local *skeleton* folder — sub-folders, an empty placeholder per image, and the small text files
discovery and class tables read (``*.txt``, ``*.csv``) — so discovery runs unchanged on
the remote listing. Fingerprints come from the listing too (size + ETag, no download). Each worker then
fetches only its own shard's images and labels into a private temporary folder, converts them, and
deletes them.

Output on object storage (:class:`~shardkit.store.splitdir.RemoteSink`, the object-storage implementation of the
split-folder interface): shards are written and renamed locally, exactly as for a local output, in a temporary
staging folder, then uploaded shard by shard; the manifest goes up last. One run per output holds a
:class:`~shardkit.files.lock.RemoteLock`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, OutputError
from ..files.lock import OutputLock, RemoteLock
from ..files.storage import Remote, content_id
from ..images.imageio import read_image_size
from ..store.splitdir import LocalSink, RemoteSink, SplitSink
from .config import ConvertConfig
from .fingerprint import SourceCache, fingerprint_samples, sample_fingerprint
from .layouts import IMAGE_EXTENSIONS
from .pairs import PairTable
from .plan import ShardTask

log = logging.getLogger(__name__)

#: Non-image files the skeleton holds whole: list files (``*.txt``) and class tables (``*.csv``), which
#: discovery reads; other files are left out of the skeleton.
TEXT_EXTENSIONS = frozenset({".txt", ".csv"})
MAX_TEXT_BYTES = 64 * 1024 * 1024
#: Annotation files (COCO/labelme JSON, CVAT XML) an annotation source may read: listed with the skeleton, fetched
#: only when the run looks for annotations (:meth:`RemoteSource.fetch_annotations`); larger ones are left out
ANNOTATION_EXTENSIONS = frozenset({".json", ".xml"})
MAX_ANNOTATION_BYTES = 1 << 30
HEADER_BYTES = 256 * 1024  # enough for any PNG/JPEG header PIL needs to report a size


def staging_root() -> str | None:
    """Where staging folders go: ``$SHARDKIT_STAGING_DIR`` or the system temporary folder."""
    return os.environ.get("SHARDKIT_STAGING_DIR") or None


def _posix(text: str) -> str:
    """A path relative to the skeleton (a pair table's text) as the listing names it."""
    return text.replace(os.sep, "/")


def _ext(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:].lower() if dot > 0 else ""


@dataclass(frozen=True)
class RemoteSource:
    """An input folder on object storage, as the workers see it (picklable)."""

    remote: Remote
    skeleton: Path  # the local listing tree discovery ran on; pairs point into it
    ids: dict[str, str]  # relative path -> content id (size + ETag …)
    annotations: tuple[str, ...] = ()  # relative paths of the annotation files, fetched on demand

    @classmethod
    def build(cls, remote: Remote, skeleton: Path) -> RemoteSource:
        """List the input once and lay it out under ``skeleton`` (see the module docstring)."""
        listing = remote.listing(recursive=True)
        if not listing:
            from ..errors import InputNotFoundError

            raise InputNotFoundError("no objects under this URL", path=remote.url,
                                     fix="point the input at the dataset's folder in the bucket")
        texts: list[tuple[str, Path]] = []
        annotations: list[str] = []
        for rel, info in listing.items():
            parts = rel.split("/")
            if any(p in ("", ".", "..") for p in parts):
                continue
            local = skeleton.joinpath(*parts)
            ext = _ext(parts[-1])
            if ext in IMAGE_EXTENSIONS:
                local.parent.mkdir(parents=True, exist_ok=True)
                local.touch()
            elif ext in TEXT_EXTENSIONS and int(info.get("size") or 0) <= MAX_TEXT_BYTES:
                texts.append((rel, local))
            elif ext in ANNOTATION_EXTENSIONS and int(info.get("size") or 0) <= MAX_ANNOTATION_BYTES:
                annotations.append(rel)
        remote.download_many(texts)
        log.info("%s: %d objects listed, %d small text files fetched; discovery runs on the listing laid out "
                 "in %s", remote.url, len(listing), len(texts), skeleton)
        return cls(remote, skeleton, {rel: content_id(info) for rel, info in listing.items()},
                   tuple(sorted(annotations)))

    def fetch_annotations(self) -> None:
        """Fetch the listed annotation files (``*.json``, ``*.xml``) into the skeleton, for an annotation source to
        find and read there (mask layouts never need them: fetched only when the run looks for annotations)."""
        wanted = [(rel, self.skeleton.joinpath(*rel.split("/"))) for rel in self.annotations]
        self.remote.download_many(wanted)
        log.info("%s: %d annotation files (*.json, *.xml) fetched to look for annotations", self.remote.url,
                 len(wanted))

    def rel(self, path: Path) -> str:
        path = Path(path)
        if not path.is_relative_to(self.skeleton):  # a resolved path (an annotation source's): the resolved skeleton
            return path.relative_to(self.skeleton.resolve()).as_posix()
        return path.relative_to(self.skeleton).as_posix()

    def fingerprints(self, pairs: PairTable, digest: str) -> np.ndarray:
        """Fingerprints from the listing's content ids (an (n, 32) uint8 array): a changed object (new ETag or
        size) changes them."""
        ids = self.ids
        out = bytearray()
        for image, label in zip(pairs.images, pairs.labels, strict=True):
            out += sample_fingerprint(digest, ids[_posix(image)], ids[_posix(label)] if label else None)
        return np.frombuffer(bytes(out), np.uint8).reshape(-1, 32)

    def header_size(self, path: Path) -> tuple[int, int]:
        """(H, W) from the first bytes of the object (byte-limited planning), falling back to the whole object."""
        from io import BytesIO

        from PIL import Image

        rel = self.rel(path)
        try:
            with Image.open(BytesIO(self.remote.read_range(rel, 0, HEADER_BYTES))) as im:
                w, h = im.size
            return int(h), int(w)
        except Exception:  # an unusual header: fetch the object and let the local reader decide
            with tempfile.TemporaryDirectory(dir=staging_root()) as tmp:
                local = Path(tmp) / Path(rel).name
                self.remote.download(rel, local)
                return read_image_size(local)

    @contextlib.contextmanager
    def staged(self, task: ShardTask) -> Iterator[tuple[ShardTask, Path]]:
        """Fetch one shard's inputs into a private temporary folder: (the task pointing there, that root)."""
        with tempfile.TemporaryDirectory(prefix="shardkit-in-", dir=staging_root()) as tmp:
            root = Path(tmp)
            assert isinstance(task.samples, PairTable)  # the pipeline's tasks carry slices of a split's pairs
            wanted = {rel: root.joinpath(*rel.split("/")) for col in (task.samples.images, task.samples.labels)
                      for rel in map(_posix, col) if rel}
            self.remote.download_many(sorted(wanted.items()))
            yield replace(task, samples=task.samples.with_root(root)), root


class StorageSession:
    """Where one conversion reads and writes; a no-op wrapper around local folders.

    ``with StorageSession(cfg) as session:`` gives ``session.cfg`` (the config with local input and
    output folders: the skeleton and the staging folder where object storage is involved) and the hooks
    the pipeline calls. Staging folders are removed on exit, whatever happened.
    """

    def __init__(self, cfg: ConvertConfig) -> None:
        self.original = cfg
        self.cfg = cfg
        self.source: RemoteSource | None = None
        #: where the split folders go: :class:`~shardkit.store.splitdir.LocalSink`, or a
        #: :class:`~shardkit.store.splitdir.RemoteSink` fed from the staging folder
        self.sink: SplitSink = LocalSink()
        self.input_name = cfg.input_url or Path(cfg.input).expanduser().resolve().as_posix()
        self.output_name = cfg.output_url or str(cfg.output)
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> StorageSession:
        cfg = self.original
        if cfg.input_url and cfg.output_url:
            a, b = cfg.input_url.rstrip("/"), cfg.output_url.rstrip("/")
            if b == a or b.startswith(a + "/"):
                raise OutputError("the output folder is inside the input folder", path=cfg.output_url,
                                  fix="choose an output folder outside the dataset, e.g. next to it")
        if cfg.output_url and cfg.backend == "dask":
            raise ConfigError("--backend dask cannot write to object storage yet",
                              fix="convert to a shared folder with dask, or use --backend local")
        try:
            changes: dict[str, Any] = {}
            if cfg.input_url:
                skeleton = Path(self._stack.enter_context(tempfile.TemporaryDirectory(
                    prefix="shardkit-list-", dir=staging_root())))
                self.source = RemoteSource.build(Remote(cfg.input_url, cfg.storage_options), skeleton)
                changes["input"] = skeleton
            if cfg.output_url:
                staging = Path(self._stack.enter_context(tempfile.TemporaryDirectory(
                    prefix="shardkit-out-", dir=staging_root())))
                self.sink = RemoteSink(Remote(cfg.output_url, cfg.storage_options))
                changes["output"] = staging
            if changes:
                self.cfg = cfg.replace(**changes, input_url=None, output_url=None)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def lock(self) -> contextlib.AbstractContextManager[Any]:
        """flock on a local output; the lock object (and a local flock on the staging folder) on a remote one."""
        if not isinstance(self.sink, RemoteSink):
            return OutputLock(self.cfg.output)
        stack = contextlib.ExitStack()
        stack.enter_context(OutputLock(self.cfg.output))
        self.sink.lock = stack.enter_context(RemoteLock(self.sink.remote))
        return stack

    def fingerprints(self, pairs: PairTable, digest: str, old_cache: SourceCache, *, threads: int,
                     on_error: str) -> tuple[np.ndarray, SourceCache]:
        """Fingerprints of ``pairs`` and the refreshed cache (object storage: from the listing, no cache)."""
        if self.source is not None:
            old_cache.close()
            return self.source.fingerprints(pairs, digest), SourceCache(len(pairs))
        return fingerprint_samples(pairs, digest, old_cache, threads=threads, on_error=on_error)

    @property
    def header_size(self) -> Callable[[Path], tuple[int, int]]:
        return self.source.header_size if self.source is not None else read_image_size
