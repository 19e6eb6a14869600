#!/usr/bin/env python
"""An unchanged nightly ``shardkit convert`` against the stat floor, against a fresh convert, and the CLI's start-up
against an older revision: #30's three bars, side by side in one run, with their ratios.

An optional benchmark (not part of the tests or CI). Every figure is a whole process (interpreter start and
imports included), as cron runs it, timed in turns in the same run so that the machine's load hits each alike:

* ``stat walk``: ``python -c`` walking the input tree with ``os.scandir`` and ``stat``-ing every file — the floor
  for a no-op, which must at least list and stat every input;
* ``no-op``: ``shardkit convert`` again on unchanged input into the output of an earlier convert;
* ``fresh``: ``shardkit convert`` into an empty folder (``--camvid`` only; on the tiny pairs with ``--fresh``);
* ``start-up``: ``shardkit --version`` and ``--help``, both as ``python -m shardkit`` and through a console script
  like the one ``pip install`` writes (each tree's own ``[project.scripts]`` entry point), this tree against
  ``--baseline REV`` (exported with ``git archive``).

Two datasets:

* ``--tiny N``: N tiny real PNG pairs (8x8 RGB image, 8x8 id label, segnet layout; built once into ``--work``,
  kept with ``--keep``): many files, little data — the no-op against the stat walk;
* ``--camvid N``: N CamVid-size pairs (the shared CamVid pairs copied under new names, ``scaled_camvid.py``),
  converted with ``--camvid-options`` (``--format lmdb --size 352x480``) — the no-op against a fresh convert, where
  start-up dominates.

Both trees are byte-compiled first (as ``pip install`` does; this machine sets ``PYTHONDONTWRITEBYTECODE``, and
compiling every imported module on each start would be timed otherwise), and every command runs in the work
folder with ``PYTHONPATH`` naming its tree (``python -m`` and ``-c`` put the working folder first on the path).

    PYTHONPATH=$PWD python scripts/bench_noop.py --tiny 200000 --camvid 701 --work /tmp/noop --keep
    PYTHONPATH=$PWD python scripts/bench_noop.py --tiny 20000 --camvid 701 --rounds 3     # a quicker look
    PYTHONPATH=$PWD python scripts/bench_noop.py --tiny 0 --camvid 701 --startup-rounds 0 --noop-baseline REV

CPU seconds (user + system of the process and its children) move less with other jobs than wall seconds;
both are printed, with their medians and the ratios of the medians.
"""

from __future__ import annotations

import argparse
import os
import re
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


REPO = Path(__file__).resolve().parents[1]
#: where every timed command runs, and each tree's ``PYTHONPATH`` (set in main)
RUN: dict[str, object] = {"cwd": None, "env": None}


def tree_env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall s, CPU s of the process and its children) of one run of ``cmd``; its output is dropped."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   cwd=RUN["cwd"], env=env or RUN["env"])  # type: ignore[arg-type]
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
        # copies, not links: another process hard-linking the shared files moves their ctime, which is a change
        replicated_source(pairs, root, times, link="copy")
        names = sorted(p.name for p in (root / "train").iterdir())
        for name in names[n:]:  # exactly n pairs
            (root / "train" / name).unlink()
            (root / "trainannot" / name).unlink()
    return root


def export(rev: str, work: Path) -> Path:
    """``rev`` of this repository as a plain tree under ``work`` (``git archive``), once."""
    tree = work / f"tree-{rev}"
    if not (tree / "shardkit").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def compile_tree(tree: Path) -> None:
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "shardkit")], check=True,
                   stdout=subprocess.DEVNULL)


def console_script(tree: Path, work: Path, name: str) -> Path:
    """A ``shardkit`` console script for ``tree``, as pip writes it from the tree's own entry point."""
    text = (tree / "pyproject.toml").read_text()
    found = re.search(r'^shardkit\s*=\s*"([\w.]+):(\w+)"', text, re.M)
    assert found, f"no shardkit entry point in {tree}/pyproject.toml"
    folder = work / f"bin-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "shardkit"
    script.write_text(f"#!{sys.executable}\nimport re\nimport sys\nfrom {found[1]} import {found[2]}\n"
                      "if __name__ == '__main__':\n"
                      "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                      f"    sys.exit({found[2]}())\n")
    script.chmod(0o755)
    return script


def startup(work: Path, baseline: str, rounds: int) -> list[tuple[str, float, float]]:
    """``--version`` and ``--help`` of this tree against ``baseline``, ``-m`` and console script, in turns."""
    old = export(baseline, work)
    compile_tree(old)
    ratios = []
    for args in (["--version"], ["--help"]):
        for how in ("python -m shardkit", "console script"):
            cmds = {}
            for label, tree in (("new", REPO), (baseline, old)):
                cmds[label] = ([sys.executable, "-m", "shardkit"] if how.startswith("python")
                               else [str(console_script(tree, work, label))]) + args
            envs = {"new": tree_env(REPO), baseline: tree_env(old)}
            runs: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
            for k in cmds:
                timed(cmds[k], envs[k])  # warm-up
            for _ in range(rounds):
                for k in cmds:
                    runs[k].append(timed(cmds[k], envs[k]))
            what = f"{how} {args[0]}"
            n, b = row(f"{what}: this tree", runs["new"]), row(f"{what}: {baseline}", runs[baseline])
            ratios.append((f"{what}: this tree / {baseline}", n[0] / b[0], n[1] / b[1]))
            per_round(f"{what}: this tree / {baseline}", runs["new"], runs[baseline])
    return ratios


def per_round(name: str, a: list[tuple[float, float]], b: list[tuple[float, float]]) -> None:
    """Each turn's ratio a/b (wall, cpu): a bar is met only where every turn meets it."""
    pairs = ", ".join(f"{x[0] / y[0]:.2f}/{x[1] / y[1]:.2f}" for x, y in zip(a, b, strict=True))
    print(f"{name}, each turn (wall/cpu): {pairs}", flush=True)


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
    ap.add_argument("--camvid-options", default="--format lmdb --size 352x480",
                    help="convert options of the CamVid no-op and fresh runs (#42 measured these)")
    ap.add_argument("--noop-baseline", default=None, metavar="REV",
                    help="also time REV's unchanged CamVid run (its own output, in the same turns)")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SegNet-layout CamVid folder")
    ap.add_argument("--rounds", type=int, default=5, help="turns of each timed convert and stat walk")
    ap.add_argument("--baseline", default="99f3085", help="revision whose start-up this tree's is compared with")
    ap.add_argument("--startup-rounds", type=int, default=10, help="turns of each start-up command (0: skip)")
    ap.add_argument("--fresh", action="store_true", help="also time a fresh convert of the tiny pairs (slow)")
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the datasets and outputs for the next run")
    args = ap.parse_args(argv)
    work = (args.work or Path(tempfile.mkdtemp(prefix="shardkit-noop-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    RUN.update(cwd=str(work), env=tree_env(REPO))
    compile_tree(REPO)
    walk = [sys.executable, "-c", STAT_WALK]
    print(f"# {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} (1 min) at the start; medians of "
          f"{args.rounds} turns ({args.startup_rounds} for start-up); whole processes", flush=True)
    bars: list[tuple[str, float, float, str]] = []
    try:
        if args.tiny:
            src, out = tiny_pairs(work / f"tiny{args.tiny}", args.tiny), work / f"tiny{args.tiny}-out"
            if args.fresh or not (out / "train" / "manifest.json").is_file():
                shutil.rmtree(out, ignore_errors=True)
                fresh = row(f"tiny x{args.tiny}: fresh convert", [timed(convert_cmd(src, out, []))])
            else:
                fresh = None
            timed(convert_cmd(src, out, []))  # warm-up: the page cache, and what an unchanged run keeps
            stat_runs, noop_runs = [], []
            for _ in range(args.rounds):
                stat_runs.append(timed([*walk, str(src)]))
                noop_runs.append(timed(convert_cmd(src, out, [])))
            s, n = row(f"tiny x{args.tiny}: stat walk", stat_runs), row(f"tiny x{args.tiny}: no-op", noop_runs)
            bars.append((f"tiny x{args.tiny}: no-op / stat walk", n[0] / s[0], n[1] / s[1], "<= 3"))
            per_round(f"tiny x{args.tiny}: no-op / stat walk", noop_runs, stat_runs)
            if fresh:
                print(f"tiny x{args.tiny}: fresh / no-op = {fresh[0] / n[0]:.1f} (wall)", flush=True)
            print(f"# load {os.getloadavg()[0]:.1f}", flush=True)
        if args.camvid:
            src = camvid_pairs(work / f"camvid{args.camvid}-copied", args.camvid, args.data)
            out = work / f"camvid{args.camvid}-out"
            extra = args.camvid_options.split()
            fresh_runs, noop_runs, stat_runs, old_runs = [], [], [], []
            if args.noop_baseline:  # the older tree's own output: a signature holds the code that wrote it
                old_tree, old_out = export(args.noop_baseline, work), work / f"camvid{args.camvid}-out-old"
                compile_tree(old_tree)
                shutil.rmtree(old_out, ignore_errors=True)
                timed(convert_cmd(src, old_out, extra), tree_env(old_tree))
            for _ in range(args.rounds):
                shutil.rmtree(out, ignore_errors=True)
                fresh_runs.append(timed(convert_cmd(src, out, extra)))
                os.sync()  # a nightly run starts long after the last one wrote
                noop_runs.append(timed(convert_cmd(src, out, extra)))
                stat_runs.append(timed([*walk, str(src)]))
                if args.noop_baseline:
                    old_runs.append(timed(convert_cmd(src, old_out, extra), tree_env(old_tree)))
            if old_runs:
                o = row(f"camvid x{args.camvid}: no-op {args.noop_baseline}", old_runs)
                per_round(f"camvid x{args.camvid}: no-op, this tree / {args.noop_baseline}", noop_runs, old_runs)
            f, n = row(f"camvid x{args.camvid}: fresh", fresh_runs), row(f"camvid x{args.camvid}: no-op", noop_runs)
            s = row(f"camvid x{args.camvid}: stat walk", stat_runs)
            bars.append((f"camvid x{args.camvid}: fresh / no-op", f[0] / n[0], f[1] / n[1], ">= 20"))
            if old_runs:
                bars.append((f"camvid x{args.camvid}: no-op, this tree / {args.noop_baseline}", n[0] / o[0],
                             n[1] / o[1], "< 1"))
            per_round(f"camvid x{args.camvid}: fresh / no-op", fresh_runs, noop_runs)
            print(f"camvid x{args.camvid}: no-op / stat walk = {n[0] / s[0]:.2f} (wall)", flush=True)
            print(f"# load {os.getloadavg()[0]:.1f}", flush=True)
        if args.startup_rounds:
            for name, wall, cpu in startup(work, args.baseline, args.startup_rounds):
                bars.append((name, wall, cpu, "well under 0.5"))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"# load {os.getloadavg()[0]:.1f} (1 min) at the end\n\nthe bars (ratios of medians):")
    for name, wall, cpu, goal in bars:
        print(f"  {name:<52} {wall:7.2f} wall {cpu:7.2f} cpu   goal {goal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
