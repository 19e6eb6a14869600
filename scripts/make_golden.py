"""Regenerate the golden examples in ``formats/golden/`` (tiny datasets written by shardkit).

    python scripts/make_golden.py               # rewrites formats/golden/
    python scripts/make_golden.py OUT_DIR       # writes the same tree somewhere else

A synthetic dataset of three samples (4x6, 7x9 and 2x9 pixels, five classes with
colours in ``class_dict.csv`` and one unknown colour per label that becomes the ignore
id 255) is written in the ``class_dict`` layout and converted with shardkit three ways:

``npy-fixed/``     npy, ``--size 4x6`` (centre crop / pad), ``index`` labels
``npy-variable/``  npy, no ``--size`` (variable size), ``packed`` labels
``lmdb/``          lmdb, no ``--size`` (variable size), ``onehot`` labels
``lmdb-zstd/``     lmdb format version 2, variable size, ``index`` labels, images zstd, labels zstd
``lmdb-png/``      lmdb format version 2, ``--size 4x6``, ``packed`` labels, images png, labels lz4
``hdf5-zstd/``     hdf5 format version 2, ``--size 4x6``, ``index`` labels, images zstd, labels lz4
                   (hdf5plugin's registered Zstd and LZ4 filters)

The folders above keep manifest version 1 (sample records inline: what shardkit wrote before the
samples sidecars; written here with :func:`shardkit.store.manifest.inline_manifest`). These are manifest
version 2 (one ``samples-<stem>.npy`` sidecar per shard, formats/samples.md), as convert writes today:

``manifest2-npy-fixed/``     as ``npy-fixed``
``manifest2-npy-variable/``  as ``npy-variable``
``manifest2-lmdb-zstd/``     as ``lmdb-zstd``

and this one manifest version 3 (version 2 plus the publish number ``version``; the publish is also kept
as ``manifest-v1.json``), as convert writes today:

``manifest3-npy-fixed/``     as ``npy-fixed``

Only ``manifest3-npy-fixed`` and the ``manifest4-*`` folders keep the sidecars' ``pixels`` and ``looks`` columns
(pixel and look hashes) as convert writes them today; every other folder has them removed (sidecars and inline
records as shardkit wrote them before the columns, formats/samples.md "version note"), so those goldens keep
checking that older outputs stay readable.

all with ``--shard-size 2`` (two shards: 2 + 1 samples) and ``--workers 1``. Each golden folder
keeps only the dataset (``manifest.json`` and the shard files it names).
``expected.json`` holds what a reader must get back, computed here from the synthetic
arrays with plain numpy (never read back through shardkit).

The version 2 (codec) folders hold compressed bytes: equal for equal codec library versions, but
a newer zstd/lz4/libpng may write other bytes for the same arrays, so their files are compared by
decoded content (tests/test_golden_current.py), never byte for byte.

Everything is deterministic: pixels come from integer formulas, the PNGs are written by
the tiny encoder below (not OpenCV's), so their bytes (which the manifest's fingerprints
hash) never change, and the source files get a fixed mtime. Between runs only
``source.root`` (a temporary folder), ``tool.version`` and the bytes of the LMDB files
(formats/lmdb.md "Reproducibility") differ.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "formats" / "golden"

SPLIT = "train"
SHARD_SIZE = 2
IGNORE = 255
FIXED_SIZE = (4, 6)
#: (name, RGB colour) of the five classes; ids are the row order.
CLASSES: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("sky", (70, 130, 180)),
    ("road", (128, 64, 128)),
    ("car", (0, 0, 142)),
    ("person", (220, 20, 60)),
    ("tree", (107, 142, 35)),
)
UNKNOWN_COLOUR = (255, 255, 255)  # not in the table: mapped to IGNORE by --unknown-as 255
SOURCE_SIZES: tuple[tuple[int, int], ...] = ((4, 6), (7, 9), (2, 9))  # (H, W) of s0, s1, s2
MTIME_NS = 1_700_000_000 * 10**9

#: folder → (format, label encoding, --size, --image-codec, --label-codec)
VARIANTS: dict[str, tuple[str, str, tuple[int, int] | None, str, str]] = {
    "npy-fixed": ("npy", "index", FIXED_SIZE, "raw", "raw"),
    "npy-variable": ("npy", "packed", None, "raw", "raw"),
    "lmdb": ("lmdb", "onehot", None, "raw", "raw"),
    "lmdb-zstd": ("lmdb", "index", None, "zstd", "zstd"),
    "lmdb-png": ("lmdb", "packed", FIXED_SIZE, "png", "lz4"),
    "hdf5-zstd": ("hdf5", "index", FIXED_SIZE, "zstd", "lz4"),
    "manifest2-npy-fixed": ("npy", "index", FIXED_SIZE, "raw", "raw"),
    "manifest2-npy-variable": ("npy", "packed", None, "raw", "raw"),
    "manifest2-lmdb-zstd": ("lmdb", "index", None, "zstd", "zstd"),
    "manifest3-npy-fixed": ("npy", "index", FIXED_SIZE, "raw", "raw"),
    "manifest4-npy-fixed-uint16": ("npy", "index", FIXED_SIZE, "raw", "raw"),
    "manifest4-lmdb-zstd-uint16": ("lmdb", "index", None, "zstd", "zstd"),
}
#: folders converted from 4-band uint16 ``.npy`` images (manifest version 4, format version 3): images keep
#: their type and bands (formats/manifest.md "sample.image")
UINT16 = ("manifest4-npy-fixed-uint16", "manifest4-lmdb-zstd-uint16")
MANIFEST4_PREFIX = "manifest4-"
#: folders whose sidecars keep the ``pixels`` and ``looks`` columns (the others are written as before them)
WITH_PIXELS = ("manifest3-npy-fixed", "manifest4-npy-fixed-uint16", "manifest4-lmdb-zstd-uint16")
MANIFEST2_PREFIX = "manifest2-"  # folders kept in manifest version 2
MANIFEST3_PREFIX = "manifest3-"  # folders in manifest version 3; the others are written as version 1


# --------------------------------------------------------------------------- synthetic source


def synthetic_sample(s: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample ``s``: (image (H, W, 3) uint8 RGB, class ids (H, W) uint8 with exactly one IGNORE pixel)."""
    h, w = SOURCE_SIZES[s]
    y, x = np.mgrid[0:h, 0:w]
    image = np.stack([(37 * y + 11 * x + 101 * c + 53 * s + 7) % 256 for c in range(3)], axis=-1)
    ids = (y + 2 * x + s) % len(CLASSES)
    ids[(h - 1) // 2, (w - 1) // 2] = IGNORE  # the centre pixel survives the 4x6 crop / pad
    return image.astype(np.uint8), ids.astype(np.uint8)


def synthetic_bands(s: int) -> np.ndarray:
    """Sample ``s``'s 4-band uint16 image (the UINT16 folders): values above 255 in every band."""
    h, w = SOURCE_SIZES[s]
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(4099 * y + 1031 * x + 9973 * c + 577 * s + 300) % 65536 for c in range(4)],
                    axis=-1).astype(np.uint16)


def colour_mask(ids: np.ndarray) -> np.ndarray:
    lut = np.zeros((256, 3), dtype=np.uint8)
    for i, (_, rgb) in enumerate(CLASSES):
        lut[i] = rgb
    lut[IGNORE] = UNKNOWN_COLOUR
    return lut[ids]


def png_rgb(image: np.ndarray) -> bytes:
    """A minimal 8-bit RGB PNG (filter 0 on every row, zlib level 9): stable bytes everywhere."""
    h, w, _ = image.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\0" + image[r].tobytes() for r in range(h))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def write_source(root: Path, bands: bool = False) -> None:
    """The raw dataset in the ``class_dict`` layout: train/s<i>.png + train_labels/s<i>_L.png (``bands``:
    train/s<i>.npy, 4-band uint16 images saved by numpy, whose bytes are as stable as the PNGs')."""
    (root / SPLIT).mkdir(parents=True)
    (root / f"{SPLIT}_labels").mkdir()
    lines = ["name,r,g,b"] + [f"{n},{r},{g},{b}" for n, (r, g, b) in CLASSES]
    files = [root / "class_dict.csv"]
    files[0].write_text("\n".join(lines) + "\n", encoding="utf-8")
    for s in range(len(SOURCE_SIZES)):
        image, ids = synthetic_sample(s)
        img_file = (root / SPLIT / f"s{s}.npy", npy_bytes(synthetic_bands(s))) if bands else \
            (root / SPLIT / f"s{s}.png", png_rgb(image))
        for path, data in (img_file,
                           (root / f"{SPLIT}_labels" / f"s{s}_L.png", png_rgb(colour_mask(ids)))):
            path.write_bytes(data)
            files.append(path)
    for path in files:
        os.utime(path, ns=(MTIME_NS, MTIME_NS))


def npy_bytes(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr.astype("<u2"), version=(1, 0), allow_pickle=False)
    return buf.getvalue()


# --------------------------------------------------------------------------- expected values


def crop_or_pad(arr: np.ndarray, size: tuple[int, int], fill: int) -> np.ndarray:
    """Centre crop or pad each axis independently (crop start (h-H)//2; pad (H-h)//2 before)."""
    th, tw = size
    out = np.full((th, tw, *arr.shape[2:]), fill, dtype=arr.dtype)
    h, w = arr.shape[:2]
    sy, dy = max((h - th) // 2, 0), max((th - h) // 2, 0)
    sx, dx = max((w - tw) // 2, 0), max((tw - w) // 2, 0)
    ch, cw = min(h, th), min(w, tw)
    out[dy : dy + ch, dx : dx + cw] = arr[sy : sy + ch, sx : sx + cw]
    return out


def encode(ids: np.ndarray, encoding: str) -> np.ndarray:
    """Stored label from class ids: ids as they are, one-hot uint8, or one-hot packed big-endian."""
    if encoding == "index":
        return ids
    onehot = (ids[..., None] == np.arange(len(CLASSES))).astype(np.uint8)  # ignore → all zero
    return onehot if encoding == "onehot" else np.packbits(onehot, axis=-1, bitorder="big")


def expected() -> dict[str, Any]:
    datasets: dict[str, Any] = {}
    for folder, (fmt, encoding, size, image_codec, label_codec) in VARIANTS.items():
        samples = []
        for s in range(len(SOURCE_SIZES)):
            image, ids = synthetic_sample(s)
            if folder in UINT16:
                image = synthetic_bands(s)
            if size is not None:
                image, ids = crop_or_pad(image, size, 0), crop_or_pad(ids, size, IGNORE)
            samples.append({
                "key": f"{SPLIT}/s{s}.npy" if folder in UINT16 else f"{SPLIT}/s{s}.png",
                "height": int(ids.shape[0]),
                "width": int(ids.shape[1]),
                "image": image.tolist(),
                "label_ids": ids.tolist(),
                "label": encode(ids, encoding).tolist(),
            })
        datasets[folder] = {
            "split": SPLIT,
            "format": fmt,
            "label_encoding": encoding,
            "size": list(size) if size else None,
            "samples": samples,
        }
        if (image_codec, label_codec) != ("raw", "raw"):  # version 1 folders keep their entry unchanged
            datasets[folder]["codecs"] = {"image": image_codec, "label": label_codec}
        if folder.startswith(MANIFEST2_PREFIX):
            datasets[folder]["manifest_version"] = 2
        if folder.startswith(MANIFEST3_PREFIX):
            datasets[folder]["manifest_version"] = 3
        if folder in UINT16:
            datasets[folder]["manifest_version"] = 4
            datasets[folder]["image_dtype"] = "<u2"
        if folder in WITH_PIXELS:  # samples.md "pixels": SHA-256 of "HxWxC:<dtype>\n" + the stored pixels, 16 bytes
            for sample in samples:
                image = np.array(sample["image"], "<u2" if folder in UINT16 else np.uint8)
                head = f"{image.shape[0]}x{image.shape[1]}x{image.shape[2]}:{image.dtype.str}\n".encode()
                sample["pixels"] = hashlib.sha256(head + image.tobytes()).hexdigest()[:32]
    return {
        "about": "Expected contents of the golden datasets, computed by scripts/make_golden.py from its "
                 "synthetic source, not read back through shardkit. image: (H, W, 3) RGB uint8 (the manifest4-*-uint16 "
                 "folders: (H, W, 4) uint16, image_dtype); label_ids: "
                 "(H, W) class ids (255 = ignore); label: the stored label in the folder's encoding.",
        "num_classes": len(CLASSES),
        "ignore_index": IGNORE,
        "class_names": [n for n, _ in CLASSES],
        "datasets": datasets,
    }


# --------------------------------------------------------------------------- conversion


def make_golden(out: Path) -> Path:
    """Write ``out/<variant>/train/…`` for every variant plus ``out/expected.json``; returns ``out``.

    Only the dataset is kept: ``manifest.json`` (and, in version 3, the kept ``manifest-v1.json``) and the
    shard files it names. shardkit's
    bookkeeping for resumed and incremental runs (hidden files such as ``.fingerprints.json``,
    ``.shard-*.json`` and the output folder's ``.shardkit.lock``) is not part of the format.
    """
    from dataclasses import replace

    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert
    from shardkit.store.manifest import inline_manifest, load_manifest
    from shardkit.store.publish import dump_manifest

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shardkit-golden-") as tmp:
        source = Path(tmp) / "synthetic"
        write_source(source)
        bands_source = Path(tmp) / "synthetic-bands"
        write_source(bands_source, bands=True)
        for folder, (fmt, encoding, size, image_codec, label_codec) in VARIANTS.items():
            converted = Path(tmp) / "out" / folder
            convert(ConvertConfig(
                input=bands_source if folder in UINT16 else source, output=converted, format=fmt, size=size,
                label_encoding=encoding,
                ignore_index=IGNORE, unknown_as=IGNORE, shard_size=ShardSize(samples=SHARD_SIZE),
                workers=1, quiet=True, image_codec=image_codec, label_codec=label_codec,
            ))
            if folder not in WITH_PIXELS:
                drop_pixel_hashes(converted / SPLIT)
            target = out / folder
            if target.exists():
                shutil.rmtree(target)
            (target / SPLIT).mkdir(parents=True)
            written = load_manifest(converted / SPLIT)
            if folder.startswith(MANIFEST2_PREFIX):
                dump_manifest(replace(written, manifest_version=2, version=None), converted / SPLIT)
            elif not folder.startswith((MANIFEST3_PREFIX, MANIFEST4_PREFIX)):
                dump_manifest(inline_manifest(replace(written, version=None)), converted / SPLIT)
            manifest = json.loads((converted / SPLIT / "manifest.json").read_text(encoding="utf-8"))
            check_coverage(folder, manifest)
            kept = ["manifest-v1.json"] if folder.startswith((MANIFEST3_PREFIX, MANIFEST4_PREFIX)) else []
            names = ["manifest.json", *kept] + [f["name"] for s in manifest["shards"]
                                         for f in [*s["files"], *([s["samples"]] if "samples" in s else [])]]
            for name in names:
                shutil.copyfile(converted / SPLIT / name, target / SPLIT / name)
    text = json.dumps(expected(), indent=None, separators=(",", ":"), sort_keys=True)
    (out / "expected.json").write_text(text + "\n", encoding="utf-8")
    return out


def drop_pixel_hashes(split: Path) -> None:
    """Rewrite the split's sidecars without the ``pixels`` and ``looks`` columns, as shardkit wrote them before
    them, and the manifest's sizes and hashes of them."""
    import io
    from dataclasses import replace

    from numpy.lib import recfunctions

    from shardkit.files.splitfiles import ShardFile
    from shardkit.store.manifest import load_manifest
    from shardkit.store.publish import dump_manifest

    m = load_manifest(split)
    shards = []
    for shard in m.shards:
        if shard.samples is None:
            raise SystemExit(f"{split}: shard {shard.index} has no samples sidecar")
        rows = np.load(split / shard.samples.name, allow_pickle=False)
        kept = recfunctions.repack_fields(rows[[n for n in rows.dtype.names if n not in ("pixels", "looks")]])
        buf = io.BytesIO()
        np.lib.format.write_array(buf, kept, version=(1, 0), allow_pickle=False)
        data = buf.getvalue()
        (split / shard.samples.name).write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        shards.append(replace(shard, samples=ShardFile(shard.samples.name, len(data), digest)))
    dump_manifest(replace(m, shards=tuple(shards), samples=type(m.samples)(tuple(shards), m.samples.num_classes,
                                                                         split, None, m.samples.size)), split)


def check_coverage(folder: str, manifest: dict[str, Any]) -> None:
    """The golden must exercise global indexing over several shards and offsets inside one shard."""
    counts = [s["num_samples"] for s in manifest["shards"]]
    if len(counts) < 2 or max(counts) < 2:
        raise SystemExit(f"{folder}: shards of {counts} samples no longer cover several shards with several "
                         "samples; adjust SHARD_SIZE or the sample names in scripts/make_golden.py")


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else GOLDEN
    make_golden(out)
    for p in sorted(out.rglob("*")):
        if p.is_file():
            print(f"{p.stat().st_size:8d}  {p.relative_to(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
