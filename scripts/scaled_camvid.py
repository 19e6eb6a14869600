"""CamVid × k: a SegNet-layout dataset made of the shared CamVid pairs repeated under new names.

Shared by the benchmark scripts (never imported by the package). ``link="symlink"`` or ``"hardlink"``
costs no disk (the decoded pixels are the same, so convert and read timings are unaffected);
``"copy"`` writes real bytes, which an out-of-core benchmark needs so that the page cache cannot
serve a repeated file from its first read.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def source_pairs(data: Path) -> list[tuple[Path, Path]]:
    """Every (image, label) pair of a SegNet-layout folder: <split>/ + <split>annot/, splits sorted."""
    if not data.is_dir():
        raise SystemExit(f"no data folder {data}: pass --data PATH (a SegNet-layout CamVid folder)")
    pairs = []
    for split in sorted(p.name for p in data.iterdir() if p.is_dir() and not p.name.endswith("annot")):
        labels = data / f"{split}annot"
        if not labels.is_dir():
            continue
        for image in sorted((data / split).glob("*.png")):
            if (labels / image.name).is_file():
                pairs.append((image, labels / image.name))
    if not pairs:
        raise SystemExit(f"no <split>/ + <split>annot/ PNG pairs under {data}")
    return pairs


def replicated_source(pairs: list[tuple[Path, Path]], root: Path, times: int, *, split: str = "train",
                      link: str = "symlink") -> list[tuple[str, str]]:
    """A SegNet-layout folder ``root`` (one split) of ``r{k}_{name}`` entries, ``times`` × the pairs."""
    if link not in ("symlink", "hardlink", "copy"):
        raise ValueError(f"link={link!r} is not symlink, hardlink or copy")
    (root / split).mkdir(parents=True)
    (root / f"{split}annot").mkdir()
    out = []
    for k in range(times):
        for image, label in pairs:
            name = f"r{k}_{image.name}"
            for src, dst in ((image, root / split / name), (label, root / f"{split}annot" / name)):
                if link == "symlink":
                    dst.symlink_to(src.resolve())
                elif link == "hardlink":
                    os.link(src, dst)
                else:
                    shutil.copyfile(src, dst)
            out.append((str(root / split / name), str(root / f"{split}annot" / name)))
    return out
