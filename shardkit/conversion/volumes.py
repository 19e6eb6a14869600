"""Volume cases read once and cut into slice samples, with the records that rebuild each label volume.

A case's modality files are read header first (:func:`~shardkit.volumes.nifti.read_header`: every limit checked
before a voxel is decoded), checked to share one grid — the same shape and affines equal within
:data:`AFFINE_TOLERANCE` — and the same element type, then each decoded once and cut into all its slices
(:func:`~shardkit.volumes.slices.cut`). Label volumes become exact class ids
(:func:`~shardkit.volumes.nifti.label_ids`) and every id must be in the class table.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DecodeError, LabelError, LayoutError, ShardkitError
from ..support.limits import DEFAULT_MAX_VOXELS
from ..volumes.files import read_header
from ..volumes.files import read_voxels as read_volume
from ..volumes.intensity import case_statistics, intensity_report
from ..volumes.patches import PatchedVolume, Patching, VolumePatch, cut_patches
from ..volumes.resample import Resampling, resample_case
from ..volumes.slices import CutVolume, SliceCounts, Slicing, VolumeSlice, cut
from ..volumes.volume import VolumeHeader, label_ids
from .fingerprint import source_digest
from .layouts.casetemplates import template_case_images, template_cases
from .layouts.pattern import Template
from .layouts.volumes import Case, VolumeLayout, case_images, detect

log = logging.getLogger(__name__)

#: Largest difference between two affines' entries (mm) for volumes still to be on one grid (nibabel's
#: ``allclose`` scale: headers written in float32 differ by ~1e-5).
AFFINE_TOLERANCE = 1e-3
#: Voxels counted at a time by :func:`check_classes` (their intp copy: 32 MiB).
_COUNT_CHUNK = 1 << 22


@dataclass
class ReadCase:
    """A case decoded: modalities stacked ``(M, X, Y, Z)``, its label ids ``(X, Y, Z)`` (None in a test split),
    and the checked headers."""

    case: Case
    images: np.ndarray
    label: np.ndarray | None
    image_header: VolumeHeader
    label_header: VolumeHeader | None
    #: ``--spacing``: how the case was resampled and its grid before (the record's ``resampling``)
    resampled: dict[str, Any] | None = None


def _same_grid(first: VolumeHeader, other: VolumeHeader, what: str) -> None:
    if other.shape != first.shape:
        raise DecodeError(f"{what} is {'x'.join(map(str, other.shape))}, {first.path.name} is "
                          f"{'x'.join(map(str, first.shape))}: not one grid", path=other.path,
                          fix="resample the case's volumes onto one grid before converting")
    diff = float(np.abs(other.affine_array() - first.affine_array()).max())
    if diff > AFFINE_TOLERANCE:
        raise DecodeError(f"{what}'s affine differs from {first.path.name}'s by up to {diff:.4g} "
                          f"(more than {AFFINE_TOLERANCE}): not one grid", path=other.path,
                          fix="resample the case's volumes onto one grid (or fix the headers) before converting")


def read_case(case: Case, classes: dict[int, str] | None, max_voxels: int = DEFAULT_MAX_VOXELS,
              resampling: Resampling | None = None, data: dict[Path, np.ndarray] | None = None) -> ReadCase:
    """Every header of ``case`` checked (limits, one grid, one element type; with ``resampling`` the resampled grid
    too) before any voxel is decoded; then the modalities and label decoded once each (and resampled). ``data``:
    files' bytes the caller has read already (the worker, hashing them): decoded from memory, not read again."""
    def read_voxels(head: VolumeHeader) -> np.ndarray:
        return read_volume(head, None if data is None else data.get(head.path))

    heads = [read_header(p, max_voxels, case.channels) for p in case.images]
    first = heads[0]
    mixed = _dicom_int16_mix(heads)
    for head in heads[1:]:
        _same_grid(first, head, "modality")
        if head.dtype != first.dtype and not mixed:
            raise DecodeError(f"holds {head.dtype} voxels, {first.path.name} {first.dtype}: bands of one sample "
                              "share one type", path=head.path,
                              fix="store the case's modalities in one type (e.g. all float32)")
    label_head = None
    if case.label is not None:
        label_head = read_header(case.label, max_voxels)
        _same_grid(first, label_head, "label volume")
    new_first = new_label = None
    if resampling is not None:  # the resampled grid checked from the headers, before decoding
        new_first = resampling.header(first, max_voxels, "float32")
        if label_head is not None:
            new_label = resampling.header(label_head, max_voxels)
    if case.channels > 1:  # MSD: (X, Y, Z, M) in one file → (M, X, Y, Z), a view
        images = np.moveaxis(read_voxels(first), 3, 0)
    elif len(heads) == 1:  # no stacking: the decoded array itself (one copy of the volume in memory, not two)
        images = read_voxels(first)[None]
    else:
        images = np.empty((len(heads), *first.shape), dtype=np.dtype("int32" if mixed else first.dtype))
        for band, head in enumerate(heads):
            images[band] = read_voxels(head)
    label = None
    if label_head is not None:
        label = label_ids(read_voxels(label_head), label_head.path)
        check_classes(label, classes, label_head.path)
    if resampling is None or new_first is None:
        return ReadCase(case, images, label, first, label_head)
    images, label = resample_case(images, label, first, resampling)
    before = {"shape": list(first.shape), "spacing": list(first.spacing), "affine": [list(r) for r in first.affine]}
    return ReadCase(case, images, label, new_first, new_label, {**resampling.to_json(), "from": before})


def _dicom_int16_mix(heads: list[VolumeHeader]) -> bool:
    """Whether a case's modalities are int16 volumes and DICOM series typed int32 from their headers: stacked as
    int32 (nothing wraps), stored as int16 once every voxel is checked to fit (:func:`_fitted`)."""
    return {h.dtype for h in heads} == {"int16", "int32"} and all(
        h.version == "dicom" for h in heads if h.dtype == "int32")


def check_classes(ids: np.ndarray, classes: dict[int, str] | None, path: Path) -> None:
    """LabelError naming the first id of ``ids`` not in ``classes`` and its voxel count (no table: any id >= 0).
    Counted only when something is wrong: a label whose ids all lie in 0..max, each a class, passes on its
    minimum and maximum."""
    if ids.size == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low >= 0 and (classes is None or (high < len(classes) + 1 and all(v in classes for v in range(high + 1)))):
        return
    if ids.dtype.kind == "u" and ids.dtype.itemsize <= 2:  # uint8/uint16 (label_ids): a count per id, no sort
        flat = ids.reshape(-1, order="A")  # a view in the array's own order (NIfTI volumes decode Fortran-ordered)
        counts = np.zeros(1 << (8 * ids.dtype.itemsize), np.int64)
        for start in range(0, flat.size, _COUNT_CHUNK):  # bincount takes intp: 8 bytes a voxel, so by chunks
            counts += np.bincount(flat[start: start + _COUNT_CHUNK], minlength=counts.size)
        values = np.flatnonzero(counts)
        counts = counts[values]
    else:
        values, counts = np.unique(ids, return_counts=True)
    for value, count in zip(values.tolist(), counts.tolist(), strict=True):
        if value < 0 or (classes is not None and value not in classes):
            known = "ids >= 0" if classes is None else f"the classes {sorted(classes)} of dataset.json 'labels'"
            raise LabelError(f"label value {value} ({count} voxels) is not one of {known}", path=path,
                             fix="add the class to dataset.json 'labels', or correct the label volume")


@dataclass
class VolumeRun:
    """What cutting a layout's split gave besides its samples: how (slices or patches), counts and, per case, the
    record that rebuilds its label volume (the manifest's ``volumes``)."""

    slicing: Slicing | Patching
    counts: SliceCounts = field(default_factory=SliceCounts)
    volumes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        if isinstance(self.slicing, Patching):
            counts = self.counts.to_json()
            return {"patching": self.slicing.to_json(), "volumes": self.volumes,
                    "patches": {"volumes": counts["volumes"], "patches": counts["slices"],
                                "written": counts["written"], "dropped_empty": counts["dropped_empty"]}}
        return {"slicing": self.slicing.to_json(), "slices": self.counts.to_json(), "volumes": self.volumes}


def _volume_record(root: Path, read: ReadCase) -> dict[str, Any]:
    case = read.case
    return {"group": case.key, "images": [p.relative_to(root).as_posix() for p in case.images],
            "label": None if case.label is None else case.label.relative_to(root).as_posix(),
            "image": read.image_header.to_json(),
            "label_volume": None if read.label_header is None else read.label_header.to_json(),
            **({"resampling": read.resampled} if read.resampled is not None else {}),
            "intensity": case_statistics(read.images, read.label)}


def cut_split(layout: VolumeLayout, split: str, slicing: Slicing | Patching, run: VolumeRun,
              max_voxels: int = DEFAULT_MAX_VOXELS) -> Iterator[VolumeSlice | VolumePatch]:
    """Every sample of ``split`` (slices, or 3-D patches with a :class:`~shardkit.volumes.patches.Patching`),
    case by case (each case decoded once), recording each case in ``run``."""
    for case in layout.splits[split]:
        read = read_case(case, layout.classes, max_voxels)
        if isinstance(slicing, Patching):
            log.info("%s: 3-D patches %s, stride %s, orientation as stored (%s per its affine), empty patches %s",
                     case.key, "x".join(map(str, slicing.size)), "x".join(map(str, slicing.step)),
                     _axcodes(read.image_header), slicing.empty)
            patched = PatchedVolume(case.key, read.image_header.shape)
            yield from cut_patches(case.key, read.images, read.label, slicing, read.image_header.affine_array(),
                                   patched, run.counts)
            run.volumes[case.key] = {**_volume_record(layout.root, read),
                                     "dropped_empty": [list(o) for o in patched.dropped]}
            continue
        axis, why = slicing.axis_for(read.image_header.spacing)
        log.info("%s: slices along %s; orientation as stored (%s per its affine), context %d each side (edge "
                 "replicate), empty slices %s", case.key, why, _axcodes(read.image_header), slicing.context,
                 slicing.empty)
        cutting = CutVolume(case.key, axis, read.image_header.shape[axis])
        yield from cut(case.key, read.images, read.label, read.image_header.spacing, slicing, run.counts, cutting,
                       read.image_header.affine_array())
        run.volumes[case.key] = {**_volume_record(layout.root, read), "axis": axis, "depth": cutting.depth,
                                 "dropped_empty": cutting.dropped}


def _axcodes(head: VolumeHeader) -> str:
    import nibabel

    return "".join(str(c) for c in nibabel.aff2axcodes(head.affine_array()))


# -- convert: a volume tree through the pipeline (one pair per case; docs/volumes.md) -----------------------------
#: The layouts whose pairs are volume cases.
VOLUME_LAYOUTS = ("nnunet", "case-folders", "case-templates")
#: Element types a slice is stored in (the formats' image types).
_STORED = {"uint8": "|u1", "uint16": "<u2", "int16": "<i2", "float32": "<f4"}


@dataclass(frozen=True)
class VolumeJob:
    """What a conversion's workers need to cut its cases: the tree's naming, the band order, the slicing, the
    voxel limit and the class ids a label may hold."""

    kind: str
    modalities: tuple[str, ...]
    #: 2-D slices / 2.5-D stacks, or 3-D patches (``--patch``)
    slicing: Slicing | Patching
    max_voxels: int
    #: class ids a label voxel may hold (the run's class table: 0..C-1, and its ignore id)
    classes: tuple[int, ...]
    #: ``--spacing``: every case resampled once (:mod:`shardkit.volumes.resample`)
    resampling: Resampling | None = None
    #: the ignore index patches of a volume shorter than the patch are padded with (None: such a volume is refused)
    pad_label: int | None = None
    #: ``case-templates``: the ``--images``/``--labels`` templates and the input folder they are relative to
    templates: tuple[str, str] | None = None
    root: Path | None = None

    @property
    def bands(self) -> int:
        """Bands of a stored sample: the modalities, times 2K + 1 neighbouring slices for 2.5-D stacks."""
        if isinstance(self.slicing, Patching):
            return len(self.modalities)
        return len(self.modalities) * (2 * self.slicing.context + 1)

    @property
    def patch_size(self) -> tuple[int, int, int] | None:
        """(D, H, W) of every stored 3-D sample (padded to the patch size); None for slices."""
        return self.slicing.size if isinstance(self.slicing, Patching) else None

    def case(self, pair: Any) -> Case:
        """The case of one discovered pair: its modality files in band order, found beside its first one (or by
        the ``--images`` template); a LayoutError when one is missing."""
        if pair.label is None:  # kept by discovery under --on-error skip: refused here, so skipped and recorded
            where = f"matching --labels {self.templates[1]!r}" if self.templates is not None else "beside its images"
            raise LayoutError(f"case {pair.key!r} has no label volume {where}", path=pair.image,
                              fix="add its label volume, or pass --on-error skip to leave such cases out")
        if self.kind == "msd":  # one file, the modalities on its 4th axis
            return Case(pair.key, (pair.image,), pair.label, len(self.modalities))
        if self.templates is not None and self.root is not None:
            return Case(pair.key, template_case_images(self.templates[0], self.root, pair.key, pair.image,
                                                       self.modalities), pair.label)
        return Case(pair.key, case_images(self.kind, pair.key, pair.image, self.modalities), pair.label)

    def to_json(self) -> dict[str, Any]:
        """What the run's settings (and so its shard keys) and manifest record of it."""
        return {**self.slicing.to_json(), "modalities": list(self.modalities), "max_voxels": self.max_voxels,
                **({"resampling": self.resampling.to_json()} if self.resampling is not None else {})}


def volume_job(layout: str, root: Path, slicing: Slicing | Patching, modalities: str | None, max_voxels: int,
               classes: tuple[int, ...], asked: tuple[str, ...] = (), resampling: Resampling | None = None,
               pad_label: int | None = None,
               templates: tuple[str | None, str | None] = (None, None)) -> VolumeJob | None:
    """The job of a run whose discovery found a volume tree; None for any other layout, where a volume option
    given (``asked``: their flags; ``--modalities``) is refused rather than ignored. ``modalities``: the
    ``--modalities`` order (per-case folders and templates); ``templates``: ``--images``/``--labels``."""
    if layout not in VOLUME_LAYOUTS:
        given = [*asked, *(["--modalities"] if modalities is not None else [])]
        if given:
            raise ConfigError(f"{given[0]} is for 3-D volume trees, and the {layout} layout holds images",
                              fix=f"leave out {given[0]}")
        return None
    order = [m.strip() for m in modalities.split(",") if m.strip()] if modalities else None
    images, labels = templates
    if layout == "case-templates" and images is not None and labels is not None:
        image_t = Template.parse(images, "--images")
        cases = template_cases(root, image_t, Template.parse(labels, "--labels"), order)[0]
        if image_t.has_modality and not order:
            log.info("modalities not given: bands in name order %s (set --modalities to choose)",
                     list(cases.modalities))
        return VolumeJob(cases.kind, cases.modalities, slicing, max_voxels, classes, resampling, pad_label,
                         (images, labels), root)
    found = detect(root, order, on_error="skip")  # discovery refused an incomplete case already unless skipping
    if found is None:  # discovery just found it
        raise LayoutError("is no longer a volume tree", path=root, fix="re-run when the input is stable")
    return VolumeJob(found.kind, found.modalities, slicing, max_voxels, classes, resampling, pad_label)


def check_options(cfg: Any) -> None:
    """Refuse, in one line, the options a volume run cannot honour yet (each would otherwise be ignored)."""
    given = [flag for flag, on in (
        ("--tile", cfg.tile is not None), ("--size", cfg.size is not None), ("--bands", bool(cfg.bands)),
        ("--image-dtype", cfg.image_dtype is not None), ("--pages-as-bands", cfg.pages_as_bands),
        ("--label-map/--reduce-zero-label/--threshold", cfg.value_map.active),
        ("--annotations", getattr(cfg, "annotations", None) not in (None, "auto", "none")),
        ("object storage", cfg.input_url is not None or cfg.output_url is not None)) if on]
    if given:
        raise ConfigError(f"{given[0]} is not available for 3-D volumes yet (docs/volumes.md)",
                          fix=f"leave out {given[0]}")


def volume_image_layout(found: Any, job: VolumeJob, on_error: str = "fail") -> tuple[str, int, str]:
    """(stored dtype, bands, channel kind) of the run's slices, from the first case's headers (nothing decoded;
    with ``on_error="skip"`` the first case whose files are there and whose header reads): modalities x (2K + 1)
    bands of the volumes' element type; logged like an image run's."""
    head, case, error = None, None, None
    for pair in (p for pairs in found.splits.values() for p in pairs):
        try:
            case = job.case(pair)
            head = read_header(case.images[0], job.max_voxels, case.channels)
            break
        except ShardkitError as exc:
            if on_error != "skip":
                raise
            error = error or exc
    if head is None or case is None:
        raise error or LayoutError("holds no volume case", path=found.root, fix="check the input")
    dtype = _stored_name(head)
    if job.resampling is not None:
        head, dtype = job.resampling.header(head, job.max_voxels, "float32"), "float32"
        log.info("volumes: %s", job.resampling.describe(), extra={"event": "resampling", **job.resampling.to_json()})
    if dtype == "int16" and head.dtype == "int32":
        log.info("volumes: %s is a DICOM series whose headers allow int32 values (16 bits stored, then rescaled): "
                 "stored as int16, every voxel checked to fit (a case whose values do not is refused)", head.path)
    bands = job.bands
    if isinstance(job.slicing, Patching):
        p = job.slicing
        log.info("volumes: 3-D patches %s, stride %s, orientation as stored; a volume shorter than the patch is "
                 "padded at the far end (labels with the ignore index %s, images with 0); empty patches %s",
                 "x".join(map(str, p.size)), "x".join(map(str, p.step)), job.pad_label,
                 "dropped" if p.empty == "drop" else "kept",
                 extra={"event": "volumes", "patch": list(p.size), "stride": list(p.step), "empty": p.empty})
        log.info("volumes: %s, %d band%s (%s), samples (D, H, W, bands)", dtype, bands, "s" * (bands != 1),
                 "/".join(job.modalities),
                 extra={"event": "images", "dtype": dtype, "bands": bands, "channels": "bands"})
        return _STORED[dtype], bands, "bands"
    rule = "the axis asked for" if job.slicing.axis is not None else "each case's axis of largest spacing"
    log.info("volumes: slices along %s (first case %s: %s); context %d slices each side, edge slices repeated; "
             "empty slices %s", rule, case.key, job.slicing.axis_for(head.spacing)[1], job.slicing.context,
             "dropped" if job.slicing.empty == "drop" else "kept",
             extra={"event": "volumes", "axis": job.slicing.to_json()["axis"], "context": job.slicing.context,
                    "empty": job.slicing.empty})
    log.info("volumes: %s, %d band%s (%s x %d slices), orientation as stored", dtype, bands,
             "s" * (bands != 1), "/".join(job.modalities), 2 * job.slicing.context + 1,
             extra={"event": "images", "dtype": dtype, "bands": bands, "channels": "bands"})
    return _STORED[dtype], bands, "bands"


def _stored_name(head: VolumeHeader) -> str:
    """The element type a case's slices are stored in: the volume's own; a DICOM series typed int32 from its
    headers (16 bits stored plus an intercept: the range the headers allow overflows int16, the values of a real
    CT in HU seldom do) int16, each voxel then checked (:func:`_fitted`)."""
    if head.version == "dicom" and head.dtype == "int32":
        return "int16"
    if head.dtype not in _STORED:
        raise DecodeError(f"holds {head.dtype} voxels; slices are stored as {', '.join(_STORED)}",
                          path=head.path, fix="re-save the volumes as int16 or float32 (nothing is converted "
                                              "silently)")
    return head.dtype


def _fitted(images: np.ndarray, want: str, path: Path) -> np.ndarray:
    """``images`` as the stored type ``want`` when that is a DICOM series' int32 narrowed to int16
    (:func:`_stored_name`) and every voxel fits; a DecodeError naming the first value that does not and how many
    voxels lie outside; any other pair of types as it is (the caller refuses a mismatch)."""
    if images.dtype != np.int32 or want != "int16":
        return images
    info = np.iinfo(np.int16)
    low, high = int(images.min()), int(images.max())
    if low < info.min or high > info.max:
        outside = int(np.count_nonzero((images < info.min) | (images > info.max)))
        raise DecodeError(f"holds the value {low if low < info.min else high} ({outside} voxels outside int16 in "
                          "all): this split stores int16", path=path,
                          fix="convert the series to NIfTI (e.g. dcm2niix) saved as float32 and convert that "
                              "(nothing is wrapped or cast silently)")
    return images.astype(np.int16)


def slice_counts(pairs: Any, job: VolumeJob) -> list[tuple[int, tuple[int, int]]]:
    """Per case: how many slices it gives at most (its depth along the slice axis) and their (H, W), from its
    first file's header; (1, (1, 1)) where the header cannot be read (its worker then reports why)."""
    counts = []
    for pair in pairs:
        try:
            head = read_header(pair.image, job.max_voxels, len(job.modalities) if job.kind == "msd" else 1)
            if job.resampling is not None:
                head = job.resampling.header(head, job.max_voxels)
        except ShardkitError:
            counts.append((1, (1, 1)))
            continue
        if isinstance(job.slicing, Patching):  # stored as (D * H, W): every patch padded to the patch size
            d, h, w = job.slicing.size
            try:
                counts.append((len(job.slicing.origins(head.shape)), (d * h, w)))
            except ShardkitError:
                counts.append((1, (1, 1)))
            continue
        axis = job.slicing.axis_for(head.spacing)[0]
        rest = [n for a, n in enumerate(head.shape) if a != axis]
        counts.append((head.shape[axis], (rest[0], rest[1])))
    return counts


def with_case_files(fingerprint: bytes, pair: Any, job: VolumeJob, on_error: str = "fail") -> bytes:
    """A case's fingerprint (of its pair: first modality file and label) with the digests of its other modality
    files folded in, so an edit to any file of the case changes it (and only its shard is written again).

    Those files are hashed each run (the fingerprint cache holds a pair's two files); the sum is the same wherever
    it is computed (parent or worker). A case whose modality files cannot be found or read: with
    ``on_error="skip"`` a placeholder digest (its worker then skips the case, saying why), else the error."""
    try:  # every file of the case but the pair's own (which is not its first band with --modalities)
        extras = [p for p in job.case(pair).images if p != pair.image]
    except ShardkitError as exc:
        if on_error != "skip":
            raise
        return hashlib.sha256(f"volume case unreadable: {exc}\0".encode() + fingerprint).digest()
    if not extras:  # one file holds every modality (MSD), or one modality: the pair's fingerprint covers the case
        return fingerprint
    h = hashlib.sha256(b"volume case files\0" + fingerprint)
    for path in extras:
        h.update(str(source_digest(path, None, on_error)[0][-1]).encode())
    return h.digest()


def fold_case_files(rows: np.ndarray, pairs: Any, job: VolumeJob, on_error: str = "fail",
                    threads: int = 4) -> np.ndarray:
    """A split's (n, 32) pair fingerprints, each with its case's other files (:func:`with_case_files`)."""
    def one(i: int) -> bytes:
        return with_case_files(rows[i].tobytes(), pairs[i], job, on_error)

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(pairs)))) as pool:
        folded = b"".join(pool.map(one, range(len(pairs))))
    return np.frombuffer(folded, np.uint8).reshape(-1, 32)


def cut_case(pair: Any, job: VolumeJob, run: VolumeRun, root: Path, checked: Callable[[], None] = lambda: None,
             stored: tuple[str, int] | None = None, data: dict[Path, np.ndarray] | None = None
             ) -> Iterator[VolumeSlice | VolumePatch]:
    """One discovered case's slices (decoded once; every header and label checked before the first slice is
    given), recording the case in ``run``; ``checked`` runs after the read, before the first slice (the worker's
    unchanged-input check). ``stored``: the split's (element type, bands), set by its first case: a case of
    another type is refused, never cast. ``data``: bytes of its files the worker read to hash them (decoded from
    memory: each such file is read once)."""
    case = job.case(pair)
    read = read_case(case, dict.fromkeys(job.classes, ""), job.max_voxels, job.resampling, data)
    if stored is not None:
        read.images = _fitted(read.images, stored[0], case.images[0])
        have = (read.images.dtype.name, job.bands // len(job.modalities) * read.images.shape[0])
        if have != stored:
            raise DecodeError(f"case {case.key!r} gives {have[0]} slices of {have[1]} bands; this split stores "
                              f"{stored[0]} with {stored[1]} bands (its first case's)", path=case.images[0],
                              fix="convert cases of another type into another output folder, or re-save them in "
                                  "one type (nothing is cast silently)")
    if isinstance(job.slicing, Patching):
        shape = read.image_header.shape
        if job.pad_label is None and any(n < p for n, p in zip(shape, job.slicing.size, strict=True)):
            raise ConfigError(f"case {case.key!r} is {'x'.join(map(str, shape))} voxels, shorter than --patch "
                              f"{'x'.join(map(str, job.slicing.size))}: its patches would be padded, and the class "
                              "table has no ignore index to pad labels with", path=case.images[0],
                              fix="pass --ignore-index ID (a value no class uses, e.g. 255), or a smaller --patch")
        checked()
        patched = PatchedVolume(case.key, shape)
        yield from cut_patches(case.key, read.images, read.label, job.slicing, read.image_header.affine_array(),
                               patched, run.counts, job.pad_label, read.image_header.spacing)
        run.volumes[case.key] = {**_volume_record(root, read), "dropped_empty": [list(o) for o in patched.dropped]}
        return
    checked()
    axis, why = job.slicing.axis_for(read.image_header.spacing)
    log.debug("%s: slices along %s", case.key, why)
    cutting = CutVolume(case.key, axis, read.image_header.shape[axis])
    yield from cut(case.key, read.images, read.label, read.image_header.spacing, job.slicing, run.counts, cutting,
                   read.image_header.affine_array())
    run.volumes[case.key] = {**_volume_record(root, read), "axis": axis, "depth": cutting.depth,
                             "dropped_empty": cutting.dropped}


def volume_wire(job: VolumeJob, run: VolumeRun) -> dict[str, Any]:
    """A shard's part of the manifest's ``volumes`` entry (sent back in its worker stats, kept in its record)."""
    return {"slicing": job.to_json(), "slices": run.counts.to_json(), "cases": run.volumes,
            **({"patches": True} if isinstance(job.slicing, Patching) else {})}


def volume_report(stats: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's ``volumes`` entry of a split from its shards' worker stats: the slicing, the counts summed
    and each case's record; ``{}`` for a run that is not a volume run."""
    parts = [s["volumes"] for s in stats if "volumes" in s]
    if not parts:
        return {}
    counts = SliceCounts()
    cases: dict[str, Any] = {}
    for part in parts:
        for name, value in part["slices"].items():
            setattr(counts, name, getattr(counts, name) + int(value))
        cases.update(part["cases"])
    names = list(parts[0]["slicing"].get("modalities") or [])
    if parts[0].get("patches"):  # 3-D patches: the counts are of patches
        c = counts.to_json()
        tally = {"patches": {"volumes": c["volumes"], "patches": c["slices"], "written": c["written"],
                             "dropped_empty": c["dropped_empty"]}}
    else:
        tally = {"slices": counts.to_json()}
    return {"volumes": {"slicing": parts[0]["slicing"], **tally, "cases": cases,
                        "intensity": intensity_report(cases, names)}}
