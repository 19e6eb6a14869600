"""Fuzz stored splits: flipped bits, zeroed runs and truncations in every format's shard files, samples sidecars
and manifests, each case read, batched, ``info``-ed, ``show``-n and ``verify``-ed in a child process under a
memory limit (``tests/fuzz.py``). Reports every case that ended in a signal, a traceback, a multi-line error or
a MemoryError; exit 1 if any did.

    python scripts/fuzz_shards.py --cases 1100 --seed 1   # ~10 minutes on 2 cores; CI runs 55 (tests/test_hostile.py)

Needs the real test data (``../shared/data`` or ``SHARDKIT_TEST_DATA``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fuzz import BUDGET, SPLITS, build_splits, run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=1100, help="cases in all (spread over the splits)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--budget-mb", type=int, default=BUDGET >> 20, help="address space a case may add (MiB)")
    ap.add_argument("--splits", default=",".join(SPLITS), help="comma-separated names from tests/fuzz.py SPLITS")
    args = ap.parse_args()
    data = Path(os.environ.get("SHARDKIT_TEST_DATA", ROOT.parent / "shared" / "data"))
    with tempfile.TemporaryDirectory(prefix="shardkit-fuzz-splits-") as tmp:
        splits = build_splits(data / "camvid-segnet", Path(tmp), args.splits.split(","))
        t0 = time.perf_counter()
        outcome = run(list(splits.values()), args.seed, args.cases, args.budget_mb << 20, timeout=3600)
        took = time.perf_counter() - t0
    sys.stdout.write(f"{outcome.cases} cases over {len(splits)} splits in {took:.0f} s; one-line errors met: "
                     f"{outcome.errors}; failures: {len(outcome.failures)}\n")
    for failure in outcome.failures:
        sys.stdout.write(f"\n--- {failure}\n")
    return 1 if outcome.failures else 0


if __name__ == "__main__":
    sys.exit(main())
