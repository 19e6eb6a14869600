"""Reading the small text files a user names (class tables, palettes, list files, TOML configs) safely.

Only regular files are read, and only up to :data:`MAX_TEXT_BYTES`: a path that is ``/dev/zero``, a FIFO,
a folder or a multi-gigabyte file is refused before a byte is read, never read until memory runs out.
"""

from __future__ import annotations

import errno
import hashlib
import stat
from pathlib import Path

#: Largest text file read whole (a list file of a few million samples still fits).
MAX_TEXT_BYTES = 256 << 20


def read_small_file(path: str | Path, what: str = "file") -> bytes:
    """The bytes of ``path``; OSError (with a readable ``strerror``) unless it is a regular file of at most
    :data:`MAX_TEXT_BYTES`. FileNotFoundError passes through unchanged for the caller's own message."""
    st = Path(path).stat()  # follows symlinks; FileNotFoundError / PermissionError / ELOOP as they are
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, f"{what} is not a regular file", str(path))
    if st.st_size > MAX_TEXT_BYTES:
        raise OSError(errno.EFBIG, f"{what} is {st.st_size} bytes, more than the {MAX_TEXT_BYTES} allowed",
                      str(path))
    with open(path, "rb") as fh:
        data = fh.read(MAX_TEXT_BYTES + 1)
    if len(data) > MAX_TEXT_BYTES:  # grew since the stat
        raise OSError(errno.EFBIG, f"{what} is more than the {MAX_TEXT_BYTES} bytes allowed", str(path))
    return data


def read_small_text(path: str | Path, what: str = "file", *, errors: str = "strict") -> str:
    """:func:`read_small_file` decoded as UTF-8 (a leading BOM dropped)."""
    return read_small_file(path, what).decode("utf-8-sig", errors)


def sha256_of(path: str | Path) -> str:
    """sha256 (hex) of a whole file, read 1 MiB at a time (memory stays bounded whatever its size); standard
    library only, so the start-up paths that must not load numpy can use it."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()
