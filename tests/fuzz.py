"""Seeded, bounded fuzzing of stored splits: flip bits in and truncate shard files, samples sidecars and manifests,
then open, read, batch, ``info``, ``show`` and ``verify`` them in a child process with a memory limit.

The child (``python -m tests.fuzz CHILD ...``) runs every case in one process under ``RLIMIT_AS`` (its size
after imports plus ``--budget``), printing ``CASE k`` before a case and one JSON line after it. The parent
(:func:`run`) reads those lines: a child that dies by a signal, exits without finishing, or reports a traceback
or a multi-line error fails the case it was in; the parent then restarts the child after that case. Used by
``tests/test_hostile.py`` (a few hundred cases, seconds) and ``scripts/fuzz_shards.py`` (as many as asked for).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 1 << 30  # bytes of address space a case may add to the child's size after imports


@dataclass
class Outcome:
    """What the cases found: how many ran, and every failure (case, what happened)."""

    cases: int = 0
    failures: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # one-line error kinds seen, for the report


def _targets(split: Path) -> list[str]:
    """Every file a split's manifest names, and the manifest."""
    m = json.loads((split / "manifest.json").read_text())
    names = ["manifest.json"]
    for shard in m["shards"]:
        names += [f["name"] for f in shard["files"]]
        if "samples" in shard:
            names.append(shard["samples"]["name"])
    return names


def refresh_manifest(split: Path) -> None:
    """Recompute every file's size and sha256 in the manifest, as an attacker (or a careless tool) would."""
    path = split / "manifest.json"
    m = json.loads(path.read_text())
    for shard in m["shards"]:
        for f in [*shard["files"], *([shard["samples"]] if "samples" in shard else [])]:
            data = (split / f["name"]).read_bytes()
            f["bytes"], f["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    path.write_text(json.dumps(m))


def mutate(split: Path, rng: np.random.Generator) -> str:
    """Damage one file of ``split`` in place (bit flips, a zeroed run or a truncation; structure-heavy spots
    favoured: the first and last 4 KiB and page headers), refreshing the manifest's hashes most of the time.
    Returns what was done."""
    names = _targets(split)
    name = names[int(rng.integers(len(names)))]
    path = split / name
    data = bytearray(path.read_bytes())
    kind = ["flip", "flip", "flip", "zero", "truncate"][int(rng.integers(5))]
    if not data:
        kind = "truncate"
    if kind == "truncate":
        cut = int(rng.integers(0, max(1, len(data))))
        del data[cut:]
        what = f"truncate {name} to {cut}"
    else:
        spots = []
        for _ in range(int(rng.integers(1, 9)) if kind == "flip" else 1):
            region = int(rng.integers(4))
            if region == 0:
                at = int(rng.integers(0, min(len(data), 4096)))
            elif region == 1:
                at = len(data) - 1 - int(rng.integers(0, min(len(data), 4096)))
            elif region == 2 and len(data) > 4096:
                at = min(len(data) - 1, 4096 * int(rng.integers(0, len(data) // 4096 + 1)) + int(rng.integers(0, 48)))
            else:
                at = int(rng.integers(0, len(data)))
            spots.append(at)
            if kind == "flip":
                data[at] ^= 1 << int(rng.integers(8))
            else:
                data[at : at + 64] = bytes(len(data[at : at + 64]))
        what = f"{kind} {name} at {spots}"
    path.write_bytes(bytes(data))
    if name != "manifest.json" and rng.random() < 0.8:
        try:
            refresh_manifest(split)
            what += " (manifest refreshed)"
        except (ValueError, KeyError, TypeError, OSError):
            pass
    return what


#: (name, convert options) of the splits fuzzed: every format, fixed and variable size, each codec family.
SPLITS: dict[str, dict[str, Any]] = {
    "npy-fixed": {"format": "npy", "size": (24, 32)},
    "npy-var": {"format": "npy"},
    "lmdb-fixed": {"format": "lmdb", "size": (48, 64)},
    "lmdb-var-zstd": {"format": "lmdb", "image_codec": "zstd", "label_codec": "lz4"},
    "lmdb-fixed-jpeg": {"format": "lmdb", "size": (48, 64), "image_codec": "jpeg:90"},
    "hdf5-fixed-gzip": {"format": "hdf5", "size": (24, 32), "compression": "gzip"},
    "hdf5-var-lzf": {"format": "hdf5", "compression": "lzf"},
    "hdf5-fixed-zstd": {"format": "hdf5", "size": (24, 32), "image_codec": "zstd", "label_codec": "lz4"},
    "hdf5-var": {"format": "hdf5"},
    "tfrecord-var-gzip": {"format": "tfrecord", "compression": "gzip"},
    "tfrecord-fixed-png": {"format": "tfrecord", "size": (24, 32), "image_codec": "png"},
}


def camvid_subset(camvid_root: Path, src: Path, pairs: int) -> Path:
    """An input folder (``val``, ``valannot``) linking the first ``pairs`` real CamVid val pairs."""
    for sub in ("val", "valannot"):
        (src / sub).mkdir(parents=True, exist_ok=True)
    for name in sorted(p.name for p in (camvid_root / "val").iterdir())[:pairs]:
        for sub in ("val", "valannot"):
            link = src / sub / name
            if not link.exists():
                link.symlink_to(camvid_root / sub / name)
    return src


def build_splits(camvid_root: Path, out: Path, names: list[str] | None = None, pairs: int = 3) -> dict[str, Path]:
    """The first ``pairs`` CamVid val pairs (real data, linked) converted as each of :data:`SPLITS`, two samples
    per shard; variable-size splits keep the stored 360x480."""
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert

    src = camvid_subset(camvid_root, out / "input", pairs)
    splits = {}
    for name in names or list(SPLITS):
        convert(ConvertConfig(src, out / name, splits=("val",), workers=0, quiet=True,
                              shard_size=ShardSize(samples=2), **SPLITS[name]))
        splits[name] = out / name / "val"
    return splits


def _exercise(split: Path, tmp: Path) -> list[str]:
    """Everything a user does with a split; the one-line errors met (``Class: message``). A traceback raises."""
    from click.testing import CliRunner

    import shardkit
    from shardkit.cli import main
    from shardkit.errors import ShardkitError
    from shardkit.verify import verify_split

    seen: list[str] = []

    def one_line(exc: BaseException) -> None:
        text = str(exc)
        if "\n" in text.strip():
            raise AssertionError(f"multi-line error: {text!r}")
        seen.append(type(exc).__name__)

    try:
        ds = shardkit.open(split)
        for i in range(len(ds)):
            try:
                ds[i]
            except ShardkitError as exc:
                one_line(exc)
        if ds.manifest.sample["image"]["shape"][0] is not None:
            try:
                ds.batch(np.arange(len(ds)))
            except ShardkitError as exc:
                one_line(exc)
    except ShardkitError as exc:
        one_line(exc)
    report = verify_split(split)
    for problem in report.problems:
        if "\n" in problem.strip():
            raise AssertionError(f"multi-line verify problem: {problem!r}")
    runner = CliRunner()
    for args in (["info", str(split)], ["show", str(split), "-o", str(tmp / "show.png")], ["verify", str(split)]):
        result = runner.invoke(main, args, catch_exceptions=True)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"{args[0]}: {''.join(traceback.format_exception(result.exception))[-1500:]}")
        if "Traceback" in result.output:
            raise AssertionError(f"{args[0]} printed a traceback: {result.output[-1500:]}")
        if args[0] == "verify" and result.exit_code not in (0, 1, 2):
            raise AssertionError(f"verify exited {result.exit_code}: {result.output[-300:]}")
    return seen


def _say(line: str) -> None:
    """One line to the parent, flushed at once (a case that kills the child is then known)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _child(srcs: list[Path], seed: int, start: int, stop: int, budget: int, tmp: str) -> None:
    import shardkit.cli  # everything imported before the limit is set
    import shardkit.verify  # noqa: F401

    with open("/proc/self/statm") as fh:
        size = int(fh.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + budget, size + budget))
    # ``tmp`` is the parent's: a child killed by a signal leaves nothing behind
    for k in range(start, stop):
        rng = np.random.default_rng([seed, k])
        work = Path(tmp) / "split"
        shutil.rmtree(work, ignore_errors=True)
        src = srcs[k % len(srcs)]
        shutil.copytree(src, work)
        what = f"{src.parent.name}: {mutate(work, rng)}"
        _say(f"CASE {k} {what}")
        try:
            seen = _exercise(work, Path(tmp))
            _say(json.dumps({"case": k, "ok": True, "errors": seen}))
        except BaseException as exc:  # reported to the parent, which fails the case
            text = "".join(traceback.format_exception(exc))[-3000:]
            _say(json.dumps({"case": k, "ok": False, "what": what, "error": text}))


def run(srcs: list[Path], seed: int, cases: int, budget: int = BUDGET, timeout: float = 600) -> Outcome:
    """Run ``cases`` seeded cases, case ``k`` against a damaged copy of split ``srcs[k % len(srcs)]``, all in one
    child process (a new one after a case that kills it); every failure named in the result."""
    out, k = Outcome(), 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHARDKIT_DECODE_THREADS": "2"}
    while k < cases:
        with tempfile.TemporaryDirectory(prefix="shardkit-fuzz-") as tmp:
            proc = subprocess.run([sys.executable, "-m", "tests.fuzz", "CHILD", json.dumps([str(p) for p in srcs]),
                                   str(seed), str(k), str(cases), str(budget), tmp],
                                  capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
        current, what = None, ""
        for line in proc.stdout.splitlines():
            if line.startswith("CASE "):
                current, what = int(line.split()[1]), line
            elif line.startswith("{"):
                rec: dict[str, Any] = json.loads(line)
                out.cases += 1
                current = None
                if rec["ok"]:
                    for e in rec["errors"]:
                        out.errors[e] = out.errors.get(e, 0) + 1
                else:
                    out.failures.append(f"{rec['what']}: {rec['error']}")
        if proc.returncode == 0 and current is None:
            break
        stuck = current if current is not None else k
        out.cases += 1
        out.failures.append(f"{what or f'case {stuck}'}: child exited {proc.returncode} "
                            f"(signal {-proc.returncode if proc.returncode < 0 else 'none'}); "
                            f"stderr: {proc.stderr[-800:]}")
        k = stuck + 1
    return out


if __name__ == "__main__" and len(sys.argv) == 8 and sys.argv[1] == "CHILD":
    _child([Path(p) for p in json.loads(sys.argv[2])], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
           int(sys.argv[6]), sys.argv[7])
