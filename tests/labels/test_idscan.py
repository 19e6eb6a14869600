"""A class table from the ids found in label files: edge cases on small synthetic labels."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from shardkit.errors import DecodeError, LabelError
from shardkit.labels import idscan
from shardkit.labels.idscan import SOURCE, scan_table


def save(path: Path, arr: np.ndarray, mode: str | None = None) -> Path:
    if mode == "P":  # a palette PNG whose indices are the ids (colours unrelated to them)
        im = Image.frombytes("P", (arr.shape[1], arr.shape[0]), arr.tobytes())
        im.putpalette([v for i in range(256) for v in (i, 255 - i, 0)])
    else:
        im = Image.fromarray(arr)
    im.save(path)
    return path


def test_ids_found_become_classes_0_to_max_with_gaps_said(tmp_path: Path) -> None:
    a = save(tmp_path / "a.png", np.array([[0, 1], [1, 4]], np.uint8))
    b = save(tmp_path / "b.png", np.array([[0, 2], [2, 2]], np.uint8), mode="P")  # palette indices are ids
    choice = scan_table([a, b], None, max_pixels=1000)
    assert choice.table.num_classes == 5 and choice.table.source == SOURCE and choice.table.ignore_index is None
    assert "all 2 label files (ids 0..4, 1 of them absent" in choice.reason


def test_the_ignore_id_only_when_given_and_then_not_a_class(tmp_path: Path) -> None:
    a = save(tmp_path / "a.png", np.array([[0, 1], [2, 255]], np.uint8))
    with pytest.raises(LabelError, match=r"255 lies far above.*--ignore-index 255") as e:
        scan_table([a], None, max_pixels=1000)
    assert "--label-map" not in str(e.value)  # three values: not a binary mask
    choice = scan_table([a], 255, max_pixels=1000)
    assert choice.table.num_classes == 3 and choice.table.ignore_index == 255


def test_a_0_255_binary_mask_is_refused_with_label_map_or_threshold(tmp_path: Path) -> None:
    a = save(tmp_path / "m.png", np.array([[0, 255], [255, 255]], np.uint8))
    with pytest.raises(LabelError) as e:
        scan_table([a], None, max_pixels=1000, root=tmp_path)
    text = str(e.value)
    assert "label values 0 (1 px), 255 (3 px) found in 1 label files (e.g. 255 in m.png)" in text
    assert "--label-map 255:1 or --threshold 127" in text


def test_a_value_map_is_applied_before_counting(tmp_path: Path) -> None:
    a = save(tmp_path / "m.png", np.array([[0, 255]], np.uint8))
    choice = scan_table([a], None, max_pixels=1000, value_map=lambda x: (x > 127).astype(np.uint8))
    assert choice.table.num_classes == 2


def test_sixteen_bit_ids_and_colour_labels(tmp_path: Path) -> None:
    a = save(tmp_path / "a.png", np.array([[0, 300]], np.uint16))
    b = save(tmp_path / "b.png", np.arange(301, dtype=np.uint16).reshape(1, 301))
    assert scan_table([a, b], None, max_pixels=1000).table.num_classes == 301
    c = save(tmp_path / "c.png", np.array([[[255, 0, 0], [0, 0, 0]]], np.uint8))
    with pytest.raises(LabelError, match=r"c\.png: label has colours.*--palette FILE"):
        scan_table([c], None, max_pixels=1000)
    g = save(tmp_path / "g.png", np.array([[[3, 3, 3], [1, 1, 1]]], np.uint8))  # gray stored as RGB: ids
    assert scan_table([g], None, max_pixels=1000).table.num_classes == 4


def test_the_pixel_limit_is_checked_before_decoding(tmp_path: Path) -> None:
    a = save(tmp_path / "a.png", np.zeros((10, 10), np.uint8))
    with pytest.raises(DecodeError, match="more than --max-pixels 50"):
        scan_table([a], None, max_pixels=50)


def test_a_scan_is_reused_only_while_the_label_files_and_options_are_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import shardkit.labels.idscan as idscan
    from shardkit.labels.idscan import SCAN_CACHE, ScanCache

    a = save(tmp_path / "a.png", np.array([[0, 1], [1, 2]], np.uint8))
    b = save(tmp_path / "b.png", np.array([[0, 2], [2, 2]], np.uint8))
    where, names = tmp_path / SCAN_CACHE, [str(a), str(b)]
    cache = ScanCache.of(where, names, "options")
    assert cache is not None and cache.load() is None
    first = scan_table(names, None, max_pixels=1000, cache=cache)
    cache.save()

    def no_read(*_: object) -> None:
        raise AssertionError("a label file was read")

    monkeypatch.setattr(idscan, "_file_counts", no_read)
    again = ScanCache.of(where, names, "options")
    assert again is not None
    reused = scan_table(names, None, max_pixels=1000, cache=again)
    assert reused.table == first.table and reused.reason == first.reason
    assert ScanCache.of(where, names, "other options").load() is None  # type: ignore[union-attr]
    assert ScanCache.of(where, names[:1], "options").load() is None  # type: ignore[union-attr]
    monkeypatch.undo()
    save(b, np.array([[0, 5], [2, 2]], np.uint8))  # an id added
    st = b.stat()
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    changed = ScanCache.of(where, names, "options")
    assert changed is not None and changed.load() is None
    assert scan_table(names, None, max_pixels=1000, cache=changed).table.num_classes == 6


def test_an_int16_tiff_label_is_named_int16_not_int32(tmp_path: Path) -> None:
    """PIL widens an int16 TIFF to int32; the scan reads the file's own type, as the decoder does."""
    import tifffile

    path = tmp_path / "a.tif"
    tifffile.imwrite(path, np.array([[0, 1], [-1, 2]], np.int16))
    with pytest.raises(LabelError, match=r"label pixels are int16 \(mode I\), not 8- or 16-bit class ids"):
        scan_table([path], None, max_pixels=1000)


def _resigned(body: dict[str, object]) -> dict[str, object]:
    """``body`` with the checksum shardkit would give it (edited but self-consistent: the field checks decide)."""
    from shardkit.support.smallfile import checksum

    body = {k: v for k, v in body.items() if k != "checksum"}
    return {**body, "checksum": checksum(body)}


def _extra_value(good: dict) -> dict:  # type: ignore[type-arg]
    return {**good, "size": 6, "values": [*good["values"], [5, 1, "x.png"]]}


#: A scan cache damaged or edited in each way: (what is written, given the good cache's parsed JSON).
SCAN_CACHE_DAMAGE = {
    "one extra value (checksum not updated)": lambda good: json.dumps(_extra_value(good)),
    "size 1e12": lambda good: json.dumps(_resigned({**good, "size": 1e12})),
    "size 10**12": lambda good: json.dumps(_resigned({**good, "size": 10**12})),
    "a -1 value": lambda good: json.dumps(_resigned({**good, "values": [[-1, 5, "a.png"], *good["values"][1:]]})),
    "a value past size": lambda good: json.dumps(_resigned({**good, "values": [*good["values"], [7, 1, "a.png"]]})),
    "a value twice": lambda good: json.dumps(_resigned({**good, "values": [*good["values"], good["values"][0]]})),
    "a string count": lambda good: json.dumps(_resigned({**good, "values": [[0, "3", "a.png"]]})),
    "100,000-deep JSON": lambda good: "[" * 100_000 + "]" * 100_000,
    "not JSON": lambda good: "{",
    "no checksum": lambda good: json.dumps({k: v for k, v in good.items() if k != "checksum"}),
}


@pytest.mark.parametrize("case", sorted(SCAN_CACHE_DAMAGE))
def test_a_damaged_scan_cache_is_dropped_with_a_warning_and_the_labels_scanned_again(
        tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture) -> None:
    """Never trusted (a 6-class table for 3-class data), never a traceback or a huge allocation: a warning, then
    the table a fresh scan gives, and the cache rewritten."""
    from shardkit.labels.idscan import SCAN_CACHE, ScanCache

    a = save(tmp_path / "a.png", np.array([[0, 1], [1, 2]], np.uint8))
    where, names = tmp_path / SCAN_CACHE, [str(a)]
    cache = ScanCache.of(where, names, "options")
    assert cache is not None
    fresh = scan_table(names, None, max_pixels=1000, cache=cache)
    cache.save()
    where.write_text(SCAN_CACHE_DAMAGE[case](json.loads(where.read_text())))
    again = ScanCache.of(where, names, "options")
    caplog.set_level("INFO", logger="shardkit.labels.idscan")
    assert again is not None and again.load() is None
    said = "older shardkit" if case == "no checksum" else "damaged"  # not trusted either, but no damage to warn of
    assert said in caplog.text and "scanned again" in caplog.text
    redo = scan_table(names, None, max_pixels=1000, cache=again)
    assert redo.table == fresh.table and redo.table.num_classes == 3
    again.save()
    reread = ScanCache.of(where, names, "options")
    assert reread is not None and reread.load() is not None  # rebuilt


def test_a_scan_cache_that_is_a_fifo_or_folder_is_dropped_without_hanging(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    import os

    from shardkit.labels.idscan import SCAN_CACHE, ScanCache

    a = save(tmp_path / "a.png", np.array([[0, 1], [1, 2]], np.uint8))
    where = tmp_path / SCAN_CACHE
    os.mkfifo(where)
    try:
        cache = ScanCache.of(where, [str(a)], "options")
        assert cache is not None and cache.load() is None  # no hang: the FIFO is never opened for a blocking read
        assert "not a regular file (a FIFO)" in caplog.text
    finally:
        where.unlink()
    where.mkdir()
    cache = ScanCache.of(where, [str(a)], "options")
    assert cache is not None and cache.load() is None
    assert "not a regular file (a folder)" in caplog.text


@pytest.mark.timeout(60)
def test_saving_the_scan_cache_never_writes_into_a_fifo_left_at_its_temp_name(tmp_path: Path) -> None:
    import os

    from shardkit.labels.idscan import SCAN_CACHE, ScanCache

    a = save(tmp_path / "a.png", np.array([[0, 1], [1, 2]], np.uint8))
    where = tmp_path / SCAN_CACHE
    cache = ScanCache.of(where, [str(a)], "options")
    assert cache is not None
    scan_table([str(a)], None, max_pixels=1000, cache=cache)
    os.mkfifo(tmp_path / f".{SCAN_CACHE}.{os.getpid()}.tmp")  # opened for writing, it would wait for a reader
    cache.save()
    again = ScanCache.of(where, [str(a)], "options")
    assert again is not None and again.load() is not None


def test_the_scan_queues_a_window_of_files_at_a_time_and_counts_every_file(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each queued file holds a future: the scan queues at most ``WINDOW`` of them (200,000 queued at once held
    ~300 MB, #42), and still counts every file and names the first file of each value across the windows."""
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 3, (4, 5), dtype=np.uint8) for _ in range(10)]
    arrays[7][0, 0] = 6  # a value first seen in the third window
    arrays[9][0, 0] = 6
    paths = [save(tmp_path / f"{i:02d}.png", a) for i, a in enumerate(arrays)]
    queued: list[int] = []

    class Counting(ThreadPoolExecutor):
        def map(self, fn: Any, *iterables: Any, **kwargs: Any) -> Any:
            items = list(iterables[0])
            queued.append(len(items))
            return super().map(fn, items, **kwargs)

    monkeypatch.setattr(idscan, "WINDOW", 3)
    monkeypatch.setattr(idscan, "ThreadPoolExecutor", Counting)
    total, first = idscan.scan_label_values([str(p) for p in paths], max_pixels=1000, threads=2)
    assert queued == [3, 3, 3, 1]
    want = np.bincount(np.concatenate([a.ravel() for a in arrays]))
    assert total.tolist() == want.tolist()
    assert first == {v: paths[next(i for i, a in enumerate(arrays) if (a == v).any())]
                     for v in np.flatnonzero(want).tolist()}
    assert first[6] == paths[7]
