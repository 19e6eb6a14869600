"""``convert --spacing`` (docs/volumes.md): every case resampled once, said in the run's log, recorded per case in
the manifest (the grid before, the methods), the stored slices those of the resampled volumes, and the label volume
stitched back on the resampled grid with a header nibabel reads as that grid."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.read.volumes import write_stitched
from shardkit.volumes.files import read_header, read_voxels
from shardkit.volumes.resample import Resampling, resample_case
from shardkit.volumes.volume import label_ids

from .test_volumes import nnunet_tree

nib = pytest.importorskip("nibabel")
SPACING = (3.0, 2.5, 1.7)


def convert(root: Path, out: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["convert", str(root), str(out), "--workers", "1", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(("method", "image"), [("nearest", "linear"), ("onehot-linear", "cubic")])
def test_spacing_resamples_once_says_so_and_stitches_back_on_the_new_grid(tmp_path: Path, method: str, image: str,
                                                                          validate_manifest) -> None:
    root, out = nnunet_tree(tmp_path / "d"), tmp_path / "out"
    code, output = convert(root, out, "--spacing", ",".join(map(str, SPACING)), "--label-interp", method,
                           "--image-interp", image)
    assert code == 0, output
    validate_manifest(out / "train")  # the case's "resampling" record in the schema
    assert (f"resampled once to spacing 3x2.5x1.7 (array axes i, j, k; MONAI Spacing's grid): images {image} "
            f"(stored float32), labels {method}") in output
    ds = shardkit.open(out / "train")
    record = ds.manifest.source.extra["volumes"]["cases"]["anat"]
    head = read_header(root / "imagesTr" / "anat_0000.nii")
    assert record["resampling"] == {"spacing": list(SPACING), "image": image, "label": method,
                                    "from": {"shape": list(head.shape), "spacing": list(head.spacing),
                                             "affine": [list(r) for r in head.affine]}}
    resampling = Resampling(SPACING, method, image)
    shape, affine = resampling.grid(head)
    assert record["label_volume"]["shape"] == list(shape) and record["image"]["spacing"] == list(SPACING)
    assert record["image"]["dtype"] == "float32" and record["label_volume"]["dtype"] == "uint16"  # the file's type

    second = read_header(root / "imagesTr" / "anat_0001.nii.gz")
    label_head = read_header(root / "labelsTr" / "anat.nii.gz")
    images = np.stack([read_voxels(head), read_voxels(second)])
    want_images, want_label = resample_case(images, label_ids(read_voxels(label_head), label_head.path), head,
                                            resampling)
    assert want_label is not None
    keys = [ds.key(i) for i in range(len(ds)) if ds.key(i).startswith("anat/")]
    assert len(keys) == shape[0]  # the largest spacing (3 along i) is the slice axis
    for i in range(len(ds)):
        case, _, where = ds.key(i).partition("/")
        if case != "anat":
            continue
        image, label = ds[i]
        index = int(where[1:])
        np.testing.assert_array_equal(image, np.moveaxis(want_images[:, index], 0, -1))
        np.testing.assert_array_equal(label, want_label[index])

    path = write_stitched(ds, "anat", tmp_path / "anat.nii.gz")
    back = nib.load(str(path))
    np.testing.assert_array_equal(np.asanyarray(back.dataobj), want_label)
    np.testing.assert_allclose(back.affine, affine, atol=1e-4)
    np.testing.assert_allclose(back.header.get_zooms(), SPACING, atol=1e-6)


def test_a_spacing_beyond_the_voxel_limit_is_refused_before_decoding(tmp_path: Path) -> None:
    code, output = convert(nnunet_tree(tmp_path / "d"), tmp_path / "out", "--spacing", "0.1,0.1,0.1",
                           "--max-voxels", "1000000")
    assert code != 0 and "resampled to spacing [0.1, 0.1, 0.1] the volume would be" in output, output
    assert "Traceback" not in output and not (tmp_path / "out" / "train").exists()


@pytest.mark.parametrize("text", ["0,1,1", "-2,1,1", "1,1"])
def test_nonsense_spacing_is_a_usage_error(tmp_path: Path, text: str) -> None:
    code, output = convert(nnunet_tree(tmp_path / "d"), tmp_path / "out", "--spacing", text)
    assert code != 0 and f"--spacing {text!r} is not three spacings > 0" in output, output


def test_a_label_method_without_spacing_is_refused_not_ignored(tmp_path: Path) -> None:
    code, output = convert(nnunet_tree(tmp_path / "d"), tmp_path / "out", "--label-interp", "onehot-linear")
    assert code != 0 and "--label-interp onehot-linear chooses how --spacing resamples, and no --spacing" in output
    code, output = convert(nnunet_tree(tmp_path / "e"), tmp_path / "out", "--image-interp", "cubic")
    assert code != 0 and "--image-interp cubic chooses how --spacing resamples, and no --spacing" in output


def test_another_spacing_or_label_method_writes_the_shards_again_and_a_dry_run_says_it(tmp_path: Path) -> None:
    root, out = nnunet_tree(tmp_path / "d"), tmp_path / "out"
    runs = [["--spacing", "3,2.5,1.7"], ["--spacing", "3,2.5,1.8"], ["--spacing", "3,2.5,1.8", "--label-interp",
                                                                      "onehot-linear"]]
    for args in runs:
        code, output = convert(root, out, "--shard-size", "1", *args)
        assert code == 0 and "2 shards planned, 0 reused, 2 to write" in output, output
    code, output = convert(root, out, "--shard-size", "1", *runs[-1])
    assert code == 0 and "nothing changed" in output, output
    code, output = convert(root, tmp_path / "dry", "--dry-run", "--spacing", "1,1,1")
    assert code == 0 and "volumes: resampled once to spacing 1x1x1" in output, output


def test_an_nrrd_label_is_stitched_back_with_its_header_on_the_resampled_grid(tmp_path: Path) -> None:
    """pynrrd's real ball (LPS, NRRD label, NIfTI twin as the image) to spacing 2x1.5x3: the stitched NRRD's sizes
    and space directions are those of the resampled grid, its voxels the nearest resampling, its origin kept."""
    nrrd = pytest.importorskip("nrrd")
    balls = Path(__file__).resolve().parents[1] / "data" / "nrrd"
    root, out = tmp_path / "Dataset002", tmp_path / "out"
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    shutil.copy(balls / "BallBinary30x30x30.nii.gz", root / "imagesTr" / "ball_0000.nii.gz")
    shutil.copy(balls / "BallBinary30x30x30.nrrd", root / "labelsTr" / "ball.nrrd")
    (root / "dataset.json").write_text(json.dumps({"channel_names": {"0": "ct"},
                                                   "labels": {"background": 0, "ball": 1}}))
    label = nrrd.read(str(balls / "BallBinary30x30x30.nrrd"))[0]
    (root / "labelsTr" / "ball.nrrd").unlink()  # ids 0/257 as 0/1, the original header kept
    nrrd.write(str(root / "labelsTr" / "ball.nrrd"), (label > 0).astype(np.uint8),
               {k: v for k, v in nrrd.read_header(str(balls / "BallBinary30x30x30.nrrd")).items()
                if k not in ("type", "encoding", "endian")}, index_order="F")
    code, output = convert(root, out, "--spacing", "2,1.5,3")
    assert code == 0, output
    ds = shardkit.open(out / "train")
    path = write_stitched(ds, "ball", tmp_path / "ball.nrrd")
    back, header = nrrd.read(str(path))
    original = nrrd.read_header(str(balls / "BallBinary30x30x30.nrrd"))
    head = read_header(root / "labelsTr" / "ball.nrrd")
    want = resample_case(np.zeros((1, *head.shape), np.float32), label_ids(read_voxels(head), head.path), head,
                         Resampling((2.0, 1.5, 3.0)))[1]
    assert back.shape == (15, 20, 11) and back.dtype == np.uint8
    np.testing.assert_array_equal(back, want)
    np.testing.assert_allclose(header["space directions"],
                               np.asarray(original["space directions"]) * np.array([[2.0], [1.5], [3.0]]))
    np.testing.assert_allclose(header["space origin"], original["space origin"])
    assert header["space"] == original["space"]
