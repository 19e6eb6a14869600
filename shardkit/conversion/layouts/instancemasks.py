"""One binary mask per object in a folder per sample: ``<id>/images/<id>.png`` + ``<id>/masks/*.png`` (the Data
Science Bowl 2018 / BBBC038 layout, common in microscopy), found under the root or one ``<stage>/`` folder below.

Recognised so that it is named, not mistaken for another tree: a label made of several files is not converted
yet (merging masks needs a label that is a folder throughout fingerprints, the no-op check and the workers), so
every run on it is refused in one line that says what was found and how to convert it.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import LayoutError
from .base import Context, Job, Layout, has_images
from .scan import Found, subdirs

_PROBE = 3  # sample folders looked at to recognise the tree


def _is_sample(folder: Path) -> bool:
    images, masks = folder / "images", folder / "masks"
    return images.is_dir() and masks.is_dir() and has_images(images) and has_images(masks)


def sample_root(root: Path, dirs: frozenset[str]) -> Path | None:
    """The folder whose sub-folders are samples (``<id>/images/`` + ``<id>/masks/``): root, or one level below
    in a single folder or in ``stage*/`` ones (DSB's ``stage1_train/``); stat calls first, listings only then."""
    below = [root / d for d in sorted(dirs) if len(dirs) == 1 or d.lower().startswith("stage")]
    for base in (root, *below):
        names = sorted(dirs) if base == root else subdirs(base)
        probe = [base / n for n in names[:_PROBE]]
        if probe and all(_is_sample(p) for p in probe):
            return base
    return None


def _refuse(root: Path, base: Path) -> Found:
    samples = subdirs(base)
    first = base / samples[0]
    masks = sum(1 for f in (first / "masks").iterdir() if f.is_file())
    where = base.relative_to(root).as_posix() + "/" if base != root else ""
    raise LayoutError(f"per-instance mask folders: {len(samples)} samples as {where}<id>/images/<id>.png + "
                      f"{where}<id>/masks/*.png (one binary mask per object; {samples[0]} has {masks}); a label made "
                      "of several files is not converted yet", path=root,
                      fix="write one label image per sample (its class where any of its masks is nonzero, e.g. "
                          "<id>/label.png) and pair them with --images '{name}/images/*.png' --labels "
                          "'{name}/label.png'")


class InstanceMasksLayout(Layout):
    name = "instance_masks"
    expected = "<id>/images/<id>.png + <id>/masks/*.png (one mask per object: Data Science Bowl 2018)"
    order = 40
    image_dirs = ("images",)
    label_dirs = ("masks",)
    takes_label_suffix = False

    def detect(self, ctx: Context) -> dict[str, Job]:
        base = sample_root(ctx.root, ctx.dirs)
        if base is None:
            return {}
        return {"all": lambda: _refuse(ctx.root, base)}


LAYOUT = InstanceMasksLayout
