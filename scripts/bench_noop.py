#!/usr/bin/env python
"""An unchanged nightly ``shardkit convert`` against the stat floor and against a fresh convert, side by side.

An optional benchmark (not part of the tests or CI). Every figure is a whole process (interpreter start and
imports included), as cron runs it, timed in turns in the same run so that the machine's load hits each alike:

* ``stat walk``: ``python -c`` walking the input tree with ``os.scandir`` and ``stat``-ing every file — the floor
  for a no-op, which must at least list and stat every input;
* ``no-op``: ``shardkit convert`` again on unchanged input into the output of an earlier convert;
* ``fresh``: ``shardkit convert`` into an empty folder (``--camvid`` only; on the tiny pairs with ``--fresh``).

Two datasets:

* ``--tiny N``: N tiny real PNG pairs (8x8 RGB image, 8x8 id label, segnet layout; built once into ``--work``,
  kept with ``--keep``): many files, little data — the no-op against the stat walk;
* ``--camvid N``: N CamVid-size pairs (the shared CamVid pairs hard-linked under new names, ``scaled_camvid.py``),
  converted at 352x480 — the no-op against a fresh convert, where start-up dominates.

    PYTHONPATH=$PWD python scripts/bench_noop.py --tiny 200000 --camvid 701 --work /tmp/noop --keep
    PYTHONPATH=$PWD python scripts/bench_noop.py --tiny 20000 --camvid 701 --rounds 3     # a quicker look

CPU seconds (user + system of the process and its children) move less with other jobs than wall seconds;
both are printed, with their medians and the ratios of the medians.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaled_camvid import replicated_source, source_pairs  # sibling script modules

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "camvid-segnet"

STAT_WALK = """
import os, sys
def walk(d):
    n = 0
    with os.scandir(d) as it:
        for e in it:
            if e.is_dir(follow_symlinks=False):
                n += walk(e.path)
            else:
                e.stat(follow_symlinks=False)
                n += 1
    return n
print(walk(sys.argv[1]))
"""


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the process and its children) of one run of ``cmd``; its output is dropped."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def convert_cmd(src: Path, out: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "shardkit", "convert", str(src), str(out), "--workers", "2", "-q", *extra]


def tiny_pairs(root: Path, n: int) -> Path:
    """``n`` tiny PNG pairs under ``root`` (built only when missing)."""
    from bench_million import write_pairs

    if not (root / "train").is_dir() or sum(1 for _ in (root / "train").iterdir()) != n:
        shutil.rmtree(root, ignore_errors=True)
        t = time.perf_counter()
        write_pairs(root, n)
        print(f"# wrote {n} tiny pairs in {time.perf_counter() - t:.0f} s", flush=True)
    return root


def camvid_pairs(root: Path, n: int, data: Path) -> Path:
    pairs = source_pairs(data)
    times = -(-n // len(pairs))
    if not root.is_dir():
        replicated_source(pairs, root, times, link="hardlink")
        names = sorted(p.name for p in (root / "train").iterdir())
        for name in names[n:]:  # exactly n pairs
            (root / "train" / name).unlink()
            (root / "trainannot" / name).unlink()
    return root


def row(name: str, runs: list[tuple[float, float]]) -> tuple[float, float]:
    wall = statistics.median(w for w, _ in runs)
    cpu = statistics.median(c for _, c in runs)
    print(f"{name:<34} wall {wall:8.3f} s (min {min(w for w, _ in runs):.3f}, max {max(w for w, _ in runs):.3f})"
          f"   cpu {cpu:8.3f} s", flush=True)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", type=int, default=200_000, help="tiny pairs for the no-op vs stat-walk (0: skip)")
    ap.add_argument("--camvid", type=int, default=701, help="CamVid-size pairs for no-op vs fresh (0: skip)")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SegNet-layout CamVid folder")
    ap.add_argument("--rounds", type=int, default=5, help="turns of each timed command")
    ap.add_argument("--fresh", action="store_true", help="also time a fresh convert of the tiny pairs (slow)")
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the datasets and outputs for the next run")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="shardkit-noop-"))
    work.mkdir(parents=True, exist_ok=True)
    walk = [sys.executable, "-c", STAT_WALK]
    print(f"# {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} (1 min) at the start; medians of "
          f"{args.rounds} turns; whole processes")
    try:
        if args.tiny:
            src, out = tiny_pairs(work / f"tiny{args.tiny}", args.tiny), work / f"tiny{args.tiny}-out"
            if args.fresh or not (out / "train" / "manifest.json").is_file():
                shutil.rmtree(out, ignore_errors=True)
                fresh = row(f"tiny x{args.tiny}: fresh convert", [timed(convert_cmd(src, out, []))])
            else:
                fresh = None
            timed(convert_cmd(src, out, []))  # warm-up: the page cache, and the caches an unchanged run keeps
            stat_runs, noop_runs = [], []
            for _ in range(args.rounds):
                stat_runs.append(timed([*walk, str(src)]))
                noop_runs.append(timed(convert_cmd(src, out, [])))
            s, n = row(f"tiny x{args.tiny}: stat walk", stat_runs), row(f"tiny x{args.tiny}: no-op", noop_runs)
            print(f"tiny x{args.tiny}: no-op / stat walk = {n[0] / s[0]:.2f} (wall), {n[1] / s[1]:.2f} (cpu)"
                  + (f"; fresh / no-op = {fresh[0] / n[0]:.1f} (wall)" if fresh else ""), flush=True)
        if args.camvid:
            src = camvid_pairs(work / f"camvid{args.camvid}", args.camvid, args.data)
            out = work / f"camvid{args.camvid}-out"
            extra = ["--size", "352x480"]
            fresh_runs, noop_runs, stat_runs = [], [], []
            for _ in range(args.rounds):
                shutil.rmtree(out, ignore_errors=True)
                fresh_runs.append(timed(convert_cmd(src, out, extra)))
                os.sync()  # a nightly run starts long after the last one wrote
                noop_runs.append(timed(convert_cmd(src, out, extra)))
                stat_runs.append(timed([*walk, str(src)]))
            f, n = row(f"camvid x{args.camvid}: fresh", fresh_runs), row(f"camvid x{args.camvid}: no-op", noop_runs)
            s = row(f"camvid x{args.camvid}: stat walk", stat_runs)
            print(f"camvid x{args.camvid}: fresh / no-op = {f[0] / n[0]:.1f} (wall), {f[1] / n[1]:.1f} (cpu); "
                  f"no-op / stat walk = {n[0] / s[0]:.2f} (wall)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"# load {os.getloadavg()[0]:.1f} (1 min) at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
