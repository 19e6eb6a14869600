"""--spacing resampling (shardkit.volumes.resample) against MONAI 1.5's ``Spacing`` on the real NIfTI volumes of
tests/data/nifti: the same grid (shape and affine, exactly), images within 4e-3 of MONAI's bilinear result (both in
float32; values up to 30,393, where one float32 step is 0.0039) and of its cubic (``mode=3``) within 0.008, labels
equal to MONAI's nearest wherever the sampling position is not exactly half way between two voxels. At such a tie
MONAI's pick follows the float32 rounding of its normalised grid coordinates (either voxel: no rule); shardkit
rounds half to even — there MONAI's label must be one of the two voxels'."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from shardkit.errors import ConfigError, DecodeError
from shardkit.volumes.files import read_header, read_voxels
from shardkit.volumes.resample import Resampling, linear, nearest, onehot_linear, resample_case
from shardkit.volumes.volume import VolumeHeader, label_ids

pytest.importorskip("nibabel")
torch = pytest.importorskip("torch")
monai = pytest.importorskip("monai")
from monai.data import MetaTensor  # noqa: E402
from monai.transforms import Spacing  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "nifti"
CASES = [("anatomical.nii", "anatomical_label.nii.gz"), ("reoriented_anat_moved.nii",
                                                         "reoriented_anat_moved_label.nii.gz")]
SPACINGS = [(3.0, 2.5, 1.7), (1.0, 1.0, 1.0), (2.9, 3.3, 5.1)]


def _monai(volume: np.ndarray, affine: np.ndarray, spacing: tuple[float, ...], mode: str | int) -> MetaTensor:
    data = MetaTensor(torch.from_numpy(np.asarray(volume, np.float32))[None], affine=torch.tensor(affine))
    return Spacing(pixdim=spacing, mode=mode)(data)


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize(("image", "label"), CASES)
def test_resampling_matches_monai_spacing_on_real_volumes(image: str, label: str, spacing: tuple[float, ...]) -> None:
    head, label_head = read_header(DATA / image), read_header(DATA / label)
    voxels = read_voxels(head)
    ids = label_ids(read_voxels(label_head), label_head.path)
    resampling = Resampling(spacing)  # type: ignore[arg-type]
    images, labels = resample_case(voxels[None], ids, head, resampling)
    assert labels is not None

    want_image = _monai(voxels, head.affine_array(), spacing, "bilinear")
    shape, affine = resampling.grid(head)
    assert tuple(want_image.shape[1:]) == shape == images.shape[1:]
    np.testing.assert_allclose(np.asarray(want_image.affine), affine, atol=1e-9)
    assert resampling.header(head, 1 << 30).spacing == spacing
    np.testing.assert_allclose(images[0], want_image[0].numpy(), rtol=0, atol=4e-3)

    want = _monai(ids, head.affine_array(), spacing, "nearest")[0].numpy()
    assert labels.dtype == ids.dtype and set(np.unique(labels)) <= set(np.unique(ids))
    at = resampling.positions(head)
    tie = [np.isclose(x % 1, 0.5) for x in at]
    ties = tie[0][:, None, None] | tie[1][None, :, None] | tie[2][None, None, :]
    np.testing.assert_array_equal(labels[~ties], want[~ties])  # exactly MONAI's, off the ties
    # at a tie: one of the voxels either rounding picks, axis by axis
    candidates = [nearest(ids, [np.where(t, np.floor(x) + up, x) for x, t, up in zip(at, tie, ups, strict=True)])
                  for ups in itertools.product((0, 1), repeat=3)]
    assert np.any([c == want for c in candidates], axis=0).all()


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize(("image", "label"), CASES)
def test_cubic_matches_monai_spacing_mode_3_on_real_volumes(image: str, label: str, spacing: tuple[float, ...]) -> None:
    """MONAI's ``mode=3`` is scipy's cubic B-spline (``map_coordinates(order=3, mode="nearest")``); shardkit's own
    within 0.008 of it: two float32 steps at these values (up to 30,393, where a step is 0.0039)."""
    head = read_header(DATA / image)
    voxels = read_voxels(head)
    images, _ = resample_case(voxels[None], None, head, Resampling(spacing, image="cubic"))  # type: ignore[arg-type]
    want = _monai(voxels, head.affine_array(), spacing, 3)[0].numpy()
    assert images.shape[1:] == want.shape and images.dtype == np.float32
    np.testing.assert_allclose(images[0], want, rtol=0, atol=0.008)
    assert np.abs(images[0] - _monai(voxels, head.affine_array(), spacing, "bilinear")[0].numpy()).max() > 1


def test_onehot_linear_keeps_the_classes_and_agrees_with_nearest_where_neighbours_agree() -> None:
    head, label_head = read_header(DATA / CASES[0][0]), read_header(DATA / CASES[0][1])
    ids = label_ids(read_voxels(label_head), label_head.path)
    resampling = Resampling((3.0, 2.5, 1.7), "onehot-linear")
    at = resampling.positions(head)
    got = onehot_linear(ids, at)
    assert got.dtype == ids.dtype and set(np.unique(got)) == set(np.unique(ids))
    # where the whole 2x2x2 neighbourhood holds one class, that class
    lows = [np.floor(x).astype(int) for x in at]
    corners = [ids[np.ix_(*[np.minimum(lo + d, n - 1) for lo, d, n in zip(lows, ds, ids.shape, strict=True)])]
               for ds in itertools.product((0, 1), repeat=3)]
    same = np.all([c == corners[0] for c in corners], axis=0)
    np.testing.assert_array_equal(got[same], corners[0][same])
    assert 0 < same.sum() < same.size and not np.array_equal(got, nearest(ids, at))


@pytest.mark.parametrize("text", ["0,1,1", "-1,1,1", "1,1", "a,b,c", "nan,1,1", "inf,1,1"])
def test_nonsense_spacing_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(ConfigError, match="is not three spacings > 0"):
        Resampling.parse(text)


def test_a_resample_beyond_the_voxel_limit_is_refused_from_the_header() -> None:
    head = read_header(DATA / "anatomical.nii")  # 33x41x25 at 2 mm: 0.1 mm would be 641x801x481
    with pytest.raises(DecodeError, match=r"would be 641x801x481 = 246965121 voxels, more than the voxel limit"):
        Resampling((0.1, 0.1, 0.1)).header(head, 1 << 20)


#: Real label volumes (binary) and one with four classes quantised from the real T1 (its intensity quartiles):
#: argmax over more than two classes is not a 0.5 threshold.
LABELS = [DATA / "anatomical_label.nii.gz", DATA / "reoriented_anat_moved_label.nii.gz",
          DATA.parent / "nrrd" / "BallBinary30x30x30.nii.gz", "quartiles"]
#: Two class shares this close are a tie: float32 linear weights round differently in shardkit's separable
#: interpolation and MONAI's ``grid_sample`` (measured: at most one float32 step, 6e-8, near 0.5).
TIE = 1e-6


def _label_volume(which: Path | str) -> tuple[np.ndarray, VolumeHeader]:
    if which == "quartiles":
        head = read_header(DATA / "anatomical.nii")
        voxels = read_voxels(head)
        return np.digitize(voxels, np.percentile(voxels, [25, 50, 75])).astype(np.uint8), head
    head = read_header(Path(which))
    return label_ids(read_voxels(head), head.path), head


@pytest.mark.parametrize("spacing", [*SPACINGS, (0.7, 1.3, 2.2)])
@pytest.mark.parametrize("which", LABELS, ids=["anatomical", "moved", "ball", "quartiles"])
def test_onehot_linear_equals_monai_onehot_spacing_bilinear_argmax(which: Path | str,
                                                                   spacing: tuple[float, ...]) -> None:
    """``--label-interp onehot-linear`` against MONAI composed as its users do: the label one-hot over its classes
    (``AsDiscrete(to_onehot=C)``, channel c = the c-th class id), ``Spacing(pixdim, mode="bilinear")``, then
    ``argmax`` over the channels (the first of equal maxima: the lower class id, shardkit's rule too). Equal at every
    voxel except near-ties, where the two largest class shares differ by less than :data:`TIE` in shardkit's or
    MONAI's result (float32 rounding decides there), and there each one's class is among the other's largest
    shares. Measured over these 16 runs (1.97 M voxels): 27 voxels differ, all at near-ties (1 on the real binary
    labels, 26 on the quartiles), of 64,054 near-ties (64,012 exact: both differences 0)."""
    from monai.transforms import AsDiscrete

    ids, head = _label_volume(which)
    classes = np.unique(ids)
    index = np.searchsorted(classes, ids).astype(np.float32)  # class id -> channel
    onehot = AsDiscrete(to_onehot=len(classes))(MetaTensor(torch.from_numpy(index)[None],
                                                           affine=torch.tensor(head.affine_array())))
    shares_monai = Spacing(pixdim=spacing, mode="bilinear")(onehot).numpy()
    want = classes[shares_monai.argmax(axis=0)]

    resampling = Resampling(spacing, "onehot-linear")  # type: ignore[arg-type]
    at = resampling.positions(head)
    got = onehot_linear(ids, at)
    assert got.shape == want.shape == resampling.grid(head)[0] and got.dtype == ids.dtype

    def gap(shares: np.ndarray) -> np.ndarray:
        top = np.sort(shares, axis=0)
        return top[-1] - top[-2]

    ours_shares = np.stack([linear(ids == c, at) for c in classes])
    ours, theirs = gap(ours_shares), gap(shares_monai)
    differ = got != want
    assert not (differ & (ours >= TIE) & (theirs >= TIE)).any(), "labels differ off the ties"
    # where they differ, each one's class is among the other's largest shares (within TIE): a tie
    pick = np.searchsorted(classes, got)[None], np.searchsorted(classes, want)[None]
    theirs_of_ours = np.take_along_axis(shares_monai, pick[0], 0)[0]
    ours_of_theirs = np.take_along_axis(ours_shares, pick[1], 0)[0]
    assert (shares_monai.max(axis=0) - theirs_of_ours)[differ].max(initial=0) < TIE
    assert (ours_shares.max(axis=0) - ours_of_theirs)[differ].max(initial=0) < TIE
    # the tie rule: the lower class id of the largest shares, in shardkit and (argmax's first maximum) in MONAI,
    # so where both hold the same classes tied exactly they agree
    np.testing.assert_array_equal(got, classes[ours_shares.argmax(axis=0)])
    same_ties = ((ours_shares == ours_shares.max(axis=0)) == (shares_monai == shares_monai.max(axis=0))).all(axis=0)
    exact = same_ties & (ours == 0)
    np.testing.assert_array_equal(got[exact], want[exact])
    near = (ours < TIE) | (theirs < TIE)
    assert (~near).sum() >= 0.5 * near.size  # the comparison is not vacuous: most voxels are no tie
