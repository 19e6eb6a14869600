"""Read throughput from a local S3 endpoint through the shard cache, beside local disk, in one run.

Converts a real CamVid split to npy shards on local disk, uploads them to a moto S3 server on
127.0.0.1 (started and stopped here; nothing else is contacted), then times one epoch of
``iter_batches`` for each row and prints samples/s and the ratio to local disk:

* ``local disk``: the local shards (page cache warm, as after conversion), global and buffer shuffle;
* ``s3 cold``: first epoch from the bucket into an empty cache (every shard downloaded, sha256-verified);
* ``s3 warm``: the next epoch on the same cache (no download);
  (local and warm rows: the median of ``--repeats`` epochs, interleaved so that load from other
  processes falls on both alike; cold and limited rows: one epoch each);
* ``s3 cache < split``: a cache limit of ``--limit-fraction`` of the split, an epoch after a first one
  (the stable cached subset hit, the rest read through), with ``shuffle_mode="buffer"`` and a buffer
  of one shard's samples;
* the same with the global shuffle (read-through shards fetched again when revisited);
* ``s3 ranges``: the same split read sample by sample with range requests (``remote_reads="ranges"``, issue 41),
  global and buffer shuffle, with read amplification (bytes fetched ÷ bytes of samples used) and requests per
  batch; the whole-shard rows get their amplification too (bytes of shards downloaded ÷ bytes used).

``--latency-ms`` and ``--mbit`` put a small delaying proxy on 127.0.0.1 in front of moto for the cache-limited and
range rows (each request waits that long before it is forwarded; responses are paced to that bandwidth), which
is what makes the number of requests and of bytes fetched show in samples/s.

The moto server is a single Python process on the same machine: "cold" measures shardkit's download
path against a fast but not S3-like endpoint (no network latency, one Python server thread). Other
agents load this machine's CPUs, so compare the ratios of one run, not absolute numbers across runs.

    python scripts/bench_s3.py [--data ../shared/data/camvid-segnet] [--split train] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import shardkit  # noqa: E402
from shardkit.conversion.config import ConvertConfig, ShardSize  # noqa: E402
from shardkit.conversion.pipeline import convert  # noqa: E402
from shardkit.files.storage import Remote  # noqa: E402
from shardkit.read.cache import read_through_slots  # noqa: E402
from shardkit.testing import local_s3, make_bucket  # noqa: E402


def epoch(ds: shardkit.Dataset, batch_size: int, seed: int, ep: int, mode: str, buffer: int) -> tuple[float, int]:
    """Seconds and samples of one shuffled epoch of batches (every byte touched)."""
    start = time.perf_counter()
    n = 0
    for images, labels in ds.iter_batches(batch_size, shuffle=True, seed=seed, epoch=ep, shuffle_mode=mode,
                                          buffer_size=buffer):
        n += len(images)
        images.sum(dtype="u8")  # make sure every page was read
        labels.max()
    return time.perf_counter() - start, n


#: How an HTTP request's first chunk starts (what :class:`DelayProxy` counts as one request).
_METHODS = (b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")


class DelayProxy:
    """A TCP proxy on 127.0.0.1 that delays each chunk a client sends by ``latency`` seconds (one request, for
    small HTTP requests) and paces what the server sends back to ``bandwidth`` bytes/s (0: unlimited). It counts
    the requests sent through it and the bytes the server sent back (:meth:`reset` sets both to 0)."""

    def __init__(self, target: tuple[str, int], latency: float, bandwidth: float) -> None:
        self.target, self.latency, self.bandwidth = target, latency, bandwidth
        self.requests = self.received = 0
        self._lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, request: bool) -> None:
        try:
            while chunk := src.recv(1 << 16):
                if request:
                    time.sleep(self.latency)
                    with self._lock:
                        self.requests += chunk.startswith(_METHODS)
                else:
                    with self._lock:
                        self.received += len(chunk)
                    if self.bandwidth:
                        time.sleep(len(chunk) / self.bandwidth)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def reset(self) -> None:
        """Start counting requests and response bytes afresh."""
        with self._lock:
            self.requests = self.received = 0

    def close(self) -> None:
        self.sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "camvid-segnet")
    parser.add_argument("--split", default="train")
    parser.add_argument("--size", default="360x480")
    parser.add_argument("--shard-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--limit-fraction", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=5, help="epochs timed (median) for local and warm rows")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added per request (limited and range rows)")
    parser.add_argument("--mbit", type=float, default=0.0, help="response bandwidth in Mbit/s (0: unlimited)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    h, w = (int(v) for v in args.size.split("x"))
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp, local_s3() as endpoint:
        out = Path(tmp) / "shards"
        convert(ConvertConfig(args.data, out, size=(h, w), splits=(args.split,), quiet=True, workers=2,
                              shard_size=ShardSize(samples=args.shard_size)))
        make_bucket("bench")
        remote = Remote(f"s3://bench/shards/{args.split}")
        split_dir = out / args.split
        for p in sorted(split_dir.iterdir()):
            if not p.name.startswith("."):
                remote.upload(p, p.name)
        total = sum(p.stat().st_size for p in split_dir.iterdir() if p.name.endswith(".npy"))
        url = remote.url

        def record(name: str, ds: shardkit.Dataset, seconds: float, n: int) -> None:
            rows.append({"name": name, "samples": n, "seconds": round(seconds, 3),
                         "samples_per_s": round(n / seconds, 1),
                         "mb_per_s": round(total * n / len(ds) / seconds / 1e6, 1),
                         "shards_downloaded_so_far": ds.cache.downloads if ds.cache is not None else 0})

        local = shardkit.open(split_dir)
        cached = shardkit.open(url, cache_dir=Path(tmp) / "cache")
        cold = epoch(cached, args.batch_size, 0, 0, "global", args.shard_size)  # every shard downloaded
        # local disk and the warm cache, interleaved so that load from other processes hits both alike
        steady = {"local disk": (local, "global"), "local disk, buffer shuffle": (local, "buffer"),
                  "s3 warm (cached)": (cached, "global")}
        times: dict[str, list[tuple[float, int]]] = {name: [] for name in steady}
        for r in range(args.repeats + 1):
            for name, (ds, mode) in steady.items():
                t = epoch(ds, args.batch_size, 0, 1, mode, args.shard_size)
                if r:  # the first round only warms the page cache and the readers
                    times[name].append(t)
        for name, (ds, _) in steady.items():
            record(name, ds, *sorted(times[name])[len(times[name]) // 2])
        record("s3 cold (first epoch, downloads)", cached, *cold)
        limit = int(total * args.limit_fraction)
        via: dict[str, object] = {}
        if args.latency_ms or args.mbit:
            host, port = endpoint.rsplit("//", 1)[1].split(":")
            proxy = DelayProxy((host, int(port)), args.latency_ms / 1000, args.mbit * 1e6 / 8)
            via = {"storage_options": {"endpoint_url": proxy.url}}
        for mode in ("buffer", "global"):
            part = shardkit.open(url, cache_dir=Path(tmp) / f"cache-{mode}", cache_limit=limit,
                                 remote_reads="shards", **via)
            epoch(part, args.batch_size, 0, 0, mode, args.shard_size)
            before = part.cache.downloads if part.cache is not None else 0
            record(f"s3 cache {args.limit_fraction:.0%} of split, epoch 2, {mode} shuffle", part,
                   *epoch(part, args.batch_size, 0, 1, mode, args.shard_size))
            downloads = int(rows[-1]["shards_downloaded_so_far"]) - before  # type: ignore[call-overload]
            rows[-1]["downloads_this_epoch"] = downloads
            rows[-1]["amplification"] = round(downloads / len(local.shard_sizes), 2)  # shards of about one size
        for mode in ("global", "buffer"):
            ranged = shardkit.open(url, cache_dir=Path(tmp) / f"cache-ranges-{mode}", cache_limit=limit,
                                   remote_reads="ranges", **via)
            stats = ranged.source.stats  # type: ignore[attr-defined]
            record(f"s3 ranges, {mode} shuffle", ranged, *epoch(ranged, args.batch_size, 0, 0, mode, args.shard_size))
            rows[-1]["amplification"] = round(stats.amplification, 3)
            rows[-1]["requests_per_batch"] = round(stats.requests / max(1, stats.batches), 1)
    base = float(rows[0]["samples_per_s"])  # type: ignore[arg-type]
    print(f"{args.split}: {len(local)} samples, {total / 1e6:.0f} MB of npy shards, batch {args.batch_size}")
    print(f"{len(local.shard_sizes)} shards; read-through slots per process: {read_through_slots()}; "
          f"added latency {args.latency_ms} ms, bandwidth {args.mbit or 'unlimited'} Mbit/s (limited and range rows)")
    print(f"{'row':<48} {'samples/s':>10} {'MB/s':>8} {'x local':>8} {'downloads':>10} {'ampl.':>6} {'req/batch':>9}")
    for r in rows:
        print(f"{r['name']:<48} {r['samples_per_s']:>10} {r['mb_per_s']:>8} "
              f"{float(r['samples_per_s']) / base:>8.2f} {r['shards_downloaded_so_far']:>10}"  # type: ignore[arg-type]
              f" {r.get('amplification', ''):>6} {r.get('requests_per_batch', ''):>9}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
