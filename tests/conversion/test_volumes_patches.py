"""``shardkit convert --patch`` on a real nnU-Net tree (tests/data/nifti): 3-D samples in every format, each equal to
nibabel's reading of its region (padding stated: labels the ignore index, images 0), the label volume stitched back
voxel-identical from overlapping patches, and what cannot take 3-D samples refused in one line, never flattened."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit import augment as A
from shardkit.cli import main
from shardkit.errors import ConfigError
from shardkit.read.volumes import normalizer, patch_record, stitch_volume, write_stitched
from tests.reference.nnunet_normalization import zscore_normalization

from .test_volumes import CASES, nnunet_tree

nib = pytest.importorskip("nibabel")

PATCH = (8, 8, 32)  # stride 6x8x32: overlapping along i; k (25 voxels) shorter than the patch: padded


def convert(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["convert", *args, "--workers", "1"])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nnunet_tree(tmp_path_factory.mktemp("patches") / "Dataset001",
                       cases={"anat": CASES["anat"], "twin": CASES["anat"]})


def _volumes(root: Path, case: str) -> list[np.ndarray]:
    return [np.asanyarray(nib.load(str(p)).dataobj) for p in (
        root / "imagesTr" / f"{case}_0000.nii", root / "imagesTr" / f"{case}_0001.nii.gz",
        root / "labelsTr" / f"{case}.nii.gz")]


@pytest.mark.parametrize("fmt", ["npy", "lmdb", "hdf5", "tfrecord"])
def test_patches_are_3d_samples_equal_to_nibabel_and_stitch_back(tree: Path, tmp_path: Path, fmt: str,
                                                                 validate_manifest: object) -> None:
    out = tmp_path / "out"
    code, output = convert(str(tree), str(out), "--patch", "8x8x32", "--stride", "6x8x32", "--empty-slices",
                           "drop", "--ignore-index", "255", "--format", fmt)
    assert code == 0, output
    assert "3-D patches 8x8x32, stride 6x8x32" in output and "padded at the far end" in output
    assert "more than every foreground class" not in output  # padding is the ignore index by design
    manifest = validate_manifest(out / "train")  # type: ignore[operator]
    assert manifest["sample"]["image"]["shape"] == [8, 8, 32, 2] and manifest["sample"]["image"]["layout"] == "DHWC"
    report = manifest["source"]["volumes"]
    counts = report["patches"]
    ds = shardkit.open(out / "train")
    assert len(ds) == counts["written"] == counts["patches"] - counts["dropped_empty"] > 0
    assert counts["volumes"] == 2 and counts["dropped_empty"] > 0  # the corner patches hold no brain
    for i in range(len(ds)):
        case, _, where = ds.key(i).partition("/")
        origin = tuple(int(v) for v in where[1:].split("_"))
        t1, neg, lab = _volumes(tree, case)
        image, label = ds[i]
        assert image.shape == (*PATCH, 2) and image.dtype == np.int16 and label.shape == PATCH
        region = tuple(slice(o, o + p) for o, p in zip(origin, PATCH, strict=True))
        inside = tuple(slice(0, min(p, n - o)) for o, p, n in zip(origin, PATCH, t1.shape, strict=True))
        for band, vol in enumerate((t1, neg)):
            np.testing.assert_array_equal(image[..., band][inside], vol[region])
        np.testing.assert_array_equal(label[inside], lab[region])
        pad = np.ones(PATCH, bool)
        pad[inside] = False
        assert pad.any() and (label[pad] == 255).all() and (image[pad] == 0).all()  # k: 25 voxels, patch 32
    last = patch_record(ds, len(ds) - 1)  # the provenance VolumePatch.record() gives, from key and manifest
    head = nib.load(str(tree / "imagesTr" / f"{last['volume']}_0000.nii"))
    assert last["shape"] == list(PATCH) and last["size"][2] == 25 and last["group"] == last["volume"]
    assert last["spacing"] == pytest.approx(list(head.header.get_zooms()[:3]))
    np.testing.assert_allclose(np.array(last["affine"]) @ [0, 0, 0, 1], head.affine @ [*last["origin"], 1])
    images, labels = ds.batch([0, len(ds) - 1])
    assert images.shape == (2, *PATCH, 2) and labels.shape == (2, *PATCH)
    np.testing.assert_array_equal(images[1], ds[len(ds) - 1][0])
    for case in ("anat", "twin"):
        ids, _ = stitch_volume(ds, case)
        np.testing.assert_array_equal(ids, _volumes(tree, case)[2])
    written = write_stitched(ds, "anat", tmp_path / "anat.nii.gz")
    back, original = nib.load(str(written)), nib.load(str(tree / "labelsTr" / "anat.nii.gz"))
    np.testing.assert_array_equal(np.asanyarray(back.dataobj), np.asanyarray(original.dataobj))
    np.testing.assert_array_equal(back.affine, original.affine)


@pytest.fixture(scope="module")
def patched(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("patched") / "out"
    code, output = convert(str(tree), str(out), "--patch", "16x16x32", "--ignore-index", "255")
    assert code == 0, output
    return out / "train"


def test_what_takes_2d_samples_refuses_3d_ones_in_one_line(patched: Path) -> None:
    ds = shardkit.open(patched)
    images, labels = ds.batch([0, 1])
    with pytest.raises(ConfigError, match=r"holds 3-D patch samples \(16x16x32 voxels, 2 bands\); augmentation"):
        ds.check_augment(A.parse("hflip"))
    with pytest.raises(ConfigError, match="augment needs"):  # the ops themselves: (H, W, C) only
        A.parse("hflip")(images, labels, [0, 1])
    with pytest.raises(ConfigError, match=r"3-D patch samples .* this reader adapter takes 2-D samples only"):
        from shardkit.read.torch import make_loader

        make_loader(patched, plan=shardkit.EpochPlan(batch_size=2))
    with pytest.raises(ConfigError, match="reader of \\(H, W\\) samples takes 2-D samples only"):
        ds.require_fixed_size()
    result = CliRunner().invoke(main, ["info", str(patched)])
    assert result.exit_code == 0 and "image 16x16x32x2 int16 (3-D patches D x H x W) (2 bands)" in result.output
    result = CliRunner().invoke(main, ["show", str(patched), "--index", "0", "--output", str(patched.parent / "s.png")])
    assert result.exit_code != 0 and "holds 3-D patches; show draws a slice" in result.output
    assert "Traceback" not in result.output
    batches = list(ds.iter_batches(2))  # the plain reader gives 3-D batches
    assert batches[0][0].shape == (2, 16, 16, 32, 2)


def test_patch_options_are_refused_where_they_cannot_hold(tree: Path, tmp_path: Path) -> None:
    code, output = convert(str(tree), str(tmp_path / "a"), "--patch", "16x16x32", "--context", "1")
    assert code != 0 and "--patch stores 3-D patches; --slices and --context are for 2-D slices" in output
    code, output = convert(str(tree), str(tmp_path / "b"), "--patch", "16x16x32")  # k is 25: padding, no ignore id
    assert code != 0 and "Traceback" not in output
    assert "shorter than --patch 16x16x32: its patches would be padded" in output and "--ignore-index" in output
    assert not (tmp_path / "b" / "train" / "manifest.json").exists()
    code, output = convert(str(tree), str(tmp_path / "c"), "--patch", "16x16x16", "--stride", "17x16x16")
    assert code != 0 and "--stride 17x16x16 must be 1..the patch size 16x16x16" in output


def test_patches_on_the_dask_backend_are_byte_identical(tree: Path, tmp_path: Path) -> None:
    """The same 3-D patches cut on a real (loopback) Dask cluster write the local pool's bytes, manifest included."""
    pytest.importorskip("distributed")
    from shardkit.conversion.config import ConvertConfig
    from shardkit.conversion.pipeline import convert as convert_api
    from shardkit.store.records import content_digest

    digests = []
    for backend in ("local", "dask"):
        out = tmp_path / backend
        convert_api(ConvertConfig(tree, out, workers=2, backend=backend, quiet=True, patch="8x8x32", stride="6x8x32",
                                  empty_slices="drop", ignore_index=255))
        digests.append({p.name: content_digest(p) for p in sorted((out / "train").iterdir()) if p.is_file()})
    assert digests[0] == digests[1] and "manifest.json" in digests[0]
    ds = shardkit.open(tmp_path / "dask" / "train")
    ids, _ = stitch_volume(ds, "twin")
    np.testing.assert_array_equal(ids, _volumes(tree, "twin")[2])


def test_3d_patches_are_normalised_outside_the_pipeline_as_nnunet_normalises_their_volume(
        tree: Path, patched: Path) -> None:
    """The split's channels are T1 and negT1: nnU-Net z-scores each case's whole volume; every patch's voxels equal
    that volume's, normalised, on the region the patch holds."""
    ds = shardkit.open(patched)
    op = normalizer(ds)
    assert op.schemes == ("zscore", "zscore")
    picks = [0, len(ds) - 1]
    images, _ = ds.batch(picks)
    with pytest.raises(ConfigError, match="augment"):  # the pipeline stays 2-D
        ds.check_augment(A.Compose([op]))
    got = op.apply(images, picks)
    assert got.shape == images.shape and got.dtype == np.float32
    for k, i in enumerate(picks):
        record = patch_record(ds, i)
        volumes = _volumes(tree, record["volume"])
        region = tuple(slice(o, o + n) for o, n in zip(record["origin"], record["size"], strict=True))
        inside = tuple(slice(0, n) for n in record["size"])
        for band in range(2):
            np.testing.assert_allclose(got[k][..., band][inside], zscore_normalization(volumes[band])[region],
                                       rtol=1e-5, atol=1e-5)
