"""Publishing and filesystem durability: temp names, fsync, rename into place, atomic manifest, cleanup.

Every file shardkit publishes is first complete under a temporary name, fsynced, then renamed into
place and its folder fsynced, so a file is either absent, complete under a temp name, or complete
under its final name. The manifest, the commit marker of a split, is written last in the same way.

Versions: each publish of a split is kept as ``manifest-v<N>.json`` and then copied to ``manifest.json``
(the commit). A reader holds the manifest it opened, so it keeps reading that version's files; those are
removed only once no kept version names them. The newest ``--keep-versions`` versions are kept, plus any
version a live reader on this host holds a *lease* on (``.lease-v<N>-<host>-<pid>-<random>``, a file the
reader makes when it opens a local split, if it may write there, and holds with a shared ``flock`` while it
reads; a lease from another host counts for :data:`LEASE_TTL` seconds after it was taken; the whole rule is
:func:`leased_versions`). Everything here is plain ``os``: the pipeline, the
format writers, shard records and the fingerprint cache share it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import ShardkitError
from ..files.lock import pid_alive
from ..files.splitfiles import TMP_MARK, fsync_file, is_temp_name
from ..support.smallfile import open_regular
from .manifest import (
    MANIFEST_NAME,
    Manifest,
    kept_versions,
    named_files,
    read_manifest_json,
    version_name,
    version_number,
)

log = logging.getLogger(__name__)

#: Reader leases: ``.lease-v<N>-<host>-<pid>-<random>``.
LEASE_PREFIX = ".lease-v"
#: How long a lease from another host protects its version after it was last touched (a week: a
#: reader on another host cannot be asked whether it still runs).
LEASE_TTL = 7 * 24 * 3600.0
#: How far in the future a lease's time may lie (clocks of hosts sharing a folder differ a little).
LEASE_SKEW = 600.0

def atomic_write_bytes(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write ``data`` (bytes, or pieces of them written in turn) to ``path`` via a temp file in the same
    folder, fsync, rename, fsync the folder. The temp name carries :data:`~shardkit.files.splitfiles.TMP_MARK`, so a
    crash leaves a name :func:`remove_temps` recognises."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TMP_MARK}{socket.gethostname()}-{os.getpid()}-",
                               dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            for piece in (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data:
                fh.write(piece)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a full disk: the error names the file it hit
            exc.filename = str(path)
        raise
    fsync_dir(path.parent)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def manifest_text(manifest: Manifest) -> str:
    """The manifest's file content: sorted keys and a fixed indent keep it deterministic."""
    return json.dumps(manifest.to_json(), indent=1, sort_keys=True, allow_nan=False) + "\n"


def dump_manifest(manifest: Manifest, directory: Path) -> Path:
    """Write the manifest atomically: first as its kept version ``manifest-v<N>.json`` (manifest version 3),
    then as ``manifest.json``, the commit."""
    directory = Path(directory)
    data = manifest_text(manifest).encode("utf-8")
    if manifest.version is not None and manifest.manifest_version >= 3:
        atomic_write_bytes(directory / version_name(manifest.version), data)
    path = directory / MANIFEST_NAME
    atomic_write_bytes(path, data)
    return path


def current_manifest(directory: Path) -> dict[str, object] | None:
    """The parsed ``manifest.json`` of a split folder as it stands (None if absent or unreadable)."""
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        data = read_manifest_json(path)
    except ShardkitError:
        return None
    return data if isinstance(data, dict) else None


def published_number(data: dict[str, object] | None) -> int:
    """The publish number of a parsed current manifest: its ``version``; 0 when there is none."""
    number = data.get("version") if data is not None else None
    return number if isinstance(number, int) and not isinstance(number, bool) and number > 0 else 0


def drop_uncommitted(directory: Path) -> None:
    """Remove version files newer than ``manifest.json`` (a run killed between the two writes): the next
    publish takes their number again, so a resumed run equals an uninterrupted one."""
    directory = Path(directory)
    if not directory.is_dir():
        return
    current = published_number(current_manifest(directory))
    for p in directory.iterdir():
        number = version_number(p.name)
        if number is not None and number > current:
            p.unlink(missing_ok=True)


def keep_legacy(directory: Path, data: dict[str, object] | None) -> int:
    """A current manifest without a publish number (written before versions existed): kept as version 1, so
    readers that opened it keep their files; returns the number the next publish follows (1, else 0)."""
    directory = Path(directory)
    if data is None or published_number(data):
        return published_number(data)
    with contextlib.suppress(OSError):
        link_into_place(directory, MANIFEST_NAME, version_name(1))
        return 1
    return 0


# ---------------------------------------------------------------------------------------------- leases
#: Descriptors of the leases this process holds (each with a shared ``flock`` on its lease file), by path.
_HELD: dict[Path, int] = {}


def take_lease(directory: Path, number: int) -> Path | None:
    """Tell publishers that this process reads version ``number`` of the split in ``directory``: an empty
    lease file, held open with a shared ``flock`` (the kernel drops it when the process dies, however it dies)
    and removed by :func:`drop_lease` (a reader that cannot write there gets None: retention only)."""
    path = Path(directory) / f"{LEASE_PREFIX}{number}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        log.debug("no reader lease in %s (%s): the version is kept by --keep-versions only", directory, exc)
        return None
    with contextlib.suppress(OSError):  # a file system without flock: the lease counts by its pid (leased_versions)
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    _HELD[path] = fd
    return path


def drop_lease(path: Path, pid: int) -> None:
    """Remove a lease, only in the process that took it (a forked child's copy of the reader must not)."""
    if os.getpid() == pid:
        Path(path).unlink(missing_ok=True)
        fd = _HELD.pop(Path(path), None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _lease_held(path: Path) -> bool | None:
    """Whether a process holds the lease file's ``flock`` (True), none does (False), or it cannot be told
    (None: no flock here). Opened non-blocking and read-only: nothing is read, and a FIFO cannot hang it."""
    try:
        fd = open_regular(path, "lease")
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # releases the test lock
    return False


def leased_versions(directory: Path, *, now: float | None = None) -> set[int]:
    """Versions a live reader holds a lease on; stale leases on this host are removed. The rule (the lease
    names ``<host>-<pid>``; its file's modification time is when it was taken):

    * only a regular file is a lease: anything else named like one (a folder, FIFO, link) protects nothing and
      is left alone, with a warning;
    * a lease dated more than :data:`LEASE_SKEW` in the future protects nothing (a clock set wrong, or a
      forged file): otherwise it would never expire;
    * this host: a lease whose ``flock`` a process holds (every reader of this version holds it while it reads)
      is live; one nobody holds is live only while it is a reader's of an older shardkit (which took no flock):
      its pid is alive and above 1 (pid 1 is init, always alive) and it is at most :data:`LEASE_TTL` old;
      else it is stale and removed;
    * another host: it counts for :data:`LEASE_TTL` after it was taken (that host cannot be asked).
    """
    host = socket.gethostname()
    now = time.time() if now is None else now
    out: set[int] = set()
    for p in Path(directory).iterdir():
        if not p.name.startswith(LEASE_PREFIX):
            continue
        number, _, rest = p.name[len(LEASE_PREFIX):].partition("-")
        holder, _, tail = rest.rpartition("-")  # "<host>-<pid>", "<random>"
        lease_host, _, pid = holder.rpartition("-")
        if not number.isdigit() or not pid.isdigit() or not tail:
            continue
        try:
            st = p.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            log.warning("%s: named like a reader's lease but not a regular file; it protects no version and is "
                        "left alone (remove it)", p)
            continue
        age = now - st.st_mtime
        if age < -LEASE_SKEW:
            log.warning("%s: a lease dated %.0f s in the future protects no version (check this host's clock; "
                        "remove it)", p, -age)
            continue
        if lease_host == host:
            held = _lease_held(p)
            if held is False and not (int(pid) > 1 and pid_alive(int(pid)) and age <= LEASE_TTL):
                p.unlink(missing_ok=True)
                continue
            if held is None and not (int(pid) > 1 and pid_alive(int(pid))):
                p.unlink(missing_ok=True)
                continue
        elif age > LEASE_TTL:
            continue
        out.add(int(number))
    return out


def versions_to_keep(numbers: Iterable[int], keep: int, leased: Iterable[int] = ()) -> set[int]:
    """The newest ``keep`` of the publish ``numbers`` and every leased one that exists."""
    ordered = sorted(set(numbers))
    return set(ordered[-max(keep, 1):]) | (set(leased) & set(ordered))


def kept_version_names(kept: Iterable[int], load: Callable[[int], object]) -> set[str]:
    """Every file name the ``kept`` versions name, each parsed by ``load`` (local file or object); a version that
    cannot be parsed names nothing (what only it names is not kept). Shared by local and object-storage clean-up."""
    names: set[str] = set()
    for number in sorted(kept):
        try:
            names |= named_files(load(number))
        except ShardkitError:
            continue
    return names


def reclaim(directory: Path, keep: int, current: set[str], owned: Callable[[str], bool],
            bookkeeping: Callable[[Path, set[str]], set[str]] | None = None) -> list[int]:
    """Retire old versions of a split: remove the version files beyond :func:`versions_to_keep`, then every
    file shardkit ``owned`` that neither ``current`` (this publish's files and records) nor a kept version
    names, nor ``bookkeeping`` keeps for the files that stay (shard records: a later run that goes back to a
    kept version's content reuses its files instead of rewriting them). Returns the kept version numbers."""
    directory = Path(directory)
    numbers = kept_versions(p.name for p in directory.iterdir())
    kept = versions_to_keep(numbers, keep, leased_versions(directory))
    for number in numbers:
        if number not in kept:
            (directory / version_name(number)).unlink(missing_ok=True)
    names = set(current) | kept_version_names(kept, lambda n: read_manifest_json(directory / version_name(n)))
    if bookkeeping is not None:
        names |= bookkeeping(directory, names)
    collect_garbage(directory, names, owned)
    return sorted(kept)


def rename_into_place(directory: Path, names: Iterable[tuple[str, str]], *, synced: bool = False) -> None:
    """Rename each ``(temporary, final)`` file name in ``directory``, data first made durable, then the folder.

    ``synced`` says the writer already fsynced the temporary files (e.g. a Dask worker on another host).
    """
    renamed = False
    for tmp_name, final_name in names:
        if not synced:  # data durable before its name points at it
            fsync_file(directory / tmp_name)
        os.replace(directory / tmp_name, directory / final_name)
        renamed = True
    if renamed:
        fsync_dir(directory)


def link_into_place(directory: Path, name: str, final_name: str) -> None:
    """Give the file ``name`` a second name ``final_name`` (a hard link, else a copy), via a temporary name."""
    tmp = directory / f".{final_name}{TMP_MARK}link-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    try:
        os.link(directory / name, tmp)
    except OSError:
        shutil.copyfile(directory / name, tmp)
    os.replace(tmp, directory / final_name)


def remove_temps(directory: Path, is_temp: Callable[[str], bool] = is_temp_name) -> None:
    """Delete temporary files left by an earlier, interrupted run: those whose name ``is_temp`` (a split folder
    passes :func:`shardkit.store.splitdir.is_split_temp`, which also knows older runs' temp names)."""
    if directory.is_dir():
        for p in directory.iterdir():
            if is_temp(p.name):
                p.unlink(missing_ok=True)


def collect_garbage(directory: Path, keep: set[str], owned: Callable[[str], bool]) -> None:
    """Delete the regular files of ``directory`` that shardkit ``owned`` but the new manifest does not ``keep``."""
    keep = keep | {MANIFEST_NAME}
    for p in directory.iterdir():
        if p.name in keep or not p.is_file():
            continue
        if owned(p.name):
            p.unlink(missing_ok=True)
    fsync_dir(directory)
