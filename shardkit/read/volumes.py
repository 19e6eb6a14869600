"""A converted volume split read back as volumes: each case's label volume stitched from its stored slices with the
record the manifest keeps (``source.volumes``; docs/volumes.md), and written in the label file's own format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..augment.intensity import VolumeNormalize
from ..errors import ConfigError, LabelError
from ..store.groups import volume_case
from ..volumes.files import write_volume
from ..volumes.patches import Patching, stitch_patches
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


#: The presets :func:`normalizer` takes: nnU-Net's pick per modality name (``auto``), or one rule for every band.
PRESETS = ("auto", "ct", "zscore", "none")


def normalizer(dataset: Dataset, preset: str = "auto") -> VolumeNormalize:
    """The split's normalisation preset as a pipeline op (``A.Compose([..., normalizer(ds)])``), from the
    statistics its manifest recorded at convert time (``source.volumes.intensity`` and each case's ``intensity``):
    per modality band, ``ct`` clips to the pooled foreground 0.5/99.5 percentiles and z-scores with the pooled
    foreground mean/std; ``zscore`` uses each sample's case mean/std over its whole volume; ``none`` only casts to
    float32; ``auto`` picks per modality as nnU-Net does from its name (``CT`` → ct, ``noNorm`` → none, else
    zscore). ConfigError for a split without the statistics (converted before they were recorded) or a CT band
    without foreground."""
    if preset not in PRESETS:
        raise ConfigError(f"normalisation preset {preset!r} is not one of {', '.join(PRESETS)}",
                          fix="write auto, ct, zscore or none")
    records = volume_records(dataset)
    report, cases = records.get("intensity"), records["cases"]
    names = list(records["slicing"].get("modalities") or [])
    if not isinstance(report, dict) or not names or any("intensity" not in c for c in cases.values()):
        raise ConfigError(f"{dataset.location} has no intensity statistics in its manifest (converted before "
                          "shardkit recorded them)", fix="convert the volumes again (an unchanged run rewrites "
                                                         "only the manifest) with this shardkit")
    bands = int(dataset.spec.image_channels)
    per = bands // len(names)
    order = sorted(cases)
    at = {case: r for r, case in enumerate(order)}
    rows = np.array([at[volume_case(dataset.key(i))] for i in range(len(dataset))], np.int64)
    shape = (len(order), bands)
    lower, upper = np.full(shape, -np.inf), np.full(shape, np.inf)
    mean, std = np.zeros(shape), np.ones(shape)
    schemes = []
    for m, entry in enumerate(report["modalities"]):
        scheme = entry["scheme"] if preset == "auto" else preset
        band = slice(m * per, (m + 1) * per)
        schemes += [scheme] * per
        if scheme == "ct":
            fg = entry.get("foreground")
            if not fg:
                raise ConfigError(f"modality {entry['name']!r} of {dataset.location} has no foreground voxel "
                                  "(label > 0) in any case: the CT preset has no statistics",
                                  fix="use the zscore preset")
            lower[:, band], upper[:, band] = fg["percentile_00_5"], fg["percentile_99_5"]
            mean[:, band], std[:, band] = fg["mean"], fg["std"]
        elif scheme == "zscore":
            for r, case in enumerate(order):
                mean[r, band] = cases[case]["intensity"]["mean"][m]
                std[r, band] = cases[case]["intensity"]["std"][m]
    return VolumeNormalize(lower, upper, mean, std, rows, schemes)


def stitch_volume(dataset: Dataset, case: str) -> tuple[np.ndarray, dict[str, Any]]:
    """Case ``case``'s label volume rebuilt from its stored slices (every slice read once; those dropped as empty
    are background), and the label volume's record (shape, spacing, affine, type, header) to write it with
    (:func:`write_stitched`). LabelError for a missing, repeated or foreign slice."""
    records = volume_records(dataset)
    cases = records["cases"]
    if case not in cases:
        listed = ", ".join(sorted(cases)[:5])
        raise ConfigError(f"{dataset.location} has no volume {case!r}", fix=f"choose one of its cases ({listed}…)")
    record = cases[case]
    volume = record["label_volume"]
    if "patch" in records["slicing"]:
        return _stitch_patches(dataset, case, record, records["slicing"]), volume
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


def _stitch_patches(dataset: Dataset, case: str, record: dict[str, Any], slicing: dict[str, Any]) -> np.ndarray:
    """Case ``case``'s label volume from its stored 3-D patches (keys ``<case>/p<i>_<j>_<k>``; padding cropped;
    overlapping patches must agree, as patches of one label volume do) and the corners dropped as empty."""
    patching = Patching(tuple(slicing["patch"]), tuple(slicing["stride"]), str(slicing["empty"]))
    prefix = f"{case}/p"
    parts = []
    for i in range(len(dataset)):
        key = dataset.key(i)
        corner = key[len(prefix):].split("_") if key.startswith(prefix) else []
        if len(corner) == 3 and all(c.isdigit() for c in corner):
            _, label = dataset[i]
            if label.ndim != 3:
                raise ConfigError(f"labels of {dataset.location} are read as {label.shape}, not class ids",
                                  fix="open the split with its stored ids (labels='index')")
            parts.append(((int(corner[0]), int(corner[1]), int(corner[2])), np.asarray(label)))
    shape = tuple(record["label_volume"]["shape"])
    return stitch_patches(shape, parts, patching, [tuple(o) for o in record["dropped_empty"]])


def patch_record(dataset: Dataset, index: int) -> dict[str, Any]:
    """Sample ``index`` of a 3-D patch split as its provenance: key, group (its case), volume, corner (``origin``,
    voxels i, j, k), ``size`` (the voxels of the volume it holds; the rest of the stored patch is padding), the
    stored ``shape``, the volume's ``spacing`` and the patch's own voxel-to-world ``affine`` (the volume's,
    translated to the corner) — from its key and its case's record, nothing read from the shards."""
    records = volume_records(dataset)
    slicing = records["slicing"]
    if "patch" not in slicing:
        raise ConfigError(f"{dataset.location} holds slices, not 3-D patches",
                          fix="a slice's provenance is its key <case>/<axis><index> and its case's record")
    key = dataset.key(index)
    case, _, where = key.partition("/")
    corner = where[1:].split("_")
    record = records["cases"].get(case)
    if record is None or where[:1] != "p" or len(corner) != 3 or not all(c.isdigit() for c in corner):
        raise ConfigError(f"sample {index} ({key!r}) of {dataset.location} is no patch of a recorded case",
                          fix="run shardkit verify on the split")
    origin = [int(c) for c in corner]
    volume = record["image"]
    shape = [int(n) for n in volume["shape"]]
    patch = [int(n) for n in slicing["patch"]]
    affine = np.array(volume["affine"], np.float64)
    affine[:3, 3] = affine[:3, :3] @ np.array(origin, np.float64) + affine[:3, 3]
    return {"key": key, "group": case, "volume": case, "origin": origin,
            "size": [min(p, n - o) for p, n, o in zip(patch, shape, origin, strict=True)], "shape": patch,
            "spacing": list(volume["spacing"]), "affine": affine.tolist()}


def write_stitched(dataset: Dataset, case: str, path: Path) -> Path:
    """Write case ``case``'s stitched label volume to ``path`` as its label file was (NIfTI or NRRD, with its
    header): nibabel or pynrrd reading it back gives the original voxels."""
    ids, volume = stitch_volume(dataset, case)
    write_volume(ids, volume, Path(path))
    return Path(path)


def slice_neighbours(dataset: Dataset, index: int, modality: int = 1) -> list[tuple[int, np.ndarray, np.ndarray, str]]:
    """Sample ``index`` of a volume split with its neighbouring slices, to look at (``shardkit show``): one
    ``(slice index, image (H, W), class ids (H, W), where it comes from)`` per slice of its case within
    ``max(context, 1)`` of it, in slice order, for modality ``modality`` (1-based, in the split's band order).

    A neighbour's image is the sample's own context band where it has one, else the neighbouring sample's centre
    band; its ids those of its own sample, or background (0) for a slice dropped as empty (that is what dropped
    means). Slices outside the volume, and neighbours dropped as empty with no context band to show, are left out.
    """
    records = volume_records(dataset)
    if "patch" in records["slicing"]:
        raise ConfigError(f"{dataset.location} holds 3-D patches; show draws a slice with its neighbours",
                          fix="read a patch with ds[i] (D, H, W, bands) and draw its planes yourself, or convert the "
                              "volumes into slices (--slices) to look at them here")
    context = int(records["slicing"]["context"])
    names = list(records["slicing"].get("modalities") or [])
    bands = 2 * context + 1
    i = index % len(dataset)
    case, _, where = dataset.key(i).partition("/")
    record = records["cases"].get(case)
    if record is None or not where[1:].isdigit():
        raise ConfigError(f"sample {i} ({dataset.key(i)!r}) of {dataset.location} is no slice of a recorded case",
                          fix="run shardkit verify on the split")
    image, ids = dataset[i]
    image = np.asarray(image)
    modalities = image.shape[2] // bands if image.ndim == 3 else 1
    if not 1 <= modality <= modalities:
        raise ConfigError(f"--bands {modality}: this split's slices hold {modalities} modalit"
                          f"{'y' if modalities == 1 else 'ies'} ({', '.join(names) or 'unnamed'})",
                          fix=f"choose one modality within 1..{modalities}")
    own = int(where[1:])
    reach = max(context, 1)
    # the case's other samples near this one (slices of a case are stored in order, one sample each)
    near: dict[int, int] = {}
    for j in range(max(0, i - reach), min(len(dataset), i + reach + 1)):
        its_case, _, its = dataset.key(j).partition("/")
        if its_case == case and its[:1] == where[:1] and its[1:].isdigit():
            near[int(its[1:])] = j
    dropped = set(record["dropped_empty"])
    rows = []
    plane = image if image.ndim == 3 else image[:, :, None]
    for offset in range(-reach, reach + 1):
        at = own + offset
        if not 0 <= at < int(record["depth"]):
            continue
        name = f"{case}/{where[0]}{at:04d}"
        if offset == 0:
            rows.append((at, plane[:, :, (modality - 1) * bands + context], np.asarray(ids), f"{name} (sample {i})"))
            continue
        neighbour = dataset[near[at]] if at in near else None
        if neighbour is not None:
            label, source = np.asarray(neighbour[1]), f"sample {near[at]}"
        elif at in dropped:
            label, source = np.zeros_like(np.asarray(ids)), "dropped: empty label"
        else:  # not in this split (a damaged or filtered split): nothing true to draw
            continue
        if abs(offset) <= context:
            band = (modality - 1) * bands + context + offset
            picture, source = plane[:, :, band], f"band {band + 1} of sample {i}; label {source}"
        elif neighbour is not None:
            theirs = np.asarray(neighbour[0])
            picture = (theirs if theirs.ndim == 3 else theirs[:, :, None])[:, :, (modality - 1) * bands + context]
        else:
            continue
        rows.append((at, picture, label, f"{name} ({source})"))
    return rows
