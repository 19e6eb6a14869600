"""``shardkit show`` on a volume split (docs/volumes.md): a slice drawn with its neighbouring slices, from the real
volumes of tests/data/nifti, every row's image and label equal to nibabel's reading of the case."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.read.volumes import slice_neighbours
from shardkit.show import display_bands, render_rows

from .conversion.test_volumes import nnunet_tree
from .conversion.test_volumes_convert import INT16_CASES, volumes_of

nib = pytest.importorskip("nibabel")


def converted(tmp_path: Path, context: int, empty: str = "keep") -> tuple[Path, Path]:
    root, out = tmp_path / "Dataset001", tmp_path / f"out-{empty}"
    if not root.exists():
        nnunet_tree(root, cases=INT16_CASES)
    result = CliRunner().invoke(main, ["convert", str(root), str(out), "--workers", "1", "--context", str(context),
                                       "--empty-slices", empty])
    assert result.exit_code == 0, result.output
    return root, out / "train"


def stored(split: Path, case: str) -> dict[int, int]:
    """Slice index -> sample index of ``case``'s stored slices."""
    ds = shardkit.open(split)
    keys = [ds.key(i) for i in range(len(ds))]
    return {int(k.split("/")[1][1:]): i for i, k in enumerate(keys) if k.startswith(case + "/")}


def check_rows(rows: list, root: Path, case: str, slices: list[int], modality: int = 0) -> None:
    t1, second, lab = volumes_of(root, case)
    assert [r[0] for r in rows] == slices
    for at, image, ids, _ in rows:
        np.testing.assert_array_equal(image, (t1, second)[modality][:, :, at])
        np.testing.assert_array_equal(ids, lab[:, :, at])


@pytest.mark.parametrize("context", [0, 1])
def test_a_slice_comes_with_its_neighbours_exact(tmp_path: Path, context: int) -> None:
    root, split = converted(tmp_path, context)
    ds = shardkit.open(split)
    have = stored(split, "anat")
    middle = next(k for k in sorted(have) if k - 1 in have and k + 1 in have)
    check_rows(slice_neighbours(ds, have[middle]), root, "anat", [middle - 1, middle, middle + 1])
    check_rows(slice_neighbours(ds, have[middle], 2), root, "anat", [middle - 1, middle, middle + 1], modality=1)
    assert len(slice_neighbours(ds, have[0])) == 2  # the first slice has no slice before it
    # empty slices dropped: the label of anat holds one slice (12), its neighbours were dropped (all background)
    root, split = converted(tmp_path, context, "drop")
    ds = shardkit.open(split)
    have = stored(split, "anat")
    assert sorted(have) == [12]
    rows = slice_neighbours(ds, have[12])
    if context:  # their images are in the sample's context bands; their labels background, as dropped says
        check_rows(rows, root, "anat", [11, 12, 13])
        assert all("dropped: empty label" in r[3] and not r[2].any() for r in (rows[0], rows[2]))
    else:  # no band holds them: left out rather than drawn blank
        check_rows(rows, root, "anat", [12])


def test_show_draws_a_volume_slice_with_its_neighbours(tmp_path: Path) -> None:
    root, split = converted(tmp_path, 1)
    have = stored(split, "twin")
    middle = sorted(have)[len(have) // 2]
    out = tmp_path / "slice.png"
    result = CliRunner().invoke(main, ["show", str(split), "--index", str(have[middle]), "-o", str(out)])
    assert result.exit_code == 0, result.output
    bgr = cv2.imread(str(out), cv2.IMREAD_COLOR)
    picture = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    # expected: three rows (slices middle-1, middle, middle+1) from nibabel's reading, stretched alike
    t1, _, lab = volumes_of(root, "twin")
    ds = shardkit.open(split)
    titles = [r[3] for r in slice_neighbours(ds, have[middle])]
    assert titles[1] == f"twin/k{middle:04d} (sample {have[middle]})"
    width = t1.shape[1]
    strip = display_bands(np.concatenate([t1[:, :, middle + o] for o in (-1, 0, 1)], axis=1)[:, :, None])
    expected = render_rows([(np.ascontiguousarray(strip[:, k * width:(k + 1) * width]),
                             np.ascontiguousarray(lab[:, :, middle + o].astype(np.uint8)), titles[k])
                            for k, o in enumerate((-1, 0, 1))], ds.class_names, ds.class_colours)
    np.testing.assert_array_equal(picture, expected)
    one_row = render_rows([(strip[:, :width].copy(), lab[:, :, middle].astype(np.uint8), "x")], ds.class_names)
    assert picture.shape[0] == 3 * one_row.shape[0]


def test_show_of_a_volume_slice_refuses_a_modality_it_does_not_have(tmp_path: Path) -> None:
    _, split = converted(tmp_path, 1)
    for bands, message in (("3", "--bands 3: this split's slices hold 2 modalities (T1, negT1)"),
                           ("1,2,3", "a volume slice is drawn one modality at a time")):
        result = CliRunner().invoke(main, ["show", str(split), "--index", "3", "--bands", bands,
                                           "-o", str(tmp_path / "x.png")])
        lines = [ln for ln in result.output.splitlines() if ln.startswith("Error")]
        assert result.exit_code != 0 and len(lines) == 1 and message in lines[0] and "fix:" in lines[0], \
            result.output
        assert "Traceback" not in result.output and not (tmp_path / "x.png").exists()
