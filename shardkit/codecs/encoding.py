"""Label encodings — what ``index``, ``onehot`` and ``packed`` mean — in one place.

An encoding says how class ids of an ``(…, H, W)`` label become an array: its shape for a
given (H, W), its dtype, and how to encode ids into it and decode it back to ids. The
writers store labels in one (``SampleSpec.encoding``), ``verify`` and the readers decode
them, and the reader's ``labels=`` outputs are encodings too (:func:`reader_output`), so
turning a stored label into the output asked for is one call, :func:`transcode_into`.

- :class:`Index`: ``(H, W)`` class ids in the split's id dtype (uint8, or little-endian
  uint16 when an id or the ignore index exceeds 255).
- :class:`OneHot`: ``(H, W, C)`` 0/1 (``(C, H, W)`` with ``channels_first``), uint8 or float32.
- :class:`Packed`: the uint8 one-hot packed to bits along the last axis, big bit order
  (``np.packbits``): ``(H, W, ceil(C / 8))``.

Ids ``>= C`` (an ignore id such as 255) encode as all-zero vectors, which decode back to
the ignore index. Stored encodings keep one plane per class id (a lossless store of the ids); the
reader's one-hot *outputs* follow the one-hot rule of :mod:`shardkit.codecs.onehot`: the ignore class is
never a channel, also when its id lies inside ``0..C-1`` (CamVid's 11), so ignore pixels are all zero.
Only numpy is imported here (the reader core must not load OpenCV).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, LabelError, ShardFormatError
from .onehot import channel_classes, hot_channels, ignore_inside, onehot_into

#: The stored label encodings, as named in manifests, the CLI and ``ConvertConfig``.
NAMES = ("index", "onehot", "packed")
#: The reader's ``labels=`` outputs.
READER_OUTPUTS = ("ids", "onehot", "float_onehot", "stored")


def id_dtype(num_classes: int, ignore_index: int | None) -> np.dtype:
    """uint8 when every stored id (the ignore index included) fits a byte, else little-endian uint16."""
    top = max(num_classes - 1, ignore_index if ignore_index is not None else 0)
    return np.dtype(np.uint8) if top <= 255 else np.dtype("<u2")


class LabelEncoding(ABC):
    """How ``(…, H, W)`` class ids become an encoded array, and back."""

    name: ClassVar[str]
    channels_first: bool = False

    def __init__(self, num_classes: int, dtype: Any) -> None:
        self.num_classes = int(num_classes)
        self.dtype = np.dtype(dtype)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), *sorted((k, str(v)) for k, v in vars(self).items())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.num_classes}, {self.dtype.str!r})"

    @property
    def channels(self) -> int | None:
        """Length of the class axis: None for id maps."""
        return None

    @property
    def bitorder(self) -> str | None:
        """Bit order of packed bytes (the manifest's ``bitorder``): None when nothing is packed."""
        return None

    def shape(self, hw: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of one encoded label of height/width ``hw``."""
        h, w = int(hw[0]), int(hw[1])
        c = self.channels
        if c is None:
            return (h, w)
        return (c, h, w) if self.channels_first else (h, w, c)

    def batch_shape(self, ids_shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the encoding of ids of shape ``(…, H, W)``."""
        if len(ids_shape) < 2:
            raise LabelError(f"label ids must be (H, W) or (..., H, W), got shape {ids_shape}")
        return (*ids_shape[:-2], *self.shape(ids_shape[-2:]))

    def lead_shape(self, encoded_shape: tuple[int, ...]) -> tuple[int, ...]:
        """``(…, H, W)`` of the ids an encoded array of ``encoded_shape`` holds."""
        if self.channels is None:
            return encoded_shape
        if self.channels_first:
            return (*encoded_shape[:-3], *encoded_shape[-2:])
        return encoded_shape[:-1]

    def encode(self, ids: np.ndarray, out: np.ndarray | None = None, *, allow_numba: bool = True) -> np.ndarray:
        """Ids ``(…, H, W)`` → encoded array; into ``out`` (exactly that shape and dtype) when given."""
        shape = self.batch_shape(ids.shape)
        if out is not None and (out.shape != shape or out.dtype != self.dtype):
            raise ConfigError(f"output buffer is {out.shape} {out.dtype}, expected {shape} {self.dtype}")
        if out is None:
            out = np.empty(shape, self.dtype)
        self.encode_into(ids, out, allow_numba=allow_numba)
        return out

    @abstractmethod
    def encode_into(self, ids: np.ndarray, out: np.ndarray, *, allow_numba: bool = True) -> None:
        """Write the encoding of ids ``(…, H, W)`` into ``out``.

        ``allow_numba=False`` keeps to numpy (convert's pool workers: see
        :func:`shardkit.codecs.onehot.onehot_into`)."""

    @abstractmethod
    def decode(self, encoded: np.ndarray, ignore_index: int | None) -> np.ndarray:
        """Encoded array → class ids ``(…, H, W)``; all-zero vectors → ``ignore_index``."""

    def decode_into(self, encoded: np.ndarray, out: np.ndarray, ignore_index: int | None) -> None:
        """:meth:`decode` written into ``out`` (any integer dtype wide enough)."""
        np.copyto(out, self.decode(encoded, ignore_index), casting="unsafe")

    def hot(self, encoded: np.ndarray) -> np.ndarray | None:
        """The 0/1 one-hot (channels last, uint8) this encoding holds, or None for id maps."""
        return None


class Index(LabelEncoding):
    """Class ids as they are: ``(H, W)`` in ``dtype`` (uint8 or ``<u2``)."""

    name = "index"

    def encode(self, ids: np.ndarray, out: np.ndarray | None = None, *, allow_numba: bool = True) -> np.ndarray:
        if out is None:
            self.batch_shape(ids.shape)  # ndim check
            return ids  # ids are their own index encoding: no copy
        return super().encode(ids, out)

    def encode_into(self, ids: np.ndarray, out: np.ndarray, *, allow_numba: bool = True) -> None:
        np.copyto(out, ids, casting="unsafe")

    def decode(self, encoded: np.ndarray, ignore_index: int | None) -> np.ndarray:
        return encoded


class _Hot(LabelEncoding):
    """Shared decoding of one-hot style encodings: exactly one bit per pixel, or none (ignore)."""

    def decode(self, encoded: np.ndarray, ignore_index: int | None) -> np.ndarray:
        stored = self.hot(encoded)
        assert stored is not None
        c = self.num_classes
        dropped = self.dropped_class
        want = c - (dropped is not None)
        if stored.shape[-1] != want:
            raise ShardFormatError(f"stored one-hot label has {stored.shape[-1]} channels, expected {want}")
        hot = stored.sum(axis=-1, dtype=np.uint32)
        if (hot > 1).any():
            raise ShardFormatError("stored one-hot label has pixels with more than one class set")
        ids = stored.argmax(axis=-1).astype(id_dtype(c, ignore_index))
        if dropped is not None:  # channels above the dropped ignore class are class id - 1
            ids += ids >= dropped
        empty = hot == 0
        if empty.any():
            if ignore_index is None:
                raise ShardFormatError(
                    f"stored one-hot label has {int(empty.sum())} pixels with no class and no ignore index")
            ids[empty] = ignore_index
        return ids

    @property
    def dropped_class(self) -> int | None:
        """The class id without a channel (the ignore class, in a one-hot output), or None."""
        return None


class OneHot(_Hot):
    """0/1 per class: ``(H, W, C)``, or ``(C, H, W)`` with ``channels_first``; uint8 (stored) or float32.

    ``ignore_index`` (outputs only; stored encodings leave it None): the ignore class gets no channel
    (:func:`shardkit.codecs.onehot.hot_channels`): ``C - 1`` channels when it lies inside ``0..C-1``."""

    name = "onehot"

    def __init__(self, num_classes: int, dtype: Any = np.uint8, *, channels_first: bool = False,
                 ignore_index: int | None = None) -> None:
        super().__init__(num_classes, dtype)
        self.channels_first = bool(channels_first)
        self.ignore_index = ignore_index if ignore_index is not None and ignore_inside(num_classes, ignore_index) \
            else None

    def __repr__(self) -> str:
        cf = ", channels_first=True" if self.channels_first else ""
        ig = f", ignore_index={self.ignore_index}" if self.ignore_index is not None else ""
        return f"OneHot({self.num_classes}, {self.dtype.str!r}{cf}{ig})"

    @property
    def channels(self) -> int:
        return hot_channels(self.num_classes, self.ignore_index)

    @property
    def dropped_class(self) -> int | None:
        return self.ignore_index

    @property
    def channel_classes(self) -> np.ndarray:
        """The class id of each channel (``0..C-1`` less the dropped ignore class)."""
        return channel_classes(self.num_classes, self.ignore_index)

    def encode_into(self, ids: np.ndarray, out: np.ndarray, *, allow_numba: bool = True) -> None:
        onehot_into(ids, self.num_classes, out, channels_first=self.channels_first, allow_numba=allow_numba,
                    ignore_index=self.ignore_index)

    def hot(self, encoded: np.ndarray) -> np.ndarray:
        return np.moveaxis(encoded, -3, -1) if self.channels_first else encoded


class Packed(_Hot):
    """The uint8 one-hot packed to bits along the class axis, big bit order: ``(H, W, ceil(C / 8))``."""

    name = "packed"

    def __init__(self, num_classes: int, dtype: Any = np.uint8) -> None:
        super().__init__(num_classes, np.uint8)

    @property
    def channels(self) -> int:
        return (self.num_classes + 7) // 8

    @property
    def bitorder(self) -> str:
        return "big"

    def encode_into(self, ids: np.ndarray, out: np.ndarray, *, allow_numba: bool = True) -> None:
        # at most one bit per pixel (bit 7 - id % 8 of byte id // 8), so compare against the byte
        # index and multiply by the bit instead of building and packing the one-hot.
        nbytes = out.shape[-1]
        bit = np.right_shift(np.uint8(0x80), (ids & 7).astype(np.uint8))
        bit[ids >= self.num_classes] = 0
        np.equal((ids >> 3)[..., None], np.arange(nbytes, dtype=np.min_scalar_type(nbytes - 1)), out=out)
        np.multiply(out, bit[..., None], out=out)

    def hot(self, encoded: np.ndarray) -> np.ndarray:
        return np.unpackbits(encoded, axis=-1, count=self.num_classes)


_STORED: dict[str, type[LabelEncoding]] = {"index": Index, "onehot": OneHot, "packed": Packed}


def stored(name: str, num_classes: int, id_dtype: Any) -> LabelEncoding:
    """The stored encoding called ``name`` (``index``, ``onehot``, ``packed``); ``id_dtype`` is the class ids'."""
    if name not in _STORED:
        raise ConfigError(f"label encoding {name!r} is not one of {', '.join(NAMES)}")
    return _STORED[name](num_classes, id_dtype if name == "index" else np.uint8)


def reader_output(labels: str, stored_as: LabelEncoding, id_dtype: Any, *,
                  channels_first: bool = False, ignore_index: int | None = None) -> LabelEncoding:
    """The encoding a reader's ``labels=`` asks for; ``"stored"`` (and ``"ids"`` of index storage) is
    ``stored_as`` itself, which a reader then hands out without conversion. One-hot outputs give the
    ignore class (``ignore_index``) no channel (:mod:`shardkit.codecs.onehot`)."""
    if labels not in READER_OUTPUTS:
        raise ConfigError(f"labels={labels!r} is not one of {', '.join(READER_OUTPUTS)}")
    if labels == "stored" or (labels == "ids" and isinstance(stored_as, Index)):
        return stored_as
    if labels == "ids":
        return Index(stored_as.num_classes, id_dtype)
    dtype = np.float32 if labels == "float_onehot" else np.uint8
    return OneHot(stored_as.num_classes, dtype, channels_first=channels_first, ignore_index=ignore_index)


def transcode_into(src: LabelEncoding, dst: LabelEncoding, encoded: np.ndarray, out: np.ndarray,
                   ignore_index: int | None) -> None:
    """Labels encoded as ``src`` → ``dst``, written into ``out``, vectorised (no per-class loop).

    One-hot outputs of one-hot or packed storage copy (unpack) the bits instead of decoding to ids."""
    if src == dst:
        np.copyto(out, encoded)
    elif isinstance(dst, Index):
        src.decode_into(encoded, out, ignore_index)
    elif isinstance(src, Index):
        dst.encode_into(encoded, out)
    elif isinstance(dst, OneHot) and (hot := src.hot(encoded)) is not None:
        if dst.dropped_class is not None:  # the ignore class's plane is not an output channel
            hot = hot[..., dst.channel_classes]
        np.copyto(out, np.moveaxis(hot, -1, -3) if dst.channels_first else hot, casting="unsafe")
    else:
        dst.encode_into(src.decode(encoded, ignore_index), out)


# ---------------------------------------------------------------- by-name helpers (writers, verify, tests)
def stored_label_shape(hw: tuple[int, int], encoding: str, num_classes: int) -> tuple[int, ...]:
    """Shape of one stored label of height/width ``hw`` under ``encoding``."""
    return stored(encoding, num_classes, np.uint8).shape(hw)


def encode_label(ids: np.ndarray, encoding: str, num_classes: int, out: np.ndarray | None = None) -> np.ndarray:
    """Turn ``(H, W)`` class ids (or a batch ``(..., H, W)``) into the stored label encoding.

    ``index`` keeps ids; ``onehot`` is ``(H, W, C)`` uint8 0/1; ``packed`` is the
    one-hot packed to bits along the last axis (``np.packbits``, big bit order),
    ``(H, W, ceil(C / 8))``. Ids ``>= C`` (an ignore id like 255) give all-zero vectors.
    ``out``, if given, must have exactly the stored shape and dtype and is filled.
    Runs in convert's workers, so the one-hot is built without numba.
    """
    enc = stored(encoding, num_classes, ids.dtype)
    return enc.encode(ids, out, allow_numba=False)


def decode_label_encoding(stored_label: np.ndarray, encoding: str, num_classes: int,
                          ignore_index: int | None) -> np.ndarray:
    """Inverse of :func:`encode_label`: back to class ids (any leading dims, e.g. a batch).

    All-zero one-hot vectors become ``ignore_index``; without one they are an error,
    as is a vector with more than one bit set.
    """
    return stored(encoding, num_classes, stored_label.dtype).decode(stored_label, ignore_index)
