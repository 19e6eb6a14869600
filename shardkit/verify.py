"""``shardkit verify``: re-check everything a manifest promises, shard by shard.

For every shard: files (samples sidecar included) exist with the stated size and sha256; every
sample decodes with the stated shapes; what the sidecars and the manifest derive from the samples —
each sample's class bitmap and pixel hash, the split's pixel and per-class counts, class shares and band
statistics — equals what the decoded samples give (:mod:`shardkit.store.derived`), and so does
``source.fingerprint`` recomputed from the sample records. Shard by shard: no list of all samples is held.
Nothing is trusted; nothing is modified.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ShardkitError
from .files.samples import split_fingerprint
from .files.storage import Remote, is_url
from .formats.base import SampleSpec, sha256_file
from .formats.registry import get
from .store.derived import DerivedCheck, label_counts
from .store.manifest import MANIFEST_NAME, Manifest, read_manifest_json
from .store.source import ByteSource, open_bytes

log = logging.getLogger(__name__)


@dataclass
class SplitReport:
    """What verify found in one split folder."""

    path: Path | str
    samples: int = 0
    shards: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def split_folders(path: Path) -> list[Path]:
    """``path`` itself if it holds a manifest, else its sub-folders that do (sorted)."""
    path = Path(path)
    if (path / MANIFEST_NAME).is_file():
        return [path]
    return sorted(p for p in path.iterdir() if (p / MANIFEST_NAME).is_file()) if path.is_dir() else []


def published_digests(path: Path) -> dict[str, str]:
    """sha256 of a split's manifest (``source.root`` blanked) and of every file it names (samples sidecars
    included): what a reader sees.

    Two conversions of the same input with the same options must give equal digests (used to compare a
    resumed, incremental or Dask run with a fresh local one).
    """
    import hashlib
    import json

    m = read_manifest_json(Path(path) / MANIFEST_NAME)
    m["source"]["root"] = ""
    m.pop("version", None)  # the publish number counts a folder's history, not what its data is
    out = {MANIFEST_NAME: hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()}
    for shard in m["shards"]:
        for f in [*shard["files"], *([shard["samples"]] if "samples" in shard else [])]:
            out[f["name"]] = sha256_file(Path(path) / f["name"])
    return out


def split_locations(path: str | Path, storage_options: dict[str, Any] | None = None) -> list[str | Path]:
    """:func:`split_folders` for a local path; for a URL, the URL itself if it holds a manifest, else its
    sub-folders that do; InputNotFoundError when the URL's bucket does not exist or nothing is stored under it."""
    if not is_url(path):
        return list(split_folders(Path(path)))
    remote = Remote(str(path), storage_options)
    if remote.exists(MANIFEST_NAME):
        return [remote.url]
    found: list[str | Path] = [remote.url_of(d) for d in remote.subfolders() if remote.exists(f"{d}/{MANIFEST_NAME}")]
    if not found:
        remote.require_present()  # a missing bucket or an empty prefix, said as such (not "no manifest.json here")
    return found


def load_split_manifest(path: str | Path, storage_options: dict[str, Any] | None = None) -> Manifest:
    """The validated manifest of a local split folder or a split URL (read once, under the manifest's parse bounds,
    by its :class:`~shardkit.store.source.ByteSource`)."""
    with open_bytes(path, storage_options=storage_options, lease=False) as source:
        return source.manifest


def verify_split(path: str | Path, storage_options: dict[str, Any] | None = None) -> SplitReport:
    """Check one split, local or on object storage (through its :class:`~shardkit.store.source.ByteSource`: a remote
    shard fetched into a temporary folder, each downloaded file checked against its sha256, verified there, then
    deleted before the next), every check below on the local files."""
    report = SplitReport(path if is_url(path) else Path(path))
    try:
        source = open_bytes(path, storage_options=storage_options, lease=False)
    except ShardkitError as exc:
        report.problems.append(str(exc))
        return report
    with source:
        try:
            spec = SampleSpec.from_manifest(source.manifest.sample)
            fmt = get(source.manifest.format)
        except ShardkitError as exc:  # an unknown format is the manifest's problem here, not a usage error
            report.problems.append(str(exc))
            return report
        _verify_shards(report, source, spec, fmt)
    return report


def _verify_shards(report: SplitReport, source: ByteSource, spec: SampleSpec, fmt: Any) -> None:
    manifest = source.manifest
    derived = DerivedCheck(manifest, spec)
    report.shards = len(manifest.shards)
    digests: list[str] = []
    for pos, shard in enumerate(manifest.shards):
        where = f"shard {shard.index} ({', '.join(f.name for f in shard.all_files)})"
        try:
            with source.hold(shard) as held:  # a remote split: the shard's verified copy, for this shard only
                _verify_shard(report, manifest, pos, fmt.open_shard(held.folder, shard, spec, manifest), spec,
                              derived, digests, where)
        except ShardkitError as exc:
            report.problems.append(f"{where}: {exc}")
        except (OSError, ValueError) as exc:
            report.problems.append(f"{where}: unreadable ({exc})")
    report.problems += derived.finish(complete=not report.problems)  # the statistics once every sample was read
    if not report.problems and manifest.manifest_version >= 2:
        fingerprint = split_fingerprint(digests)
        if fingerprint != manifest.source.fingerprint:
            report.problems.append(f"source fingerprint {fingerprint[:12]}… recomputed from the samples sidecars "
                                   f"differs from the manifest's {str(manifest.source.fingerprint)[:12]}…")


def _verify_shard(report: SplitReport, manifest: Manifest, pos: int, reader: Any, spec: SampleSpec,
                  derived: DerivedCheck, digests: list[str], where: str) -> None:
    """Every check of one shard, on its ``reader``."""
    shard = manifest.shards[pos]
    reader.verify_hashes()
    reader.ensure_open()
    hw = manifest.samples.hw(pos, reader.local_directory)  # this shard's only
    digests.append(_shard_digest(manifest, pos, reader))
    columns = derived.shard(pos, reader.local_directory)
    for i in range(shard.num_samples):
        image, stored = reader.read(i)
        h, w = int(hw[i, 0]), int(hw[i, 1])
        want = spec.image_shape((h, w))  # the stored type and bands (manifest version 4), not RGB only
        if image.shape != want or image.dtype != spec.stored_image_dtype:
            report.problems.append(f"{where}: sample {i} has image {image.shape} {image.dtype}, expected "
                                   f"{want} {spec.stored_image_dtype}")
            continue
        columns.add(i, image, stored)
        report.samples += 1
    columns.done()


def class_pixels(spec: SampleSpec, stored: np.ndarray, ignore: int | None) -> np.ndarray:
    """Pixels of each class id in one stored label (:func:`~shardkit.store.derived.label_counts`; ids at or above
    ``num_classes`` are not counted)."""
    return label_counts(spec, stored, ignore)[: spec.num_classes]


def _shard_digest(manifest: Manifest, pos: int, reader: Any) -> str:
    """sha256 of one shard's raw sample fingerprints (manifest version 2; "" for version 1)."""
    if manifest.manifest_version < 2:
        return ""
    rows = manifest.samples.rows(pos, reader.local_directory)
    return hashlib.sha256(rows["fingerprint"].tobytes()).hexdigest()
