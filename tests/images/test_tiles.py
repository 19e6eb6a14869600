"""Tiling: the grid, convert --tile on real CamVid images, provenance, stitching, windowed TIFF reads."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile

import shardkit
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import ConvertSummary, convert
from shardkit.errors import ConfigError, DecodeError, DuplicateError, ShardFormatError
from shardkit.files.samples import SidecarBuilder, read_sidecar
from shardkit.files.splitfiles import ShardFile, ShardInfo
from shardkit.images.tiles import (
    Tile,
    TiledTiff,
    Tiling,
    by_source,
    coverage,
    grid_starts,
    owned_box,
    stitch,
    stitch_split,
)
from shardkit.verify import published_digests, verify_split

ROOT = Path(__file__).resolve().parents[2]
#: CamVid SegNet images are 360x480: 400 rows > 360 (padded, one tile row), 176 wide with stride 150 gives
#: starts 0, 150, 300 and the edge-aligned 304 (overlaps of 26 and 146 pixels)
TILE, STRIDE = (400, 176), (400, 150)
CAMVID_IGNORE = 11  # the SegNet layout's built-in table: 11 classes, 11 = unlabelled


# -- the grid ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,t,s", [(360, 128, 100), (480, 176, 150), (100, 100, 7), (99, 100, 50), (1, 5, 1),
                                   (1000, 512, 384), (513, 512, 512), (30000, 512, 384)])
def test_grid_covers_every_pixel_and_ends_at_the_edge(n: int, t: int, s: int) -> None:
    starts = grid_starts(n, t, s)
    assert starts == sorted(set(starts)) and starts[0] == 0
    if n <= t:
        assert starts == [0]
    else:
        assert starts[-1] == n - t  # the last tile aligned to the edge, never past it
        assert all(b - a <= s for a, b in itertools.pairwise(starts))  # no gap wider than the stride
    cover = np.zeros(n, int)
    for a in starts:
        cover[a : a + t] += 1
    assert cover.min() >= 1


def test_coverage_and_order_of_a_2d_grid() -> None:
    tiling = Tiling.from_options("128x160", overlap="28x40")
    assert tiling is not None and tiling.stride == (100, 120)
    windows = tiling.windows((360, 480))
    assert windows == sorted(windows)  # row-major: y, then x
    assert len(windows) == tiling.count((360, 480)) == 16
    assert coverage((360, 480), tiling).min() == 1
    small = Tiling.from_options("512")
    assert small is not None and small.windows((300, 700)) == [(0, 0, 300, 512), (0, 188, 300, 512)]


@pytest.mark.parametrize("kwargs,message", [
    ({"tile": "64", "stride": "65"}, "larger stride would leave pixels uncovered"),
    ({"tile": "64", "stride": "32", "overlap": "8"}, "both given"),
    ({"tile": "64", "overlap": "64"}, "smaller than --tile"),
    ({"stride": "32"}, "needs --tile"),
    ({"tile": "64", "drop_ignored": "1.5"}, r"must be in \(0, 1\]"),
    ({"tile": "0x5"}, "at least 1x1"),
    ({"tile": "axb"}, "not HEIGHTxWIDTH"),
])
def test_bad_tiling_options_are_one_line_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Tiling.from_options(kwargs.pop("tile", None), **kwargs)


def test_tiling_does_not_combine_with_size_or_dropped_tiles_with_duplicate_checks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--size/--resize"):
        ConvertConfig(tmp_path / "in", tmp_path / "out", tile="64", size="32x32")
    with pytest.raises(ConfigError, match="--drop-tiles-ignored leaves some tiles unstored"):
        ConvertConfig(tmp_path / "in", tmp_path / "out", tile="64", on_duplicate="skip", drop_tiles_ignored=0.9)
    assert ConvertConfig(tmp_path / "in", tmp_path / "out", tile="64", on_duplicate="error").on_duplicate == "error"
    with pytest.raises(ConfigError, match="more than --max-pixels"):
        ConvertConfig(tmp_path / "in", tmp_path / "out", tile="64", max_pixels=1000)
    cfg = ConvertConfig(tmp_path / "in", tmp_path / "out", tile="64x32", overlap="16x0")
    assert (cfg.tile, cfg.stride, cfg.overlap) == ((64, 32), (48, 32), None)
    plain = ConvertConfig(tmp_path / "in", tmp_path / "out")
    assert "tile" not in plain.preprocessing()  # untiled manifests and fingerprints stay as they were


@pytest.mark.parametrize("hw,tile,stride", [((360, 480), (128, 160), (100, 120)), ((411, 634), (128, 160), (96, 100)),
                                            ((100, 300), (128, 160), (128, 7)), ((7, 5), (8, 8), (8, 8)),
                                            ((1000, 513), (512, 512), (384, 1))])
def test_owned_boxes_partition_each_source(hw: tuple[int, int], tile: tuple[int, int],
                                           stride: tuple[int, int]) -> None:
    """Every source pixel lies in exactly one tile's owned box (the part no earlier tile covers); no box holds
    padding. The band statistics of a tiled split are summed over these boxes."""
    tiling = Tiling(tile, stride)
    count = np.zeros(hw, np.int32)
    for y, x, h, w in tiling.windows(hw):
        y0, y1, x0, x1 = owned_box(Tile("k", y, x, h, w, *hw), tiling)
        assert 0 <= y0 <= y1 <= h and 0 <= x0 <= x1 <= w  # inside the source region: never padding
        count[y + y0 : y + y1, x + x0 : x + x1] += 1
    assert count.min() == 1 and count.max() == 1
    with pytest.raises(ValueError, match="not on the"):
        owned_box(Tile("k", 1, 0, min(tile[0], hw[0]), min(tile[1], hw[1]), *hw), tiling)


def test_tiled_band_statistics_count_each_real_pixel_once(tmp_path: Path) -> None:
    """Real 4-band uint16 rasters (tests/data/geotiff) tiled with overlaps, one source shorter than a tile (padded):
    the manifest's band mean, std, min and max are numpy's over the sources' pixels, each once, for 1 or 2
    workers alike (they used to count overlaps once per tile and the padding's zeros)."""
    with tifffile.TiffFile(ROOT / "tests" / "data" / "geotiff" / "RGBA.uint16.tif") as tif:
        real = tif.pages[0].asarray()
    sources = {"whole": real, "strip": real[200:300, 17:450], "inner": real[50:350, 20:530]}
    root = tmp_path / "in"
    (root / "img").mkdir(parents=True)
    (root / "lab").mkdir()
    for name, img in sources.items():
        tifffile.imwrite(root / "img" / f"{name}.tif", img, photometric="minisblack", planarconfig="contig",
                         compression="zlib")
        ids = (img[:, :, 0] > np.median(img[:, :, 0])).astype(np.uint8)
        ids[img[:, :, 3] == 0] = 255
        cv2.imwrite(str(root / "lab" / f"{name}.png"), ids)
    stats = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        convert(ConvertConfig(root, out, images="img/{name}.tif", labels="lab/{name}.png", num_classes=2,
                              ignore_index=255, tile="128x160", stride="96x100", workers=workers, shard_size=1,
                              quiet=True))
        manifest = json.loads(next(out.glob("*/manifest.json")).read_text())
        assert manifest["source"]["tiles"]["written"] > 3 * len(sources)  # overlapping tiles, one padded row
        stats.append(manifest["stats"])
    assert stats[0] == stats[1]  # the same numbers for any worker count
    pixels = np.concatenate([img.reshape(-1, 4).astype(np.float64) for img in sources.values()])
    got = stats[0]
    assert got["image_min"] == pixels.min(0).tolist() and got["image_max"] == pixels.max(0).tolist()
    assert np.allclose(got["image_mean"], pixels.mean(0), rtol=0, atol=1e-6)
    assert np.allclose(got["image_std"], pixels.std(0), rtol=0, atol=1e-6)


def test_duplicate_sources_are_found_by_their_tiles(tmp_path: Path) -> None:
    """--on-duplicate with --tile compares whole sources: a real uint16 raster saved again as .npy is a duplicate
    (warn: reported; error: refused; skip: its tiles left out, recorded, and a re-run reuses every shard); the
    same raster with one pixel changed, or cut differently, is not."""
    with tifffile.TiffFile(ROOT / "tests" / "data" / "geotiff" / "RGBA.uint16.tif") as tif:
        real = tif.pages[0].asarray()[:200, :300]
    changed = real.copy()
    changed[150, 250, 2] += 1
    root = tmp_path / "in"
    (root / "img").mkdir(parents=True)
    (root / "lab").mkdir()
    tifffile.imwrite(root / "img" / "a.tif", real, photometric="minisblack", planarconfig="contig")
    np.save(root / "img" / "b.npy", real)  # the same pixels in another file type
    np.save(root / "img" / "c.npy", changed)
    np.save(root / "img" / "d.npy", real[:, :-1])  # the same pixels but one column: another source
    for name in "abcd":
        cv2.imwrite(str(root / "lab" / f"{name}.png"), (real[:, : 300 - (name == "d"), 0] > 3000).astype(np.uint8))

    def run(out: str, how: str, workers: int = 1) -> ConvertSummary:
        return convert(ConvertConfig(root, tmp_path / out, images="img/{name}.*", labels="lab/{name}.png",
                                     num_classes=2, tile="96x128", stride="80x100", on_duplicate=how,
                                     workers=workers, shard_size=1, quiet=True))

    warned = run("warn", "warn")
    assert warned.duplicates is not None and [[c.key for c in g.copies] for g in warned.duplicates.groups] == \
        [["img/a.tif", "img/b.npy"]]
    listed = subprocess.run([sys.executable, "-m", "shardkit", "info", str(tmp_path / "warn"), "--duplicates"],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert "1 duplicate image(s) in 1 group(s) among 4 samples" in listed.stdout, listed.stdout  # sources, as convert
    with pytest.raises(DuplicateError, match="identical pixels"):
        run("error", "error")
    skipped = run("skip", "skip", workers=2)
    split = next(p for p in (tmp_path / "skip").iterdir() if p.is_dir())
    manifest = json.loads((split / "manifest.json").read_text())
    assert [(s["key"], s["duplicate_of"]) for s in manifest["skipped"]] == [("img/b.npy", f"{split.name}:img/a.tif")]
    tiles = [t for t in shardkit.open(split).tiles() if t is not None]
    assert sorted({t.key for t in tiles}) == ["img/a.tif", "img/c.npy", "img/d.npy"]
    assert skipped.duplicates is not None and skipped.duplicates.extra_copies == 1
    again = run("skip", "skip")
    assert again.reused == skipped.shards and json.loads((split / "manifest.json").read_text()) == manifest


# -- CamVid end to end -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def camvid_tiles(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiles") / "out"
    convert(ConvertConfig(camvid_root, out, splits=("val",), tile=TILE, stride=STRIDE, workers=2, quiet=True,
                          shard_size=40))
    return out / "val"


def _source_label(camvid_root: Path, key: str) -> np.ndarray:
    return cv2.imread(str(camvid_root / key.replace("val/", "valannot/")), cv2.IMREAD_UNCHANGED)


def test_stitching_stored_label_tiles_returns_every_camvid_label_exactly(camvid_tiles: Path, camvid_root: Path,
                                                                         validate_manifest) -> None:
    manifest = validate_manifest(camvid_tiles)
    ds = shardkit.open(camvid_tiles)
    tiles = ds.tiles()
    groups = by_source(tiles)
    sources = sorted((camvid_root / "val").glob("*.png"))
    assert len(groups) == len(sources) and len(ds) == 4 * len(sources)  # one tile row of 4 per 360x480 source
    assert manifest["source"]["tiles"] == {"sources": len(sources), "written": len(ds), "dropped_ignored": 0}
    assert manifest["sample"]["image"]["shape"] == [*TILE, 3]
    for key, indices in groups.items():
        images, labels = ds.batch(indices)
        source = _source_label(camvid_root, key)
        picture = cv2.cvtColor(cv2.imread(str(camvid_root / key)), cv2.COLOR_BGR2RGB)
        group = [tiles[i] for i in indices]
        assert [(t.y, t.x) for t in group] == [(0, 0), (0, 150), (0, 300), (0, 304)]
        voted = stitch(labels, group, reduce="vote")
        assert voted.dtype == source.dtype and np.array_equal(voted, source), key
        assert np.array_equal(stitch(images.astype(np.float32), group), picture)  # exact: equal values averaged
        for t, lab, img in zip(group, labels, images, strict=True):  # padding: ignore under labels, 0 under images
            assert (t.height, t.width, t.source_height, t.source_width) == (360, 176, 360, 480)
            assert (lab[360:] == CAMVID_IGNORE).all() and (img[360:] == 0).all()
    stitched = stitch_split(tiles, lambda idx: ds.batch(idx)[1], reduce="vote")  # the same, split-wide
    key, labels = next(stitched)
    assert key == next(iter(groups)) and np.array_equal(labels, _source_label(camvid_root, key))


def test_provenance_is_in_the_sidecar_for_numpy_alone(camvid_tiles: Path) -> None:
    manifest = json.loads((camvid_tiles / "manifest.json").read_text())
    ds = shardkit.open(camvid_tiles)
    shard = manifest["shards"][1]
    rows = np.load(camvid_tiles / shard["samples"]["name"], allow_pickle=False)
    for j, row in enumerate(rows):
        t = ds.tile(shard["first_index"] + j)
        assert row["key"].decode() == t.key and tuple(int(v) for v in row["tile"]) == t.values


def test_the_numpy_only_spec_reader_reads_a_tiled_split(camvid_tiles: Path) -> None:
    from tests.formats.test_spec import read_split

    m, samples = read_split(camvid_tiles)
    ds = shardkit.open(camvid_tiles)
    assert len(samples) == len(ds)
    for i in (0, 5, len(ds) - 1):
        assert Tile.from_record(m["records"][i]) == ds.tile(i)
        assert np.array_equal(samples[i][0], ds[i][0]) and np.array_equal(samples[i][1], ds[i][1])


def test_tile_of_an_untiled_split_is_a_clear_error(camvid_val_npy: Path) -> None:
    with pytest.raises(ConfigError, match="converted without --tile"):
        shardkit.open(camvid_val_npy).tile(0)


def _shard_files(split: Path) -> dict[str, str]:
    """The current manifest's shard files and sidecars → their sha256, each checked against the file."""
    shards = json.loads((split / "manifest.json").read_text())["shards"]
    files = {f["name"]: f["sha256"] for s in shards for f in (*s["files"], s["samples"])}
    assert all(hashlib.sha256((split / n).read_bytes()).hexdigest() == h for n, h in files.items())
    return files


def test_same_bytes_for_any_worker_count(camvid_tiles: Path, camvid_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "one"
    convert(ConvertConfig(camvid_root, out, splits=("val",), tile=TILE, stride=STRIDE, workers=1, quiet=True,
                          shard_size=40))
    assert _shard_files(out / "val") == _shard_files(camvid_tiles)


def test_rerun_reuses_and_an_edit_rewrites_only_its_shard(camvid_root: Path, tmp_path: Path) -> None:
    src = tmp_path / "camvid"
    for part in ("val", "valannot"):
        shutil.copytree(camvid_root / part, src / part)
    (src / "val.txt").write_text((camvid_root / "val.txt").read_text())
    out = tmp_path / "out"

    def run(**kw: object) -> shardkit.conversion.pipeline.ConvertSummary:
        return convert(ConvertConfig(src, out, splits=("val",), tile="200x240", workers=1, quiet=True,
                                     shard_size=30, **kw))

    first = run()
    assert first.shards > 2 and first.reused == 0
    again = run(rehash=True)
    assert again.reused == first.shards and _shard_files(out / "val")
    before = _shard_files(out / "val")
    label = sorted((src / "valannot").glob("*.png"))[-1]
    ids = cv2.imread(str(label), cv2.IMREAD_UNCHANGED)
    ids[:10, :10] = 3
    cv2.imwrite(str(label), ids)
    edited = run()
    assert edited.reused == first.shards - 1
    after = _shard_files(out / "val")
    changed = {name for name, _ in set(after.items()) - set(before.items())}
    assert len(changed) == 3 and len({n.split("-")[1] for n in changed}) == 1  # one shard: images, labels, sidecar
    fresh = tmp_path / "fresh"
    convert(ConvertConfig(src, fresh, splits=("val",), tile="200x240", workers=2, quiet=True, shard_size=30))
    assert _shard_files(fresh / "val") == after  # an incremental run equals a fresh conversion
    ds = shardkit.open(out / "val")
    idx = by_source(ds.tiles())[label.relative_to(src).as_posix().replace("valannot", "val")]
    assert np.array_equal(stitch(ds.batch(idx)[1], [ds.tile(i) for i in idx], reduce="vote"), ids)


def test_a_failed_run_leaves_no_manifest_and_the_next_reuses_its_shards(camvid_root: Path, tmp_path: Path) -> None:
    src = tmp_path / "camvid"
    for part in ("val", "valannot"):
        shutil.copytree(camvid_root / part, src / part)
    out = tmp_path / "out"
    bad = sorted((src / "valannot").glob("*.png"))[-1]
    good = bad.read_bytes()
    bad.write_bytes(good[:200])  # truncated: its shard fails, the others are written and recorded

    def cfg() -> ConvertConfig:
        return ConvertConfig(src, out, splits=("val",), tile="200x240", workers=1, quiet=True, shard_size=30)

    with pytest.raises(DecodeError):
        convert(cfg())
    assert not (out / "val" / "manifest.json").exists()
    assert not [p for p in (out / "val").iterdir() if ".tmp" in p.name]
    bad.write_bytes(good)
    summary = convert(cfg())
    assert summary.reused >= 1 and (out / "val" / "manifest.json").exists()


def test_sigkill_then_resume_equals_an_uninterrupted_tiled_run(camvid_tiles: Path, camvid_root: Path,
                                                                tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [sys.executable, "-m", "shardkit", "convert", str(camvid_root), str(out), "--split", "val", "-q",
            "--tile", "x".join(map(str, TILE)), "--stride", "x".join(map(str, STRIDE)), "--shard-size", "40"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for delay in (1.5, 3.0):
        proc = subprocess.Popen(args, env=env)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if (out / "val" / "manifest.json").exists():  # whatever is published is complete and valid
            assert verify_split(out / "val").ok
    subprocess.run(args, env=env, check=True)
    assert published_digests(out / "val") == published_digests(camvid_tiles)
    assert verify_split(out / "val").ok


def test_drop_tiles_ignored_counts_in_the_manifest(camvid_root: Path, tmp_path: Path) -> None:
    src = tmp_path / "camvid"
    for part in ("val", "valannot"):
        shutil.copytree(camvid_root / part, src / part)
    first = sorted((src / "valannot").glob("*.png"))[0]
    ids = cv2.imread(str(first), cv2.IMREAD_UNCHANGED)
    ids[:180] = CAMVID_IGNORE  # the top half of one source: its top row of tiles is all ignore
    cv2.imwrite(str(first), ids)
    out = tmp_path / "out"
    convert(ConvertConfig(src, out, splits=("val",), tile="180x240", workers=1, quiet=True,
                          drop_tiles_ignored=0.95))
    manifest = json.loads((out / "val" / "manifest.json").read_text())
    n = len(list((src / "val").glob("*.png")))
    assert manifest["source"]["tiles"] == {"sources": n, "written": 4 * n - 2, "dropped_ignored": 2}
    assert manifest["preprocessing"]["drop_tiles_ignored"] == 0.95
    ds = shardkit.open(out / "val")
    kept = [t for t in ds.tiles() if t.key == first.relative_to(src).as_posix().replace("valannot", "val")]
    assert [(t.y, t.x) for t in kept] == [(180, 0), (180, 240)]


# -- stitching ---------------------------------------------------------------------------------------------------


def _grid(hw: tuple[int, int], tiling: Tiling) -> list[Tile]:
    return [Tile("s", y, x, h, w, *hw) for y, x, h, w in tiling.windows(hw)]


def _cut(arr: np.ndarray, tiles: list[Tile], size: tuple[int, int]) -> list[np.ndarray]:
    out = []
    for t in tiles:
        part = np.zeros((*size, *arr.shape[2:]), arr.dtype)
        part[: t.height, : t.width] = arr[t.y : t.y + t.height, t.x : t.x + t.width]
        out.append(part)
    return out


def test_stitch_averages_logits_with_a_weight_window() -> None:
    tiling = Tiling.from_options("32x48", "20x30")
    assert tiling is not None
    tiles = _grid((70, 100), tiling)
    field = np.random.default_rng(0).normal(size=(70, 100, 5)).astype(np.float32)
    for window in ("mean", "hann", np.ones((32, 48))):
        out = stitch(_cut(field, tiles, (32, 48)), tiles, window=window)
        assert out.shape == field.shape and np.allclose(out, field, atol=1e-6)
    # disagreeing overlaps are averaged: tile k predicts the constant k
    preds = [np.full((32, 48, 1), float(k), np.float32) for k in range(len(tiles))]
    out = stitch(preds, tiles)[..., 0]
    assert out[0, 25] == 0.0 and out[0, 35] == 0.5  # columns 0..29: tile 0 only; 30..47: tiles 0 and 1


def test_stitch_votes_ids_and_refuses_to_average_them() -> None:
    tiling = Tiling.from_options("4x4", "2x2")
    assert tiling is not None
    tiles = _grid((6, 6), tiling)  # the centre pixels are covered by 4 tiles
    preds = [np.full((4, 4), 7, np.uint16) for _ in tiles]
    preds[0][:] = 3
    out = stitch(preds, tiles, reduce="vote")
    assert out.dtype == np.uint16 and out[0, 0] == 3 and out[3, 3] == 7  # 3 of 4 tiles say 7 in the centre
    preds[3][:] = 3  # now 2 against 2 at (2..3, 2..3): ties go to the smaller id
    assert stitch(preds, tiles, reduce="vote")[2, 2] == 3
    with pytest.raises(ValueError, match="would invent ids"):
        stitch(preds, tiles)
    with pytest.raises(ValueError, match="one source at a time"):
        stitch(preds[:2], [tiles[0], Tile("other", 0, 0, 4, 4, 6, 6)], reduce="vote")
    with pytest.raises(ValueError, match="covered by no tile"):
        stitch(preds[:1], tiles[:1], reduce="vote")
    assert np.isnan(stitch([p.astype(np.float32) for p in preds[:1]], tiles[:1])[5, 5])


def _vote_before_the_budget(predictions: list[np.ndarray], tiles: list[Tile]) -> np.ndarray:
    """The vote as shardkit 0.x computed it (a depth x H x W int64 array, depth^2 passes): the reference the
    bounded vote must equal bit for bit."""
    hw = (tiles[0].source_height, tiles[0].source_width)
    extra = predictions[0].shape[2:]
    dtype = predictions[0].dtype
    cover = np.zeros(hw, np.int32)
    for t in tiles:
        cover[t.y : t.y + t.height, t.x : t.x + t.width] += 1
    depth = int(cover.max())
    sentinel = np.iinfo(np.int64).min
    layers = np.full((depth, *hw, *extra), sentinel, np.int64)
    filled = np.zeros(hw, np.int32)
    for pred, t in zip(predictions, tiles, strict=True):
        part = pred[: t.height, : t.width]
        ys, xs = slice(t.y, t.y + t.height), slice(t.x, t.x + t.width)
        level = filled[ys, xs]
        for d in range(depth):
            here = level == d
            if here.any():
                view = layers[d, ys, xs]
                view[here] = part[here]
        filled[ys, xs] += 1
    layers.sort(axis=0)
    best = layers[0].copy()
    best_count = np.zeros(best.shape, np.int32)
    for k in range(depth):
        value = layers[k]
        count: np.ndarray = (layers == value).sum(axis=0, dtype=np.int32)
        count[value == sentinel] = 0
        better = count > best_count
        best[better] = value[better]
        best_count[better] = count[better]
    return best.astype(dtype)


@pytest.mark.parametrize(("dtype", "extra", "classes"), [(np.uint8, (), 3), (np.int16, (2,), 4), (np.bool_, (), 2),
                                                         (np.int64, (), 6)])
def test_the_bounded_vote_equals_the_whole_grid_vote_bit_for_bit(dtype: type, extra: tuple[int, ...],
                                                                 classes: int) -> None:
    """Disagreeing overlaps of few classes (many ties), edge-aligned tiles, channels; stitched a few rows at a
    time (a small ``max_bytes``) and all at once, both equal the whole-grid vote."""
    tiling = Tiling.from_options("12x10", "5x3")
    assert tiling is not None
    tiles = _grid((37, 41), tiling)
    rng = np.random.default_rng(7)
    preds = [rng.integers(-1 if dtype is np.int16 else 0, classes, (12, 10, *extra)).astype(dtype) for _ in tiles]
    expected = _vote_before_the_budget(preds, tiles)
    for budget in (37 * 41 * 8 + 41 * 2000, 1 << 30):  # a band of a few rows; the whole grid in one band
        got = stitch(preds, tiles, reduce="vote", max_bytes=budget)
        assert got.dtype == expected.dtype and np.array_equal(got, expected)
    means = [p.astype(np.float32) for p in preds]  # the mean is summed in the same order, band or not
    assert np.array_equal(stitch(means, tiles, max_bytes=37 * 41 * 8 + 41 * 400), stitch(means, tiles),
                          equal_nan=True)


def test_stitch_stays_within_its_memory_budget_and_refuses_above_it_before_allocating() -> None:
    import tracemalloc

    tiling = Tiling.from_options("64x64", "8x8")  # 64 tiles cover the middle pixels: depth x H x W was 128 MB
    assert tiling is not None
    tiles = _grid((512, 512), tiling)
    preds = [np.full((64, 64), k % 5, np.uint8) for k in range(len(tiles))]
    budget = 16 << 20
    tracemalloc.start()
    try:
        voted = stitch(preds, tiles, reduce="vote", max_bytes=budget)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= budget + (1 << 20), peak  # numpy's own allocations are traced
    assert voted.shape == (512, 512) and voted.dtype == np.uint8
    # a declared size whose output alone is over the budget: one line, channels counted, nothing allocated
    huge = [Tile("scene", 0, 0, 64, 64, 8192, 8192)]
    logits = [np.zeros((64, 64, 19), np.float32)]
    with pytest.raises(ValueError, match=r"stitching 'scene' \(8192x8192 pixels, 19 channels, reduce='mean'\) needs "
                                         r"at least \d+ bytes, more than max_bytes=805306368"):
        stitch(logits, huge)  # the default budget: 8192^2 x 19 float32 is 5.1 GB
    with pytest.raises(ValueError, match="more than max_bytes=1000000"):
        stitch(logits, huge, max_bytes=10**6)
    with pytest.raises(ValueError, match=r"1 channel, reduce='vote'\) needs"):
        stitch([np.zeros((64, 64), np.uint16)], huge, reduce="vote", max_bytes=10**6)


def test_a_sidecar_tile_outside_its_source_is_refused(tmp_path: Path) -> None:
    b = SidecarBuilder(3)
    b.add("a.png", None, 8, 8, "00" * 32, [0], bytes(16), (0, 4, 8, 8, 8, 10))  # x + width = 12 > 10
    digest = b.write(tmp_path / "samples-00000-abc.npy")
    size = (tmp_path / "samples-00000-abc.npy").stat().st_size
    shard = ShardInfo(0, 1, 0, (), ShardFile("samples-00000-abc.npy", size, digest))
    with pytest.raises(ShardFormatError, match="tile region outside"):
        read_sidecar(tmp_path, shard, 3, (8, 8))


# -- windowed reads of tiled TIFFs -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,dtype,planar", [((300, 170, 3), np.uint8, False), ((300, 170, 3), np.uint8, True),
                                                 ((300, 170), np.uint16, False), ((300, 170, 4), np.uint16, True)])
def test_tiled_tiff_windows_equal_the_array(tmp_path: Path, shape: tuple[int, ...], dtype: type, planar: bool) -> None:
    arr = np.random.default_rng(1).integers(0, np.iinfo(dtype).max, shape, dtype=dtype)
    path = tmp_path / "x.tif"
    if planar:
        tifffile.imwrite(path, np.moveaxis(arr, -1, 0), tile=(64, 48), planarconfig="separate", compression="zlib",
                         photometric="rgb" if shape[2] == 3 else "minisblack")
    else:
        tifffile.imwrite(path, arr, tile=(64, 48), compression="zlib", photometric="minisblack" if arr.ndim == 2
                         else "rgb")
    with TiledTiff(path, "image", 10_000) as tif:
        assert tif.shape == shape and tif.planar == planar
        tif.plan_cache(100)
        for y, x, h, w in [(0, 0, 300, 170), (63, 47, 2, 2), (250, 100, 50, 70), (10, 0, 100, 1)]:
            assert np.array_equal(tif.read(y, x, h, w), arr[y : y + h, x : x + w])
        decoded = tif.decoded
        assert decoded <= 2 * 5 * 4 * (shape[2] if planar else 1)  # a bounded cache, never the whole file twice


def test_tiled_tiff_refuses_tiles_above_max_pixels(tmp_path: Path) -> None:
    tifffile.imwrite(tmp_path / "x.tif", np.zeros((512, 512), np.uint8), tile=(256, 256))
    with pytest.raises(DecodeError, match="TIFF tiles are 256x256 pixels, more than --max-pixels 1000"):
        TiledTiff(tmp_path / "x.tif", "label", 1000)


def _scene(root: Path, tiled: bool) -> None:
    """A 1500x1100 scene: the label ignore (255) but for a block of ids 0..4, the image textured."""
    h, w = 1500, 1100
    yy, xx = np.mgrid[0:h, 0:w]
    image = np.stack([(yy * 7 + xx * 3) % 256, (yy * 3) % 256, (xx * 5) % 256], axis=-1).astype(np.uint8)
    label = np.full((h, w), 255, np.uint8)
    label[300:900, 200:1000] = ((yy[300:900, 200:1000] // 64 + xx[300:900, 200:1000] // 64) % 5).astype(np.uint8)
    kw = {"tile": (128, 128)} if tiled else {"rowsperstrip": 64}
    for sub, arr in (("img", image), ("lbl", label)):
        (root / sub / "train").mkdir(parents=True, exist_ok=True)
        tifffile.imwrite(root / sub / "train" / "scene.tif", arr, compression="zlib", **kw)


def _scene_cfg(root: Path, out: Path, **kw: object) -> ConvertConfig:
    return ConvertConfig(root, out, images="img/{split}/{name}.tif", labels="lbl/{split}/{name}.tif",
                         num_classes=5, ignore_index=255, tile="256x256", stride="200x192",
                         drop_tiles_ignored=0.95, workers=1, quiet=True, **kw)


def test_a_tiled_tiff_above_max_pixels_is_read_window_by_window_bit_exactly(tmp_path: Path) -> None:
    _scene(tmp_path / "src", tiled=True)
    convert(_scene_cfg(tmp_path / "src", tmp_path / "whole"))  # 1.65 M pixels, within the default: decoded whole
    convert(_scene_cfg(tmp_path / "src", tmp_path / "windows", max_pixels=500_000))  # window by window
    assert _shard_files(tmp_path / "windows" / "train") == _shard_files(tmp_path / "whole" / "train")
    manifest = json.loads((tmp_path / "windows" / "train" / "manifest.json").read_text())
    counts = manifest["source"]["tiles"]
    assert counts["dropped_ignored"] > 0 and counts["written"] + counts["dropped_ignored"] == 8 * 6


def test_a_two_band_label_read_window_by_window_is_refused_not_read_as_its_first_band(tmp_path: Path) -> None:
    _scene(tmp_path / "src", tiled=True)
    label = tifffile.imread(tmp_path / "src" / "lbl" / "train" / "scene.tif")
    tifffile.imwrite(tmp_path / "src" / "lbl" / "train" / "scene.tif", np.stack([label, label // 2], axis=-1),
                     photometric="minisblack", planarconfig="contig", tile=(128, 128))
    for max_pixels in (500_000, 1 << 24):  # window by window, and whole
        with pytest.raises(DecodeError, match="label is a TIFF of 2 bands"):
            convert(_scene_cfg(tmp_path / "src", tmp_path / f"out{max_pixels}", max_pixels=max_pixels))
        assert not (tmp_path / f"out{max_pixels}" / "train" / "manifest.json").exists()


def test_an_untiled_tiff_above_max_pixels_is_refused_clearly(tmp_path: Path) -> None:
    _scene(tmp_path / "src", tiled=False)
    with pytest.raises(DecodeError, match="not a tiled one") as err:
        convert(_scene_cfg(tmp_path / "src", tmp_path / "out", max_pixels=500_000))
    assert "tiled TIFF" in (err.value.fix or "")
    assert not (tmp_path / "out" / "train" / "manifest.json").exists()


def test_a_png_above_max_pixels_is_refused_clearly(camvid_root: Path, tmp_path: Path) -> None:
    with pytest.raises(DecodeError, match=r"360x480 = 172800 pixels, more than --max-pixels 100000, and a PNG file"):
        convert(ConvertConfig(camvid_root, tmp_path / "out", splits=("val",), tile="128", max_pixels=100_000,
                              workers=1, quiet=True))


# -- multi-page TIFFs (--pages-as-bands) read window by window --------------------------------------------------

#: 600x500 sources: 300000 pixels, more than PAGES_MAX (so read window by window), 64x64 TIFF tiles
PAGES_HW, PAGES_MAX = (600, 500), 100_000


def _write_pages(path: Path, pages: np.ndarray, layout: str, tile: tuple[int, int] = (64, 64)) -> None:
    """``pages`` (P, H, W[, S]) as a P-page tiled TIFF: ``"gray"`` one sample a page, ``"chunky"`` / ``"planar"``
    S samples a page stored interleaved / as separate planes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if layout == "planar":
        tifffile.imwrite(path, np.moveaxis(pages, -1, 1), tile=tile, compression="zlib", planarconfig="separate",
                         photometric="minisblack", metadata=None)
    else:
        tifffile.imwrite(path, pages, tile=tile, compression="zlib", photometric="minisblack", metadata=None,
                         planarconfig="contig" if layout == "chunky" else None)
    with tifffile.TiffFile(path) as tif:  # what the tests below rely on: P tiled pages
        assert len(tif.pages) == len(pages) and all(page.is_tiled for page in tif.pages)


def _pages_source(root: Path, pages: np.ndarray, layout: str) -> np.ndarray:
    """A split of one multi-page image (``pages``) and its tiled id label (ids 0..4, 255 in a corner); the label."""
    yy, xx = np.mgrid[0 : PAGES_HW[0], 0 : PAGES_HW[1]]
    label = ((yy // 37 + xx // 23) % 5).astype(np.uint8)
    label[:100, :120] = 255
    _write_pages(root / "img" / "train" / "scene.tif", pages, layout)
    _write_pages(root / "lbl" / "train" / "scene.tif", label[None], "gray")
    return label


def _pages_cfg(root: Path, out: Path, **kw: object) -> ConvertConfig:
    return ConvertConfig(root, out, images="img/{split}/{name}.tif", labels="lbl/{split}/{name}.tif", num_classes=5,
                         ignore_index=255, tile="256x256", workers=1, quiet=True, **kw)


@pytest.mark.parametrize("layout,shape,dtype", [("gray", (3, *PAGES_HW), np.uint16),
                                                ("chunky", (2, *PAGES_HW, 3), np.int16),
                                                ("planar", (2, *PAGES_HW, 2), np.float32)])
def test_a_tiled_multi_page_tiff_above_max_pixels_is_read_window_by_window_as_bands(
        tmp_path: Path, layout: str, shape: tuple[int, ...], dtype: type) -> None:
    """--pages-as-bands with a source too large to decode whole: every stored tile holds every page's window, in
    page order, bit-exactly, its label exactly, and the shards equal those of decoding the file whole."""
    rng = np.random.default_rng(29)
    if np.dtype(dtype).kind == "f":
        pages = rng.standard_normal(shape).astype(dtype) * 1000
    else:
        pages = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)
    label = _pages_source(tmp_path / "src", pages, layout)
    bands = np.moveaxis(pages, 0, 2).reshape(*PAGES_HW, -1)  # (H, W, P*S): page 1's samples, then page 2's …
    windowed = tmp_path / "windowed"
    convert(_pages_cfg(tmp_path / "src", windowed, max_pixels=PAGES_MAX, pages_as_bands=True))
    ds = shardkit.open(windowed / "train")
    tiles = ds.tiles()
    assert [(t.y, t.x) for t in tiles] == [(y, x) for y in (0, 256, 344) for x in (0, 244)]  # edge-aligned grid
    images, labels = ds.batch(range(len(ds)))
    assert images.dtype == dtype and images.shape[1:] == (256, 256, bands.shape[2])
    for t, img, lab in zip(tiles, images, labels, strict=True):
        assert (t.height, t.width, t.source_height, t.source_width) == (256, 256, *PAGES_HW)
        assert np.array_equal(img, bands[t.y : t.y + 256, t.x : t.x + 256]), t  # bit-exact, every band
        assert lab.dtype == label.dtype and np.array_equal(lab, label[t.y : t.y + 256, t.x : t.x + 256]), t
    assert np.array_equal(stitch(labels, tiles, reduce="vote"), label)
    whole = tmp_path / "whole"
    convert(_pages_cfg(tmp_path / "src", whole, pages_as_bands=True))  # within the default: decoded whole
    assert _shard_files(windowed / "train") == _shard_files(whole / "train")


def test_windowed_pages_are_decoded_tile_by_tile_in_a_bounded_cache(tmp_path: Path) -> None:
    """TiledTiff over 3 pages keeps at most one row of windows' TIFF tiles per page, and decodes each TIFF tile
    about once over a row-major walk: never a page, let alone the file, whole."""
    pages = np.random.default_rng(3).integers(0, 65535, (3, 1200, 500), dtype=np.uint16)
    _write_pages(tmp_path / "x.tif", pages, "gray")
    tiling = Tiling((256, 256), (192, 192))
    with TiledTiff(tmp_path / "x.tif", "image", PAGES_MAX, pages_as_bands=True) as tif:
        tif.plan_cache(256)
        assert tif.shape == (1200, 500, 3) and tif.cache_tiles == 5 * 8 * 3  # (256 / 64 + 1) rows x 8 across
        largest = 0
        for y, x, h, w in tiling.windows((1200, 500)):
            assert np.array_equal(tif.read(y, x, h, w), np.moveaxis(pages[:, y : y + h, x : x + w], 0, -1))
            largest = max(largest, len(tif._cache))
        assert largest <= tif.cache_tiles < 19 * 8 * 3  # the file has 19 rows of 8 TIFF tiles a page
        assert tif.decoded <= 2 * 19 * 8 * 3  # overlapping windows share the cached tiles


def test_pages_tiled_differently_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.tif"
    tifffile.imwrite(path, np.zeros((300, 200), np.uint16), tile=(64, 64), metadata=None)
    tifffile.imwrite(path, np.zeros((300, 200), np.uint16), tile=(128, 128), metadata=None, append=True)
    with pytest.raises(DecodeError, match=r"TIFF pages are tiled differently \(64x64 and 128x128"):
        TiledTiff(path, "image", PAGES_MAX, pages_as_bands=True)


def test_a_real_big_endian_imagej_hyperstack_tiled_is_read_window_by_window_as_bands(tmp_path: Path) -> None:
    """The real TCYX microscopy hyperstack (tests/data/microscopy16: four 169x169 uint16 planes, big-endian),
    re-saved as a tiled big-endian TIFF of one page per plane, converted with --pages-as-bands above --max-pixels:
    every tile holds the four planes' window bit-exactly, in page order, the label exactly."""
    from tests.test_real16 import hyperstack_bands

    bands = hyperstack_bands()
    label = ((bands[:, :, 0] > np.median(bands[:, :, 0])) + 2 * (bands[:, :, 1] > 200)).astype(np.uint8)
    src = tmp_path / "src"
    for sub, arr in (("img", np.moveaxis(bands, -1, 0)), ("lbl", label)):
        (src / sub / "train").mkdir(parents=True)
        tifffile.imwrite(src / sub / "train" / "cells.tif", arr, tile=(32, 32), byteorder=">", compression="zlib",
                         photometric="minisblack", metadata=None)
    with tifffile.TiffFile(src / "img" / "train" / "cells.tif") as tif:
        assert len(tif.pages) == 4 and tif.byteorder == ">" and tif.pages[0].is_tiled
    convert(ConvertConfig(src, tmp_path / "out", images="img/{split}/{name}.tif", labels="lbl/{split}/{name}.tif",
                          num_classes=4, tile="64x64", stride="48x48", max_pixels=10_000, pages_as_bands=True,
                          workers=1, quiet=True))
    ds = shardkit.open(tmp_path / "out" / "train")
    tiles = ds.tiles()
    images, labels = ds.batch(range(len(ds)))
    assert len(tiles) == 4 * 4 and images.dtype == np.uint16 and images.shape[1:] == (64, 64, 4)
    for t, img, lab in zip(tiles, images, labels, strict=True):
        assert np.array_equal(img, bands[t.y : t.y + 64, t.x : t.x + 64]), t
        assert np.array_equal(lab, label[t.y : t.y + 64, t.x : t.x + 64]), t
    assert np.array_equal(stitch(images.astype(np.float32), tiles), bands)


def _cli_convert(src: Path, out: Path, *args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from shardkit.cli import main

    res = CliRunner().invoke(main, ["convert", str(src), str(out), "-q", "--workers", "1", "--images",
                                    "img/{split}/{name}.tif", "--labels", "lbl/{split}/{name}.tif", "--num-classes",
                                    "5", "--ignore-index", "255", "--tile", "256x256", *args])
    return res.exit_code, res.output


@pytest.mark.parametrize("second,problem", [
    (np.zeros((1, 600, 400), np.uint16), r"TIFF pages differ in size or type \(\(600, 500\) uint16 and \(600, 400\)"),
    (np.zeros((1, *PAGES_HW), np.int16), r"TIFF pages differ in size or type \(\(600, 500\) uint16 and \(600, 500\) "
                                         "int16"),
])
@pytest.mark.parametrize("max_pixels", [PAGES_MAX, 10_000_000])  # read window by window, and decoded whole
def test_pages_that_differ_are_a_one_line_error(tmp_path: Path, second: np.ndarray, problem: str,
                                                max_pixels: int) -> None:
    src = tmp_path / "src"
    _pages_source(src, np.zeros((1, *PAGES_HW), np.uint16), "gray")
    path = src / "img" / "train" / "scene.tif"
    tifffile.imwrite(path, second, tile=(64, 64), photometric="minisblack", metadata=None, append=True)
    code, output = _cli_convert(src, tmp_path / "out", "--pages-as-bands", "--max-pixels", str(max_pixels))
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "Traceback" not in output, output
    assert str(path) in lines[0] and "they are not bands of one image" in lines[0], output
    assert re.search(problem, lines[0]) and "export the bands as one image" in lines[0], output
    assert not (tmp_path / "out" / "train" / "manifest.json").exists()


def test_a_multi_page_tiff_above_max_pixels_without_pages_as_bands_is_refused(tmp_path: Path) -> None:
    """Without --pages-as-bands a windowed multi-page image is refused as a whole decode refuses it — also when the
    split's first image (which sets the split's bands) is a one-page file, where reading page 1 would pass every
    other check; and a multi-page label is refused even with --pages-as-bands."""
    src = tmp_path / "src"
    pages = np.random.default_rng(5).integers(0, 65535, (3, *PAGES_HW), dtype=np.uint16)
    label = _pages_source(src, pages, "gray")
    code, output = _cli_convert(src, tmp_path / "out", "--max-pixels", str(PAGES_MAX))
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "Traceback" not in output, output
    assert "scene.tif" in lines[0] and "a multi-page TIFF (3 pages)" in lines[0] and "--pages-as-bands" in lines[0]

    _write_pages(src / "img" / "train" / "a-first.tif", pages[:1], "gray")  # one page: the split stores 1 band
    _write_pages(src / "lbl" / "train" / "a-first.tif", label[None], "gray")
    with pytest.raises(DecodeError, match=r"image is a multi-page TIFF \(3 pages\)") as err:
        convert(_pages_cfg(src, tmp_path / "out2", max_pixels=PAGES_MAX))
    assert err.value.path == str(src / "img" / "train" / "scene.tif")
    assert not (tmp_path / "out2" / "train" / "manifest.json").exists()

    _write_pages(src / "lbl" / "train" / "scene.tif", np.stack([label, label]), "gray")
    with pytest.raises(DecodeError, match=r"label is a multi-page TIFF \(2 pages\)") as err:
        convert(_pages_cfg(src, tmp_path / "out3", max_pixels=PAGES_MAX, pages_as_bands=True))
    assert "single-page" in (err.value.fix or "") and "--pages-as-bands" not in (err.value.fix or "")
    _write_pages(src / "lbl" / "train" / "scene.tif", label[None], "gray")  # decoded whole: its header says it
    tifffile.imwrite(src / "lbl" / "train" / "scene.tif", label[:, :400], tile=(64, 64), metadata=None, append=True)
    with pytest.raises(DecodeError, match=r"label: TIFF pages differ in size .* not bands of one label") as err:
        convert(_pages_cfg(src, tmp_path / "out4", pages_as_bands=True))
    assert "single-page" in (err.value.fix or "")


def test_many_pages_within_max_pixels_but_too_many_bytes_are_read_window_by_window(tmp_path: Path) -> None:
    """A source of at most --max-pixels pixels whose pages make its whole decode exceed the bytes --max-pixels
    allows (12 a pixel; 8 uint16 pages need 32) is read window by window instead of being refused."""
    pages = np.random.default_rng(8).integers(0, 65535, (8, *PAGES_HW), dtype=np.uint16)
    _pages_source(tmp_path / "src", pages, "gray")
    max_pixels = 400_000  # >= 600 x 500 pixels, < 600 x 500 x 32 / 12
    with pytest.raises(DecodeError, match="its decode needs"):  # what decoding it whole would say
        shardkit.images.imageio.check_pixels(tmp_path / "src" / "img" / "train" / "scene.tif", max_pixels)
    convert(_pages_cfg(tmp_path / "src", tmp_path / "windowed", max_pixels=max_pixels, pages_as_bands=True))
    convert(_pages_cfg(tmp_path / "src", tmp_path / "whole", pages_as_bands=True))
    assert _shard_files(tmp_path / "windowed" / "train") == _shard_files(tmp_path / "whole" / "train")
    assert json.loads((tmp_path / "windowed" / "train" / "manifest.json").read_text())["sample"]["image"]["shape"] \
        == [256, 256, 8]


@pytest.mark.slow
def test_a_large_tiled_tiff_converts_in_bounded_memory() -> None:
    """scripts/tiling_memory.py at 8000x8000 (a 192 MB image and a 64 MB label decoded whole): the converting
    process (under RLIMIT_AS) peaks far below them. The 30000x30000 case runs the same script by hand."""
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "tiling_memory.py"), "--size", "8000"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(res.stdout.splitlines()[-1])
    assert result["tiles_written"] > 0 and result["tiles_dropped"] > 0
    assert result["peak_rss_mb"] - result["baseline_rss_mb"] < 150, result


def test_a_multi_page_tiled_tiff_converts_as_bands_in_bounded_memory() -> None:
    """scripts/tiling_memory.py on a 3000x3000 image of 4 RGB pages (12 bands: 112 MB with its label decoded whole,
    every tile kept) converted with --pages-as-bands window by window: the converting process peaks far below the
    source decoded whole (it used to hold the whole file twice, and 64 tiles of 3 MB, before writing any)."""
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "tiling_memory.py"), "--size", "3000", "--block",
                          "3000", "--pages", "4", "--max-pixels", "2000000"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(res.stdout.splitlines()[-1])
    assert result["tiles_written"] == 64 and result["tiles_dropped"] == 0 and result["whole_mb"] > 110
    assert result["peak_rss_mb"] - result["baseline_rss_mb"] < 0.4 * result["whole_mb"], result


# -- the command line --------------------------------------------------------------------------------------------


def test_cli_tiles_with_overlap_and_refuses_a_stride_without_a_tile(camvid_root: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shardkit.cli import main

    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["convert", str(camvid_root), str(out), "--split", "val", "-q", "--workers", "1",
                                    "--tile", "360x256", "--overlap", "0x32"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "val" / "manifest.json").read_text())
    assert (manifest["preprocessing"]["tile"], manifest["preprocessing"]["stride"]) == ([360, 256], [360, 224])
    assert manifest["num_samples"] == 2 * manifest["source"]["tiles"]["sources"]  # x = 0 and the edge, 224
    for args in (["--stride", "32"], ["--tile", "64", "--stride", "80"], ["--tile", "64", "--size", "32x32"]):
        res = CliRunner().invoke(main, ["convert", str(camvid_root), str(tmp_path / "o"), *args])
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.output, res.output
