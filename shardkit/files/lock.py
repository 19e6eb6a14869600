"""One conversion per output folder at a time, with a lock that a crash cannot leave stuck.

Local output: an ``flock`` on ``<output>/.shardkit.lock``: the kernel releases it when the
holder dies, however it dies, so a stale lock never blocks the next run. The file also
names the holder (host, pid) for the error message.

Object storage has no flock. There :class:`RemoteLock` stands in: a lock *object* created with a
conditional put (``If-None-Match: *`` on S3: of two runs, exactly one creates it), refreshed by a
heartbeat every ``ttl / 4`` seconds, and taken over by a later run when its holder is gone — dead
on this host (its pid no longer exists), or silent for ``ttl`` seconds (a crashed machine). The
takeover and the heartbeat are conditional on the lock's ETag (``If-Match``), so two runs cannot
both take over one stale lock. What it cannot promise (docs/object-storage.md): a holder that is
paused (not dead) for longer than ``ttl`` loses the lock without knowing until its next heartbeat
or the check before its manifest upload; expiry compares this machine's clock with the store's
``LastModified`` (clock skew shortens or lengthens ``ttl``); and on stores without conditional
writes (fsspec's generic "create" mode checks, then writes) two runs starting in the same instant
may both get it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import socket
import stat
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..errors import OutputError
from ..support.smallfile import loads_bounded

if TYPE_CHECKING:
    from .storage import Remote

log = logging.getLogger(__name__)
LOCK_NAME = ".shardkit.lock"
#: Seconds without a heartbeat after which a remote lock counts as stale (SHARDKIT_LOCK_TTL overrides).
LOCK_TTL = 300.0


class OutputLock:
    """``with OutputLock(out):`` — raises OutputError at once if another run holds it."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a parent that is a file, no permission, read-only file system, …
            raise OutputError(f"cannot create the output folder ({exc.strerror or exc})", path=self.path.parent,
                              fix="check the path (every parent must be a folder) and its permissions") from None
        try:  # never through a link, never blocking on a FIFO; and only a regular file is the lock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError(errno.EINVAL, "not a regular file")
            os.set_blocking(fd, True)
        except OSError as exc:
            if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
                raise OutputError("the output lock is not a regular file (a folder, FIFO or link)", path=self.path,
                                  fix=f"remove {self.path} (shardkit keeps its lock file there)") from None
            raise OutputError(f"cannot create the output lock ({exc.strerror or exc})", path=self.path,
                              fix="check the output folder's permissions (convert writes there)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 4096).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise OutputError(
                f"another shardkit convert is writing here ({holder})",
                path=self.path.parent,
                fix="wait for it to finish, or write to another output folder",
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode())
        self._fd = fd
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists on this host (it may belong to another user). A number no process can
    have (0 and below would signal process groups; past 2^31 ``os.kill`` overflows) is no live process."""
    if not 0 < pid < 2**31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _age(info: dict[str, Any]) -> float | None:
    """Seconds since the object was last written, from the store's LastModified (None if unknown)."""
    stamp = info.get("LastModified") or info.get("mtime") or info.get("last_modified")
    if isinstance(stamp, (int, float)):
        return time.time() - float(stamp)
    if isinstance(stamp, datetime):
        return (datetime.now(timezone.utc) - stamp.astimezone(timezone.utc)).total_seconds()
    if isinstance(stamp, str):
        with contextlib.suppress(ValueError):
            return (datetime.now(timezone.utc) - datetime.fromisoformat(stamp).astimezone(timezone.utc)).total_seconds()
    return None


#: Longest ttl a lock object may claim (a day): a lock saying more (or inf, or text) expires after our own ttl.
MAX_LOCK_TTL = 86400.0


def _lock_ttl(claimed: Any, default: float) -> float:
    """The ttl a lock object states, when it is a number in (0, MAX_LOCK_TTL]; else ``default``."""
    if isinstance(claimed, (int, float)) and not isinstance(claimed, bool) and 0 < claimed <= MAX_LOCK_TTL:
        return float(claimed)
    return default


class RemoteLock:
    """``with RemoteLock(remote):`` — one convert per object-storage output; raises OutputError if held.

    See the module docstring for the protocol and what it cannot promise. :meth:`check` raises if the
    heartbeat found the lock taken over; the pipeline calls it before each manifest upload.
    """

    def __init__(self, remote: Remote, ttl: float | None = None) -> None:
        self.remote = remote
        self.ttl = float(ttl if ttl is not None else os.environ.get("SHARDKIT_LOCK_TTL", LOCK_TTL))
        self.token = secrets.token_hex(8)
        self._etag: str | None = None
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": self.token,
                           "ttl": self.ttl, "written": time.time()}).encode()

    def _conditional(self) -> bool:
        return self.remote.protocol in ("s3", "s3a")

    def _put(self, **kwargs: Any) -> None:
        out = self.remote.fs.pipe_file(self.remote.path(LOCK_NAME), self._body(), **kwargs)
        etag = out.get("ETag") if isinstance(out, dict) else None
        if etag is None:
            info = self.remote.info(LOCK_NAME) or {}
            etag = info.get("ETag") or info.get("etag")
        self._etag = etag

    def _holder(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(lock body, object info) of the current lock, None if there is none."""
        info = self.remote.info(LOCK_NAME)
        if info is None:
            return None
        try:
            body = loads_bounded(self.remote.read_bytes(LOCK_NAME, limit=65536), "lock object")
        except (ValueError, OSError):
            body = {}
        return (body if isinstance(body, dict) else {}), info

    def _stale(self, body: dict[str, Any], info: dict[str, Any]) -> str | None:
        """Why the lock's holder is gone, or None while it may be alive.

        A holder on this host whose pid is dead is gone at once. Otherwise the heartbeat decides, on this host
        too: a live pid may be another process that reused the number after the holder was killed, so a lock
        silent for longer than its ttl is stale whoever holds the pid now.
        """
        pid = body.get("pid")
        same_host = body.get("host") == socket.gethostname()
        if same_host and isinstance(pid, int) and not isinstance(pid, bool) and not pid_alive(pid):
            return f"its holder (pid {pid} on this host) is dead"
        age = _age(info)
        ttl = _lock_ttl(body.get("ttl"), self.ttl)
        if age is not None and age > ttl:
            return f"no heartbeat for {age:.0f} s (more than {ttl:.0f} s)"
        return None

    def __enter__(self) -> RemoteLock:
        try:
            self._put(mode="create")
        except FileExistsError:
            self._take_over()
        except Exception as exc:  # botocore/aiohttp errors are not OSErrors: one line whatever they are
            from .storage import storage_error

            raise storage_error(exc, "creating the lock object", self.remote.url_of(LOCK_NAME)) from None
        self._thread = threading.Thread(target=self._heartbeat, name="shardkit-lock", daemon=True)
        self._thread.start()
        return self

    def _take_over(self) -> None:
        held = self._holder()
        if held is None:  # released in between: try once more
            try:
                self._put(mode="create")
                return
            except FileExistsError:
                held = self._holder() or ({}, {})
        body, info = held
        reason = self._stale(body, info)
        holder = f"host {body.get('host', '?')}, pid {body.get('pid', '?')}"
        if reason is None:
            raise OutputError(f"another shardkit convert is writing here ({holder})", path=self.remote.url,
                              fix="wait for it to finish, or write to another output folder; a lock whose "
                                  f"holder crashed expires after {self.ttl:.0f} s without heartbeat")
        etag = info.get("ETag") or info.get("etag")
        try:
            if self._conditional() and etag:
                self._put(IfMatch=etag)
            else:
                self._put()
        except OSError as exc:
            if not isinstance(exc, (ConnectionError, TimeoutError)) and exc.errno in (errno.EINVAL, None):
                raise OutputError(f"another shardkit convert took over the stale lock first ({holder})",
                                  path=self.remote.url, fix="wait for it to finish, or write elsewhere") from None
            from .storage import storage_error

            raise storage_error(exc, "taking over the lock object", self.remote.url_of(LOCK_NAME)) from None
        except Exception as exc:  # botocore/aiohttp errors are not OSErrors
            from .storage import storage_error

            raise storage_error(exc, "taking over the lock object", self.remote.url_of(LOCK_NAME)) from None
        log.warning("%s: took over a stale lock (%s; %s)", self.remote.url, holder, reason)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                if self._conditional() and self._etag:
                    self._put(IfMatch=self._etag)
                else:
                    held = self._holder()
                    if held is None or held[0].get("token") != self.token:
                        raise OSError("lock object replaced")
                    self._put()
            except Exception as exc:  # the lock was taken over (precondition failed) or the store is gone
                log.error("%s: lost the output lock (%s)", self.remote.url, exc)
                self._lost.set()
                return

    def check(self) -> None:
        """Raise OutputError if another run took the lock over (before committing anything)."""
        if self._lost.is_set():
            raise OutputError("the output lock was lost (another run took it over after a long pause)",
                              path=self.remote.url, fix="check no other convert is writing here, then re-run")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._lost.is_set():
            return
        with contextlib.suppress(Exception):  # a lock left behind expires; never mask the run's own error
            held = self._holder()
            if held is not None and held[0].get("token") == self.token:
                self.remote.delete([LOCK_NAME])
