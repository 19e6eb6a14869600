"""A conversion from and/or to object storage, staged through local folders.

Input on object storage (``RemoteSource``): the parent lists the bucket once and lays the listing out
as a local *skeleton* folder — sub-folders, an empty placeholder per image, and the small text files
discovery and class tables read (``*.txt``, ``*.csv``) — so discovery runs unchanged on
the remote listing. Fingerprints come from the listing too (size + ETag, no download). Each worker then
fetches only its own shard's images and labels into a private temporary folder, converts them, and
deletes them.

Output on object storage (``RemoteSink``): shards are written and renamed locally, exactly as for a
local output, in a temporary staging folder; each finished shard is uploaded (files first, then its
record ``.shard-<key>.json``) and its local files deleted, so local disk holds only the shards in flight.
After every shard of a split is up, the fingerprint cache, the new version's ``manifest-v<N>.json`` and then
``manifest.json`` — the commit marker — are uploaded last, and only then are objects that no kept version
names deleted (``--keep-versions``; object storage has no reader leases, retention alone protects readers).
A killed run leaves uploaded shards and records: the next run downloads the records, checks the objects'
sizes, and reuses them. One run per output holds a :class:`~shardkit.lock.RemoteLock`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .config import ConvertConfig
from .discover import IMAGE_EXTENSIONS
from .errors import ConfigError, OutputError, ShardkitError
from .fingerprint import CACHE_NAME, SourceCache, fingerprint_samples, sample_fingerprint
from .imageio import read_image_size
from .lock import OutputLock, RemoteLock
from .manifest import (
    MANIFEST_NAME,
    kept_versions,
    named_files,
    parse_manifest_bytes,
    version_name,
    version_number,
)
from .pairs import PairTable
from .plan import ShardTask
from .publish import current_manifest, published_number, versions_to_keep
from .records import RECORD_PREFIX, ShardRecord, records_within, reuse
from .splitdir import owned
from .splitfiles import ShardFile
from .storage import Remote, content_id

log = logging.getLogger(__name__)

#: Non-image files the skeleton holds whole: list files (``*.txt``) and class tables (``*.csv``), which
#: discovery reads; other files are left out of the skeleton.
TEXT_EXTENSIONS = frozenset({".txt", ".csv"})
MAX_TEXT_BYTES = 64 * 1024 * 1024
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

    @classmethod
    def build(cls, remote: Remote, skeleton: Path) -> RemoteSource:
        """List the input once and lay it out under ``skeleton`` (see the module docstring)."""
        listing = remote.listing(recursive=True)
        if not listing:
            from .errors import InputNotFoundError

            raise InputNotFoundError("no objects under this URL", path=remote.url,
                                     fix="point the input at the dataset's folder in the bucket")
        texts: list[tuple[str, Path]] = []
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
        remote.download_many(texts)
        log.info("%s: %d objects listed, %d small text files fetched; discovery runs on the listing laid out "
                 "in %s", remote.url, len(listing), len(texts), skeleton)
        return cls(remote, skeleton, {rel: content_id(info) for rel, info in listing.items()})

    def rel(self, path: Path) -> str:
        return Path(path).relative_to(self.skeleton).as_posix()

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


class RemoteSink:
    """An output folder on object storage, fed from the local staging folder (parent process only)."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote
        self.listings: dict[str, dict[str, int]] = {}
        self.lock: RemoteLock | None = None

    def prepare_split(self, directory: Path) -> None:
        """List the remote split folder; fetch its shard records, fingerprint cache and current manifest into
        ``directory``; delete version files newer than that manifest (a run killed before its commit)."""
        split = directory.name
        listing = self.remote.listing(split)
        self.listings[split] = {name: int(info.get("size") or 0) for name, info in listing.items()}
        wanted = [(f"{split}/{n}", directory / n) for n in listing
                  if "/" not in n and (n.startswith(RECORD_PREFIX) or n in (CACHE_NAME, MANIFEST_NAME))]
        self.remote.download_many(wanted)
        current = published_number(current_manifest(directory))
        orphans = [f"{split}/{n}" for n in listing if (version_number(n) or 0) > current]
        self.remote.delete(orphans)
        # the kept versions too: their shards' records stay (a run back to their content reuses the objects)
        self.remote.download_many([(f"{split}/{n}", directory / n) for n in listing
                                   if 0 < (version_number(n) or 0) <= current])

    def reuse(self, directory: Path, key: str, wanted_names: tuple[str, ...]) -> ShardRecord | None:
        """The record of shard ``key`` if every file it names is on the store with its recorded size.

        Content is not re-hashed (that would download every shard): an object store writes an object
        whole or not at all, names hold the shard's content key, and a file's record is uploaded only after
        the file. ``shardkit verify URL`` re-checks every sha256. A shard whose position moved is copied
        to its new names on the store (server side)."""
        split = directory.name
        sizes = self.listings.get(split, {})
        record = ShardRecord.load(directory, key)
        if record is None or len(record.files) != len(wanted_names) or record.key != key:
            return None
        if any(sizes.get(f.name) != f.bytes for f in record.files):
            return None
        files = []
        for f, name in zip(record.files, wanted_names, strict=True):
            if f.name != name:
                self.remote.copy(f"{split}/{f.name}", f"{split}/{name}")
                sizes[name] = f.bytes
            files.append(ShardFile(name, f.bytes, f.sha256))
        moved = replace(record, files=tuple(files), stats_on_disk=())
        if moved != record:
            moved.save(directory)
            self._upload_record(directory, key)
        return moved

    def _upload_record(self, directory: Path, key: str) -> None:
        path = ShardRecord.path(directory, key)
        self.remote.upload(path, f"{directory.name}/{path.name}")

    def shard_published(self, directory: Path, record: ShardRecord) -> None:
        """Upload a shard renamed into place locally: files, then its record; then free the local files."""
        split = directory.name
        for f in record.files:
            self.remote.upload(directory / f.name, f"{split}/{f.name}")
        self._upload_record(directory, record.key)
        for f in record.files:
            (directory / f.name).unlink(missing_ok=True)
            self.listings.setdefault(split, {})[f.name] = f.bytes

    def split_committed(self, directory: Path, records: Sequence[ShardRecord], keep_versions: int) -> None:
        """Upload the fingerprint cache, the new version file(s), then ``manifest.json`` (the commit marker),
        then delete what no kept version names (old shards, records and version files of earlier runs)."""
        split = directory.name
        if self.lock is not None:
            self.lock.check()
        if (directory / CACHE_NAME).is_file():
            self.remote.upload(directory / CACHE_NAME, f"{split}/{CACHE_NAME}")
        remote_names = set(self.remote.listing(split))
        local_names = [p.name for p in directory.iterdir()]
        for number in kept_versions(local_names):  # the new version (and a pre-version manifest kept as 1)
            name = version_name(number)
            if name not in remote_names:
                self.remote.upload(directory / name, f"{split}/{name}")
        self.remote.upload(directory / MANIFEST_NAME, f"{split}/{MANIFEST_NAME}")
        keep = {f.name for r in records for f in r.files}
        keep |= {ShardRecord.path(directory, r.key).name for r in records}
        keep |= {MANIFEST_NAME, CACHE_NAME}
        listing = self.remote.listing(split)
        numbers = kept_versions(listing)
        kept = versions_to_keep(numbers, keep_versions)
        stale = []
        for number in numbers:
            name = version_name(number)
            if number not in kept:
                stale.append(f"{split}/{name}")
                continue
            local = directory / name
            data = local.read_bytes() if local.is_file() else self.remote.read_bytes(f"{split}/{name}")
            try:
                keep |= named_files(parse_manifest_bytes(data, self.remote.url_of(f"{split}/{name}"))) | {name}
            except ShardkitError:
                continue
        keep |= records_within(directory, keep)  # the records fetched by prepare_split
        stale += [f"{split}/{n}" for n in listing if "/" not in n and n not in keep and owned(n)]
        self.remote.delete(stale)
        log.info("%s: manifest uploaded (versions kept: %s), %d stale objects removed", self.remote.url_of(split),
                 ", ".join(map(str, sorted(kept))) or "none", len(stale))


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
        self.sink: RemoteSink | None = None
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
        if self.sink is None:
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

    def prepare_split(self, directory: Path) -> None:
        if self.sink is not None:
            self.sink.prepare_split(directory)

    def reuse(self, directory: Path, key: str, wanted_names: tuple[str, ...], *,
              rehash: bool = False) -> ShardRecord | None:
        """A reusable shard's record. ``rehash`` (local outputs): hash every file instead of trusting its stat;
        on object storage sizes are compared and ``shardkit verify URL`` hashes (it would download every shard)."""
        if self.sink is not None:
            return self.sink.reuse(directory, key, wanted_names)
        return reuse(directory, key, wanted_names, rehash=rehash)

    def shard_published(self, directory: Path, record: ShardRecord) -> None:
        if self.sink is not None:
            self.sink.shard_published(directory, record)

    def split_committed(self, directory: Path, records: Sequence[ShardRecord], keep_versions: int) -> None:
        if self.sink is not None:
            self.sink.split_committed(directory, records, keep_versions)

    def committed(self, split: str, local_manifest: Path) -> Path | str:
        """Where the split's manifest now is: its URL on object storage, else the local path."""
        if self.sink is not None:
            return self.sink.remote.url_of(f"{split}/{MANIFEST_NAME}")
        return local_manifest
