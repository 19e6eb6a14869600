"""Pixels in, pixels out: decode images, fit image/label pairs to a size, encode labels.

Everything here runs inside worker processes and is a pure function of its inputs.
Labels are never interpolated: they are resized with nearest neighbour only and
padded with an explicit id, so every class id survives bit-exactly.

Files are read with ``np.fromfile`` + ``cv2.imdecode`` rather than ``cv2.imread``
because that works for non-ASCII paths on every platform and lets us tell an empty
file from a corrupt one. ``IMREAD_UNCHANGED`` keeps bit depth and alpha and ignores
EXIF orientation, so an image and its label are always read in the same pixel grid.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import warnings
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, UnidentifiedImageError

from .errors import ConfigError, DecodeError, InputNotFoundError, LabelError, ShardFormatError
from .onehot import onehot_into

logger = logging.getLogger(__name__)

#: Nearest neighbour with pixel centres aligned the way INTER_LINEAR / INTER_AREA align
#: them (the same sampling as PIL's NEAREST). Plain ``cv2.INTER_NEAREST`` samples
#: ``floor(dst * scale)``, which shifts labels up to one source pixel against the image
#: (e.g. at a 3x shrink). Both only ever copy existing ids: neither interpolates.
LABEL_INTERPOLATION = cv2.INTER_NEAREST_EXACT

RESIZE_MODES = ("none", "exact", "shorter")
CROP_MODES = ("center", "none")
ENCODINGS = ("index", "onehot", "packed")

_FIX_CORRUPT = "re-export or remove the file, or --on-error skip"
_warned_16bit = False


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


def _jpeg_truncated(data: np.ndarray) -> bool:
    """True for a JPEG whose last scan has no end-of-image marker after it.

    Entropy-coded data byte-stuffs 0xFF, so 0xFFD9 cannot occur inside a scan: a
    missing EOI after the last SOS means the file was cut. Older OpenCV builds decode
    such files to a half-grey picture with only a warning on stderr; this catches them.
    """
    raw = data.tobytes()
    if not raw.startswith(b"\xff\xd8"):
        return False
    return raw.rfind(b"\xff\xd9") < raw.rfind(b"\xff\xda")


def decode_raw(path: Path, what: str = "image", data: np.ndarray | None = None) -> np.ndarray:
    """Decode a file (or its already-read ``data``) exactly as stored with OpenCV; BGR order."""
    if data is None:
        data = read_bytes(path, what)
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
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _decode_png_rgb(data: np.ndarray) -> np.ndarray | None:
    """RGB-ordered pixels of a PNG via libspng, or None (not a PNG, no pyspng, or libspng refused it).

    A refusal falls back to OpenCV, which then produces the one-line error for a broken file.
    """
    if _spng is None or data[:8].tobytes() != _PNG_SIGNATURE:
        return None
    try:
        return _spng.load(data.tobytes())
    except Exception:  # any libspng failure: let OpenCV decide and word the error
        return None


def _png_plain_8bit(data: np.ndarray) -> bool:
    """True for an 8-bit gray or RGB PNG without a ``tRNS`` chunk: libspng then gives OpenCV's pixels exactly."""
    if data.size < 33 or data[:8].tobytes() != _PNG_SIGNATURE:
        return False
    depth = colour_type = -1
    pos = 8
    while pos + 8 <= data.size:
        length = int.from_bytes(data[pos : pos + 4].tobytes(), "big")
        kind = data[pos + 4 : pos + 8].tobytes()
        if kind == b"IHDR" and pos + 18 <= data.size:
            depth, colour_type = int(data[pos + 16]), int(data[pos + 17])
        elif kind == b"tRNS":  # OpenCV may turn it into an alpha channel
            return False
        elif kind == b"IDAT":  # tRNS must come before the image data
            break
        pos += 12 + length
    return depth == 8 and colour_type in (0, 2)


def decode_label_pixels(path: Path) -> np.ndarray:
    """A label file's pixels exactly as ``cv2.imdecode(…, IMREAD_UNCHANGED)`` gives them (BGR order).

    8-bit gray and RGB PNGs (the usual id maps and colour masks) are decoded with libspng,
    ~1.3-1.6x faster to the same pixels (tested on the real datasets); anything else
    (palette, 16-bit, transparency, other formats) goes through OpenCV.
    """
    path = Path(path)
    data = read_bytes(path, "label")
    if _png_plain_8bit(data):
        arr = _decode_png_rgb(data)  # None when libspng is missing or refuses: OpenCV decides below
        if arr is not None and arr.dtype == np.uint8:
            if arr.ndim == 3 and arr.shape[2] == 1:
                arr = arr[:, :, 0]
            return arr[:, :, ::-1] if arr.ndim == 3 else arr
    return decode_raw(path, "label", data)


def decode_image(path: Path) -> np.ndarray:
    """Decode an image to ``(H, W, 3)`` uint8 RGB.

    Grayscale is repeated to three channels; an alpha channel is dropped (segmentation
    images are opaque pictures; the alpha is not blended against anything); 16-bit
    images are reduced to 8-bit by ``>> 8`` (the high byte, i.e. floor(v / 256)).
    Floating-point images are refused: their value range is unknown.
    """
    global _warned_16bit
    data = read_bytes(Path(path), "image")
    rgb = _decode_png_rgb(data)
    arr = rgb if rgb is not None else decode_raw(Path(path), "image", data)
    if arr.dtype == np.uint16:
        if not _warned_16bit:
            logger.debug("%s: 16-bit image reduced to 8-bit by >> 8 (logged once per process)", path)
            _warned_16bit = True
        arr = (arr >> 8).astype(np.uint8)
    elif arr.dtype != np.uint8:
        raise DecodeError(
            f"cannot decode image: pixel type {arr.dtype} is not supported (only 8- or 16-bit integer)",
            path=path,
            fix="convert the image to 8-bit PNG or JPEG",
        )
    if arr.ndim == 3 and arr.shape[2] in (1, 2):  # gray (+ alpha)
        arr = arr[:, :, 0]
    if arr.ndim == 2:
        out = cv2.cvtColor(arr, cv2.COLOR_GRAY2RGB)
    elif arr.ndim == 3 and arr.shape[2] == 3:
        out = arr if rgb is not None else cv2.cvtColor(arr, cv2.COLOR_BGR2RGB)
    elif arr.ndim == 3 and arr.shape[2] == 4:
        out = cv2.cvtColor(arr, cv2.COLOR_RGBA2RGB if rgb is not None else cv2.COLOR_BGRA2RGB)
    else:
        raise DecodeError(
            f"cannot decode image: unsupported shape {arr.shape}", path=path, fix="convert it to an RGB image"
        )
    return np.ascontiguousarray(out)


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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


def check_pixels(path: Path, max_pixels: int, what: str = "image") -> None:
    """Refuse a file whose header declares more than ``max_pixels`` pixels, before anything is decoded.

    PNG: width and height from the IHDR chunk; anything else: PIL, which reads only the header.
    A header neither can read is left to the decoder (which reports it as corrupt).
    """
    path = Path(path)
    hw: tuple[int, int] | None = None
    try:
        with open(path, "rb") as fh:
            head = fh.read(24)
            if head[:8] == _PNG_SIGNATURE and head[12:16] == b"IHDR":
                hw = int.from_bytes(head[20:24], "big"), int.from_bytes(head[16:20], "big")
            else:
                fh.seek(0)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                    try:
                        with Image.open(fh) as im:
                            hw = int(im.size[1]), int(im.size[0])
                    except Image.DecompressionBombError:
                        bomb = 2 * (Image.MAX_IMAGE_PIXELS or 0)
                        if bomb and max_pixels < bomb:
                            raise DecodeError(
                                f"{what} is larger than {bomb} pixels, more than --max-pixels {max_pixels}",
                                path=path, fix="shrink the file, raise --max-pixels, or --on-error skip",
                            ) from None
    except FileNotFoundError:
        raise InputNotFoundError(f"{what} file does not exist", path=path,
                                 fix="check the input folder or list file") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return  # not a header we can read: the decoder gives the one-line error
    if hw is not None and hw[0] * hw[1] > max_pixels:
        raise DecodeError(
            f"{what} is {hw[0]}x{hw[1]} = {hw[0] * hw[1]} pixels, more than --max-pixels {max_pixels}",
            path=path, fix="shrink the file, raise --max-pixels, or --on-error skip",
        )


def read_image_size(path: Path) -> tuple[int, int]:
    """``(H, W)`` from the file header, without decoding pixels (used to plan shards by bytes).

    PIL reads headers lazily. A format PIL does not know (or refuses as too large)
    but OpenCV decodes falls back to a full decode. Like ``decode_image``, EXIF orientation is ignored.
    """
    path = Path(path)
    regular_stat(path, "image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                w, h = im.size
        return int(h), int(w)
    except FileNotFoundError:
        raise InputNotFoundError(
            "image file does not exist", path=path, fix="check the input folder"
        ) from None
    except (UnidentifiedImageError, Image.DecompressionBombError):
        arr = decode_raw(path, "image")
        return int(arr.shape[0]), int(arr.shape[1])
    except OSError as exc:
        raise DecodeError(f"cannot read image header: {exc}", path=path, fix=_FIX_CORRUPT) from None


def _target_size(hw: tuple[int, int], size: tuple[int, int] | None, resize: str) -> tuple[int, int]:
    """The (H, W) an image of size ``hw`` is scaled to before any crop."""
    if resize not in RESIZE_MODES:
        raise ConfigError(f"resize={resize!r} is not one of {', '.join(RESIZE_MODES)}")
    if resize == "none":
        return hw
    if size is None:
        raise ConfigError(f"--resize {resize} needs a target", fix="add --size HxW")
    th, tw = size
    if resize == "exact":
        return th, tw
    h, w = hw
    scale = max(th / h, tw / w)
    return max(th, round(h * scale)), max(tw, round(w * scale))


def pads(hw: tuple[int, int], size: tuple[int, int] | None, resize: str, crop: str) -> bool:
    """Whether :func:`fit_pair` pads a sample of height/width ``hw`` (it is smaller than ``size`` after resizing)."""
    if size is None or crop != "center":
        return False
    th, tw = _target_size(hw, size, resize)
    return th < size[0] or tw < size[1]


def _crop_or_pad(arr: np.ndarray, size: tuple[int, int], fill: int) -> np.ndarray:
    """Centre crop or pad to exactly ``size`` like ``tf.image.resize_with_crop_or_pad``.

    Per axis: larger → crop starting at ``(h - H) // 2``; smaller → pad with ``fill``,
    ``(H - h) // 2`` before and the rest after.
    """
    h, w = arr.shape[:2]
    th, tw = size
    if (h, w) == (th, tw):
        return arr
    src_y, dst_y = max((h - th) // 2, 0), max((th - h) // 2, 0)
    src_x, dst_x = max((w - tw) // 2, 0), max((tw - w) // 2, 0)
    ch, cw = min(h, th), min(w, tw)
    if h >= th and w >= tw:  # pure crop: a contiguous copy of the window
        return np.ascontiguousarray(arr[src_y : src_y + th, src_x : src_x + tw])
    out = np.full((th, tw, *arr.shape[2:]), fill, dtype=arr.dtype)
    out[dst_y : dst_y + ch, dst_x : dst_x + cw] = arr[src_y : src_y + ch, src_x : src_x + cw]
    return out


def fit_pair(
    image: np.ndarray,
    label: np.ndarray,
    *,
    size: tuple[int, int] | None,
    resize: str,
    crop: str,
    pad_label: int,
    label_path: Path | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Resize then centre crop-or-pad an image and its label identically.

    Images use INTER_AREA when shrinking (both axes no larger) and INTER_LINEAR
    otherwise; labels always use nearest neighbour (:data:`LABEL_INTERPOLATION`), so
    the output label holds only ids present in the input. Padding is 0 for the image
    and ``pad_label`` for the label.
    """
    if image.shape[:2] != label.shape[:2]:
        ih, iw = image.shape[:2]
        lh, lw = label.shape[:2]
        raise LabelError(
            f"label is {lh}x{lw} (HxW) but its image is {ih}x{iw}",
            path=label_path,
            fix="re-export the label at the image size",
        )
    if crop not in CROP_MODES:
        raise ConfigError(f"crop={crop!r} is not one of {', '.join(CROP_MODES)}")
    if np.issubdtype(label.dtype, np.integer):
        info = np.iinfo(label.dtype)
        if not info.min <= pad_label <= info.max:
            raise ConfigError(
                f"pad label {pad_label} does not fit labels of type {label.dtype}",
                fix="choose an --ignore-index that is a stored class id",
            )
    h, w = image.shape[:2]
    th, tw = _target_size((h, w), size, resize)
    if (th, tw) != (h, w):
        shrinking = th <= h and tw <= w
        interp = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
        had_channel_axis = image.ndim == 3
        image = cv2.resize(image, (tw, th), interpolation=interp)
        if had_channel_axis and image.ndim == 2:  # cv2 drops a single channel axis
            image = image[:, :, None]
        label = cv2.resize(label, (tw, th), interpolation=LABEL_INTERPOLATION)
    if size is not None and crop == "center":
        image = _crop_or_pad(image, size, 0)
        label = _crop_or_pad(label, size, pad_label)
    return np.ascontiguousarray(image), np.ascontiguousarray(label)


def stored_label_shape(hw: tuple[int, int], encoding: str, num_classes: int) -> tuple[int, ...]:
    """Shape of one stored label of height/width ``hw`` under ``encoding``."""
    h, w = hw
    if encoding == "index":
        return (h, w)
    if encoding == "onehot":
        return (h, w, num_classes)
    if encoding == "packed":
        return (h, w, (num_classes + 7) // 8)
    raise ConfigError(f"label encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")


def encode_label(
    ids: np.ndarray, encoding: str, num_classes: int, out: np.ndarray | None = None
) -> np.ndarray:
    """Turn ``(H, W)`` class ids (or a batch ``(..., H, W)``) into the stored label encoding.

    ``index`` keeps ids; ``onehot`` is ``(H, W, C)`` uint8 0/1; ``packed`` is the
    one-hot packed to bits along the last axis (``np.packbits``, big bit order),
    ``(H, W, ceil(C / 8))``. Ids ``>= C`` (an ignore id like 255) give all-zero vectors.
    ``out``, if given, must have exactly the stored shape and dtype and is filled.
    """
    if ids.ndim < 2:
        raise LabelError(f"label ids must be (H, W) or (..., H, W), got shape {ids.shape}")
    shape = (*ids.shape[:-2], *stored_label_shape(ids.shape[-2:], encoding, num_classes))
    dtype = ids.dtype if encoding == "index" else np.dtype(np.uint8)
    if out is not None and (out.shape != shape or out.dtype != dtype):
        raise ConfigError(f"output buffer is {out.shape} {out.dtype}, expected {shape} {dtype}")
    if encoding == "index":
        if out is None:
            return ids
        np.copyto(out, ids)
        return out
    if out is None:
        out = np.empty(shape, dtype=np.uint8)
    if encoding == "onehot":
        onehot_into(ids, num_classes, out, allow_numba=False)  # runs in convert's workers
        return out
    # packed: at most one bit per pixel (bit 7 - id % 8 of byte id // 8), so compare against
    # the byte index and multiply by the bit instead of building and packing the one-hot.
    nbytes = shape[-1]
    bit = np.right_shift(np.uint8(0x80), (ids & 7).astype(np.uint8))
    bit[ids >= num_classes] = 0
    np.equal((ids >> 3)[..., None], np.arange(nbytes, dtype=np.min_scalar_type(nbytes - 1)), out=out)
    np.multiply(out, bit[..., None], out=out)
    return out


def decode_label_encoding(
    stored: np.ndarray, encoding: str, num_classes: int, ignore_index: int | None
) -> np.ndarray:
    """Inverse of :func:`encode_label`: back to class ids (any leading dims, e.g. a batch).

    All-zero one-hot vectors become ``ignore_index``; without one they are an error,
    as is a vector with more than one bit set.
    """
    if encoding == "index":
        return stored
    if encoding == "packed":
        stored = np.unpackbits(stored, axis=-1, count=num_classes)
    elif encoding != "onehot":
        raise ConfigError(f"label encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")
    if stored.shape[-1] != num_classes:
        raise ShardFormatError(
            f"stored one-hot label has {stored.shape[-1]} channels, expected {num_classes}"
        )
    top = max(num_classes - 1, ignore_index or 0)
    out_dtype = np.uint8 if top <= 255 else np.dtype("<u2")
    hot = stored.sum(axis=-1, dtype=np.uint32)
    if (hot > 1).any():
        raise ShardFormatError("stored one-hot label has pixels with more than one class set")
    ids = stored.argmax(axis=-1).astype(out_dtype)
    empty = hot == 0
    if empty.any():
        if ignore_index is None:
            raise ShardFormatError(
                f"stored one-hot label has {int(empty.sum())} pixels with no class and no ignore index"
            )
        ids[empty] = ignore_index
    return ids
