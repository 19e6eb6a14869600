"""Before/after byte identity: convert the same inputs with two revisions of shardkit and compare every output byte.

    python scripts/byte_identity.py OLD_REV [NEW_REV|worktree] [--inputs camvid,rgb,demo] [--quick] [--jobs N]

Each revision is exported with ``git archive`` into a temporary folder (nothing is checked out in this tree);
``worktree`` (the default NEW) is this checkout as it is, uncommitted edits included; a path to a source tree (a
folder holding ``shardkit/``) is used as is. Each convert runs ``python -m shardkit convert`` in a child process
with ``PYTHONPATH`` set to that tree, on the same input folders, into fresh output folders.

Cases: every format x ``--compression`` x ``--image-codec`` x ``--label-codec`` combination both registries offer
(a combination a revision refuses counts as compared when both refuse it with the same exit code), on each input,
with ``--workers 1``; then, per format (its default codecs), the preprocessing options in ``VARIANTS`` (``--size``
with both resize modes, one-hot and packed labels, 1 and 2 workers over several shards, a byte shard size), on the
first input (``--variant-inputs`` for more). The demo
input is written by each revision's ``shardkit demo`` (those files are compared too) and the OLD one is converted by
both. ``--quick`` keeps the matrix on the small inputs and only the val split of CamVid.

Compared: the exit code, the set of files under the output folder, and every file's bytes, except for these
fields, which depend on when and where a run happened, not on what it wrote:

- ``.shardkit.lock``: the writer's host name and pid (process-dependent by design); only its presence is compared.
- ``.shardkit-unchanged.json`` (the signature an unchanged re-run is checked against, since #30): not compared at
  all. It is the state of a run (paths, every input's and output's stat, the code's files), and older revisions
  write none.
- ``.shard-<key>.json`` (a shard's record for no-op re-runs): each output file's ``stat`` (size, mtime_ns,
  ctime_ns, inode of the file just written: time- and filesystem-dependent; the same record's ``bytes`` and
  ``sha256`` are compared). Everything else in the record is compared.

- ``.fingerprints.json`` (the source-file cache of no-op re-runs): each input file's ``mtime_ns``, ``ctime_ns`` and
  inode (items 1-3 of its entry). Both revisions read the same input files, but these are the files' state, not
  the code's output: another process hard-linking or touching a shared input changes its ctime between the two
  runs (seen on this machine: a CamVid label's link count went from 4 to 5 between OLD's and NEW's run); and its
  checksum, which covers them. Its paths, sizes and sha256 are compared.

Nothing is left out of ``manifest.json``, ``manifest-v<N>.json`` or any shard or sidecar: their differences are
all reported.
HDF5 ``--compression lzf`` is the one setting whose bytes are not promised (formats/hdf5.md: h5py's liblzf starts
its hash table from stack contents); a differing lzf shard is decoded with h5py and reported as "lzf: bytes
differ, decoded identical" when every dataset and attribute is equal, and the manifest's sha256/bytes of that
file are then attributed to it. Whenever a case differs, OLD is run a second time: a file that also differs
between two runs of OLD is marked "unstable (OLD vs OLD too)", i.e. not a change between the revisions.

Exit status: 0 when every case is identical (lzf-decoded-identical counts as identical), 1 when any differs,
2 for a usage error. ``--json FILE`` writes every case and difference.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"

#: name -> (folder under the data root, or None for the demo); extra convert options
INPUTS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "camvid": ("camvid-segnet", ()),
    # its masks hold a colour class_dict.csv lacks (white, shared/data/README.md): mapped to class 0
    "rgb": ("rgb-masks-mini", ("--unknown-as", "0")),
    "demo": (None, ()),
}
#: preprocessing and run options, each converted once per format with its default codecs
VARIANTS: dict[str, tuple[str, ...]] = {
    "size-exact": ("--size", "96x128", "--resize", "exact"),
    "size-shorter-crop": ("--size", "80x80", "--resize", "shorter", "--crop", "center"),
    "onehot": ("--label-encoding", "onehot"),
    "packed": ("--label-encoding", "packed"),
    "shards-1worker": ("--shard-size", "8", "--workers", "1"),
    "shards-2workers": ("--shard-size", "8", "--workers", "2"),
    "bytes-shard-size": ("--shard-size", "2MB"),
}
#: fields of a ``.shard-<key>.json`` record's file entries that are the file's stat, not its content
RECORD_STAT_FIELDS = ("stat",)
LOCK_NAME = ".shardkit.lock"
SIGNATURE_NAME = ".shardkit-unchanged.json"
FINGERPRINTS_NAME = ".fingerprints.json"


# ---------------------------------------------------------------------------------------------------- revisions

@dataclasses.dataclass
class Tree:
    label: str      # what the user passed
    ident: str      # full commit, or "worktree", or the path
    path: Path


def export(rev: str, into: Path) -> Tree:
    """``rev`` as a source tree: this checkout (``worktree``), a folder holding ``shardkit/``, or a git export."""
    if rev == "worktree":
        return Tree(rev, "worktree", REPO)
    as_path = Path(rev)
    if (as_path / "shardkit" / "__init__.py").is_file():
        return Tree(rev, str(as_path.resolve()), as_path.resolve())
    try:
        full = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", rev + "^{commit}"],
                              check=True, capture_output=True, text=True).stdout.strip()
    except subprocess.CalledProcessError:
        raise SystemExit(f"byte_identity: {rev!r} is no commit of {REPO} (nor a source tree, nor 'worktree')") \
            from None
    dest = into / f"src-{full[:12]}"
    if not dest.exists():
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", full, "shardkit"],
                                 check=True, capture_output=True).stdout
        tmp_tar = into / f"{full[:12]}.tar"
        tmp_tar.write_bytes(archive)
        with tarfile.open(tmp_tar) as tar:
            tar.extractall(dest, filter="data")
        tmp_tar.unlink()
    return Tree(rev, full, dest)


def _env(tree: Tree) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDKIT_")}  # no user settings leak in
    env["PYTHONPATH"] = str(tree.path)
    env.pop("PYTHONSTARTUP", None)
    return env


def registry(tree: Tree) -> dict[str, dict[str, list[str]]]:
    """Each format's compressions and image/label codec names, as that tree's registry states them."""
    code = ("import json; from shardkit.formats.registry import all_formats as a; print(json.dumps({f.name: "
            "{'compressions': list(f.compressions), 'image_codecs': list(f.image_codecs), "
            "'label_codecs': list(f.label_codecs)} for f in a()}))")
    out = subprocess.run([sys.executable, "-c", code], env=_env(tree), capture_output=True, text=True,
                         cwd=tempfile.gettempdir())
    if out.returncode:
        raise SystemExit(f"byte_identity: reading the format registry of {tree.label} failed:\n{out.stderr}")
    found: dict[str, dict[str, list[str]]] = json.loads(out.stdout)
    return found


# -------------------------------------------------------------------------------------------------------- cases

@dataclasses.dataclass
class Case:
    name: str
    input: str
    args: tuple[str, ...]

    @property
    def options(self) -> str:
        """The case without its input: a combination one input's run shows both revisions refuse."""
        return self.name.split("/", 1)[1]


def matrix(old: dict[str, dict[str, list[str]]], new: dict[str, dict[str, list[str]]],
           formats: set[str] | None) -> tuple[list[tuple[str, str, str, str]], list[str]]:
    """Every (format, compression, image codec, label codec) both registries offer; and what only one offers."""
    combos: list[tuple[str, str, str, str]] = []
    one_sided: list[str] = []

    def product(reg: dict[str, dict[str, list[str]]]) -> list[tuple[str, str, str, str]]:
        return [(f, c, i, lab) for f, facts in reg.items() for c in facts["compressions"]
                for i in facts["image_codecs"] for lab in facts["label_codecs"]]

    in_old, in_new = product(old), product(new)
    for combo in in_new:
        if formats is not None and combo[0] not in formats:
            continue
        if combo in in_old:
            combos.append(combo)
        else:
            one_sided.append("only NEW offers " + "/".join(combo))
    for combo in in_old:
        if combo not in in_new and (formats is None or combo[0] in formats):
            one_sided.append("only OLD offers " + "/".join(combo))
    return combos, one_sided


def codec_arg(name: str) -> str:
    return "jpeg:90" if name == "jpeg" else name


def cases(inputs: list[str], combos: list[tuple[str, str, str, str]], formats: list[str], quick: bool,
          variant_inputs: set[str]) -> list[Case]:
    out: list[Case] = []
    for inp in inputs:
        extra: tuple[str, ...] = (*INPUTS[inp][1], *(("--split", "val") if quick and inp == "camvid" else ()))
        for fmt, comp, img, lab in combos:
            args = ("--format", fmt, "--compression", comp, "--image-codec", codec_arg(img),
                    "--label-codec", codec_arg(lab), "--workers", "1", *extra)
            out.append(Case(f"{inp}/{fmt}/{comp}/{img}/{lab}", inp, args))
        for fmt in formats if inp in variant_inputs else ():
            for variant, vargs in VARIANTS.items():
                workers = () if "--workers" in vargs else ("--workers", "1")
                out.append(Case(f"{inp}/{fmt}/{variant}", inp, ("--format", fmt, *vargs, *workers, *extra)))
    return out


def run_convert(tree: Tree, src: Path, dest: Path, args: Iterable[str], log: Path) -> int:
    if dest.exists():
        shutil.rmtree(dest)
    cmd = [sys.executable, "-m", "shardkit", "convert", str(src), str(dest), "-q", *args]
    with log.open("wb") as err:
        return subprocess.run(cmd, env=_env(tree), stdout=subprocess.DEVNULL, stderr=err,
                              cwd=tempfile.gettempdir()).returncode


# -------------------------------------------------------------------------------------------------- comparing

@dataclasses.dataclass
class Diff:
    path: str
    kind: str      # only-old, only-new, bytes, manifest, record, npy, exit, lzf-decoded-identical, refusal-text
    detail: str
    unstable: bool = False

    @property
    def counts(self) -> bool:
        """False for a difference that is not a change between the revisions."""
        return self.kind not in ("lzf-decoded-identical", "refusal-text") and not self.unstable


def files_under(root: Path) -> dict[str, Path]:
    if not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def _json_paths(a: Any, b: Any, where: str = "") -> Iterator[str]:
    """JSON paths at which ``a`` and ``b`` differ (list indices as [i])."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            sub = f"{where}.{key}" if where else key
            if key not in a:
                yield f"{sub} (only new: {json.dumps(b[key])[:80]})"
            elif key not in b:
                yield f"{sub} (only old: {json.dumps(a[key])[:80]})"
            else:
                yield from _json_paths(a[key], b[key], sub)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _json_paths(x, y, f"{where}[{i}]")
    elif a != b or type(a) is not type(b):
        yield f"{where}: {json.dumps(a)[:60]} -> {json.dumps(b)[:60]}"


def _collapse(paths: list[str]) -> list[str]:
    """``shards[3].samples.sha256: ..`` lines → one ``shards[*].samples.sha256 (N)`` line per pattern."""
    groups: dict[str, list[str]] = {}
    for p in paths:
        key = re.sub(r"\[\d+\]", "[*]", p.split(":")[0].split(" (")[0])
        groups.setdefault(key, []).append(p)
    return [g[0] if len(g) == 1 else f"{k} ({len(g)} places, e.g. {g[0]})" for k, g in groups.items()]


def _strip_record_stat(rec: Any) -> Any:
    if isinstance(rec, dict):
        for entry in rec.get("files", []) if isinstance(rec.get("files"), list) else []:
            if isinstance(entry, dict):
                for field in RECORD_STAT_FIELDS:
                    entry.pop(field, None)
    return rec


def _strip_source_stat(cache: Any) -> Any:
    """``.fingerprints.json``: each entry ``[size, mtime_ns, ctime_ns, inode, sha256]`` → ``[size, sha256]``; its
    checksum (of the file's bytes, stats included) left out."""
    if isinstance(cache, dict):
        return {k: [v[0], *v[4:]] if isinstance(v, list) and len(v) >= 5 else v for k, v in cache.items()
                if k != "\x00checksum"}
    return cache


def _first_diff(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    for start in range(0, n, 1 << 16):
        if a[start:start + (1 << 16)] != b[start:start + (1 << 16)]:
            return start + next(i for i in range(min(1 << 16, n - start)) if a[start + i] != b[start + i])
    return n


def _npy_detail(a: Path, b: Path) -> str | None:
    """For two differing ``.npy`` files: which fields (structured) or whether the values differ."""
    try:
        import numpy as np

        x, y = np.load(a, allow_pickle=False), np.load(b, allow_pickle=False)
    except Exception:
        return None
    if x.dtype.names and y.dtype.names:
        fx, fy = set(x.dtype.names), set(y.dtype.names)
        parts = []
        if fy - fx:
            parts.append(f"columns only in new: {sorted(fy - fx)}")
        if fx - fy:
            parts.append(f"columns only in old: {sorted(fx - fy)}")
        common = [n for n in x.dtype.names if n in fy]
        changed = [n for n in common if x.shape != y.shape or x.dtype[n] != y.dtype[n]
                   or not np.array_equal(x[n], y[n])]
        parts.append(f"common columns {'differing: ' + str(changed) if changed else 'all equal'}")
        return "; ".join(parts)
    if x.dtype == y.dtype and x.shape == y.shape:
        return "same dtype/shape, values " + ("equal (header differs)" if np.array_equal(x, y) else "differ")
    return f"{x.dtype}{x.shape} -> {y.dtype}{y.shape}"


def _hdf5_equal(a: Path, b: Path) -> bool:
    """Every dataset's values, dtype, shape and every attribute equal (decoded through h5py)."""
    try:
        import h5py
        import numpy as np
    except ImportError:
        return False

    def walk(f: Any) -> dict[str, Any]:
        items: dict[str, Any] = {"/": dict(f.attrs)}
        f.visititems(lambda name, obj: items.__setitem__(name, (obj[()], dict(obj.attrs)) if hasattr(obj, "dtype")
                                                         else dict(obj.attrs)))
        return items

    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        wa, wb = walk(fa), walk(fb)
    if wa.keys() != wb.keys():
        return False

    def same(u: Any, v: Any) -> bool:
        if isinstance(u, tuple):
            return isinstance(v, tuple) and len(u) == len(v) and all(same(p, q) for p, q in zip(u, v, strict=True))
        if isinstance(u, dict):
            return isinstance(v, dict) and u.keys() == v.keys() and all(same(u[k], v[k]) for k in u)
        if isinstance(u, np.ndarray) or isinstance(v, np.ndarray):
            return bool(np.asarray(u).dtype == np.asarray(v).dtype and np.array_equal(u, v))
        return bool(u == v)

    return all(same(wa[k], wb[k]) for k in wa)


def compare(old: Path, new: Path) -> tuple[list[Diff], int, int]:
    """Differences between two output folders; the number of files and of bytes compared."""
    fa, fb = files_under(old), files_under(new)
    for files in (fa, fb):  # a run's state, not its output (see the module notes)
        files.pop(SIGNATURE_NAME, None)
    diffs: list[Diff] = [Diff(p, "only-old", "file only in OLD's output") for p in sorted(fa.keys() - fb.keys())]
    diffs += [Diff(p, "only-new", "file only in NEW's output") for p in sorted(fb.keys() - fa.keys())]
    nbytes = 0
    lzf_files: set[str] = set()
    manifests: list[tuple[str, Any, Any]] = []
    for rel in sorted(fa.keys() & fb.keys()):
        name = rel.rsplit("/", 1)[-1]
        if name == LOCK_NAME:
            continue  # host + pid of the writer
        a, b = fa[rel].read_bytes(), fb[rel].read_bytes()
        nbytes += len(a)
        if name.startswith(".shard-") and name.endswith(".json"):
            try:
                ja, jb = _strip_record_stat(json.loads(a)), _strip_record_stat(json.loads(b))
            except ValueError:
                ja, jb = a, b
            if ja != jb:
                diffs.append(Diff(rel, "record", "; ".join(_collapse(list(_json_paths(ja, jb))))))
            continue
        if a == b:
            continue
        if name == FINGERPRINTS_NAME:
            try:
                ja, jb = _strip_source_stat(json.loads(a)), _strip_source_stat(json.loads(b))
            except ValueError:
                ja, jb = a, b
            if ja != jb:
                diffs.append(Diff(rel, "fingerprints", "; ".join(_collapse(list(_json_paths(ja, jb))))))
            continue
        if name.endswith(".json"):
            try:
                ja, jb = json.loads(a), json.loads(b)
            except ValueError:
                diffs.append(Diff(rel, "bytes", "not JSON"))
                continue
            manifests.append((rel, ja, jb))
            continue
        if name.endswith((".h5", ".hdf5")) and _hdf5_equal(fa[rel], fb[rel]):
            lzf_files.add(rel)
            diffs.append(Diff(rel, "lzf-decoded-identical", "bytes differ, every dataset and attribute decodes equal"))
            continue
        detail = _npy_detail(fa[rel], fb[rel]) if name.endswith(".npy") else None
        off = _first_diff(a, b)
        diffs.append(Diff(rel, "npy" if detail else "bytes",
                          f"{len(a)} -> {len(b)} bytes, first difference at byte {off}" + (f"; {detail}" if detail
                                                                                            else "")))
    for rel, ja, jb in manifests:
        paths = list(_json_paths(ja, jb))
        folder = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
        lzf_names = {f.rsplit("/", 1)[-1] for f in lzf_files if f.startswith(folder)}
        # a differing lzf file's sha256/bytes in the manifest follow from the file itself
        kept = [p for p in paths if not (lzf_names and re.match(r"shards\[\d+\]\.files\[\d+\]\.(sha256|bytes)", p)
                                         and _names_lzf(ja, jb, p, lzf_names))]
        if kept:
            diffs.append(Diff(rel, "manifest", "; ".join(_collapse(kept))))
        elif paths:
            diffs.append(Diff(rel, "lzf-decoded-identical", "only the sha256/bytes of lzf shards above"))
    return diffs, len(fa.keys() & fb.keys()), nbytes


def _names_lzf(ja: Any, jb: Any, path: str, lzf_names: set[str]) -> bool:
    m = re.match(r"shards\[(\d+)\]\.files\[(\d+)\]", path)
    if not m:
        return False
    try:
        return bool(ja["shards"][int(m[1])]["files"][int(m[2])]["name"] in lzf_names)
    except (KeyError, IndexError, TypeError):
        return False


# --------------------------------------------------------------------------------------------------------- main

@dataclasses.dataclass
class Result:
    case: str
    rc_old: int
    rc_new: int
    files: int
    nbytes: int
    diffs: list[Diff]
    seconds: float
    refusal: str = ""  # the last stderr line when both revisions exited non-zero

    @property
    def identical(self) -> bool:
        return self.rc_old == self.rc_new and not any(d.counts for d in self.diffs)

    @property
    def refused(self) -> bool:
        return self.rc_old == self.rc_new != 0


def run_case(case: Case, src: Path, trees: tuple[Tree, Tree], work: Path, keep: bool, control: bool) -> Result:
    t0 = time.perf_counter()
    slug = hashlib.sha1(case.name.encode()).hexdigest()[:10]
    outs = [work / "out" / f"{slug}-{side}" for side in ("old", "new")]
    logs = [work / "logs" / f"{slug}-{side}.log" for side in ("old", "new")]
    rcs = [run_convert(tree, src, out, case.args, log) for tree, out, log in zip(trees, outs, logs, strict=True)]
    diffs, nfiles, nbytes = compare(outs[0], outs[1])
    tails = [(log.read_text(errors="replace").strip().splitlines()[-1:] or [""])[0][:300] for log in logs]
    if rcs[0] != rcs[1]:
        diffs += [Diff("(exit)", "exit", f"{side} exit {rc}: {tail}")
                  for side, rc, tail in zip(("OLD", "NEW"), rcs, tails, strict=True)]
    elif rcs[0] and tails[0] != tails[1]:  # both refused, but say different things: worth a look, not a failure
        diffs.append(Diff("(stderr)", "refusal-text", f"OLD: {tails[0]} | NEW: {tails[1]}"))
    if control and any(d.counts for d in diffs):  # is it the revision, or does OLD differ from itself?
        again = work / "out" / f"{slug}-old2"
        run_convert(trees[0], src, again, case.args, work / "logs" / f"{slug}-old2.log")
        noisy = {d.path for d in compare(outs[0], again)[0]}
        for d in diffs:
            d.unstable = d.path in noisy
        if not keep:
            shutil.rmtree(again, ignore_errors=True)
    if not keep:
        for out in outs:
            shutil.rmtree(out, ignore_errors=True)
    return Result(case.name, rcs[0], rcs[1], nfiles, nbytes, diffs, time.perf_counter() - t0,
                  tails[0] if rcs[0] and rcs[1] else "")


def demo_inputs(trees: tuple[Tree, Tree], work: Path) -> tuple[Path, Result]:
    """Each revision's ``shardkit demo``; its files compared; OLD's is the input both convert."""
    t0 = time.perf_counter()
    dirs = [work / f"demo-{side}" for side in ("old", "new")]
    rcs = []
    for tree, d in zip(trees, dirs, strict=True):
        rcs.append(subprocess.run([sys.executable, "-m", "shardkit", "demo", str(d), "--train", "12", "--val", "4"],
                                  env=_env(tree), capture_output=True, cwd=tempfile.gettempdir()).returncode)
    diffs, nfiles, nbytes = compare(dirs[0], dirs[1])
    return dirs[0], Result("demo generator (shardkit demo --train 12 --val 4)", rcs[0], rcs[1], nfiles, nbytes,
                           diffs, time.perf_counter() - t0)


def _abstract(text: str) -> str:
    text = re.sub(r"[0-9a-f]{12,}", "<hash>", text)
    text = re.sub(r"\b\d+\b", "<n>", text)
    return re.sub(r"^(train|val|test)/", "<split>/", text)


def distinct_differences(results: list[Result]) -> dict[str, list[str]]:
    """Each kind of difference (path and detail with hashes, numbers and split names abstracted) → its cases."""
    kinds: dict[str, list[str]] = {}
    for r in results:
        for d in r.diffs:
            what = _abstract(f"{d.path}: {d.kind}: {d.detail}") + (" [unstable]" if d.unstable else "")
            if r.case not in kinds.setdefault(what, []):
                kinds[what].append(r.case)
    return kinds


def report(results: list[Result], one_sided: list[str], trees: tuple[Tree, Tree]) -> str:
    lines = [f"OLD = {trees[0].label} ({trees[0].ident})", f"NEW = {trees[1].label} ({trees[1].ident})", "",
             "| case | exit old/new | files | MB compared | result |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        if r.refused and r.identical:
            verdict = f"both refuse (exit {r.rc_old})"
        elif r.identical:
            lzf = sum(d.kind == "lzf-decoded-identical" for d in r.diffs)
            verdict = "identical" + (f" (lzf: {lzf} decoded-identical)" if lzf else "")
        else:
            verdict = f"**{sum(d.counts for d in r.diffs)} difference(s)**"
        unstable = sum(d.unstable for d in r.diffs)
        if unstable:
            verdict += f" ({unstable} unstable in OLD itself)"
        lines.append(f"| {r.case} | {r.rc_old}/{r.rc_new} | {r.files} | {r.nbytes / 1e6:.1f} | {verdict} |")
    lines.append("")
    differing = [r for r in results if r.diffs]
    if differing:
        lines.append("Differences:")
        for r in differing:
            for d in r.diffs:
                flag = " [unstable: OLD vs OLD too]" if d.unstable else ""
                lines.append(f"- {r.case}: {d.path}: {d.kind}: {d.detail}{flag}")
        lines.append("")
    kinds = distinct_differences(results)
    if kinds:
        lines.append("Distinct differences (hashes, sizes and split names abstracted), with how many cases show each:")
        lines += [f"- {len(names)} case(s), e.g. {names[0]}: {what}" for what, names in kinds.items()]
        lines.append("")
    refusals: dict[str, list[str]] = {}
    for r in results:
        if r.refused:
            refusals.setdefault(r.refusal, []).append(r.case)
    if refusals:
        lines.append("Refused by both revisions (same exit code), by message:")
        lines += [f"- {len(names)} case(s), e.g. {names[0]}: {msg}" for msg, names in refusals.items()]
        lines.append("")
    for s in one_sided:
        lines.append(f"- not compared: {s}")
    n_same = sum(r.identical and not r.refused for r in results)
    n_refused = sum(r.identical and r.refused for r in results)
    lines.append(f"{n_same} of {len(results)} cases wrote identical output, {n_refused} were refused identically by "
                 f"both, {len(results) - n_same - n_refused} differ; {sum(r.files for r in results)} files, "
                 f"{sum(r.nbytes for r in results) / 1e6:.0f} MB compared.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", help="git revision (or source tree) to compare against")
    ap.add_argument("new", nargs="?", default="worktree", help="git revision, source tree, or 'worktree' (default)")
    ap.add_argument("--inputs", default=",".join(INPUTS), help=f"comma list of {', '.join(INPUTS)}")
    ap.add_argument("--formats", default=None, help="comma list of formats (default: every one in both registries)")
    ap.add_argument("--no-variants", action="store_true", help="only the format x compression x codec matrix")
    ap.add_argument("--quick", action="store_true", help="CamVid's val split only")
    ap.add_argument("--variant-inputs", default=None,
                    help="inputs the VARIANTS run on (comma list; default: the first of --inputs; 'all')")
    ap.add_argument("--no-control", action="store_true",
                    help="do not re-run OLD on a differing case (faster when differences are expected)")
    ap.add_argument("--data", type=Path, default=DATA, help=f"the shared data folder (default {DATA})")
    ap.add_argument("--jobs", type=int, default=1, help="cases run at a time (each runs OLD, then NEW)")
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep every output")
    ap.add_argument("--json", type=Path, default=None, help="write every case and difference here")
    args = ap.parse_args(argv)
    inputs = [s for s in args.inputs.split(",") if s]
    if unknown := [s for s in inputs if s not in INPUTS]:
        ap.error(f"unknown input(s) {unknown}; choose from {list(INPUTS)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still removes its folder
    work = args.keep or Path(tempfile.mkdtemp(prefix="byte-identity-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    try:
        trees = (export(args.old, work), export(args.new, work))
        regs = (registry(trees[0]), registry(trees[1]))
        wanted = set(args.formats.split(",")) if args.formats else None
        combos, one_sided = matrix(*regs, wanted)
        formats = [f for f in regs[1] if f in regs[0] and (wanted is None or f in wanted)]
        vin = set(inputs) if args.variant_inputs == "all" else \
            set((args.variant_inputs or inputs[0]).split(","))
        all_cases = cases(inputs, combos, [] if args.no_variants else formats, args.quick, vin)
        results: list[Result] = []
        sources: dict[str, Path] = {}
        for name in inputs:
            folder, _ = INPUTS[name]
            if folder is None:
                sources[name], demo_result = demo_inputs(trees, work)
                results.append(demo_result)
            else:
                sources[name] = args.data / folder
                if not sources[name].is_dir():
                    raise SystemExit(f"byte_identity: input {sources[name]} not found (--data)")
        print(f"byte_identity: {len(all_cases)} cases, OLD={trees[0].ident[:12]} NEW={trees[1].ident[:12]}, "
              f"work in {work}", file=sys.stderr)
        # options both revisions refuse (exit 2: a usage error, before any input is read) on the first input are
        # not tried again on the others
        first = [c for c in all_cases if c.input == inputs[0]]
        done = 0
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for phase in (first, None):
                if phase is None:
                    refused = {r.case.split("/", 1)[-1] for r in results if r.refused and r.rc_old == 2}
                    phase = [c for c in all_cases if c.input != inputs[0] and c.options not in refused]
                futures = [pool.submit(run_case, c, sources[c.input], trees, work, args.keep is not None,
                                       not args.no_control) for c in phase]
                for fut in futures:
                    r = fut.result()
                    results.append(r)
                    done += 1
                    state = "refused by both" if r.refused and r.identical else \
                        "identical" if r.identical else "DIFFERS"
                    print(f"[{done}] {r.case}: exit {r.rc_old}/{r.rc_new} {state} ({r.seconds:.1f} s)",
                          file=sys.stderr)
                    for d in r.diffs:  # as they come, so that a run stopped early still shows them
                        print(f"    {d.path}: {d.kind}: {d.detail}", file=sys.stderr)
        print(report(results, one_sided, trees))
        if args.json:
            args.json.write_text(json.dumps({"old": dataclasses.asdict(trees[0]) | {"path": str(trees[0].path)},
                                             "new": dataclasses.asdict(trees[1]) | {"path": str(trees[1].path)},
                                             "not_compared": one_sided,
                                             "cases": [dataclasses.asdict(r) | {"identical": r.identical}
                                                       for r in results]}, indent=1, default=str))
        return 0 if all(r.identical for r in results) else 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
