"""Volume datasets: which cases a folder holds, each case's modality files (in band order) and its label volume.

Two trees are detected (:func:`detect`), their volumes NIfTI (``.nii``, ``.nii.gz``) or NRRD (``.nrrd``):

- **nnU-Net / MSD** (``nnunet``): ``dataset.json`` beside ``imagesTr/<case>_<CCCC>.nii.gz`` (one file per
  modality, channel ``CCCC`` = 0000, 0001, … in ``channel_names`` order; MSD's ``modality``), ``labelsTr/<case>.nii.gz``
  and optionally ``imagesTs/`` (split ``test``, no labels). The class table is ``dataset.json``'s ``labels``
  (nnU-Net v2 ``{"name": id}`` or MSD ``{"id": "name"}``).
- **per-case folders** (``case-folders``, BraTS): ``<case>/<case>_<modality>.nii.gz`` and ``<case>/<case>_seg.nii.gz``;
  a modality may also be a DICOM series folder ``<case>/<case>_<modality>/`` (the label is a NIfTI or NRRD file);
  modalities in ``modalities`` order when given, else sorted by name (stated in the log); every case must have
  the same set. No class table in the tree: the label values found are the classes.

Nothing here decodes a voxel; :mod:`shardkit.conversion.volumes` reads the cases. The ``nnunet`` and
``case-folders`` layouts (:mod:`.nnunet`, :mod:`.casefolders`) hand the cases to discovery as one pair per case.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import LayoutError
from ...files.splitfiles import ClassInfo, ClassTable
from ...labels.policy import TableChoice
from ...support.smallfile import read_json
from ...volumes.files import VOLUME_SUFFIXES, is_volume, volume_stem
from ..pairs import PairBuilder
from .scan import Found

log = logging.getLogger(__name__)

_CHANNEL = re.compile(r"^(?P<case>.+)_(?P<channel>\d{4})$")
#: Largest dataset.json read (nnU-Net's hold a few kB; MSD's list every case: a few MB at most).
MAX_DATASET_JSON = 16 << 20
#: The label file's suffix in a per-case folder (BraTS).
SEG_SUFFIX = "_seg"


@dataclass(frozen=True)
class Case:
    """One case (patient): its modality files in band order and its label volume (None in a test split)."""

    key: str
    images: tuple[Path, ...]
    label: Path | None
    #: modalities stacked in one 4-D file (MSD's own ``imagesTr/BRATS_001.nii.gz``, the 4th axis in dataset.json's
    #: ``modality`` order); 1: one 3-D file per modality
    channels: int = 1


@dataclass(frozen=True)
class VolumeLayout:
    """A volume dataset found in a folder: its kind, modality names (band order), class table and cases per
    split."""

    kind: str
    root: Path
    modalities: tuple[str, ...]
    #: class id → name (``dataset.json``'s ``labels``); None: the label values found are the classes
    classes: dict[int, str] | None
    splits: dict[str, tuple[Case, ...]]

    def describe(self) -> str:
        """One line for the log: the kind, the bands and the cases per split."""
        counts = ", ".join(f"{s}: {len(c)} cases" for s, c in self.splits.items())
        return f"{self.kind} volume layout, bands {list(self.modalities)} (in this order), {counts}"


def _volume_files(folder: Path) -> list[Path]:
    """The volume files of ``folder``, sorted; hidden ones (MSD's archives carry macOS ``._BRATS_001.nii.gz``
    resource forks) left out, as nnU-Net's own conversion does."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if is_volume(p.name) and not p.name.startswith(".") and p.is_file())


def _series_folders(folder: Path) -> list[Path]:
    """The subfolders of a case folder, each read as a DICOM series (hidden ones and links left out)."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and p.is_dir() and not p.is_symlink())


def volume_folders(root: Path, depth: int = 2, cap: int = 64) -> list[str]:
    """Folders of ``root`` (itself ``.``, and up to ``depth`` levels down, ``cap`` folders at most) that hold volume
    files (NIfTI, NRRD), by name only: what tells a user whose folder no image layout matches that it holds volumes."""
    found: list[str] = []
    level, seen = [Path(root)], 0
    for _ in range(depth + 1):
        nxt: list[Path] = []
        for folder in level:
            seen += 1
            if seen > cap:
                return found
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            if any(is_volume(e.name) for e in entries):
                found.append(str(folder.relative_to(root)))
            nxt += [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
        level = nxt
    return found


def detect(root: Path, modalities: Sequence[str] | None = None, on_error: str = "fail") -> VolumeLayout | None:
    """The volume layout of ``root``, or None when it holds neither tree (nothing is decoded). ``on_error="skip"``:
    a case missing a modality (channel) or its label volume is kept with the files it has (and no label) rather
    than refused, so that converting it fails alone (:meth:`~shardkit.conversion.volumes.VolumeJob.case`) and
    ``--on-error skip`` skips and records it; without ``modalities`` the bands of per-case folders are then every
    modality any case has."""
    root = Path(root)
    skip = on_error == "skip"
    if (root / "imagesTr").is_dir() and _volume_files(root / "imagesTr"):
        return _nnunet(root, modalities, skip)
    if root.is_dir():
        folders = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
        if folders and any((d / f"{d.name}{SEG_SUFFIX}{s}").is_file() for d in folders for s in VOLUME_SUFFIXES):
            return _case_folders(root, folders, modalities, skip)
    return None


def _class_table(labels: Any, path: Path) -> dict[int, str]:
    """``labels`` of dataset.json: ``{"name": id}`` (nnU-Net v2) or ``{"id": "name"}`` (MSD) → id → name."""
    if not isinstance(labels, dict) or not labels:
        raise LayoutError("'labels' is not a non-empty object", path=path,
                          fix='write it like "labels": {"background": 0, "tumour": 1}')
    table: dict[int, str] = {}
    if all(isinstance(v, int) and not isinstance(v, bool) for v in labels.values()):
        pairs = [(int(v), str(k)) for k, v in labels.items()]
    elif all(isinstance(k, str) and k.strip().isdigit() and isinstance(v, str) for k, v in labels.items()):
        pairs = [(int(k), v) for k, v in labels.items()]
    else:
        raise LayoutError("'labels' maps neither names to integer ids (nnU-Net v2) nor ids to names (MSD); region "
                          "labels (lists of ids) are not read", path=path,
                          fix='write it like "labels": {"background": 0, "tumour": 1}')
    for cid, name in pairs:
        if cid < 0 or cid in table:
            raise LayoutError(f"'labels' gives id {cid} twice or below 0", path=path, fix="give each class one id >= 0")
        table[cid] = name
    return dict(sorted(table.items()))


def _names(given: Any, path: Path, key: str) -> tuple[str, ...]:
    if not isinstance(given, dict) or not all(isinstance(k, str) and k.isdigit() for k in given):
        raise LayoutError(f"'{key}' is not an object of channel numbers", path=path,
                          fix=f'write it like "{key}": {{"0": "T1", "1": "T2"}}')
    by_id = {int(k): str(v) for k, v in given.items()}
    if sorted(by_id) != list(range(len(given))):
        raise LayoutError(f"'{key}' numbers {sorted(given)} are not 0..{len(given) - 1}", path=path,
                          fix="number the channels 0, 1, 2 … as the files' _0000, _0001 … suffixes")
    return tuple(by_id[i] for i in range(len(by_id)))


def _nnunet(root: Path, modalities: Sequence[str] | None, skip: bool = False) -> VolumeLayout:
    meta_path = root / "dataset.json"
    if not meta_path.is_file():
        raise LayoutError("imagesTr/ holds NIfTI volumes but there is no dataset.json beside it", path=root,
                          fix="add nnU-Net's dataset.json (channel_names and labels)")
    try:
        meta = read_json(meta_path, "dataset.json", limit=MAX_DATASET_JSON)
    except (OSError, ValueError) as exc:
        raise LayoutError(f"cannot be read: {exc}", path=meta_path, fix="check the file") from None
    if not isinstance(meta, dict):
        raise LayoutError("is not a JSON object", path=meta_path, fix="check the file")
    key = "channel_names" if "channel_names" in meta else "modality"
    if key not in meta:
        raise LayoutError("has neither 'channel_names' (nnU-Net v2) nor 'modality' (MSD)", path=meta_path,
                          fix='add "channel_names": {"0": "CT"} with one entry per _000N file')
    names = _names(meta[key], meta_path, key)
    if modalities:
        raise LayoutError("--modalities is for per-case folders: here dataset.json's channel order is the band "
                          "order", path=meta_path, fix="leave out --modalities")
    classes = _class_table(meta.get("labels"), meta_path)
    msd = key == "modality" and not any(_CHANNEL.match(volume_stem(p.name)) for p in _volume_files(root / "imagesTr"))
    cases = _msd_cases if msd else _channel_cases
    splits = {"train": cases(root / "imagesTr", root / "labelsTr", names, skip)}
    if _volume_files(root / "imagesTs"):
        splits["test"] = cases(root / "imagesTs", None, names)
    return VolumeLayout("msd" if msd else "nnunet", root, names, classes, splits)


def _msd_cases(images: Path, labels: Path | None, names: tuple[str, ...], skip: bool = False) -> tuple[Case, ...]:
    """Cases of an MSD ``imagesTr``: one file per case, its modalities (dataset.json's ``modality``) stacked on
    a 4th axis (3-D when there is one)."""
    cases = []
    for path in _volume_files(images):
        case = volume_stem(path.name)
        cases.append(Case(case, (path,), _label_of(labels, case, skip), len(names)))
    return tuple(cases)


def _label_of(labels: Path | None, case: str, skip: bool = False) -> Path | None:
    """``labelsTr/<case>.<volume suffix>``; None without a labels folder (or, ``skip``, when missing); LayoutError
    when missing."""
    if labels is None:
        return None
    found = [labels / f"{case}{s}" for s in VOLUME_SUFFIXES if (labels / f"{case}{s}").is_file()]
    if not found and skip:
        return None
    if not found:
        raise LayoutError(f"case {case!r} has no label volume {case}.nii.gz", path=labels,
                          fix="add the label volume, or move the case's images out of imagesTr/")
    return found[0]


def _channel_cases(images: Path, labels: Path | None, names: tuple[str, ...], skip: bool = False) -> tuple[
        Case, ...]:
    """Cases of an ``imagesTr``-like folder: ``<case>_<CCCC>`` files grouped, every channel present."""
    by_case: dict[str, dict[int, Path]] = {}
    for path in _volume_files(images):
        m = _CHANNEL.match(volume_stem(path.name))
        if m is None:
            raise LayoutError("is not named <case>_<CCCC>.nii.gz (nnU-Net: one file per channel)", path=path,
                              fix="rename it like case_001_0000.nii.gz, or split a 4-D MSD volume per channel "
                                  "(nnUNetv2_convert_MSD_dataset)")
        by_case.setdefault(m.group("case"), {})[int(m.group("channel"))] = path
    cases = []
    for case, files in sorted(by_case.items()):
        if skip and files and set(files) < set(range(len(names))):  # its missing channel refused when resolved
            cases.append(Case(case, tuple(files[c] for c in sorted(files)), _label_of(labels, case, skip)))
            continue
        if sorted(files) != list(range(len(names))):
            raise LayoutError(f"case {case!r} has channels {sorted(files)}, dataset.json names {len(names)} "
                              f"({', '.join(names)})", path=images,
                              fix="give every case one file per channel, _0000 to "
                                  f"_{len(names) - 1:04d}")
        cases.append(Case(case, tuple(files[c] for c in range(len(names))), _label_of(labels, case, skip)))
    return tuple(cases)


def _case_folders(root: Path, folders: list[Path], modalities: Sequence[str] | None,
                  skip: bool = False) -> VolumeLayout:
    cases: list[Case] = []
    order: tuple[str, ...] | None = tuple(modalities) if modalities else None
    if order is None:  # every modality any case has: the case lacking one is named (with skip: skipped)
        order = tuple(sorted({name for folder in folders for name in _modality_names(folder)}))
        log.info("modalities not given: bands in name order %s (set --modalities to choose)", list(order))
    for folder in folders:
        files = {volume_stem(p.name): p for p in _volume_files(folder)}
        prefix = folder.name + "_"
        label = files.pop(folder.name + SEG_SUFFIX, None)
        for series in _series_folders(folder):  # a modality as a DICOM series folder
            if series.name == folder.name + SEG_SUFFIX:
                raise LayoutError(f"case folder {folder.name!r} holds its label as a folder {series.name}/: label "
                                  "volumes are read from NIfTI or NRRD files", path=series,
                                  fix=f"save the label volume as {series.name}.nii.gz on the modalities' grid")
            if series.name in files:
                raise LayoutError(f"case folder {folder.name!r} holds both {files[series.name].name} and a "
                                  f"folder {series.name}/ for one modality", path=folder,
                                  fix="keep one of them")
            files[series.name] = series
        mods = {name[len(prefix):]: p for name, p in files.items() if name.startswith(prefix)}
        if len(mods) != len(files) or not mods:
            odd = sorted(set(files) - {prefix + m for m in mods}) or ["(no modality file)"]
            raise LayoutError(f"case folder {folder.name!r} holds {odd[0]}, not named {prefix}<modality>",
                              path=folder, fix=f"name each modality {prefix}<modality>.nii.gz and the label "
                                               f"{folder.name}{SEG_SUFFIX}.nii.gz")
        if skip and mods and (label is None or set(mods) < set(order)):  # refused when its files are resolved
            cases.append(Case(folder.name, tuple(mods[m] for m in order if m in mods), label))
            continue
        if label is None:
            raise LayoutError(f"case folder {folder.name!r} has no {folder.name}{SEG_SUFFIX}.nii.gz", path=folder,
                              fix="add its label volume or move the folder out")
        if set(mods) != set(order):
            raise LayoutError(f"case {folder.name!r} has modalities {sorted(mods)}, not {sorted(order)}",
                              path=folder, fix="give every case the same modality files (or --modalities)")
        cases.append(Case(folder.name, tuple(mods[m] for m in order), label))
    return VolumeLayout("case-folders", root, order, None, {"train": tuple(cases)})


def _modality_names(folder: Path) -> set[str]:
    """The modality names of a per-case folder's files and series folders (``<case>_<modality>``), its label's
    left out."""
    prefix = folder.name + "_"
    names = {volume_stem(p.name) for p in _volume_files(folder)} | {p.name for p in _series_folders(folder)}
    return {n[len(prefix):] for n in names if n.startswith(prefix) and n != folder.name + SEG_SUFFIX}


def case_jobs(found: VolumeLayout) -> dict[str, Callable[[], Found]]:
    """Discovery's pairing job per split: one pair per case, keyed by the case, its first modality file as the
    image (the file each run fingerprints and checks for changes; the worker finds the others by
    :func:`case_images`) and its label volume."""

    def job(cases: tuple[Case, ...]) -> Found:
        builder = PairBuilder(found.root)
        for case in cases:
            builder.add(case.key, str(case.images[0]), None if case.label is None else str(case.label))
        return Found(builder)

    unlabelled = [split for split, cases in found.splits.items() if all(c.label is None for c in cases)]
    if unlabelled:
        log.warning("%s: split %s has no label volumes (imagesTs/) and is not converted", found.root,
                    ", ".join(unlabelled))
    return {split: functools.partial(job, cases) for split, cases in found.splits.items() if split not in unlabelled}


def dataset_table(root: Path) -> TableChoice | None:
    """dataset.json's ``labels`` as the class table (ids must be 0..C-1, as shardkit stores them); None for a
    tree without one."""
    found = detect(root, on_error="skip")  # only its dataset.json is wanted here
    if found is None or found.classes is None:
        return None
    ids = sorted(found.classes)
    if ids != list(range(len(ids))):
        raise LayoutError(f"'labels' has ids {ids}: shardkit stores class ids 0..{len(ids) - 1}",
                          path=root / "dataset.json",
                          fix="relabel the volumes to consecutive ids (BraTS: 4 → 3, as nnU-Net's conversion does) "
                              "and list them so in dataset.json")
    table = ClassTable(tuple(ClassInfo(i, found.classes[i]) for i in ids), None, source="dataset.json")
    return TableChoice(table, "dataset.json 'labels' (nnU-Net/MSD)")


def case_images(kind: str, key: str, first: Path, modalities: tuple[str, ...]) -> tuple[Path, ...]:
    """A case's modality files in band order, found beside ``first`` (its first file) by the tree's naming:
    ``<case>_<CCCC>.<ext>`` (nnU-Net) or ``<case>_<modality>.<ext>`` (per-case folders), any volume suffix, or (per-case
    folders) a DICOM series folder ``<case>_<modality>/``."""
    names = [f"{key}_{c:04d}" for c in range(len(modalities))] if kind == "nnunet" else [
        f"{key}_{m}" for m in modalities]
    out = []
    for name in names:
        found = [first.parent / f"{name}{s}" for s in VOLUME_SUFFIXES if (first.parent / f"{name}{s}").is_file()]
        series = first.parent / name  # per-case folders: a DICOM series folder
        if kind == "case-folders" and series.is_dir() and not series.is_symlink():
            found.append(series)
        if len(found) != 1:
            raise LayoutError(f"case {key!r} has {len(found)} files named {name}.<volume suffix>, not one",
                              path=first.parent, fix="give every case exactly one file per modality")
        out.append(found[0])
    return tuple(out)
