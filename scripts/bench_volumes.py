"""Time and peak memory of converting NIfTI volume cases into slices, side by side with nibabel decoding the same files.

A volume set is written to a temporary nnU-Net tree: ``--cases`` synthetic CT cases (``--depth`` slices of 512x512
int16 "HU" with smooth anatomy-like structure and a uint8 label sphere, spacing 0.7 x 0.7 x 2.5 mm, ``.nii.gz``),
or with ``--real`` the real volumes of tests/data/nifti (nibabel's T1 33x41x25 ``.nii`` and its ``.nii.gz`` label,
copied as ``--cases`` cases). Then, each in a fresh child process (peak RSS = that child's ``VmHWM``, its worker
processes not included; CPU = its user + system time, its worker processes included):

- ``nibabel``: ``np.asanyarray(nib.load(p).dataobj)`` of every image and label (the decode alone, one process;
  nibabel inflates with Python's own gzip/zlib);
- ``slices K``: :func:`shardkit.conversion.volumes.cut_split` with ``context`` K (synthetic set only);
- ``convert``: ``shardkit convert`` of the tree (``--format``, default npy): ``--workers 1`` with python-isal's
  inflater where installed (shardkit's default), ``--workers 1`` with Python's gzip (``FAST_GZIP`` off: the same
  inflater nibabel uses), and the default worker count (every core; with isal);
- ``read``: 200 random slices (image and label) read from the shards (``shardkit.open``);
- ``nibabel-slice``: 10 random slices, each loaded from the ``.nii.gz`` files by nibabel's array proxy (it
  decompresses up to the slice) — the per-access cost the shards replace (synthetic set only).

The load average before and after is printed (the machine may be shared: then compare CPU seconds too, and the
ratios of one run). Throughput: image voxels per second; convert / nibabel ratios in wall and CPU time. The last
line is JSON.

    PYTHONPATH=$PWD python scripts/bench_volumes.py --format lmdb              # one 512 x 512 x 600 CT
    PYTHONPATH=$PWD python scripts/bench_volumes.py --format lmdb --cases 4 --depth 150
    PYTHONPATH=$PWD python scripts/bench_volumes.py --format lmdb --real --cases 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path
import numpy as np
root, what, fmt = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
def hwm():  # this process's peak RSS in kB (VmHWM: ru_maxrss would include the forking parent's)
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM")))
def cpu():  # user + system seconds of this process and its finished children (the convert's workers)
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
def pairs():
    for image in sorted((root / "imagesTr").iterdir()):
        yield image, root / "labelsTr" / (image.name.split("_0000")[0] + ".nii.gz")
base, c0 = hwm(), cpu()
t = time.perf_counter()
voxels = 0
if what == "nibabel":
    import nibabel as nib
    n = 0
    for image, label in pairs():
        arrays = [np.asanyarray(nib.load(str(p)).dataobj) for p in (image, label)]
        n += arrays[0].shape[2]
        voxels += arrays[0].size
elif what.startswith("convert"):  # into ROOT/../<what>, each its own folder ("read" opens ../convert)
    import shardkit.volumes.nifti as nifti
    from shardkit.conversion.config import ConvertConfig
    from shardkit.conversion.pipeline import convert
    nifti.FAST_GZIP = what != "convert-gzip"
    workers = 0 if what == "convert-all" else 1
    n = convert(ConvertConfig(root, root.parent / what, workers=workers, quiet=True, format=fmt)).samples
    if workers != 1:  # loky keeps its worker processes: ended and reaped here, so their CPU time is counted
        from joblib.externals.loky import get_reusable_executor
        get_reusable_executor().shutdown(wait=True)
elif what == "read":  # random slices from the shards
    import shardkit
    ds = shardkit.open(root.parent / "convert" / "train")
    picks = np.random.default_rng(0).integers(0, len(ds), 200)
    for i in picks:
        image, label = ds[int(i)]
    n = len(picks)
elif what == "nibabel-slice":  # a random slice per access, decoded from the .nii.gz by nibabel's proxy
    import nibabel as nib
    image, label = next(pairs())
    depth = nib.load(str(image)).shape[2]
    picks = np.random.default_rng(0).integers(0, depth, 10)
    for k in picks:
        a = np.asanyarray(nib.load(str(image)).dataobj[:, :, int(k)])
        b = np.asanyarray(nib.load(str(label)).dataobj[:, :, int(k)])
    n = len(picks)
else:
    from shardkit.conversion.layouts.volumes import detect
    from shardkit.conversion.volumes import VolumeRun, cut_split
    from shardkit.volumes.slices import Slicing
    layout = detect(root)
    run = VolumeRun(Slicing(context=int(what)))
    n = sum(1 for s in cut_split(layout, "train", run.slicing, run))
seconds = time.perf_counter() - t
peak = hwm()
print(json.dumps({"what": what, "seconds": seconds, "cpu": cpu() - c0, "slices": n, "peak_mb": peak / 1024,
                  "base_mb": base / 1024, "voxels": voxels}))
"""


def write_case(root: Path, depth: int, name: str = "ct", seed: int = 0) -> None:
    """A 512 x 512 x ``depth`` int16 CT-like volume and a uint8 label sphere, as a case of an nnU-Net tree."""
    import nibabel as nib

    (root / "imagesTr").mkdir(parents=True, exist_ok=True)
    (root / "labelsTr").mkdir(exist_ok=True)
    y, x = np.mgrid[-256:256, -256:256].astype(np.float32)
    body = (x / 200) ** 2 + (y / 150) ** 2 < 1
    rng = np.random.default_rng(seed)
    ct = np.empty((512, 512, depth), np.int16)
    label = np.zeros((512, 512, depth), np.uint8)
    for z in range(depth):
        organ = ((x - 40) ** 2 + (y + 20) ** 2) < (60 * np.sin(np.pi * (z + 1) / (depth + 1))) ** 2
        plane = np.where(body, 40, -1000) + np.where(organ, 60, 0)
        ct[:, :, z] = plane + rng.integers(-20, 20, (512, 512), dtype=np.int16)
        label[:, :, z] = organ
    affine = np.diag([0.7, 0.7, 2.5, 1.0])
    nib.save(nib.Nifti1Image(ct, affine), str(root / "imagesTr" / f"{name}_0000.nii.gz"))
    nib.save(nib.Nifti1Image(label, affine), str(root / "labelsTr" / f"{name}.nii.gz"))
    _dataset_json(root)


def _dataset_json(root: Path) -> None:
    (root / "dataset.json").write_text(json.dumps({"channel_names": {"0": "CT"},
                                                   "labels": {"background": 0, "organ": 1}}))


def write_real(root: Path, cases: int) -> None:
    """tests/data/nifti's real T1 (``anatomical.nii``, 33x41x25) and its label, copied as ``cases`` cases."""
    import shutil

    data = Path(__file__).resolve().parents[1] / "tests" / "data" / "nifti"
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    for i in range(cases):
        shutil.copyfile(data / "anatomical.nii", root / "imagesTr" / f"t1{i:03d}_0000.nii")
        shutil.copyfile(data / "anatomical_label.nii.gz", root / "labelsTr" / f"t1{i:03d}.nii.gz")
    _dataset_json(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=600)
    parser.add_argument("--cases", type=int, default=1)
    parser.add_argument("--real", action="store_true", help="tests/data/nifti's T1 and label as the cases")
    parser.add_argument("--format", default="npy", help="shard format of the convert rows (npy holds a shard of "
                        "variable-size samples in memory until it ends; lmdb writes each sample as it comes)")
    args = parser.parse_args()
    rows = []
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="shardkit-volbench-") as tmp:
        root = Path(tmp) / "Dataset001"
        if args.real:
            write_real(root, args.cases)
            order: tuple[str, ...] = ("nibabel", "convert", "convert-gzip", "convert-all", "read")
        else:
            for i in range(args.cases):
                write_case(root, args.depth, f"ct{i:03d}", i)
            order = ("nibabel", "0", "1", "convert", "convert-gzip", "convert-all", "read", "nibabel-slice")
        load.append(os.getloadavg())
        for what in order:
            out = subprocess.run([sys.executable, "-c", CHILD, str(root), what, args.format], check=True,
                                 capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    load.append(os.getloadavg())
    byname = {r["what"]: r for r in rows}
    voxels = byname["nibabel"]["voxels"]
    try:
        import isal  # noqa: F401
        fast = "python-isal installed"
    except ImportError:
        fast = "python-isal not installed: the convert rows both inflate with Python's gzip"
    what = ("real T1 33x41x25 .nii + .nii.gz label" if args.real
            else f"512 x 512 x {args.depth} int16 + uint8 label, .nii.gz")
    print(f"{args.cases} case(s) of {what}: {voxels / 1e6:.1f} M image voxels; {os.cpu_count()} cores; {fast}")
    print("load average (1, 5, 15 min) before writing the set, before the rows, after: "
          + "; ".join(", ".join(f"{v:.2f}" for v in avg) for avg in load))
    names = {"nibabel": "nibabel decode", "convert": "convert -w1 isal", "convert-gzip": "convert -w1 gzip",
             "convert-all": "convert default -w", "read": "read shards", "nibabel-slice": "nibabel per slice"}
    for r in rows:
        name = names.get(r["what"], f"slices, context {r['what']}")
        print(f"  {name:19s} {r['seconds']:7.2f} s wall {r['cpu']:7.2f} s CPU  {r['slices']:5d} slices  peak RSS "
              f"{r['peak_mb']:6.0f} MB (after imports {r['base_mb']:.0f} MB)")
    nib_row = byname["nibabel"]
    for key in ("convert", "convert-gzip", "convert-all"):
        r = byname[key]
        print(f"{names[key]}: {voxels / r['seconds'] / 1e6:.1f} M voxels/s wall, "
              f"{nib_row['seconds'] / r['seconds']:.2f}x nibabel's {voxels / nib_row['seconds'] / 1e6:.1f}; "
              f"CPU {nib_row['cpu'] / r['cpu']:.2f}x nibabel's")
    if "nibabel-slice" in byname:
        per = {r["what"]: r["seconds"] / r["slices"] for r in rows}
        print(f"random slice access: shards {per['read'] * 1e3:.2f} ms, nibabel from the .nii.gz "
              f"{per['nibabel-slice'] * 1e3:.0f} ms: {per['nibabel-slice'] / per['read']:.0f}x")
    print(json.dumps({"cases": args.cases, "depth": None if args.real else args.depth, "real": args.real,
                      "load": load, "rows": rows}))


if __name__ == "__main__":
    main()
