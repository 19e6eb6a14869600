#!/usr/bin/env python
"""shardkit beside its peers (WebDataset, MosaicML Streaming, LitData): write and read throughput, one run.

An optional benchmark: never imported by the package, not part of the tests or CI. Everything is
measured in one process, in one run, on the same data and the same output — a uint8 RGB image
(352×480×3) and a uint8 class-id label (352×480) per sample, decoded with ``cv2.imread`` from the
same CamVid PNGs — and printed as one table of samples/s and ratios. Absolute figures drift
±15–35 % between runs on a shared 2-core machine; compare the ratios, which hold within a run.

Set-up (the peers would otherwise replace the CPU torch with a multi-GB CUDA build)::

    pip install --no-deps webdataset mosaicml-streaming litdata
    pip install --no-deps braceexpand lightning-utilities xxhash zstd python-snappy cramjam brotli \\
        catalogue transformers huggingface_hub tokenizers safetensors httpx2 httpcore2 h11 truststore \\
        hf-xet typer

``import streaming`` imports ``streaming.vision`` and with it ``torchvision``; PyPI only has CUDA
builds of torchvision, which fail to load beside a CPU torch. Without a working torchvision, this
script puts a small stand-in module in its place (only ``streaming.vision``, which is not used here,
touches it) and says so. A peer that cannot be imported is skipped with a printed note.

Run::

    python scripts/bench_peers.py                       # CamVid train+val × 5 (745 samples), ~5–8 min
    python scripts/bench_peers.py --quick               # smoke run, ~1 min
    python scripts/bench_peers.py --json bench.json     # also write every figure as JSON
    python scripts/bench_peers.py --write-only          # only the write section (decode bounds, convert, peers)

What is measured (medians of timed passes after one untimed warm-up pass; the writers run interleaved,
one pass of each per round for ``--write-repeats`` rounds, so that a burst of outside load on a shared
machine hits every writer once rather than one writer every time; the readers ``--repeats`` passes each):

* write, PNG → shards: pure decode (1 process and a 2-process pool: the bound for any writer),
  shardkit ``convert()`` (npy, lmdb; 1 and 2 workers; ``force``; ≥ 8 shards), WebDataset
  ``ShardWriter`` and MosaicML ``MDSWriter`` (2 processes writing one part each; MDS parts merged
  with ``merge_index``), LitData ``optimize(num_workers=2)``. Peers and shardkit are called
  in-process as libraries; a last row times the ``shardkit convert`` command as a user runs it.
  Each write row also gives its median CPU milliseconds per sample over its whole process tree (this
  process, its pool or loky workers): on a shared machine that figure moves far less than samples/s,
  and its ratio to the 2-process libspng decode says how much work beyond decoding a writer does.
* read, random order: shardkit's core batched reader (npy, lmdb, hdf5, tfrecord: ``ds.batch`` of
  sorted random index batches into one reused buffer), its torch loader at 0 and 2 workers, and each
  peer's own reader with its own shuffle in a plain loop (per-sample arrays, not stacked into a batch:
  this favours the peers) and through a 2-worker DataLoader (batches collated to tensors); the
  memcpy and mmap-copy limits and the naive online pipeline from ``shardkit bench`` for scale.
* peak memory of a ``shardkit convert`` subprocess (npy, 2 workers, same shard size) on 1× and
  ``--rss-scale``× the data: the largest single process (``getrusage``) and the whole process tree
  (sampled every 20 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import json
import logging
import math
import multiprocessing as mp
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from shardkit.bench import (
    Measurement,
    _measure,
    memcpy_limit,
    mmap_copy_limit,
    naive_pass,
    reader_pass,
    shard_files,
    torch_pass,
)
from shardkit.codecs.onehot import kernel_name

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaled_camvid import replicated_source, source_pairs  # a sibling script module

log = logging.getLogger("bench_peers")

H, W = 352, 480
SAMPLE_BYTES = H * W * 3 + H * W
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "camvid-segnet"
MDS_COLUMNS = {"image": f"ndarray:uint8:{H},{W},3", "label": f"ndarray:uint8:{H},{W}"}

# --------------------------------------------------------------------------------------------- data


def _crop(a: np.ndarray) -> np.ndarray:
    top, left = (a.shape[0] - H) // 2, (a.shape[1] - W) // 2
    return np.ascontiguousarray(a[top : top + H, left : left + W])


def decode_spng(pair: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """The same with libspng (bit-identical pixels), for the decode bound only."""
    import pyspng

    with open(pair[0], "rb") as fh:
        image = pyspng.load(fh.read())
    with open(pair[1], "rb") as fh:
        label = pyspng.load(fh.read())
    return _crop(image), _crop(label)


def decode(pair: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """What every writer stores: RGB uint8 image and uint8 class ids, centre-cropped to 352×480."""
    import cv2

    image = cv2.cvtColor(cv2.imread(pair[0], cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    label = cv2.imread(pair[1], cv2.IMREAD_UNCHANGED)
    return _crop(image), _crop(label)


def _init_worker() -> None:
    """One OpenCV thread per process, as shardkit's workers do. Set in the parent at start-up (main):
    calling setNumThreads in a forked child after the parent's OpenCV pool ran deadlocks it."""
    import cv2

    if cv2.getNumThreads() != 1:
        cv2.setNumThreads(1)


def _halves(items: list[Any], parts: int) -> list[list[Any]]:
    step = math.ceil(len(items) / parts)
    return [items[i : i + step] for i in range(0, len(items), step)]


def _pool(n: int) -> Any:
    return mp.get_context("fork").Pool(n, initializer=_init_worker)


# ------------------------------------------------------------------------------------- writers


def _decode_part(part: list[tuple[str, str]], spng: bool = False) -> int:
    fn = decode_spng if spng else decode
    for pair in part:
        fn(pair)
    return len(part)


def _decode_part_spng(part: list[tuple[str, str]]) -> int:
    return _decode_part(part, True)


def decode_pass(pairs: list[tuple[str, str]], procs: int, spng: bool = False) -> Callable[[], int]:
    def run() -> int:
        if procs == 1:
            return _decode_part(pairs, spng)
        with _pool(procs) as pool:  # chunks of 8 keep both processes busy to the end
            chunks = [pairs[i : i + 8] for i in range(0, len(pairs), 8)]
            return sum(pool.map(_decode_part_spng if spng else _decode_part, chunks))

    return run


def shardkit_convert_pass(src: Path, out: Path, fmt: str, workers: int, shard_size: int) -> Callable[[], int]:
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert

    cfg = ConvertConfig(input=src, output=out, format=fmt, size=(H, W), layout="segnet", workers=workers,
                        shard_size=ShardSize(samples=shard_size), force=True, quiet=True)

    def run() -> int:
        summary = convert(cfg)
        assert summary.shards >= 8 or summary.samples < 8 * shard_size, summary.line()
        return summary.samples

    return run


def shardkit_cli_pass(src: Path, out: Path, fmt: str, workers: int, shard_size: int,
                      tree: Path | None = None) -> Callable[[], int]:
    """The ``shardkit convert`` command in a child process; ``tree``: another source tree of shardkit (``--baseline``)
    put first on its ``PYTHONPATH``."""
    cmd = [sys.executable, "-m", "shardkit", "convert", str(src), str(out), "--format", fmt, "--size",
           f"{H}x{W}", "--layout", "segnet", "--workers", str(workers), "--shard-size", str(shard_size),
           "--force", "-q"]
    n = sum(1 for _ in (src / "train").iterdir())
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}

    def run() -> int:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                       cwd=tree)
        return n

    return run


def _wds_part(args: tuple[int, list[tuple[str, str]], str, int]) -> int:
    import webdataset as wds

    part, pairs, out, shard_size = args
    with wds.ShardWriter(str(Path(out) / f"part{part}-%05d.tar"), maxcount=shard_size, verbose=0) as sink:
        for i, pair in enumerate(pairs):
            image, label = decode(pair)
            sink.write({"__key__": f"{part}_{i:07d}", "image.npy": image, "label.npy": label})
    return len(pairs)


def wds_write_pass(pairs: list[tuple[str, str]], out: Path, procs: int, shard_size: int) -> Callable[[], int]:
    def run() -> int:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        jobs = [(k, part, str(out), shard_size) for k, part in enumerate(_halves(pairs, procs))]
        with _pool(procs) as pool:
            return sum(pool.map(_wds_part, jobs, chunksize=1))

    return run


def _mds_part(args: tuple[int, list[tuple[str, str]], str, int]) -> int:
    from streaming import MDSWriter

    part, pairs, out, shard_size = args
    with MDSWriter(out=str(Path(out) / f"part{part}"), columns=MDS_COLUMNS,
                   size_limit=int(shard_size * SAMPLE_BYTES * 1.02), progress_bar=False) as sink:
        for pair in pairs:
            image, label = decode(pair)
            sink.write({"image": image, "label": label})
    return len(pairs)


def mds_write_pass(pairs: list[tuple[str, str]], out: Path, procs: int, shard_size: int) -> Callable[[], int]:
    from streaming.base.util import merge_index

    def run() -> int:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        jobs = [(k, part, str(out), shard_size) for k, part in enumerate(_halves(pairs, procs))]
        with _pool(procs) as pool:
            n = sum(pool.map(_mds_part, jobs, chunksize=1))
        merge_index(str(out), keep_local=True)
        return n

    return run


def _litdata_sample(pair: tuple[str, str]) -> dict[str, np.ndarray]:
    _init_worker()
    image, label = decode(pair)
    return {"image": image, "label": label}


def litdata_write_pass(pairs: list[tuple[str, str]], out: Path, procs: int,
                       shard_size: int) -> Callable[[], int]:
    import litdata

    def run() -> int:
        shutil.rmtree(out, ignore_errors=True)
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            # fork like the other writers' pools (LitData's default, spawn, re-imports everything per run)
            litdata.optimize(fn=_litdata_sample, inputs=pairs, output_dir=str(out), num_workers=procs,
                             chunk_size=shard_size, mode="overwrite", verbose=False, start_method="fork")
        # optimize() sets the global start method (force=True): give DataLoaders their default back
        mp.set_start_method("fork", force=True)
        return len(pairs)

    return run


# ------------------------------------------------------------------------------------- readers


def _pair(s: Any) -> tuple[np.ndarray, np.ndarray]:
    """(image, label) of one peer sample: a (image, label) tuple or a dict with image* / label* keys."""
    if isinstance(s, dict):
        image, label = (s[k] for k in sorted(s) if k.startswith(("image", "label")))
    else:
        image, label = s[0], s[1]
    return image, label


def _loop(make_iter: Callable[[], Iterable[Any]], limit: int, batch_size: int,
          stack: bool) -> Callable[[], int]:
    """Iterate epochs of a peer's per-sample reader until ``limit`` samples.

    ``stack=False``: each sample's arrays are checked and dropped (the peer's most favourable case).
    ``stack=True``: each sample is copied into a reused (batch, …) buffer, the output shardkit's
    batched reader produces.
    """
    images = np.empty((batch_size, H, W, 3), np.uint8)
    labels = np.empty((batch_size, H, W), np.uint8)

    def run() -> int:
        n = 0
        while n < limit:
            before = n
            for s in make_iter():
                image, label = _pair(s)
                if stack:
                    images[n % batch_size] = image
                    labels[n % batch_size] = label
                elif image.shape != (H, W, 3) or label.shape != (H, W):
                    raise RuntimeError(f"unexpected sample shapes {image.shape}, {label.shape}")
                n += 1
                if n >= limit:
                    break
            if n == before:
                raise RuntimeError("the reader yielded nothing")
        return n

    return run


def _batches(loader: Any, limit: int) -> Callable[[], int]:
    """Iterate epochs of a peer's DataLoader (batches of tensors) until ``limit`` samples."""

    def run() -> int:
        n = 0
        while n < limit:
            before = n
            for b in loader:
                image, _label = _pair(b)
                n += int(image.shape[0])
                if n >= limit:
                    break
            if n == before:
                raise RuntimeError("the loader yielded nothing")
        return n

    return run


Readers = list[tuple[str, Callable[[], int]]]


def _plain(peer: str, make_iter: Callable[[], Iterable[Any]], limit: int, batch_size: int) -> Readers:
    return [(f"{peer}, plain loop, per-sample arrays", _loop(make_iter, limit, batch_size, False)),
            (f"{peer}, plain loop, stacked into a batch", _loop(make_iter, limit, batch_size, True))]


def _collate_np(samples: list[tuple[np.ndarray, np.ndarray]]) -> tuple[Any, Any]:
    import torch

    return (torch.from_numpy(np.stack([s[0] for s in samples])),
            torch.from_numpy(np.stack([s[1] for s in samples])))


def wds_readers(out: Path, limit: int, batch_size: int, seed: int) -> Readers:
    """WebDataset: shard shuffle + its sample shuffle buffer (1000), npy decode."""
    import webdataset as wds

    urls = sorted(str(p) for p in out.glob("*.tar"))

    def dataset() -> Any:
        return (wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False)
                .shuffle(1000).decode().to_tuple("image.npy", "label.npy"))

    loader = wds.WebLoader(dataset().batched(batch_size, collation_fn=_collate_np), batch_size=None,
                           num_workers=2, persistent_workers=True)
    return [*_plain("WebDataset (shuffle buffer 1000)", dataset, limit, batch_size),
            ("WebDataset, WebLoader 2 workers", _batches(loader, limit))]


def mds_readers(out: Path, limit: int, batch_size: int, seed: int) -> Readers:
    """MosaicML Streaming: StreamingDataset(shuffle=True) from the local folder."""
    from streaming import StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    plain = StreamingDataset(local=str(out), shuffle=True, shuffle_seed=seed, batch_size=batch_size)
    loader_ds = StreamingDataset(local=str(out), shuffle=True, shuffle_seed=seed, batch_size=batch_size)
    loader = StreamingDataLoader(loader_ds, batch_size=batch_size, num_workers=2, persistent_workers=True)
    return [*_plain("MosaicML StreamingDataset (shuffle)", lambda: plain, limit, batch_size),
            ("MosaicML StreamingDataLoader 2 workers", _batches(loader, limit))]


def litdata_readers(out: Path, limit: int, batch_size: int, seed: int) -> Readers:
    """LitData: StreamingDataset(shuffle=True), with batch_decode off and at its default ("auto")."""
    import litdata

    fast = litdata.StreamingDataset(str(out), shuffle=True, seed=seed, batch_decode=False)
    default = litdata.StreamingDataset(str(out), shuffle=True, seed=seed)
    loader_ds = litdata.StreamingDataset(str(out), shuffle=True, seed=seed, batch_decode=False)
    loader = litdata.StreamingDataLoader(loader_ds, batch_size=batch_size, num_workers=2, persistent_workers=True)
    return [*_plain("LitData (shuffle, batch_decode=False)", lambda: fast, limit, batch_size),
            ("LitData (shuffle, default batch_decode=auto), plain loop, per-sample arrays",
             _loop(lambda: default, limit, batch_size, False)),
            ("LitData StreamingDataLoader 2 workers (batch_decode=False)", _batches(loader, limit))]


# ------------------------------------------------------------------------------------- imports


def _stub_torchvision() -> None:
    """A stand-in ``torchvision`` with just what ``streaming.vision`` imports (never called here)."""

    def module(name: str, package: bool = False) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
        if package:
            m.__path__ = []
        sys.modules[name] = m
        return m

    class VisionDataset:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("torchvision is a stand-in inside bench_peers.py")

    def to_tensor(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("torchvision is a stand-in inside bench_peers.py")

    tv, datasets = module("torchvision", True), module("torchvision.datasets")
    transforms = module("torchvision.transforms", True)
    functional = module("torchvision.transforms.functional")
    datasets.VisionDataset = datasets.CIFAR10 = VisionDataset  # type: ignore[attr-defined]
    functional.to_tensor = to_tensor  # type: ignore[attr-defined]
    tv.datasets, tv.transforms, transforms.functional = datasets, transforms, functional  # type: ignore[attr-defined]


def import_peers() -> tuple[dict[str, str], list[str]]:
    """Import what is installed → ({peer: version}, notes). LitData first: it must not see a stub."""
    versions: dict[str, str] = {}
    notes: list[str] = []
    for peer, module in (("LitData", "litdata"), ("WebDataset", "webdataset")):
        try:
            versions[peer] = getattr(__import__(module), "__version__", "?")
        except Exception as exc:
            notes.append(f"{peer} skipped: `import {module}` failed ({type(exc).__name__}: {exc})")
    try:
        import streaming

        versions["MosaicML Streaming"] = streaming.__version__
    except Exception as exc:
        if "torchvision" not in repr(exc) and "nms" not in repr(exc):
            notes.append(f"MosaicML Streaming skipped: `import streaming` failed "
                         f"({type(exc).__name__}: {exc})")
        else:
            for name in [m for m in sys.modules if m.split(".")[0] in ("streaming", "torchvision")]:
                del sys.modules[name]
            _stub_torchvision()
            try:
                import streaming

                versions["MosaicML Streaming"] = streaming.__version__
                notes.append("MosaicML Streaming: no loadable torchvision (PyPI has only CUDA builds), so a "
                             "stand-in module was used; only streaming.vision imports it, unused here")
            except Exception as exc2:
                notes.append(f"MosaicML Streaming skipped: `import streaming` failed ({type(exc2).__name__}: "
                             f"{exc2})")
    return versions, notes


# ------------------------------------------------------------------------------------- memory


def peak_rss(cmd: list[str]) -> dict[str, float]:
    """Run ``cmd`` in a fresh wrapper → peak MB of its largest process (getrusage), of its tree (sampled)."""
    import psutil

    wrapper = ("import resource, subprocess, sys\n"
               "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    proc = subprocess.Popen([sys.executable, "-c", wrapper, *cmd], stdout=subprocess.PIPE, text=True)
    tree_peak = [0]
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                total = 0
                for p in root.children(recursive=True):  # the convert process and its workers
                    with contextlib.suppress(psutil.Error):
                        total += p.memory_info().rss
                tree_peak[0] = max(tree_peak[0], total)
            except psutil.Error:
                pass
            done.wait(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    stdout, _ = proc.communicate()
    done.set()
    t.join()
    if proc.returncode:
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}")
    return {"max_process_mb": int(stdout.strip().splitlines()[-1]) / 1024, "tree_mb": tree_peak[0] / 2**20}


# ------------------------------------------------------------------------------------- table


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    try:
        nproc = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)
    except (OSError, subprocess.CalledProcessError, ValueError):
        nproc = os.cpu_count() or 0
    mem = 0.0
    with contextlib.suppress(OSError), open("/proc/meminfo") as fh:
        mem = int(fh.readline().split()[1]) / 2**20
    import torch

    return {"nproc": nproc, "cpu": model or platform.processor(), "mem_gib": round(mem, 1),
            "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform()}


def _ratio(a: float, b: float | None) -> str:
    if not b:
        return ""
    r = a / b
    return f"{r:.2f}×" if r < 10 else f"{r:.0f}×"


def render(res: dict[str, Any]) -> str:
    by: dict[str, Measurement] = {m.name: m for m in res["writes"] + res["reads"]}
    writes, reads = res["writes"], res["reads"]
    peer_w = [m for m in writes if m.note == "peer"]
    peer_r = [m for m in reads if m.note.startswith("peer")]
    best_w = max(peer_w, key=lambda m: m.samples_per_s, default=None)
    best_r = max(peer_r, key=lambda m: m.samples_per_s, default=None)
    dec1, dec2 = by.get("pure decode (cv2.imread ×2 + crop), 1 process"), by.get(
        "pure decode (cv2.imread ×2 + crop), 2 processes")
    naive = by.get("naive online: decode + crop (uint8, ids)")
    naive_hot = by.get("naive online: + float image + float one-hot")
    mmap_lim = by.get("limit: copy out of mmap'd shards, random")
    lines = [
        f"shardkit vs peers — CamVid {res['samples']} samples ({res['pairs']} pairs × {res['replicate']}), "
        f"{H}×{W} uint8 RGB image + uint8 class ids, warm page cache, median of {res['repeats']} "
        f"(after 1 warm-up pass)",
        f"machine: {res['machine']['nproc']} CPUs (nproc), {res['machine']['cpu']}, "
        f"{res['machine']['mem_gib']} GiB RAM, Python {res['machine']['python']}, "
        f"torch {res['machine']['torch']}",
        f"load average (1 min) at start / end: {res['load'][0]:.2f} / {res['load'][1]:.2f} "
        f"(anything else running skews absolute figures; ratios suffer less)",
        f"peers: {', '.join(f'{k} {v}' for k, v in res['peers'].items()) or 'none installed'}",
        f"command: {res['command']}",
        "",
        f"{'measurement':<74} {'samples/s':>10} {'MB/s':>7}  ratios",
    ]
    rule = "-" * 110
    lines += [rule, "WRITE: PNG → shards (same decoded uint8 image + ids per sample)"]
    if best_w is not None:
        lines.append(f"  best peer writer = {best_w.name}")
    lines.append(rule)
    cpu = res.get("write_cpu") or {}
    spng2 = by.get("pure decode, libspng (pyspng) instead of cv2, 2 processes")
    for m in writes:
        parts = []
        procs = 2 if ("2 workers" in m.name or "2 processes" in m.name) else 1
        dec = dec2 if procs == 2 else dec1
        if dec is not None and m is not dec:
            parts.append(f"{_ratio(m.samples_per_s, dec.samples_per_s)} pure decode ({procs}p)")
        if spng2 is not None and procs == 2 and m.note != "decode":
            parts.append(f"{_ratio(m.samples_per_s, spng2.samples_per_s)} libspng decode (2p)")
        if m.name in cpu:
            parts.append(f"{cpu[m.name]:.2f} CPU ms/sample"
                         + (f" ({_ratio(cpu[spng2.name], cpu[m.name])} libspng decode by CPU)"
                            if spng2 is not None and spng2.name in cpu and m is not spng2 else ""))
        if best_w is not None and m.note != "decode" and m is not best_w:
            parts.append(f"{_ratio(m.samples_per_s, best_w.samples_per_s)} best peer writer")
        if "2 workers" in m.name and m.note == "shardkit":
            one = by.get(m.name.replace("2 workers", "1 worker"))
            if one is not None:
                parts.append(f"{_ratio(m.samples_per_s, one.samples_per_s)} 1 worker")
        if m is dec2 and dec1 is not None:
            parts.append(f"{_ratio(m.samples_per_s, dec1.samples_per_s)} 1 process")
        lines.append(f"{m.name:<74} {m.samples_per_s:10.0f} {m.mb_per_s:7.0f}  {' · '.join(parts)}")
    lines += [rule, "READ: random order, uint8 image + ids"]
    if best_r is not None:
        lines.append(f"  best peer reader = {best_r.name} (the fastest of all peer rows)")
    lines.append(rule)
    for m in reads:
        parts = []
        if best_r is not None and not m.note.startswith(("limit", "naive")) and m is not best_r:
            parts.append(f"{_ratio(m.samples_per_s, best_r.samples_per_s)} best peer reader")
        if m.note.startswith(("shardkit", "peer")):
            ref = naive_hot if "one-hot" in m.name else naive
            if ref is not None:
                parts.append(f"{_ratio(m.samples_per_s, ref.samples_per_s)} naive"
                             + (" one-hot" if "one-hot" in m.name else ""))
            if mmap_lim is not None and "one-hot" not in m.name:
                parts.append(f"{100 * m.samples_per_s / mmap_lim.samples_per_s:.0f}% mmap limit")
        lines.append(f"{m.name:<74} {m.samples_per_s:10.0f} {m.mb_per_s:7.0f}  {' · '.join(parts)}")
    if res.get("rss"):
        lines += [rule, "MEMORY: peak RSS of a `shardkit convert` subprocess (npy, 2 workers, same "
                  "--shard-size)", rule]
        rss = res["rss"]
        for r in rss:
            lines.append(f"{r['label']:<74} largest process {r['max_process_mb']:6.0f} MB · "
                         f"process tree {r['tree_mb']:6.0f} MB")
        if len(rss) == 2:
            label = "ratio, " + rss[1]["label"].split(" (")[0] + " / 1× data"
            lines.append(f"{label:<74} largest process "
                         f"{rss[1]['max_process_mb'] / rss[0]['max_process_mb']:.2f}× · "
                         f"process tree {rss[1]['tree_mb'] / rss[0]['tree_mb']:.2f}×")
    lines.append(rule)
    lines += [f"note: {n}" for n in res["notes"]]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SegNet-layout CamVid folder")
    ap.add_argument("--replicate", type=int, default=5, help="use every pair this many times (default 5)")
    ap.add_argument("--repeats", type=int, default=5, help="timed read passes per figure (median shown)")
    ap.add_argument("--write-repeats", type=int, default=5, help="interleaved rounds of timed writes")
    ap.add_argument("--shards", type=int, default=16, help="shards per written dataset (≥ 8; default 16)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--samples", type=int, default=2048, help="samples per timed read pass")
    ap.add_argument("--rss-scale", type=int, default=10, help="peak memory on 1× and this many × the data")
    ap.add_argument("--workdir", type=Path, default=None, help="where to write (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the written datasets")
    ap.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1× data, 1 repeat, short passes")
    ap.add_argument("--write-only", action="store_true",
                    help="only the write section (pure decode, shardkit convert, peer writers): no reads, no memory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline", default=None, metavar="REV",
                    help="also time the CLI convert row with this git revision's code (git archive), same rounds")
    args = ap.parse_args(argv)
    if args.quick:
        args.replicate, args.repeats, args.write_repeats, args.samples, args.rss_scale = 1, 1, 1, 256, 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    # peers' loaders hand read-only arrays to torch.from_numpy in their collate: harmless here
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    for name in ("bench_peers", "shardkit.bench"):
        logging.getLogger(name).setLevel(logging.INFO)
    for name in ("litdata", "streaming", "webdataset"):
        logging.getLogger(name).setLevel(logging.ERROR)
    command = shlex.join([Path(sys.executable).name, *sys.argv]) if argv is None else shlex.join(argv)

    _init_worker()  # before any OpenCV call and any fork (see _init_worker)
    versions, notes = import_peers()
    for n in notes:
        log.warning("%s", n)
    work = Path(tempfile.mkdtemp(prefix="bench-peers-", dir=args.workdir))
    # LitData (chunks/, data/), MDS (index folders, file locks) and multiprocessing put scratch files in
    # the temp folder: keep them inside ours, removed at the end
    scratch = work / "tmp"
    scratch.mkdir()
    os.environ["TMPDIR"] = tempfile.tempdir = str(scratch)
    load = os.getloadavg()[0]
    try:
        res = run(args, work, versions, notes, command)
        res["load"] = [load, os.getloadavg()[0]]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log.info("datasets kept in %s", work)
    text = render(res)
    print(text)
    if args.json:
        doc = {k: v for k, v in res.items() if k not in ("writes", "reads")}
        doc["writes"] = [asdict(m) for m in res["writes"]]
        doc["reads"] = [asdict(m) for m in res["reads"]]
        doc["table"] = text
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by this process and every process it started: the children
    already waited for (``os.times``) plus the live ones (joblib's loky workers persist between runs)."""
    import psutil

    t = os.times()
    live = 0.0
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            c = p.cpu_times()
            live += c.user + c.system
    return t.user + t.system + t.children_user + t.children_system + live


def measure_rounds(jobs: list[tuple[str, Callable[[], int], str]], repeats: int,
                   notes: list[str], cpu: dict[str, float] | None = None) -> list[Measurement]:
    """Like ``shardkit.bench._measure`` for each job, but interleaved: one warm-up pass of every job,
    then ``repeats`` rounds in which every job runs once. On a shared machine a burst of outside load
    then hits one pass of every job rather than all passes of one, so the medians stay comparable.
    Before every timed pass the page cache's dirty data is flushed (untimed): a job that leaves its
    writes unflushed must not slow the next job's writes, or its fsyncs, with that backlog.

    ``cpu`` receives each job's median CPU milliseconds per sample over its whole process tree: on a machine
    shared with other work, this moves far less than samples/s (kernel writeback threads are not counted)."""
    alive = []
    for name, fn, note in jobs:
        try:
            fn()
            alive.append((name, fn, note))
        except Exception as exc:
            notes.append(f"{name}: failed ({type(exc).__name__}: {str(exc)[:200]})")
            log.warning("%s failed: %r", name, exc)
    rates: dict[str, list[float]] = {name: [] for name, _, _ in alive}
    cpu_ms: dict[str, list[float]] = {name: [] for name, _, _ in alive}
    for r in range(repeats):
        for name, fn, _ in alive:
            os.sync()
            c0 = tree_cpu_seconds()
            t = time.perf_counter()
            count = fn()
            rates[name].append(count / max(time.perf_counter() - t, 1e-9))
            cpu_ms[name].append(1000 * (tree_cpu_seconds() - c0) / max(count, 1))
        log.info("write round %d/%d done", r + 1, repeats)
    out = []
    for name, _, note in alive:
        med = statistics.median(rates[name])
        out.append(Measurement(name, med, med * SAMPLE_BYTES / 1e6, rates[name], note))
        if cpu is not None:
            cpu[name] = statistics.median(cpu_ms[name])
        log.info("%-66s %8.0f samples/s  runs %s  cpu ms/sample %s", name, med,
                 " ".join(f"{x:.0f}" for x in rates[name]), " ".join(f"{x:.2f}" for x in cpu_ms[name]))
    return out


def run(args: argparse.Namespace, work: Path, versions: dict[str, str], notes: list[str],
        command: str) -> dict[str, Any]:
    import shardkit

    base = source_pairs(args.data)
    src = work / "src"
    pairs = replicated_source(base, src, args.replicate)
    n = len(pairs)
    shard_size = math.ceil(n / max(args.shards, 8))
    reps, bs = args.repeats, args.batch_size
    limit = max(args.samples, bs)
    out = work / "out"
    writes: list[Measurement] = []
    reads: list[Measurement] = []

    jobs: list[tuple[str, Callable[[], int], str]] = []

    def write(name: str, fn: Callable[[], int], note: str) -> None:
        jobs.append((name, fn, note))

    def read(name: str, fn: Callable[[], int], note: str, nbytes: int = SAMPLE_BYTES) -> None:
        try:
            reads.append(_measure(name, fn, reps, nbytes, note))
        except Exception as exc:
            notes.append(f"{name}: failed ({type(exc).__name__}: {str(exc)[:200]})")
            log.warning("%s failed: %r", name, exc)

    log.info("%d samples (%d pairs × %d), %d per shard, in %s", n, len(base), args.replicate, shard_size,
             work)
    # ---- write
    write("pure decode (cv2.imread ×2 + crop), 1 process", decode_pass(pairs, 1), "decode")
    write("pure decode (cv2.imread ×2 + crop), 2 processes", decode_pass(pairs, 2), "decode")
    try:
        import pyspng  # noqa: F401
    except ImportError:
        notes.append("pyspng is not installed: no libspng decode rows (pip install pyspng)")
    else:
        write("pure decode, libspng (pyspng) instead of cv2, 1 process", decode_pass(pairs, 1, True), "decode")
        write("pure decode, libspng (pyspng) instead of cv2, 2 processes", decode_pass(pairs, 2, True), "decode")
    for fmt in ("npy", "lmdb"):
        for w in (1, 2):
            write(f"shardkit convert {fmt}, {w} worker{'s' if w > 1 else ''}",
                  shardkit_convert_pass(src, out / fmt, fmt, w, shard_size), "shardkit")
    write("shardkit convert npy, 2 workers, CLI subprocess (with start-up)",
          shardkit_cli_pass(src, out / "npy-cli", "npy", 2, shard_size), "shardkit-cli")
    if args.baseline:  # the same command run by an older revision, in the same rounds (before/after)
        tree = work / "baseline"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", args.baseline], check=True, capture_output=True,
                                 cwd=Path(__file__).resolve().parents[1]).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        write(f"shardkit convert npy, 2 workers, CLI subprocess, at {args.baseline}",
              shardkit_cli_pass(src, out / "npy-cli-base", "npy", 2, shard_size, tree), "shardkit-cli")
    peer_writers = [("WebDataset", "WebDataset ShardWriter, 2 processes", wds_write_pass, "wds"),
                    ("MosaicML Streaming", "MosaicML MDSWriter, 2 processes + merge_index", mds_write_pass,
                     "mds"),
                    ("LitData", "LitData optimize, 2 workers", litdata_write_pass, "litdata")]
    for peer, name, make, folder in peer_writers:
        if peer in versions:
            write(name, make(pairs, out / folder, 2, shard_size), "peer")
    write_cpu: dict[str, float] = {}
    writes += measure_rounds(jobs, args.write_repeats, notes, write_cpu)
    if args.write_only:
        return {"samples": n, "pairs": len(base), "replicate": args.replicate, "repeats": args.write_repeats,
                "shard_size": shard_size, "batch_size": bs, "machine": machine(), "peers": versions,
                "command": command, "writes": writes, "reads": reads, "rss": [], "notes": notes,
                "statistics": "median", "write_cpu": write_cpu}
    # The write rounds leave gigabytes of dirty pages; flush them now, or the kernel's writeback would run
    # (and take CPU and memory bandwidth) during the read measurements below.
    log.info("flushing written data to disk before the reads")
    os.sync()
    # ---- read
    for fmt in ("hdf5", "tfrecord"):
        log.info("converting %s for the read figures (not timed)", fmt)
        shardkit_convert_pass(src, out / fmt, fmt, 2, shard_size)()
    npy_ds = shardkit.open(out / "npy" / "train")
    files = shard_files(npy_ds, out / "npy" / "train")
    read("limit: memcpy (RAM → RAM)", memcpy_limit(SAMPLE_BYTES, bs, limit), "limit")
    read("limit: copy out of mmap'd shards, random",
         mmap_copy_limit(files, SAMPLE_BYTES, bs, limit, args.seed), "limit")
    for fmt in ("npy", "lmdb", "hdf5", "tfrecord"):
        ds = shardkit.open(out / fmt / "train")
        read(f"shardkit {fmt} batched (ds.batch, sorted random batches of {bs})",
             reader_pass(ds, bs, limit, True, args.seed), "shardkit")
    onehot = shardkit.open(out / "npy" / "train", labels="float_onehot")
    read(f"shardkit npy float one-hot (host, NHWC, {kernel_name()}), random",
         reader_pass(onehot, bs, limit, True, args.seed),
         "shardkit", H * W * 3 + H * W * onehot.num_classes * 4)
    for w in (0, 2):
        read(f"shardkit torch make_loader, {w} workers",
             torch_pass(out / "npy" / "train", bs, limit, w, args.seed), "shardkit")
    peer_readers = [("WebDataset", wds_readers, "wds"), ("MosaicML Streaming", mds_readers, "mds"),
                    ("LitData", litdata_readers, "litdata")]
    for peer, make, folder in peer_readers:
        if peer in versions and (out / folder).is_dir():
            try:
                for name, fn in make(out / folder, limit, bs, args.seed):
                    read(name, fn, "peer")
            except Exception as exc:
                notes.append(f"{peer} readers: failed ({type(exc).__name__}: {str(exc)[:200]})")
                log.warning("%s readers failed: %r", peer, exc)
    naive_n = max(8, min(40, limit // 8))
    read("naive online: decode + crop (uint8, ids)", naive_pass(npy_ds, naive_n, False), "naive")
    read("naive online: + float image + float one-hot", naive_pass(npy_ds, naive_n, True), "naive",
         H * W * 3 * 4 + H * W * onehot.num_classes * 4)
    # ---- memory
    rss = []
    for times in (1, args.rss_scale):
        root = work / f"rss{times}"
        replicated_source(base, root, times)
        cmd = [sys.executable, "-m", "shardkit", "convert", str(root), str(work / f"rss{times}-out"),
               "--size", f"{H}x{W}", "--layout", "segnet", "--workers", "2", "--shard-size", str(shard_size),
               "--force", "-q"]
        log.info("peak memory: converting %d samples", times * len(base))
        r = peak_rss(cmd)
        r["label"] = f"{times}× data ({times * len(base)} samples)"
        r["samples"] = times * len(base)
        rss.append(r)
        shutil.rmtree(work / f"rss{times}-out", ignore_errors=True)
    notes.append("peer plain loops: 'per-sample arrays' only checks each sample's arrays (most favourable to "
                 "the peer); 'stacked into a batch' copies them into a reused batch buffer, the output "
                 "shardkit's batched reader produces; peer DataLoaders collate batches into tensors")
    notes.append("convert figures include worker start-up; shardkit's in-process runs reuse joblib's loky "
                 "workers after the warm-up pass, the peers' fork a fresh pool per run (fork is cheap); the "
                 "CLI row includes interpreter start-up and imports")
    return {"samples": n, "pairs": len(base), "replicate": args.replicate, "repeats": reps,
            "shard_size": shard_size, "batch_size": bs, "machine": machine(), "peers": versions,
            "command": command, "writes": writes, "reads": reads, "rss": rss, "notes": notes,
            "statistics": "median", "write_cpu": write_cpu}


if __name__ == "__main__":
    sys.exit(main())
