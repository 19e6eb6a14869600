"""Per-sample statistics: class counts agree with np.bincount whichever counting path is taken; class weights
equal their formulae computed from the label files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardkit.errors import ConfigError
from shardkit.store.stats import WEIGHT_METHODS, ClassFrequencies, Stats, class_counts, class_weights


@pytest.mark.parametrize(("dtype", "high", "num_classes"), [
    (np.uint8, 256, 12),   # OpenCV histogram path, ids past the classes (255 ignore) included
    (np.uint8, 12, 300),   # more classes than uint8 values: padded with zeros
    (np.uint16, 1000, 1000),
])
def test_class_counts_equal_bincount(dtype: type, high: int, num_classes: int) -> None:
    ids = np.random.default_rng(0).integers(0, high, (61, 77)).astype(dtype)
    got = class_counts(ids, num_classes)
    want = np.bincount(ids.ravel(), minlength=num_classes)
    assert got.dtype == np.int64
    assert np.array_equal(got[: len(want)], want) and not got[len(want):].any()


def test_stats_count_ignore_pixels_apart_from_classes() -> None:
    ids = np.full((4, 5), 255, np.uint8)
    ids[0] = [0, 1, 1, 2, 2]
    s = Stats(3)
    present = s.add(np.zeros((4, 5, 3), np.uint8), ids)
    assert present == [0, 1, 2]
    assert s.class_pixels.tolist() == [1, 2, 2] and s.ignore_pixels == 15 and s.pixels == 20


@pytest.mark.parametrize("histogram", [True, False])
def test_channel_sums_and_squares_are_exact(histogram: bool, monkeypatch) -> None:
    from shardkit.store import stats

    if not histogram:
        monkeypatch.setattr(stats, "_HIST_EXACT", 0)  # the np.bincount path of images of 2**24+ pixels
    rng = np.random.default_rng(3)
    s = Stats(4)
    images = [rng.integers(0, 256, (37, 53, 3), dtype=np.uint8) for _ in range(3)]
    images.append(np.full((20, 30, 3), 255, np.uint8)[:, ::2])  # a strided view
    for image in images:
        s.add(image, np.zeros(image.shape[:2], np.uint8))
    wide = [im.astype(np.int64) for im in images]
    assert s.channel_sum.tolist() == sum(w.sum(axis=(0, 1)) for w in wide).tolist()
    assert s.channel_sumsq.tolist() == sum((w * w).sum(axis=(0, 1)) for w in wide).tolist()


# --------------------------------------------------------------------------- class weights


def _label_counts(camvid_root: Path, split: str, num_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Straight from the label PNGs (PIL): pixels per id, and per class the H x W of the images holding it and
    how many images hold it. Independent of shardkit."""
    from PIL import Image

    pixels = np.zeros(256, np.int64)
    image_pixels = np.zeros(num_classes, np.int64)
    images = np.zeros(num_classes, np.int64)
    for path in sorted((camvid_root / f"{split}annot").glob("*.png")):
        ids = np.asarray(Image.open(path))
        counts = np.bincount(ids.ravel(), minlength=256)
        pixels += counts
        present = counts[:num_classes] > 0
        image_pixels[present] += ids.shape[0] * ids.shape[1]
        images[present] += 1
    return pixels, image_pixels, images


def _independent_weights(method: str, pixels: np.ndarray, image_pixels: np.ndarray, num_classes: int,
                         ignore: int) -> np.ndarray:
    """docs/class-imbalance.md's formulae, written out again in plain numpy."""
    counts = pixels[:num_classes].astype(np.float64)
    keep = [c for c in range(num_classes) if c != ignore and counts[c] > 0]
    p = {c: counts[c] / sum(counts[k] for k in keep) for c in keep}
    w = np.zeros(num_classes)
    if method == "median_frequency":
        freq = {c: counts[c] / image_pixels[c] for c in keep}
        med = float(np.median(list(freq.values())))
        for c in keep:
            w[c] = med / freq[c]
    elif method == "inverse":
        for c in keep:
            w[c] = 1.0 / (len(keep) * p[c])
    elif method == "inverse_sqrt":
        s = sum(np.sqrt(v) for v in p.values())
        for c in keep:
            w[c] = 1.0 / (np.sqrt(p[c]) * s)
    else:
        for c in keep:
            w[c] = 1.0 / np.log(1.02 + p[c])
    return w


@pytest.mark.parametrize("method", WEIGHT_METHODS)
def test_class_weights_equal_a_numpy_computation_from_the_label_files(camvid_root: Path, camvid_val_npy: Path,
                                                                      method: str) -> None:
    """CamVid val (26 labels, ignore id 11 inside the class range): every method, from the manifest and the
    sidecars, equals the same formula computed from the label PNGs read with PIL."""
    import shardkit

    ds = shardkit.open(camvid_val_npy)
    assert ds.ignore_index == 11 and ds.num_classes == 12
    pixels, image_pixels, images = _label_counts(camvid_root, "val", 12)
    freqs = ds.class_frequencies()
    assert freqs.class_pixels.tolist() == pixels[:12].tolist()
    assert freqs.image_pixels is not None and freqs.images is not None
    assert freqs.image_pixels.tolist() == image_pixels.tolist() and freqs.images.tolist() == images.tolist()
    got = ds.class_weights(method)
    assert got.dtype == np.float32 and got.shape == (12,)
    assert got[11] == 0.0, "the ignore class weighs nothing"
    np.testing.assert_allclose(got, _independent_weights(method, pixels, image_pixels, 12, 11), rtol=1e-6)


def test_median_frequency_reads_no_label(camvid_val_npy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardkit
    from shardkit.formats.base import ShardReader

    ds = shardkit.open(camvid_val_npy)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a shard was read")

    for name in ("read", "read_batch_into"):
        for reader in ds.readers:
            monkeypatch.setattr(type(reader), name, refuse)
    monkeypatch.setattr(ShardReader, "read", refuse)
    assert ds.class_weights("median_frequency")[0] > 0


def test_a_class_without_pixels_gets_zero_and_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    freqs = ClassFrequencies(np.array([100, 0, 300, 50]), 4, np.array([400, 0, 800, 400]), np.array([1, 0, 2, 1]),
                             ignore_index=3)
    with caplog.at_level("WARNING", logger="shardkit.store.stats"):
        w = class_weights("median_frequency", freqs)
    assert w[1] == 0 and w[3] == 0 and "class(es) 1 have no pixels" in caplog.text
    # freq = 100/400, 300/800 → median 0.3125 (of the two classes that get a weight)
    np.testing.assert_allclose(w, [0.3125 / 0.25, 0, 0.3125 / 0.375, 0], rtol=1e-6)
    np.testing.assert_allclose(class_weights("enet", freqs), [1 / np.log(1.02 + 0.25), 0, 1 / np.log(1.02 + 0.75),
                                                              0], rtol=1e-6)


def test_inverse_weights_have_a_pixel_weighted_mean_of_one() -> None:
    counts = np.array([5000, 300, 20, 0, 7])
    freqs = ClassFrequencies(counts, 10, ignore_index=255)  # an ignore id past the classes: no class dropped
    p = counts / counts.sum()
    for method in ("inverse", "inverse_sqrt"):
        assert float((p * class_weights(method, freqs)).sum()) == pytest.approx(1.0, rel=1e-6)


def test_median_frequency_needs_the_bitmap_and_other_methods_do_not() -> None:
    freqs = ClassFrequencies(np.arange(1, 301), 5)  # 300 classes: sidecars keep no bitmap
    with pytest.raises(ConfigError, match="median_frequency needs the per-sample class bitmap"):
        class_weights("median_frequency", freqs)
    assert class_weights("enet", freqs).shape == (300,)
    with pytest.raises(ConfigError, match="not one of"):
        class_weights("median", freqs)


def test_info_class_weights_json_and_text(camvid_val_npy: Path) -> None:
    from click.testing import CliRunner

    import shardkit
    from shardkit.cli import main

    want = shardkit.open(camvid_val_npy).class_weights("median_frequency")
    run = CliRunner().invoke(main, ["info", str(camvid_val_npy), "--class-weights", "median_frequency", "--json"])
    assert run.exit_code == 0, run.output
    data = json.loads(run.output)
    assert data["method"] == "median_frequency" and np.array_equal(np.float32(data["weights"]), want)
    assert [r["name"] for r in data["classes"]][:2] == ["Sky", "Building"]
    text = CliRunner().invoke(main, ["info", str(camvid_val_npy), "--class-weights", "enet"])
    assert text.exit_code == 0 and "class weights enet (k=1.02)" in text.output and "Bicyclist" in text.output


def test_class_weights_of_a_remote_split_download_only_sidecars(camvid_val_npy: Path, tmp_path: Path) -> None:
    """A split on object storage (a local S3 server): the same weights, and no shard file is downloaded: only the
    samples sidecars, through the shard cache (its lock, admission and verified download)."""
    from click.testing import CliRunner

    import shardkit
    from shardkit.cli import main
    from shardkit.files.storage import Remote
    from shardkit.testing import local_s3, make_bucket

    want = shardkit.open(camvid_val_npy).class_weights("median_frequency")
    with local_s3():
        make_bucket("weights")
        remote = Remote("s3://weights/val")
        for p in camvid_val_npy.iterdir():
            if p.is_file() and not p.name.startswith("."):
                remote.upload(p, p.name)
        ds = shardkit.open("s3://weights/val", cache_dir=tmp_path / "cache")
        assert np.array_equal(ds.class_weights("median_frequency"), want)
        sidecars = sum(p.stat().st_size for p in camvid_val_npy.glob("samples-*.npy"))
        assert sidecars > 0
        assert ds.cache is not None and ds.cache.downloads == 0 and ds.cache.cached_bytes() == sidecars
        run = CliRunner().invoke(main, ["info", "s3://weights/val", "--class-weights", "median_frequency", "--json"])
        assert run.exit_code == 0, run.output
        assert np.array_equal(np.float32(json.loads(run.output)["weights"]), want)


def test_median_frequency_refuses_zeroed_bitmaps_instead_of_infinite_weights(camvid_val_npy: Path,
                                                                            tmp_path: Path) -> None:
    """Zeroed class bitmaps (sidecar hashes refreshed) gave every class 0 image pixels and an infinite weight; the
    bitmaps contradict the manifest's class pixel counts, which is said in one line with the fix."""
    import shutil

    import shardkit
    from shardkit.errors import IntegrityError
    from tests.tamper import rewrite_sidecars, zero_class_bitmaps

    split = Path(shutil.copytree(camvid_val_npy, tmp_path / "val"))
    rewrite_sidecars(split, zero_class_bitmaps)
    ds = shardkit.open(split)
    with pytest.raises(IntegrityError, match="have pixels but no sample's bitmap holds them") as err:
        ds.class_weights("median_frequency")
    assert "\n" not in str(err.value) and "enet" in str(err.value)
    assert np.isfinite(ds.class_weights("enet")).all()  # the methods that need no bitmap still work
