"""Augmentation of 4-band uint16 and float32 batches (#29), side by side in one run: shardkit's product path
``make_loader(split, augment=aug)`` against albumentations with the same ops, in the same 2-worker DataLoader
setup as ``scripts/bench_augment.py`` (batch 32), on the same cores.

    python scripts/bench_augment_bands.py RAW_CAMVID [--rounds 3] [--batches 20] [--batch 32] [--workers 2]
        [--u16-spec "scale=0.5:2,crop=352x480,hflip,rotate=10,jitter=0.2:0.2"]
        [--f32-spec "scale=0.5:2,crop=352x480,hflip,rotate=10,gamma=0.8:1.2"] [--json out.json]

Data: the CamVid train pairs (123, 360x480) made 4-band as ``scripts/multiband_camvid.py`` makes them (RGB and
grey, each x257: uint16 over its whole range), and the same bands divided by 65535 as float32 in [0, 1]; each
converted by shardkit into a temporary npy split (deleted at the end). Both rows of a dtype read the same samples
from that split (albumentations from its memory maps, one sample per ``__getitem__``).

Ops: the geometry of ``bench_augment.py`` (RandomScale, Rotate with constant border and mask fill = ignore,
PadIfNeeded + RandomCrop, HorizontalFlip; masks nearest) plus one photometric op that means something on
non-RGB data:

- uint16: brightness and contrast per band, shardkit ``jitter=B:C`` (``clip(rint((x*b - 32768)*c + 32768))``)
  against ``A.RandomBrightnessContrast(B, C)`` (its own formula, ``x*alpha + beta*max``, also per band within
  the dtype's range: the same work, not the same values);
- float32: gamma, shardkit ``gamma=LO:HI`` (``x ** g`` on values in [0, 1]) against
  ``A.RandomGamma(gamma_range=(100*LO, 100*HI))`` (the same values). albumentations cannot take gamma on uint16
  (2.0.8 returns float64 values up to ~190000 for a 16-bit input, measured): that is why the uint16 row uses
  brightness/contrast and gamma is compared on float32.

AlbumentationsX 2.5.1 (the maintained line, the names ``bench_augment.py`` speaks) takes no uint16 in
``RandomBrightnessContrast`` (``KeyError: dtype('uint16')``; its docs list uint8 and float32): the script then says
so and compares float32 only (the JSON's ``refused``). A warning from the peer stops the script (see
``scripts/augment_peers.py``).

Each round times the two loaders of each dtype in turn (--batches batches after a warm-up batch per worker) and
prints samples/s, CPU ms per sample (this process and its workers, from /proc) and their ratios, with the 1-minute
load average at the round's start. Every round is printed; compare within a round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

import shardkit
from shardkit import augment as A
from shardkit.augment import geometry as augment_geometry
from shardkit.augment import levels as augment_levels
from shardkit.augment import ops as O
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert

sys.path.insert(0, str(Path(__file__).resolve().parent))
from augment_peers import PeerRefused, peer_version, quiet_albumentations
from bench_augment import IGNORE, albu_compose, cpu_seconds, first_call
from multiband_camvid import four_bands


class PeerCannotRun(Exception):
    """albumentations raised on the first sample of a dtype: that dtype is not compared (and the report says so)."""


def make_splits(raw: Path, tmp: Path) -> dict[str, Path]:
    """The CamVid train pairs as 4-band uint16 and float32 ``.npy`` images (SegNet layout), each converted to an
    npy split: {"uint16": split, "float32": split}."""
    out = {}
    pairs = sorted((raw / "train").glob("*.png"))
    for dtype in ("uint16", "float32"):
        src = tmp / f"raw-{dtype}"
        (src / "train").mkdir(parents=True)
        (src / "trainannot").mkdir()
        for p in pairs:
            bands = four_bands(cv2.imread(str(p), cv2.IMREAD_COLOR)[:, :, ::-1])
            img = bands if dtype == "uint16" else (bands / 65535.0).astype(np.float32)
            np.save(src / "train" / f"{p.stem}.npy", img)
            shutil.copy(raw / "trainannot" / p.name, src / "trainannot" / p.name)
        dst = tmp / f"split-{dtype}"
        convert(ConvertConfig(src, dst, format="npy", splits=("train",), workers=1, quiet=True, num_classes=12,
                              ignore_index=IGNORE))
        shutil.rmtree(src)
        out[dtype] = dst / "train"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", type=Path, help="the CamVid SegNet subset (train/, trainannot/)")
    ap.add_argument("--u16-spec", default="scale=0.5:2,crop=352x480,hflip,rotate=10,jitter=0.2:0.2")
    ap.add_argument("--f32-spec", default="scale=0.5:2,crop=352x480,hflip,rotate=10,gamma=0.8:1.2")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="also write every round here")
    args = ap.parse_args()
    try:
        run(args)
    except PeerRefused as exc:
        raise SystemExit(f"bench_augment_bands: {exc}") from None


def run(args: argparse.Namespace) -> None:
    """Every round of both dtypes, printed (and written to --json)."""
    quiet_albumentations()
    import albumentations  # noqa: F401  (ImportError here, before minutes of conversion, when it is missing)

    peer = peer_version("albumentations")
    specs = {"uint16": args.u16_spec, "float32": args.f32_spec}
    print(f"{peer}, OpenCV {cv2.__version__}, numpy {np.__version__}, "
          f"{os.cpu_count()} cores; image warp cv2.warpAffine, level maps "
          f"{augment_levels.KERNELS.name()}, label gather {augment_geometry.kernel_name()}")
    print(f"batch {args.batch}, {args.batches} timed batches per row and round, {args.workers} DataLoader workers")
    tmp = Path(tempfile.mkdtemp(prefix="bench-augment-bands-"))
    report: dict[str, Any] = {"specs": specs, "batch": args.batch, "batches": args.batches, "workers": args.workers,
                              "albumentations": peer, "refused": {}, "rounds": []}
    try:
        splits = make_splits(args.raw, tmp)
        loaders: dict[str, dict[str, Callable[[], Any]]] = {}
        for dtype in splits:
            try:
                loaders[dtype] = rows(args, A.parse(specs[dtype]), splits[dtype])
            except PeerCannotRun as exc:  # the peer cannot run this pipeline at all: say so, compare nothing
                report["refused"][dtype] = str(exc)
                print(f"{dtype}: {peer} cannot run {specs[dtype]!r} on this dtype ({exc}); its comparison is skipped")
        for r in range(args.rounds):
            load = os.getloadavg()[0]
            got: dict[str, Any] = {"load_average": load}
            for dtype, named in loaders.items():
                got[dtype] = {name: rate(make(), args) for name, make in named.items()}
            report["rounds"].append(got)
            print(f"\nround {r + 1}: load average (1 min) {load:.2f}")
            for dtype in loaders:
                (sk, sk_ms), (al, al_ms) = got[dtype].values()
                print(f"  {dtype:8s} {specs[dtype]}")
                print(f"    shardkit make_loader   {sk:8.1f} samples/s  {sk_ms:6.2f} CPU ms/sample")
                print(f"    albumentations         {al:8.1f} samples/s  {al_ms:6.2f} CPU ms/sample")
                print(f"    shardkit / albumentations: {sk / al:.2f}x samples/s, {al_ms / sk_ms:.2f}x CPU time")
        print("\nsummary (every round; shardkit make_loader / albumentations):")
        for dtype in loaders:
            per = [(r[dtype]["shardkit"], r[dtype]["albumentations"]) for r in report["rounds"]]
            speed = [s[0] / a[0] for s, a in per]
            cpu = [a[1] / s[1] for s, a in per]
            print(f"  {dtype:8s} samples/s " + " ".join(f"{v:.2f}x" for v in speed)
                  + f" (median {statistics.median(speed):.2f}x); CPU time " + " ".join(f"{v:.2f}x" for v in cpu)
                  + f" (median {statistics.median(cpu):.2f}x); CPU ms/sample shardkit "
                  + " ".join(f"{s[1]:.2f}" for s, _ in per) + " vs albumentations "
                  + " ".join(f"{a[1]:.2f}" for _, a in per))
        print("  load average (1 min) at each round's start: "
              + " ".join(f"{r['load_average']:.2f}" for r in report["rounds"]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def rows(args: argparse.Namespace, aug: O.Compose, split: Path) -> dict[str, Callable[[], Any]]:
    """The two loaders of one split: {"shardkit": make_loader(...), "albumentations": DataLoader(per sample)}."""
    from torch.utils.data import DataLoader, Dataset

    from shardkit.read.torch import ShardkitTorchDataset, make_loader

    ds = shardkit.open(split)
    views = [ds[i] for i in range(len(ds))]
    n, B, nb, w = len(views), args.batch, args.batches, args.workers
    batches = [[i % n for i in range(b * B, (b + 1) * B)] for b in range(nb + max(w, 1))]  # no epoch ends
    tf = albu_compose(aug, bands=True)

    def albu(i: int) -> tuple[np.ndarray, np.ndarray]:
        out = tf(image=views[i % n][0], mask=views[i % n][1])
        return out["image"], out["mask"]

    try:
        first_call("albumentations", albu)  # a warning refuses the run (PeerRefused propagates)
    except (KeyError, TypeError, ValueError, NotImplementedError) as exc:  # the peer's own error on this dtype
        raise PeerCannotRun(f"{type(exc).__name__}: {exc}") from exc

    class PerSample(Dataset):
        def __len__(self) -> int:
            return B * (nb + max(w, 1))

        def __getitem__(self, i):  # type: ignore[no-untyped-def]
            return albu(i)

    def product() -> Any:
        """make_loader(split, augment=aug) as a user gets it, its epoch sampler's batches replaced by ours
        (as bench_augment.py: this small split's epochs are a few batches long)."""
        loader = make_loader(split, shardkit.EpochPlan(B, shuffle=False), num_workers=w, layout="NHWC", augment=aug,
                             pin_memory=False)
        if hasattr(loader, "ring"):
            slotted: Any = loader.sampler
            slotted.inner = batches
            return loader
        return DataLoader(ShardkitTorchDataset(split, layout="NHWC", augment=aug), batch_size=None, num_workers=w,
                          sampler=batches)

    return {"shardkit": product, "albumentations": lambda: DataLoader(PerSample(), batch_size=B, num_workers=w)}


def rate(loader: Any, args: argparse.Namespace) -> tuple[float, float]:
    """(samples/s, CPU ms per sample of this process and its workers) over ``--batches`` batches, after a warm-up
    batch per worker."""
    it = iter(loader)
    for _ in range(max(args.workers, 1)):
        next(it)
    inner = getattr(loader, "loader", None)
    pids = [p.pid for p in getattr(inner._iterator if inner is not None else it, "_workers", [])]
    t, cpu = time.perf_counter(), time.process_time() + sum(map(cpu_seconds, pids))
    for _ in range(args.batches):
        next(it)
    wall = time.perf_counter() - t
    cpu = time.process_time() + sum(map(cpu_seconds, pids)) - cpu
    done = args.batch * args.batches
    return done / wall, 1000 * cpu / done


if __name__ == "__main__":
    main()
