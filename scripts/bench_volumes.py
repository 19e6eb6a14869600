"""Time and peak memory of cutting a CT-sized NIfTI case into slices, against nibabel decoding the same files.

A synthetic case (``--depth`` slices of 512x512 int16 "HU" with smooth anatomy-like structure and a uint8 label
sphere, spacing 0.7 x 0.7 x 2.5 mm, both ``.nii.gz``) is written to a temporary nnU-Net tree; then, each in a
fresh child process (peak RSS = that child's ``VmHWM``):

- ``nibabel``: ``np.asanyarray(nib.load(p).dataobj)`` of the image and the label (the decode alone);
- ``slices K``: :func:`shardkit.conversion.volumes.cut_split` with ``context`` K: headers checked, the case
  decoded once, labels checked against the class table, every slice stacked (``K`` = 0 and 1);
- ``convert``: ``shardkit convert`` of the tree (``--format``, default npy; one worker, in that process):
  slices written, the sidecar, the manifest;
- ``read``: 200 random slices (image and label) read from those shards (``shardkit.open``);
- ``nibabel-slice``: 10 random slices, each loaded from the ``.nii.gz`` files by nibabel's array proxy (it
  decompresses up to the slice) — the per-access cost the shards replace.

The last line is JSON.

    PYTHONPATH=$PWD python scripts/bench_volumes.py               # 512 x 512 x 600 (300 MiB as int16)
    PYTHONPATH=$PWD python scripts/bench_volumes.py --depth 100
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CHILD = r"""
import json, sys, time
from pathlib import Path
import numpy as np
root, what, fmt = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
def hwm():  # this process's peak RSS in kB (VmHWM: ru_maxrss would include the forking parent's)
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM")))
base = hwm()
t = time.perf_counter()
if what == "nibabel":
    import nibabel as nib
    arrays = [np.asanyarray(nib.load(str(p)).dataobj) for p in (root / "imagesTr" / "ct_0000.nii.gz",
                                                                   root / "labelsTr" / "ct.nii.gz")]
    n = arrays[0].shape[2]
elif what == "convert":  # into ROOT/../out, which the "read" row then opens
    from shardkit.conversion.config import ConvertConfig
    from shardkit.conversion.pipeline import convert
    n = convert(ConvertConfig(root, root.parent / "out", workers=1, quiet=True, format=fmt)).samples
elif what == "read":  # random slices from the shards
    import shardkit
    ds = shardkit.open(root.parent / "out" / "train")
    picks = np.random.default_rng(0).integers(0, len(ds), 200)
    for i in picks:
        image, label = ds[int(i)]
    n = len(picks)
elif what == "nibabel-slice":  # a random slice per access, decoded from the .nii.gz by nibabel's proxy
    import nibabel as nib
    picks = np.random.default_rng(0).integers(0, 600, 10)
    for k in picks:
        image = np.asanyarray(nib.load(str(root / "imagesTr" / "ct_0000.nii.gz")).dataobj[:, :, int(k)])
        label = np.asanyarray(nib.load(str(root / "labelsTr" / "ct.nii.gz")).dataobj[:, :, int(k)])
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
print(json.dumps({"what": what, "seconds": seconds, "slices": n, "peak_mb": peak / 1024, "base_mb": base / 1024}))
"""


def write_case(root: Path, depth: int) -> None:
    """A 512 x 512 x ``depth`` int16 CT-like volume and a uint8 label sphere, as an nnU-Net tree."""
    import nibabel as nib

    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    y, x = np.mgrid[-256:256, -256:256].astype(np.float32)
    body = (x / 200) ** 2 + (y / 150) ** 2 < 1
    rng = np.random.default_rng(0)
    ct = np.empty((512, 512, depth), np.int16)
    label = np.zeros((512, 512, depth), np.uint8)
    for z in range(depth):
        organ = ((x - 40) ** 2 + (y + 20) ** 2) < (60 * np.sin(np.pi * (z + 1) / (depth + 1))) ** 2
        plane = np.where(body, 40, -1000) + np.where(organ, 60, 0)
        ct[:, :, z] = plane + rng.integers(-20, 20, (512, 512), dtype=np.int16)
        label[:, :, z] = organ
    affine = np.diag([0.7, 0.7, 2.5, 1.0])
    nib.save(nib.Nifti1Image(ct, affine), str(root / "imagesTr" / "ct_0000.nii.gz"))
    nib.save(nib.Nifti1Image(label, affine), str(root / "labelsTr" / "ct.nii.gz"))
    (root / "dataset.json").write_text(json.dumps({"channel_names": {"0": "CT"},
                                                   "labels": {"background": 0, "organ": 1}}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=600)
    parser.add_argument("--format", default="npy", help="shard format of the convert row (npy holds a shard of "
                        "variable-size samples in memory until it ends; lmdb writes each sample as it comes)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="shardkit-volbench-") as tmp:
        root = Path(tmp) / "Dataset001"
        write_case(root, args.depth)
        for what in ("nibabel", "0", "1", "convert", "read", "nibabel-slice"):
            out = subprocess.run([sys.executable, "-c", CHILD, str(root), what, args.format], check=True,
                                 capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    voxels = 512 * 512 * args.depth
    print(f"case 512 x 512 x {args.depth} int16 ({voxels * 2 / 2**20:.0f} MiB) + uint8 label, .nii.gz")
    for r in rows:
        names = {"nibabel": "nibabel decode", "convert": "shardkit convert", "read": "read shards",
                 "nibabel-slice": "nibabel per slice"}
        name = names.get(r["what"], f"slices, context {r['what']}")
        print(f"  {name:18s} {r['seconds']:6.2f} s  {r['slices']:4d} slices  peak RSS {r['peak_mb']:6.0f} MB "
              f"(after imports {r['base_mb']:.0f} MB)")
    per = {r["what"]: r["seconds"] / r["slices"] for r in rows}
    print(f"random slice access: shards {per['read'] * 1e3:.2f} ms, nibabel from the .nii.gz "
          f"{per['nibabel-slice'] * 1e3:.0f} ms: {per['nibabel-slice'] / per['read']:.0f}x")
    print(json.dumps({"depth": args.depth, "rows": rows}))


if __name__ == "__main__":
    main()
