"""One PNG and one JPEG header parser (shardkit/images/headers.py) for its two callers: convert's size check
(``imageio.read_header``, lenient as libjpeg) and the shard readers' (``codecs.registry``'s png/jpeg codecs,
strict). On real files both give the size PIL reads; hostile headers are refused by both; where they differ,
they differ only as the ``strict`` switch states."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from shardkit.codecs.registry import CodecDataError, Jpeg, Png, _image_size
from shardkit.errors import DecodeError
from shardkit.images.headers import jpeg_frame, png_header
from shardkit.images.imageio import read_header

DATA = Path(__file__).resolve().parents[1] / "data"


def _real_files(shared_data: Path) -> list[Path]:
    files = [p for root in (DATA, shared_data) for p in sorted(root.rglob("*"))
             if p.suffix.lower() in (".png", ".jpg", ".jpeg") and p.is_file()]
    assert len(files) > 300  # tests/data and ../shared/data hold ~400
    return files


def test_both_callers_read_every_real_png_and_jpeg_as_pil_does(shared_data: Path) -> None:
    """Every PNG and JPEG of the real fixtures: convert's header and the readers' header give PIL's size; the
    readers' components are the channels OpenCV decodes for 8-bit gray, RGB and RGBA, 16-bit ones at depth 16."""
    kinds = set()
    for path in _real_files(shared_data):
        data = path.read_bytes()
        with Image.open(path) as im:
            width, height = im.size
        convert = read_header(path)
        assert (convert.height, convert.width) == (height, width), path
        png = png_header(data)
        depth = png.depth if png is not None else 8
        kind, h, w, comps = _image_size(data, depth)
        assert (kind, h, w) == (convert.kind.lower(), height, width), path
        kinds.add((kind, comps))
        if comps:
            decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
            assert (decoded.shape[2] if decoded.ndim == 3 else 1) == comps, path
        elif png is not None:
            assert png.colour == 3 or png.depth not in (8, 16), path  # palette, or 1/2/4-bit: no stored codec
    assert {k for k, _ in kinds} == {"png", "jpeg"} and len(kinds) >= 4, kinds


def _picture(ext: str) -> bytes:
    """A real 16x16 RGB file of type ``ext`` from OpenCV."""
    rgb = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    ok, buf = cv2.imencode(ext, rgb)
    assert ok
    return buf.tobytes()


def _after_app0(jpeg: bytes, extra: bytes) -> bytes:
    """``jpeg`` with ``extra`` between its first segment (APP0, JFIF) and the next marker."""
    assert jpeg[2:4] == b"\xff\xe0"
    end = 4 + int.from_bytes(jpeg[4:6], "big")
    return jpeg[:end] + extra + jpeg[end:]


def _sof(data: bytes) -> int:
    return data.index(b"\xff\xc0")


def _both(data: bytes, tmp_path: Path) -> tuple[str | None, str | None]:
    """What convert's header check and a reader's decode say of ``data`` as a 16x16 RGB sample: None when each
    accepts it, else its one-line error."""
    path = tmp_path / ("x.png" if data.startswith(b"\x89PNG") else "x.jpg")
    path.write_bytes(data)
    said: list[str | None] = []
    try:
        header = read_header(path)
        said.append(None if (header.height, header.width) == (16, 16) else f"{header.height}x{header.width}")
    except DecodeError as exc:
        said.append(str(exc))
    codec = Png() if path.suffix == ".png" else Jpeg()
    try:
        codec.decode_into(data, np.empty((16, 16, 3), np.uint8))
        said.append(None)
    except CodecDataError as exc:
        said.append(str(exc))
    return said[0], said[1]


def _hostile() -> dict[str, bytes]:
    jpeg, png = _picture(".jpg"), _picture(".png")
    sof = _sof(jpeg)
    big = jpeg[: sof + 5] + (30000).to_bytes(2, "big") + (30000).to_bytes(2, "big") + jpeg[sof + 9 :]
    decoy = b"\xff\xc0\x00\x11\x08\x00\x10\x00\x10\x03" + bytes(9)  # a 16x16 SOF0 look-alike inside an APP5
    return {
        "jpeg: a 30000x30000 frame behind a 16x16 decoy inside a segment":
            big[:2] + b"\xff\xe5" + (len(decoy) + 2).to_bytes(2, "big") + decoy + big[2:],
        "jpeg: a 30000x30000 frame behind fill bytes": big[:sof] + b"\xff\xff" + big[sof:],
        "jpeg: cut inside the frame header": jpeg[: sof + 6],
        "jpeg: cut inside a marker": jpeg[:3],
        "jpeg: a scan before any frame": jpeg[:2] + b"\xff\xda\x00\x02" + jpeg[2:],
        "jpeg: the end before any frame": jpeg[:2] + b"\xff\xd9" + jpeg[2:],
        "jpeg: 2 colour components": jpeg[: sof + 9] + b"\x02" + jpeg[sof + 10 :],
        "png: IHDR not the first chunk": png[:8] + b"\x00\x00\x00\x00tEXt\x00\x00\x00\x00" + png[8:],
        "png: cut inside IHDR": png[:24],
        "png: a 30000x30000 IHDR": png[:16] + (30000).to_bytes(4, "big") * 2 + png[24:],
    }


@pytest.mark.parametrize("name", list(_hostile()))
def test_hostile_headers_are_refused_by_both_callers(name: str, tmp_path: Path) -> None:
    """Each hostile header: convert refuses it (or sizes it at its real, too large size, never the decoy's) and a
    reader refuses it before decoding; neither takes it for a 16x16 image."""
    convert, reader = _both(_hostile()[name], tmp_path)
    assert convert is not None and reader is not None, (convert, reader)
    assert "30000" in convert if "30000" in name else "header cannot be read" in convert, convert
    assert "header says" in reader and "expected" in reader, reader
    assert "\n" not in convert + reader


def test_the_strictness_switch_is_the_one_difference(tmp_path: Path) -> None:
    """What libjpeg skips with a warning (a byte that is not a marker, a stuffed zero, a segment length below 2),
    and a second SOI or 12-bit samples: convert's lenient reading sizes the file as libjpeg does, a reader's
    strict one refuses it."""
    jpeg = _picture(".jpg")
    sof = _sof(jpeg)
    lenient_only = {
        "garbage before a marker": _after_app0(jpeg, b"\x00"),
        "a stuffed zero": _after_app0(jpeg, b"\xff\x00"),
        "a segment length below 2": _after_app0(jpeg, b"\xff\xe5\x00\x01"),
        "a second SOI": _after_app0(jpeg, b"\xff\xd8\x00\x02"),
        "12-bit samples": jpeg[: sof + 4] + b"\x0c" + jpeg[sof + 5 :],
    }
    for name, data in lenient_only.items():
        frame = jpeg_frame(data, strict=False)
        assert (frame.height, frame.width, frame.components) == (16, 16, 3), name
        with pytest.raises(ValueError):
            jpeg_frame(data, strict=True)
        convert, reader = _both(data, tmp_path)
        assert convert is None and reader is not None and "header says ? 0x0x0" in reader, (name, reader)
    assert cv2.imdecode(np.frombuffer(lenient_only["garbage before a marker"], np.uint8),
                        cv2.IMREAD_COLOR).shape == (16, 16, 3)  # libjpeg decodes it: convert must size it
    clean = jpeg_frame(jpeg, strict=True)
    assert clean == jpeg_frame(jpeg, strict=False) and (clean.height, clean.width, clean.precision) == (16, 16, 8)
