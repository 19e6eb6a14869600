"""One conversion per output folder at a time, with a lock that a crash cannot leave stuck.

The lock is an ``flock`` on ``<output>/.shardkit.lock``: the kernel releases it when the
holder dies, however it dies, so a stale lock never blocks the next run. The file also
names the holder (host, pid) for the error message.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path
from types import TracebackType

from .errors import OutputError

LOCK_NAME = ".shardkit.lock"


class OutputLock:
    """``with OutputLock(out):`` — raises OutputError at once if another run holds it."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a parent that is a file, no permission, read-only file system, …
            raise OutputError(f"cannot create the output folder ({exc.strerror or exc})", path=self.path.parent,
                              fix="check the path (every parent must be a folder) and its permissions") from None
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
