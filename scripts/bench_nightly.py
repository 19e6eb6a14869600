#!/usr/bin/env python
"""A nightly re-run that changed nothing, against a fresh convert, at 1× and 10× the data.

An optional benchmark (not part of the tests or CI). It builds CamVid × ``--times`` and
CamVid × 10·``--times`` (the shared pairs hard-linked under new names: no extra disk for the
sources; the decoded pixels, and so convert's work, are the same), converts each once, then
times in the same run:

* ``fresh``: ``convert()`` into an empty folder (every sample decoded and written);
* ``no-op``: ``convert()`` again on unchanged input — every shard reused by its recorded
  ``(size, mtime_ns, ctime_ns, inode)``, no shard byte read — with the bytes the process read
  meanwhile (``/proc/self/io`` ``rchar``: every read() call, page cache or disk); timed after
  ``sync`` (as a nightly run starts long after the last one wrote);
* ``no-op, whole process``: the ``shardkit convert`` command as cron runs it (interpreter start
  and imports included);
* ``--rehash``: the full check, every source and shard byte read and hashed.

The machine is shared (other agents load its 2 cores): compare ratios, which hold within a run.

    python scripts/bench_nightly.py                 # 745 and 7,450 samples, ~4 min, ~5.5 GB of shards
    python scripts/bench_nightly.py --times 1 --quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaled_camvid import replicated_source, source_pairs  # a sibling script module

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "camvid-segnet"


def rchar() -> int:
    """Bytes this process has read through read() calls so far (Linux), or -1."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def timed(cfg: ConvertConfig) -> tuple[float, int, Any]:
    before, t = rchar(), time.perf_counter()
    summary = convert(cfg)
    return time.perf_counter() - t, rchar() - before, summary


def cli_seconds(cfg: ConvertConfig, extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "shardkit", "convert", str(cfg.input), str(cfg.output), "--size",
           "x".join(map(str, cfg.size or ())), "--workers", str(cfg.workers), "-q", *extra]
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t


def scale(root: Path, pairs: list[tuple[Path, Path]], times: int, args: argparse.Namespace) -> dict[str, Any]:
    src, out = root / f"x{times}", root / f"x{times}-out"
    replicated_source(pairs, src, times, link="hardlink")
    cfg = ConvertConfig(src, out, size=(352, 480), workers=args.workers, quiet=True)
    fresh_s, _, first = timed(cfg)
    # A nightly run starts long after the last one wrote: let the kernel write the fresh shards back first,
    # or the re-runs' few fsyncs (manifest, records) would wait for gigabytes of writeback (ext4 data=ordered).
    os.sync()
    noop = [timed(cfg) for _ in range(args.repeats)]
    assert all(s.reused == s.shards for _, _, s in noop), "an unchanged re-run rewrote a shard"
    whole = [cli_seconds(cfg, []) for _ in range(args.repeats)]
    rehash = [timed(cfg.replace(rehash=True)) for _ in range(args.rehash_repeats)]
    shard_files = sum(1 for p in (out / "train").iterdir() if not p.name.startswith("."))
    res = {
        "times": times, "samples": first.samples, "shards": first.shards, "shard_bytes": first.bytes,
        "source_files": 2 * len(pairs) * times, "published_files": shard_files,
        "fresh_s": fresh_s,
        "noop_s": statistics.median(s for s, _, _ in noop),
        "noop_read_bytes": max(b for _, b, _ in noop),
        "noop_whole_process_s": statistics.median(whole),
        "rehash_s": statistics.median(s for s, _, _ in rehash),
        "rehash_read_bytes": max(b for _, b, _ in rehash),
    }
    if not args.keep:
        shutil.rmtree(out)
        shutil.rmtree(src)
    return res


def render(rows: list[dict[str, Any]]) -> str:
    head = (f"{'data':>10} {'samples':>8} {'files':>12} {'shard MB':>9} {'fresh s':>8} {'no-op s':>8} "
            f"{'× faster':>9} {'read MB':>8} {'cli no-op s':>11} {'× (cli)':>8} {'rehash s':>9} {'read MB':>8}")
    lines = [head]
    for r in rows:
        files = f"{r['source_files']}+{r['published_files']}"
        lines.append(
            f"{'CamVid×' + str(r['times']):>10} {r['samples']:>8} {files:>12} {r['shard_bytes'] / 1e6:>9.0f} "
            f"{r['fresh_s']:>8.2f} {r['noop_s']:>8.3f} {r['fresh_s'] / r['noop_s']:>8.1f}× "
            f"{r['noop_read_bytes'] / 1e6:>8.2f} {r['noop_whole_process_s']:>11.2f} "
            f"{r['fresh_s'] / r['noop_whole_process_s']:>7.1f}× {r['rehash_s']:>9.2f} "
            f"{r['rehash_read_bytes'] / 1e6:>8.0f}")
    if len(rows) == 2:
        a, b = rows
        files = (b["source_files"] + b["published_files"]) / (a["source_files"] + a["published_files"])
        lines.append(
            f"{b['times'] // a['times']}× the data: no-op {b['noop_s'] / a['noop_s']:.1f}× the time "
            f"(files {files:.1f}×, shard bytes {b['shard_bytes'] / a['shard_bytes']:.1f}×, bytes read by the "
            f"no-op {b['noop_read_bytes'] / max(a['noop_read_bytes'], 1):.1f}×); "
            f"--rehash {b['rehash_s'] / a['rehash_s']:.1f}×")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SegNet-layout CamVid folder")
    ap.add_argument("--times", type=int, default=5, help="the 1× dataset is the shared pairs × this")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rehash-repeats", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="only the 1× dataset")
    ap.add_argument("--keep", action="store_true", help="keep the datasets and shards (the folder is printed)")
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    pairs = source_pairs(args.data)
    tmp = tempfile.mkdtemp(prefix="shardkit-nightly-", dir=args.work)
    scales = [args.times] if args.quick else [args.times, 10 * args.times]
    try:
        rows = [scale(Path(tmp), pairs, t, args) for t in scales]
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.keep:
        print(f"# kept in {tmp}")
    print(f"# {os.cpu_count()} CPUs (shared with other jobs), workers={args.workers}; medians of {args.repeats}")
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
