"""DRIVE-style retina trees, built at test time from the shared CamVid subset.

The DRIVE database may not be redistributed (its site: "Copying, redistribution, and any unauthorized
commercial use is prohibited"), so tests/data ships none of its files. The tests that need DRIVE's file kinds and
names make them here from real CamVid files (``../shared/data/camvid-segnet``), exactly as DRIVE lays them out:

- ``{split}/images/<n>_{split}.tif``: the CamVid photo, RGB TIFF with LZW compression (DRIVE's encoding);
- ``{split}/1st_manual/<n>_manual1.gif``: one class of its label (pole, thin like a vessel) as a 0/255 gray GIF;
  the ``test`` split's label is a palette GIF with indices 0/251, as DRIVE's ``test/1st_manual/01_manual1.gif``;
- ``{split}/mask/<n>_{split}_mask.gif``: a 0/255 field-of-view mask (every labelled pixel, i.e. not CamVid's
  void id 11). It looks like a label but is not one: discovery must ignore ``mask/``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

VESSEL_ID = 2  # CamVid SegNet "pole": thin structures, a few thousand pixels per frame
VOID_ID = 11
TEST_FOREGROUND = 251  # the palette index DRIVE's test/1st_manual/01_manual1.gif uses for vessels

# DRIVE number → the CamVid file it is made from (split folder, stem); each has pole and non-pole pixels.
SOURCES = {"21": ("train", "0001TP_006690"), "22": ("train", "0001TP_006780"), "01": ("val", "0016E5_07959")}


def _gif(array: np.ndarray, path: Path, palette_foreground: int | None = None) -> None:
    """Save a 0/1 array as a GIF: gray 0/255 (mode L), or palette indices 0/``palette_foreground`` (mode P)."""
    if palette_foreground is None:
        Image.fromarray((array * 255).astype(np.uint8), "L").save(path, "GIF", optimize=False)
        return
    im = Image.fromarray((array * palette_foreground).astype(np.uint8), "P")
    im.putpalette([v for i in range(256) for v in ((255, 255, 255) if i == palette_foreground else (0, 0, 0))])
    im.save(path, "GIF", optimize=False)


def drive_file_names(split: str, number: str) -> tuple[str, str, str]:
    """(image, label, field-of-view mask) paths of DRIVE sample ``number`` relative to the dataset root."""
    return (f"{split}/images/{number}_{split}.tif", f"{split}/1st_manual/{number}_manual1.gif",
            f"{split}/mask/{number}_{split}_mask.gif")


def drive_tree(root: Path, camvid_root: Path, samples: tuple[tuple[str, str], ...] = (("training", "21"),
                                                                                       ("test", "01")),
               with_fov_masks: bool = True) -> Path:
    """Write a DRIVE-style tree of ``samples`` ((split, number) pairs, numbers from :data:`SOURCES`) under root."""
    for split, number in samples:
        camvid_split, stem = SOURCES[number]
        image_rel, label_rel, mask_rel = drive_file_names(split, number)
        for rel in (image_rel, label_rel, mask_rel):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
        with Image.open(camvid_root / camvid_split / f"{stem}.png") as im:
            im.convert("RGB").save(root / image_rel, "TIFF", compression="tiff_lzw")
        with Image.open(camvid_root / f"{camvid_split}annot" / f"{stem}.png") as im:
            ids = np.array(im)
        _gif((ids == VESSEL_ID).astype(np.uint8), root / label_rel,
             TEST_FOREGROUND if split == "test" else None)
        if with_fov_masks:
            _gif((ids != VOID_ID).astype(np.uint8), root / mask_rel)
    return root
