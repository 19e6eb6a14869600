"""A bounded local cache of whole shards, for splits read from object storage (``shardkit.open("s3://…")``).

* **Whole shards, verified once.** A shard's files are downloaded on first use into
  ``<cache_dir>/<url digest>/`` under a temporary name, their sha256 compared with the manifest, then
  renamed into place; later opens trust the verified file (size still checked). The cached folder is read
  by the ordinary local readers, with their checks (regular files, real path inside the folder).
* **One download per machine.** A per-shard ``flock`` makes concurrent processes (DataLoader workers,
  several jobs) wait for the one downloading instead of downloading it again.
* **A limit that does not thrash.** Space is accounted across the whole ``cache_dir`` (finished files plus
  reservations of downloads in flight). A shard is admitted while it fits; when it does not, files of
  *other* splits are evicted, least recently used first. A split never evicts its own shards: when it is
  larger than the limit, the shards admitted first stay (a stable subset, hit on every epoch) and the
  rest are **read through**: downloaded to a private temporary folder, verified, read, and deleted when
  the process has moved on by :func:`read_through_slots` shards (default 4, ``$SHARDKIT_READ_THROUGH``), or
  sooner: read-through folders count against the limit too, and a process drops its oldest ones while the
  cache would exceed it. A split larger than the limit leaves one shard's room under the limit for them (so a
  buffer shuffle straddling two shards keeps both). **The limit is a bound**: the cache folder holds at most
  ``limit`` plus one shard per process reading it (DataLoader workers included).
  An LRU over an epoch larger than the cache would instead evict every shard just before it is needed
  again and hit never. A read-through shard costs one download per visit: with ``shuffle_mode="buffer"``
  and a ``buffer_size`` of at most (slots - 2) shards' samples, each is visited once per epoch; the
  global shuffle visits a shard once per batch that draws from it, so prefer the buffer shuffle for
  splits much larger than the cache.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import multiprocessing.util
import os
import re
import secrets
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..conversion.config import parse_bytes
from ..errors import ConfigError, IntegrityError, ShardkitError
from ..files.lock import pid_alive
from ..files.splitfiles import ShardFile, ShardInfo
from ..files.storage import Remote
from ..store.manifest import (
    MANIFEST_NAME,
    Manifest,
    kept_versions,
    named_files,
    read_manifest_json,
    version_name,
    version_number,
)
from ..store.publish import atomic_write_bytes
from ..store.source import FileStore, Hold, download_verified
from ..support.smallfile import read_guarded

log = logging.getLogger(__name__)

#: Read-through shards a process keeps at once unless ``$SHARDKIT_READ_THROUGH`` says otherwise.
READ_THROUGH_SLOTS = 4
_RESERVE = ".reserve-"
_TRANSIENT = ".transient-"
_GLOBAL_LOCK = ".cache.lock"
_PIN = ".pin-"
_STEM = re.compile(r"-([0-9]{5}-[0-9a-f]{12})\.")


def default_cache_dir() -> Path:
    """``$SHARDKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/shardkit``, else ``~/.cache/shardkit``."""
    env = os.environ.get("SHARDKIT_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "shardkit"


def read_through_slots() -> int:
    """How many read-through shards a process keeps (``$SHARDKIT_READ_THROUGH``, default 4, at least 1)."""
    text = os.environ.get("SHARDKIT_READ_THROUGH", "")
    return max(1, int(text)) if text.isdigit() else READ_THROUGH_SLOTS


def parse_limit(limit: int | str | None) -> int | None:
    """``"20GB"``, ``"500MiB"`` or a byte count → bytes; None (or ``$SHARDKIT_CACHE_LIMIT``) → no limit."""
    if limit is None:
        limit = os.environ.get("SHARDKIT_CACHE_LIMIT") or None
        if limit is None:
            return None
    if isinstance(limit, int) and not isinstance(limit, bool):
        if limit <= 0:
            raise ConfigError(f"cache_limit {limit} must be positive")
        return limit
    text = str(limit).strip()
    return int(text) if text.isdigit() and int(text) > 0 else parse_bytes(text, "cache_limit", "20GB")


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if needed); released when the block ends or the process dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _same_bytes(path: Path, data: bytes) -> bool:
    try:
        return read_guarded(path, "cached manifest", limit=len(data)) == data
    except OSError:  # missing, not a regular file, longer
        return False


def _folder_bytes(folder: Path) -> int:
    """Bytes of the regular files directly in ``folder`` (a read-through folder; files vanishing meanwhile count 0)."""
    total = 0
    for p in folder.iterdir():
        with contextlib.suppress(OSError):
            if p.is_file():
                total += p.stat().st_size
    return total


def _is_manifest_name(name: str) -> bool:
    return name == MANIFEST_NAME or version_number(name) is not None


def _pin_path(path: Path) -> Path:
    """The lock file that pins the shard ``path`` belongs to: ``.pin-<stem>`` (every file of a shard, its
    sidecar included, carries the shard's stem ``NNNNN-<12 hex>``), else one for the file alone."""
    m = _STEM.search(path.name)
    return path.parent / f"{_PIN}{m.group(1) if m else path.name}"


def _remove_unpinned(path: Path) -> bool:
    """Delete a cached file unless a process holds its shard pinned (a shared ``flock`` on the shard's pin
    file); whether it was deleted."""
    try:
        fd = os.open(_pin_path(path), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # pinned by a reader
        os.close(fd)
        return False
    try:
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)  # a reader waiting for its shared lock finds the file gone and fetches again
    return True


class ShardCache(FileStore):
    """The local cache of one split on object storage: the :class:`~shardkit.store.source.FileStore` of a reader's
    :class:`~shardkit.store.source.RemoteBytes`. Picklable: a worker process gets its own transient slots.

    ``directory`` holds the manifests fetched (``manifest.json``, the current one, and ``manifest-v<N>.json``
    of each version a reader opened) and the admitted shard files under their manifest names.
    ``downloads`` counts the shards this process downloaded (cached or read through), for tests and logs.
    """

    def __init__(self, url: str, *, cache_dir: str | os.PathLike[str] | None = None, limit: int | str | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.remote = Remote(url, storage_options)
        self.root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.limit = parse_limit(limit)
        self.directory = self.root / self.remote.token()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            from ..errors import OutputError

            raise OutputError(f"cannot create the cache folder ({exc.strerror or exc})", path=self.root,
                              fix="pass a writable cache_dir= (or set SHARDKIT_CACHE_DIR)") from None
        self.downloads = 0
        #: bytes of the limit that cached shards leave free for read-through ones (:meth:`leave_room`: one shard
        #: when the split is larger than the limit, so the shard read before the current one stays within it)
        self.read_through_room = 0
        self._transient: OrderedDict[str, tuple[Path, list[Hold]]] = OrderedDict()
        self._transient_pid = os.getpid()
        self._remove_dead_leftovers()
        #: the local copy of the manifest opened (:meth:`keep_manifest`): the current one, or a kept version
        self.manifest = self.directory / MANIFEST_NAME

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_transient"] = OrderedDict()
        state["_transient_pid"] = None
        state["downloads"] = 0
        return state

    # ------------------------------------------------------------------ manifest
    def keep_manifest(self, data: bytes, manifest: Manifest, *, current: bool) -> Path:
        """Keep the manifest ``data`` read by a :class:`~shardkit.store.source.RemoteBytes` (``manifest``: parsed
        there, once) as ``manifest-v<N>.json``, and as ``manifest.json`` when it is the ``current`` one (the commit
        marker, always fetched); its path here. Cached files that no kept version of the split names any more, and
        that no process has open, are removed."""
        number = manifest.version
        with _flock(self.directory / ".manifest.lock"):
            if number is not None:
                path = self.directory / version_name(number)
                changed = not _same_bytes(path, data)
                if changed:
                    atomic_write_bytes(path, data)
            else:  # a manifest written before versions
                path = self.directory / MANIFEST_NAME
                changed = False
            if current and not _same_bytes(self.directory / MANIFEST_NAME, data):
                atomic_write_bytes(self.directory / MANIFEST_NAME, data)
                changed = True
            if changed:
                fresh = {path.name} | ({MANIFEST_NAME} if current else set())
                self._drop_retired(fresh, {f.name for shard in manifest.shards for f in shard.all_files})
        self.manifest = path
        return path

    def _drop_retired(self, fresh: set[str], names: set[str]) -> None:
        """Remove cached manifests of versions the store no longer keeps, and cached files none of the
        remaining manifests names (never a file a process has open: :func:`_remove_unpinned`). ``fresh``: the
        manifest files just kept, which name ``names`` (not parsed again)."""
        kept = set(kept_versions(self.remote.listing().keys()))
        for p in self.directory.iterdir():
            if p.name in fresh:
                continue
            number = version_number(p.name)
            if number is not None and number not in kept:
                p.unlink(missing_ok=True)
                continue
            if number is not None or p.name == MANIFEST_NAME:
                try:
                    names |= named_files(read_manifest_json(p))
                except ShardkitError:  # not a regular file, too large or too deep, not JSON: names nothing
                    continue
        for p in self.directory.iterdir():
            if not p.name.startswith(".") and not _is_manifest_name(p.name) and p.name not in names:
                _remove_unpinned(p)

    def _remove_dead_leftovers(self) -> None:
        """Reservations and read-through folders of processes that died (a forked worker never runs atexit)."""
        for p in self.directory.iterdir():
            for prefix in (_RESERVE, _TRANSIENT):
                if p.name.startswith(prefix):
                    pid = p.name[len(prefix):].split("-", 1)[0]
                    if pid.isdigit() and not pid_alive(int(pid)):
                        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ space
    def usage(self) -> int:
        """Bytes held in ``root``: finished files of every cached split, the read-through folders of live processes
        and the reservations of downloads in flight."""
        total = 0
        for folder in self.root.iterdir() if self.root.is_dir() else ():
            if not folder.is_dir():
                continue
            for p in folder.iterdir():
                try:
                    if p.name.startswith(_RESERVE):
                        pid = p.name[len(_RESERVE):].split("-", 1)[0]
                        if pid.isdigit() and pid_alive(int(pid)):  # a dead downloader's reservation is void
                            total += int(read_guarded(p, "reservation", limit=32) or 0)
                    elif p.name.startswith(_TRANSIENT) and p.is_dir():
                        pid = p.name[len(_TRANSIENT):].split("-", 1)[0]
                        if pid.isdigit() and pid_alive(int(pid)):  # a dead process's folder is reclaimed
                            total += _folder_bytes(p)
                    elif not p.name.startswith(".") and p.is_file():
                        total += p.stat().st_size
                except (OSError, ValueError):
                    continue
        return total

    def _evict(self, need: int) -> int:
        """Delete least recently used files of *other* splits until ``need`` bytes are freed; bytes freed.
        A file some process has open (pinned) is never deleted."""
        candidates = []
        for folder in self.root.iterdir():
            if not folder.is_dir() or folder == self.directory:
                continue
            for p in folder.iterdir():
                if not p.name.startswith(".") and not _is_manifest_name(p.name) and p.is_file():
                    with contextlib.suppress(OSError):
                        st = p.stat()
                        candidates.append((st.st_mtime, st.st_size, p))
        freed = 0
        for _, size, p in sorted(candidates, key=lambda c: c[0]):
            if freed >= need:
                break
            if _remove_unpinned(p):
                freed += size
                log.debug("cache: evicted %s (%d bytes)", p, size)
        return freed

    def leave_room(self, shard_sizes: Sequence[int]) -> None:
        """A split whose shards (``shard_sizes`` bytes) do not all fit under the limit keeps one shard's room (at
        most half the limit) free of cached shards, for the read-through ones (:attr:`read_through_room`)."""
        if self.limit is not None and sum(shard_sizes) > self.limit:
            self.read_through_room = min(max(shard_sizes, default=0), self.limit // 2)

    def _admit(self, need: int) -> Path | None:
        """Reserve ``need`` bytes in the cache (a reservation file; None when they do not fit even after eviction,
        under the limit less :attr:`read_through_room`)."""
        with _flock(self.root / _GLOBAL_LOCK):
            if self.limit is not None:
                room = self.limit - self.read_through_room
                used = self.usage()
                if used + need > room:
                    used -= self._evict(used + need - room)
                if used + need > room:
                    return None
            reservation = self.directory / f"{_RESERVE}{os.getpid()}-{secrets.token_hex(4)}"
            reservation.write_text(str(need))
            return reservation

    # ------------------------------------------------------------------ shards
    def _present(self, files: Sequence[ShardFile], directory: Path) -> bool:
        for f in files:
            try:
                if (directory / f.name).stat().st_size != f.bytes:
                    return False
            except OSError:
                return False
        return True

    def _download(self, files: Sequence[ShardFile], directory: Path) -> None:
        """Download ``files`` into ``directory``, each by :func:`~shardkit.store.source.download_verified`."""
        for f in files:
            download_verified(self.remote, f, directory)

    def hold(self, shard: ShardInfo, files: Sequence[ShardFile] | None = None) -> Hold:
        """``files`` of ``shard`` (all of them by default; its sidecar alone for sample records), verified and pinned
        (:meth:`pin`) in the cache folder, or (when they do not fit under the limit) in a private read-through
        folder; the hold closes, and the files go, when the read-through slot is dropped. Pinned before they are
        handed out, so another process sharing the cache cannot evict them between the fetch and the read."""
        whole = files is None or {f.name for f in files} == {f.name for f in shard.all_files}
        wanted = tuple(shard.all_files if files is None else files)
        for _ in range(3):
            folder, slot = self._fetch(shard, wanted, count=whole)
            pins = self.pin(wanted, folder)
            if pins is not None:
                held = Hold(folder, pins)
                if slot is not None:  # closed with the slot; the holds closed since are forgotten
                    slot[:] = [h for h in slot if h.open]
                    slot.append(held)
                return held
        raise IntegrityError("shard files keep disappearing from the cache while being opened", path=self.directory,
                             fix="another process is deleting files in this cache_dir; give each job its own "
                                 "cache_dir or a larger cache_limit")

    def _fetch(self, shard: ShardInfo, files: Sequence[ShardFile], *, count: bool) -> tuple[Path, list[Hold] | None]:
        """The folder holding ``files`` verified, and the holds of its read-through slot (None: the cache folder)."""
        if self._present(files, self.directory):
            self._touch(files)
            return self.directory, None
        with _flock(self.directory / f".lock-{files[0].name}"):
            if self._present(files, self.directory):  # another process downloaded it while we waited
                self._touch(files)
                return self.directory, None
            need = sum(f.bytes for f in files)
            reservation = self._admit(need)
            if reservation is not None:
                try:
                    self._download(files, self.directory)
                finally:
                    reservation.unlink(missing_ok=True)
                self.downloads += count
                log.debug("cache: shard %d cached (%d bytes)", shard.index, need)
                return self.directory, None
        return self._read_through(shard, files, count=count)

    def pin(self, files: Sequence[ShardFile], directory: Path) -> list[int] | None:
        """Pin ``files`` in ``directory`` so that no process evicts them while they are read: a shared ``flock``
        on their shard's pin file (one descriptor per shard, however many files it has), which eviction must
        take exclusively, without waiting, before it deletes. The descriptors, to close when done, or None when
        a file is gone or changed (fetch again)."""
        fds: list[int] = []
        try:
            for pin in dict.fromkeys(_pin_path(directory / f.name) for f in files):
                fd = os.open(pin, os.O_RDWR | os.O_CREAT, 0o644)
                fds.append(fd)
                fcntl.flock(fd, fcntl.LOCK_SH)
            if self._present(files, directory):  # checked under the lock: they stay until it is released
                return fds
        except OSError:
            pass
        Hold(directory, fds).close()
        return None

    def _touch(self, files: Sequence[ShardFile]) -> None:
        """Mark the shard recently used (mtime), for the LRU order other splits evict in."""
        with contextlib.suppress(OSError):
            os.utime(self.directory / files[0].name)

    def _read_through(self, shard: ShardInfo, files: Sequence[ShardFile], *,
                      count: bool) -> tuple[Path, list[Hold]]:
        """A private folder holding ``files``, kept in one of :func:`read_through_slots` slots keyed by the first
        file's name: the same shard read through again reuses its folder; the oldest slot's folder is deleted
        (and its holds closed) when a new one is needed. Released at exit, also in worker processes."""
        if self._transient_pid != os.getpid():  # a forked child: the parent's read-through folders are not ours
            self._transient, self._transient_pid = OrderedDict(), os.getpid()
        key = files[0].name if len(files) == len(shard.all_files) else f"{files[0].name}#part"
        hit = self._transient.get(key)
        if hit is not None and self._present(files, hit[0]):
            self._transient.move_to_end(key)
            return hit
        if hit is not None:
            self._drop_slot(key)
        if not self._transient:
            atexit.register(self.release_transient)
            # multiprocessing workers (DataLoader) end through multiprocessing's exit hooks, not atexit
            multiprocessing.util.Finalize(self, self.release_transient, exitpriority=10)
        reservation = self._admit_read_through(sum(f.bytes for f in files))
        try:
            folder = Path(tempfile.mkdtemp(prefix=f"{_TRANSIENT}{os.getpid()}-", dir=self.directory))
            try:
                self._download(files, folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
        finally:
            reservation.unlink(missing_ok=True)
        self.downloads += count
        log.debug("cache: shard %d read through (does not fit under the limit)", shard.index)
        slot: tuple[Path, list[Hold]] = (folder, [])
        self._transient[key] = slot
        while len(self._transient) > read_through_slots():
            self._drop_slot(next(iter(self._transient)))
        return slot

    def _admit_read_through(self, need: int) -> Path:
        """Make room for a read-through shard of ``need`` bytes and reserve them: while the cache (every process's
        read-through folders included) is over the limit, this process's oldest read-through shards are dropped;
        then the new one is added, which may go over it. So each process holds at most one shard beyond the limit:
        the cache folder stays within ``limit`` plus one shard per process reading it."""
        with _flock(self.root / _GLOBAL_LOCK):
            if self.limit is not None:
                used = self.usage()
                while self._transient and used > self.limit:
                    key = next(iter(self._transient))
                    used -= _folder_bytes(self._transient[key][0])
                    self._drop_slot(key)
            reservation = self.directory / f"{_RESERVE}{os.getpid()}-{secrets.token_hex(4)}"
            reservation.write_text(str(need))
            return reservation

    def _drop_slot(self, key: str) -> None:
        folder, holds = self._transient.pop(key)
        for held in holds:  # their holders see the hold closed and fetch again
            held.close()
        shutil.rmtree(folder, ignore_errors=True)

    def release(self) -> None:
        """Delete this process's read-through folders: :meth:`release_transient`."""
        self.release_transient()

    def release_transient(self) -> None:
        """Delete this process's read-through folders (also at exit)."""
        if self._transient_pid != os.getpid():
            return
        while self._transient:
            self._drop_slot(next(iter(self._transient)))

    def cached_bytes(self) -> int:
        """Bytes of this split's shard files now in the cache."""
        return sum(p.stat().st_size for p in self.directory.iterdir()
                   if not p.name.startswith(".") and not _is_manifest_name(p.name) and p.is_file())
