"""3-D patches of real volumes (tests/data/nifti) equal nibabel's reading of the same region; the grid covers every
voxel; a label volume cut with overlap and empty patches dropped stitches back voxel-identical."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardkit.errors import ConfigError, LabelError
from shardkit.volumes.nifti import read_header, read_voxels, to_nifti
from shardkit.volumes.patches import PatchedVolume, Patching, cut_patches, parse_triple, stitch_patches
from shardkit.volumes.slices import SliceCounts
from shardkit.volumes.volume import label_ids

nib = pytest.importorskip("nibabel")

DATA = Path(__file__).resolve().parents[1] / "data" / "nifti"


def test_patch_options_are_checked() -> None:
    assert parse_triple("16x32x8", "--patch") == (16, 32, 8) and parse_triple(None, "--patch") is None
    with pytest.raises(ConfigError, match="--patch '16x32' is not DxHxW"):
        Patching.parse("16x32")
    with pytest.raises(ConfigError, match=r"--stride 17x8x8 must be 1..the patch size 16x8x8"):
        Patching.parse("16x8x8", "17x8x8")
    with pytest.raises(ConfigError, match="--patch 0x8x8 must be at least 1x1x1"):
        Patching.parse("0x8x8")
    with pytest.raises(ConfigError, match=r"gives 4165681 patches of a 2048x2048x8 volume, more than 1048576"):
        Patching.parse("8x8x8", "1x1x1").origins((2048, 2048, 8))


def test_every_patch_of_a_real_volume_equals_nibabels_region_and_the_grid_covers_it() -> None:
    want = np.asanyarray(nib.load(str(DATA / "anatomical.nii")).dataobj)  # 33 x 41 x 25, int16 big-endian
    head = read_header(DATA / "anatomical.nii")
    patching = Patching.parse("16x16x16", "12x16x10")
    counts = SliceCounts()
    patches = list(cut_patches("anat", read_voxels(head)[None], None, patching, counts=counts))
    starts = [sorted({p.origin[a] for p in patches}) for a in range(3)]
    assert starts == [[0, 12, 17], [0, 16, 25], [0, 9]]  # stride steps, then the last aligned to the edge
    covered = np.zeros(want.shape, bool)
    for p in patches:
        region = tuple(slice(o, o + 16) for o in p.origin)
        assert p.image.shape == (16, 16, 16, 1) and p.image.dtype == np.int16
        np.testing.assert_array_equal(p.image[..., 0], want[region])
        covered[region] = True
        assert p.key == f"anat/p{p.origin[0]}_{p.origin[1]}_{p.origin[2]}" and p.record()["group"] == "anat"
    assert covered.all()
    assert counts.volumes == 1 and counts.slices == counts.written == len(patches) == 3 * 3 * 2
    assert [p.origin for p in patches] == sorted(p.origin for p in patches)  # C order of the corners


def test_a_volume_smaller_than_the_patch_gives_patches_of_its_own_extent() -> None:
    data = read_voxels(read_header(DATA / "resampled_anat_moved.nii"))  # 17 x 21 x 3
    patches = list(cut_patches("r", data[None], None, Patching((8, 8, 8))))
    assert {p.image.shape for p in patches} == {(8, 8, 3, 1)} and len(patches) == 3 * 3


@pytest.mark.parametrize(("size", "stride"), [("8x8x8", None), ("8x8x6", "4x6x5")])
def test_a_real_label_volume_stitches_back_from_overlapping_patches_empties_dropped(tmp_path: Path, size: str,
                                                                                    stride: str | None) -> None:
    lab_head = read_header(DATA / "anatomical_label.nii.gz")
    ids = label_ids(read_voxels(lab_head), lab_head.path)
    image = read_voxels(read_header(DATA / "anatomical.nii"))
    patching = Patching.parse(size, stride, empty="drop")
    cutting = PatchedVolume("anat", lab_head.shape)
    stored = [(p.origin, p.label) for p in cut_patches("anat", image[None], ids, patching, cutting=cutting)]
    assert cutting.dropped, "the real label (one slice, k = 12) leaves patches empty"
    rebuilt = stitch_patches(lab_head.shape, stored, patching, cutting.dropped)
    nib.save(to_nifti(rebuilt, lab_head.to_json()), str(tmp_path / "back.nii.gz"))
    back, original = nib.load(str(tmp_path / "back.nii.gz")), nib.load(str(DATA / "anatomical_label.nii.gz"))
    np.testing.assert_array_equal(np.asanyarray(back.dataobj), np.asanyarray(original.dataobj))
    np.testing.assert_array_equal(back.affine, original.affine)
    assert back.get_data_dtype() == original.get_data_dtype()


def test_stitching_patches_refuses_a_missing_foreign_or_disagreeing_patch() -> None:
    patching = Patching((2, 2, 2), (1, 2, 2))
    ids = np.arange(3 * 2 * 2).reshape(3, 2, 2)
    parts = [((i, 0, 0), ids[i: i + 2]) for i in (0, 1)]
    np.testing.assert_array_equal(stitch_patches((3, 2, 2), parts, patching), ids)
    with pytest.raises(LabelError, match=r"patch at \(1, 0, 0\) is missing \(1 of 2 missing\)"):
        stitch_patches((3, 2, 2), parts[:1], patching)
    with pytest.raises(LabelError, match=r"patch at \(2, 0, 0\) is not on the grid of 3x2x2"):
        stitch_patches((3, 2, 2), [*parts, ((2, 0, 0), ids[1:3])], patching)
    with pytest.raises(LabelError, match=r"patch at \(1, 0, 0\) disagrees with an overlapping patch"):
        stitch_patches((3, 2, 2), [parts[0], ((1, 0, 0), ids[1:3] + 1)], patching)


def test_a_patchs_affine_maps_its_first_voxel_to_its_corners_world_point() -> None:
    img = nib.load(str(DATA / "reoriented_anat_moved.nii"))
    data = np.asanyarray(img.dataobj)
    for p in cut_patches("m", data[None], None, Patching((8, 8, 8)), img.affine):
        assert p.affine is not None
        np.testing.assert_allclose(np.array(p.affine) @ [1, 2, 3, 1], img.affine @ [*np.add(p.origin, [1, 2, 3]), 1])
