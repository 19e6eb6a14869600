"""Peak memory of converting one huge tiled-TIFF scene with --tile (read window by window), against a small one.

A synthetic SIZExSIZE scene (scripts/tiling_scene.py: textured image and id label as 256x256-tiled zlib TIFFs,
content in a central block, ignore elsewhere) is converted with ``--tile 512x512 --stride 384
--drop-tiles-ignored 0.95 --workers 1`` at the default ``--max-pixels`` (so it is read window by window), in a
child process under ``RLIMIT_AS`` (``--limit-gb``); its peak RSS (``ru_maxrss`` from ``wait4``: the largest of
it and its reaped children) is printed beside a baseline run of a 1024x1024 scene with the same options and the
size the scene would take decoded whole. The last line is JSON (the tests read it). ``--pages N`` writes the
image as N RGB pages and converts with ``--pages-as-bands`` (3N bands); ``--max-pixels`` forces windows on a
small scene.

    PYTHONPATH=$PWD python scripts/tiling_memory.py                # 30000x30000 (2.7 GB RGB + 0.9 GB label)
    PYTHONPATH=$PWD python scripts/tiling_memory.py --size 8000    # what tests/images/test_tiles.py runs
    PYTHONPATH=$PWD python scripts/tiling_memory.py --size 4000 --block 4000 --pages 4 --max-pixels 4000000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiling_scene import IGNORE, IMAGES, LABELS, NUM_CLASSES, write_scene

from shardkit.conversion.config import DEFAULT_MAX_PIXELS

CHILD = f"""
import json, sys
from pathlib import Path
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert
src, out, max_pixels, pages = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
convert(ConvertConfig(src, out, images={IMAGES!r}, labels={LABELS!r}, num_classes={NUM_CLASSES},
                      ignore_index={IGNORE}, max_pixels=max_pixels, pages_as_bands=pages > 1,
                      tile="512x512", stride="384x384", drop_tiles_ignored=0.95, workers=1, quiet=True))
print(json.dumps(json.loads((out / "train" / "manifest.json").read_text())["source"]["tiles"]))
"""


def run_child(src: Path, out: Path, limit_bytes: int, max_pixels: int = DEFAULT_MAX_PIXELS,
              pages: int = 1) -> tuple[float, float, dict[str, int]]:
    """Convert ``src`` into ``out`` in a child under RLIMIT_AS; (peak RSS in MB, seconds, tile counts)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    started = time.perf_counter()
    with tempfile.TemporaryFile() as out_fh, tempfile.TemporaryFile() as err_fh:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(src), str(out), str(max_pixels), str(pages)],
                                stdout=out_fh, stderr=err_fh, preexec_fn=limit, env=os.environ.copy())
        _, status, usage = os.wait4(proc.pid, 0)  # reaped here, so its rusage (peak RSS) is its own
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - started
        out_fh.seek(0)
        err_fh.seek(0)
        stdout, stderr = out_fh.read(), err_fh.read()
    if proc.returncode != 0:
        raise SystemExit(f"convert failed ({proc.returncode}): {stderr.decode()[-2000:]}")
    return usage.ru_maxrss / 1024, seconds, json.loads(stdout.decode().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=30000, help="scene height and width")
    ap.add_argument("--block", type=int, default=2048, help="side of the labelled block in the middle")
    ap.add_argument("--limit-gb", type=float, default=3.0, help="RLIMIT_AS of the converting process")
    ap.add_argument("--pages", type=int, default=1, help="image pages (RGB each), converted with --pages-as-bands")
    ap.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS, help="convert's --max-pixels")
    args = ap.parse_args()
    n, b = args.size, min(args.block, args.size)
    limit = int(args.limit_gb * 2**30)
    with tempfile.TemporaryDirectory(prefix="shardkit-tiling-memory-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        write_scene(root / "big", n, n, block=((n - b) // 2, (n - b) // 2, b, b), pages=args.pages)
        write_scene(root / "small", 1024, 1024, block=(256, 256, 512, 512), pages=args.pages)
        made = time.perf_counter() - started
        base_rss, _, _ = run_child(root / "small", root / "out-small", limit, args.max_pixels, args.pages)
        rss, seconds, counts = run_child(root / "big", root / "out-big", limit, args.max_pixels, args.pages)
        files = sum(p.stat().st_size for p in (root / "big").rglob("*.tif"))
    whole = n * n * (3 * args.pages + 1) / 2**20  # the RGB image (every page) and the uint8 label decoded whole
    print(f"scene {n}x{n}, {args.pages} page(s), --max-pixels {args.max_pixels}: files {files / 2**20:.1f} MB, "
          f"written in {made:.1f} s; decoded whole it would be "
          f"{whole:.0f} MB")
    print(f"convert: {seconds:.1f} s, peak RSS {rss:.0f} MB (baseline 1024x1024: {base_rss:.0f} MB; RLIMIT_AS "
          f"{args.limit_gb} GB); tiles {counts}")
    print(json.dumps({"size": n, "pages": args.pages, "peak_rss_mb": round(rss, 1),
                      "baseline_rss_mb": round(base_rss, 1), "whole_mb": round(whole, 1),
                      "seconds": round(seconds, 2), "tiles_written": counts["written"],
                      "tiles_dropped": counts["dropped_ignored"]}))


if __name__ == "__main__":
    main()
