"""A reader written from ``formats/*.md`` alone reads shardkit's output bit-exactly.

Nothing here imports shardkit: the reader below uses only json, hashlib, numpy, py-lmdb,
h5py + hdf5plugin, and for format version 2 the codec libraries ``formats/codecs.md`` names
(zstandard, lz4, Pillow), and follows the MUST rules of ``formats/manifest.md``,
``formats/npy.md``, ``formats/lmdb.md``, ``formats/hdf5.md``, ``formats/codecs.md`` and
``formats/samples.md`` (the per-shard sample records of manifest version 2). It reads
the golden examples in ``formats/golden/`` (compared with ``expected.json``, which
``scripts/make_golden.py`` computes without shardkit), refuses tampered copies, and reads a real
CamVid conversion made with the ``shardkit`` command.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "formats" / "golden"
VARIANTS = ("npy-fixed", "npy-variable", "lmdb", "lmdb-zstd", "lmdb-png", "hdf5-zstd",
            "manifest2-npy-fixed", "manifest2-npy-variable", "manifest2-lmdb-zstd", "manifest3-npy-fixed",
            "manifest4-npy-fixed-uint16", "manifest4-lmdb-zstd-uint16")
CODEC_VARIANTS = ("lmdb-zstd", "lmdb-png", "hdf5-zstd")

# --------------------------------------------------------------------------- the spec-only reader

SCHEMA_ID = "shardkit.manifest"
KNOWN_MANIFEST_VERSIONS = {1, 2, 3, 4}
MAX_PATH_BYTES = 4096  # samples.md: longest key / label path
KNOWN_FORMAT_VERSIONS = {"npy": {1, 3}, "lmdb": {1, 2, 3}, "hdf5": {1, 2, 3}}
IMAGE_DTYPES = {"|u1", "<u2", "<i2", "<f4"}  # manifest.md "sample.image" (version 4)
CODEC_PARAMS = {"raw": set(), "zstd": {"level"}, "lz4": set(), "png": set(), "jpeg": {"quality"}}
LOSSLESS = {"raw", "zstd", "lz4", "png"}
PLAIN_NAME = re.compile(r"^[^\x00-\x1f./\\:][^\x00-\x1f/\\:]*$")  # manifest.md "File names"
LMDB_HEADER = np.dtype(
    [("height", "<u4"), ("width", "<u4"), ("image_nbytes", "<u4"), ("label_nbytes", "<u4")]
)
LMDB_META_KEY = b"__shardkit__"
JPEG_BAND_GROUPS = {2: (1, 1), 4: (3, 1)}  # codecs.md: the bands of each stream of a jpeg band frame


class SpecError(Exception):
    """The data breaks a MUST of the spec: the reader refuses it."""


def need(ok: Any, what: str) -> None:
    if not ok:
        raise SpecError(what)


def load_manifest(folder: Path) -> dict[str, Any]:
    """manifest.md, "Reader obligations" 1-5."""
    m = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    need(isinstance(m, dict) and m.get("schema") == SCHEMA_ID, "not a shardkit manifest")
    version, fmt = m.get("manifest_version"), m.get("format")
    need(version in KNOWN_MANIFEST_VERSIONS, f"unknown manifest_version {version!r}")
    need(fmt in KNOWN_FORMAT_VERSIONS, f"unknown format {fmt!r}")
    fmt_version = m.get("format_version")
    need(fmt_version in KNOWN_FORMAT_VERSIONS[fmt], f"unknown format_version {fmt_version!r}")
    expected_first = 0
    for shard in m["shards"]:
        need(shard["first_index"] == expected_first, f"shard {shard['index']} is not contiguous")
        expected_first += shard["num_samples"]
        for f in files_of(shard):
            name = f["name"]
            need(isinstance(name, str) and PLAIN_NAME.match(name), f"unsafe file name {name!r}")
        need(("samples" in shard) == (version >= 2), "a shard's samples sidecar disagrees with manifest_version")
    need(("samples" in m) == (version == 1), "inline samples disagree with manifest_version")
    if version >= 3:  # manifest.md "Versions": the split's publish number
        number = m.get("version")
        need(isinstance(number, int) and not isinstance(number, bool) and number >= 1,
             f"publish number (version) {number!r} is not an integer >= 1")
    else:
        need("version" not in m, "a publish number (version) in a manifest_version 1 or 2 manifest")
    inline = len(m["samples"]) if version == 1 else expected_first
    need(expected_first == m["num_samples"] == inline, "sample counts disagree")
    lab = m["sample"]["label"]
    classes = m["classes"]
    need(lab["num_classes"] == classes["num_classes"] == len(classes["classes"]), "class counts disagree")
    need(all(c["id"] == i for i, c in enumerate(m["classes"]["classes"])), "class ids are not 0..C-1")
    need(m["sample"]["image"]["shape"][:2] == lab["shape"][:2], "image and label extents disagree")
    need(tuple(lab["shape"][2:]) == label_tail(m), "label shape disagrees with its encoding")
    image = m["sample"]["image"]
    legacy = (image["dtype"], image["shape"][2], image["channels"]) == ("|u1", 3, "RGB")
    need(legacy or (version >= 4 and fmt_version == 3), "a non-RGB-uint8 image before manifest 4 / format 3")
    need(image["dtype"] in IMAGE_DTYPES and isinstance(image["shape"][2], int) and image["shape"][2] >= 1,
         f"image dtype {image['dtype']!r} / channels {image['shape'][2]!r} not allowed")
    if fmt_version >= 2:  # codecs.md "In the manifest"
        codecs = m["format_options"].get("codecs")
        need(isinstance(codecs, dict), "format version 2 or 3 without format_options.codecs")
        for kind in ("image", "label"):
            c = codecs.get(kind)
            need(isinstance(c, dict) and c.get("name") in CODEC_PARAMS, f"unknown {kind} codec {c!r}")
            need(set(c) - {"name"} <= CODEC_PARAMS[c["name"]], f"{kind} codec {c!r} has unknown parameters")
        need(codecs["label"]["name"] in LOSSLESS - {"png"}, "labels must use a lossless codec")
    return m


def files_of(shard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every file a shard entry names: the format's files, then (manifest version 2) its samples sidecar."""
    return [*shard["files"], *([shard["samples"]] if "samples" in shard else [])]


def sidecar_dtype(m: dict[str, Any], key_bytes: int, label_bytes: int, pixels: bool, looks: bool) -> np.dtype:
    """samples.md "Layout": the packed row of a sidecar (``pixels`` / ``looks``: with the pixel hash / look hash
    column, which sidecars written before it lack; ``tile`` exactly in tiled splits, samples.md "Tiles")."""
    c = m["sample"]["label"]["num_classes"]
    fields: list[tuple[Any, ...]] = [("height", "<u4"), ("width", "<u4"), ("fingerprint", "u1", (32,))]
    if pixels:
        fields.append(("pixels", "u1", (16,)))
    if looks:
        fields.append(("looks", "u1", (8,)))
    if c <= 256:
        fields.append(("classes", "u1", ((c + 7) // 8,)))
    if "tile" in m["preprocessing"]:
        fields.append(("tile", "<u4", (6,)))
    return np.dtype([*fields, ("key", f"S{key_bytes}"), ("label", f"S{label_bytes}")])


def sample_records(folder: Path, m: dict[str, Any], *, verify: bool = True) -> list[dict[str, Any]]:
    """Every sample record in global index order: inline (version 1) or from the sidecars (samples.md)."""
    if m["manifest_version"] == 1:
        return list(m["samples"])
    c = m["sample"]["label"]["num_classes"]
    out = []
    for shard in m["shards"]:
        path = check_file(folder, shard["samples"], verify=verify)
        rows = np.load(path, mmap_mode="r", allow_pickle=False)
        need(rows.shape == (shard["num_samples"],), "sidecar row count disagrees with num_samples")
        widths = [rows.dtype.fields[k][0].itemsize if rows.dtype.fields and k in rows.dtype.fields else 0
                  for k in ("key", "label")]
        names = rows.dtype.names or ()
        want = sidecar_dtype(m, *widths, pixels="pixels" in names, looks="looks" in names)
        need(all(1 <= w <= MAX_PATH_BYTES for w in widths) and rows.dtype == want and rows.dtype.names == want.names,
             f"sidecar dtype {rows.dtype} is not the spec's")
        for row in rows:
            rec = {"key": row["key"].decode("utf-8"), "label": row["label"].decode("utf-8") or None,
                   "height": int(row["height"]), "width": int(row["width"]),
                   "fingerprint": bytes(row["fingerprint"]).hex()}
            if "pixels" in (rows.dtype.names or ()):
                rec["pixels"] = bytes(row["pixels"]).hex()
            if "looks" in (rows.dtype.names or ()):
                rec["looks"] = bytes(row["looks"]).hex()
            if c <= 256:
                rec["classes"] = np.flatnonzero(np.unpackbits(row["classes"], count=c, bitorder="big")).tolist()
            if "tile" in m["preprocessing"]:  # samples.md "Tiles": the region lies in the sample and the source
                y, x, h, w, sh, sw = (int(v) for v in row["tile"])
                need(1 <= h <= rec["height"] and 1 <= w <= rec["width"] and y + h <= sh and x + w <= sw,
                     f"{rec['key']}: tile region outside its sample or source")
                rec["tile"] = {"y": y, "x": x, "height": h, "width": w, "source_height": sh, "source_width": sw}
            out.append(rec)
    return out


def source_fingerprint(records: list[dict[str, Any]], m: dict[str, Any]) -> str:
    """manifest.md "source": version 1 hashes the joined hex fingerprints; version 2 the per-shard digests."""
    if m["manifest_version"] == 1:
        return hashlib.sha256("\n".join(r["fingerprint"] for r in records).encode()).hexdigest()
    h, k = hashlib.sha256(), 0
    for shard in m["shards"]:
        part = records[k : k + shard["num_samples"]]
        k += shard["num_samples"]
        h.update(hashlib.sha256(b"".join(bytes.fromhex(r["fingerprint"]) for r in part)).digest())
    return h.hexdigest()


def codecs_of(m: dict[str, Any]) -> dict[str, Any]:
    """The image and label codec of a split (raw for format version 1)."""
    return m["format_options"]["codecs"] if m["format_version"] >= 2 else {"image": {"name": "raw"},
                                                                            "label": {"name": "raw"}}


def decode(codec: dict[str, Any], data: bytes, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """codecs.md: the stored bytes of one array → the array; sizes known before decoding, never taken from data."""
    import io

    import lz4.frame
    import zstandard
    from PIL import Image

    n = int(np.prod(shape)) * dtype.itemsize
    name = codec["name"]
    if name == "raw":
        raw = bytes(data)
    elif name == "zstd":
        need(zstandard.frame_content_size(data) == n, f"zstd frame size is not {n}")
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=n)
    elif name == "lz4":
        need(lz4.frame.get_frame_info(data)["content_size"] == n, f"lz4 frame size is not {n}")
        d = lz4.frame.LZ4FrameDecompressor()
        raw = d.decompress(data, max_length=n)
        need(d.eof and not d.unused_data, "lz4 frame is not exactly one frame")
    elif name == "jpeg" and shape[2] in JPEG_BAND_GROUPS:  # codecs.md "The jpeg band frame"
        groups = JPEG_BAND_GROUPS[shape[2]]
        head = 8 + 4 * len(groups)
        need(len(data) >= head and bytes(data[:4]) == b"SKJP", "jpeg band frame has no SKJP magic")
        count, *lengths = struct.unpack_from(f"<{1 + len(groups)}I", data, 4)
        need(count == len(groups), f"jpeg band frame has {count} streams, expected {len(groups)}")
        need(min(lengths) >= 1 and head + sum(lengths) == len(data), "jpeg band frame lengths do not fill it")
        parts, start = [], head
        for length, bands in zip(lengths, groups, strict=True):  # each stream: a whole jpeg of its bands
            parts.append(decode(codec, data[start : start + length], (*shape[:2], bands), dtype))
            start += length
        return np.concatenate(parts, axis=-1)
    else:
        im = Image.open(io.BytesIO(data))  # parses the header only
        mode = {1: "L", 3: "RGB"}.get(shape[2])
        need(im.format == name.upper() and im.size == (shape[1], shape[0]) and im.mode == mode,
             f"{name} header disagrees: {im.format} {im.size} {im.mode}")
        arr = np.asarray(im, dtype=np.uint8)
        arr = arr[:, :, None] if arr.ndim == 2 else arr
        need(arr.shape == shape, f"{name} decodes to {arr.shape}")
        return arr
    need(len(raw) == n, f"{name} decodes to {len(raw)} bytes, expected {n}")
    return np.frombuffer(raw, dtype).reshape(shape)


def check_file(folder: Path, f: dict[str, Any], *, verify: bool) -> Path:
    """manifest.md "Integrity": size always, sha256 when verifying."""
    path = folder / f["name"]
    need(path.is_file(), f"{f['name']} is missing")
    need(path.stat().st_size == f["bytes"], f"{f['name']} has the wrong size")
    if verify:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        need(digest == f["sha256"], f"{f['name']} has the wrong sha256")
    return path


def per_pixel(m: dict[str, Any]) -> int:
    lab = m["sample"]["label"]
    c = lab["num_classes"]
    return {"index": 1, "onehot": c, "packed": (c + 7) // 8}[lab["encoding"]]


def label_tail(m: dict[str, Any]) -> tuple[int, ...]:
    return () if m["sample"]["label"]["encoding"] == "index" else (per_pixel(m),)


def image_of(m: dict[str, Any]) -> tuple[np.dtype, int]:
    """(element dtype, channels) of the split's images: manifest.md "sample.image"."""
    return np.dtype(m["sample"]["image"]["dtype"]), int(m["sample"]["image"]["shape"][2])


def fixed_size(m: dict[str, Any]) -> tuple[int, int] | None:
    h, w = m["sample"]["image"]["shape"][:2]
    return None if h is None else (h, w)


def read_npy_shard(folder: Path, m: dict[str, Any], shard: dict[str, Any], verify: bool) -> list:
    """npy.md."""
    size = fixed_size(m)
    need(len(shard["files"]) == (2 if size else 3), "wrong number of npy files")
    for f, prefix in zip(shard["files"], ("images-", "labels-", "shapes-"), strict=False):
        need(f["name"].startswith(prefix) and f["name"].endswith(".npy"), f"unexpected name {f['name']!r}")
    arrays = [np.load(check_file(folder, f, verify=verify), allow_pickle=False) for f in shard["files"]]
    n, tail = shard["num_samples"], label_tail(m)
    images, labels = arrays[0], arrays[1]
    idt, ch = image_of(m)
    need(images.dtype == idt, f"images are not {idt}")
    need(labels.dtype == np.dtype(m["sample"]["label"]["dtype"]), "labels have the wrong dtype")
    if size:
        need(images.shape == (n, *size, ch), "images have the wrong shape")
        need(labels.shape == (n, *size, *tail), "labels have the wrong shape")
        return [(images[j], labels[j]) for j in range(n)]
    shapes = arrays[2]
    need(shapes.dtype == np.dtype("<i8") and shapes.shape == (n, 2), "shapes array is malformed")
    need((shapes >= 1).all(), "a sample has no pixels")
    px = shapes[:, 0] * shapes[:, 1]
    img_off = np.concatenate([[0], np.cumsum(ch * px)])
    lab_off = np.concatenate([[0], np.cumsum(per_pixel(m) * px)])
    need(images.shape == (img_off[-1],) and labels.shape == (lab_off[-1],), "flat arrays: wrong length")
    return [
        (
            images[img_off[j] : img_off[j + 1]].reshape(h, w, ch),
            labels[lab_off[j] : lab_off[j + 1]].reshape(h, w, *tail),
        )
        for j, (h, w) in enumerate(shapes.tolist())
    ]


def read_lmdb_shard(folder: Path, m: dict[str, Any], shard: dict[str, Any], verify: bool) -> list:
    """lmdb.md."""
    need(len(shard["files"]) == 1, "an lmdb shard has exactly one file")
    path = check_file(folder, shard["files"][0], verify=verify)
    n, tail, size = shard["num_samples"], label_tail(m), fixed_size(m)
    dtype = np.dtype(m["sample"]["label"]["dtype"])
    out = []
    # py-lmdb refuses a second open of one file per process, and shardkit's reader (other tests, same
    # process) may hold it: this independent reader opens its own copy.
    private = Path(tempfile.mkdtemp()) / path.name
    shutil.copyfile(path, private)
    env = lmdb.open(str(private), subdir=False, readonly=True, lock=False, readahead=False)
    try:
        need(env.stat()["entries"] == n + 1, "wrong number of LMDB entries")
        with env.begin() as txn:
            raw = txn.get(LMDB_META_KEY)
            need(raw is not None, "no __shardkit__ record")
            meta = json.loads(raw.decode("utf-8"))
            need(meta.get("format") == "shardkit-lmdb", "not a shardkit LMDB shard")
            need(meta.get("format_version") == m["format_version"], "LMDB format_version disagrees")
            need(meta.get("num_samples") == n, "LMDB num_samples disagrees")
            if m["format_version"] >= 2:
                need(meta.get("codecs") == m["format_options"]["codecs"], "LMDB codecs disagree")
            idt, ch = image_of(m)
            for j in range(n):
                value = txn.get(b"%08d" % j)
                need(value is not None and len(value) >= LMDB_HEADER.itemsize, f"record {j} missing or short")
                h, w, ni, nl = (int(v) for v in np.frombuffer(value, LMDB_HEADER, count=1)[0])
                need(h >= 1 and w >= 1 and len(value) == 16 + ni + nl, f"record {j} has the wrong length")
                need(size is None or (h, w) == size, f"record {j} is not the fixed size")
                if m["format_version"] == 1:
                    want_nl = h * w * per_pixel(m) * dtype.itemsize
                    need(ni == h * w * 3 and nl == want_nl, f"record {j} sizes disagree")
                codecs = codecs_of(m)
                image = decode(codecs["image"], value[16 : 16 + ni], (h, w, ch), idt)
                label = decode(codecs["label"], value[16 + ni :], (h, w, *tail), dtype)
                out.append((image, label))
    finally:
        env.close()
    return out


def read_hdf5_shard(folder: Path, m: dict[str, Any], shard: dict[str, Any], verify: bool) -> list:
    """hdf5.md: plain h5py; format version 2 chunks go through hdf5plugin's registered filters."""
    import h5py
    import hdf5plugin  # noqa: F401 - registers the Zstd (32015) and LZ4 (32004) filters with HDF5

    need(len(shard["files"]) == 1, "an hdf5 shard has exactly one file")
    path = check_file(folder, shard["files"][0], verify=verify)
    n, tail, size = shard["num_samples"], label_tail(m), fixed_size(m)
    dtype = np.dtype(m["sample"]["label"]["dtype"])
    with h5py.File(path, "r") as f:
        need(f.attrs["format"] == "shardkit-hdf5", "not a shardkit HDF5 shard")
        need(f.attrs["format_version"] == m["format_version"], "HDF5 format_version disagrees")
        need(f.attrs["num_samples"] == n, "HDF5 num_samples disagrees")
        images, labels = f["images"], f["labels"]
        idt, ch = image_of(m)
        need(images.dtype == idt and labels.dtype == dtype, "HDF5 dtypes disagree")
        if m["format_version"] >= 2:
            want = {"zstd": 32015, "lz4": 32004}
            for ds, kind in ((images, "image"), (labels, "label")):
                name = codecs_of(m)[kind]["name"]
                plist = ds.id.get_create_plist()
                ids = [plist.get_filter(k)[0] for k in range(plist.get_nfilters())]
                need(ids == ([want[name]] if name in want else []), f"{kind} filters {ids} disagree with {name}")
        need(size is not None, "this reader covers the fixed-size HDF5 layout")
        need(images.shape == (n, *size, ch) and labels.shape == (n, *size, *tail), "HDF5 shapes disagree")
        return [(images[j], labels[j]) for j in range(n)]


READERS = {"npy": read_npy_shard, "lmdb": read_lmdb_shard, "hdf5": read_hdf5_shard}


def read_split(folder: Path, *, verify: bool = True) -> tuple[dict[str, Any], list]:
    """Every sample of a split folder in global index order: (image, stored label)."""
    folder = Path(folder)
    m = load_manifest(folder)
    samples: list = []
    for shard in m["shards"]:
        samples += READERS[m["format"]](folder, m, shard, verify)
    records = sample_records(folder, m, verify=verify)
    for record, (image, _) in zip(records, samples, strict=True):
        need(image.shape[:2] == (record["height"], record["width"]), f"{record['key']}: size disagrees")
        if "pixels" in record and codecs_of(m)["image"]["name"] in LOSSLESS:  # samples.md "pixels" (pre-codec)
            head = f"{image.shape[0]}x{image.shape[1]}x{image.shape[2]}:{image.dtype.str}\n".encode()
            need(hashlib.sha256(head + np.ascontiguousarray(image).tobytes()).hexdigest()[:32] == record["pixels"],
                 f"{record['key']}: pixel hash disagrees with the stored image")
        if "looks" in record and codecs_of(m)["image"]["name"] in LOSSLESS:
            need(look_hash(image) == record["looks"], f"{record['key']}: look hash disagrees with the stored image")
    need(source_fingerprint(records, m) == m["source"]["fingerprint"], "source fingerprint disagrees")
    m["records"] = records  # for the tests below: what this reader found
    return m, samples


def look_hash(image: np.ndarray) -> str:
    """samples.md "looks", as written there: the bands summed into one plane; 8 x 9 blocks starting at
    floor(k·H/8) rows and floor(k·W/9) columns (a block whose start equals the next one's is the one row or column
    at its start); bit (r, c) = mean of block (r, c) < mean of block (r, c+1), row by row, most significant first."""
    h, w = image.shape[:2]
    plane = image.reshape(h, w, -1).astype(np.float64 if image.dtype.kind == "f" else object).sum(axis=2)
    rows = [k * h // 8 for k in range(8)] + [h]
    cols = [k * w // 9 for k in range(9)] + [w]
    means = [[0] * 9 for _ in range(8)]
    for r in range(8):
        r0, r1 = rows[r], max(rows[r + 1], rows[r] + 1)
        for c in range(9):
            c0, c1 = cols[c], max(cols[c + 1], cols[c] + 1)
            block = plane[r0:r1, c0:c1]
            total = block.sum() if image.dtype.kind == "f" else sum(int(v) for v in block.reshape(-1))
            means[r][c] = (total, block.size)
    bits = []
    for r in range(8):
        for c in range(8):
            (s0, n0), (s1, n1) = means[r][c], means[r][c + 1]
            bits.append(s0 / n0 < s1 / n1 if image.dtype.kind == "f" else s0 * n1 < s1 * n0)
    return np.packbits(np.array(bits, bool)).tobytes().hex()


def label_ids(stored: np.ndarray, m: dict[str, Any]) -> np.ndarray:
    """manifest.md "Label encodings": stored label → class ids."""
    lab = m["sample"]["label"]
    c, ignore = lab["num_classes"], m["classes"]["ignore_index"]
    if lab["encoding"] == "index":
        return stored
    onehot = np.unpackbits(stored, axis=-1, count=c, bitorder="big") if lab["encoding"] == "packed" else stored
    need(onehot.shape[-1] == c and onehot.max(initial=0) <= 1, "one-hot is malformed")
    hot = onehot.sum(axis=-1)
    need((hot <= 1).all(), "a pixel has more than one class")
    need(ignore is not None or (hot == 1).all(), "a pixel has no class and there is no ignore index")
    ids = np.where(hot == 1, onehot.argmax(axis=-1), ignore if ignore is not None else 0)
    return ids.astype(lab["class_id_dtype"])


# --------------------------------------------------------------------------- golden examples


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    return json.loads((GOLDEN / "expected.json").read_text(encoding="utf-8"))


def split_dir(variant: str, exp: dict[str, Any]) -> Path:
    return GOLDEN / variant / exp["datasets"][variant]["split"]


def test_golden_folders_are_small() -> None:
    for variant in VARIANTS:
        total = sum(p.stat().st_size for p in (GOLDEN / variant).rglob("*") if p.is_file())
        assert total <= 57_000, f"{variant} holds {total} bytes"  # two LMDB shards + manifest and its kept copy


@pytest.mark.parametrize("variant", VARIANTS)
def test_golden_manifest_validates(variant: str, expected: dict[str, Any], validate_manifest) -> None:
    m = validate_manifest(split_dir(variant, expected))
    exp = expected["datasets"][variant]
    assert m["format"] == exp["format"] and m["sample"]["label"]["encoding"] == exp["label_encoding"]
    assert m["preprocessing"]["size"] == exp["size"]
    if "image_dtype" in exp:  # version 4 / format version 3: images keep their type and bands, codecs named
        assert m["format_version"] == 3 and m["sample"]["image"]["dtype"] == exp["image_dtype"]
        assert m["sample"]["image"]["channels"] == "bands" and m["sample"]["image"]["shape"][2] == 4
        assert {k: v["name"] for k, v in m["format_options"]["codecs"].items()} == exp.get(
            "codecs", {"image": "raw", "label": "raw"})
        assert len(m["stats"]["image_mean"]) == len(m["stats"]["image_std"]) == 4
    elif "codecs" in exp:
        assert m["format_version"] == 2
        assert {k: v["name"] for k, v in m["format_options"]["codecs"].items()} == exp["codecs"]
    else:
        assert m["format_version"] == 1 and "codecs" not in m["format_options"]
    counts = [s["num_samples"] for s in m["shards"]]
    assert len(counts) >= 2 and max(counts) >= 2, "golden covers several shards with several samples"
    assert m["classes"]["ignore_index"] == expected["ignore_index"]
    assert [c["name"] for c in m["classes"]["classes"]] == expected["class_names"]
    assert m["manifest_version"] == exp.get("manifest_version", 1)
    records = sample_records(split_dir(variant, expected), m)
    assert [(s["key"], s["height"], s["width"]) for s in records] == [
        (s["key"], s["height"], s["width"]) for s in exp["samples"]
    ]


@pytest.mark.parametrize("variant", VARIANTS)
def test_golden_sizes_and_hashes(variant: str, expected: dict[str, Any]) -> None:
    folder = split_dir(variant, expected)
    m = load_manifest(folder)
    named = set()
    for shard in m["shards"]:
        for f in files_of(shard):
            data = (folder / f["name"]).read_bytes()
            assert len(data) == f["bytes"]
            assert hashlib.sha256(data).hexdigest() == f["sha256"]
            named.add(f["name"])
    kept = {f"manifest-v{m['version']}.json"} if m["manifest_version"] >= 3 else set()  # "Versions"
    assert {p.name for p in folder.iterdir() if not p.name.startswith(".")} == named | {"manifest.json"} | kept


@pytest.mark.parametrize("variant", VARIANTS)
def test_golden_reads_bit_exactly(variant: str, expected: dict[str, Any]) -> None:
    m, samples = read_split(split_dir(variant, expected))
    exp = expected["datasets"][variant]["samples"]
    assert len(samples) == len(exp) == m["num_samples"]
    stored_dtype = np.dtype(m["sample"]["label"]["dtype"])
    image_dtype = np.dtype(expected["datasets"][variant].get("image_dtype", "|u1"))
    for (image, label), e in zip(samples, exp, strict=True):
        assert image.dtype == image_dtype, e["key"]
        assert np.array_equal(image, np.array(e["image"], dtype=image_dtype)), e["key"]
        assert label.dtype == stored_dtype
        assert np.array_equal(label, np.array(e["label"], dtype=stored_dtype)), e["key"]
        ids = label_ids(label, m)
        assert np.array_equal(ids, np.array(e["label_ids"])), e["key"]
        assert (ids == expected["ignore_index"]).any(), "every golden sample keeps an ignore pixel"


def test_golden_packed_unpacks_with_count(expected: dict[str, Any]) -> None:
    """npy.md: np.unpackbits(..., axis=-1, count=C) of a packed label is the one-hot array."""
    m, samples = read_split(split_dir("npy-variable", expected))
    c = m["sample"]["label"]["num_classes"]
    for (_, packed), e in zip(samples, expected["datasets"]["npy-variable"]["samples"], strict=True):
        onehot = np.unpackbits(packed, axis=-1, count=c)  # numpy's default bit order is big
        ids = np.array(e["label_ids"])
        assert np.array_equal(onehot, (ids[..., None] == np.arange(c)).astype(np.uint8))
        assert not np.unpackbits(packed, axis=-1)[..., c:].any(), "padding bits are zero"


# --------------------------------------------------------------------------- the reader refuses bad data


def tampered(tmp_path: Path, variant: str, expected: dict[str, Any]) -> Path:
    folder = tmp_path / variant
    shutil.copytree(split_dir(variant, expected), folder)
    return folder


def edit_manifest(folder: Path, change) -> None:
    path = folder / "manifest.json"
    m = json.loads(path.read_text(encoding="utf-8"))
    change(m)
    path.write_text(json.dumps(m), encoding="utf-8")


def rehash(folder: Path) -> None:
    """Make the manifest's sizes and hashes match the (tampered) files, to reach deeper checks."""

    def fix(m: dict[str, Any]) -> None:
        for shard in m["shards"]:
            for f in files_of(shard):
                data = (folder / f["name"]).read_bytes()
                f["bytes"], f["sha256"] = len(data), hashlib.sha256(data).hexdigest()

    edit_manifest(folder, fix)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.__setitem__("manifest_version", 4), "manifest_version"),
        (lambda m: m.__setitem__("version", 2), "publish number"),
        (lambda m: m.__setitem__("manifest_version", 2), "manifest_version"),
        (lambda m: m.__setitem__("format_version", 2), "format_version"),
        (lambda m: m.__setitem__("schema", "other"), "not a shardkit manifest"),
        (lambda m: m["shards"][0]["files"][0].__setitem__("name", "../manifest.json"), "unsafe"),
        (lambda m: m["shards"][0]["files"][0].__setitem__("name", "/etc/passwd"), "unsafe"),
        (lambda m: m["shards"][1].__setitem__("first_index", 1), "contiguous"),
        (lambda m: m["samples"].pop(), "counts"),
    ],
)
def test_reader_refuses_bad_manifests(tmp_path: Path, expected: dict[str, Any], change, message: str,
                                      validate_manifest) -> None:
    folder = tampered(tmp_path, "npy-fixed", expected)
    edit_manifest(folder, change)
    with pytest.raises(SpecError, match=message):
        read_split(folder)
    if message in ("manifest_version", "unsafe", "not a shardkit manifest", "publish number"):
        import jsonschema

        with pytest.raises(jsonschema.ValidationError):
            validate_manifest(folder)


@pytest.mark.parametrize("variant", VARIANTS)
def test_reader_refuses_truncated_and_corrupt_files(tmp_path: Path, variant: str,
                                                     expected: dict[str, Any]) -> None:
    folder = tampered(tmp_path, variant, expected)
    m = load_manifest(folder)
    target = folder / m["shards"][0]["files"][0]["name"]
    data = bytearray(target.read_bytes())
    target.write_bytes(bytes(data[:-1]))
    with pytest.raises(SpecError, match="wrong size"):
        read_split(folder)
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(SpecError, match="sha256"):
        read_split(folder)


def test_reader_refuses_npy_with_wrong_dtype(tmp_path: Path, expected: dict[str, Any]) -> None:
    folder = tampered(tmp_path, "npy-fixed", expected)
    name = load_manifest(folder)["shards"][0]["files"][1]["name"]
    labels = np.load(folder / name, allow_pickle=False)
    np.save(folder / name, labels.astype(">u2"), allow_pickle=False)
    rehash(folder)
    with pytest.raises(SpecError, match="dtype"):
        read_split(folder)


def test_reader_refuses_npy_with_wrong_shapes(tmp_path: Path, expected: dict[str, Any]) -> None:
    folder = tampered(tmp_path, "npy-variable", expected)
    name = load_manifest(folder)["shards"][0]["files"][2]["name"]
    shapes = np.load(folder / name, allow_pickle=False)
    shapes[0] = (shapes[0][1] + 1, shapes[0][0])
    np.save(folder / name, shapes, allow_pickle=False)
    rehash(folder)
    with pytest.raises(SpecError, match="wrong length"):
        read_split(folder)


def put_lmdb(path: Path, key: bytes, value: bytes) -> None:
    env = lmdb.open(str(path), subdir=False, lock=False, map_size=1 << 24)
    try:
        with env.begin(write=True) as txn:
            txn.put(key, value)
    finally:
        env.close()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (LMDB_META_KEY, b'{"format": "shardkit-lmdb", "format_version": 2, "num_samples": 2}',
         "format_version"),
        (LMDB_META_KEY, b'{"format": "shardkit-lmdb", "format_version": 1, "num_samples": 3}',
         "num_samples"),
        (b"00000002", b"x", "entries"),
        (b"00000001", np.array([(7, 9, 189, 315)], LMDB_HEADER).tobytes() + bytes(100), "wrong length"),
        (b"00000001", np.array([(7, 9, 100, 404)], LMDB_HEADER).tobytes() + bytes(504), "sizes disagree"),
    ],
)
def test_reader_refuses_bad_lmdb_records(tmp_path: Path, expected: dict[str, Any], key: bytes, value: bytes,
                                         message: str) -> None:
    folder = tampered(tmp_path, "lmdb", expected)
    put_lmdb(folder / load_manifest(folder)["shards"][0]["files"][0]["name"], key, value)
    rehash(folder)
    with pytest.raises(SpecError, match=message):
        read_split(folder)


# --------------------------------------------------------------------------- real data


def shardkit_command() -> list[str]:
    script = Path(sys.executable).with_name("shardkit")
    found = str(script) if script.is_file() else shutil.which("shardkit")
    assert found, "the shardkit console script is not installed (pip install -e .)"
    return [found]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["npy", "lmdb"])
def test_camvid_conversion_reads_like_cv2_center_crop(tmp_path: Path, camvid_root: Path, fmt: str,
                                                      validate_manifest) -> None:
    import cv2

    out = tmp_path / "out"
    run = subprocess.run(
        [*shardkit_command(), "convert", str(camvid_root), str(out), "--format", fmt, "--size", "352x480",
         "--split", "val", "--workers", "2", "-q"],
        capture_output=True, text=True, check=False, timeout=240,
    )
    assert run.returncode == 0, run.stderr
    validate_manifest(out / "val")
    m, samples = read_split(out / "val")
    assert m["sample"]["image"]["shape"] == [352, 480, 3] and m["sample"]["label"]["encoding"] == "index"
    for i in (0, len(samples) - 1):
        record = m["records"][i]
        bgr = cv2.imread(str(camvid_root / record["key"]), cv2.IMREAD_UNCHANGED)
        ids = cv2.imread(str(camvid_root / record["label"]), cv2.IMREAD_UNCHANGED)
        assert bgr.shape == (360, 480, 3) and ids.shape == (360, 480)
        top = (360 - 352) // 2
        want_image = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)[top : top + 352]
        image, label = samples[i]
        assert np.array_equal(image, want_image), record["key"]
        assert np.array_equal(label, ids[top : top + 352]), record["label"]


@pytest.mark.parametrize("bands", [4, 2])
def test_jpeg_band_frames_read_within_jpeg_loss(tmp_path: Path, camvid_root: Path, bands: int,
                                                validate_manifest) -> None:
    """uint8 CamVid of 4 bands (R, G, B, gray) and 2 (R, gray), converted with jpeg:95 to LMDB, read by the
    spec-only reader (Pillow decodes each stream of the band frame): within JPEG loss, labels exact; a frame
    with a wrong stream count is refused."""
    import cv2

    from tests.camvid_bands import camvid_bands

    images = camvid_bands(camvid_root, tmp_path / "in", bands, 3)
    out = tmp_path / "out"
    run = subprocess.run([*shardkit_command(), "convert", str(tmp_path / "in"), str(out), "--format", "lmdb",
                          "--image-codec", "jpeg:95", "--split", "val", "--workers", "1", "-q"],
                         capture_output=True, text=True, check=False, timeout=240)
    assert run.returncode == 0, run.stderr
    validate_manifest(out / "val")
    m, samples = read_split(out / "val")
    assert m["format_version"] == 3 and m["sample"]["image"]["shape"][2] == bands
    for record, (image, label) in zip(m["records"], samples, strict=True):
        want = images[Path(record["key"]).stem]
        assert image.shape == want.shape and image.dtype == np.uint8
        mse = ((image.astype(np.float64) - want) ** 2).mean(axis=(0, 1))
        assert (10 * np.log10(255.0**2 / mse) >= 38).all(), record["key"]  # measured: 38.3 dB and more
        assert np.array_equal(label, cv2.imread(str(camvid_root / record["label"]), cv2.IMREAD_UNCHANGED))
    env = lmdb.open(str(out / "val" / m["shards"][0]["files"][0]["name"]), subdir=False, readonly=True,
                    lock=False)
    with env.begin() as txn:
        value = bytearray(txn.get(b"00000000"))
    env.close()
    value[20:24] = (3).to_bytes(4, "little")  # the frame's stream count (after the 16-byte record header, magic)
    put_lmdb(out / "val" / m["shards"][0]["files"][0]["name"], b"00000000", bytes(value))
    rehash(out / "val")
    with pytest.raises(SpecError, match="jpeg band frame has 3 streams"):
        read_split(out / "val")


# --------------------------------------------------------------------------- format version 2 (codecs.md)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m["format_options"].pop("codecs"), "without format_options.codecs"),
        (lambda m: m["format_options"]["codecs"].__setitem__("label", {"name": "jpeg", "quality": 90}), "lossless"),
        (lambda m: m["format_options"]["codecs"].__setitem__("image", {"name": "webp"}), "unknown image codec"),
        (lambda m: m["format_options"]["codecs"]["image"].__setitem__("dictionary", 1), "unknown parameters"),
    ],
)
def test_reader_refuses_bad_codec_manifests(tmp_path: Path, expected: dict[str, Any], change, message: str,
                                            validate_manifest) -> None:
    import jsonschema

    folder = tampered(tmp_path, "lmdb-zstd", expected)
    edit_manifest(folder, change)
    with pytest.raises(SpecError, match=message):
        read_split(folder)
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(folder)


def test_reader_refuses_a_frame_claiming_a_huge_size(tmp_path: Path, expected: dict[str, Any]) -> None:
    """codecs.md: the decoded size comes from the manifest and the header; a frame claiming more is refused."""
    import zstandard

    folder = tampered(tmp_path, "lmdb-zstd", expected)
    frame = b"\x28\xb5\x2f\xfd" + bytes([0xC0, 0x58]) + (1 << 40).to_bytes(8, "little") + b"\x01\x00\x00"
    assert zstandard.frame_content_size(frame) == 1 << 40
    label = zstandard.ZstdCompressor().compress(bytes(6 * 4))
    record = np.array([(4, 6, len(frame), len(label))], LMDB_HEADER).tobytes() + frame + label
    put_lmdb(folder / load_manifest(folder)["shards"][0]["files"][0]["name"], b"00000000", record)
    rehash(folder)
    with pytest.raises(SpecError, match="zstd frame size"):
        read_split(folder)


# --------------------------------------------------------------------------- manifest version 2 (samples.md)


def rewrite_sidecar(folder: Path, change) -> None:
    """Replace shard 0's sidecar rows with ``change(rows)`` and fix the manifest's sizes and hashes."""
    path = folder / load_manifest(folder)["shards"][0]["samples"]["name"]
    rows = np.load(path, allow_pickle=False)
    with open(path, "wb") as fh:
        np.save(fh, change(rows), allow_pickle=False)
    rehash(folder)


def other_fingerprint(rows: np.ndarray) -> np.ndarray:
    rows = rows.copy()
    rows["fingerprint"][0] ^= 1
    return rows


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda rows: rows[:-1], "row count"),
        (lambda rows: rows.astype([(n, "<u8" if n == "height" else rows.dtype.fields[n][0]) for n in rows.dtype.names]),
         "not the spec's"),
        (other_fingerprint, "source fingerprint"),
    ],
)
def test_reader_refuses_bad_sidecars(tmp_path: Path, expected: dict[str, Any], change, message: str) -> None:
    folder = tampered(tmp_path, "manifest2-npy-variable", expected)
    rewrite_sidecar(folder, change)
    with pytest.raises(SpecError, match=message):
        read_split(folder)


def test_pixel_hashes_follow_the_spec(expected: dict[str, Any]) -> None:
    """samples.md "pixels": the golden's hashes are the ones make_golden.py computes from its synthetic images
    (expected.json), and the reader above recomputes each from the stored image; the older goldens have none."""
    m, _ = read_split(split_dir("manifest3-npy-fixed", expected))
    assert [r["pixels"] for r in m["records"]] == [s["pixels"] for s in
                                                   expected["datasets"]["manifest3-npy-fixed"]["samples"]]
    assert all("pixels" not in r for r in read_split(split_dir("manifest2-npy-fixed", expected))[0]["records"])


def other_pixels(rows: np.ndarray) -> np.ndarray:
    rows = rows.copy()
    rows["pixels"][0] ^= 1
    return rows


def test_reader_refuses_a_wrong_pixel_hash(tmp_path: Path, expected: dict[str, Any]) -> None:
    folder = tampered(tmp_path, "manifest3-npy-fixed", expected)
    rewrite_sidecar(folder, other_pixels)
    with pytest.raises(SpecError, match="pixel hash disagrees"):
        read_split(folder)


def test_a_version_2_split_reads_with_numpy_and_json_only(expected: dict[str, Any]) -> None:
    """samples.md: np.load(mmap_mode="r", allow_pickle=False) of a sidecar gives every record; with the
    shard files, the split decodes without shardkit (the same arrays as its version 1 twin)."""
    m2, samples2 = read_split(split_dir("manifest2-npy-variable", expected))
    m1, samples1 = read_split(split_dir("npy-variable", expected))
    assert m2["manifest_version"] == 2 and "samples" not in m2 and m1["manifest_version"] == 1
    assert m2["records"] == m1["records"]  # the same records, inline or in sidecars
    for (i2, l2), (i1, l1) in zip(samples2, samples1, strict=True):
        assert np.array_equal(i2, i1) and np.array_equal(l2, l1)


def test_a_version_3_split_is_version_2_plus_its_publish_number(expected: dict[str, Any]) -> None:
    """manifest.md "Versions": ``manifest.json`` is a copy of the newest kept ``manifest-v<N>.json``; apart from
    ``version`` it is a version 2 manifest of the same data."""
    folder = split_dir("manifest3-npy-fixed", expected)
    m3, samples3 = read_split(folder)
    m2, samples2 = read_split(split_dir("manifest2-npy-fixed", expected))
    assert m3["manifest_version"] == 3 and m3["version"] == 1
    assert (folder / "manifest-v1.json").read_bytes() == (folder / "manifest.json").read_bytes()
    # the same records; version 3 as convert writes it today also has the sidecars' pixel hashes (samples.md)
    assert all(isinstance(r.pop("pixels"), str) and isinstance(r.pop("looks"), str) for r in m3["records"])
    assert m3["records"] == m2["records"]
    for (i3, l3), (i2, l2) in zip(samples3, samples2, strict=True):
        assert np.array_equal(i3, i2) and np.array_equal(l3, l2)


def test_a_version_3_manifest_without_its_publish_number_is_refused(tmp_path: Path, expected: dict[str, Any],
                                                                     validate_manifest) -> None:
    import jsonschema

    folder = tampered(tmp_path, "manifest3-npy-fixed", expected)
    edit_manifest(folder, lambda m: m.pop("version"))
    with pytest.raises(SpecError, match="publish number"):
        read_split(folder)
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(folder)
