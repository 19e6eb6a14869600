"""Augmentation throughput, side by side in one run: shardkit's numpy/OpenCV batched path against
albumentations and torchvision v2 (per-sample pipelines in DataLoader workers), and shardkit's torch path
against Kornia on a GPU; for samples stored at 360x480 (CamVid) and at 1080p (the same pairs upscaled).

    python scripts/bench_augment.py RAW_CAMVID [--spec "scale=0.5:2,crop=352x480,hflip,rotate=10,jitter=0.2"]
        [--batch 32] [--batches 20] [--workers 2] [--sizes 360x480,1080x1440] [--rounds 3]
        [--device cuda] [--json out.json]

Data: --samples CamVid train pairs (the 123 in turn, repeated as needed), for each --sizes entry at that size
(the original size as is, others upscaled: images bilinear, labels nearest), converted by shardkit into a
temporary npy split (deleted at the end). Every row reads the same samples from that split's
memory maps (page cache; no row copies whole samples); every pipeline ends in the spec's crop, so all rows
produce batches of the same shape.

Rows, per size (samples/s; "x cpu" is the ratio to the first row):

- ``shardkit numpy/OpenCV batched``: ``aug(images, labels, indices)`` on in-memory arrays, this process.
- ``shardkit torch (DEV)``: :func:`shardkit.augment.torch.apply_batch` on the same arrays as tensors on DEV
  (on CUDA synchronised before and after the timed batches, as the Kornia row: throughput, host and GPU
  overlapping as in training); on the CPU only for the first size.
- ``shardkit numpy DataLoader(N workers)``: the numpy path on in-memory arrays, one list of indices per
  ``__getitem__`` (batch_size=None) — the like-for-like row against the peers below.
- ``shardkit split DataLoader(N workers)``: the product path: ``make_loader(split, batch_size, num_workers=N,
  augment=aug)`` itself (npy samples warped from their memory maps in the workers straight into a slot of a
  shared-memory ring; each batch yielded as views of its slot, held while they live), reading the converted split,
  its epoch sampler's batches replaced by a list of index batches (this small split's epochs are a few batches long; an
  epoch end stalls the workers, which a real epoch of hundreds of batches does not).
- ``floor: 1 warp + 1 gather + 1 LUT``: the least work an augmented sample needs, in this process on one
  OpenCV thread, on the same samples and drawn parameters: one bilinear ``cv2.warpAffine`` into the output
  size from a 4-channel copy of the sample made before the clock starts (OpenCV 5 warps 4 channels ~2.5x faster
  than 3; the copy is not counted), one ``INTER_NEAREST`` ``cv2.warpAffine`` of the label (cv2's fixed-point
  nearest, cheaper than shardkit's exact gather) and one ``cv2.LUT`` — nothing else (no parameter drawing, no
  reading, no batch assembly, no hand-over between processes). Its CPU ms per sample is printed beside the
  DataLoader rows' (``split / floor (CPU time)``: the product path's CPU per sample over the floor's).
- ``albumentations DataLoader(N workers)``: per-sample ``A.Compose`` (RandomScale, Rotate with constant
  border and mask fill = ignore, PadIfNeeded + RandomCrop, HorizontalFlip, ColorJitter with brightness and
  contrast in [1-v, 1+v], saturation and hue fixed; masks nearest), one sample per ``__getitem__``,
  batch_size=--batch, default collate. Written in the maintained line's parameter names (AlbumentationsX 2.5:
  ``scale_range``, ``angle_range``, ``fill``/``fill_mask``, ``brightness_range``...), ``Compose(strict=True,
  telemetry=False)``.
- ``torchvision v2 DataLoader(N workers)``: per-sample ``transforms.v2.Compose`` on (``tv_tensors.Image``,
  ``tv_tensors.Mask``): RandomResize (shorter side scaled by [lo, hi]), RandomRotation (fill: image 0,
  mask ignore), RandomCrop(pad_if_needed, same fills), RandomHorizontalFlip, ColorJitter(b, c); masks are
  nearest by type. Same DataLoader setup as albumentations.
- ``kornia AugmentationSequential (cuda)``: with --device cuda only (skipped with a note otherwise):
  ``AugmentationSequential(RandomAffine(rotate, scale), RandomCrop, RandomHorizontalFlip, ColorJitter,
  data_keys=["input", "mask"])`` on the same batches on the GPU (uint8 → float, masks as float (B, 1, H, W));
  Kornia scales about the centre within the input canvas before cropping (shardkit scales the canvas, then
  crops anywhere in it): the same per-pixel work, a different crop distribution.

Peers are held to their current APIs: every peer pipeline (albumentations, torchvision, Kornia) is built, and
run once, with every warning recorded (``scripts/augment_peers.py``); a warning — an argument the installed version
ignores or has deprecated — stops the script with the peer's version and the warning, rather than timing a
pipeline other than the one asked for. The first line printed, and the JSON's ``peers``, name the installed
version of each peer (``albumentationsx 2.5.1``; None when not installed).

The DataLoader rows run --rounds rounds, each timing every loader row once in turn (--batches batches after
a warm-up batch per worker), then the floor, so each round's ratios are measured side by side; the
summary prints every round's ratios and their median, and the load average at each round's start.
albumentations, torchvision and kornia are optional
(``pip install --no-deps albumentationsx==2.5.1 albucore==0.2.21 numkong stringzilla`` — the maintained
line, importing as ``albumentations``; ``PIP_CONSTRAINT=constraints/ci.txt pip install torchvision==0.28.0``;
``pip install --no-deps kornia kornia_rs``): a missing one's row is skipped with a note. The torchvision
wheel on PyPI is a CUDA build; beside a CPU-only torch its C++ ops do not load and ``import torchvision``
fails while registering them; transforms v2 does not use them, so the script then imports torchvision
without those two registration modules (the note says so). On a machine shared with other work the
absolute numbers move from run to run; compare ratios within a round.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

import shardkit
from shardkit import augment as A
from shardkit.augment import cpu as augment_cpu
from shardkit.augment import geometry as augment_geometry
from shardkit.augment import ops as O
from shardkit.conversion.config import ConvertConfig
from shardkit.conversion.pipeline import convert

sys.path.insert(0, str(Path(__file__).resolve().parent))
from augment_peers import PeerRefused, peer_version, quiet_albumentations, strict_peer  # scripts/ is on sys.path

IGNORE = 11
SK = "shardkit numpy"


def albu_compose(aug: O.Compose, bands: bool = False):  # type: ignore[no-untyped-def]
    """The nearest albumentations.Compose to ``aug`` in the maintained line's parameter names (AlbumentationsX 2.5:
    ``scale_range``, ``angle_range``, ``fill``/``fill_mask``, ``*_range``), built under :func:`strict_peer` with
    ``strict=True`` so a renamed or ignored argument refuses rather than silently runs a default (imported lazily;
    ImportError when not installed). ``bands``: for images that are not RGB, where ``jitter=B:C`` is
    ``RandomBrightnessContrast`` per band in the legacy additive model (``brightness_by_max=True``; saturation or
    hue is refused); for RGB it is ``ColorJitter``."""
    quiet_albumentations()
    import albumentations as al

    ts: list[Any] = []
    with strict_peer("albumentations"):
        for op in aug.ops:
            if isinstance(op, O.RandomScale):
                ts.append(al.RandomScale(scale_range=(op.lo - 1, op.hi - 1), interpolation=cv2.INTER_LINEAR,
                                         mask_interpolation=cv2.INTER_NEAREST, p=1.0))
            elif isinstance(op, O.RandomRotate):
                ts.append(al.Rotate(angle_range=(-op.degrees, op.degrees), interpolation=cv2.INTER_LINEAR,
                                    mask_interpolation=cv2.INTER_NEAREST, border_mode=cv2.BORDER_CONSTANT, fill=0,
                                    fill_mask=IGNORE, p=1.0))
            elif isinstance(op, O.RandomCrop):
                ts.append(al.PadIfNeeded(op.h, op.w, position="top_left", border_mode=cv2.BORDER_CONSTANT, fill=0,
                                         fill_mask=IGNORE))
                ts.append(al.RandomCrop(op.h, op.w))
            elif isinstance(op, O.RandomFlip):
                ts.append(al.HorizontalFlip(p=op.horizontal))
            elif isinstance(op, O.ColorJitter) and bands:
                if op.saturation or op.hue:
                    raise ValueError("saturation and hue mean nothing for images that are not RGB")
                ts.append(al.RandomBrightnessContrast(brightness_range=(-op.brightness, op.brightness),
                                                     contrast_range=(-op.contrast, op.contrast),
                                                     brightness_by_max=True, p=1.0))
            elif isinstance(op, O.ColorJitter):
                ts.append(al.ColorJitter(brightness_range=(1 - op.brightness, 1 + op.brightness),
                                         contrast_range=(1 - op.contrast, 1 + op.contrast),
                                         saturation_range=(1.0, 1.0), hue_range=(0.0, 0.0), p=1.0))
            elif isinstance(op, O.RandomGamma):
                ts.append(al.RandomGamma(gamma_range=(100 * op.lo, 100 * op.hi), p=1.0))
            else:
                raise ValueError(f"no albumentations equivalent for {type(op).__name__}")
        return al.Compose(ts, strict=True, telemetry=False)


def first_call(module: str, fn: Callable[[int], Any]) -> None:
    """Run a peer's per-sample (or per-batch) call once under :func:`strict_peer`: a warning on first use (an
    argument ignored at call time, a dtype the peer converts) refuses the row before anything is timed."""
    with strict_peer(module, "first call"):
        fn(0)


def import_torchvision() -> tuple[Any, str]:
    """(torchvision, note) — imported as is, or without its C++ op registrations when those cannot load."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchvision
        return torchvision, ""
    except RuntimeError as exc:  # a CUDA torchvision wheel beside a CPU torch: its ops never registered
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        for name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
            sys.modules[name] = types.ModuleType(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchvision
        return torchvision, (f"torchvision {torchvision.__version__}: C++ ops unavailable ({exc}); "
                             "imported without their registrations (transforms v2 does not use them)")


def tv_compose(aug: O.Compose, hw: tuple[int, int]):  # type: ignore[no-untyped-def]
    """The nearest torchvision ``transforms.v2.Compose`` to ``aug`` for inputs of height/width ``hw``, built under
    :func:`strict_peer` (a warning refuses)."""
    from torchvision import tv_tensors
    from torchvision.transforms import InterpolationMode, v2

    fill = {tv_tensors.Image: 0, tv_tensors.Mask: IGNORE}
    short = min(hw)
    ts: list[Any] = []
    with strict_peer("torchvision"):
        for op in aug.ops:
            if isinstance(op, O.RandomScale):
                ts.append(v2.RandomResize(max(1, round(short * op.lo)), round(short * op.hi) + 1,
                                          interpolation=InterpolationMode.BILINEAR, antialias=False))
            elif isinstance(op, O.RandomRotate):
                ts.append(v2.RandomRotation(op.degrees, interpolation=InterpolationMode.BILINEAR, fill=fill))
            elif isinstance(op, O.RandomCrop):
                ts.append(v2.RandomCrop((op.h, op.w), pad_if_needed=True, fill=fill))
            elif isinstance(op, O.RandomFlip):
                ts.append(v2.RandomHorizontalFlip(op.horizontal))
            elif isinstance(op, O.ColorJitter):
                ts.append(v2.ColorJitter(brightness=op.brightness, contrast=op.contrast))
            else:
                raise ValueError(f"no torchvision equivalent for {type(op).__name__}")
        return v2.Compose(ts)


def kornia_sequential(aug: O.Compose):  # type: ignore[no-untyped-def]
    """The nearest Kornia ``AugmentationSequential`` (images and masks) to ``aug``, built under :func:`strict_peer`
    (a warning refuses)."""
    import kornia.augmentation as K

    with strict_peer("kornia"):
        return _kornia_sequential(K, aug)


def _kornia_sequential(K: Any, aug: O.Compose):  # type: ignore[no-untyped-def]
    """:func:`kornia_sequential`'s body: the ops in Kornia's names."""
    degrees, scale, ts = 0.0, (1.0, 1.0), []
    for op in aug.ops:
        if isinstance(op, O.RandomScale):
            scale = (op.lo, op.hi)
        elif isinstance(op, O.RandomRotate):
            degrees = op.degrees
    ts.append(K.RandomAffine(degrees=degrees, scale=scale, p=1.0))
    for op in aug.ops:
        if isinstance(op, O.RandomCrop):
            ts.append(K.RandomCrop((op.h, op.w), pad_if_needed=True))
        elif isinstance(op, O.RandomFlip):
            ts.append(K.RandomHorizontalFlip(p=op.horizontal))
        elif isinstance(op, O.ColorJitter):
            ts.append(K.ColorJitter(brightness=op.brightness, contrast=op.contrast, p=1.0))
        elif not isinstance(op, (O.RandomScale, O.RandomRotate)):
            raise ValueError(f"no Kornia equivalent for {type(op).__name__}")
    return K.AugmentationSequential(*ts, data_keys=["input", "mask"])


def make_split(raw: Path, n: int, hw: tuple[int, int], tmp: Path) -> Path:
    """``n`` CamVid train pairs (all of them in turn, repeated as needed) at ``hw`` (upscaled when larger),
    converted to an npy split."""
    pairs = sorted((raw / "train").glob("*.png"))
    files = [pairs[i % len(pairs)] for i in range(n)]
    src = tmp / f"raw-{hw[0]}x{hw[1]}"
    (src / "train").mkdir(parents=True)
    (src / "trainannot").mkdir()
    lines = []
    for f in files:
        img, lab = cv2.imread(str(f)), cv2.imread(str(raw / "trainannot" / f.name), cv2.IMREAD_GRAYSCALE)
        if img.shape[:2] != hw:
            img = cv2.resize(img, hw[::-1], interpolation=cv2.INTER_LINEAR)
            lab = cv2.resize(lab, hw[::-1], interpolation=cv2.INTER_NEAREST)
        name = f"{len(lines):05d}_{f.name}"
        cv2.imwrite(str(src / "train" / name), img, [cv2.IMWRITE_PNG_COMPRESSION, 1])
        cv2.imwrite(str(src / "trainannot" / name), lab, [cv2.IMWRITE_PNG_COMPRESSION, 1])
        lines.append(f"/SegNet/CamVid/train/{name} /SegNet/CamVid/trainannot/{name}\n")
    (src / "train.txt").write_text("".join(lines))
    out = tmp / f"split-{hw[0]}x{hw[1]}"
    convert(ConvertConfig(src, out, format="npy", size=hw, splits=("train",), workers=1, quiet=True))
    shutil.rmtree(src)
    return out / "train"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", type=Path)
    ap.add_argument("--spec", default="scale=0.5:2,crop=352x480,hflip,rotate=10,jitter=0.2")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--samples", type=int, default=160,
                    help="samples per split: the CamVid train pairs, repeated when more are asked for")
    ap.add_argument("--device", default=None, help="device of the torch rows (default: cuda when available)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers for the loader rows (0: skip them)")
    ap.add_argument("--sizes", default="360x480,1080x1440", help="stored sample sizes, HxW, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the DataLoader rows (ratios per round)")
    ap.add_argument("--json", type=Path, default=None, help="also write every row and ratio here")
    ap.add_argument("--no-torch-cpu", action="store_true",
                    help="skip the shardkit torch (cpu) row (minutes on a small machine; it measures no loader)")
    args = ap.parse_args()
    aug = A.parse(args.spec)
    sizes = [tuple(int(v) for v in s.lower().split("x")) for s in args.sizes.split(",") if s.strip()]
    peers = installed_peers()
    report: dict[str, Any] = {"spec": args.spec, "batch": args.batch, "batches": args.batches,
                              "workers": args.workers, "label_gather": augment_geometry.kernel_name(),
                              "peers": peers, "sizes": {}}
    print("peers: " + "; ".join(f"{m}: {v or 'not installed (row skipped)'}" for m, v in peers.items()))
    tmp = Path(tempfile.mkdtemp(prefix="bench-augment-"))
    try:
        for k, hw in enumerate(sizes):
            split = make_split(args.raw, max(args.samples, args.batch), hw, tmp)  # type: ignore[arg-type]
            report["sizes"][f"{hw[0]}x{hw[1]}"] = bench_size(args, aug, split, first=k == 0)
            shutil.rmtree(split.parent)
    except PeerRefused as exc:
        raise SystemExit(f"bench_augment: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def installed_peers() -> dict[str, str | None]:
    """{peer module: "<distribution> <version>" or None when it is not installed}, for the header and the JSON."""
    return {m: peer_version(m) if importlib.util.find_spec(m) else None
            for m in ("albumentations", "torchvision", "kornia")}


def bench_size(args: argparse.Namespace, aug: O.Compose, split: Path, first: bool) -> dict[str, Any]:
    """Every row for one stored size: printed, and returned as {"rows": {name: samples/s}, "rounds": [...]}."""
    # every row reads the samples from the split's memory maps (page cache): no copies of whole samples
    ds = shardkit.open(split)
    views: list[tuple[np.ndarray, np.ndarray]] = [ds[i] for i in range(len(ds))]
    hw = ds.spec.size
    rows: list[tuple[str, float]] = []
    notes: list[str] = []

    def timed(name: str, fn: Callable[[int], Any], sync: Callable[[], Any] = lambda: None) -> None:
        fn(0)
        sync()
        t = time.perf_counter()
        for b in range(args.batches):
            fn(b)
        sync()
        rows.append((name, args.batch * args.batches / (time.perf_counter() - t)))

    n, idx = len(views), np.arange(args.batch)

    def numpy_batch(b: int) -> Any:
        ims, labs = zip(*(views[i % n] for i in idx + b * args.batch), strict=True)
        return aug(ims, labs, idx + b * args.batch, seed=0, epoch=0, ignore_index=IGNORE)

    timed("shardkit numpy/OpenCV batched", numpy_batch)
    try:
        import torch

        from shardkit.augment.torch import apply_batch
    except ImportError:
        torch = None
    dev = "cpu"
    if torch is not None:
        dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
        if (first and not args.no_torch_cpu) or dev != "cpu":
            first = views[: args.batch]
            ti = torch.from_numpy(np.stack([v[0] for v in first])).to(dev)
            tl = torch.from_numpy(np.stack([v[1] for v in first])).to(dev)
            timed(f"shardkit torch ({dev})", lambda b: apply_batch(aug, ti, tl, idx + b * args.batch, seed=0,
                                                                  epoch=0, ignore_index=IGNORE), sync)
            kornia_row(aug, ti, tl, dev, timed, sync, notes)
        else:
            notes.append("shardkit torch (cpu) row: skipped (--no-torch-cpu)" if args.no_torch_cpu else
                         "shardkit torch (cpu) row: first size only (CPU torch at this size is slow)")
    rounds: list[dict[str, float]] = []
    loads: list[float] = []
    if torch is not None and args.workers > 0:
        rounds = loader_rounds(args, aug, split, views, rows, notes, loads)
    base = rows[0][1]
    print(f"\n{'path':48s} {'samples/s':>10s} {'x cpu':>7s}   stored {hw[0]}x{hw[1]}, "
          f"spec={args.spec} batch={args.batch} label gather={augment_geometry.kernel_name()}")
    for name, rate in rows:
        print(f"{name:48s} {rate:10.1f} {rate / base:7.2f}")
    if loads:
        print(f"load average (1 min) at the start of each round: {'  '.join(f'{v:.2f}' for v in loads)} "
              f"({os.cpu_count()} cores)")
    for key in sorted({k for r in rounds for k in r}):
        vals = [r[key] for r in rounds if key in r]
        print(f"{key}: " + "  ".join(f"{v:.2f}x" for v in vals) + f"   (median {statistics.median(vals):.2f}x)")
    for note in notes:
        print(f"note: {note}")
    return {"stored_hw": list(hw), "rows": dict(rows), "rounds": rounds, "load_average": loads,
            "notes": notes}


def kornia_row(aug: O.Compose, ti: Any, tl: Any, dev: str, timed: Callable[..., None], sync: Callable[[], Any],
               notes: list[str]) -> None:
    """Kornia AugmentationSequential on the same batches, on CUDA only."""
    if not dev.startswith("cuda"):
        notes.append("kornia row: GPU only (run with --device cuda on a CUDA machine)")
        return
    try:
        seq = kornia_sequential(aug)
    except ImportError:
        notes.append("kornia is not installed; its row is skipped (pip install --no-deps kornia kornia_rs)")
        return
    seq = seq.to(dev)
    imgs = ti.permute(0, 3, 1, 2)
    masks = tl[:, None]

    def run(_: int) -> Any:
        return seq(imgs.float() / 255.0, masks.float())

    first_call("kornia", run)
    timed(f"kornia AugmentationSequential ({dev})", run, sync)


def loader_rounds(args: argparse.Namespace, aug: O.Compose, split: Path, views: list[tuple[np.ndarray, np.ndarray]],
                  rows: list[tuple[str, float]], notes: list[str], loads: list[float]) -> list[dict[str, float]]:
    """The DataLoader rows, --rounds times in turn; each row's best round goes into ``rows``, the 1-minute
    load average at each round's start into ``loads``."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    from shardkit.read.torch import ShardkitTorchDataset, make_loader

    n, B, nb, w = len(views), args.batch, args.batches, args.workers
    cpu_ms: list[dict[str, float]] = []
    rates: list[dict[str, float]] = []
    hw = views[0][0].shape[:2]

    def rate(loader: Any) -> tuple[float, float]:
        """(samples/s, CPU ms per sample of this process and its workers) over ``nb`` batches."""
        it = iter(loader)
        for _ in range(max(w, 1)):  # warm-up: worker start and each worker's first batch
            next(it)
        inner = getattr(loader, "loader", None)  # a RingLoader's DataLoader keeps its (persistent) iterator
        pids = [p.pid for p in getattr(inner._iterator if inner is not None else it, "_workers", [])]
        t, cpu = time.perf_counter(), time.process_time() + sum(map(cpu_seconds, pids))
        for _ in range(nb):
            next(it)
        wall = time.perf_counter() - t
        cpu = time.process_time() + sum(map(cpu_seconds, pids)) - cpu
        return B * nb / wall, 1000 * cpu / (B * nb)

    class ShardkitBatches(Dataset):
        def __getitem__(self, idx):  # type: ignore[no-untyped-def]
            idx = np.asarray(idx)
            return aug([views[i][0] for i in idx], [views[i][1] for i in idx], idx, seed=0, epoch=0,
                       ignore_index=IGNORE)

    class PerSample(Dataset):
        def __init__(self, fn: Callable[[int], Any]) -> None:
            self.fn = fn

        def __len__(self) -> int:
            return B * (nb + max(w, 1))

        def __getitem__(self, i):  # type: ignore[no-untyped-def]
            return self.fn(i)

    name = f"DataLoader({w} workers)"
    batches = [[i % n for i in range(b * B, (b + 1) * B)] for b in range(nb + max(w, 1))]  # no epoch ends

    def product() -> Any:
        """make_loader(split, augment=aug) as a user gets it, its epoch sampler's batches replaced by ours."""
        loader = make_loader(split, shardkit.EpochPlan(B, shuffle=False), num_workers=w, layout="NHWC", augment=aug,
                             pin_memory=False)
        if hasattr(loader, "ring"):  # a RingLoader: its DataLoader's sampler pairs the inner batches with slots
            slotted: Any = loader.sampler
            slotted.inner = batches
            return loader
        return DataLoader(ShardkitTorchDataset(split, layout="NHWC", augment=aug), batch_size=None,
                          num_workers=w, sampler=batches)

    loaders: dict[str, Callable[[], Any]] = {
        f"{SK} {name}": lambda: DataLoader(ShardkitBatches(), batch_size=None, num_workers=w,
                                           sampler=batches),
        f"shardkit split {name}": product,
    }
    try:
        tf = albu_compose(aug)

        def albu(i: int) -> tuple[np.ndarray, np.ndarray]:
            out = tf(image=views[i % n][0], mask=views[i % n][1])
            return out["image"], out["mask"]

        first_call("albumentations", albu)
        loaders[f"albumentations {name}"] = lambda: DataLoader(PerSample(albu), batch_size=B, num_workers=w)
    except ImportError:
        notes.append("albumentations is not installed; its row is skipped (pip install --no-deps "
                     "albumentationsx==2.5.1 albucore==0.2.21 numkong stringzilla)")
    try:
        _, note = import_torchvision()
        if note:
            notes.append(note)
        from torchvision import tv_tensors

        tvc = tv_compose(aug, hw)
        with warnings.catch_warnings():  # read-only memory maps: the transforms never write their input
            warnings.simplefilter("ignore")
            tviews = [(torch.from_numpy(im).permute(2, 0, 1), torch.from_numpy(la)) for im, la in views]

        def tvs(i: int) -> tuple[Any, Any]:
            return tvc(tv_tensors.Image(tviews[i % n][0]), tv_tensors.Mask(tviews[i % n][1]))

        first_call("torchvision", tvs)
        loaders[f"torchvision v2 {name}"] = lambda: DataLoader(PerSample(tvs), batch_size=B, num_workers=w)
    except ImportError:
        notes.append("torchvision is not installed; its row is skipped "
                     "(PIP_CONSTRAINT=constraints/ci.txt pip install torchvision==0.28.0)")
    best: dict[str, float] = {}
    rounds = []
    floor_name = "floor: 1 warp + 1 gather + 1 LUT (1 thread)"
    floor_ms: list[float] = []
    for _ in range(max(1, args.rounds)):
        loads.append(os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"))
        got = {key: rate(make()) for key, make in loaders.items()}
        floor_ms.append(floor_cpu_ms(aug, views, B * nb))
        for key, (r, _) in got.items():
            best[key] = max(best.get(key, 0.0), r)
        ratios = {"shardkit split / floor (CPU time)": got[f"shardkit split {name}"][1] / floor_ms[-1]}
        for mine in (f"{SK} {name}", f"shardkit split {name}"):
            for key, (r, c) in got.items():
                if not key.startswith("shardkit"):
                    pair = f"{mine.split(' DataLoader')[0]} / {key.split(' DataLoader')[0]}"
                    ratios[pair] = got[mine][0] / r
                    ratios[f"{pair} (CPU time)"] = c / got[mine][1]
        rounds.append(ratios)
        cpu_ms.append({key: c for key, (_, c) in got.items()})
        rates.append({key: r for key, (r, _) in got.items()})
    rows.extend(best.items())
    rows.append((floor_name, 1000 / min(floor_ms)))  # one core
    for key in loaders:
        notes.append(f"{key}: CPU ms/sample (this process + workers) per round: "
                     + "  ".join(f"{c[key]:.2f}" for c in cpu_ms)
                     + "; samples/s per round: " + "  ".join(f"{r[key]:.0f}" for r in rates))
    notes.append(f"{floor_name}: CPU ms/sample per round: " + "  ".join(f"{c:.2f}" for c in floor_ms)
                 + " (its samples/s row: one core)")
    return rounds


def floor_cpu_ms(aug: O.Compose, views: list[tuple[np.ndarray, np.ndarray]], count: int) -> float:
    """CPU ms per sample of the least work an augmented sample needs (the floor row; see the module docstring):
    one bilinear warpAffine from a 4-channel copy made beforehand, one INTER_NEAREST warpAffine of the label,
    one cv2.LUT, on one OpenCV thread, for ``count`` samples drawn as the loader rows draw them."""
    n = len(views)
    idx = [i % n for i in range(count)]
    params = aug.params_batch(idx, seed=0, epoch=0, hws=[views[i][0].shape[:2] for i in idx])
    hw = params[0].out_hw
    out4, out3 = np.empty((*hw, 4), np.uint8), np.empty((*hw, 3), np.uint8)
    out_lab = np.empty(hw, views[0][1].dtype)
    luts = [augment_cpu.colour_lut(p) for p in params]
    mats = [np.asarray(p.matrix) for p in params]
    src = np.empty((*views[0][0].shape[:2], 4), np.uint8)
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        spent = 0.0
        for k, i in enumerate(idx):
            cv2.cvtColor(views[i][0], cv2.COLOR_RGB2RGBA, dst=src)  # before the clock: not counted
            t = time.process_time()
            cv2.warpAffine(src, mats[k], hw[::-1], dst=out4, flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                           borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0, 0))
            cv2.warpAffine(views[i][1], mats[k], hw[::-1], dst=out_lab,
                           flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_CONSTANT,
                           borderValue=IGNORE)
            cv2.LUT(out3, luts[k], dst=out3)
            spent += time.process_time() - t
        return 1000 * spent / count
    finally:
        cv2.setNumThreads(threads)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
