"""A converted volume split read back as volumes: each case's label volume stitched from its stored slices with the
record the manifest keeps (``source.volumes``; docs/volumes.md), and written in the label file's own format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, LabelError
from ..store.groups import volume_case
from ..volumes.files import write_volume
from ..volumes.slices import AXES, stitch_labels
from .dataset import Dataset


def volume_records(dataset: Dataset) -> dict[str, Any]:
    """The split's ``source.volumes`` (slicing, counts, one record per case); ConfigError for a split that was
    not converted from volumes."""
    found = dataset.manifest.source.extra.get("volumes")
    if not isinstance(found, dict) or not isinstance(found.get("cases"), dict):
        raise ConfigError(f"{dataset.location} was not converted from volumes (its manifest has no source.volumes)",
                          fix="open a split converted from an nnU-Net/MSD or per-case-folder volume tree")
    return found


def groups(dataset: Dataset) -> list[str]:
    """Each sample's group: the case (patient) its slice was cut from — its key's part before the ``/`` — so that
    splits, duplicates and samplers can keep a case's slices together."""
    volume_records(dataset)
    return [volume_case(dataset.key(i)) for i in range(len(dataset))]


def stitch_volume(dataset: Dataset, case: str) -> tuple[np.ndarray, dict[str, Any]]:
    """Case ``case``'s label volume rebuilt from its stored slices (every slice read once; those dropped as empty
    are background), and the label volume's record (shape, spacing, affine, type, header) to write it with
    (:func:`write_stitched`). LabelError for a missing, repeated or foreign slice."""
    cases = volume_records(dataset)["cases"]
    if case not in cases:
        listed = ", ".join(sorted(cases)[:5])
        raise ConfigError(f"{dataset.location} has no volume {case!r}", fix=f"choose one of its cases ({listed}…)")
    record = cases[case]
    volume = record["label_volume"]
    axis = int(record["axis"])
    prefix = f"{case}/{AXES[axis]}"
    parts = []
    for i in range(len(dataset)):
        key = dataset.key(i)
        if key.startswith(prefix) and key[len(prefix):].isdigit():
            _, label = dataset[i]
            if label.ndim != 2:
                raise ConfigError(f"labels of {dataset.location} are read as {label.shape}, not class ids",
                                  fix="open the split with its stored ids (labels='index')")
            parts.append((int(key[len(prefix):]), np.asarray(label)))
    if not parts and len(record["dropped_empty"]) != record["depth"]:
        raise LabelError(f"no stored slice of {case!r} in {dataset.location}")
    ids = stitch_labels(tuple(volume["shape"]), axis, parts, record["dropped_empty"])
    return ids, volume


def write_stitched(dataset: Dataset, case: str, path: Path) -> Path:
    """Write case ``case``'s stitched label volume to ``path`` as its label file was (NIfTI or NRRD, with its
    header): nibabel or pynrrd reading it back gives the original voxels."""
    ids, volume = stitch_volume(dataset, case)
    write_volume(ids, volume, Path(path))
    return Path(path)
