"""The volume normalisation presets end to end: a real nnU-Net tree converted (tests/data/nifti), its manifest's
statistics, and ``normalizer(ds)`` on the numpy, torch and TensorFlow backends equal to nnU-Net's CTNormalization and
ZScoreNormalization (restated in tests/reference/nnunet_normalization.py) of the whole volumes, slice for slice."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit import augment as A
from shardkit.cli import main
from shardkit.errors import ConfigError
from shardkit.read.volumes import normalizer
from tests.conversion.test_volumes import CASES, nnunet_tree
from tests.reference.nnunet_normalization import (
    collect_foreground_intensities,
    ct_normalization,
    pooled_properties,
    zscore_normalization,
)

nib = pytest.importorskip("nibabel")


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, tf: object) -> tuple[Path, Path]:
    """Two int16 cases (nibabel's T1, and it again scaled), channels named CT and T1 (nnU-Net: CT, then z-score)."""
    tmp = tmp_path_factory.mktemp("norm")
    root = nnunet_tree(tmp / "Dataset001", cases={"anat": CASES["anat"], "twin": CASES["anat"]})
    meta = json.loads((root / "dataset.json").read_text())
    meta["channel_names"] = {"0": "CT", "1": "T1"}
    (root / "dataset.json").write_text(json.dumps(meta))
    scan = root / "imagesTr" / "twin_0001.nii.gz"  # the twin's T1: another scale and offset (its own mean, std)
    img = nib.load(str(scan))
    nib.save(type(img)((np.asanyarray(img.dataobj).astype(np.int16) * 2 + 100).astype(np.int16), img.affine,
                       img.header), str(scan))
    twin = root / "labelsTr" / "twin.nii.gz"  # the twin's label: only its first half, so the cases differ
    img = nib.load(str(twin))
    data = np.asanyarray(img.dataobj).copy()
    data[data.shape[0] // 2:] = 0
    nib.save(type(img)(data, img.affine, img.header), str(twin))
    out = tmp / "out"
    result = CliRunner().invoke(main, ["convert", str(root), str(out), "--workers", "1", "--context", "1"])
    assert result.exit_code == 0, result.output
    return root, out / "train"


def _volumes(root: Path, case: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(np.asanyarray(nib.load(str(p)).dataobj) for p in (  # type: ignore[return-value]
        root / "imagesTr" / f"{case}_0000.nii", root / "imagesTr" / f"{case}_0001.nii.gz",
        root / "labelsTr" / f"{case}.nii.gz"))


def test_the_manifest_holds_nnunets_foreground_properties(converted: tuple[Path, Path],
                                                          validate_manifest: object) -> None:
    root, split = converted
    report = validate_manifest(split)["source"]["volumes"]  # type: ignore[operator]
    modalities = report["intensity"]["modalities"]
    assert [(m["name"], m["scheme"]) for m in modalities] == [("CT", "ct"), ("T1", "zscore")]
    draws: list[list[np.ndarray]] = [[], []]
    for case in ("anat", "twin"):
        ct, t1, lab = _volumes(root, case)
        # nibabel decodes Fortran-ordered: the draws run over Fortran order, C order of the transposed arrays
        assert lab.flags.f_contiguous
        for m, d in enumerate(collect_foreground_intensities(lab.T[None], np.stack([ct.T, t1.T]))):
            draws[m].append(d)
        record = report["cases"][case]["intensity"]
        assert record["mean"][1] == pytest.approx(float(t1.astype(np.float64).mean()), rel=1e-12)
        assert record["std"][1] == pytest.approx(float(t1.astype(np.float64).std()), rel=1e-9)
    for m in range(2):
        want = pooled_properties(draws[m])
        for key, value in want.items():
            assert modalities[m]["foreground"][key] == pytest.approx(value, rel=1e-12, abs=1e-9), key


def _expected(root: Path, key: str, properties: dict[str, float]) -> np.ndarray:
    case, _, where = key.partition("/")
    index = int(where[1:])
    ct, t1, _ = _volumes(root, case)
    normed = [ct_normalization(ct, properties), zscore_normalization(t1)]  # nnU-Net: the whole volume at once
    last = ct.shape[2] - 1
    return np.stack([vol[:, :, min(max(index + o, 0), last)] for vol in normed for o in (-1, 0, 1)], axis=-1)


def test_auto_preset_equals_nnunet_on_every_backend(converted: tuple[Path, Path], tf: object) -> None:
    import torch

    from shardkit.augment import tf as tf_backend
    from shardkit.augment import torch as torch_backend

    root, split = converted
    ds = shardkit.open(split)
    op = normalizer(ds)
    assert op.schemes == ("ct",) * 3 + ("zscore",) * 3
    aug = A.Compose([op])
    properties = ds.manifest.source.extra["volumes"]["intensity"]["modalities"][0]["foreground"]
    picks = [0, 5, len(ds) // 2, len(ds) - 1]  # both cases: each z-scored with its own statistics
    images, labels = ds.batch(np.array(picks))
    assert images.dtype == np.int16  # stored as decoded
    got, _ = aug(images, labels, picks)
    on_torch, _ = torch_backend.apply_batch(aug, torch.from_numpy(images), torch.from_numpy(labels), picks,
                                            seed=0, epoch=0, ignore_index=255)
    on_tf, _ = tf_backend.apply_batch(aug, images, labels, picks)
    assert {ds.key(i).partition("/")[0] for i in picks} == {"anat", "twin"}
    for k, i in enumerate(picks):
        want = _expected(root, ds.key(i), properties)
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(on_torch.numpy(), got, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(on_tf.numpy(), got, rtol=1e-6, atol=1e-6)


def test_presets_for_every_band_and_their_refusals(converted: tuple[Path, Path]) -> None:
    _, split = converted
    ds = shardkit.open(split)
    i = len(ds) - 1
    images, labels = ds.batch(np.array([i]))
    ct = normalizer(ds, "ct")
    properties = ds.manifest.source.extra["volumes"]["intensity"]["modalities"]
    got, _ = A.Compose([ct])(images, labels, [i])
    t1_props = properties[1]["foreground"]
    want = ct_normalization(images[0][..., 3:], t1_props)
    np.testing.assert_allclose(got[0][..., 3:], want, rtol=1e-6, atol=1e-6)
    none, _ = A.Compose([normalizer(ds, "none")])(images, labels, [i])
    np.testing.assert_array_equal(none, images.astype(np.float32))
    with pytest.raises(ConfigError, match="preset 'minmax' is not one of auto, ct, zscore, none"):
        normalizer(ds, "minmax")
    with pytest.raises(ConfigError, match="statistics for 6 bands, the images 3"):
        A.Compose([ct])(images[..., :3], labels, [i])
    with pytest.raises(ConfigError, match="a pipeline takes one Normalize"):
        A.Compose([A.Normalize([0.0] * 6, [1.0] * 6), ct])
