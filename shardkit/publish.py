"""Publishing and filesystem durability: temp names, fsync, rename into place, atomic manifest, cleanup.

Every file shardkit publishes is first complete under a temporary name, fsynced, then renamed into
place and its folder fsynced, so a file is either absent, complete under a temp name, or complete
under its final name. The manifest, the commit marker of a split, is written last in the same way;
then the files that no manifest names any more are removed. Everything here is plain ``os``: the
pipeline, the format writers, shard records and the fingerprint cache share it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from .manifest import MANIFEST_NAME, Manifest

#: Marks a temporary name: ``.<final name>.tmp-<host>-<pid>-<random>``; anything hidden carrying it is
#: unfinished work of some run, and :func:`remove_temps` deletes it.
TMP_MARK = ".tmp-"


def fsync_file(path: Path) -> None:
    """Make a file's data durable before a name points at it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write ``data`` (bytes, or pieces of them written in turn) to ``path`` via a temp file in the same
    folder, fsync, rename, fsync the folder."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            for piece in (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data:
                fh.write(piece)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
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


def dump_manifest(manifest: Manifest, directory: Path) -> Path:
    """Write ``directory/manifest.json`` atomically; sorted keys and fixed indent keep it deterministic."""
    path = Path(directory) / MANIFEST_NAME
    text = json.dumps(manifest.to_json(), indent=1, sort_keys=True, allow_nan=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))
    return path


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


def remove_temps(directory: Path) -> None:
    """Delete temporary files left by an earlier, interrupted run."""
    if directory.is_dir():
        for p in directory.iterdir():
            if p.name.startswith(".") and TMP_MARK in p.name:
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
