#!/usr/bin/env python
"""Range reads beside whole-shard caching and the peers, from S3 with added latency and bandwidth limits (issue 41).

An optional benchmark (not a test): one run, one process, on the same data. A real CamVid split is converted to npy
shards (``--format``: or LMDB, HDF5, TFRecord) at 360x480 (8 samples per shard, ~5.5 MB), and the very same arrays
(a uint8 RGB image and a uint8 label per sample) are written with MosaicML Streaming's ``MDSWriter`` (shards of
about 8 samples) and LitData's ``optimize`` (chunks of 8 samples). All of it goes to a moto S3 server on 127.0.0.1
(started and stopped here; nothing else is contacted); every reader then reads through a small delaying proxy on
127.0.0.1 (each request waits ``--latency-ms`` before it is forwarded, responses are paced to ``--mbit``), which
counts the requests and the response bytes of every row alike. Each row reads one shuffled epoch in this process
with a cache limit of the split's size ÷ ``--ratio`` (10: the split is 10x the cache):

* shardkit, range reads (``remote_reads="ranges"``), global shuffle and its buffer shuffle (shards in random
  order, samples through a buffer of one shard's samples), batches of ``--batch-size``;
* shardkit, whole shards through the cache (``remote_reads="shards"``), global shuffle and its buffer shuffle;
* MosaicML Streaming ``StreamingDataset(remote=…, cache_limit=…, shuffle=True)`` (its default shuffle), sample by
  sample;
* LitData ``StreamingDataset("s3://…", max_cache_size=…, shuffle=True)``, sample by sample.

The peers' shuffles are theirs: Streaming's default (``py1e``) and LitData's (chunks in random order, samples
shuffled within each chunk) are close to shardkit's buffer shuffle, not to its global shuffle (every batch drawn
from the whole split). Streaming refuses a ``cache_limit`` under 4x its largest shard: it gets that minimum
(the row says so) when the common limit is lower.

Read amplification is the proxy's response bytes during the epoch ÷ the bytes of the samples handed out (so it
counts HTTP headers and whatever index or table a reader fetches); requests per batch is the proxy's request
count ÷ (samples ÷ batch size). Opening each dataset (manifest, index.json) is not timed or counted.

Peers are installed without dependencies (see ``scripts/bench_peers.py``): ``import streaming`` gets the same
torchvision stand-in bench_peers uses (only ``streaming.vision`` touches it). Other processes load this machine's
CPUs: compare the ratios of one run, not absolute numbers across runs.

    python scripts/bench_ranges_peers.py --latency-ms 20 --mbit 400 [--split train] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from bench_s3 import DelayProxy  # noqa: E402  (a sibling script module)

import shardkit  # noqa: E402
from shardkit.conversion.config import ConvertConfig, ShardSize  # noqa: E402
from shardkit.conversion.pipeline import convert  # noqa: E402
from shardkit.files.storage import Remote  # noqa: E402
from shardkit.testing import local_s3, make_bucket  # noqa: E402

log = logging.getLogger("bench_ranges_peers")


def upload_folder(folder: Path, url: str) -> None:
    """Every file under ``folder`` to ``url`` (relative names kept)."""
    remote = Remote(url)
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.name.startswith("."):
            remote.upload(p, str(p.relative_to(folder)))


def write_mds(ds: shardkit.Dataset, out: Path, per_shard: int) -> None:
    from streaming import MDSWriter

    h, w = ds.spec.size  # type: ignore[misc]
    columns = {"image": f"ndarray:uint8:{h},{w},3", "label": f"ndarray:uint8:{h},{w}"}
    sample = h * w * 4
    with MDSWriter(out=str(out), columns=columns, size_limit=int(per_shard * sample * 1.02),
                   progress_bar=False) as sink:
        for i in range(len(ds)):
            image, label = ds[i]
            sink.write({"image": np.ascontiguousarray(image), "label": np.ascontiguousarray(label)})


def _litdata_item(args: tuple[str, int]) -> dict[str, np.ndarray]:
    folder, i = args
    image, label = shardkit.open(folder)[i]
    return {"image": np.ascontiguousarray(image), "label": np.ascontiguousarray(label)}


def write_litdata(folder: Path, n: int, out: Path, per_chunk: int) -> None:
    import litdata

    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        litdata.optimize(fn=_litdata_item, inputs=[(str(folder), i) for i in range(n)], output_dir=str(out),
                         num_workers=1, chunk_size=per_chunk, mode="overwrite", verbose=False,
                         start_method="fork")


def timed(samples: Callable[[], Iterable[tuple[Any, Any]]], proxy: DelayProxy) -> tuple[float, int, int, int]:
    """Seconds, samples, proxy requests and response bytes of one pass over ``samples()`` (every byte touched)."""
    proxy.reset()
    start = time.perf_counter()
    n = 0
    for image, label in samples():
        n += len(image) if getattr(image, "ndim", 3) == 4 else 1
        np.asarray(image).sum(dtype="u8")
        np.asarray(label).max()
    return time.perf_counter() - start, n, proxy.requests, proxy.received


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "camvid-segnet")
    parser.add_argument("--split", default="train")
    parser.add_argument("--format", default="npy", choices=("npy", "lmdb", "hdf5", "tfrecord"),
                        help="shardkit's shard format (one object per shard for lmdb, hdf5: one request per sample)")
    parser.add_argument("--shard-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--ratio", type=float, default=10.0, help="split size ÷ cache limit")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--mbit", type=float, default=400.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_peers import import_peers

    versions, notes = import_peers()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ranges-peers-") as tmp_name, local_s3() as endpoint:
        tmp = Path(tmp_name)
        convert(ConvertConfig(args.data, tmp / "shards", format=args.format, size=(360, 480), splits=(args.split,),
                              quiet=True, workers=2, shard_size=ShardSize(samples=args.shard_size)))
        local_dir = tmp / "shards" / args.split
        local = shardkit.open(local_dir)
        sample_bytes = 360 * 480 * 4
        split_bytes = len(local) * sample_bytes
        limit = int(split_bytes / args.ratio)
        make_bucket("bench")
        upload_folder(local_dir, "s3://bench/shardkit")
        if "MosaicML Streaming" in versions:
            write_mds(local, tmp / "mds", args.shard_size)
            upload_folder(tmp / "mds", "s3://bench/mds")
        if "LitData" in versions:
            write_litdata(local_dir, len(local), tmp / "litdata", args.shard_size)
            upload_folder(tmp / "litdata", "s3://bench/litdata")
        host, port = endpoint.rsplit("//", 1)[1].split(":")
        proxy = DelayProxy((host, int(port)), args.latency_ms / 1000, args.mbit * 1e6 / 8)
        os.environ["AWS_ENDPOINT_URL"] = os.environ["S3_ENDPOINT_URL"] = proxy.url  # the peers' boto3 clients
        via = {"endpoint_url": proxy.url}

        def record(name: str, result: tuple[float, int, int, int], **extra: Any) -> None:
            seconds, n, requests, received = result
            rows.append({"name": name, "samples": n, "seconds": round(seconds, 2),
                         "samples_per_s": round(n / seconds, 1),
                         "amplification": round(received / (n * sample_bytes), 2),
                         "requests_per_batch": round(requests / (n / args.batch_size), 1), **extra})
            log.warning("%s", rows[-1])

        def batches(ds: shardkit.Dataset, mode: str) -> Callable[[], Iterable[tuple[Any, Any]]]:
            return lambda: ds.iter_batches(args.batch_size, shuffle=True, seed=0, epoch=0, shuffle_mode=mode,
                                           buffer_size=args.shard_size)

        for mode in ("global", "buffer"):
            ranged = shardkit.open("s3://bench/shardkit", cache_dir=tmp / f"c-ranges-{mode}", cache_limit=limit,
                                   remote_reads="ranges", storage_options=via)
            record(f"shardkit range reads, {mode} shuffle", timed(batches(ranged, mode), proxy),
                   counted_amplification=round(ranged.source.stats.amplification, 3))  # type: ignore[attr-defined]
        for mode in ("global", "buffer"):
            whole = shardkit.open("s3://bench/shardkit", cache_dir=tmp / f"c-shards-{mode}", cache_limit=limit,
                                  remote_reads="shards", storage_options=via)
            record(f"shardkit whole shards, {mode} shuffle", timed(batches(whole, mode), proxy))
        if "MosaicML Streaming" in versions:
            from streaming import StreamingDataset

            largest = max(p.stat().st_size for p in (tmp / "mds").glob("shard.*.mds"))
            mds_limit = max(limit, 4 * largest)  # Streaming refuses less than 4x its largest shard
            mds = StreamingDataset(remote="s3://bench/mds", local=str(tmp / "c-mds"), shuffle=True,
                                   shuffle_seed=0, cache_limit=mds_limit, batch_size=args.batch_size)
            record(f"MosaicML Streaming {versions['MosaicML Streaming']} (cache_limit "
                   f"{mds_limit / 1e6:.1f} MB)", timed(lambda: ((s["image"], s["label"]) for s in mds), proxy),
                   cache_limit=mds_limit)
        if "LitData" in versions:
            import litdata

            lit = litdata.StreamingDataset("s3://bench/litdata", cache_dir=str(tmp / "c-litdata"), shuffle=True,
                                           seed=0, max_cache_size=limit,
                                           storage_options={"endpoint_url": proxy.url})
            record(f"LitData {versions['LitData']} (max_cache_size {limit / 1e6:.1f} MB)",
                   timed(lambda: ((s["image"], s["label"]) for s in lit), proxy))
        proxy.close()
    whole_rate = next(r["samples_per_s"] for r in rows if r["name"] == "shardkit whole shards, global shuffle")
    print(f"{args.split}: {len(local)} samples of 360x480 (uint8 RGB + uint8 label), {split_bytes / 1e6:.1f} MB, "
          f"shardkit as {args.format}; "
          f"cache limit {limit / 1e6:.1f} MB (split ÷ {args.ratio:g}); shards/chunks of {args.shard_size} samples; "
          f"batch {args.batch_size}; proxy: +{args.latency_ms:g} ms per request, {args.mbit:g} Mbit/s")
    for note in notes:
        print(note)
    print(f"{'row':<52} {'samples/s':>9} {'x whole':>8} {'ampl.':>6} {'req/batch':>9}")
    for r in rows:
        print(f"{r['name']:<52} {r['samples_per_s']:>9} {r['samples_per_s'] / whole_rate:>8.2f} "
              f"{r['amplification']:>6} {r['requests_per_batch']:>9}")
    if args.json:
        args.json.write_text(json.dumps({"versions": versions, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
