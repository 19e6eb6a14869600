"""Where a split's bytes come from: one object per opened split version, local folder or object storage.

A :class:`ByteSource` opens one version of one split, parses its manifest once (under the manifest's parse
bounds, :func:`~shardkit.store.manifest.parse_manifest_bytes`), and hands out a shard's files, or its samples
sidecar alone, as a :class:`Hold`: a folder on this machine where those files stay (pinned) until the hold is
closed. :meth:`ByteSource.close` gives back what the source took (a reader lease on a local version, a remote
split's read-through folders). The readers (:class:`~shardkit.read.dataset.Dataset`), ``verify``, ``diff``,
``info`` and the object-storage sink all read a split's bytes through it:

* :class:`LocalBytes`: a split folder; a hold is the folder itself, the version kept by a reader lease.
* :class:`RemoteBytes`: a split on object storage, its files fetched into a :class:`FileStore`: the bounded shard
  cache of the readers (:class:`~shardkit.read.cache.ShardCache`), or :class:`TempFiles`, a private temporary
  folder whose files are deleted when their hold closes (verify, diff, info, the sink).

Every remote file is fetched by :func:`download_verified`, the one download-then-verify.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import IntegrityError
from ..files.splitfiles import ShardFile, ShardInfo, member_path
from ..files.storage import Remote, is_url
from ..formats.base import sha256_file
from .manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    Manifest,
    checked_version,
    kept_versions,
    load_manifest,
    manifest_from_bytes,
    requested_version,
    version_name,
)
from .publish import drop_lease, take_lease

__all__ = ["ByteSource", "FileStore", "Hold", "LocalBytes", "RemoteBytes", "TempFiles", "download_verified",
           "open_bytes"]


def download_verified(remote: Remote, f: ShardFile, directory: Path) -> Path:
    """Download ``f`` of the split at ``remote`` into ``directory``: its size asked of the store first, the
    download stopped past the manifest's size, its sha256 compared, and only then renamed to its name; the path."""
    final = member_path(f.name, directory)
    info = remote.info(f.name)
    stored = int(info.get("size") or 0) if info is not None else None
    if stored != f.bytes:
        raise IntegrityError(
            f"the object is {stored if stored is not None else 'missing'} bytes, the manifest says "
            f"{f.bytes}: not downloaded", path=remote.url_of(f.name),
            fix="the object was changed or removed after conversion; re-open the split or re-convert it")
    part = directory / f".{f.name}.part-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        remote.download(f.name, part, max_bytes=f.bytes)
        digest = sha256_file(part)
        if digest != f.sha256 or part.stat().st_size != f.bytes:
            raise IntegrityError(
                f"downloaded {part.stat().st_size} bytes with sha256 {digest[:12]}…, the manifest says "
                f"{f.bytes} bytes, {f.sha256[:12]}…", path=remote.url_of(f.name),
                fix="the object was changed or damaged after conversion; re-convert this split")
        os.replace(part, final)
    finally:
        part.unlink(missing_ok=True)
    return final


class Hold:
    """Files of one shard at hand in :attr:`folder`, kept there until :meth:`close`: pinned in a shared cache
    (descriptors holding shared locks that eviction must take exclusively), or deleted on close (a private
    temporary copy). The store that handed it out may close it first (a read-through folder it deletes):
    :attr:`open` then turns False, and whoever holds it fetches again. :attr:`kept` is the holder's object
    built on the files (a shard's reader); it is dropped with the hold."""

    def __init__(self, folder: Path, pins: Sequence[int] = (), remove: Sequence[Path] = ()) -> None:
        """``pins``: descriptors to close, ``remove``: folders to delete, when the hold closes."""
        self.folder = folder
        self._pins = list(pins)
        self._remove = list(remove)
        self._pid = os.getpid()
        self.open = True
        self.kept: Any = None

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:  # descriptors and files stay with the process that holds them
        return {**self.__dict__, "_pins": [], "_remove": [], "open": False, "kept": None}

    @property
    def owned(self) -> bool:
        """Whether this process took the hold (a forked child inherits its parent's, which it must not use)."""
        return self._pid == os.getpid()

    def close(self) -> None:
        """Unpin the files (or delete the private copy) and forget :attr:`kept`; a forked child's inherited
        descriptors stay with its parent's lock."""
        self.open, self.kept = False, None
        pins, remove, self._pins, self._remove = self._pins, self._remove, [], []
        if self._pid != os.getpid():
            return
        for fd in pins:
            with contextlib.suppress(OSError):
                os.close(fd)
        for path in remove:
            shutil.rmtree(path, ignore_errors=True)


class FileStore(ABC):
    """Where the files of a split on object storage are fetched to on this machine."""

    remote: Remote
    directory: Path
    #: bytes this store may hold (None: no bound)
    limit: int | None = None

    @abstractmethod
    def keep_manifest(self, data: bytes, manifest: Manifest, *, current: bool) -> Path:
        """Keep the manifest ``data`` (parsed once by the source: ``manifest``; the split's current one when
        ``current``) in the store; its path there."""

    @abstractmethod
    def hold(self, shard: ShardInfo, files: Sequence[ShardFile] | None = None) -> Hold:
        """``files`` of ``shard`` (all of them by default), verified and held on this machine."""

    def release(self) -> None:  # noqa: B027 - nothing held by default
        """Give back what this process holds beyond open holds (read-through folders)."""


class TempFiles(FileStore):
    """A private temporary folder: each hold downloads its files there and deletes them when it closes (one
    shard at a time on disk), for what reads a remote split once (verify, diff, info, the sink)."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote
        #: made by the first hold (a source read for its manifest alone writes nothing), removed by :meth:`release`
        self.directory = Path(tempfile.gettempdir()) / f"shardkit-fetch-{os.getpid()}-{secrets.token_hex(6)}"
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.directory, ignore_errors=True)

    def keep_manifest(self, data: bytes, manifest: Manifest, *, current: bool) -> Path:
        """Nothing is kept: the source holds the parsed manifest."""
        return self.directory / (MANIFEST_NAME if current or manifest.version is None
                                 else version_name(manifest.version))

    def hold(self, shard: ShardInfo, files: Sequence[ShardFile] | None = None) -> Hold:
        self.directory.mkdir(mode=0o700, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="shard-", dir=self.directory))
        try:
            for f in shard.all_files if files is None else files:
                download_verified(self.remote, f, folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return Hold(folder, remove=[folder])

    def release(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class ByteSource(ABC):
    """One version of one split and where its bytes come from (see the module's docstring)."""

    #: the manifest of the version opened, parsed once; its samples table reads sidecars through :meth:`sidecar`
    manifest: Manifest
    #: the folder holding the manifest read (a remote split's store folder)
    folder: Path
    #: the store of a split on object storage (None for a local folder)
    files: FileStore | None = None

    @property
    @abstractmethod
    def location(self) -> str:
        """The split's URL (object storage) or local folder, as messages name it."""

    @property
    def manifest_path(self) -> Path | str:
        """The manifest file of a local split; a remote split's URL."""
        return self.folder / MANIFEST_NAME if self.files is None else self.location

    @abstractmethod
    def hold(self, shard: ShardInfo, files: Sequence[ShardFile] | None = None) -> Hold:
        """``files`` of ``shard`` (all of them by default) in a folder on this machine, kept until the hold closes."""

    @contextlib.contextmanager
    def sidecar(self, shard: ShardInfo) -> Iterator[Path]:
        """The folder holding ``shard``'s verified samples sidecar, kept there while the block runs (only that file
        is fetched: keys and sizes, never pixels)."""
        with self.hold(shard, (shard.samples,) if shard.samples is not None else None) as held:
            yield held.folder

    @abstractmethod
    def kept_versions(self) -> list[int]:
        """The publish numbers of the split's kept versions, ascending."""

    @abstractmethod
    def close(self) -> None:
        """Give back what this source took (a lease, read-through folders); reading afterwards still works while
        the version is kept."""

    def __enter__(self) -> ByteSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalBytes(ByteSource):
    """A split folder on this machine. With ``lease``, a reader lease on the version read (formats/manifest.md,
    "Versions") keeps its files from a publish's clean-up until :meth:`close` or the end of the process."""

    def __init__(self, folder: Path, version: int | None = None, *, lease: bool = True) -> None:
        self.manifest = load_manifest(folder, version)
        folder = Path(folder)
        self.folder = folder.parent if folder.is_file() else folder
        self._lease: weakref.finalize | None = None
        if lease and self.manifest.version is not None:
            taken = take_lease(self.folder, self.manifest.version)
            if taken is not None:
                self._lease = weakref.finalize(self, drop_lease, taken, os.getpid())

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lease": None}  # the opening process's lease covers its workers

    @property
    def location(self) -> str:
        return str(self.folder)

    def hold(self, shard: ShardInfo, files: Sequence[ShardFile] | None = None) -> Hold:
        return Hold(self.folder)

    def kept_versions(self) -> list[int]:
        return kept_versions(p.name for p in self.folder.iterdir())

    def close(self) -> None:
        if self._lease is not None:
            self._lease()


class RemoteBytes(ByteSource):
    """A split on object storage, its files fetched into ``files`` (the manifest of ``version``, or the current
    one, read once: it is also kept in the store)."""

    def __init__(self, files: FileStore, version: int | None = None) -> None:
        self.files = files
        self.remote = files.remote
        self.folder = files.directory
        version = requested_version(version)
        rel = MANIFEST_NAME if version is None else version_name(version)
        data = self.remote.read_bytes(rel, limit=MAX_MANIFEST_BYTES)
        where = files.directory / rel
        manifest = manifest_from_bytes(data, where, sidecars=self.sidecar)
        checked_version(manifest, where, version)
        files.keep_manifest(data, manifest, current=version is None)
        self.manifest = manifest

    @property
    def location(self) -> str:
        return self.remote.url

    def hold(self, shard: ShardInfo, files: Sequence[ShardFile] | None = None) -> Hold:
        return self.files.hold(shard, files) if self.files is not None else Hold(self.folder)

    def kept_versions(self) -> list[int]:
        return kept_versions(self.remote.listing())

    def close(self) -> None:
        if self.files is not None:
            self.files.release()


def open_bytes(location: str | os.PathLike[str], version: int | None = None, *,
               storage_options: Mapping[str, Any] | None = None, files: FileStore | None = None,
               lease: bool = True) -> ByteSource:
    """The :class:`ByteSource` of ``location`` (a split folder or URL) at ``version`` (the current one by default):
    a URL's files through ``files`` (a private :class:`TempFiles` by default)."""
    if not is_url(location):
        return LocalBytes(Path(location), version, lease=lease)
    return RemoteBytes(files if files is not None else TempFiles(Remote(os.fspath(location), storage_options)),
                       version)
