"""A small, deterministic, synthetic street-scene dataset in the CamVid-32 layout.

``make_demo`` writes ``class_dict.csv`` plus ``train/``, ``train_labels/``, ``val/`` and
``val_labels/`` (masks named ``<stem>_L.png``), so ``shardkit convert`` can run with no downloads.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import cv2
import numpy as np

from shardkit.errors import ConfigError, OutputError

log = logging.getLogger(__name__)

DEMO_CLASSES: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("Sky", (128, 128, 128)),
    ("Building", (128, 0, 0)),
    ("Road", (128, 64, 128)),
    ("Sidewalk", (0, 0, 192)),
    ("Tree", (128, 128, 0)),
    ("Car", (64, 0, 128)),
    ("Pedestrian", (64, 64, 0)),
    ("Pole", (192, 192, 128)),
)
SKY, BUILDING, ROAD, SIDEWALK, TREE, CAR, PEDESTRIAN, POLE = range(len(DEMO_CLASSES))
_SPLIT_DIRS = ("train", "train_labels", "val", "val_labels")
# Mean image colour (RGB) of each class; jittered per sample and noised per pixel.
_BASE = np.array(
    [
        (150, 190, 235),  # sky
        (150, 120, 100),  # building
        (90, 90, 95),  # road
        (175, 170, 160),  # sidewalk
        (60, 120, 50),  # tree
        (170, 30, 40),  # car
        (200, 150, 120),  # pedestrian
        (110, 110, 110),  # pole
    ],
    dtype=np.float32,
)


def class_dict_text() -> str:
    """The exact ``class_dict.csv`` content of the demo (also how a previous demo is recognised)."""
    return "name,r,g,b\n" + "".join(f"{n},{r},{g},{b}\n" for n, (r, g, b) in DEMO_CLASSES)


def _draw_ids(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Class-id map of one scene, drawn without anti-aliasing so every pixel is one class."""
    ids = np.full((h, w), SKY, np.uint8)
    horizon = int(h * rng.uniform(0.40, 0.55))
    x = int(rng.integers(-w // 10, 1))
    while x < w:  # skyline of buildings of varying widths and heights
        bw = int(rng.integers(w // 8, w // 3))
        top = int(rng.integers(h // 12, horizon - h // 10))
        cv2.rectangle(ids, (x, top), (x + bw, horizon), BUILDING, -1, cv2.LINE_8)
        x += bw + int(rng.integers(0, w // 16 + 1))
    ids[horizon:] = SIDEWALK
    vx = int(w * rng.uniform(0.35, 0.65))  # vanishing point of the road
    road = [[vx - w // 20, horizon], [vx + w // 20, horizon], [w + w // 4, h], [-w // 4, h]]
    cv2.fillPoly(ids, [np.array(road, np.int32)], ROAD, cv2.LINE_8)
    for _ in range(int(rng.integers(1, 4))):  # trees: trunk-less canopies above the sidewalk
        cx = int(rng.integers(0, w // 4) if rng.random() < 0.5 else rng.integers(3 * w // 4, w))
        r = int(rng.integers(h // 12, h // 6))
        cv2.circle(ids, (cx, horizon - r // 2), r, TREE, -1, cv2.LINE_8)
    for _ in range(int(rng.integers(1, 3))):  # poles
        px, top = int(rng.integers(0, w - 3)), int(rng.integers(h // 10, horizon - 5))
        cv2.rectangle(ids, (px, top), (px + 2, int(horizon + h * 0.2)), POLE, -1, cv2.LINE_8)
    for _ in range(int(rng.integers(1, 4))):  # cars on the road, bigger when nearer
        y = int(rng.integers(horizon + h // 10, h - h // 12))
        cw = max(6, int(w * 0.35 * (y - horizon) / (h - horizon)))
        lo = vx - (y - horizon)
        cx = int(rng.integers(lo, max(lo + 1, vx + (y - horizon) - cw + 1)))
        cv2.rectangle(ids, (cx, y - cw // 2), (cx + cw, y), CAR, -1, cv2.LINE_8)
    for _ in range(int(rng.integers(1, 4))):  # pedestrians: a head and a body
        px, y = int(rng.integers(2, w - 4)), int(rng.integers(horizon + 4, h))
        ph = int(rng.integers(h // 10, h // 5))
        cv2.rectangle(ids, (px - 2, y - ph), (px + 2, y), PEDESTRIAN, -1, cv2.LINE_8)
        cv2.circle(ids, (px, y - ph - 2), 2, PEDESTRIAN, -1, cv2.LINE_8)
    return ids


def _render(rng: np.random.Generator, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RGB image (jittered class colours, sky gradient, pixel noise) and RGB colour mask."""
    h = ids.shape[0]
    colours = np.clip(_BASE + rng.normal(0, 12, _BASE.shape), 0, 255).astype(np.float32)
    image = colours[ids]
    ramp = np.linspace(-40, 30, h, dtype=np.float32)[:, None, None]
    image = np.where((ids == SKY)[..., None], image + ramp, image)
    image += rng.normal(0, 8, image.shape).astype(np.float32)
    palette = np.array([c for _, c in DEMO_CLASSES], np.uint8)
    return np.clip(image, 0, 255).astype(np.uint8), palette[ids]


def _write_png(path: Path, rgb: np.ndarray) -> None:
    """Encode an RGB array as PNG to a temporary name, then rename it into place."""
    ok, buf = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    if not ok:
        raise OutputError("cv2 could not encode PNG", path=path, fix="check the OpenCV installation")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(buf.tobytes())
    tmp.replace(path)


def make_demo(
    root: Path, *, train: int = 24, val: int = 8, size: tuple[int, int] = (120, 160), seed: int = 0
) -> Path:
    """Write the synthetic demo dataset under ``root`` (replacing a previous demo) and return ``root``."""
    root = Path(root)
    h, w = size
    if train < 1 or val < 0 or h < 48 or w < 64:
        raise ConfigError(f"demo needs train >= 1, val >= 0 and size >= (48, 64); got {train}, {val}, {size}")
    marker = root / "class_dict.csv"
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        if not (marker.is_file() and marker.read_bytes() == class_dict_text().encode()):
            fix = "choose an empty or new folder, or delete this one"
            raise OutputError("exists and is not a shardkit demo", path=root, fix=fix)
        log.info("replacing previous demo in %s", root)
        marker.unlink()  # until rewritten last, a half-written demo does not look complete
        for name in _SPLIT_DIRS:
            shutil.rmtree(root / name, ignore_errors=True)
    index = 0
    for split, count in (("train", train), ("val", val)):
        (root / split).mkdir(parents=True, exist_ok=True)
        (root / f"{split}_labels").mkdir(parents=True, exist_ok=True)
        for _ in range(count):
            index += 1
            rng = np.random.default_rng([seed, index])
            image, mask = _render(rng, _draw_ids(rng, h, w))
            stem = f"scene_{index:04d}"
            _write_png(root / split / f"{stem}.png", image)
            _write_png(root / f"{split}_labels" / f"{stem}_L.png", mask)
    tmp = marker.with_name(".class_dict.csv.tmp")
    tmp.write_text(class_dict_text(), encoding="utf-8", newline="\n")
    tmp.replace(marker)
    log.info("wrote demo dataset: %d train + %d val scenes of %dx%d in %s", train, val, h, w, root)
    return root
