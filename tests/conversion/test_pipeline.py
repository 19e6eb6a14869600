"""End-to-end conversion on the real data: round trips, determinism, shard planning, skipping."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import cv2
import numpy as np
import pytest

import shardkit
from shardkit.conversion.config import ConvertConfig, ShardSize
from shardkit.conversion.pipeline import convert
from shardkit.errors import DecodeError, LabelError, OutputError
from shardkit.store.records import content_digest
from tests.sample_records import records

CROP = (352, 480)


def camvid_expected(root: Path, key: str, label_rel: str) -> tuple[np.ndarray, np.ndarray]:
    """The documented preprocessing, computed straight from the source: decode, centre-crop 360→352 rows."""
    image = cv2.cvtColor(cv2.imread(str(root / key), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    label = cv2.imread(str(root / label_rel), cv2.IMREAD_UNCHANGED)
    top = (image.shape[0] - CROP[0]) // 2
    left = (image.shape[1] - CROP[1]) // 2
    return image[top : top + CROP[0], left : left + CROP[1]], label[top : top + CROP[0], left : left + CROP[1]]


def file_digests(directory: Path) -> dict[str, str]:
    return {p.name: content_digest(p) for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture(scope="module", params=["npy", "lmdb"])
def camvid_converted(request: pytest.FixtureRequest, camvid_root: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp(f"camvid-{request.param}")
    cfg = ConvertConfig(camvid_root, out, format=request.param, size=CROP, shard_size=ShardSize(samples=50),
                        workers=2, quiet=True)
    return request.param, out, convert(cfg)


def test_camvid_round_trips_every_sample_exactly(camvid_converted, camvid_root: Path, validate_manifest) -> None:
    fmt, out, summary = camvid_converted
    assert summary.samples == 149
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["train", "val"]
    for split, n in (("train", 123), ("val", 26)):
        manifest = validate_manifest(out / split)
        assert manifest["format"] == fmt
        ds = shardkit.open(out / split)
        assert len(ds) == n
        recs = records(out / split, manifest)
        keys = [s["key"] for s in recs]
        assert keys == sorted(keys)
        for i in range(len(ds)):
            image, label = ds[i]
            rec = recs[i]
            want_image, want_label = camvid_expected(camvid_root, rec["key"], rec["label"])
            assert image.dtype == np.uint8 and image.shape == (*CROP, 3)
            np.testing.assert_array_equal(image, want_image)
            np.testing.assert_array_equal(label, want_label)
            assert rec["classes"] == sorted(set(np.unique(want_label).tolist()) - {11}) or rec["classes"] == sorted(
                np.unique(want_label).tolist()
            )


def test_camvid_manifest_counts_classes_and_shards(camvid_converted, camvid_root: Path) -> None:
    _fmt, out, _ = camvid_converted
    ds = shardkit.open(out / "train")
    m = ds.manifest
    sizes = [s.num_samples for s in m.shards]
    assert sum(sizes) == 123 and max(sizes) <= 50 and len(sizes) >= 3
    assert m.classes["num_classes"] == 12 and m.classes["ignore_index"] == 11
    assert m.preprocessing["cityscapes_train_ids"] is None  # a SegNet dataset: the remap did not apply
    counts = np.zeros(12, np.int64)
    for i in range(len(ds)):
        counts += np.bincount(ds[i][1].ravel(), minlength=12)
    assert m.stats["class_pixels"] == counts.tolist()
    assert m.stats["pixels"] == 123 * CROP[0] * CROP[1]


@pytest.mark.parametrize("fmt", ["npy", "lmdb"])
def test_bytes_identical_for_one_and_two_workers(camvid_root: Path, tmp_path: Path, fmt: str) -> None:
    digests = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        convert(ConvertConfig(camvid_root, out, format=fmt, size=CROP, splits=("val",),
                              shard_size=ShardSize(samples=7), workers=workers, quiet=True))
        digests.append(file_digests(out / "val"))
    assert len([n for n in digests[0] if n.startswith(("images-", "shard-"))]) >= 3
    assert digests[0] == digests[1]


def read_class_dict(root: Path) -> dict[tuple[int, int, int], int]:
    with (root / "class_dict.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    return {(int(r["r"]), int(r["g"]), int(r["b"])): i for i, r in enumerate(rows)}


def test_rgb_masks_unknown_colour_is_reported(rgb_masks_root: Path, tmp_path: Path) -> None:
    cfg = ConvertConfig(rgb_masks_root, tmp_path / "out", splits=("val",), workers=1, quiet=True)
    with pytest.raises(LabelError) as info:
        convert(cfg)
    msg = str(info.value)
    assert "_color_mask.png" in msg and "255,255,255" in msg
    assert "878 px" in msg and "--unknown-as" in msg
    assert "\n" not in msg
    assert not (tmp_path / "out" / "val" / "manifest.json").exists()


@pytest.mark.parametrize("fmt", ["npy", "lmdb"])
@pytest.mark.parametrize("encoding", ["index", "onehot", "packed"])
def test_rgb_masks_variable_size_round_trip(rgb_masks_root: Path, tmp_path: Path, fmt: str, encoding: str,
                                            validate_manifest) -> None:
    out = tmp_path / "out"
    summary = convert(ConvertConfig(rgb_masks_root, out, format=fmt, label_encoding=encoding, unknown_as=255,
                                    ignore_index=255, workers=2, shard_size=ShardSize(samples=3), quiet=True))
    assert summary.samples == 20
    colours = read_class_dict(rgb_masks_root)
    for split in ("test", "train", "val"):
        manifest = validate_manifest(out / split)
        assert manifest["sample"]["image"]["shape"] == [None, None, 3]
        ds = shardkit.open(out / split)
        sizes = set()
        recs = records(out / split, manifest)
        for i in range(len(ds)):
            rec = recs[i]
            image, ids = ds[i]
            src = cv2.cvtColor(cv2.imread(str(rgb_masks_root / rec["key"])), cv2.COLOR_BGR2RGB)
            mask = cv2.cvtColor(cv2.imread(str(rgb_masks_root / rec["label"])), cv2.COLOR_BGR2RGB)
            want = np.full(mask.shape[:2], 255, np.uint8)
            for colour, cid in colours.items():
                want[(mask == colour).all(axis=-1)] = cid
            np.testing.assert_array_equal(image, src)
            np.testing.assert_array_equal(ids, want)
            sizes.add(image.shape)
        if split == "train":
            assert len(sizes) > 1, "rgb-masks-mini images differ in size; the variable layout must keep them"


def test_shard_size_in_bytes_cuts_shards_by_stored_bytes(camvid_root: Path, tmp_path: Path) -> None:
    per_sample = CROP[0] * CROP[1] * 4
    convert(ConvertConfig(camvid_root, tmp_path, size=CROP, splits=("val",), workers=1, quiet=True,
                          shard_size=ShardSize(nbytes=per_sample * 10)))
    m = shardkit.open(tmp_path / "val").manifest
    assert all(sum(f.bytes for f in s.files) <= per_sample * 10 + 4096 for s in m.shards)
    assert max(s.num_samples for s in m.shards) <= 10 and sum(s.num_samples for s in m.shards) == 26


def corrupt_copy(src: Path, dst: Path, n: int = 6) -> list[str]:
    """A small SegNet-layout copy of CamVid val with one truncated image."""
    names = sorted(p.name for p in (src / "val").iterdir())[:n]
    for sub in ("val", "valannot"):
        (dst / sub).mkdir(parents=True)
        for name in names:
            (dst / sub / name).write_bytes((src / sub / name).read_bytes())
    if n > 2:
        bad = dst / "val" / names[2]
        bad.write_bytes(bad.read_bytes()[:5000])
    return names


def test_corrupt_image_fails_with_one_line_naming_the_file(camvid_root: Path, tmp_path: Path) -> None:
    names = corrupt_copy(camvid_root, tmp_path / "raw")
    with pytest.raises(DecodeError) as info:
        convert(ConvertConfig(tmp_path / "raw", tmp_path / "out", workers=2, quiet=True,
                              shard_size=ShardSize(samples=2)))
    assert names[2] in str(info.value) and "\n" not in str(info.value)
    out = tmp_path / "out" / "val"
    assert not (out / "manifest.json").exists()
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name], "no temporary or partial shard may remain"


def test_on_error_skip_lists_skipped_inputs(camvid_root: Path, tmp_path: Path, validate_manifest) -> None:
    names = corrupt_copy(camvid_root, tmp_path / "raw")
    summary = convert(ConvertConfig(tmp_path / "raw", tmp_path / "out", workers=2, quiet=True, on_error="skip",
                                    shard_size=ShardSize(samples=2)))
    assert summary.samples == 5
    manifest = validate_manifest(tmp_path / "out" / "val")
    assert [s["key"] for s in manifest["skipped"]] == [f"val/{names[2]}"]
    assert "decode" in manifest["skipped"][0]["reason"]
    ds = shardkit.open(tmp_path / "out" / "val")
    assert [ds.key(i) for i in range(len(ds))] == [f"val/{n}" for n in names if n != names[2]]


def test_output_inside_input_is_refused(camvid_root: Path, tmp_path: Path) -> None:
    corrupt_copy(camvid_root, tmp_path / "raw", n=2)
    with pytest.raises(OutputError, match="inside the input"):
        convert(ConvertConfig(tmp_path / "raw", tmp_path / "raw" / "out", quiet=True))


def test_dry_run_writes_nothing(camvid_root: Path, tmp_path: Path) -> None:
    summary = convert(ConvertConfig(camvid_root, tmp_path / "out", dry_run=True))
    assert summary.discovery.total() == 149 and summary.table.num_classes == 12
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("resize", ["exact", "shorter"])
def test_resized_camvid_equals_opencv_resize_and_labels_stay_nearest(camvid_root: Path, tmp_path: Path,
                                                                    resize: str) -> None:
    size = (180, 200)
    convert(ConvertConfig(camvid_root, tmp_path, size=size, resize=resize, splits=("val",), workers=2, quiet=True))
    ds = shardkit.open(tmp_path / "val")
    for i in (0, 11, 25):
        rec = ds.manifest.samples[i]
        src = cv2.cvtColor(cv2.imread(str(camvid_root / rec["key"])), cv2.COLOR_BGR2RGB)
        lab = cv2.imread(str(camvid_root / rec["label"]), cv2.IMREAD_UNCHANGED)
        if resize == "exact":
            hw = size
        else:  # cover the target keeping the aspect ratio, then centre-crop
            scale = max(size[0] / src.shape[0], size[1] / src.shape[1])
            hw = (max(size[0], round(src.shape[0] * scale)), max(size[1], round(src.shape[1] * scale)))
        want_img = cv2.resize(src, (hw[1], hw[0]), interpolation=cv2.INTER_AREA)
        want_lab = cv2.resize(lab, (hw[1], hw[0]), interpolation=cv2.INTER_NEAREST_EXACT)
        top, left = (hw[0] - size[0]) // 2, (hw[1] - size[1]) // 2
        image, label = ds[i]
        np.testing.assert_array_equal(image, want_img[top : top + size[0], left : left + size[1]])
        np.testing.assert_array_equal(label, want_lab[top : top + size[0], left : left + size[1]])
        assert set(np.unique(label)) <= set(np.unique(lab)), "nearest neighbour never invents a class id"


@pytest.mark.parametrize("workers", [1, 2])
def test_every_shard_file_is_fsynced_before_its_final_name_appears(camvid_root: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     workers: int) -> None:
    import os

    import shardkit.store.publish as publish

    events: list[tuple[str, str]] = []
    real_fsync, real_replace = publish.fsync_file, os.replace
    monkeypatch.setattr(publish, "fsync_file", lambda p: (events.append(("fsync", Path(p).name)), real_fsync(p)))
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", Path(a).name)), real_replace(a, b)))
    out = tmp_path / "out"
    convert(ConvertConfig(camvid_root, out, format="npy", size=CROP, splits=("val",),
                          shard_size=ShardSize(samples=7), workers=workers, quiet=True))
    renamed = [name for kind, name in events if kind == "replace" and name.startswith((".images-", ".labels-"))]
    assert len(renamed) >= 6  # ≥ 3 shards × 2 files
    for name in renamed:
        assert ("fsync", name) in events[: events.index(("replace", name))], name


def test_padding_warning_only_when_samples_were_padded(rgb_masks_root: Path, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """No ignore index: the 'labels padded with class 0' warning names how many samples were padded, and is
    silent when a centre crop pads nothing (it used to fire on the demo before anything was converted)."""
    from shardkit.demo import make_demo

    h, w = np.max([cv2.imread(str(p)).shape[:2] for p in (rgb_masks_root / "val").iterdir()], axis=0)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        convert(ConvertConfig(rgb_masks_root, tmp_path / "big", size=(int(h) + 8, int(w) + 8), splits=("val",),
                              unknown_as=0, quiet=True))
    n_val = len(list((rgb_masks_root / "val").iterdir()))
    padded = [r.getMessage() for r in caplog.records if "padded with class 0" in r.getMessage()]
    assert len(padded) == 1 and padded[0].startswith(f"{n_val} samples were smaller than --size")
    caplog.clear()
    make_demo(tmp_path / "demo")
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        convert(ConvertConfig(tmp_path / "demo", tmp_path / "demo-out", size=(96, 128), quiet=True))
    assert not [r for r in caplog.records if "padded" in r.getMessage()]
