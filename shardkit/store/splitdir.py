"""A split folder, owned in one place: every name in it, what shardkit owns there, what a publish keeps, and
the sinks that publish, commit and clean it up — on a local disk or in a bucket — behind one interface.

A split folder holds, besides ``manifest.json`` and its kept versions ``manifest-v<N>.json``, shard files (named
by their format), samples sidecars, shard records ``.shard-<key>.json``, the fingerprint cache, the run lock,
readers' leases and temporary names ``.<name>.tmp-…`` (an older shardkit's also ``.<name>.<8 characters>.tmp``);
anything else (a user's notes, another tool's files) is never deleted. The name rules live where each file is
written (:mod:`shardkit.store.manifest`, :mod:`shardkit.store.records`, :mod:`shardkit.files.samples`,
:mod:`shardkit.conversion.fingerprint`,
:mod:`shardkit.files.lock`, :mod:`shardkit.store.publish`, the formats); this module is the one that puts them together
and
decides.

:class:`SplitSink` is what the pipeline sees of an output: :class:`LocalSink` for a folder on disk,
:class:`RemoteSink` for one on object storage, which is written in a local staging folder first and uploaded
shard by shard (see :mod:`shardkit.conversion.staging`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import OutputError
from ..files.lock import LOCK_NAME, RemoteLock
from ..files.samples import is_sidecar_name
from ..files.splitfiles import TMP_MARK, ShardFile, ShardInfo, is_temp_name, mkstemp_temp_target
from ..files.storage import Remote
from ..formats.registry import all_formats
from ..support.smallfile import read_guarded
from .manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    Manifest,
    kept_versions,
    parse_manifest_bytes,
    version_name,
    version_number,
)
from .publish import (
    LEASE_PREFIX,
    current_manifest,
    drop_uncommitted,
    dump_manifest,
    keep_legacy,
    kept_version_names,
    manifest_text,
    published_number,
    reclaim,
    remove_temps,
    rename_into_place,
    versions_to_keep,
)
from .records import RECORD_PREFIX, ShardRecord, is_record_name, records_within, reuse
from .source import TempFiles

log = logging.getLogger(__name__)

#: The split's source fingerprint cache (:mod:`shardkit.conversion.fingerprint` reads and writes it).
CACHE_NAME = ".fingerprints.json"

__all__ = [
    "CACHE_NAME",
    "LEASE_PREFIX",
    "LOCK_NAME",
    "MANIFEST_NAME",
    "RECORD_PREFIX",
    "TMP_MARK",
    "LocalSink",
    "RemoteSink",
    "SplitSink",
    "has_records",
    "is_shard_name",
    "is_split_temp",
    "is_temp_name",
    "keep_set",
    "owned",
    "publish_shard",
    "version_name",
    "version_number",
]


# ------------------------------------------------------------------------------------------------- names
def name_kind(name: str) -> str | None:
    """What a file name in a split folder is: ``manifest``, ``version`` (a kept ``manifest-v<N>.json``),
    ``cache``, ``lock``, ``lease``, ``temp``, ``record``, ``sidecar`` or ``shard``; None for a name shardkit
    never writes (a user's notes, another tool's files)."""
    if name == MANIFEST_NAME:
        return "manifest"
    if version_number(name) is not None:
        return "version"
    if name == CACHE_NAME:
        return "cache"
    if name == LOCK_NAME:
        return "lock"
    if name.startswith(LEASE_PREFIX):
        return "lease"
    if is_split_temp(name):
        return "temp"
    if is_record_name(name):
        return "record"
    if is_sidecar_name(name):
        return "sidecar"
    return "shard" if is_shard_name(name) else None


#: The kinds of file :func:`~shardkit.store.publish.atomic_write_bytes` writes into a split folder.
_WRITTEN_WHOLE = frozenset({"manifest", "version", "cache", "record", "sidecar"})


def is_split_temp(name: str) -> bool:
    """A temporary name in a split folder: one carrying :data:`TMP_MARK`, or an older shardkit's
    ``.<final name>.<8 random characters>.tmp`` of a file it writes whole (the manifest, a kept version, the
    fingerprint cache, a shard record, a samples sidecar). A user's file is never one."""
    if is_temp_name(name):
        return True
    target = mkstemp_temp_target(name)
    return target is not None and name_kind(target) in _WRITTEN_WHOLE


def owned(name: str) -> bool:
    """A file name shardkit writes into a split folder and may delete: a shard record, a shard file or a samples
    sidecar (version files, temp names and leases have their own clean-up)."""
    return is_record_name(name) or is_shard_name(name) or is_sidecar_name(name)


def is_shard_name(name: str) -> bool:
    """A final shard file name of any format (a split folder may hold an earlier run's other format)."""
    return any(fmt.owns(name) for fmt in all_formats())


def has_records(directory: Path) -> bool:
    """Whether ``directory`` holds any shard record: without one, no shard of it can be reused."""
    return any(is_record_name(p.name) for p in directory.iterdir())


def keep_set(records: Iterable[ShardRecord]) -> set[str]:
    """The names a publish of ``records`` keeps: their files and records, the manifest and the fingerprint cache
    (kept versions add theirs: :func:`~shardkit.store.publish.reclaim`)."""
    records = list(records)
    return ({f.name for r in records for f in r.files} | {ShardRecord.name(r.key) for r in records}
            | {MANIFEST_NAME, CACHE_NAME})


def _body(data: dict[str, Any]) -> dict[str, Any]:
    """A parsed manifest without its publish number: what tells whether a publish changed anything."""
    return {k: v for k, v in data.items() if k != "version"}


def publish_shard(directory: Path, renames: Sequence[tuple[str, str]], record: ShardRecord, *,
                  synced: bool = False) -> ShardRecord:
    """Rename one finished shard's ``(temporary, final)`` files into place, then record it (crash-safe order);
    returns the record with its files' stats. The same for every sink: shards are always renamed locally first."""
    rename_into_place(directory, renames, synced=synced)
    if record.files:
        record = record.with_stats(directory)  # after the rename, which may change ctime
        record.save(directory)
    return record


# ------------------------------------------------------------------------------------------------- sinks
class SplitSink:
    """Where a conversion's split folders go. The pipeline calls, per split: :meth:`open`; :meth:`reuse` per
    planned shard; :meth:`shard_published` per written one (after :func:`publish_shard`); :meth:`commit` (the
    manifest, then local clean-up); :meth:`committed` once the fingerprint cache is saved; :meth:`location`.

    The local steps are shared: every sink writes its shards, records and manifest into a local folder first
    (the output itself, or a staging folder); a subclass adds what moves them elsewhere."""

    lock: RemoteLock | None = None

    def open(self, directory: Path) -> None:
        """Make the split folder ready: created, temp files of an interrupted run removed, version files newer
        than its manifest (a run killed before its commit) dropped."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create the output folder ({exc.strerror})", path=directory,
                              fix="check the path and its permissions") from None
        remove_temps(directory, is_split_temp)
        drop_uncommitted(directory)

    def reuse(self, directory: Path, key: str, wanted_names: tuple[str, ...], *,
              rehash: bool = False) -> ShardRecord | None:
        """The record of shard ``key`` if its files can be reused under ``wanted_names``, else None."""
        raise NotImplementedError

    def shard_published(self, directory: Path, record: ShardRecord) -> None:
        """A shard is in place in the local folder (object storage: upload it)."""

    def commit(self, directory: Path, manifest: Manifest, records: Sequence[ShardRecord],
               keep_versions: int) -> tuple[Path, int, bool]:
        """Publish ``manifest`` as the split's next version (the commit marker; nothing when nothing but the publish
        number would change), then remove what no kept version names; returns the manifest's path, the split's
        current version number and whether this commit published it (False: unchanged, no new version)."""
        split = manifest.split
        current = current_manifest(directory)
        if current is not None and _body(current) == _body(json.loads(manifest_text(manifest))):
            path = directory / MANIFEST_NAME  # nothing changed: no new version
            number, new = published_number(current), False
            log.info("%s: unchanged, still version %d", split, number)
        else:
            number, new = keep_legacy(directory, current) + 1, True
            manifest = replace(manifest, version=number)
            path = dump_manifest(manifest, directory)
            log.info("%s: published version %d", split, manifest.version,
                     extra={"event": "published", "split": split, "version": manifest.version})
        kept = reclaim(directory, keep_versions, keep_set(records), owned, records_within)
        log.info("%s: versions kept: %s", split, ", ".join(map(str, kept)) or "none")
        return path, number, new

    def committed(self, directory: Path, records: Sequence[ShardRecord], keep_versions: int) -> None:
        """The split is committed locally and its fingerprint cache saved (object storage: upload and clean up)."""

    def location(self, split: str, local_manifest: Path) -> Path | str:
        """Where the split's manifest now is, to report: the local path, or its URL on object storage."""
        return local_manifest

    @contextlib.contextmanager
    def sidecar_folder(self, directory: Path, shard: ShardInfo) -> Iterator[Path]:
        """A local folder holding the samples sidecar of a reused ``shard`` of the split in ``directory``."""
        yield directory


class LocalSink(SplitSink):
    """A split folder on a local (or shared) file system: written in place."""

    def reuse(self, directory: Path, key: str, wanted_names: tuple[str, ...], *,
              rehash: bool = False) -> ShardRecord | None:
        """See :func:`shardkit.store.records.reuse`: stats compared, files hashed where they changed (or ``rehash``)."""
        return reuse(directory, key, wanted_names, rehash=rehash)


class RemoteSink(SplitSink):
    """A split folder on object storage, fed from the local staging folder (parent process only).

    Each finished shard is uploaded (files first, then its record) and its local files deleted, so local disk
    holds only the shards in flight. After every shard of a split is up, the fingerprint cache, the new version's
    ``manifest-v<N>.json`` and then ``manifest.json`` — the commit marker — are uploaded last, and only then are
    objects that no kept version names deleted (``--keep-versions``; object storage has no reader leases,
    retention alone protects readers). A killed run leaves uploaded shards and records: the next run downloads
    the records, checks the objects' sizes, and reuses them."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote
        self.listings: dict[str, dict[str, int]] = {}
        self.lock = None

    def open(self, directory: Path) -> None:
        """The local steps, then: list the remote split folder; fetch its shard records, fingerprint cache and
        current manifest into ``directory``; delete version files newer than that manifest (a run killed before its
        commit)."""
        super().open(directory)
        split = directory.name
        listing = self.remote.listing(split)
        self.listings[split] = {name: int(info.get("size") or 0) for name, info in listing.items()}
        wanted = [(f"{split}/{n}", directory / n) for n in listing
                  if "/" not in n and (is_record_name(n) or n in (CACHE_NAME, MANIFEST_NAME))]
        self.remote.download_many(wanted)
        current = published_number(current_manifest(directory))
        orphans = [f"{split}/{n}" for n in listing if (version_number(n) or 0) > current]
        self.remote.delete(orphans)
        # the kept versions too: their shards' records stay (a run back to their content reuses the objects)
        self.remote.download_many([(f"{split}/{n}", directory / n) for n in listing
                                   if 0 < (version_number(n) or 0) <= current])

    def reuse(self, directory: Path, key: str, wanted_names: tuple[str, ...], *,
              rehash: bool = False) -> ShardRecord | None:
        """The record of shard ``key`` if every file it names is on the store with its recorded size.

        Content is not re-hashed (that would download every shard; ``rehash`` does not apply): an object store
        writes an object whole or not at all, names hold the shard's content key, and a file's record is uploaded
        only after the file. ``shardkit verify URL`` re-checks every sha256. A shard whose position moved is copied
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

    def committed(self, directory: Path, records: Sequence[ShardRecord], keep_versions: int) -> None:
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
        listing = self.remote.listing(split)
        numbers = kept_versions(listing)
        kept = versions_to_keep(numbers, keep_versions)
        stale = [f"{split}/{version_name(n)}" for n in numbers if n not in kept]
        texts = {n: self._version_bytes(directory, n) for n in sorted(kept)}
        keep = keep_set(records) | {version_name(n) for n in kept}
        keep |= kept_version_names(kept, lambda n: parse_manifest_bytes(
            texts[n], self.remote.url_of(f"{split}/{version_name(n)}")))
        keep |= records_within(directory, keep)  # the records fetched by open
        stale += [f"{split}/{n}" for n in listing if "/" not in n and n not in keep and owned(n)]
        self.remote.delete(stale)
        log.info("%s: manifest uploaded (versions kept: %s), %d stale objects removed", self.remote.url_of(split),
                 ", ".join(map(str, sorted(kept))) or "none", len(stale))

    def _version_bytes(self, directory: Path, number: int) -> bytes:
        """A kept version file: the local copy (fetched by :meth:`open`, or this publish), else the object."""
        name = version_name(number)
        local = directory / name
        if not local.is_file():
            return self.remote.read_bytes(f"{directory.name}/{name}", limit=MAX_MANIFEST_BYTES)
        try:
            return read_guarded(local, "kept manifest", limit=MAX_MANIFEST_BYTES)
        except OSError:  # replaced meanwhile by something else: it names nothing (parse_manifest_bytes refuses b"")
            return b""

    def location(self, split: str, local_manifest: Path) -> Path | str:
        return self.remote.url_of(f"{split}/{MANIFEST_NAME}")

    @contextlib.contextmanager
    def sidecar_folder(self, directory: Path, shard: ShardInfo) -> Iterator[Path]:
        """The staging folder where the sidecar is still there, else a private folder it is fetched into (verified,
        and deleted after the block) by the split's :class:`~shardkit.store.source.TempFiles`."""
        if shard.samples is None or (directory / shard.all_files[-1].name).is_file():
            yield directory  # (a shard without a sidecar: reading it says so)
            return
        files = TempFiles(Remote(self.remote.url_of(directory.name), self.remote.options))
        try:
            with files.hold(shard, (shard.samples,)) as held:
                yield held.folder
        finally:
            files.release()

