"""The committed golden examples in ``formats/golden/`` are what the current code writes.

If this fails after an intended change to the on-disk layout, bump the format or
manifest version (formats/README.md "Versioning"), update the spec text, and run
``python scripts/make_golden.py``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
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


def load_script() -> Any:
    spec = importlib.util.spec_from_file_location("make_golden", ROOT / "scripts" / "make_golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return load_script().make_golden(tmp_path_factory.mktemp("golden"))


def comparable(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest without what legitimately differs between runs."""
    m = copy.deepcopy(manifest)
    del m["source"]["root"]
    del m["tool"]["version"]
    if m["format"] == "lmdb":  # LMDB files are not byte-reproducible (formats/lmdb.md "Reproducibility")
        for shard in m["shards"]:
            for f in shard["files"]:
                del f["sha256"]
    if m["format_version"] >= 2:  # codec output may change with the codec library's version (codecs.md)
        for shard in m["shards"]:
            for f in shard["files"]:
                f.pop("sha256", None)
                del f["bytes"]
    return m


def decoded(folder: Path) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Every sample of a split as shardkit decodes it: (key, image, stored label)."""
    import shardkit

    ds = shardkit.open(folder, labels="stored")
    return [(ds.key(i), *ds[i]) for i in range(len(ds))]


def lmdb_items(path: Path) -> list[tuple[bytes, bytes]]:
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    finally:
        env.close()


def test_expected_json_is_current(regenerated: Path) -> None:
    assert (regenerated / "expected.json").read_bytes() == (GOLDEN / "expected.json").read_bytes()


@pytest.mark.parametrize("variant", VARIANTS)
def test_golden_is_what_the_code_writes(regenerated: Path, variant: str) -> None:
    committed, fresh = (
        sorted(p.relative_to(base / variant) for p in (base / variant).rglob("*")
               if p.is_file() and not p.name.startswith("."))  # not a reader's lease (formats/manifest.md)
        for base in (GOLDEN, regenerated)
    )
    assert fresh == committed, "different files: regenerate with python scripts/make_golden.py"
    version = json.loads((GOLDEN / variant / "train" / "manifest.json").read_text(encoding="utf-8"))["format_version"]
    if version >= 2:  # compressed bytes: same decoded content (tests/test_formats_spec.py checks the values)
        old_samples, new_samples = decoded(GOLDEN / variant / "train"), decoded(regenerated / variant / "train")
        assert len(old_samples) == len(new_samples)
        for (k0, i0, l0), (k1, i1, l1) in zip(old_samples, new_samples, strict=True):
            assert k0 == k1 and np.array_equal(i0, i1) and np.array_equal(l0, l1) and l0.dtype == l1.dtype, k0
    for rel in committed:
        old, new = GOLDEN / variant / rel, regenerated / variant / rel
        if rel.name == "manifest.json" or rel.name.startswith("manifest-v"):
            a = json.loads(old.read_text(encoding="utf-8"))
            b = json.loads(new.read_text(encoding="utf-8"))
            assert comparable(b) == comparable(a), rel
        elif rel.suffix == ".npy":
            assert new.read_bytes() == old.read_bytes(), rel
        elif version >= 2:
            continue  # compared by decoded content above
        elif rel.suffix == ".lmdb":
            assert lmdb_items(new) == lmdb_items(old), rel
        else:  # pragma: no cover - a new kind of file needs a rule here
            pytest.fail(f"no comparison rule for {rel}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_shardkit_reader_agrees_with_expected(variant: str) -> None:
    """The package's own reader returns the golden values too (stored labels and decoded ids)."""
    import shardkit
    from shardkit.images.preprocess import decode_label_encoding

    expected = json.loads((GOLDEN / "expected.json").read_text(encoding="utf-8"))
    exp = expected["datasets"][variant]
    folder = GOLDEN / variant / exp["split"]
    # Stored labels are turned into ids with the package's own decoder.
    ds = shardkit.open(folder, labels="stored", verify=True)
    assert len(ds) == len(exp["samples"])
    for i, e in enumerate(exp["samples"]):
        image, label = ds[i]
        want = np.array(e["image"], dtype=np.dtype(exp.get("image_dtype", "|u1")))
        assert image.dtype == want.dtype and np.array_equal(image, want)
        assert np.array_equal(label, np.array(e["label"], dtype=label.dtype))
        ids = decode_label_encoding(label, ds.spec.label_encoding, ds.num_classes, ds.ignore_index)
        assert np.array_equal(ids, np.array(e["label_ids"]))
        assert ds.key(i) == e["key"]
