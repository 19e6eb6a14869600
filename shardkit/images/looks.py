"""A look hash: 64 bits that stay equal, or nearly, when an image is re-encoded or resized — for near-duplicates.

A difference hash (dHash) taken exactly: the stored image's bands are summed into one gray plane; the plane is cut
into 8 rows × 9 columns of blocks at ``floor(k · H / 8)`` and ``floor(k · W / 9)``; bit ``(r, c)`` is 1 when block
``(r, c)``'s mean is less than block ``(r, c + 1)``'s, read row by row, most significant bit first (8 bytes). Block
sums of integer images are exact (int64) and means are compared by cross-multiplying in Python integers, so the hash
is the same on every machine (``shardkit verify`` recomputes it); float images sum in float64. Images smaller than
8 × 9 pixels repeat rows or columns (blocks of at least one pixel). Spec: formats/samples.md (``looks``).
"""

from __future__ import annotations

import numpy as np

#: bytes of a look hash (64 bits)
LOOK_BYTES = 8
ROWS, COLUMNS = 8, 9


def _edges(n: int, parts: int) -> np.ndarray:
    """Block starts along an axis of ``n`` pixels: ``floor(k · n / parts)`` (on an axis shorter than ``parts``
    some starts repeat, and ``reduceat`` gives such a block the one pixel at its start)."""
    return (np.arange(parts, dtype=np.int64) * n) // parts


def look_hash(image: np.ndarray) -> bytes:
    """The 8-byte look hash of a stored image (H, W) or (H, W, C), any dtype shardkit stores."""
    h, w = int(image.shape[0]), int(image.shape[1])
    plane = np.ascontiguousarray(image).reshape(h, -1)  # (H, W * C): the band sum comes after the row blocks
    integer = plane.dtype.kind in "iub"
    acc = np.int64 if integer else np.float64
    rows, cols = _edges(h, ROWS), _edges(w, COLUMNS)
    ends = np.append(rows[1:], h)
    blocks = [plane[a:max(b, a + 1)] for a, b in zip(rows.tolist(), ends.tolist(), strict=True)]
    if plane.dtype == np.uint8 and (int(np.max(ends - rows)) + 1) * 255 < 2**31:
        # OpenCV's column sums of each row block in int32 (exact: no block sums past 2**31), 2.4x numpy's widening
        # to int64 on a 352x480 RGB image; then the bands, in int64
        import cv2

        sums = np.stack([cv2.reduce(block, 0, cv2.REDUCE_SUM, dtype=cv2.CV_32S).ravel() for block in blocks])
        bands = sums.reshape(ROWS, w, -1).sum(axis=2, dtype=np.int64)
    else:  # one row block at a time, summed in a buffered reduction: memory O(W * C), never the image widened
        bands = np.stack([block.sum(axis=0, dtype=acc).reshape(w, -1).sum(axis=1) for block in blocks])  # (8, W)
    sums = np.add.reduceat(bands, cols, axis=1)  # (8, 9)
    rh = np.diff(np.append(rows, h)).clip(min=1)
    cw = np.diff(np.append(cols, w)).clip(min=1)
    area = rh[:, None] * cw[None, :]
    if integer:  # mean[c] < mean[c+1]  <=>  sum[c] * area[c+1] < sum[c+1] * area[c], exactly
        s, a = sums.tolist(), area.tolist()
        bits = [[s[r][c] * a[r][c + 1] < s[r][c + 1] * a[r][c] for c in range(COLUMNS - 1)] for r in range(ROWS)]
        packed = np.packbits(np.array(bits, dtype=bool).reshape(-1))
    else:
        means = sums / area
        packed = np.packbits((means[:, :-1] < means[:, 1:]).reshape(-1))
    return packed.tobytes()


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bits that differ between look hashes ``a`` and ``b`` ((..., 8) uint8, broadcast)."""
    return np.unpackbits(np.bitwise_xor(a, b), axis=-1).sum(axis=-1)
