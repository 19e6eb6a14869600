"""shardkit.labels.raster: COCO RLE and polygons bit-exact with pycocotools on real masks, the overlap and crowd
policies, and the report, on synthetic edge cases."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardkit.labels import raster
from shardkit.labels.raster import Region, Shape, ShapeError, paint

mask_api = pytest.importorskip("pycocotools.mask")
#: pycocotools 2.0.10's Cython calls np.array(..., copy=False) on its RLE objects under numpy 2
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")
DATA = Path(__file__).resolve().parents[1] / "data"


def test_compressed_rle_matches_pycocotools_on_real_masks() -> None:
    """734 real compressed RLE masks (cocoapi's val2014 segmentation results): every pixel as pycocotools."""
    results = json.loads((DATA / "coco-results" / "instances_val2014_fakesegm100_results.json").read_text())
    assert len(results) == 734
    for r in results:
        seg = r["segmentation"]
        h, w = seg["size"]
        got = raster.rle_mask(raster.rle_string_counts(seg["counts"]), h, w)
        np.testing.assert_array_equal(got, mask_api.decode(seg).astype(bool))


def test_uncompressed_rle_matches_pycocotools() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        h, w = (int(v) for v in rng.integers(1, 30, 2))
        m = rng.random((h, w)) < 0.3
        enc = mask_api.encode(np.asfortranarray(m.astype(np.uint8)))
        counts = raster.rle_string_counts(enc["counts"])
        uncompressed = {"size": [h, w], "counts": counts.tolist()}
        ref = mask_api.decode(mask_api.frPyObjects(uncompressed, h, w)).astype(bool)
        np.testing.assert_array_equal(raster.rle_mask(counts.tolist(), h, w), ref)
        np.testing.assert_array_equal(ref, m)


def test_polygons_match_pycocotools_on_real_annotations() -> None:
    """The real polygons of labelme's COCO example: annToMask's union, pixel for pixel."""
    doc = json.loads((DATA / "coco-labelme" / "annotations.json").read_text())
    sizes = {im["id"]: (im["height"], im["width"]) for im in doc["images"]}
    for a in doc["annotations"]:
        h, w = sizes[a["image_id"]]
        ref = mask_api.decode(mask_api.merge(mask_api.frPyObjects(a["segmentation"], h, w))).astype(bool)
        np.testing.assert_array_equal(raster.polygons_mask(a["segmentation"], h, w), ref)


@pytest.mark.parametrize("numba", ["compiled", "numpy"])
def test_polygons_match_pycocotools_on_edge_cases(numba: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Synthetic edge cases: vertices outside the image, on half pixels, repeated, self-crossing polygons; the
    compiled walk (where numba is installed) and the numpy one."""
    if numba == "numpy":
        monkeypatch.setenv("SHARDKIT_NO_NUMBA", "1")
    elif raster.KERNELS.get() is None:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(0)
    for i in range(2000):
        h, w = (int(v) for v in rng.integers(1, 40, 2))
        p = rng.uniform(-5, 45, 2 * int(rng.integers(3, 9)))
        if i % 3 == 0:
            p = np.round(p * 2) / 2
        if i % 5 == 0:
            p[2:4] = p[0:2]
        ref = mask_api.decode(mask_api.frPyObjects([p.tolist()], h, w))[:, :, 0].astype(bool)
        np.testing.assert_array_equal(raster.polygons_mask([p], h, w), ref)


@pytest.mark.parametrize(("counts", "words"), [
    ([3, 4], "sum to 7"), ([10, -1, 3], "negative"), ([5, 5, 5], "sum to 15")])
def test_rle_counts_that_do_not_fit_are_refused(counts: list[int], words: str) -> None:
    with pytest.raises(ShapeError, match=words):
        raster.rle_mask(counts, 3, 4)


def test_rle_string_overflow_and_bad_characters_are_refused() -> None:
    with pytest.raises(ShapeError, match="longer than 7"):
        raster.rle_string_counts("o" * 20)
    with pytest.raises(ShapeError, match="alphabet"):
        raster.rle_string_counts("0\x01")


@pytest.mark.parametrize(("poly", "words"), [
    ([0, 0, float("nan"), 1, 2, 2], "NaN"), ([0, 0, float("inf"), 1, 2, 2], "NaN"),
    ([0, 0, 1e9, 1, 2, 2], "beyond"), ([0, 0, 9e6, 0, 9e6, 9e6, 0, 9e6], "steps long"), ([0, 0, 1], "pairs")])
def test_hostile_polygons_are_refused(poly: list[float], words: str) -> None:
    with pytest.raises(ShapeError, match=words):
        raster.polygons_mask([poly], 10, 10)


def _box(h: int, w: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
    m = np.zeros((h, w), dtype=bool)
    m[y0:y1, x0:x1] = True
    return m


def test_overlap_policies() -> None:
    big = Shape("big", 1, Region.of(_box(6, 6, 0, 6, 0, 6)))
    small = Shape("small", 2, Region.of(_box(6, 6, 2, 4, 2, 4)))
    ids, rep = paint([small, big], 6, 6, np.uint8, overlap="order", crowd="class", background=0, ignore=255)
    assert (ids == 1).all() and rep.lost == ["small"] and rep.painted_over == 4  # later on top: small vanishes
    ids, rep = paint([small, big], 6, 6, np.uint8, overlap="area", crowd="class", background=0, ignore=255)
    assert ids[2, 2] == 2 and ids[0, 0] == 1 and rep.lost == []  # smaller on top
    ids, rep = paint([small, big], 6, 6, np.uint8, overlap="ignore", crowd="class", background=0, ignore=255)
    assert (ids[2:4, 2:4] == 255).all() and ids[0, 0] == 1 and rep.overlap_ignored == 4
    lower = Shape("a", 1, Region.of(_box(6, 6, 0, 3, 0, 3)), z=2)
    upper = Shape("b", 2, Region.of(_box(6, 6, 0, 3, 0, 3)), z=1)
    ids, _ = paint([lower, upper], 6, 6, np.uint8, overlap="z-order", crowd="class", background=0, ignore=255)
    assert ids[0, 0] == 1  # the higher z on top, whatever the file order


def test_crowd_policies_and_report() -> None:
    person = Shape("p", 1, Region.of(_box(5, 5, 0, 2, 0, 5)))
    crowd = Shape("c", 1, Region.of(_box(5, 5, 1, 4, 0, 5)), crowd=True)
    ids, rep = paint([person, crowd], 5, 5, np.uint8, overlap="order", crowd="ignore", background=0, ignore=255)
    assert (ids[1:4] == 255).all() and (ids[0] == 1).all() and rep.crowd_pixels == 15
    ids, _ = paint([person, crowd], 5, 5, np.uint8, overlap="order", crowd="drop", background=0, ignore=255)
    assert (ids[:2] == 1).all() and (ids[2:] == 0).all()
    ids, rep = paint([person, crowd], 5, 5, np.uint8, overlap="order", crowd="class", background=0, ignore=255)
    assert (ids[:4] == 1).all() and rep.unlabelled == 5 and rep.to_json()["unlabelled_share"] == 0.2


def test_rle_holes_are_kept() -> None:
    """A ring as RLE keeps its hole (datumaro#168 fills holes)."""
    ring = _box(7, 7, 1, 6, 1, 6) & ~_box(7, 7, 3, 4, 3, 4)
    enc = mask_api.encode(np.asfortranarray(ring.astype(np.uint8)))
    got = raster.rle_mask(raster.rle_string_counts(enc["counts"]), 7, 7)
    np.testing.assert_array_equal(got, ring)
    ids, _ = paint([Shape("r", 3, Region.of(got))], 7, 7, np.uint8, overlap="order", crowd="class", background=0,
                   ignore=255)
    assert ids[3, 3] == 0 and ids[1, 1] == 3


def test_batch_check_names_the_first_bad_polygon() -> None:
    ok = [np.array([0.0, 0, 10, 0, 10, 10]), np.array([1.0, 1, 2, 2, 3, 1])]
    raster.check_polygons(ok)
    long = np.array([0.0, 0, 9e6, 0, 9e6, 9e6, 0, 9e6])
    with pytest.raises(ShapeError) as info:
        raster.check_polygons([*ok, long, np.array([np.nan, 0, 1, 1, 2, 2])])
    assert info.value.args[1] == 3 and "NaN" in info.value.args[0]  # NaN is checked over the whole file first
    with pytest.raises(ShapeError) as info:
        raster.check_polygons([*ok, long])
    assert info.value.args[1] == 2 and "steps long" in info.value.args[0]
    with pytest.raises(ShapeError, match="steps long"):
        raster.check_polygon(long)
