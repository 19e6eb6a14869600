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
  the process has moved on by :func:`read_through_slots` shards (default 4, ``$SHARDKIT_READ_THROUGH``).
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
import json
import logging
import os
import secrets
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..config import parse_bytes
from ..errors import ConfigError, IntegrityError
from ..formats.base import SampleSpec, ShardFormat, ShardReader, sha256_file
from ..lock import pid_alive
from ..manifest import MANIFEST_NAME, Manifest, ShardInfo, member_path
from ..publish import atomic_write_bytes
from ..storage import Remote

log = logging.getLogger(__name__)

#: Read-through shards a process keeps at once unless ``$SHARDKIT_READ_THROUGH`` says otherwise.
READ_THROUGH_SLOTS = 4
_RESERVE = ".reserve-"
_TRANSIENT = ".transient-"
_GLOBAL_LOCK = ".cache.lock"


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


class ShardCache:
    """The local cache of one split on object storage. Picklable: a worker process gets its own transient slots.

    ``directory`` holds ``manifest.json`` and the admitted shard files under their manifest names.
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
        self._transient: OrderedDict[int, tuple[Path, Any]] = OrderedDict()
        self._transient_pid = os.getpid()
        self._refresh_manifest()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_transient"] = OrderedDict()
        state["_transient_pid"] = None
        state["downloads"] = 0
        return state

    # ------------------------------------------------------------------ manifest
    def _refresh_manifest(self) -> None:
        """Fetch the manifest (always: it is the commit marker), and drop cached files it no longer names."""
        data = self.remote.read_bytes(MANIFEST_NAME)
        path = self.directory / MANIFEST_NAME
        with _flock(self.directory / ".manifest.lock"):
            try:
                same = path.read_bytes() == data
            except OSError:
                same = False
            if same:
                return
            atomic_write_bytes(path, data)
            try:
                names = {f["name"] for s in json.loads(data)["shards"] for f in s["files"] + [s.get("samples", {})]
                         if "name" in f}
            except (ValueError, KeyError, TypeError):
                return  # load_manifest reports it
            for p in self.directory.iterdir():
                if not p.name.startswith(".") and p.name != MANIFEST_NAME and p.name not in names and p.is_file():
                    p.unlink(missing_ok=True)
        self._remove_dead_leftovers()

    def _remove_dead_leftovers(self) -> None:
        """Reservations and read-through folders of processes that died."""
        for p in self.directory.iterdir():
            for prefix in (_RESERVE, _TRANSIENT):
                if p.name.startswith(prefix):
                    pid = p.name[len(prefix):].split("-", 1)[0]
                    if pid.isdigit() and not pid_alive(int(pid)):
                        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ space
    def usage(self) -> int:
        """Bytes held in ``root``: finished files of every cached split plus reservations of downloads in flight."""
        total = 0
        for folder in self.root.iterdir() if self.root.is_dir() else ():
            if not folder.is_dir():
                continue
            for p in folder.iterdir():
                try:
                    if p.name.startswith(_RESERVE):
                        pid = p.name[len(_RESERVE):].split("-", 1)[0]
                        if pid.isdigit() and pid_alive(int(pid)):  # a dead downloader's reservation is void
                            total += int(p.read_text() or 0)
                    elif not p.name.startswith(".") and p.is_file():
                        total += p.stat().st_size
                except (OSError, ValueError):
                    continue
        return total

    def _evict(self, need: int) -> int:
        """Delete least recently used files of *other* splits until ``need`` bytes are freed; bytes freed."""
        candidates = []
        for folder in self.root.iterdir():
            if not folder.is_dir() or folder == self.directory:
                continue
            for p in folder.iterdir():
                if not p.name.startswith(".") and p.name != MANIFEST_NAME and p.is_file():
                    with contextlib.suppress(OSError):
                        st = p.stat()
                        candidates.append((st.st_mtime, st.st_size, p))
        freed = 0
        for _, size, p in sorted(candidates, key=lambda c: c[0]):
            if freed >= need:
                break
            p.unlink(missing_ok=True)
            freed += size
            log.debug("cache: evicted %s (%d bytes)", p, size)
        return freed

    def _admit(self, need: int) -> Path | None:
        """Reserve ``need`` bytes in the cache (a reservation file; None when they do not fit even after eviction)."""
        with _flock(self.root / _GLOBAL_LOCK):
            if self.limit is not None:
                used = self.usage()
                if used + need > self.limit:
                    used -= self._evict(used + need - self.limit)
                if used + need > self.limit:
                    return None
            reservation = self.directory / f"{_RESERVE}{os.getpid()}-{secrets.token_hex(4)}"
            reservation.write_text(str(need))
            return reservation

    # ------------------------------------------------------------------ shards
    def _present(self, shard: ShardInfo, directory: Path) -> bool:
        for f in shard.all_files:
            try:
                if (directory / f.name).stat().st_size != f.bytes:
                    return False
            except OSError:
                return False
        return True

    def _download(self, shard: ShardInfo, directory: Path) -> None:
        """Download the shard's files into ``directory``, each verified by sha256 before it gets its name."""
        for f in shard.all_files:
            final = member_path(f.name, directory)
            part = directory / f".{f.name}.part-{os.getpid()}-{secrets.token_hex(4)}"
            try:
                self.remote.download(f.name, part)
                digest = sha256_file(part)
                if digest != f.sha256 or part.stat().st_size != f.bytes:
                    raise IntegrityError(
                        f"downloaded {part.stat().st_size} bytes with sha256 {digest[:12]}…, the manifest says "
                        f"{f.bytes} bytes, {f.sha256[:12]}…", path=self.remote.url_of(f.name),
                        fix="the object was changed or damaged after conversion; re-convert this split")
                os.replace(part, final)
            finally:
                part.unlink(missing_ok=True)
        self.downloads += 1

    def fetch(self, shard: ShardInfo, owner: Any = None) -> Path:
        """The folder holding ``shard``'s verified files: the cache folder, or (when the shard does not fit
        under the limit) a private read-through folder released when ``owner.release()`` is called."""
        if self._present(shard, self.directory):
            self._touch(shard)
            return self.directory
        with _flock(self.directory / f".lock-{shard.files[0].name}"):
            if self._present(shard, self.directory):  # another process downloaded it while we waited
                self._touch(shard)
                return self.directory
            need = sum(f.bytes for f in shard.all_files)
            reservation = self._admit(need)
            if reservation is not None:
                try:
                    self._download(shard, self.directory)
                finally:
                    reservation.unlink(missing_ok=True)
                log.debug("cache: shard %d cached (%d bytes)", shard.index, need)
                return self.directory
        return self._read_through(shard, owner)

    def _touch(self, shard: ShardInfo) -> None:
        """Mark the shard recently used (mtime), for the LRU order other splits evict in."""
        with contextlib.suppress(OSError):
            os.utime(self.directory / shard.files[0].name)

    def _read_through(self, shard: ShardInfo, owner: Any) -> Path:
        if self._transient_pid != os.getpid():  # a forked child: the parent's read-through folders are not ours
            self._transient, self._transient_pid = OrderedDict(), os.getpid()
        if not self._transient:
            atexit.register(self.release_transient)
        folder = Path(tempfile.mkdtemp(prefix=f"{_TRANSIENT}{os.getpid()}-", dir=self.directory))
        try:
            self._download(shard, folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        log.debug("cache: shard %d read through (does not fit under the limit)", shard.index)
        self._transient[id(owner)] = (folder, owner)
        while len(self._transient) > read_through_slots():
            _, (old, old_owner) = self._transient.popitem(last=False)
            if old_owner is not None:
                old_owner.release()
            shutil.rmtree(old, ignore_errors=True)
        return folder

    def release_transient(self) -> None:
        """Delete this process's read-through folders (also at exit)."""
        if self._transient_pid != os.getpid():
            return
        while self._transient:
            _, (old, owner) = self._transient.popitem(last=False)
            if owner is not None:
                owner.release()
            shutil.rmtree(old, ignore_errors=True)

    def cached_bytes(self) -> int:
        """Bytes of this split's shard files now in the cache."""
        return sum(p.stat().st_size for p in self.directory.iterdir()
                   if not p.name.startswith(".") and p.name != MANIFEST_NAME and p.is_file())


class CachedShardReader(ShardReader):
    """A shard of a split on object storage: fetched through the :class:`ShardCache` on first read, then
    served by the format's own reader on the local copy. Nothing is fetched before a sample is read."""

    def __init__(self, cache: ShardCache, fmt: type[ShardFormat], shard: ShardInfo, spec: SampleSpec,
                 manifest: Manifest) -> None:
        self.cache = cache
        self.fmt = fmt
        self.manifest = manifest
        self.directory = cache.directory
        self.shard = shard
        self.spec = spec
        self.format_options = manifest.format_options
        self.format_version = manifest.format_version
        self.expected_hw = None
        self._pid: int | None = None
        self._inner: ShardReader | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pid"] = None
        state["_inner"] = None
        return state

    def inner(self) -> ShardReader:
        """The format reader on the local copy (fetching the shard first, once per process)."""
        pid = os.getpid()
        if self._inner is None or self._pid != pid:
            folder = self.cache.fetch(self.shard, self)
            reader = self.fmt.open_shard(folder, self.shard, self.spec, self.manifest)
            reader.ensure_open()  # a read-through folder may be deleted later: hold its files open now
            reader.expected_hw  # noqa: B018 - and read the sizes from its sidecar now (variable-size splits)
            self._inner, self._pid = reader, pid
        return self._inner

    @property
    def local_directory(self) -> Path:
        return self.inner().directory

    def release(self) -> None:
        """Forget the local copy (a read-through shard whose folder is being deleted)."""
        self._inner = None

    def check_files(self) -> None:
        self.inner()

    def path(self, name: str) -> Path:
        return member_path(name, self._inner.directory if self._inner is not None else self.directory)

    def verify_hashes(self) -> None:
        self.inner().verify_hashes()

    def ensure_open(self) -> None:
        self.inner()

    def _open(self) -> None:
        self.inner()

    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.inner().read(i)

    def prefetch(self, local_indices: Sequence[int] | np.ndarray, cold: bool = True) -> None:
        self.inner().prefetch(local_indices, cold)

    def read_batch_into(self, local_indices: Sequence[int] | np.ndarray, out_images: np.ndarray,
                        out_labels: np.ndarray) -> None:
        self.inner().read_batch_into(local_indices, out_images, out_labels)

    def shape_of(self, i: int) -> tuple[int, int]:
        return self.inner().shape_of(i)
