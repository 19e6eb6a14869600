"""SIGKILL soak test: kill `shardkit convert` at random moments, then check what a cron job would see.

For each trial a conversion is started and killed after a random delay; whatever is published
must verify. A final uninterrupted re-run must then reuse the finished shards and produce output
byte-identical to a reference conversion made without interruption.

    python scripts/kill_soak.py ../shared/data/camvid-segnet --trials 30 --format npy
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shardkit.verify import published_digests, split_folders, verify_split


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--format", default="npy")
    ap.add_argument("--max-delay", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    opts = ["--format", args.format, "--size", "352x480", "--shard-size", "12", "-q"]
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        ref, out = Path(tmp) / "ref", Path(tmp) / "out"
        subprocess.run([sys.executable, "-m", "shardkit", "convert", str(args.raw), str(ref), *opts], check=True)
        bad = 0
        for trial in range(args.trials):
            proc = subprocess.Popen([sys.executable, "-m", "shardkit", "convert", str(args.raw), str(out), *opts])
            delay = rng.uniform(0.05, args.max_delay)
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            for split in split_folders(out):
                report = verify_split(split)
                if not report.ok:
                    bad += 1
                    print(f"trial {trial} (kill after {delay:.2f} s): {split} FAILED {report.problems[:2]}")
        res = subprocess.run([sys.executable, "-m", "shardkit", "convert", str(args.raw), str(out),
                              *opts[:-1]], capture_output=True, text=True, check=True)
        same = all(published_digests(out / s.name) == published_digests(s) for s in split_folders(ref))
        print(f"{args.trials} kills: {bad} published splits failed verify; final re-run: "
              f"{res.stderr.strip().splitlines()[-1]}; byte-identical to the uninterrupted run: {same}")
        return 0 if bad == 0 and same else 1


if __name__ == "__main__":
    sys.exit(main())
