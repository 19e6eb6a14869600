"""Codec sizes and warm batched-read speed on real data, side by side in one run.

    python scripts/bench_codecs.py [SOURCE] [--split val] [--size 360x480] [--repeats 5] [--only lmdb]
                                   [--json out.json]

Converts SOURCE (default: the shared CamVid SegNet copy) once per (format, image codec, label
codec) below into a temporary folder, then reports for each dataset:

* bytes per sample (all shard files / samples) and the ratio raw / this (higher = smaller);
* labels alone: bytes per sample in the label codec (LMDB records, from their headers);
* warm batched reads: one shuffled epoch of ``Dataset.iter_batches`` (batch 32, id labels),
  repeated ``--repeats`` times with the datasets interleaved (page cache warm, one process),
  median samples/s and the ratio to raw LMDB measured in the same run.

Decoding uses ``SHARDKIT_DECODE_THREADS`` threads (default min(4, cores)). Other processes on
the machine load the CPU; compare ratios from one run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "data" / "camvid-segnet"

#: (format, image codec, label codec); the first is the reference every ratio is taken against.
VARIANTS: tuple[tuple[str, str, str], ...] = (
    ("lmdb", "raw", "raw"),
    ("lmdb", "raw", "zstd"),
    ("lmdb", "lz4", "lz4"),
    ("lmdb", "zstd", "zstd"),
    ("lmdb", "png", "zstd"),
    ("lmdb", "jpeg:95", "zstd"),
    ("hdf5", "zstd", "zstd"),
    ("hdf5", "lz4", "lz4"),
    ("tfrecord", "png", "raw"),
    ("npy", "raw", "raw"),
)


def convert_all(source: Path, out: Path, split: str, size: tuple[int, int], only: str | None) -> dict[str, Path]:
    from shardkit.conversion.config import ConvertConfig
    from shardkit.conversion.pipeline import convert

    folders = {}
    for fmt, image, label in VARIANTS:
        if only and fmt != only and (fmt, image, label) != VARIANTS[0]:
            continue
        name = f"{fmt} image={image} label={label}"
        target = out / name.replace(" ", "_").replace(":", "").replace("=", "-")
        t0 = time.perf_counter()
        convert(ConvertConfig(source, target, format=fmt, size=size, splits=(split,), workers=2, quiet=True,
                              image_codec=image, label_codec=label))
        print(f"converted {name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        folders[name] = target / split
    return folders


def sizes(folder: Path) -> dict[str, float]:
    import shardkit

    ds = shardkit.open(folder)
    total = sum(f.bytes for s in ds.manifest.shards for f in s.files)
    out = {"bytes_per_sample": total / len(ds)}
    if ds.format == "lmdb":  # label bytes from the record headers
        from shardkit.formats.lmdb import RECORD_HEADER

        label_bytes = 0
        for r in ds.readers:
            r.ensure_open()
            for j in range(len(r)):
                label_bytes += int(np.frombuffer(r.record(j), RECORD_HEADER, count=1)[0][3])
        out["label_bytes_per_sample"] = label_bytes / len(ds)
    return out


def epoch_rate(folder: Path, seed: int) -> float:
    import shardkit

    ds = shardkit.open(folder)
    t0 = time.perf_counter()
    n = 0
    for images, _labels in ds.iter_batches(32, shuffle=True, seed=seed, shuffle_mode="global"):
        n += len(images)
    return n / (time.perf_counter() - t0)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--split", default="val")
    ap.add_argument("--size", default="360x480")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", help="only this format's datasets (and the raw LMDB reference)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    h, w = (int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory(prefix="shardkit-codecs-") as tmp:
        folders = convert_all(args.source, Path(tmp), args.split, (h, w), args.only)
        facts = {name: sizes(folder) for name, folder in folders.items()}
        for folder in folders.values():  # warm the page cache and each reader once
            epoch_rate(folder, 0)
        rates: dict[str, list[float]] = {name: [] for name in folders}
        for rep in range(args.repeats):
            for name, folder in folders.items():
                rates[name].append(epoch_rate(folder, rep + 1))
    ref = VARIANTS[0]
    ref_name = f"{ref[0]} image={ref[1]} label={ref[2]}"
    ref_bytes, ref_rate = facts[ref_name]["bytes_per_sample"], statistics.median(rates[ref_name])
    rows: list[dict[str, Any]] = []
    print(f"{'dataset':<36} {'bytes/sample':>13} {'ratio':>6} {'label B/sample':>15} {'samples/s':>10} "
          f"{'vs raw lmdb':>11}")
    for name in folders:
        f, rate = facts[name], statistics.median(rates[name])
        row = {"dataset": name, **f, "size_ratio": ref_bytes / f["bytes_per_sample"], "samples_per_s": rate,
               "read_vs_raw_lmdb": rate / ref_rate, "rates": rates[name]}
        rows.append(row)
        label = f"{f['label_bytes_per_sample']:>15.0f}" if "label_bytes_per_sample" in f else f"{'':>15}"
        print(f"{name:<36} {f['bytes_per_sample']:>13.0f} {row['size_ratio']:>5.2f}x {label} {rate:>10.0f} "
              f"{row['read_vs_raw_lmdb']:>10.2f}x")
    print(f"split {args.split} of {args.source}, {h}x{w}; decode threads "
          f"{os.environ.get('SHARDKIT_DECODE_THREADS', 'default')}; median of {args.repeats} warm epochs")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
