"""The bad-input matrix: every broken input gets one clear line (file, problem, fix), a documented exit
code, and nothing already written is lost."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from shardkit.verify import verify_split
from tests.sample_records import records


def make_raw(camvid_root: Path, dst: Path, n: int = 4) -> list[str]:
    names = sorted(p.name for p in (camvid_root / "val").iterdir())[:n]
    for sub in ("val", "valannot"):
        (dst / sub).mkdir(parents=True, exist_ok=True)
        for name in names:
            (dst / sub / name).write_bytes((camvid_root / sub / name).read_bytes())
    return names


def invoke(*args: object):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def one_line_error(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


def truncated(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 3])


def zero_bytes(p: Path) -> None:
    p.write_bytes(b"")


def not_an_image(p: Path) -> None:
    p.write_text("this is a text file with a .png name\n")


def other_size_label(p: Path) -> None:
    label = cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
    cv2.imwrite(str(p), label[:-8, :-8])


def label_16bit_out_of_range(p: Path) -> None:
    label = cv2.imread(str(p), cv2.IMREAD_UNCHANGED).astype(np.uint16)
    label[0, :5] = 1000
    cv2.imwrite(str(p), label)


def id_too_large(p: Path) -> None:
    label = cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
    label[:3, :3] = 20
    cv2.imwrite(str(p), label)


CASES: dict[str, tuple[str, Callable[[Path], None], str]] = {
    # name: (which file: image/label, damage, words the error must contain)
    "truncated_png": ("image", truncated, "decode"),
    "zero_byte_file": ("image", zero_bytes, "empty"),
    "non_image_with_png_name": ("image", not_an_image, "decode"),
    "label_of_other_size": ("label", other_size_label, "352"),
    "label_16bit_out_of_range": ("label", label_16bit_out_of_range, "1000"),
    "id_not_below_num_classes": ("label", id_too_large, "20"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gives_one_line_and_keeps_previous_output(case: str, camvid_root: Path, tmp_path: Path) -> None:
    which, damage, words = CASES[case]
    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw)
    out = tmp_path / "out"
    assert invoke("convert", raw, out, "-q", "--workers", "1").exit_code == 0
    before = (out / "val" / "manifest.json").read_bytes()
    target = raw / ("val" if which == "image" else "valannot") / names[2]
    damage(target)
    res = invoke("convert", raw, out, "-q", "--workers", "2", "--shard-size", "2")
    assert res.exit_code == 1
    line = one_line_error(res.output)
    assert names[2] in line and words in line.lower() and "fix:" in line
    assert (out / "val" / "manifest.json").read_bytes() == before, "the previous manifest must stay"
    assert verify_split(out / "val").ok, "the previous output must stay readable"
    skip = invoke("convert", raw, tmp_path / "skip", "-q", "--on-error", "skip")
    assert skip.exit_code == 3
    manifest = json.loads((tmp_path / "skip" / "val" / "manifest.json").read_text())
    assert [s["key"] for s in manifest["skipped"]] == [f"val/{names[2]}"]
    reason = manifest["skipped"][0]["reason"]
    assert names[2] in reason and "--on-error skip" not in reason  # the fix it would suggest was taken


def test_a_corrupt_png_is_one_line_without_decoder_chatter(camvid_root: Path, tmp_path: Path) -> None:
    """OpenCV/libpng write warnings straight to fd 2; the user sees only shardkit's line (a real process)."""
    import subprocess
    import sys

    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw, n=2)
    target = raw / "valannot" / names[1]
    target.write_bytes(target.read_bytes()[:3000])
    for workers in ("1", "2"):
        res = subprocess.run([sys.executable, "-m", "shardkit", "convert", str(raw), str(tmp_path / f"o{workers}"),
                              "-q", "--workers", workers], capture_output=True, text=True, timeout=120)
        assert res.returncode == 1
        assert res.stderr.strip().splitlines() == [one_line_error(res.stderr)], res.stderr


def test_unreadable_file_is_named(camvid_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw)
    victim = (raw / "val" / names[1]).resolve()
    real_open = open

    def guarded_open(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        if Path(file).resolve() == victim:
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", guarded_open)  # root ignores chmod, so simulate EACCES
    res = invoke("convert", raw, tmp_path / "out", "-q", "--workers", "1")
    assert res.exit_code == 1
    line = one_line_error(res.output)
    assert names[1] in line and "permission" in line.lower()


@pytest.mark.parametrize("mode", ["RGBA", "grayscale"])
def test_rgba_and_grayscale_images_are_converted_explicitly(mode: str, camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw, n=2)
    p = raw / "val" / names[0]
    bgr = cv2.imread(str(p), cv2.IMREAD_COLOR)
    if mode == "RGBA":
        cv2.imwrite(str(p), cv2.cvtColor(bgr, cv2.COLOR_BGR2BGRA))
        want = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    else:
        gray = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
        cv2.imwrite(str(p), gray)
        want = np.repeat(gray[:, :, None], 3, axis=2)
    assert invoke("convert", raw, tmp_path / "out", "-q").exit_code == 0
    image, _ = shardkit.open(tmp_path / "out" / "val")[0]
    np.testing.assert_array_equal(image, want)


def test_duplicate_stems_in_one_split(camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw, n=2)
    stem = Path(names[0]).stem
    bgr = cv2.imread(str(raw / "val" / names[0]))
    cv2.imwrite(str(raw / "val" / f"{stem}.jpg"), bgr)
    res = invoke("convert", raw, tmp_path / "out", "-q")
    assert res.exit_code == 1
    line = one_line_error(res.output)
    assert stem in line and ".jpg" in line


def test_empty_input_folder(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    res = invoke("convert", tmp_path / "raw", tmp_path / "out")
    assert res.exit_code == 1
    assert "raw" in one_line_error(res.output)


def test_output_inside_input(camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    make_raw(camvid_root, raw, n=2)
    res = invoke("convert", raw, raw / "shards")
    assert res.exit_code == 1
    assert "inside the input" in one_line_error(res.output)


def test_full_disk_is_one_line_and_keeps_previous_output(camvid_root: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    raw = tmp_path / "raw"
    make_raw(camvid_root, raw)
    out = tmp_path / "out"
    assert invoke("convert", raw, out, "-q", "--size", "352x480").exit_code == 0
    before = (out / "val" / "manifest.json").read_bytes()
    from shardkit.formats.npy import NpyWriter

    def no_space(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(NpyWriter, "add", no_space)  # in-process (--workers 1), simulates ENOSPC
    res = invoke("convert", raw, out, "-q", "--size", "320x480", "--workers", "1")
    assert res.exit_code == 1
    line = one_line_error(res.output)
    assert "No space left" in line and "free disk space" in line
    assert (out / "val" / "manifest.json").read_bytes() == before
    assert verify_split(out / "val").ok


@pytest.mark.parametrize("fmt", ["npy", "lmdb"])
def test_skip_with_fixed_size_writes_the_rest(fmt: str, camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw)
    truncated(raw / "val" / names[1])
    out = tmp_path / "out"
    res = invoke("convert", raw, out, "-q", "--format", fmt, "--size", "96x128", "--on-error", "skip",
                 "--workers", "1")
    assert res.exit_code == 3, res.output
    assert "Traceback" not in res.output
    manifest = json.loads((out / "val" / "manifest.json").read_text())
    assert [s["key"] for s in manifest["skipped"]] == [f"val/{names[1]}"]
    assert manifest["num_samples"] == len(names) - 1
    assert verify_split(out / "val").ok
    assert len(shardkit.open(out / "val")) == len(names) - 1


def _png_header_only(path: Path, height: int, width: int) -> None:
    """A PNG whose IHDR claims height x width (no pixel data: the check must refuse it before decoding)."""
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk)


def test_max_pixels_refuses_huge_header_before_decoding(camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw)
    _png_header_only(raw / "val" / names[1], 40000, 40000)
    res = invoke("convert", raw, tmp_path / "out", "-q", "--workers", "1")
    assert res.exit_code == 1
    line = one_line_error(res.output)
    assert names[1] in line and "40000x40000" in line and "--max-pixels" in line
    skip = invoke("convert", raw, tmp_path / "skip", "-q", "--workers", "1", "--on-error", "skip")
    assert skip.exit_code == 3
    # a lower limit refuses the real (360x480) images too, and is read from the environment
    low = CliRunner(env={"SHARDKIT_MAX_PIXELS": "1000"}).invoke(main, ["convert", str(raw), str(tmp_path / "low"),
                                                                       "-q", "--workers", "1"])
    assert low.exit_code == 1 and "--max-pixels 1000" in one_line_error(low.output)


def test_size_above_max_pixels_is_a_usage_error(camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    make_raw(camvid_root, raw, n=2)
    res = invoke("convert", raw, tmp_path / "out", "--size", "100000x70000")
    assert res.exit_code == 2
    assert "--max-pixels" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "out").exists()
    res = invoke("convert", raw, tmp_path / "out", "--size", "96x128", "--max-pixels", "1000")
    assert res.exit_code == 2 and "--max-pixels 1000" in res.output


NOT_REGULAR: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (lambda p: os.mkfifo(p), "fifo"),
    "symlink_loop": (lambda p: p.symlink_to(p.name), "symbolic link loop"),
    "broken_symlink": (lambda p: p.symlink_to("/nonexistent/shardkit/x.png"), "broken symbolic link"),
}


@pytest.mark.parametrize("case", sorted(NOT_REGULAR))
@pytest.mark.parametrize("which", ["val", "valannot"])
def test_only_regular_files_are_inputs(case: str, which: str, camvid_root: Path, tmp_path: Path) -> None:
    make, words = NOT_REGULAR[case]
    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw)
    target = raw / which / names[1]
    target.unlink()
    make(target)
    res = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "out"), "-q", "--workers", "1"],
                             catch_exceptions=False)
    assert res.exit_code == 1
    line = one_line_error(res.output)
    assert names[1] in line and words in line.lower() and "vanished" not in line
    skip = invoke("convert", raw, tmp_path / "skip", "-q", "--workers", "1", "--on-error", "skip")
    assert skip.exit_code == 3, skip.output
    manifest = json.loads((tmp_path / "skip" / "val" / "manifest.json").read_text())
    assert [s["key"] for s in manifest["skipped"]] == [f"val/{names[1]}"]


def test_object_storage_url_errors_are_one_line_and_leave_no_local_folder(camvid_root: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """URLs are object storage (docs/object-storage.md), never a local folder named 's3:'; an unreachable
    endpoint or a scheme without its fsspec backend is one line, exit 1 (tests/test_object_storage.py has the rest)."""
    raw = tmp_path / "raw"
    make_raw(camvid_root, raw, n=2)
    monkeypatch.chdir(tmp_path)
    res = invoke("convert", raw, "s3://bucket/out", "-q", "--storage-option", "endpoint_url=http://127.0.0.1:9",
                 "--storage-option", "config_kwargs.retries.max_attempts=1", "--storage-option", "key=k",
                 "--storage-option", "secret=s")  # nothing listens on port 9: nothing is contacted
    assert res.exit_code == 1 and "s3://bucket/out" in res.output and "Traceback" not in res.output, res.output
    res = invoke("convert", "gs://bucket/raw", tmp_path / "out", "-q")
    assert res.exit_code == 1 and "gs://bucket/raw" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "gs:").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["1" + "0" * 400, "1" + "0" * 400 + "MB", "1" + "0" * 400 + "GiB"])
def test_absurd_shard_size_is_a_usage_error(value: str, camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    make_raw(camvid_root, raw, n=2)
    res = invoke("convert", raw, tmp_path / "out", "-q", "--shard-size", value)
    assert res.exit_code == 2, res.output
    assert "too large" in res.output and "Traceback" not in res.output


def test_output_whose_parent_is_a_file(camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    make_raw(camvid_root, raw, n=2)
    (tmp_path / "afile").write_text("not a folder\n")
    res = invoke("convert", raw, tmp_path / "afile" / "out", "-q", "--workers", "1")
    assert res.exit_code == 1
    line = one_line_error(res.output)
    assert "afile" in line and "cannot create the output folder" in line and "fix:" in line


def test_other_os_errors_are_one_line(camvid_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = tmp_path / "raw"
    make_raw(camvid_root, raw, n=2)

    def denied(result: Any) -> None:  # root ignores chmod, so simulate EACCES (renaming a shard into place)
        raise PermissionError(errno.EACCES, "Permission denied", str(result.directory / ".shard-x.json"))

    # (a failure writing the fingerprint cache, after the publish, is a warning:
    # tests/conversion/test_pipeline_publish_outcome.py)
    monkeypatch.setattr("shardkit.conversion.pipeline.publish_files", denied)
    res = invoke("convert", raw, tmp_path / "out", "-q", "--workers", "1")
    assert res.exit_code == 1
    line = one_line_error(res.output)
    assert ".shard-x.json" in line and "Permission denied" in line and "fix:" in line


def test_a_jpeg_label_is_named_as_the_cause(camvid_root: Path, tmp_path: Path) -> None:
    """A JPEG id label is refused up front (lossy edges). Its ids (0..11) lie one apart, so compression noise
    cannot be told from them: no flag is offered (--threshold 127 would make it all background, a --label-map of
    ranges would merge classes), only a lossless export."""
    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw, n=2)
    label = raw / "valannot" / names[0]
    ids = cv2.imread(str(label), cv2.IMREAD_UNCHANGED)
    label.unlink()
    cv2.imwrite(str(label.with_suffix(".jpg")), ids, [cv2.IMWRITE_JPEG_QUALITY, 90])
    res = invoke("convert", raw, tmp_path / "out", "-q", "--workers", "1")
    assert res.exit_code == 1
    line = one_line_error(res.output)
    assert f"{names[0][:-4]}.jpg" in line and "is a JPEG" in line and "no flag reads it exactly" in line
    assert "--threshold" not in line and "--label-map" not in line and "--num-classes" not in line


def test_png_header_with_zero_size_is_one_line_without_libpng_chatter(camvid_root: Path, tmp_path: Path) -> None:
    """A PNG whose IHDR says 0x0: libpng prints its own warning and error to fd 2 when asked to decode it."""
    import struct
    import subprocess
    import sys
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw, n=2)
    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", 0, 0, 8, 2, 0, 0, 0))
    (raw / "val" / names[1]).write_bytes(b"\x89PNG\r\n\x1a\n" + ihdr + chunk(b"IDAT", zlib.compress(b"\0"))
                                         + chunk(b"IEND", b""))
    res = subprocess.run([sys.executable, "-m", "shardkit", "convert", str(raw), str(tmp_path / "out"), "-q",
                          "--workers", "1"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [one_line_error(res.stderr)], res.stderr
    assert names[1] in res.stderr and "0x0" in res.stderr


@pytest.mark.parametrize("which", ["val", "valannot"])
def test_file_name_that_is_not_utf8_is_one_line(which: str, camvid_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw, n=2)
    os.rename(bytes(raw / which / names[1]), bytes(raw / which) + b"/\xff\xfe" + names[1].encode())  # noqa: PTH104
    res = invoke("convert", raw, tmp_path / "out", "-q", "--workers", "1")
    assert res.exit_code == 1
    assert "not valid UTF-8" in one_line_error(res.output)


def test_folder_symlink_loop_is_walked_once(camvid_root: Path, tmp_path: Path) -> None:
    """``val/sub -> ..`` (and ``val/again -> .``) must not add the same images again under longer names."""
    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw, n=3)
    (raw / "val" / "sub").symlink_to("..")
    (raw / "val" / "again").symlink_to(".")
    res = invoke("convert", raw, tmp_path / "out", "-q", "--workers", "1")
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "out" / "val" / "manifest.json").read_text())
    assert sorted(s["key"] for s in records(tmp_path / "out" / "val", manifest)) == [f"val/{n}" for n in names]


def test_input_file_far_larger_than_its_header_is_refused_unread(camvid_root: Path, tmp_path: Path) -> None:
    """A real PNG followed by 4 GiB of (sparse) zeros decodes fine, but would be read whole into memory."""
    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw, n=2)
    with open(raw / "val" / names[1], "r+b") as fh:
        fh.truncate(4 << 30)
    res = invoke("convert", raw, tmp_path / "out", "-q", "--workers", "1")
    assert res.exit_code == 1
    line = one_line_error(res.output)
    assert names[1] in line and "4294967296 bytes" in line


@pytest.mark.parametrize("option", ["--class-dict", "--palette", "--config"])
@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
def test_option_file_that_is_not_a_regular_file_is_refused_unread(option: str, target: str, camvid_root: Path,
                                                                  tmp_path: Path) -> None:
    """/dev/zero as a class table used to be read until the machine ran out of memory; a FIFO blocked."""
    raw = tmp_path / "raw"
    make_raw(camvid_root, raw, n=2)
    if target == "fifo":
        target = str(tmp_path / "table.csv")
        os.mkfifo(target)
    res = invoke("convert", raw, tmp_path / "out", "-q", "--workers", "1", option, target)
    assert res.exit_code in (1, 2)
    assert "not a regular file" in one_line_error(res.output)


def test_list_file_that_is_a_device_is_refused(camvid_root: Path, tmp_path: Path) -> None:
    """val.txt -> /dev/zero is not a list file (it used to be read as one endless first line)."""
    raw = tmp_path / "raw"
    make_raw(camvid_root, raw, n=2)
    (raw / "val.txt").symlink_to("/dev/zero")
    res = invoke("convert", raw, tmp_path / "out", "-q", "--workers", "1", "--layout", "listfile")
    assert res.exit_code == 1
    assert "listfile" in one_line_error(res.output)


def _bomb_jpeg(path: Path, h: int, w: int) -> None:
    """A real 16x16 JPEG (under 1 KB) whose frame header says h x w, behind two 0xFF fill bytes: libjpeg would
    allocate h x w x 3 bytes before finding out the data is short."""
    _ok, buf = cv2.imencode(".jpg", np.zeros((16, 16, 3), np.uint8))
    raw = buf.tobytes()
    sof = raw.index(b"\xff\xc0")
    frame = raw[sof + 2 :]
    path.write_bytes(raw[:sof] + b"\xff\xff\xff\xc0" + frame[:3] + h.to_bytes(2, "big") + w.to_bytes(2, "big")
                     + frame[7:])


def _convert_limited(args: list[str], limit: int = 3 << 30) -> tuple[int, str]:
    """``shardkit convert ARGS`` in a subprocess whose address space is capped at ``limit`` bytes."""
    import subprocess
    import sys

    code = (f"import resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
            "from shardkit.cli import main; sys.argv = ['shardkit', 'convert'] + sys.argv[1:]; main()")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    return proc.returncode, proc.stdout + proc.stderr


def _bomb_tiff(path: Path, h: int, w: int) -> None:
    """A 100-byte TIFF whose directory says h x w 8-bit RGB pixels in one strip (libtiff would allocate them)."""
    import struct

    entries = [(256, 4, 1, w), (257, 4, 1, h), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 2), (273, 4, 1, 8),
               (277, 3, 1, 3), (278, 4, 1, h), (279, 4, 1, 3 * h * w % 2**32)]
    ifd = struct.pack("<H", len(entries)) + b"".join(struct.pack("<HHII", *e) for e in entries) + bytes(4)
    path.write_bytes(b"II*\x00" + struct.pack("<I", 8) + ifd)


@pytest.mark.parametrize("shard_size", ["500", "64MB"])  # 64MB: shards planned from every image's header
@pytest.mark.parametrize("bomb", ["jpeg", "hdr", "tiff"])
def test_a_decompression_bomb_is_refused_before_any_decoder_runs(camvid_root: Path, tmp_path: Path,
                                                                 shard_size: str, bomb: str) -> None:
    """A 30000x30000 JPEG of under 1 KB (5.2 GB RSS before), and a Radiance HDR named .png (OpenCV decodes what
    PIL cannot parse: OOM-killed at 6 GB before): one line, under a 3 GB address-space cap."""
    raw = tmp_path / "raw"
    names = make_raw(camvid_root, raw, n=2)
    target = raw / "val" / names[1]
    if bomb == "jpeg":
        _bomb_jpeg(target, 30000, 30000)
    elif bomb == "tiff":
        _bomb_tiff(target, 30000, 30000)
    else:
        target.write_bytes(b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 30000 +X 30000\n" + bytes(64))
    rc, output = _convert_limited([str(raw), str(tmp_path / "out"), "-q", "--workers", "1", "--shard-size",
                                   shard_size])
    assert rc == 1, output
    line = one_line_error(output)
    assert names[1] in line
    assert ("Radiance HDR" in line if bomb == "hdr"
            else "30000x30000 = 900000000 pixels, more than --max-pixels 16777216" in line)
    assert not (tmp_path / "out" / "val" / "manifest.json").exists()


def _lmdb_commit_failed() -> Exception:
    import lmdb

    return lmdb.Error("mdb_txn_commit: Input/output error")


def _hdf5_flush_failed() -> Exception:  # h5py's text: the OS error inside a message that spans two lines
    return RuntimeError("Unable to flush raw data (file write failed: time = Fri Nov 27 10:00:00 2026\n, filename = "
                        "'x.h5', file descriptor = 5, errno = 28, error message = 'No space left on device', buf = "
                        "0x5, total write size = 164944)")


@pytest.mark.parametrize(("fmt", "writer", "method", "error", "says"), [
    ("lmdb", "shardkit.formats.lmdb.LmdbWriter", "add", _lmdb_commit_failed, "mdb_txn_commit: Input/output error"),
    ("lmdb", "shardkit.formats.lmdb.LmdbWriter", "_finish", _lmdb_commit_failed, "Input/output error"),
    ("hdf5", "shardkit.formats.hdf5.Hdf5Writer", "add", _hdf5_flush_failed, "(No space left on device)"),
    ("hdf5", "shardkit.formats.hdf5.Hdf5Writer", "_finish", _hdf5_flush_failed, "(No space left on device)"),
])
def test_a_writer_library_error_is_one_line(camvid_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            fmt: str, writer: str, method: str, error: Callable[[], Exception],
                                            says: str) -> None:
    """LMDB reports a full disk as ``lmdb.Error``, h5py as a RuntimeError spanning two lines: one line each."""
    raw = tmp_path / "raw"
    make_raw(camvid_root, raw)
    out = tmp_path / "out"
    assert invoke("convert", raw, out, "-q", "--format", fmt, "--size", "96x128").exit_code == 0
    before = (out / "val" / "manifest.json").read_bytes()

    def fails(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise error()

    monkeypatch.setattr(f"{writer}.{method}", fails)
    res = invoke("convert", raw, out, "-q", "--format", fmt, "--size", "64x96", "--workers", "1")
    assert res.exit_code == 1
    line = one_line_error(res.output)
    assert says in line and "free disk space" in line and "errno" not in line
    assert (out / "val" / "manifest.json").read_bytes() == before
    assert verify_split(out / "val").ok
    assert not [p for p in (out / "val").iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("fmt", ["npy", "lmdb", "hdf5", "tfrecord"])
def test_a_really_full_disk_is_one_line_and_keeps_previous_output(camvid_root: Path, small_tmpfs: Path,
                                                                  fmt: str) -> None:
    """A real full disk (a 4 MiB tmpfs), in a real process: no traceback, no crash at exit (HDF5 left open after
    a failed flush crashed the process with SIGSEGV), the previous output intact."""
    import subprocess
    import sys

    out = small_tmpfs / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def run(size: str, shard_size: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shardkit", "convert", str(camvid_root), str(out), "--split",
                               "val", "-q", "--workers", "1", "--format", fmt, "--size", size, "--shard-size",
                               shard_size], capture_output=True, text=True, timeout=300, env=env)

    assert run("48x64", "500").returncode == 0
    before = (out / "val" / "manifest.json").read_bytes()
    for shard_size in ("500", "4"):  # fills up inside the first shard, or after some shards are finished
        res = run("360x480", shard_size)
        output = res.stdout + res.stderr
        assert res.returncode == 1, output
        lines = output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error:") and "Traceback" not in output, output
        assert "space" in lines[0].lower()
        assert (out / "val" / "manifest.json").read_bytes() == before
        assert verify_split(out / "val").ok
        assert not [p for p in (out / "val").iterdir() if ".tmp-" in p.name]
