"""Audit exact, elastic resumption with real torch.distributed ranks (gloo, CPU, one process per rank).

Each trial runs ``--epochs`` epochs of ``make_loader`` as a chain of segments: a segment starts ``W`` processes
(``W`` drawn from ``--worlds``), each joins a gloo process group, builds its loader with the group's rank and
world size, loads the previous segment's state dict, takes a random number of batches (or the rest of the epoch)
and all-gathers what it saw (each sample's index and the sha256 of its augmented image and label bytes) and its
state, which every rank must agree on. The audit then checks, per epoch: every sample seen, exactly once apart
from the wrap-around padding the epoch's last world size adds (fewer than W repeats), and every sample's bytes
equal to the uninterrupted run's (read and augmented one at a time in this process). Exit 1 on any difference.

    python scripts/audit_resume.py                      # CamVid train (../shared/data) converted at 90x120
    python scripts/audit_resume.py --split out/train --trials 20 --epochs 3 --worlds 1,2,4 --batch 8
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import multiprocessing
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("audit_resume")
AUG = "scale=0.75:1.5,crop=48x64,hflip,rotate=10,jitter=0.2"


def digest(image: Any, label: Any) -> str:
    return hashlib.sha256(np.ascontiguousarray(image).tobytes() + np.ascontiguousarray(label).tobytes()).hexdigest()


def _rank(split: str, plan: dict[str, Any], aug: str | None, world: int, rank: int, steps: int | None,
          state: dict[str, Any] | None, store: str, out: str) -> None:
    """One rank of a segment (a separate process)."""
    import torch.distributed as dist

    import shardkit
    from shardkit import augment as A
    from shardkit.read.torch import make_loader

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        the_plan = shardkit.EpochPlan(**plan, rank=dist.get_rank(), world_size=dist.get_world_size())
        loader = make_loader(split, the_plan, with_indices=True, layout="NHWC", pin_memory=False,
                             augment=A.parse(aug) if aug else None)
        if state is not None:
            loader.load_state_dict(state)
        n = len(loader) if steps is None else min(steps, len(loader))
        seen: list[tuple[int, str]] = []
        if n:
            for k, (images, labels, idx) in enumerate(loader):
                seen += [(int(i), digest(images[j].numpy(), labels[j].numpy())) for j, i in enumerate(idx.tolist())]
                if k + 1 == n < len(loader):
                    break
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, (seen, loader.state_dict()))
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


def segment(split: str | Path, plan: dict[str, Any], aug: str | None, world: int, steps: int | None,
            state: dict[str, Any] | None) -> tuple[list[tuple[int, str]], dict[str, Any]]:
    """``world`` gloo ranks in separate processes, resumed at ``state``, each taking ``steps`` batches (None: the
    rest of the epoch): what they saw, and the state they agree on."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        store, out = str(Path(tmp) / "store"), str(Path(tmp) / "out.json")
        procs = [ctx.Process(target=_rank, args=(str(split), plan, aug, world, r, steps, state, store, out))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        codes = [p.exitcode for p in procs]
        if any(c != 0 for c in codes):
            raise RuntimeError(f"a rank failed: exit codes {codes}")
        gathered = json.loads(Path(out).read_text())
    states = [s for _, s in gathered]
    if any(s != states[0] for s in states):
        raise RuntimeError(f"ranks disagree on the state: {states}")
    return [(int(i), d) for seen, _ in gathered for i, d in seen], states[0]


def reference(split: str | Path, aug: str | None, seed: int, epoch: int) -> dict[int, str]:
    """Each sample's digest in ``epoch``, read (and augmented) one at a time in this process."""
    import shardkit
    from shardkit import augment as A

    ds = shardkit.open(split)
    out = {}
    for i in range(len(ds)):
        if aug:
            images, labels = ds.augmented_batch(np.array([i]), A.parse(aug), seed=seed, epoch=epoch)
        else:
            images, labels = ds.batch(np.array([i]))
        out[i] = digest(images[0], labels[0])
    return out


def audit(split: str | Path, *, batch: int = 4, seed: int = 0, aug: str | None = AUG, trials: int = 1,
          epochs: int = 2, worlds: tuple[int, ...] = (1, 2, 4), rng_seed: int = 0,
          schedule: list[tuple[int, int | None]] | None = None) -> list[str]:
    """Run the trials; the problems found (empty: every check passed). ``schedule``: fixed (world, steps) segments
    for one trial instead of random ones (steps None: the rest of the epoch)."""
    import shardkit
    from shardkit.read.sampling import num_batches, per_rank

    n = len(shardkit.open(split))
    refs = {e: reference(split, aug, seed, e) for e in range(epochs)}
    rng = np.random.default_rng(rng_seed)
    problems: list[str] = []
    for trial in range(trials):
        seen: dict[int, list[tuple[int, str]]] = {e: [] for e in range(epochs)}
        last_world = dict.fromkeys(range(epochs), 1)
        state: dict[str, Any] | None = None
        fixed = list(schedule) if schedule is not None else None
        while state is None or state["epoch"] < epochs:
            epoch = 0 if state is None else state["epoch"]
            if fixed is not None:
                world, steps = fixed.pop(0)
            else:
                world = int(rng.choice(worlds))
                left = n - (0 if state is None else state["consumed"])
                batches = num_batches(per_rank(left, world, False), batch, False)
                steps = int(rng.integers(1, batches + 1))
            got, state = segment(split, {"batch_size": batch, "seed": seed}, aug, world, steps, state)
            log.info("trial %d: epoch %d, %d ranks took %s batches each -> epoch %d, sample %d", trial, epoch, world,
                     steps, state["epoch"], state["consumed"])
            seen[epoch] += got
            last_world[epoch] = world
        for e in range(epochs):
            counts = Counter(i for i, _ in seen[e])
            missing = n - len(counts)
            extra = sum(counts.values()) - n
            wrong = sum(refs[e][i] != d for i, d in seen[e])
            if missing or not 0 <= extra < last_world[e] or wrong:
                problems.append(f"trial {trial} epoch {e}: {missing} samples never seen, {extra} seen again, "
                                f"{wrong} with other bytes than the uninterrupted run")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", help="a converted split folder (default: CamVid train converted at --size)")
    ap.add_argument("--size", default="90x120")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--augment", default=AUG, help="a shardkit.augment pipeline, or '' for none")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        split = args.split
        if split is None:
            from shardkit.conversion.config import ConvertConfig
            from shardkit.conversion.pipeline import convert

            h, w = (int(v) for v in args.size.split("x"))
            root = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "camvid-segnet"
            convert(ConvertConfig(root, Path(tmp), format="npy", size=(h, w), splits=("train",), quiet=True))
            split = str(Path(tmp) / "train")
        problems = audit(split, batch=args.batch, aug=args.augment or None, trials=args.trials, epochs=args.epochs,
                         worlds=tuple(int(v) for v in args.worlds.split(",")))
    for p in problems:
        log.error(p)
    log.info("%s", "every sample of every epoch seen once, every byte equal" if not problems else "FAILED")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
