"""imageio: decoding image and label files (OpenCV, libspng, PIL), header reads, one-line errors."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from shardkit.errors import DecodeError, InputNotFoundError
from shardkit.images.imageio import _jpeg_truncated, _png_plain_8bit, decode_image, decode_label_pixels, read_image_size
from shardkit.images.imagetypes import ImageOptions

RNG = np.random.default_rng(2024)
Arm = Callable[[], None]


def write(path: Path, arr: np.ndarray, params: list[int] | None = None) -> Path:
    """Encode ``arr`` (already in OpenCV channel order) by the path's suffix; non-ASCII-path safe."""
    _ok, buf = cv2.imencode(path.suffix, arr, params or [])
    assert _ok
    buf.tofile(path)
    return path


def rgb_image(h: int = 24, w: int = 32) -> np.ndarray:
    return RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)


# --------------------------------------------------------------------------- decode_image


@pytest.mark.parametrize(
    ("suffix", "params"),
    [(".png", []), (".bmp", []), (".tiff", []), (".webp", [cv2.IMWRITE_WEBP_QUALITY, 101])],
)
def test_decode_image_lossless_formats_give_exact_rgb(tmp_path: Path, suffix: str, params: list[int]) -> None:
    rgb = rgb_image()
    p = write(tmp_path / f"img{suffix}", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), params)
    out = decode_image(p)
    assert out.dtype == np.uint8 and out.shape == (24, 32, 3) and out.flags.c_contiguous
    assert np.array_equal(out, rgb)


def test_decode_image_jpeg_is_rgb_ordered(tmp_path: Path) -> None:
    rgb = np.zeros((16, 16, 3), np.uint8)
    rgb[..., 0] = 250  # pure red
    p = write(tmp_path / "img.jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 95])
    out = decode_image(p)
    assert out.shape == (16, 16, 3)
    assert out[..., 0].min() > 240 and out[..., 1:].max() < 10


def test_decode_image_real_camvid_matches_opencv(camvid_root: Path) -> None:
    f = sorted((camvid_root / "train").glob("*.png"))[0]
    out = decode_image(f)
    assert out.shape == (360, 480, 3)
    assert np.array_equal(out, cv2.imread(str(f), cv2.IMREAD_COLOR)[:, :, ::-1])


def test_decode_image_grayscale_is_stacked_to_three_channels(tmp_path: Path) -> None:
    grey = RNG.integers(0, 256, (10, 12), dtype=np.uint8)
    out = decode_image(write(tmp_path / "g.png", grey))
    assert out.shape == (10, 12, 3)
    for c in range(3):
        assert np.array_equal(out[..., c], grey)


def test_decode_image_drops_alpha(tmp_path: Path) -> None:
    rgb = rgb_image(8, 9)
    bgra = np.dstack([cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), np.zeros((8, 9), np.uint8)])
    out = decode_image(write(tmp_path / "a.png", bgra))
    assert np.array_equal(out, rgb)  # colours kept as stored, not blended by the (zero) alpha


def test_decode_image_16bit_is_kept_as_stored_and_shifted_only_when_asked(tmp_path: Path) -> None:
    rgb16 = RNG.integers(0, 65536, (6, 7, 3), dtype=np.uint16)
    p = write(tmp_path / "d.png", cv2.cvtColor(rgb16, cv2.COLOR_RGB2BGR))
    out = decode_image(p)
    assert out.dtype == np.uint16 and np.array_equal(out, rgb16)  # never rescaled silently
    shifted = decode_image(p, options=ImageOptions("uint8", "shift"))
    assert shifted.dtype == np.uint8 and np.array_equal(shifted, (rgb16 >> 8).astype(np.uint8))
    with pytest.raises(DecodeError, match="--rescale"):
        decode_image(p, options=ImageOptions("uint8"))


def test_decode_image_float_tiff_is_kept(tmp_path: Path) -> None:
    values = RNG.normal(0, 10, (4, 5)).astype(np.float32)
    p = write(tmp_path / "f.tiff", values)
    out = decode_image(p)
    assert out.dtype == np.float32 and out.shape == (4, 5, 1) and np.array_equal(out[:, :, 0], values)


def test_decode_image_float64_is_refused_unless_converted(tmp_path: Path) -> None:
    p = tmp_path / "d.npy"
    np.save(p, np.ones((4, 5), np.float64))
    with pytest.raises(DecodeError, match="float64"):
        decode_image(p)
    assert decode_image(p, options=ImageOptions("float32")).dtype == np.float32


def test_decode_image_non_ascii_path(tmp_path: Path) -> None:
    d = tmp_path / "画像 données"
    d.mkdir()
    rgb = rgb_image(5, 6)
    p = write(d / "ß.png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert np.array_equal(decode_image(p), rgb)


def _truncated(suffix: str) -> bytes:
    _ok, buf = cv2.imencode(suffix, cv2.cvtColor(rgb_image(40, 50), cv2.COLOR_RGB2BGR))
    data = buf.tobytes()
    return data[: int(len(data) * 0.6)]


def test_decode_label_pixels_real_labels_match_opencv_bit_exactly(camvid_root: Path, rgb_masks_root: Path) -> None:
    """The libspng fast path (8-bit gray ids, RGB colour masks) gives OpenCV's IMREAD_UNCHANGED pixels."""
    files = sorted((camvid_root / "trainannot").glob("*.png")) + sorted(rgb_masks_root.rglob("*_color_mask.png"))
    kinds = set()
    for f in files:
        data = np.fromfile(f, np.uint8)
        assert _png_plain_8bit(data), f
        kinds.add(int(data[25]))
        assert np.array_equal(decode_label_pixels(f), cv2.imdecode(data, cv2.IMREAD_UNCHANGED)), f
    assert kinds == {0, 2}, "both gray id maps and RGB colour masks were compared"


def _with_trns(png: bytes, payload: bytes) -> bytes:
    """Insert a tRNS chunk right after IHDR (8-byte signature + 25-byte IHDR chunk)."""
    chunk = len(payload).to_bytes(4, "big") + b"tRNS" + payload
    return png[:33] + chunk + zlib.crc32(chunk[4:]).to_bytes(4, "big") + png[33:]


def test_decode_label_pixels_leaves_transparency_palette_and_16bit_to_opencv(tmp_path: Path) -> None:
    gray = RNG.integers(0, 12, (7, 9), dtype=np.uint8)
    _ok, buf = cv2.imencode(".png", gray)
    cases = {
        "gray.png": (buf.tobytes(), True),
        "trns.png": (_with_trns(buf.tobytes(), b"\x00\x03"), False),
        "deep.png": (cv2.imencode(".png", gray.astype(np.uint16) * 1000)[1].tobytes(), False),
        "bgra.png": (cv2.imencode(".png", np.dstack([gray] * 4))[1].tobytes(), False),
    }
    Image.fromarray(gray, mode="L").convert("P").save(tmp_path / "pal.png")
    cases["pal.png"] = ((tmp_path / "pal.png").read_bytes(), False)
    for name, (content, fast) in cases.items():
        p = tmp_path / name
        p.write_bytes(content)
        data = np.fromfile(p, np.uint8)
        assert _png_plain_8bit(data) is fast, name
        assert np.array_equal(decode_label_pixels(p), cv2.imdecode(data, cv2.IMREAD_UNCHANGED)), name


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("empty.png", b""),
        ("text.png", b"this is not an image\n"),
        ("trunc.png", _truncated(".png")),
        ("trunc.jpg", _truncated(".jpg")),
        ("trunc.webp", _truncated(".webp")),
    ],
)
def test_decode_image_corrupt_files_are_decode_errors(tmp_path: Path, name: str, content: bytes) -> None:
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(DecodeError) as e:
        decode_image(p)
    msg = str(e.value)
    assert str(p) in msg and "cannot decode image" in msg and "fix:" in msg and "\n" not in msg
    if not content:
        assert "0 bytes" in msg


def test_jpeg_without_end_marker_after_the_last_scan_counts_as_truncated() -> None:
    _ok, buf = cv2.imencode(".jpg", rgb_image())
    assert not _jpeg_truncated(buf)
    assert _jpeg_truncated(np.frombuffer(buf.tobytes()[:-100], np.uint8))
    assert not _jpeg_truncated(np.frombuffer(b"\x89PNG....", np.uint8))


def test_decode_image_missing_file_is_input_not_found(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError):
        decode_image(tmp_path / "missing.png")


# --------------------------------------------------------------------------- read_image_size


def test_read_image_size_reads_the_header(tmp_path: Path, camvid_root: Path) -> None:
    assert read_image_size(sorted((camvid_root / "train").glob("*.png"))[0]) == (360, 480)
    p = write(tmp_path / "x.jpg", rgb_image(13, 29))
    assert read_image_size(p) == (13, 29)
    # Only the header is read: a PNG cut after its header still reports its size.
    full = (tmp_path / "x.png").with_suffix(".png")
    write(full, rgb_image(17, 23))
    cut = tmp_path / "cut.png"
    cut.write_bytes(full.read_bytes()[:64])
    assert read_image_size(cut) == (17, 23)


def test_read_image_size_errors(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError):
        read_image_size(tmp_path / "missing.png")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(DecodeError):
        read_image_size(bad)



def test_libspng_and_opencv_decode_real_pngs_identically(camvid_root: Path, rgb_masks_root: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import shardkit.images.imageio as tr

    assert tr._spng is not None, "pyspng is a dependency: the fast PNG path must be what the tests exercise"
    files = sorted((camvid_root / "val").glob("*.png"))[:5] + sorted((rgb_masks_root / "train").glob("*.png"))[:5]
    fast = [tr.decode_image(f) for f in files]
    monkeypatch.setattr(tr, "_spng", None)
    slow = [tr.decode_image(f) for f in files]
    for f, a, b in zip(files, fast, slow, strict=True):
        assert a.dtype == b.dtype == np.uint8 and np.array_equal(a, b), f


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P", "I;16"])
def test_libspng_and_opencv_agree_on_every_png_kind(tmp_path: Path, mode: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import shardkit.images.imageio as tr

    rng = np.random.default_rng(1)
    if mode == "I;16":
        img = Image.fromarray(rng.integers(0, 65535, (7, 9), dtype=np.uint16))
    elif mode == "P":
        img = Image.fromarray(rng.integers(0, 4, (7, 9), dtype=np.uint8), mode="P")
        img.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 9, 9] + [0] * (252 * 3))
    else:
        img = Image.fromarray(rng.integers(0, 256, (7, 9, len(mode)), dtype=np.uint8).squeeze(), mode=mode)
    path = tmp_path / f"x-{mode.replace(';', '')}.png"
    img.save(path)
    fast = tr.decode_image(path)
    monkeypatch.setattr(tr, "_spng", None)
    assert np.array_equal(fast, tr.decode_image(path))


# --------------------------------------------------------------------------- check_pixels: before any decoder


def _tiny(kind: str, path: Path, h: int = 30, w: int = 40) -> Path:
    """A real ``h`` x ``w`` file of ``kind``, under a ``.png`` name (OpenCV goes by content, so must the check)."""
    rgb = rgb_image(h, w)
    if kind in ("gif", "ppm-pil", "pgm"):
        im = Image.fromarray(rgb)
        buf = path.with_suffix(".tmp")
        {"gif": lambda: im.convert("P").save(buf, "GIF"), "ppm-pil": lambda: im.save(buf, "PPM"),
         "pgm": lambda: im.convert("L").save(buf, "PPM")}[kind]()
        return buf.rename(path)
    ext, params = {"png": (".png", []), "jpeg": (".jpg", []),
                   "jpeg-progressive": (".jpg", [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]), "tiff": (".tiff", []),
                   "bmp": (".bmp", []), "webp": (".webp", []), "ppm": (".ppm", [])}[kind]
    _ok, buf = cv2.imencode(ext, rgb, params)
    path.write_bytes(buf.tobytes())
    return path


KINDS = ["png", "jpeg", "jpeg-progressive", "tiff", "bmp", "gif", "webp", "ppm", "ppm-pil", "pgm"]


@pytest.fixture()
def no_decoder(monkeypatch: pytest.MonkeyPatch) -> Arm:
    """Call it once the test's files exist: from then on any decoder call fails the test (headers alone)."""

    def decoded(*args: object, **kwargs: object) -> None:
        raise AssertionError("a decoder ran")

    def arm() -> None:
        Image.init()  # (importing PIL's plugins builds images)
        monkeypatch.setattr(cv2, "imdecode", decoded)
        monkeypatch.setattr(Image.Image, "load", decoded)
        monkeypatch.setattr("shardkit.images.imageio._spng", None)

    return arm


@pytest.mark.parametrize("kind", KINDS)
def test_check_pixels_reads_every_type_from_its_header_alone(kind: str, tmp_path: Path, no_decoder: Arm) -> None:
    from shardkit.images.imageio import check_pixels

    p = _tiny(kind, tmp_path / "x.png")
    no_decoder()
    header = check_pixels(p, 1200)
    assert (header.height, header.width) == (30, 40)
    with pytest.raises(DecodeError, match=r"30x40 = 1200 pixels, more than --max-pixels 1199"):
        check_pixels(p, 1199)
    data = np.fromfile(p, np.uint8)  # the same from bytes already read
    assert check_pixels(p, 1200, "label", data).pixels == 1200


@pytest.mark.parametrize("kind", KINDS)
def test_check_pixels_agrees_with_what_opencv_decodes(kind: str, tmp_path: Path) -> None:
    from shardkit.images.imageio import read_header

    p = _tiny(kind, tmp_path / "x.png", 37, 53)
    assert decode_image(p).shape[:2] == (read_header(p).height, read_header(p).width) == (37, 53)


def _jpeg_with_frame(h: int, w: int, *, fill: bytes = b"", decoy: bool = False) -> bytes:
    """A real 16x16 JPEG whose frame header (SOF0) is made to say ``h`` x ``w``; ``fill``: 0xFF fill bytes
    before that marker; ``decoy``: an APP segment holding a 16x16 SOF0 look-alike first."""
    _ok, buf = cv2.imencode(".jpg", rgb_image(16, 16))
    raw = buf.tobytes()
    sof = raw.index(b"\xff\xc0")
    frame = raw[sof + 2 :]
    frame = frame[:3] + h.to_bytes(2, "big") + w.to_bytes(2, "big") + frame[7:]
    app = b""
    if decoy:
        fake = b"\xff\xc0\x00\x11\x08\x00\x10\x00\x10\x03" + bytes(9)
        app = b"\xff\xe5" + (len(fake) + 2).to_bytes(2, "big") + fake
    return raw[:2] + app + raw[2:sof] + fill + b"\xff\xc0" + frame


@pytest.mark.parametrize(("fill", "decoy"), [(b"", False), (b"\xff\xff", False), (b"\xff", True)])
def test_a_jpeg_frame_is_found_as_libjpeg_finds_it(fill: bytes, decoy: bool, tmp_path: Path,
                                                   no_decoder: Arm) -> None:
    """Fill bytes (``FF FF C0``) and a SOF look-alike inside another segment do not hide the real size."""
    from shardkit.images.imageio import check_pixels

    p = tmp_path / "bomb.jpg"
    p.write_bytes(_jpeg_with_frame(30000, 30000, fill=fill, decoy=decoy))
    no_decoder()
    with pytest.raises(DecodeError, match="30000x30000 = 900000000 pixels, more than --max-pixels"):
        check_pixels(p, 2**24)
    assert read_image_size(p) == (30000, 30000)  # planning reads the header too, never a decode


def test_the_jpeg_walk_matches_libjpeg_on_fill_bytes(tmp_path: Path) -> None:
    from shardkit.images.imageio import read_header

    p = tmp_path / "filled.jpg"
    p.write_bytes(_jpeg_with_frame(16, 16, fill=b"\xff\xff\xff"))
    assert decode_image(p).shape == (16, 16, 3)
    assert (read_header(p).height, read_header(p).width) == (16, 16)


def test_a_file_opencv_decodes_but_cannot_be_sized_first_is_refused(tmp_path: Path, no_decoder: Arm) -> None:
    """A Radiance HDR named .png: PIL cannot parse it, OpenCV would decode it whatever its size."""
    from shardkit.images.imageio import check_pixels

    p = tmp_path / "x.png"
    p.write_bytes(b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 30000 +X 30000\n" + bytes(64))
    no_decoder()
    for call in (lambda: check_pixels(p, 2**24), lambda: read_image_size(p), lambda: decode_image(p)):
        with pytest.raises(DecodeError, match="cannot decode image") as e:
            call()
        assert "\n" not in str(e.value) and str(p) in str(e.value)
    with pytest.raises(DecodeError, match="Radiance HDR"):
        check_pixels(p, 2**24)


def test_a_decode_needing_more_than_the_per_pixel_budget_is_refused(tmp_path: Path, no_decoder: Arm) -> None:
    """4 float32 channels (16 bytes a pixel) are allowed fewer pixels than --max-pixels states."""
    from shardkit.images.imageio import DECODE_BYTES_PER_PIXEL, check_pixels

    p = tmp_path / "f.tiff"
    cv2.imencode(".tiff", np.ones((30, 40, 4), np.float32))[1].tofile(p)
    no_decoder()
    with pytest.raises(DecodeError, match="its decode needs 19200 bytes"):
        check_pixels(p, 1200)
    assert check_pixels(p, 1200 * 16 // DECODE_BYTES_PER_PIXEL).bytes_per_pixel == 16


def test_an_unreadable_header_is_refused_not_decoded(tmp_path: Path, no_decoder: Arm) -> None:
    from shardkit.images.imageio import check_pixels

    p = tmp_path / "cut.png"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    with pytest.raises(DecodeError, match="PNG header cannot be read"):
        check_pixels(p, 2**24)
    q = tmp_path / "cut.jpg"
    q.write_bytes(_jpeg_with_frame(16, 16)[:20])
    no_decoder()
    with pytest.raises(DecodeError, match="JPEG header cannot be read"):
        check_pixels(q, 2**24)


def test_a_tiff_directory_claiming_millions_of_values_is_refused_before_read(tmp_path: Path,
                                                                               no_decoder: Arm) -> None:
    import struct

    from shardkit.images.imageio import check_pixels

    # little-endian classic TIFF: a 10x10 image whose StripOffsets tag claims 50 million LONG values
    entries = [(256, 4, 1, 10), (257, 4, 1, 10), (258, 3, 1, 8), (273, 4, 50_000_000, 8), (277, 3, 1, 1)]
    ifd = struct.pack("<H", len(entries)) + b"".join(struct.pack("<HHII", *e) for e in entries) + bytes(4)
    p = tmp_path / "x.tif"
    p.write_bytes(b"II*\x00" + struct.pack("<I", 8) + ifd)
    no_decoder()
    with pytest.raises(DecodeError, match="tag 273 holds 50000000 values"):
        check_pixels(p, 2**24)


def test_a_tiff_tile_far_larger_than_its_image_is_refused(tmp_path: Path, no_decoder: Arm) -> None:
    """OpenCV allocates one whole tile (up to 1 GiB) whatever the image's size."""
    import struct

    from shardkit.images.imageio import check_pixels

    entries = [(256, 4, 1, 10), (257, 4, 1, 10), (258, 3, 1, 8), (277, 3, 1, 1), (322, 4, 1, 16384),
               (323, 4, 1, 16384)]
    ifd = struct.pack("<H", len(entries)) + b"".join(struct.pack("<HHII", *e) for e in entries) + bytes(4)
    p = tmp_path / "x.tif"
    p.write_bytes(b"II*\x00" + struct.pack("<I", 8) + ifd)
    no_decoder()
    with pytest.raises(DecodeError, match="a tile or strip of 268435456 pixels for a 10x10 image"):
        check_pixels(p, 2**24)


@pytest.mark.slow
@pytest.mark.timeout(900)  # its subprocess has 600 s: ~30 s on CI's 2 cores, >300 s on a machine loaded to 10
def test_one_worker_stays_under_1_gb_at_the_default_max_pixels() -> None:
    """The default --max-pixels is chosen so: the costliest kinds (a colour-mask label, a 16-bit RGBA PNG or
    TIFF image) converted at exactly the limit, peak RSS of the converting process (scripts/max_pixels_memory.py,
    which builds each case in another process so the measured one starts small)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, str(root / "scripts" / "max_pixels_memory.py"), "--cases",
                          "colour-label,png16-rgba,tiff16-rgba,jpeg-cmyk-progressive"], capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines()[2:]]
    assert len(rows) == 4 and all(r[3] == "ok" for r in rows), res.stdout
    assert all(float(r[2]) < 1024 for r in rows), res.stdout


# --------------------------------------------------------------------------- TIFF labels (tifffile)


@pytest.mark.parametrize("compression", [None, "zlib"])
def test_a_tiff_label_in_16x16_tiles_decodes_as_tifffile_reads_it(camvid_root: Path, tmp_path: Path,
                                                                   compression: str | None) -> None:
    """A legitimate tiled TIFF (16x16 tiles: OpenCV's reader called the uncompressed one corrupt) gives exactly
    tifffile's own decode, by every label read: pixels, the scan's read, and the header check."""
    import tifffile

    from shardkit.images.imageio import check_pixels, decode_palette_label

    ids = np.asarray(Image.open(sorted((camvid_root / "valannot").iterdir())[0]))
    path = tmp_path / "label.tif"
    tifffile.imwrite(path, ids, tile=(16, 16), compression=compression)
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        assert isinstance(page, tifffile.TiffPage) and page.is_tiled and (page.tilelength, page.tilewidth) == (16, 16)
    expected = tifffile.imread(path)
    assert check_pixels(path, 1 << 24, "label").pixels == ids.size
    for got in (decode_label_pixels(path, indices=True), decode_label_pixels(path), decode_palette_label(path)[1]):
        assert got.dtype == expected.dtype and np.array_equal(got, expected)


@pytest.mark.parametrize("planar", ["contig", "separate"])
def test_a_two_band_tiff_label_is_refused_not_read_as_its_first_band(tmp_path: Path, planar: str) -> None:
    import tifffile

    from shardkit.images.imageio import check_pixels, decode_palette_label

    bands = RNG.integers(0, 5, (2, 20, 30), dtype=np.uint8)
    path = tmp_path / "label.tif"
    tifffile.imwrite(path, bands if planar == "separate" else np.moveaxis(bands, 0, -1), photometric="minisblack",
                     planarconfig=planar)
    for read in (lambda: check_pixels(path, 1 << 24, "label"), lambda: decode_label_pixels(path, indices=True),
                 lambda: decode_palette_label(path)):
        with pytest.raises(DecodeError, match=r"label is a TIFF of 2 bands.*no single answer") as err:
            read()
        assert "fix: save the class-id band as a one-band file" in str(err.value)
    # gray + a declared alpha band is what a gray + alpha PNG is: the alpha band is dropped by the label rule
    alpha = tmp_path / "alpha.tif"
    tifffile.imwrite(alpha, np.moveaxis(bands, 0, -1), photometric="minisblack", extrasamples=["unassalpha"])
    assert np.array_equal(decode_label_pixels(alpha, indices=True), np.moveaxis(bands, 0, -1))
