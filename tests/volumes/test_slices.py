"""Slices of real volumes (tests/data/nifti) equal nibabel's reading of the same voxels; 2.5-D stacks pad by edge
replication; a label volume cut (empty slices dropped or kept) stitches back voxel-identical, header included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardkit.errors import ConfigError, LabelError
from shardkit.volumes.nifti import read_header, read_voxels, to_nifti
from shardkit.volumes.slices import (
    CutVolume,
    SliceCounts,
    Slicing,
    cut,
    default_axis,
    parse_axis,
    slice_affine,
    stitch_labels,
)
from shardkit.volumes.volume import label_ids

nib = pytest.importorskip("nibabel")

DATA = Path(__file__).resolve().parents[1] / "data" / "nifti"


def test_the_default_axis_is_the_largest_spacing_from_the_header() -> None:
    head = read_header(DATA / "resampled_anat_moved.nii")  # spacing 4 x 4 x 8
    assert head.spacing == (4.0, 4.0, 8.0)
    assert default_axis(head.spacing) == (2, "axis k (2): the largest spacing 8 of (4.0, 4.0, 8.0)")
    assert default_axis((3.0, 1.0, 1.0))[0] == 0
    axis, why = default_axis(read_header(DATA / "anatomical.nii").spacing)  # isotropic 2 mm: the last axis
    assert axis == 2 and why.endswith("the last of equal ones")
    assert Slicing(axis=1).axis_for((4.0, 4.0, 8.0)) == (1, "axis j (1): asked for")


def test_slice_options_are_checked() -> None:
    assert [parse_axis(t) for t in ("auto", None, "i", "J", "2")] == [None, None, 0, 1, 2]
    with pytest.raises(ConfigError, match="--slices 'z'"):
        parse_axis("z")
    with pytest.raises(ConfigError, match="--context -1"):
        Slicing(context=-1)
    with pytest.raises(ConfigError, match="--empty-slices 'some'"):
        Slicing(empty="some")


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_every_slice_of_a_real_volume_equals_nibabels_reading(axis: int) -> None:
    head = read_header(DATA / "anatomical.nii")
    data = read_voxels(head)
    want = np.asanyarray(nib.load(str(DATA / "anatomical.nii")).dataobj)
    counts = SliceCounts()
    slices = list(cut("anat", data[None], None, head.spacing, Slicing(axis=axis), counts))
    assert [s.index for s in slices] == list(range(want.shape[axis]))
    for s in slices:
        assert s.image.dtype == np.int16 and s.image.shape == (*np.delete(want.shape, axis), 1)
        np.testing.assert_array_equal(s.image[..., 0], want.take(s.index, axis=axis))
        assert s.key == f"anat/{'ijk'[axis]}{s.index:04d}" and s.record()["group"] == "anat"
    assert counts.to_json() == {"volumes": 1, "slices": want.shape[axis], "written": want.shape[axis],
                                "dropped_empty": 0}


def test_context_stacks_neighbours_as_bands_modality_major_with_edge_replicate() -> None:
    a = np.asanyarray(nib.load(str(DATA / "reoriented_anat_moved.nii")).dataobj).astype(np.float32)
    b = -a  # a second modality on the same grid
    depth = a.shape[2]
    slices = list(cut("c", np.stack([a, b]), None, (4.0, 4.0, 4.0), Slicing(axis=2, context=2)))
    assert len(slices) == depth
    for s in slices:
        assert s.image.shape == (a.shape[0], a.shape[1], 10) and s.image.dtype == np.float32
        for m, vol in enumerate((a, b)):
            for o in range(-2, 3):
                source = min(max(s.index + o, 0), depth - 1)  # edge slices repeated
                np.testing.assert_array_equal(s.image[..., m * 5 + o + 2], vol[:, :, source])


@pytest.mark.parametrize("empty", ["keep", "drop"])
@pytest.mark.parametrize(("image", "label"), [("anatomical.nii", "anatomical_label.nii.gz"),
                                              ("reoriented_anat_moved.nii", "reoriented_anat_moved_label.nii.gz")])
def test_a_real_label_volume_stitches_back_voxel_identical_with_its_header(tmp_path: Path, empty: str, image: str,
                                                                          label: str) -> None:
    img_head, lab_head = read_header(DATA / image), read_header(DATA / label)
    ids = label_ids(read_voxels(lab_head), lab_head.path)
    counts = SliceCounts()
    slicing = Slicing(empty=empty)
    axis = slicing.axis_for(img_head.spacing)[0]
    cutting = CutVolume("case", axis, ids.shape[axis])
    stored = [(s.index, s.label) for s in cut("case", read_voxels(img_head)[None], ids, img_head.spacing, slicing,
                                              counts, cutting)]
    empties = sum(1 for i in range(ids.shape[axis]) if not ids.take(i, axis=axis).any())
    assert empties > 0  # the real labels have empty slices at the volume's edges
    assert counts.dropped_empty == (empties if empty == "drop" else 0) == len(cutting.dropped)
    assert len(stored) == ids.shape[axis] - counts.dropped_empty
    rebuilt = stitch_labels(ids.shape, axis, stored, cutting.dropped)
    written = tmp_path / label
    nib.save(to_nifti(rebuilt, lab_head.to_json()), str(written))
    original, back = nib.load(str(DATA / label)), nib.load(str(written))
    assert back.get_data_dtype() == original.get_data_dtype()
    np.testing.assert_array_equal(np.asanyarray(back.dataobj), np.asanyarray(original.dataobj))
    np.testing.assert_array_equal(back.affine, original.affine)
    assert back.header.get_zooms() == original.header.get_zooms()
    for field in ("dim", "pixdim", "qform_code", "sform_code", "srow_x", "srow_y", "srow_z", "quatern_b",
                  "quatern_c", "quatern_d", "qoffset_x", "qoffset_y", "qoffset_z", "datatype", "bitpix", "xyzt_units",
                  "descrip", "intent_code", "cal_min", "cal_max"):
        np.testing.assert_array_equal(back.header[field], original.header[field], err_msg=field)


def test_stitching_refuses_a_missing_or_repeated_slice() -> None:
    parts = [(i, np.zeros((2, 3), np.uint8)) for i in range(4)]
    with pytest.raises(LabelError, match=r"slice 2 along axis k is missing \(1 of 4 missing\)"):
        stitch_labels((2, 3, 4), 2, [p for p in parts if p[0] != 2])
    with pytest.raises(LabelError, match=r"slice 1 along axis k is outside 0\.\.3 or repeated"):
        stitch_labels((2, 3, 4), 2, [*parts, parts[1]])
    with pytest.raises(LabelError, match=r"slice 3 along axis k is outside 0\.\.3 or repeated"):
        stitch_labels((2, 3, 4), 2, parts, dropped=[3])  # stored and recorded as dropped
    assert stitch_labels((2, 3, 4), 2, parts[:3], dropped=[3]).shape == (2, 3, 4)


def test_a_slices_affine_maps_its_pixels_to_the_voxels_world_point() -> None:
    affine = nib.load(str(DATA / "reoriented_anat_moved.nii")).affine
    for axis in range(3):
        a = slice_affine(affine, axis, 5)
        voxel = [0, 0, 0]
        voxel[axis] = 5
        rest = [d for d in range(3) if d != axis]
        voxel[rest[0]], voxel[rest[1]] = 3, 7
        np.testing.assert_allclose(a @ [3, 7, 0, 1], affine @ [*voxel, 1])
