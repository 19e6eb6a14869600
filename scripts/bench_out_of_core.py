#!/usr/bin/env python
"""Out of core: one shuffled epoch over a dataset several times larger than the memory the reader may use.

An optional benchmark (not part of the tests or CI). **Needs root** (it creates a memory cgroup and
drops the page cache) and Linux. It

1. copies the shared CamVid pairs ``--times`` × under new names (real copies, so the page cache
   cannot serve a repeated PNG from its first read), and converts them once per row (``--row``:
   ``shardkit convert`` options, e.g. ``"--format lmdb"``; codec options such as
   ``"--format lmdb --image-codec zstd --label-codec zstd"`` where this shardkit has them);
2. creates a memory cgroup with ``--limit`` (cgroup v1: ``memory/<own group>/<name>/memory.limit_in_bytes``;
   v2: ``/sys/fs/cgroup/<name>/memory.max``) — page cache is charged to it, so it cannot hold the data;
3. for each row: ``sync; echo 3 > /proc/sys/vm/drop_caches``, then a fresh process in the cgroup reads
   one shuffled epoch (shardkit's batched reader: sorted random index batches of ``--batch-size`` into
   one reused buffer; the naive row: ``cv2.imread`` of both PNGs + centre crop per sample, shuffled) and
   reports samples/s, the bytes it read from disk (``/proc/self/io`` ``read_bytes``: page-cache misses,
   read-ahead included) and its peak RSS; the first raw npy, HDF5 and LMDB splits are also read without the
   readers' read-ahead hints (npy, HDF5: a plain memory map; LMDB: page by page), and the npy split through
   the ``preadv`` prototype; with ``--disk-mbps`` the out-of-core reads are also limited to that many MB/s of
   disk (cgroup v1 ``blkio.throttle.read_bps_device`` / v2 ``io.max``), a slower disk on the same machine;
4. measures each row warm too (no limit, every file read once before the timed epoch: the CPU bound;
   the process still maps the shard pages on first touch), and prints the break-even
   table: for a disk of D MB/s a row reads at about min(warm rate, D / bytes read per sample);
5. removes the cgroup and every file it wrote.

The machine is shared (other jobs load its CPUs and its disk): compare ratios within one run.

    sudo python scripts/bench_out_of_core.py                        # 300 MB limit, CamVid × 10 (~1 GB / row)
    sudo python scripts/bench_out_of_core.py --limit 400MB --times 20 \\
        --row "--format npy" --row "--format lmdb" --row "--format lmdb --image-codec zstd --label-codec zstd"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaled_camvid import replicated_source, source_pairs  # a sibling script module

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "camvid-segnet"
SIZE = "352x480"
DISK_SPEEDS_MB_S = (50, 100, 200, 400, 800, 1600, 3200)


# ------------------------------------------------------------------------------------------ cgroup


class MemoryCgroup:
    """A memory cgroup with a hard limit, removed on exit. v1 (``memory.limit_in_bytes``) or v2 (``memory.max``)."""

    def __init__(self, limit: int, name: str) -> None:
        self.limit = limit
        if Path("/sys/fs/cgroup/cgroup.controllers").exists():  # unified (v2) hierarchy
            self.version = 2
            self.path = Path("/sys/fs/cgroup") / name
        else:
            own = ""
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                _, controllers, where = line.split(":", 2)
                if "memory" in controllers.split(","):
                    own = where.lstrip("/")
            self.version = 1
            self.path = Path("/sys/fs/cgroup/memory") / own / name

    def __enter__(self) -> MemoryCgroup:
        try:
            self.path.mkdir()
            if self.version == 1:
                (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
                with contextlib.suppress(OSError):  # no swap accounting: nothing to limit
                    (self.path / "memory.memsw.limit_in_bytes").write_text(str(self.limit))
            else:
                (self.path / "memory.max").write_text(str(self.limit))
                with contextlib.suppress(OSError):
                    (self.path / "memory.swap.max").write_text("0")
        except PermissionError:
            raise SystemExit(f"cannot create the memory cgroup {self.path}: this benchmark needs root") from None
        except OSError as exc:
            raise SystemExit(f"cannot create the memory cgroup {self.path} ({exc.strerror}); on cgroup v2 the "
                             "memory controller must be enabled in /sys/fs/cgroup/cgroup.subtree_control") from None
        return self

    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def peak(self) -> int:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self.path / name).read_text())
        except (OSError, ValueError):
            return -1

    def reset_peak(self) -> None:
        with contextlib.suppress(OSError):
            (self.path / ("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak")).write_text("0")

    def __exit__(self, *exc: object) -> None:
        for _ in range(50):  # the last member may take a moment to leave after it exits
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        print(f"note: could not remove the cgroup {self.path}; remove it with: rmdir {self.path}", file=sys.stderr)


def whole_disk(path: Path) -> str:
    """``MAJ:MIN`` of the disk (not the partition) that holds ``path``; SystemExit when it is not on one."""
    st = path.stat()
    dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if not dev.exists():
        raise SystemExit(f"--disk-mbps: {path} is not on a block device (device {os.major(st.st_dev)}:"
                         f"{os.minor(st.st_dev)}); put --work on a disk")
    if (dev / "partition").exists():
        dev = dev.resolve().parent
    return (dev / "dev").read_text().strip()


class DiskThrottle:
    """Reads from one disk limited to ``mbps`` MB/s for the processes that join: a slower disk (a network file
    system, a cloud volume) on this machine. v1: a ``blkio`` cgroup with ``blkio.throttle.read_bps_device``;
    v2: ``io.max`` ``rbps`` written into the memory cgroup (one hierarchy). Removed on exit (v1)."""

    def __init__(self, mbps: float, disk: str, name: str, memory: MemoryCgroup) -> None:
        self.rule = f"{disk} {int(mbps * 1e6)}"
        self.memory = memory
        self.path = memory.path if memory.version == 2 else Path("/sys/fs/cgroup/blkio") / name

    def __enter__(self) -> DiskThrottle:
        try:
            if self.memory.version == 2:
                (self.path / "io.max").write_text(self.rule.replace(" ", " rbps=", 1))
            else:
                self.path.mkdir()
                (self.path / "blkio.throttle.read_bps_device").write_text(self.rule)
        except OSError as exc:
            raise SystemExit(f"cannot throttle reads in {self.path} ({exc.strerror}); on cgroup v2 the io "
                             "controller must be enabled in /sys/fs/cgroup/cgroup.subtree_control") from None
        return self

    def procs(self) -> Path | None:
        """The v1 group's member list (v2: the memory cgroup is the same group)."""
        return None if self.memory.version == 2 else self.path / "cgroup.procs"

    def __exit__(self, *exc: object) -> None:
        if self.memory.version == 1:
            with contextlib.suppress(OSError):
                self.path.rmdir()


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


# ------------------------------------------------------------------------------ one pass (child)


def io_counters() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/io").read_text().splitlines():
        key, value = line.split(":")
        out[key] = int(value)
    return out


def child(kind: str, path: str, batch_size: int, seed: int, warm: bool, source: str | None) -> dict[str, Any]:
    """One shuffled epoch of ``kind`` in this process (``warm``: after reading every file it reads once)."""
    import numpy as np

    import shardkit
    from shardkit.bench import naive_pass, reader_pass, shard_files

    if kind == "plain":  # the reader without its read-ahead hints (npy, HDF5: a plain memory map; LMDB)
        from shardkit.formats.mapping import MappedArray

        MappedArray._advise = lambda self, advice, start, length: None  # type: ignore[method-assign]
    ds = shardkit.open(path)
    n = len(ds)
    if kind in ("reader", "plain"):
        run = reader_pass(ds, batch_size, n, True, seed)
        files = shard_files(ds, Path(path))
    elif kind == "pread":
        run = pread_pass(ds, batch_size, seed)
        files = shard_files(ds, Path(path))
    else:
        order = np.random.default_rng(seed).permutation(n)
        root = Path(source) if source else Path(ds.manifest.source.root or ".")
        run = naive_pass(ds, n, False, root, order=order)
        files = [root / r[k] for r in ds.manifest.samples for k in ("key", "label")]
    if warm:  # into the page cache (no limit in this process)
        for f in files:
            with f.open("rb", buffering=0) as fh:
                while fh.read(1 << 24):
                    pass
    before, t = io_counters(), time.perf_counter()
    done = run()
    seconds = time.perf_counter() - t
    after = io_counters()
    return {"samples": done, "seconds": seconds, "read_bytes": after["read_bytes"] - before["read_bytes"],
            "rchar": after["rchar"] - before["rchar"],
            "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def pread_pass(ds: Any, batch_size: int, seed: int) -> Any:
    """A prototype, not in the library: npy samples read with one ``preadv`` per array straight into the batch.

    The disk then reads exactly each sample's bytes; a page fault in a memory map instead reads the
    block device's whole read-ahead window around it (``/sys/block/<dev>/queue/read_ahead_kb``).
    """
    import numpy as np

    if ds.format != "npy" or ds.spec.size is None:
        raise SystemExit("the pread row needs a fixed-size npy split")
    handles = []
    for r in ds.readers:
        r.ensure_open()
        images, labels = r._images, r._labels
        handles.append((os.open(images.filename, os.O_RDONLY), images.offset, images[0].nbytes,
                        os.open(labels.filename, os.O_RDONLY), labels.offset, labels[0].nbytes))
    out_images, out_labels = ds.empty_batch(batch_size)
    order = np.random.default_rng(seed).permutation(len(ds))
    starts = ds._starts

    def run() -> int:
        for a in range(0, len(order), batch_size):
            idx = np.sort(order[a : a + batch_size])
            shard = np.searchsorted(starts, idx, side="right") - 1
            for k, (s, i) in enumerate(zip(shard.tolist(), (idx - starts[shard]).tolist(), strict=True)):
                fi, oi, bi, fl, ol, bl = handles[s]
                os.preadv(fi, [out_images[k]], oi + i * bi)
                os.preadv(fl, [out_labels[k]], ol + i * bl)
        return len(order)

    return run


def run_child(args: argparse.Namespace, kind: str, path: Path, source: Path,
              cgroup: MemoryCgroup | None, throttle: DiskThrottle | None = None) -> dict[str, Any]:
    """One epoch in a fresh process: inside ``cgroup`` (cold, out of core; and ``throttle``'s disk limit when
    given), or without one (warm)."""
    cmd = [sys.executable, __file__, "--child", kind, str(path), "--batch-size", str(args.batch_size),
           "--seed", str(args.seed), "--source", str(source), *([] if cgroup is not None else ["--warm"])]
    throttled = throttle.procs() if throttle is not None and cgroup is not None else None

    def enter() -> None:  # in the child, before exec: join the cgroups before anything is read
        if cgroup is not None:
            cgroup.procs().write_text(str(os.getpid()))
        if throttled is not None:
            throttled.write_text(str(os.getpid()))

    if cgroup is not None:
        cgroup.reset_peak()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, preexec_fn=enter)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if cgroup is not None:
        res["cgroup_peak"] = cgroup.peak()
    return res


# ----------------------------------------------------------------------------------------- parent


def parse_bytes(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1] if t and t[-1] in units else ""
    return int(float(t[: len(t) - len(unit)]) * units[unit])


def convert_row(src: Path, out: Path, options: str, workers: int) -> None:
    cmd = [sys.executable, "-m", "shardkit", "convert", str(src), str(out), "--size", SIZE, "--workers",
           str(workers), "-q", *shlex.split(options)]
    subprocess.run(cmd, check=True)


def stored_bytes(split: Path) -> int:
    manifest = json.loads((split / "manifest.json").read_text())
    return sum(f["bytes"] for s in manifest["shards"] for f in s["files"])


def codec_rows() -> list[str]:
    """Codec rows, where this shardkit's convert has ``--image-codec``/``--label-codec``."""
    help_text = subprocess.run([sys.executable, "-m", "shardkit", "convert", "--help"], capture_output=True,
                               text=True).stdout
    if "--image-codec" not in help_text:
        return []
    return ["--format lmdb --label-codec zstd", "--format lmdb --image-codec lz4 --label-codec zstd",
            "--format lmdb --image-codec zstd --label-codec zstd", "--format lmdb --image-codec png --label-codec zstd"]


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    pairs = source_pairs(args.data)
    src = work / "src"
    replicated_source(pairs, src, args.times, link="copy")
    png_bytes = sum(f.stat().st_size for d in ("train", "trainannot") for f in (src / d).iterdir())
    rows = args.row or (["--format npy", "--format lmdb", *codec_rows()])
    converted = []
    for i, options in enumerate(rows):
        out = work / f"row{i}"
        convert_row(src, out, options, args.workers)
        converted.append((options, out / "train", stored_bytes(out / "train")))
    n = len(pairs) * args.times
    results: dict[str, Any] = {"limit": args.limit, "samples": n, "times": args.times, "png_bytes": png_bytes,
                               "rows": [], "cgroup": None}
    with contextlib.ExitStack() as stack:
        cg = stack.enter_context(MemoryCgroup(args.limit, f"shardkit-ooc-{os.getpid()}"))
        results["cgroup"] = f"v{cg.version} {cg.path}"
        throttle = None
        if args.disk_mbps:
            disk = whole_disk(work)
            throttle = stack.enter_context(DiskThrottle(args.disk_mbps, disk, f"shardkit-ooc-{os.getpid()}", cg))
            results["disk_mbps"] = args.disk_mbps
            results["cgroup"] += f"; reads from disk {disk} limited to {args.disk_mbps:g} MB/s"
        jobs = [(f"shardkit {o}", "reader", split, size) for o, split, size in converted]
        npy = next(((split, size) for o, split, size in converted if "--format npy" in o and "codec" not in o), None)
        for fmt in ("npy", "hdf5", "lmdb"):  # the hinted readers, once each with their hints off
            plain = next(((split, size) for o, split, size in converted if f"--format {fmt}" in o
                          and "codec" not in o and "compression" not in o), None)
            if plain is not None and not args.no_plain:
                jobs.append((f"{fmt} without read-ahead hints", "plain", *plain))
        if npy is not None and not args.no_pread:
            jobs.append(("prototype: npy via preadv (not in shardkit)", "pread", *npy))
        jobs.append(("naive: cv2.imread image + label, crop (PNG)", "naive", converted[0][1], png_bytes))
        for name, kind, split, size in jobs:
            drop_caches()
            cold = run_child(args, kind, split, src, cg, throttle)
            warm = run_child(args, kind, split, src, None)
            row = {"name": name, "stored_bytes": size, "cold": cold, "warm": warm}
            results["rows"].append(row)
            print(f"  {name}: {cold['samples'] / cold['seconds']:.0f} samples/s out of core, "
                  f"{cold['read_bytes'] / cold['seconds'] / 1e6:.0f} MB/s from disk; "
                  f"{warm['samples'] / warm['seconds']:.0f} samples/s warm", file=sys.stderr)
    return results


def render(res: dict[str, Any]) -> str:
    rows = res["rows"]
    n = res["samples"]
    rate = {r["name"]: r["cold"]["samples"] / r["cold"]["seconds"] for r in rows}
    raw = next((v for k, v in rate.items() if "--format npy" in k), None)
    naive = next(v for k, v in rate.items() if k.startswith("naive"))
    big = max(r["stored_bytes"] for r in rows)
    lines = [f"# {n} samples (CamVid × {res['times']}, {SIZE}); one shuffled epoch per row; memory limit "
             f"{res['limit'] / 1e6:.0f} MB ({res['cgroup']}); largest row {big / 1e9:.2f} GB = "
             f"{big / res['limit']:.1f}× the limit; PNG sources {res['png_bytes'] / 1e6:.0f} MB",
             f"{'row':<64} {'stored KB/s.':>12} {'samples/s':>9} {'disk MB/s':>9} {'read KB/s.':>10} "
             f"{'× npy':>6} {'× naive':>7} {'peak MB':>7} {'warm s/s':>8}"]
    for r in rows:
        c, w = r["cold"], r["warm"]
        s = rate[r["name"]]
        lines.append(
            f"{r['name'][:64]:<64} {r['stored_bytes'] / n / 1e3:>12.0f} {s:>9.0f} "
            f"{c['read_bytes'] / c['seconds'] / 1e6:>9.0f} {c['read_bytes'] / c['samples'] / 1e3:>10.0f} "
            f"{(s / raw if raw else float('nan')):>6.2f} {s / naive:>7.1f} {c.get('cgroup_peak', -1) / 1e6:>7.0f} "
            f"{w['samples'] / w['seconds']:>8.0f}")
    lines.append("")
    lines.append("break-even: samples/s ≈ min(warm rate, disk MB/s ÷ bytes read per sample) — best row per disk speed")
    lines.append(f"{'disk MB/s':>9}  " + "  ".join(f"{r['name'].removeprefix('shardkit ')[:28]:>28}" for r in rows))
    for d in DISK_SPEEDS_MB_S:
        est = []
        for r in rows:
            c, w = r["cold"], r["warm"]
            per = max(c["read_bytes"] / c["samples"], r["stored_bytes"] / n)  # never below what is stored
            est.append(min(w["samples"] / w["seconds"], d * 1e6 / per))
        best = max(range(len(rows)), key=lambda i: est[i])
        lines.append(f"{d:>9}  " + "  ".join(f"{e:>27.0f}{'*' if i == best else ' '}" for i, e in enumerate(est)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SegNet-layout CamVid folder")
    ap.add_argument("--times", type=int, default=10, help="copies of the shared pairs (149 each)")
    ap.add_argument("--limit", type=parse_bytes, default=parse_bytes("300MB"), help="memory limit, e.g. 300MB")
    ap.add_argument("--disk-mbps", type=float, default=0.0,
                    help="also limit the out-of-core reads to this many MB/s of disk (a slower disk; cgroup v1 blkio "
                         "or v2 io.max); default: the disk as it is")
    ap.add_argument("--row", action="append", help='convert options of one row, e.g. "--format lmdb" (repeatable)')
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2, help="convert workers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one), emptied after")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", nargs=2, metavar=("KIND", "SPLIT"), help=argparse.SUPPRESS)
    ap.add_argument("--no-pread", action="store_true", help="leave out the preadv prototype row")
    ap.add_argument("--no-plain", action="store_true",
                    help="leave out the npy, HDF5 and LMDB rows without read-ahead hints")
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--source", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.batch_size, args.seed, args.warm, args.source)))
        return 0
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        raise SystemExit("this benchmark needs Linux and root (a memory cgroup, /proc/sys/vm/drop_caches)")
    tmp = tempfile.mkdtemp(prefix="shardkit-ooc-", dir=args.work)
    try:
        res = measure(args, Path(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(render(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
