"""A million samples: open time and memory, a spawned worker's start, verify/info and convert memory.

    PYTHONPATH=$PWD python scripts/bench_million.py                    # 1,000,000 samples, 10k vs 100k pairs
    PYTHONPATH=$PWD python scripts/bench_million.py --samples 20000 --pairs 1000   # a quick look
    PYTHONPATH=$PWD python scripts/bench_million.py --skip-open --pairs 20000 --scale 10 --scan-ids --open-converted

1. Builds a synthetic npy split of ``--samples`` tiny fixed-size samples (8x8, 4 classes) without decoding a
   single PNG: shard files are written as the npy format specifies (``np.save`` bytes, what ``NpyWriter``
   writes), each shard's samples sidecar with :class:`shardkit.files.samples.SidecarBuilder`, the manifest with
   shardkit's own ``Manifest``/``dump_manifest``. ``shardkit verify`` accepts it. The same shards are then
   hard-linked into a second folder with a manifest version 1 (every record inline, as shardkit wrote before
   the sidecars): the "before".
2. In fresh processes, for both: ``import shardkit`` and ``shardkit.open`` time and peak RSS; a spawned
   DataLoader worker's start (first batch of a ``num_workers=1`` spawn loader); ``shardkit info`` and
   ``shardkit verify`` peak RSS (version 2 only for verify: it decodes every sample).
3. Converts ``--pairs`` and ``--scale`` x ``--pairs`` tiny real PNG pairs (segnet layout, in ``--tmp``) with
   ``--workers 2`` (``--scan-ids``: without ``num_classes``, so every label's ids are scanned for the class
   table, as the CLI does without ``--num-classes``; ``--open-converted``: also ``shardkit.open`` of each
   converted split, in the default shard size) and reports the converting parent's and the largest process's
   peak RSS, and (1x, under
   ``tracemalloc``) the parent's Python heap peaks while planning and while publishing the manifest; with
   ``--rerun`` also a no-op re-run of each (every shard reused). With ``--baseline CHECKOUT`` the same runs use
   another shardkit checkout too (the version before this change).

Peak RSS is ``VmHWM`` from ``/proc`` (Linux): the measured process's own at its end, and every descendant's
polled every 20 ms while it runs (``ru_maxrss`` would carry the forking process's peak across ``exec``). Every
figure comes from one run on one machine; other jobs on it move timings (hardly the memory figures). Everything
it writes is removed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HW = (8, 8)
CLASSES = 4
log = logging.getLogger("bench_million")


# --------------------------------------------------------------------------- the synthetic split


def build_split(out: Path, n: int, shard_size: int) -> Path:
    """A fixed-size npy split of ``n`` tiny samples (``shard_size`` per shard) with samples sidecars."""
    from shardkit._version import __version__
    from shardkit.codecs.registry import RAW
    from shardkit.files.samples import SampleTable, SidecarBuilder, sidecar_name, split_fingerprint
    from shardkit.files.splitfiles import ShardFile, ShardInfo
    from shardkit.formats.base import SampleSpec, sha256_file
    from shardkit.formats.npy import FORMAT
    from shardkit.labels import ClassInfo, ClassTable
    from shardkit.store.manifest import Manifest
    from shardkit.store.publish import dump_manifest
    from shardkit.store.stats import Stats

    split = out / "train"
    split.mkdir(parents=True)
    table = ClassTable(tuple(ClassInfo(i, f"class{i}") for i in range(CLASSES)), ignore_index=None, source="synthetic")
    spec = SampleSpec(HW, "index", CLASSES, "|u1")
    rng = np.random.default_rng(0)
    shards, digests, stats = [], [], Stats(CLASSES)
    for k, first in enumerate(range(0, n, shard_size)):
        m = min(shard_size, n - first)
        stem = f"{k:05d}-{hashlib.sha256(str(k).encode()).hexdigest()[:12]}"
        images = rng.integers(0, 256, (m, *HW, 3), dtype=np.uint8)
        labels = rng.integers(0, CLASSES, (m, *HW), dtype=np.uint8)
        files = []
        for name, arr in zip(FORMAT.file_names(stem, spec), (images, labels), strict=True):
            with open(split / name, "wb") as fh:
                np.save(fh, arr, allow_pickle=False)
            files.append(ShardFile(name, (split / name).stat().st_size, sha256_file(split / name)))
        present = (labels.reshape(m, -1, 1) == np.arange(CLASSES)).any(axis=1)
        builder = SidecarBuilder(CLASSES)
        for j in range(m):
            i = first + j
            builder.add(f"train/{i:07d}.png", f"trainannot/{i:07d}.png", *HW, hashlib.sha256(b"%d" % i).hexdigest(),
                        np.flatnonzero(present[j]).tolist())
        name = sidecar_name(stem)
        digest = builder.write(split / name)
        shards.append(ShardInfo(k, m, first, tuple(files), ShardFile(name, (split / name).stat().st_size, digest)))
        digests.append(builder.digest())
        stats.add(images.reshape(-1, HW[1], 3), labels.reshape(-1, HW[1]))
    manifest = Manifest(
        version=1, format="npy", format_version=1, split="train", num_samples=n, sample=spec.to_manifest(),
        classes=table.to_json(), preprocessing={"size": list(HW), "resize": "none", "crop": "center"},
        source={"layout": "segnet", "label_kind": "ids", "root": "/synthetic",
                "fingerprint": split_fingerprint(digests), "pairs": n, "unmatched_images": [], "unmatched_labels": []},
        shards=tuple(shards), samples=SampleTable(shards, CLASSES, split), stats=stats.to_manifest(),
        format_options=FORMAT.format_options(spec, "none", RAW),
        tool_version=__version__)
    dump_manifest(manifest, split)
    return split


def write_version1(src: Path, dst: Path) -> Path:
    """The same shards (hard links) with a manifest version 1, streamed record by record, laid out as
    ``dump_manifest`` wrote it (indent 1, sorted keys): the "before" of this change."""
    from shardkit.store.manifest import inline_manifest, load_manifest

    dst.mkdir(parents=True)
    m = load_manifest(src)
    for shard in m.shards:
        for f in shard.files:
            os.link(src / f.name, dst / f.name)
    v1 = inline_manifest(m)  # records are produced lazily below; only the fingerprint pass streams them here
    head = v1.to_json()
    head["samples"] = "@@SAMPLES@@"
    text = json.dumps(head, indent=1, sort_keys=True, allow_nan=False)
    before, after = text.split('"@@SAMPLES@@"')
    with open(dst / "manifest.json", "w", encoding="utf-8") as fh:
        fh.write(before + "[")
        for i, rec in enumerate(m.samples):
            body = json.dumps(rec, indent=1, sort_keys=True).replace("\n", "\n  ")
            fh.write(("," if i else "") + "\n  " + body)
        fh.write("\n ]" + after + "\n")
    return dst


# --------------------------------------------------------------------------- fresh-process measurements

HWM = """
def hwm_mb(pid="self"):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0
"""

OPEN = HWM + """
import json, sys, time
t0 = time.perf_counter()
import shardkit
t1 = time.perf_counter()
ds = shardkit.open(sys.argv[1])
t2 = time.perf_counter()
ds[len(ds) - 1]
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "open_s": t2 - t1, "first_read_s": t3 - t2, "rss_mb": hwm_mb()}))
"""

SPAWN = HWM + """
import json, sys, time
import torch
from shardkit.read.torch import make_loader
loader = make_loader(sys.argv[1], 64, shuffle=True, num_workers=1, multiprocessing_context="spawn",
                     pin_memory=False)
t0 = time.perf_counter()
it = iter(loader)
next(it)
t1 = time.perf_counter()
print(json.dumps({"first_batch_s": t1 - t0, "parent_rss_mb": hwm_mb(), "worker_rss_mb": hwm_mb(it._workers[0].pid)}))
"""

CLI = HWM + """
import atexit, json, sys, time
from shardkit.cli import main
t0 = time.perf_counter()
atexit.register(lambda: print(json.dumps({"seconds": time.perf_counter() - t0, "peak_rss_mb": hwm_mb()})))
sys.argv = ["shardkit", *sys.argv[1:]]
main()
"""

CONVERT = HWM + """
import json, sys, time
from pathlib import Path
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
t0 = time.perf_counter()
classes = {} if sys.argv[3:] == ["scan"] else {"num_classes": 4}  # scan: the table from the label ids, as the CLI
s = convert(ConvertConfig(Path(sys.argv[1]), Path(sys.argv[2]), layout="segnet", workers=2, quiet=True, **classes))
print(json.dumps({"samples": s.samples, "shards": s.shards, "seconds": time.perf_counter() - t0,
                  "parent_rss_mb": hwm_mb()}))
"""


HEAP = """
import json, sys, tracemalloc
from pathlib import Path
tracemalloc.start()
import shardkit.conversion.pipeline as pl
from shardkit.conversion.config import ConvertConfig
marks = {}
plan, publish = pl._plan, pl.publish_split
def traced_plan(*a, **k):
    r = plan(*a, **k)
    marks["plan_mb"] = tracemalloc.get_traced_memory()[1] / 1e6
    return r
def traced_publish(*a, **k):
    tracemalloc.reset_peak()
    r = publish(*a, **k)
    marks["publish_peak_mb"] = tracemalloc.get_traced_memory()[1] / 1e6
    return r
pl._plan, pl.publish_split = traced_plan, traced_publish
pl.convert(ConvertConfig(Path(sys.argv[1]), Path(sys.argv[2]), layout="segnet", num_classes=4, workers=2, quiet=True))
print(json.dumps(marks))
"""


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out.update(int(c) for c in (task / "children").read_text().split())
    except OSError:
        pass
    for c in list(out):
        out |= _children(c)
    return out


def _hwm_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def fresh(code: str, *args: str, checkout: Path | None = None) -> dict[str, Any]:
    """Run ``code`` in a new interpreter (this checkout, or ``checkout``, first on the path) and parse its JSON
    line; adds ``largest_descendant_rss_mb``: the highest VmHWM of any process it started, polled while it ran."""
    root = checkout or Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        # cwd: ``python -c`` puts the current folder first on the path, ahead of PYTHONPATH
        proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=stdout, stderr=stderr, env=env, cwd=root)
        peaks: dict[int, float] = {}
        while proc.poll() is None:
            for pid in _children(proc.pid):
                peaks[pid] = max(peaks.get(pid, 0.0), _hwm_mb(pid))
            time.sleep(0.02)
        stdout.seek(0)
        stderr.seek(0)
        if proc.returncode not in (0, 1):  # verify exits 1 when it finds a problem: reported, not fatal
            raise SystemExit(f"measurement failed:\n{stderr.read()[-2000:]}")
        result = dict(json.loads(stdout.read().strip().splitlines()[-1]))
    result["rc"] = proc.returncode
    result["largest_descendant_rss_mb"] = max(peaks.values(), default=0.0)
    return result


def median_of(code: str, repeats: int, *args: str) -> dict[str, Any]:
    runs = [fresh(code, *args) for _ in range(repeats)]
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


# --------------------------------------------------------------------------- convert at 1x and 10x


def write_pairs(root: Path, n: int) -> None:
    """``n`` tiny real PNG pairs (8x8 RGB image, 8x8 id label) in the segnet layout: train/ + trainannot/."""
    import cv2

    (root / "train").mkdir(parents=True)
    (root / "trainannot").mkdir()
    rng = np.random.default_rng(1)
    for i in range(n):
        image = rng.integers(0, 256, (*HW, 3), dtype=np.uint8)
        ids = rng.integers(0, CLASSES, HW, dtype=np.uint8)
        (root / "train" / f"{i:07d}.png").write_bytes(cv2.imencode(".png", image)[1].tobytes())
        (root / "trainannot" / f"{i:07d}.png").write_bytes(cv2.imencode(".png", ids)[1].tobytes())


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--shard-size", type=int, default=10_000)
    ap.add_argument("--pairs", type=int, default=10_000, help="convert 1x: this many tiny PNG pairs")
    ap.add_argument("--scale", type=int, default=10, help="convert at pairs and scale x pairs")
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per open measurement (median)")
    ap.add_argument("--tmp", type=Path, default=Path("/dev/shm") if Path("/dev/shm").is_dir() else None)
    ap.add_argument("--skip-convert", action="store_true")
    ap.add_argument("--skip-open", action="store_true", help="only the convert measurement")
    ap.add_argument("--baseline", type=Path, help="also convert with this shardkit checkout (e.g. the previous "
                    "version's) first on the path, for a before/after of the converting processes")
    ap.add_argument("--rerun", action="store_true", help="also a no-op re-run of each conversion (every shard "
                    "reused; the parent reads the fingerprint cache and stats every source file)")
    ap.add_argument("--scan-ids", action="store_true", help="convert without num_classes: the class table from a "
                    "scan of every label's ids, as `shardkit convert` without --num-classes or --classes does (#42)")
    ap.add_argument("--open-converted", action="store_true", help="also time shardkit.open (fresh processes, "
                    "median of --repeats) of the converted split at each scale (default shard size: many shards)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    res: dict[str, Any] = {"samples": args.samples, "shard_size": args.shard_size}
    with tempfile.TemporaryDirectory(prefix="shardkit-million-", dir=args.tmp) as tmp:
        if not args.skip_open:
            measure_split(res, Path(tmp), args)
        if not args.skip_convert:
            for scale in (1, args.scale):
                n = args.pairs * scale
                raw = Path(tmp) / f"raw{scale}"
                t = time.perf_counter()
                write_pairs(raw, n)
                log.info("wrote %d tiny PNG pairs in %.1f s", n, time.perf_counter() - t)
                for name, checkout in (("", None), ("baseline_", args.baseline)):
                    if name and checkout is None:
                        continue
                    out = Path(tmp) / f"out{scale}"
                    scan = ["scan"] if args.scan_ids else []
                    res[f"{name}convert_{scale}x"] = fresh(CONVERT, str(raw), str(out), *scan, checkout=checkout)
                    log.info("%sconvert %dx (%d pairs): %s", name, scale, n, res[f"{name}convert_{scale}x"])
                    if args.open_converted:
                        runs = [fresh(OPEN, str(out / "train"), checkout=checkout) for _ in range(args.repeats)]
                        res[f"{name}open_{scale}x"] = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
                        log.info("%sshardkit.open of the %dx split: %s", name, scale, res[f"{name}open_{scale}x"])
                    if args.rerun:  # the same command again: every shard reused, the cache read back
                        res[f"{name}rerun_{scale}x"] = fresh(CONVERT, str(raw), str(out), *scan, checkout=checkout)
                        log.info("%sno-op re-run %dx: %s", name, scale, res[f"{name}rerun_{scale}x"])
                    shutil.rmtree(out)
                    if scale == 1:  # where the parent's Python heap peaks (tracemalloc, so slower: 1x only)
                        res[f"{name}heap_1x"] = fresh(HEAP, str(raw), str(out), checkout=checkout)
                        log.info("%sheap 1x: %s", name, res[f"{name}heap_1x"])
                        shutil.rmtree(out)
                shutil.rmtree(raw)
    report(res, args.scale)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


def measure_split(res: dict[str, Any], tmp: Path, args: argparse.Namespace) -> None:
    """Build the split (both manifest versions) and take every reader-side measurement."""
    t = time.perf_counter()
    v2 = build_split(tmp / "v2", args.samples, args.shard_size)
    res["build_s"] = time.perf_counter() - t
    t = time.perf_counter()
    v1 = write_version1(v2, tmp / "v1" / "train")
    res["build_v1_s"] = time.perf_counter() - t
    res["manifest_bytes"] = {k: (p / "manifest.json").stat().st_size for k, p in (("v1", v1), ("v2", v2))}
    res["sidecar_bytes"] = sum(p.stat().st_size for p in v2.glob("samples-*.npy"))
    log.info("built %d samples in %.1f s (v1 manifest %.1f s): manifests %s bytes, sidecars %d bytes",
             args.samples, res["build_s"], res["build_v1_s"], res["manifest_bytes"], res["sidecar_bytes"])
    for name, split in (("v2", v2), ("v1", v1)):
        res[f"open_{name}"] = median_of(OPEN, args.repeats, str(split))
        log.info("open %s: %s", name, res[f"open_{name}"])
        res[f"spawn_{name}"] = median_of(SPAWN, args.repeats, str(split))
        log.info("spawned worker %s: %s", name, res[f"spawn_{name}"])
        res[f"info_{name}"] = fresh(CLI, "info", str(split))
        log.info("info %s: %s", name, res[f"info_{name}"])
    res["verify_v2"] = fresh(CLI, "verify", str(v2))
    log.info("verify v2: %s", res["verify_v2"])
    shutil.rmtree(tmp / "v1")
    shutil.rmtree(tmp / "v2")


def report(res: dict[str, Any], scale: int) -> None:
    lines = _split_lines(res) if "open_v2" in res else []
    for name in ("", "baseline_"):
        if f"{name}convert_1x" in res:
            c1, c10 = res[f"{name}convert_1x"], res[f"{name}convert_{scale}x"]
            big1 = max(c1["parent_rss_mb"], c1["largest_descendant_rss_mb"])
            big10 = max(c10["parent_rss_mb"], c10["largest_descendant_rss_mb"])
            lines.append(
                f"{name or 'this checkout: '}convert {c1['samples']} vs {c10['samples']} pairs: parent "
                f"{c1['parent_rss_mb']:.0f} → {c10['parent_rss_mb']:.0f} MB, largest process {big1:.0f} → "
                f"{big10:.0f} MB ({big10 / big1:.2f}x); {c1['seconds']:.1f} s vs {c10['seconds']:.1f} s")
        if f"{name}rerun_1x" in res:
            r1, r10 = res[f"{name}rerun_1x"], res[f"{name}rerun_{scale}x"]
            lines.append(f"{name or 'this checkout: '}no-op re-run: parent {r1['parent_rss_mb']:.0f} → "
                         f"{r10['parent_rss_mb']:.0f} MB ({r10['parent_rss_mb'] / r1['parent_rss_mb']:.2f}x); "
                         f"{r1['seconds']:.1f} s vs {r10['seconds']:.1f} s")
        for key in (f"{name}open_1x", f"{name}open_{scale}x"):
            if key in res:
                o = res[key]
                lines.append(f"{name or 'this checkout: '}{key.removeprefix(name)}: import shardkit + shardkit.open of "
                             f"the converted split {o['import_s'] + o['open_s']:.3f} s, peak RSS {o['rss_mb']:.0f} MB")
        if f"{name}heap_1x" in res:
            h = res[f"{name}heap_1x"]
            lines.append(f"{name or 'this checkout: '}parent's Python heap at 1x: {h['plan_mb']:.0f} MB peak until the "
                         f"shards are planned, {h['publish_peak_mb']:.0f} MB peak while the manifest is published")
    print("\n".join(lines))


def _split_lines(res: dict[str, Any]) -> list[str]:
    o1, o2, s1, s2 = res["open_v1"], res["open_v2"], res["spawn_v1"], res["spawn_v2"]
    return [
        f"{res['samples']} samples in shards of {res['shard_size']}: manifest v1 "
        f"{res['manifest_bytes']['v1'] / 1e6:.1f} MB, v2 {res['manifest_bytes']['v2'] / 1e6:.3f} MB + sidecars "
        f"{res['sidecar_bytes'] / 1e6:.1f} MB",
        f"{'':<34} {'v1 (inline)':>12} {'v2 (sidecars)':>14}",
        f"{'shardkit.open s':<34} {o1['open_s']:>12.3f} {o2['open_s']:>14.3f}",
        f"{'open + read one sample, peak RSS MB':<34} {o1['rss_mb']:>12.0f} {o2['rss_mb']:>14.0f}",
        f"{'import shardkit s':<34} {o1['import_s']:>12.3f} {o2['import_s']:>14.3f}",
        f"{'spawned worker first batch s':<34} {s1['first_batch_s']:>12.2f} {s2['first_batch_s']:>14.2f}",
        f"{'spawned worker peak RSS MB':<34} {s1['worker_rss_mb']:>12.0f} {s2['worker_rss_mb']:>14.0f}",
        f"{'info peak RSS MB':<34} {res['info_v1']['peak_rss_mb']:>12.0f} {res['info_v2']['peak_rss_mb']:>14.0f}",
        f"{'verify peak RSS MB':<34} {'':>12} {res['verify_v2']['peak_rss_mb']:>14.0f}",
        f"{'verify s':<34} {'':>12} {res['verify_v2']['seconds']:>14.1f}",
    ]


if __name__ == "__main__":
    sys.exit(main())
