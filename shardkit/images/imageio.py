"""Image and label files in, pixel arrays out: the one place that decodes image files.

PNG, JPEG, BMP, WebP, PPM/PGM and TIFF go through OpenCV; GIF, palette and 1-bit labels through PIL.
Files with several frames or pages (animated GIF/PNG/WebP, multi-page TIFF) are refused: which frame
is the label has no one answer.

Files are read with ``np.fromfile`` + ``cv2.imdecode`` rather than ``cv2.imread``
because that works for non-ASCII paths on every platform and lets us tell an empty
file from a corrupt one. ``IMREAD_UNCHANGED`` keeps bit depth and alpha and ignores
EXIF orientation, so an image and its label are always read in the same pixel grid.
8-bit PNGs go through libspng when it is installed (faster, same pixels); palette PNGs
through PIL, which keeps their indices. Headers are checked (regular file, pixel count)
before anything is decoded. Everything here runs inside worker processes.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import DecodeError, InputNotFoundError
from .headers import JPEG_SOI, PNG_CHANNELS, PNG_SIGNATURE, jpeg_frame, png_header
from .imagetypes import ImageOptions, check_band_count, stored_dtype
from .jpeg2000 import decode_jpeg2000, is_jpeg2000, read_siz

logger = logging.getLogger(__name__)

_FIX_CORRUPT = "re-export or remove the file, or --on-error skip"
#: Formats whose files may hold several frames or pages (PIL's names).
_MULTI_FRAME = frozenset({"GIF", "TIFF", "PNG", "WEBP"})  # not MPO: a phone JPEG's second picture is a preview


def read_bytes(path: Path, what: str = "image") -> np.ndarray:
    """Read a whole file as a uint8 array; missing → InputNotFoundError, unreadable/empty → DecodeError."""
    try:
        data = np.fromfile(path, dtype=np.uint8)
    except FileNotFoundError:
        raise InputNotFoundError(
            f"{what} file does not exist", path=path, fix="check the input folder or list file"
        ) from None
    except OSError as exc:
        raise DecodeError(
            f"cannot read {what}: {exc.strerror or exc}",
            path=path,
            fix="fix the file permissions, or --on-error skip",
        ) from None
    if data.size == 0:
        raise DecodeError(f"cannot decode {what}: the file is empty (0 bytes)", path=path, fix=_FIX_CORRUPT)
    return data


def read_head(path: Path, what: str, size: int) -> bytes:
    """The first ``size`` bytes of a file (fewer when it is shorter; :func:`read_header` and :func:`georeference`
    read no more): missing → InputNotFoundError, unreadable → DecodeError, each one line with its fix."""
    try:
        with open(path, "rb") as fh:
            return fh.read(size)
    except FileNotFoundError:
        raise InputNotFoundError(f"{what} file does not exist", path=path,
                                 fix="check the input folder or list file") from None
    except OSError as exc:
        raise DecodeError(f"cannot read {what}: {exc.strerror or exc}", path=path,
                          fix="check the file and its permissions, or --on-error skip") from None


def file_bytes(path: Path, what: str, data: np.ndarray | None) -> np.ndarray:
    """``data`` (the file's bytes, already read by the caller) checked like :func:`read_bytes`, else a read."""
    if data is None:
        return read_bytes(path, what)
    if data.size == 0:
        raise DecodeError(f"cannot decode {what}: the file is empty (0 bytes)", path=path, fix=_FIX_CORRUPT)
    return data


def _as_bytes(data: np.ndarray) -> bytes:
    """The bytes of ``data``, without a copy when it is a view of a whole ``bytes`` object (libspng wants bytes)."""
    base = data.base
    return base if isinstance(base, bytes) and len(base) == data.nbytes else data.tobytes()


def _jpeg_truncated(data: np.ndarray) -> bool:
    """True for a JPEG whose last scan has no end-of-image marker after it.

    Entropy-coded data byte-stuffs 0xFF, so 0xFFD9 cannot occur inside a scan: a
    missing EOI after the last SOS means the file was cut. Older OpenCV builds decode
    such files to a half-grey picture with only a warning on stderr; this catches them.
    """
    raw = data.tobytes()
    if not raw.startswith(JPEG_SOI):
        return False
    return raw.rfind(b"\xff\xd9") < raw.rfind(b"\xff\xda")


def decode_raw(path: Path, what: str = "image", data: np.ndarray | None = None) -> np.ndarray:
    """Decode a file (or its already-read ``data``) exactly as stored with OpenCV; BGR order."""
    if data is None:
        data = read_bytes(path, what)
    kind = sniff(data[:16].tobytes())
    if kind is None or kind.startswith("unsupported"):  # (check_pixels refuses these first, with the reason)
        raise DecodeError(f"cannot decode {what}: not a {SUPPORTED_TYPES} file", path=path, fix=_FIX_CORRUPT)
    if kind == "JPEG2000":  # images go through .jpeg2000 before this; a JPEG 2000 label is never decoded
        raise DecodeError(f"cannot decode {what}: JPEG 2000 is read for images only, not labels (lossy by "
                          "default)", path=path, fix="save the labels losslessly as PNG or TIFF, or --on-error skip")
    try:
        arr = cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
    except cv2.error:
        arr = None
    if arr is None:
        raise DecodeError(
            f"cannot decode {what}: not a readable PNG/JPEG/BMP/TIFF/WebP image, or corrupt or truncated "
            f"({data.size} bytes)",
            path=path,
            fix=_FIX_CORRUPT,
        )
    if _jpeg_truncated(data):
        raise DecodeError(
            f"cannot decode {what}: JPEG is truncated (no end-of-image marker, {data.size} bytes)",
            path=path,
            fix=_FIX_CORRUPT,
        )
    return arr


try:  # libspng decodes PNG ~1.4x faster than OpenCV here, to identical pixels (tested); optional
    import pyspng as _spng
except ImportError:  # pragma: no cover - pyspng is a regular dependency, but keep working without it
    _spng = None


def _decode_png_rgb(data: np.ndarray) -> np.ndarray | None:
    """RGB-ordered pixels of a PNG via libspng, or None (not a PNG, no pyspng, or libspng refused it).

    A refusal falls back to OpenCV, which then produces the one-line error for a broken file.
    """
    if _spng is None or data[:8].tobytes() != PNG_SIGNATURE:
        return None
    try:
        return _spng.load(_as_bytes(data))
    except Exception:  # any libspng failure: let OpenCV decide and word the error
        return None


def _png_plain_8bit(data: np.ndarray) -> bool:
    """True for an 8-bit gray or RGB PNG without a ``tRNS`` chunk: libspng then gives OpenCV's pixels exactly."""
    header = png_header(data)
    if header is None or header.depth != 8 or header.colour not in (0, 2) or data.size < 33:
        return False
    pos = 8
    while pos + 8 <= data.size:  # the chunks up to the image data
        length = int.from_bytes(data[pos : pos + 4].tobytes(), "big")
        kind = data[pos + 4 : pos + 8].tobytes()
        if kind == b"tRNS":  # OpenCV may turn it into an alpha channel
            return False
        if kind == b"IDAT":  # tRNS must come before the image data
            break
        pos += 12 + length
    return True


def is_jpeg_data(data: np.ndarray) -> bool:
    """Whether a file's bytes are a JPEG (lossy: labels in it carry compression noise)."""
    return data[: len(JPEG_SOI)].tobytes() == JPEG_SOI


def _pil_header(path: Path, what: str, data: np.ndarray) -> tuple[str, str] | None:
    """``(format, mode)`` of a file from PIL's header (no pixels decoded), or None when PIL cannot read it
    (OpenCV then decides). A file of several frames or pages is refused."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(_as_bytes(data))) as im:
                fmt, mode = str(im.format), str(im.mode)
                frames = int(getattr(im, "n_frames", 1)) if fmt in _MULTI_FRAME else 1
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return None
    if frames > 1:
        kind = {"GIF": "an animated GIF", "TIFF": "a multi-page TIFF", "PNG": "an animated PNG",
                "WEBP": "an animated WebP"}[fmt]
        pages = "pages" if fmt == "TIFF" else "frames"
        raise DecodeError(f"{what} is {kind} ({frames} {pages}); which one is the {what} has no single answer",
                          path=path, fix=f"export the {what} as a single-{pages[:-1]} file, or --on-error skip")
    return fmt, mode


def _pil_pixels(path: Path, what: str, data: np.ndarray, mode: str | None = None) -> np.ndarray:
    """Pixels as PIL decodes them (converted to ``mode`` when given): palette indices for mode P, 0/1 for
    mode 1."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(_as_bytes(data))) as im:
                im.load()
                arr = np.array(im.convert(mode) if mode is not None and im.mode != mode else im)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise DecodeError(f"cannot decode {what}: {exc}", path=path, fix=_FIX_CORRUPT) from None
    return arr.astype(np.uint8) if arr.dtype == np.bool_ else arr


def _png_gray_depth(data: np.ndarray) -> int:
    """The bit depth of a gray (colour type 0) PNG from its IHDR, 0 for anything else."""
    header = png_header(data)
    return header.depth if header is not None and header.colour == 0 else 0


def decode_label_pixels(path: Path, data: np.ndarray | None = None, *, indices: bool = False) -> np.ndarray:
    """A label file's pixels exactly as ``cv2.imdecode(…, IMREAD_UNCHANGED)`` gives them (BGR order).

    8-bit gray and RGB PNGs (the usual id maps and colour masks) are decoded with libspng,
    ~1.3-1.6x faster to the same pixels (tested on the real datasets); other PNG, JPEG, BMP, WebP,
    PPM/PGM and TIFF files go through OpenCV, GIF through PIL (as RGB, or gray for a gray GIF). With
    ``indices`` (id labels), palette images (PNG, GIF, BMP, TIFF) give their palette indices, 1-bit
    images 0/1 and 2- or 4-bit gray PNGs their samples, not the colours or 0..255 levels OpenCV and PIL
    expand them to. ``data``: the file's bytes, when
    the caller has read them already.
    """
    path = Path(path)
    data = file_bytes(path, "label", data)
    if data[:6].tobytes() == _NPY_MAGIC:  # an id map saved with numpy (2-D integers)
        return _decode_npy(path, data, "label")
    if _png_plain_8bit(data):
        arr = _decode_png_rgb(data)  # None when libspng is missing or refuses: OpenCV decides below
        if arr is not None and arr.dtype == np.uint8:
            if arr.ndim == 3 and arr.shape[2] == 1:
                arr = arr[:, :, 0]
            return arr[:, :, ::-1] if arr.ndim == 3 else arr
    header = _pil_header(path, "label", data)
    depth = _png_gray_depth(data)
    if indices and depth in (2, 4):  # decoders scale 2- and 4-bit gray to 0..255; ids are the samples
        return decode_raw(path, "label", data) // (255 // ((1 << depth) - 1))
    if header is not None:
        fmt, mode = header
        if indices and mode in ("P", "1"):
            return _pil_pixels(path, "label", data)
        if indices and mode == "PA":
            return _pil_pixels(path, "label", data)[:, :, 0]
        if fmt == "GIF":
            rgb = _pil_pixels(path, "label", data, "L" if mode in ("L", "1") else "RGB")
            return rgb if rgb.ndim == 2 else np.ascontiguousarray(rgb[:, :, ::-1])
    if _tiff_by_tifffile(data, header):
        arr, _ = _decode_tiff(path, data, False, "label")
        if arr.shape[2] == 1:
            return arr[:, :, 0]
        return np.ascontiguousarray(arr[:, :, [2, 1, 0, *range(3, arr.shape[2])]]) if arr.shape[2] >= 3 else arr
    return decode_raw(path, "label", data)


def _tiff_by_tifffile(data: np.ndarray, header: tuple[str, str] | None) -> bool:
    """Whether a label file is a TIFF decoded by tifffile, as TIFF images are (exactly its samples, every band
    checked by :func:`_check_label_samples`): all but palette and 1-bit ones, whose colours or indices PIL and
    OpenCV give. OpenCV's own TIFF reader refuses valid files (8-bit 16x16 tiles) and keeps the first of two
    bands."""
    return sniff(data[:16].tobytes()) == "TIFF" and (header is None or header[1] not in ("P", "PA", "1"))


def _legacy_rgb(arr: np.ndarray, from_spng: bool, path: Path) -> np.ndarray:
    """An 8-bit picture (PNG, JPEG, BMP, WebP, GIF, PNM) as (H, W, 3) RGB, as shardkit always stored them: gray
    repeated to three channels, an alpha channel (transparency, not a band) dropped."""
    if arr.ndim == 3 and arr.shape[2] in (1, 2):  # gray (+ alpha)
        arr = arr[:, :, 0]
    if arr.ndim == 2:
        out = cv2.cvtColor(arr, cv2.COLOR_GRAY2RGB)
    elif arr.ndim == 3 and arr.shape[2] == 3:
        out = arr if from_spng else cv2.cvtColor(arr, cv2.COLOR_BGR2RGB)
    elif arr.ndim == 3 and arr.shape[2] == 4:
        out = cv2.cvtColor(arr, cv2.COLOR_RGBA2RGB if from_spng else cv2.COLOR_BGRA2RGB)
    else:
        raise DecodeError(
            f"cannot decode image: unsupported shape {arr.shape}", path=path, fix="convert it to an RGB image"
        )
    return np.ascontiguousarray(out)


#: What a decoded image's channels are (``SampleSpec.channel_kind``): "RGB" colour, or "bands" as stored.
RGB, BANDS = "RGB", "bands"
_NPY_MAGIC = b"\x93NUMPY"


def _unsupported_dtype(dtype: np.dtype, path: Path) -> DecodeError:
    return DecodeError(f"cannot decode image: pixel type {dtype} is not stored (shardkit stores uint8, uint16, "
                       "int16 and float32)", path=path,
                       fix="add --image-dtype float32 (or uint8/uint16 with --rescale) to convert it, or re-export it")


def _as_hwc(arr: np.ndarray, axes: str, path: Path) -> np.ndarray:
    """A decoded array with tifffile-style ``axes`` (``YX``, ``YXS``, ``SYX``) as (H, W, C)."""
    if axes == "YX":
        return arr[:, :, None]
    if axes == "YXS":
        return arr
    if axes == "SYX":
        return np.ascontiguousarray(np.moveaxis(arr, 0, -1))
    raise DecodeError(f"cannot decode image: TIFF page of axes {axes} {arr.shape} is not one image", path=path,
                      fix="export it as a single image (planar or chunky bands), or --on-error skip")


def _tiff_pages(tif: Any) -> list[Any]:
    """The full-resolution pages of a TIFF: reduced-resolution overviews (a COG's) and masks left out."""
    pages = []
    for page in tif.pages:
        kind = int(getattr(page, "subfiletype", 0) or 0)
        if kind & 0b101:  # 1: reduced resolution, 4: transparency mask
            continue
        pages.append(page)
    return pages


def _tiff_planes(tif: Any, pages: list[Any], path: Path, what: str = "image") -> int:
    """How many image planes a TIFF holds: one per full-resolution page, with two exceptions.

    An OME-TIFF of several images (series) with several pages is refused: its pages are not the planes of one
    image. An ImageJ stack stored as one page followed by the other planes' pixels (how ImageJ saves stacks over
    4 GB, and tifffile with ``truncate=True``) holds as many planes as its description counts ``images``: a reader
    of the page alone would silently keep plane 1. Those planes must lie in the file, uncompressed, after the page.
    """
    n = len(pages)
    if n > 1 and getattr(tif, "is_ome", False) and len(tif.series) > 1:
        raise DecodeError(f"{what} is an OME-TIFF of {len(tif.series)} images (series): its pages are not the bands "
                          f"of one {what}", path=path,
                          fix="save each series as its own file (tifffile.imread(path, series=N)), or --on-error skip")
    if n != 1 or not getattr(tif, "is_imagej", False):
        return n
    try:
        images = int((tif.imagej_metadata or {}).get("images", 1))
    except (TypeError, ValueError):
        images = 1
    if images <= 1:
        return n
    page = pages[0]
    plane = int(page.imagelength) * int(page.imagewidth) * int(page.samplesperpixel) * np.dtype(page.dtype).itemsize
    end = int(page.dataoffsets[0]) + images * plane if len(page.dataoffsets) else -1
    if not page.is_contiguous or int(page.compression) != 1 or not 0 < end <= int(tif.filehandle.size):
        raise DecodeError(f"{what}: its ImageJ description counts {images} images, but the file holds one page and "
                          f"not the other {images - 1} planes' pixels after it", path=path,
                          fix="re-save the stack (one page per plane: ImageJ, tifffile), or --on-error skip")
    return images


def _tiff_layout(pages: list[Any], path: Path, pages_as_bands: bool, what: str = "image",
                 planes: int | None = None) -> tuple[np.dtype, int, str]:
    """(dtype, bands, channel kind) a TIFF decodes to, from its directories (no pixel decoded). ``planes``: what
    :func:`_tiff_planes` counts (default: one per page)."""
    if not pages:
        raise DecodeError(f"cannot decode {what}: TIFF has no image", path=path, fix=_FIX_CORRUPT)
    planes = len(pages) if planes is None else planes
    single = f"export the {what} as a single-page file, or --on-error skip"  # a label is always one page
    if planes > 1 and not pages_as_bands:
        stack = f"a multi-page TIFF ({planes} pages)" if planes == len(pages) else \
            f"an ImageJ stack of {planes} planes in one TIFF page"
        fix = ("add --pages-as-bands (each page one band), export one page, or --on-error skip" if what == "image"
               else single)
        raise DecodeError(f"{what} is {stack}; which one is the {what} has no single answer", path=path, fix=fix)
    first = pages[0]
    shape = tuple(first.shape)
    axes = str(first.axes)
    if axes not in ("YX", "YXS", "SYX"):
        raise DecodeError(f"cannot decode {what}: TIFF page of axes {axes} {shape} is not one image", path=path,
                          fix="export it as a single image, or --on-error skip")
    for page in pages[1:]:
        if tuple(page.shape) != shape or page.dtype != first.dtype or str(page.axes) != axes:
            raise DecodeError(f"{what}: TIFF pages differ in size or type ({shape} {first.dtype} and "
                              f"{tuple(page.shape)} {page.dtype}); they are not bands of one {what}", path=path,
                              fix="export the bands as one image, or --on-error skip" if what == "image" else single)
    bands = 1 if axes == "YX" else shape[-1] if axes == "YXS" else shape[0]
    photometric = int(getattr(first, "photometric", -1))
    if what == "label":
        _check_label_samples(first, bands, photometric, path)
    kind = RGB if photometric == 2 and bands == 3 and planes == 1 else BANDS
    dtype = np.dtype(first.dtype) if first.dtype is not None else np.dtype(np.uint8)
    return dtype, bands * planes, kind


#: TIFF photometric interpretations whose three samples are colours (RGB; YCbCr, which decoders give as RGB).
_COLOUR_PHOTOMETRIC = (2, 6)
_ALPHA = (1, 2)  # ExtraSamples: associated, unassociated alpha


def _check_label_samples(page: Any, samples: int, photometric: int, path: Path) -> None:
    """Refuse a TIFF label whose samples are not one band of ids, gray + alpha, or RGB(A) colours: which of its
    bands holds the class ids has no single answer (a decoder would silently keep the first)."""
    extra = [int(v) for v in (getattr(page, "extrasamples", None) or ())]
    alpha = bool(extra) and extra[-1] in _ALPHA
    if samples == 1 or (samples == 2 and alpha) or (photometric in _COLOUR_PHOTOMETRIC and (
            samples == 3 or (samples == 4 and alpha))):
        return
    raise DecodeError(f"label is a TIFF of {samples} bands, not one band of ids, gray + alpha or RGB(A) colours; "
                      "which band holds the class ids has no single answer", path=path,
                      fix="save the class-id band as a one-band file (e.g. tifffile.imwrite(out, "
                          "tifffile.imread(label)[..., 0])), or --on-error skip")


def tiff_band_pages(tif: Any, path: Path, what: str, pages_as_bands: bool) -> list[Any]:
    """The pages of an open ``tifffile.TiffFile`` whose samples are, in order, the bands a whole decode
    (:func:`_decode_tiff`) gives: its one full-resolution page, or with ``pages_as_bands`` every one. Refused
    exactly as that decode refuses (several pages without ``pages_as_bands``, pages that differ in size, type or
    axes, an OME-TIFF of several images), and an ImageJ stack held in one page, whose other planes are no page:
    what reads a file page by page (:class:`~shardkit.images.tiles.TiledTiff`) never silently keeps page 1."""
    pages = _tiff_pages(tif)
    planes = _tiff_planes(tif, pages, path, what)
    _tiff_layout(pages, path, pages_as_bands, what, planes)
    if planes != len(pages):
        raise DecodeError(f"{what} is an ImageJ stack of {planes} planes in one TIFF page, which cannot be read "
                          "window by window", path=path,
                          fix="re-save it as a tiled TIFF, one page per plane (tifffile.imwrite(path, data, "
                              "tile=(256, 256))), raise --max-pixels, or --on-error skip")
    return pages


def _decode_tiff(path: Path, data: np.ndarray, pages_as_bands: bool, what: str = "image") -> tuple[np.ndarray, str]:
    """A TIFF (chunky or planar, striped or tiled, BigTIFF; any tifffile/imagecodecs compression) as (H, W, C)
    exactly as stored: every sample a band, extra samples (alpha) included."""
    import tifffile

    try:
        with tifffile.TiffFile(io.BytesIO(_as_bytes(data))) as tif:
            pages = _tiff_pages(tif)
            count = _tiff_planes(tif, pages, path, what)
            dtype, _, kind = _tiff_layout(pages, path, pages_as_bands, what, count)
            if dtype.newbyteorder("=").name == "bool":
                dtype = np.dtype(np.uint8)
            if count > len(pages):  # an ImageJ stack in one page: tifffile's series reads every plane
                first = pages[0]
                stack = np.asarray(tif.series[0].asarray()).reshape(count, *first.shape)
                planes = [_as_hwc(plane, str(first.axes), path) for plane in stack]
            else:
                planes = [_as_hwc(page.asarray(), str(page.axes), path) for page in pages]
    except DecodeError:
        raise
    except Exception as exc:  # tifffile and its codecs raise many types for damaged files
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise DecodeError(f"cannot decode {what}: TIFF does not decode ({reason})", path=path,
                          fix=_FIX_CORRUPT) from None
    arr = planes[0] if len(planes) == 1 else np.concatenate(planes, axis=2)
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8)
    return np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("="), copy=False)), kind


def _npy_header(head: bytes) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """(shape, dtype, fortran order, data offset) from a ``.npy`` file's header (numpy's own parser; no pickle)."""
    fh = io.BytesIO(head)
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    else:  # pragma: no cover - read_magic refuses others
        raise ValueError(f"npy version {version}")
    if dtype.hasobject or dtype.fields is not None:
        raise ValueError(f"npy of {dtype} (objects or fields)")
    if len(shape) not in (2, 3) or min(shape, default=0) < 1:
        raise ValueError(f"npy of shape {shape} is not (H, W) or (H, W, C)")
    return tuple(int(v) for v in shape), dtype, bool(fortran), fh.tell()


def _decode_npy(path: Path, data: np.ndarray, what: str = "image") -> np.ndarray:
    """A ``.npy`` array (H, W) or (H, W, C), checked to hold exactly its header's bytes (never a pickle)."""
    raw = _as_bytes(data)
    try:
        shape, dtype, fortran, start = _npy_header(raw[:HEADER_BYTES])
    except (ValueError, SyntaxError, TypeError, EOFError) as exc:
        raise DecodeError(f"cannot decode {what}: not a readable .npy array ({exc})", path=path,
                          fix="save it with numpy.save (allow_pickle=False), or --on-error skip") from None
    need = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - start != need:
        raise DecodeError(f"cannot decode {what}: .npy holds {len(raw) - start} bytes of data, its header says "
                          f"{need}", path=path, fix=_FIX_CORRUPT)
    arr = np.frombuffer(raw, dtype, int(np.prod(shape)), start)
    arr = arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)
    arr = np.ascontiguousarray(arr, dtype=dtype.newbyteorder("="))
    return arr[:, :, None] if arr.ndim == 2 and what == "image" else arr


def decode_native(path: Path, data: np.ndarray | None = None, *, pages_as_bands: bool = False
                  ) -> tuple[np.ndarray, str]:
    """An image file as (H, W, C) in the type it stores, and what its channels are (``"RGB"`` or ``"bands"``).

    8-bit pictures (PNG, JPEG, BMP, WebP, GIF, PNM) are RGB as shardkit always stored them (gray repeated,
    alpha dropped: :func:`_legacy_rgb`). Every other file keeps what it holds: a 16-bit PNG its channels
    (gray 1, RGB 3, RGBA 4 in RGB(A) order), a TIFF (through tifffile) every sample of its page, or of every page
    with ``pages_as_bands``, an ``.npy`` its array. Never rescaled.
    """
    path = Path(path)
    data = file_bytes(path, "image", data)
    head = data[:16].tobytes()
    if head.startswith(_NPY_MAGIC):
        return _decode_npy(path, data), BANDS
    if sniff(head) == "TIFF":
        return _decode_tiff(path, data, pages_as_bands)
    if is_jpeg2000(head):  # every component in its stored type, like a TIFF's samples
        arr = decode_jpeg2000(path, data)
        return arr, RGB if arr.dtype == np.uint8 and arr.shape[2] == 3 else BANDS
    rgb = _decode_png_rgb(data) if _png_depth(data) != 16 else None
    if rgb is None:
        header = _pil_header(path, "image", data)  # refuses animations and multi-page files
        if header is not None and header[0] == "GIF":
            rgb = _pil_pixels(path, "image", data, "RGB")
    arr = rgb if rgb is not None else decode_raw(path, "image", data)
    if arr.dtype == np.uint8:
        return _legacy_rgb(arr, rgb is not None, path), RGB
    if arr.dtype not in (np.uint16, np.int16, np.float32):
        raise _unsupported_dtype(arr.dtype, path)
    if arr.ndim == 2:
        return arr[:, :, None], BANDS
    if arr.shape[2] == 3:
        return np.ascontiguousarray(arr[:, :, ::-1]), RGB
    if arr.shape[2] == 4:
        return np.ascontiguousarray(arr[:, :, [2, 1, 0, 3]]), BANDS
    return np.ascontiguousarray(arr), BANDS


def image_layout(path: Path, options: ImageOptions, max_pixels: int, *, windowed: bool = False,
                 data: np.ndarray | None = None) -> tuple[str, int, str]:
    """(dtype string, bands, channel kind) an image file is stored as under ``options``: what a split's first
    image says its every image must be. Checked (:func:`check_pixels`) and decoded like any sample.

    ``windowed`` (tiling): a TIFF too large to decode whole (:func:`decodes_whole`), which is read window by
    window, is described from its directories instead, with ``options`` applied to one pixel of its type and bands
    (no pixel decoded). ``data``: the image file's bytes, when they are not (only) a file's at ``path``."""
    path = Path(path)
    if data is None:
        regular_stat(path, "image")
    header = read_header(path, "image", data)
    if windowed and data is None and header.kind == "TIFF" and not decodes_whole(header, max_pixels):
        import tifffile

        with tifffile.TiffFile(path) as tif:
            pages = tiff_band_pages(tif, path, "image", options.pages_as_bands)
            dtype, n, kind = _tiff_layout(pages, path, options.pages_as_bands)
        if not options.bands:
            check_band_count(n, path)  # before a pixel of every band is allocated
        arr = np.zeros((1, 1, n), np.uint8 if dtype == np.bool_ else dtype.newbyteorder("="))
    else:
        check_pixels(path, max_pixels, "image", data)
        arr, kind = decode_native(path, data, pages_as_bands=options.pages_as_bands)
    bands = options.bands
    arr = options.apply(arr, path)
    check_band_count(int(arr.shape[2]), path)
    if arr.shape[2] != 3 or bands not in ((), (1, 2, 3)):
        kind = BANDS
    try:
        return stored_dtype(arr.dtype), int(arr.shape[2]), kind
    except ValueError:
        raise _unsupported_dtype(arr.dtype, path) from None


def window_as_stored(raw: np.ndarray, path: Path, options: ImageOptions) -> np.ndarray:
    """A window of a TIFF read by :class:`~shardkit.images.tiles.TiledTiff` ((h, w) or (h, w, C), the page's type) as
    convert stores that TIFF's images: every sample a band, then the bands and type asked for (the rule of
    :func:`decode_image`, so windowed and whole-decoded tiles are alike)."""
    arr = raw if raw.ndim == 3 else raw[:, :, None]
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8)
    return options.apply(np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("="), copy=False)), path)


#: A georeference: (CRS, affine transform (a, b, c, d, e, f): x = a·col + b·row + c, y = d·col + e·row + f, at
#: pixel corners). The CRS is ``EPSG:<code>`` where the GeoKeys name one, else their citation text, else "".
Georeference = tuple[str, tuple[float, float, float, float, float, float]]
_USER_DEFINED = 32767


def _crs_text(geo: dict[str, Any]) -> str:
    for key in ("ProjectedCSTypeGeoKey", "GeographicTypeGeoKey"):
        code = geo.get(key)
        if code is not None and int(code) not in (0, _USER_DEFINED):
            return f"EPSG:{int(code)}"
    return str(geo.get("GTCitationGeoKey") or geo.get("GeogCitationGeoKey") or "")


def georeference(path: Path, data: np.ndarray | None = None) -> Georeference | None:
    """A GeoTIFF's CRS and pixel-to-model transform, from its GeoKeys and ModelTransformation or
    ModelPixelScale + ModelTiepoint tags (no pixel decoded); None for any other file or a TIFF without them.
    Provenance only: nothing here changes pixels. A point-registered raster (RasterPixelIsPoint) is moved half a
    pixel so the transform always refers to pixel corners.

    ``data``: the file's bytes when the caller holds them; else the file is opened and only its directories and
    tags are read (a source read window by window may be far larger than memory)."""
    path = Path(path)
    head = read_head(path, "image", 16) if data is None else file_bytes(path, "image", data)[:16].tobytes()
    if sniff(head) != "TIFF":
        return None
    import tifffile

    try:
        with tifffile.TiffFile(path if data is None else io.BytesIO(_as_bytes(data))) as tif:
            geo = tif.geotiff_metadata if tif.is_geotiff else None
    except Exception:  # a damaged GeoKey directory: no georeference (the pixels decode or fail on their own)
        return None
    if not geo:
        return None
    matrix = geo.get("ModelTransformation")
    if matrix is not None and np.size(matrix) == 16:
        m = np.asarray(matrix, np.float64).reshape(4, 4)
        t = (m[0, 0], m[0, 1], m[0, 3], m[1, 0], m[1, 1], m[1, 3])
    else:
        scale, tie = geo.get("ModelPixelScale"), geo.get("ModelTiepoint")
        if scale is None or tie is None or len(scale) < 2 or len(tie) < 6:
            return None
        sx, sy = float(scale[0]), float(scale[1])
        i, j, x, y = (float(v) for v in (tie[0], tie[1], tie[3], tie[4]))
        t = (sx, 0.0, x - i * sx, 0.0, -sy, y + j * sy)
    if int(geo.get("GTRasterTypeGeoKey", 1) or 1) == 2:  # PixelIsPoint: the tie point is a pixel's centre
        a, b, c, d, e, f = t
        t = (a, b, c - 0.5 * (a + b), d, e, f - 0.5 * (d + e))
    if not all(np.isfinite(t)):
        return None
    return _crs_text(geo), tuple(float(v) for v in t)  # type: ignore[return-value]


def _png_depth(data: np.ndarray) -> int:
    """A PNG's bit depth from its IHDR (0 for anything else)."""
    header = png_header(data)
    return 0 if header is None else header.depth


def decode_image(path: Path, data: np.ndarray | None = None, options: ImageOptions | None = None) -> np.ndarray:
    """Decode an image to (H, W, C) as stored (:func:`decode_native`), then as ``options`` ask (bands, type).

    Nothing is rescaled unless ``options`` say how (:mod:`shardkit.images.imagetypes`); a type shardkit does not store
    (float64, int32 …) is refused unless ``options`` convert it. ``data``: the file's bytes, when the caller has
    read them already.
    """
    options = options or ImageOptions()
    arr, _ = decode_native(Path(path), data, pages_as_bands=options.pages_as_bands)
    arr = options.apply(arr, Path(path))
    try:
        stored_dtype(arr.dtype)
    except ValueError:
        raise _unsupported_dtype(arr.dtype, Path(path)) from None
    return arr


def regular_stat(path: Path, what: str = "image") -> os.stat_result:
    """``os.stat`` of an input that must be a regular file (not a FIFO, device, socket or folder).

    Checked before anything opens the file: opening a FIFO blocks forever. A broken symbolic link,
    a symbolic link loop and a file that is not regular are each a one-line error.
    """
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise InputNotFoundError(f"broken symbolic link to {str(path.readlink())!r}", path=path,
                                     fix="fix or remove the link, or --on-error skip") from None
        raise InputNotFoundError(f"{what} file vanished while converting", path=path,
                                 fix="re-run when the input is stable") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DecodeError("symbolic link loop (too many levels of symbolic links)", path=path,
                              fix="fix or remove the link, or --on-error skip") from None
        raise DecodeError(f"cannot read {what}: {exc.strerror or exc}", path=path,
                          fix="check the file and its permissions, or --on-error skip") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise DecodeError(f"{what} is {kind}, not a regular file", path=path,
                          fix="replace it with the image file, remove it, or --on-error skip")
    return st


#: Most bytes a file may hold per pixel its header states (16-bit RGBA stored uncompressed), plus metadata.
MAX_BYTES_PER_PIXEL = 8
METADATA_SLACK = 64 << 20
#: Most bytes per allowed pixel a decode may allocate: 12 is a progressive CMYK JPEG (2 bytes of coefficients per
#: component sample kept for the whole image, and the output); a file needing more is allowed fewer pixels.
DECODE_BYTES_PER_PIXEL = 12
#: Bytes :func:`read_header` reads from a file: every header it parses fits (JPEG's segments before the frame
#: header included: EXIF, ICC and MPF segments are at most 64 KiB each, 64 of them fit); a frame header further
#: in is refused rather than searched for.
HEADER_BYTES = 4 << 20
#: A TIFF's tile or strip buffer (OpenCV allocates one whole tile) may exceed its image by this many pixels.
TIFF_TILE_SLACK = 1 << 20

#: The input file types convert decodes, by the first bytes OpenCV recognises them by (in its order). Anything
#: else OpenCV would decode (Radiance HDR, PFM, PAM, Sun raster, AVIF …) is refused before decoding: its size is
#: not known first. JPEG 2000 images are decoded by :mod:`.jpeg2000`, not OpenCV.
SUPPORTED_TYPES = "PNG, JPEG, TIFF, BMP, GIF, WebP, PPM/PGM/PBM, NPY, JPEG 2000 (images)"
_PNM_WHITESPACE = b" \t\r\n\v\f"


@dataclass(frozen=True)
class ImageHeader:
    """What a file's header says, read without decoding: its type, size, and the bytes per pixel its decode
    allocates at most (channels x bytes per channel, and JPEG's coefficient buffers)."""

    kind: str
    height: int
    width: int
    bytes_per_pixel: int

    @property
    def pixels(self) -> int:
        return self.height * self.width


def sniff(head: bytes) -> str | None:
    """The type OpenCV will decode a file as, from its first bytes (OpenCV picks its decoder by signature, not
    by name); None for anything else. ``"unsupported: …"`` for types OpenCV decodes but convert does not."""
    if head.startswith(b"BM"):
        return "BMP"
    if head.startswith((b"#?RGBE", b"#?RADIANCE")):
        return "unsupported: Radiance HDR"
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    if head.startswith(b"\x59\xa6\x6a\x95"):
        return "unsupported: Sun raster"
    if len(head) > 2 and head[:1] == b"P" and head[2:3] in _PNM_WHITESPACE:
        if head[1:2] in b"123456":
            return "PNM"
        if head[1:2] == b"7":
            return "unsupported: PAM"
    if head[:2] in (b"Pf", b"PF"):
        return "unsupported: PFM"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "TIFF"
    if head.startswith(_NPY_MAGIC):
        return "NPY"
    if head.startswith(PNG_SIGNATURE):
        return "PNG"
    if is_jpeg2000(head):
        return "JPEG2000"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if head[4:8] == b"ftyp" and head[8:12] in (b"avif", b"avis", b"mif1", b"msf1"):
        return "unsupported: AVIF/HEIF"
    return None


def _png_header(head: bytes) -> tuple[int, int, int]:
    """(height, width, bytes per pixel) from a PNG's IHDR, which must be its first chunk (as libpng requires)."""
    header = png_header(head)
    if header is None:
        raise ValueError("no IHDR chunk first")
    channels = PNG_CHANNELS.get(header.colour, 4 if header.colour == 3 else None)  # palette: OpenCV may give BGRA
    if channels is None or header.depth not in (1, 2, 4, 8, 16):
        raise ValueError(f"colour type {header.colour} / bit depth {header.depth}")
    return header.height, header.width, channels * (2 if header.depth == 16 else 1)


def _jpeg_header(head: bytes) -> tuple[int, int, int]:
    """(height, width, bytes per pixel) from the first frame header, found as libjpeg finds it, with its tolerance
    (:func:`~shardkit.images.headers.jpeg_frame`, not strict: an input libjpeg decodes is sized as libjpeg sizes it).
    A progressive decode keeps 2 bytes of coefficients per component sample besides the output.
    """
    frame = jpeg_frame(head, strict=False)
    if frame.components not in (1, 3, 4):
        raise ValueError(f"{frame.components} colour components")
    return frame.height, frame.width, (frame.components * 2 if frame.progressive else 0) + max(frame.components, 3)


#: Most bytes one TIFF tag's values may hold: PIL turns each value into a Python object, so a directory claiming
#: millions of strip offsets would cost gigabytes before any pixel (4096 one-row strips take 16 KiB).
MAX_TIFF_TAG_BYTES = 1 << 20
_TIFF_TYPE_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4, 16: 8, 17: 8,
                    18: 8}


def _check_tiff_entries(fh: Any, offset: int, little: bool, big: bool) -> None:
    """Refuse a TIFF directory with too many entries or a tag with more than :data:`MAX_TIFF_TAG_BYTES` of values,
    from the entries' declared counts, before PIL reads any value."""
    order: Literal["little", "big"] = "little" if little else "big"
    fh.seek(offset)
    count_size, entry_size, count_at = (8, 20, 4) if big else (2, 12, 4)
    n = int.from_bytes(fh.read(count_size), order)
    if n > 4096:
        raise ValueError(f"a directory of {n} entries")
    entries = fh.read(n * entry_size)
    for i in range(0, len(entries) - entry_size + 1, entry_size):
        kind = int.from_bytes(entries[i + 2 : i + 4], order)
        count = int.from_bytes(entries[i + count_at : i + count_at + (8 if big else 4)], order)
        if count * _TIFF_TYPE_BYTES.get(kind, 1) > MAX_TIFF_TAG_BYTES:
            raise ValueError(f"tag {int.from_bytes(entries[i : i + 2], order)} holds {count} values")


def _tiff_header(fh: Any, path: Path, what: str) -> tuple[int, int, int]:
    """(height, width, bytes per pixel) of what a TIFF decodes to (:func:`_decode_tiff`), from its directories.

    The first directory's entries are bounded before tifffile reads a value (:func:`_check_tiff_entries`); every
    full-resolution page counts (a multi-page TIFF decodes to one band per page, or is refused). A tile or strip
    far larger than the image is refused: the decoder allocates one whole. Pages that cannot be the bands of one
    image (:func:`_tiff_layout`) are a DecodeError naming ``path``, the problem and its fix.
    """
    import tifffile

    prefix = fh.read(16)
    little, big = prefix[:2] == b"II", prefix[2:4] in (b"+\x00", b"\x00+")
    order: Literal["little", "big"] = "little" if little else "big"
    first = int.from_bytes(prefix[8:16] if big else prefix[4:8], order)
    _check_tiff_entries(fh, first, little, big)
    fh.seek(0)
    with tifffile.TiffFile(fh) as tif:
        pages = _tiff_pages(tif)
        if not pages:
            raise ValueError("no image directory")
        page = pages[0]
        height, width = int(page.imagelength), int(page.imagewidth)
        count = _tiff_planes(tif, pages, path, what)
        dtype, bands, _ = _tiff_layout(pages, path, True, what, count)
        planar = int(getattr(page, "planarconfig", 1)) == 2 or count > 1
        if page.is_tiled:
            tile = int(page.tilelength) * int(page.tilewidth)
        else:
            rows = int(page.rowsperstrip or height)
            tile = width * min(rows, height)
    if tile > max(width * height, 1) + TIFF_TILE_SLACK:
        raise ValueError(f"a tile or strip of {tile} pixels for a {height}x{width} image")
    return height, width, bands * max(dtype.itemsize, 1) * (2 if planar else 1)


def _pil_size(fh: Any, kind: str, path: Path, what: str) -> tuple[int, int, int]:
    """(height, width, bytes per pixel) by PIL, which reads only the header, held to the type OpenCV sniffed."""
    if kind == "TIFF":
        return _tiff_header(fh, path, what)
    fmt = {"PNM": "PPM"}.get(kind, kind.upper())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with Image.open(fh, formats=[fmt]) as im:
            width, height = (int(v) for v in im.size)
            depth = {"I;16": 2, "I;16B": 2, "I;16L": 2, "I": 4, "F": 4}.get(im.mode, 1)
            # OpenCV decodes palette, 1-bit and gray BMP/GIF to 3 or 4 channels
            channels = max(len(im.getbands()), 4 if kind == "GIF" else 3 if kind == "BMP" else 1)
    return height, width, channels * depth


def read_header(path: Path, what: str = "image", data: np.ndarray | None = None) -> ImageHeader:
    """The file's :class:`ImageHeader`, from its first :data:`HEADER_BYTES` only, never a decode.

    Its type is what OpenCV will take it for (by its first bytes, whatever its name). PNG and JPEG are parsed
    here as libpng and libjpeg read them; TIFF, BMP, GIF, WebP and PNM by PIL, held to that type. A file of
    another type, or whose header cannot be read, is a DecodeError: without its size it must not be decoded.
    """
    path = Path(path)
    if data is None:
        head = read_head(path, what, HEADER_BYTES)
    else:
        head = data[:HEADER_BYTES].tobytes()
        data_bytes = _as_bytes(data)
    if not head:
        raise DecodeError(f"cannot decode {what}: the file is empty (0 bytes)", path=path, fix=_FIX_CORRUPT)
    kind = sniff(head)
    if kind is None or kind.startswith("unsupported"):
        said = "not a " + SUPPORTED_TYPES + " file" if kind is None else f"a {kind.split(': ')[1]} file"
        raise DecodeError(f"cannot decode {what}: {said} (convert reads {SUPPORTED_TYPES}; the size of anything "
                          "else is not known before decoding)", path=path,
                          fix=f"re-export it as PNG (or another of {SUPPORTED_TYPES}), or --on-error skip")
    try:
        if kind == "PNG":
            h, w, bpp = _png_header(head)
        elif kind == "JPEG":
            h, w, bpp = _jpeg_header(head)
        elif kind == "NPY":
            shape, dtype, _, _ = _npy_header(head)
            h, w, bpp = shape[0], shape[1], (shape[2] if len(shape) == 3 else 1) * dtype.itemsize
        elif kind == "JPEG2000":  # the codestream's SIZ marker: nothing decoded
            siz = read_siz(head, path, what)
            h, w, bpp = siz.height, siz.width, siz.bytes_per_pixel
        elif data is not None:
            h, w, bpp = _pil_size(io.BytesIO(data_bytes), kind, path, what)
        else:  # PIL seeks to what it needs (a TIFF's directory is often at the end of the file)
            with open(path, "rb") as fh:
                h, w, bpp = _pil_size(fh, kind, path, what)
    except DecodeError:  # the header is read and says what is wrong (TIFF pages that are not one image's bands)
        raise
    except Image.DecompressionBombError:
        bomb = 2 * (Image.MAX_IMAGE_PIXELS or 0)
        raise DecodeError(f"{what} is larger than {bomb} pixels (its {kind} header), more than any --max-pixels "
                          "convert can check", path=path, fix="shrink the file, or --on-error skip") from None
    except (ValueError, SyntaxError, OSError, EOFError, IndexError, KeyError, TypeError,
            UnidentifiedImageError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise DecodeError(f"cannot decode {what}: its {kind} header cannot be read ({reason}), corrupt or "
                          "truncated", path=path, fix=_FIX_CORRUPT) from None
    return ImageHeader(kind, h, w, bpp)


def decodes_whole(header: ImageHeader, max_pixels: int) -> bool:
    """Whether :func:`check_pixels` lets a file of this header be decoded whole: at most ``max_pixels`` pixels,
    and at most :data:`DECODE_BYTES_PER_PIXEL` bytes per allowed pixel (many bands or pages need more). A tiled
    TIFF that does not is read window by window when tiling."""
    return header.pixels <= max_pixels and header.pixels * header.bytes_per_pixel <= max_pixels * DECODE_BYTES_PER_PIXEL


def check_pixels(path: Path, max_pixels: int, what: str = "image", data: np.ndarray | None = None) -> ImageHeader:
    """Refuse a file before any decoder sees it, unless its header is readable and within ``max_pixels``.

    The one check every decode of an input file goes through (images and labels of every type): a regular
    file no larger than its pixels can need, a type convert reads (:func:`read_header`), at most
    ``max_pixels`` pixels, and a decode of at most :data:`DECODE_BYTES_PER_PIXEL` bytes per allowed pixel.
    ``data``: the file's bytes, when the caller has read them already (then the file is not opened again).
    Returns the header.
    """
    path = Path(path)
    size = regular_stat(path, what).st_size if data is None else data.size
    _check_file_size(path, size, max_pixels, None, what)
    header = read_header(path, what, data)
    hw = header.height, header.width
    if min(hw) == 0:  # libpng would print its own complaint before the decode fails
        raise DecodeError(f"cannot decode {what}: its header says {hw[0]}x{hw[1]} pixels", path=path,
                          fix=_FIX_CORRUPT)
    if header.pixels > max_pixels:
        raise DecodeError(
            f"{what} is {hw[0]}x{hw[1]} = {header.pixels} pixels, more than --max-pixels {max_pixels}",
            path=path, fix="shrink the file, raise --max-pixels, or --on-error skip",
        )
    need = header.pixels * header.bytes_per_pixel
    if need > max_pixels * DECODE_BYTES_PER_PIXEL:
        raise DecodeError(
            f"{what} is {hw[0]}x{hw[1]} pixels of {header.bytes_per_pixel} bytes ({header.kind}): its decode needs "
            f"{need} bytes, more than --max-pixels {max_pixels} allows ({DECODE_BYTES_PER_PIXEL} bytes per pixel)",
            path=path, fix="shrink the file, raise --max-pixels, or --on-error skip",
        )
    _check_file_size(path, size, max_pixels, hw, what, header.bytes_per_pixel)
    return header


def _check_file_size(path: Path, size: int, max_pixels: int, hw: tuple[int, int] | None, what: str,
                     bytes_per_pixel: int = 0) -> None:
    """Refuse a file far larger than any image of its header's size (or of --max-pixels) can be: it would be
    read whole into memory for nothing (e.g. a real PNG followed by gigabytes of padding). Before the header is
    read, a file may hold as many bytes as the largest decode allowed; after, as its pixels' bytes can need."""
    pixels = hw[0] * hw[1] if hw is not None else max_pixels
    per_pixel = max(MAX_BYTES_PER_PIXEL, bytes_per_pixel if hw is not None else DECODE_BYTES_PER_PIXEL)
    limit = pixels * per_pixel + METADATA_SLACK
    if size > limit:
        said = f"its header's {hw[0]}x{hw[1]} pixels" if hw is not None else f"--max-pixels {max_pixels}"
        raise DecodeError(f"{what} file is {size} bytes, more than {limit} that {said} can need",
                          path=path, fix="re-export the file, or --on-error skip")


def read_image_size(path: Path) -> tuple[int, int]:
    """``(H, W)`` from the file header, never decoding pixels (used to plan shards by bytes).

    The same header parse as :func:`check_pixels` (a file whose size its header does not tell is refused there
    and here); like ``decode_image``, EXIF orientation is ignored.
    """
    path = Path(path)
    regular_stat(path, "image")
    header = read_header(path, "image")
    return header.height, header.width


def label_palette(path: Path) -> tuple[tuple[int, int, int], ...] | None:
    """The RGB palette of a palette-indexed label (PNG, GIF, BMP, TIFF), read from its header (no pixels
    decoded); None for any other file or one that cannot be read. ``show`` draws the ids in these colours."""
    try:
        regular_stat(path, "label")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                if im.mode not in ("P", "PA"):
                    return None
                flat = im.getpalette("RGB") or []
    except (DecodeError, InputNotFoundError, UnidentifiedImageError, OSError, SyntaxError, ValueError,
            Image.DecompressionBombError):
        return None
    return tuple((flat[k], flat[k + 1], flat[k + 2]) for k in range(0, len(flat) - 2, 3))


def decode_palette_label(path: Path, data: np.ndarray | None = None) -> tuple[str, np.ndarray]:
    """A label file's PIL mode and pixels as stored: palette PNGs give their indices (OpenCV would expand colours).
    A TIFF that is not palette or 1-bit is decoded by tifffile (:func:`_tiff_by_tifffile`, RGB order as PIL's): its
    own type (PIL widens int16 to int32) and every band (PIL keeps the first)."""
    data = file_bytes(path, "label", data)
    if sniff(data[:16].tobytes()) == "TIFF":
        header = _pil_header(path, "label", data)
        if _tiff_by_tifffile(data, header):
            arr, _ = _decode_tiff(path, data, False, "label")
            mode = header[1] if header is not None else f"TIFF {arr.dtype}"
            return mode, arr[:, :, 0] if arr.shape[2] == 1 else arr
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(_as_bytes(data))) as im:
                im.load()
                return im.mode, np.array(im)
    except (
        UnidentifiedImageError,
        OSError,
        SyntaxError,
        ValueError,
        Image.DecompressionBombError,
    ) as exc:
        raise DecodeError(f"cannot decode label: {exc}", path=path, fix=_FIX_CORRUPT) from None
