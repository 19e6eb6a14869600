"""Pictures a person can check by eye, drawn with OpenCV only (no plotting library needed).

* :func:`render_sample` — the image, its label in class colours, and the two overlaid, side
  by side, with a legend of the classes in the sample (colour, id, name, pixel share).
* :func:`render_class_chart` — the split's class pixel share as a horizontal bar chart.

Classes without a colour in the manifest get a deterministic palette colour.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from .errors import OutputError

log = logging.getLogger(__name__)

FONT = cv2.FONT_HERSHEY_SIMPLEX
BG = (255, 255, 255)
INK = (20, 20, 20)
FRAME = (90, 90, 90)  # around every panel and swatch, so a white class on the white page still shows
IGNORE_CANDIDATES = ((0, 0, 0), (255, 255, 255), (255, 0, 255), (128, 128, 128), (0, 255, 255))
MIN_PANEL_WIDTH = 360  # smaller samples are enlarged (nearest, whole multiples) so the text fits beside them
MAX_PANEL_SIDE = 960  # larger samples are drawn smaller (labels nearest), so three panels stay one screen wide
BASE_PANEL_WIDTH = 480  # panels up to this wide get the base text size; wider ones scale every length with them


@dataclass(frozen=True)
class Layout:
    """Every length of a picture, scaled to its panels: text, gaps, legend rows and frames grow with the panel
    width (``unit`` = width / 480, at least 1), so a picture reads the same when it is viewed fitted to a
    screen, whatever the sample's size."""

    panel_h: int
    panel_w: int

    @property
    def unit(self) -> float:
        return max(1.0, self.panel_w / BASE_PANEL_WIDTH)

    def px(self, base: float) -> int:
        """A length of ``base`` pixels at the base size, scaled."""
        return round(base * self.unit)

    @property
    def font(self) -> float:
        return 0.5 * self.unit

    @property
    def thickness(self) -> int:
        return max(1, self.px(1))

    @property
    def gap(self) -> int:
        return self.px(10)

    @property
    def legend_row(self) -> int:
        return self.px(22)

    @property
    def swatch(self) -> int:
        return self.px(14)

    @property
    def width(self) -> int:
        """Three panels side by side with a gap around each."""
        return 3 * self.panel_w + 4 * self.gap

    def panel_top(self, titled: bool) -> int:
        """Height of the caption (and title) lines above the panels of a row."""
        return self.px(54 if titled else 30)

    def panel_x(self, k: int) -> int:
        return self.gap + k * (self.panel_w + self.gap)


def display_scale(h: int, w: int) -> float:
    """How much a (h, w) sample is scaled on the picture: a whole multiple up to at least 360 px wide, down to at
    most 960 px on its longer side, else 1."""
    if w < MIN_PANEL_WIDTH:
        return float(-(-MIN_PANEL_WIDTH // w))
    if max(h, w) > MAX_PANEL_SIDE:
        return MAX_PANEL_SIDE / max(h, w)
    return 1.0


def palette(num_classes: int, colours: Sequence[Sequence[int] | None] = ()) -> np.ndarray:
    """(num_classes, 3) uint8 RGB: the given colours, and evenly spread hues (golden ratio) for the rest."""
    out = np.zeros((num_classes, 3), np.uint8)
    for c in range(num_classes):
        given = colours[c] if c < len(colours) else None
        if given is not None:
            out[c] = given
            continue
        hue = int((c * 0.618033988749895 % 1.0) * 180)
        sat, val = (255, 230) if c % 2 == 0 else (170, 255)
        out[c] = cv2.cvtColor(np.array([[[hue, sat, val]]], np.uint8), cv2.COLOR_HSV2RGB)[0, 0]
    return out


def ignore_colour(pal: np.ndarray) -> tuple[int, int, int]:
    """A colour for pixels without a class, far from every class colour (black unless one is near it)."""
    used = pal.astype(np.int32).reshape(-1, 3)
    for cand in IGNORE_CANDIDATES:
        if not len(used) or np.abs(used - np.array(cand)).max(axis=1).min() >= 64:
            return cand
    return IGNORE_CANDIDATES[0]


def colourize(ids: np.ndarray, colours: np.ndarray, ignore_colour: Sequence[int] = (0, 0, 0)) -> np.ndarray:
    """Class ids (H, W) → RGB (H, W, 3) uint8; ids without a class (e.g. 255) get ``ignore_colour``."""
    lut = np.empty((max(int(ids.max(initial=0)) + 1, len(colours)), 3), np.uint8)
    lut[:] = ignore_colour
    lut[: len(colours)] = colours
    return lut[ids]


def _text(img: np.ndarray, text: str, org: tuple[int, int], lay: Layout, scale: float = 1.0) -> None:
    safe = text.encode("ascii", "replace").decode("ascii")  # Hershey fonts draw ASCII only
    cv2.putText(img, safe, org, FONT, lay.font * scale, INK, lay.thickness, cv2.LINE_AA)


def _text_width(text: str, lay: Layout) -> int:
    return int(cv2.getTextSize(text, FONT, lay.font, lay.thickness)[0][0])


def _frame(img: np.ndarray, x: int, y: int, w: int, h: int, lay: Layout) -> None:
    """A frame just outside the box (x, y, w, h): the box's own pixels stay as drawn."""
    t = lay.thickness
    y0, x0 = max(y - t, 0), max(x - t, 0)
    img[y0:y, x0:x + w + t] = FRAME
    img[y + h:y + h + t, x0:x + w + t] = FRAME
    img[y0:y + h + t, x0:x] = FRAME
    img[y0:y + h + t, x + w:x + w + t] = FRAME


def _swatch(img: np.ndarray, x: int, y: int, lay: Layout, colour: Sequence[int] | np.ndarray) -> None:
    size = lay.swatch
    cv2.rectangle(img, (x, y), (x + size, y + size), tuple(int(v) for v in colour), -1)
    _frame(img, x, y, size + 1, size + 1, lay)


def _panels(image: np.ndarray, ids: np.ndarray, pal: np.ndarray, alpha: float
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[int, int, int]]:
    """(image, ids, label in class colours, overlay, no-class colour) at their size on the picture
    (:func:`display_scale`; labels always nearest, so no id is invented)."""
    h, w = ids.shape[:2]
    scale = display_scale(h, w)
    if scale != 1.0:
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        image = cv2.resize(image, size, interpolation=cv2.INTER_NEAREST if scale > 1 else cv2.INTER_AREA)
        ids = cv2.resize(ids, size, interpolation=cv2.INTER_NEAREST)
    no_class = ignore_colour(pal)
    label_rgb = colourize(ids, pal, no_class)
    overlay = cv2.addWeighted(image, 1.0 - alpha, label_rgb, alpha, 0.0)
    return image, ids, label_rgb, overlay, no_class


def _draw_row(canvas: np.ndarray, y: int, image: np.ndarray, label_rgb: np.ndarray, overlay: np.ndarray,
              alpha: float, lay: Layout, title: str = "") -> int:
    """Draw image | label | overlay (framed, with captions and an optional title line) from row ``y``;
    → panel top."""
    h, w = lay.panel_h, lay.panel_w
    top = y + lay.panel_top(bool(title))
    panels = ((image, "image"), (label_rgb, "label"), (overlay, f"overlay {alpha:g}"))
    for k, (panel, caption) in enumerate(panels):
        x = lay.panel_x(k)
        canvas[top:top + h, x:x + w] = panel
        _frame(canvas, x, top, w, h, lay)
        _text(canvas, caption, (x, top - lay.gap), lay)
    if title:
        _text(canvas, title, (lay.gap, y + lay.px(20)), lay, scale=1.1)
    return top


def render_sample(
    image: np.ndarray,
    ids: np.ndarray,
    class_names: Sequence[str],
    colours: Sequence[Sequence[int] | None] = (),
    *,
    ignore_index: int | None = None,
    alpha: float = 0.5,
    title: str = "",
) -> np.ndarray:
    """Image | label in class colours | overlay, with a legend of the classes present. RGB uint8.

    Pixel shares are counted on the sample as stored, before it is scaled for the picture."""
    num_classes = len(class_names)
    pal = palette(num_classes, colours)
    counts = np.bincount(ids.ravel(), minlength=num_classes)
    image, shown_ids, label_rgb, overlay, no_class = _panels(image, ids, pal, alpha)
    lay = Layout(*shown_ids.shape[:2])
    top = lay.panel_top(bool(title))

    present = [(c, int(n)) for c, n in enumerate(counts) if n]
    total = max(int(counts.sum()), 1)
    entries = []
    for c, n in present:
        name = class_names[c] if c < num_classes else "(no class)"
        if ignore_index is not None and c == ignore_index:
            name += " [ignore]"
        colour = pal[c] if c < num_classes else np.array(no_class)
        entries.append((colour, f"{c:>3} {name}  {100 * n / total:.1f}%"))
    sw = lay.swatch
    col_w = max([_text_width(t, lay) for _, t in entries] + [lay.px(100)]) + sw + lay.px(30)
    cols = max(1, (lay.width - 2 * lay.gap) // col_w)
    rows = -(-len(entries) // cols)
    legend_h = lay.px(30) + rows * lay.legend_row + 2 * lay.gap

    canvas = np.full((top + lay.panel_h + legend_h, lay.width, 3), BG, np.uint8)
    _draw_row(canvas, 0, image, label_rgb, overlay, alpha, lay, title)
    y0 = top + lay.panel_h + lay.px(26)
    _text(canvas, "classes in this sample (id, name, pixel share):", (lay.gap, y0), lay)
    for k, (colour, text) in enumerate(entries):
        x = lay.gap + (k // rows) * col_w if rows else lay.gap
        y = y0 + lay.gap + (k % rows) * lay.legend_row
        _swatch(canvas, x, y, lay, colour)
        _text(canvas, text, (x + sw + lay.px(8), y + sw - lay.px(2)), lay)
    return canvas


def render_rows(rows: Sequence[tuple[np.ndarray, np.ndarray, str]], class_names: Sequence[str],
                colours: Sequence[Sequence[int] | None] = (), *, alpha: float = 0.5) -> np.ndarray:
    """One image | label | overlay row per ``(image, ids, title)``, all the same size, stacked. RGB uint8.

    Every row has the same height (title line + panel + gap), so the picture is ``len(rows)`` times it.
    """
    pal = palette(len(class_names), colours)
    drawn = [(_panels(image, ids, pal, alpha), title) for image, ids, title in rows]
    if not drawn:
        raise ValueError("render_rows needs at least one row")
    sizes = {d[1].shape[:2] for d, _ in drawn}
    if len(sizes) > 1:
        raise ValueError(f"rows differ in size {sorted(sizes)}")
    lay = Layout(*sizes.pop())
    row_h = lay.panel_top(True) + lay.panel_h + lay.gap
    canvas = np.full((row_h * len(drawn), lay.width, 3), BG, np.uint8)
    for k, ((image, _ids, label_rgb, overlay, _nc), title) in enumerate(drawn):
        _draw_row(canvas, k * row_h, image, label_rgb, overlay, alpha, lay, title or " ")
    return canvas


def render_class_chart(class_names: Sequence[str], shares: Sequence[float],
                       colours: Sequence[Sequence[int] | None] = (), *, title: str = "") -> np.ndarray:
    """Horizontal bars of each class's share (``shares``, as given), with the value at each bar. RGB uint8."""
    pal = palette(len(class_names), colours)
    lay = Layout(0, BASE_PANEL_WIDTH)  # a chart has no sample to scale with: the base text size
    labels = [f"{c:>3} {name}" for c, name in enumerate(class_names)]
    label_w = max([_text_width(t, lay) for t in labels] + [60]) + 20
    bar_w, row_h, gap, top = 420, 24, 12, 44
    width = max(label_w + bar_w + 90, _text_width(title, lay) * 6 // 5 + 2 * gap)
    canvas = np.full((top + row_h * len(labels) + 2 * gap, width, 3), BG, np.uint8)
    _text(canvas, title or "class pixel share", (gap, 26), lay, scale=1.2)
    top_share = max([float(s) for s in shares] + [1e-12])
    for c, text in enumerate(labels):
        y = top + c * row_h
        share = float(shares[c]) if c < len(shares) else 0.0
        _text(canvas, text, (gap, y + 16), lay)
        length = round(bar_w * share / top_share)
        x0 = label_w
        cv2.rectangle(canvas, (x0, y + 3), (x0 + bar_w, y + row_h - 3), (238, 238, 238), -1)
        if length > 0:
            colour = tuple(int(v) for v in pal[c])
            cv2.rectangle(canvas, (x0, y + 3), (x0 + length, y + row_h - 3), colour, -1)
            cv2.rectangle(canvas, (x0, y + 3), (x0 + length, y + row_h - 3), FRAME, 1)
        _text(canvas, f"{100 * share:.2f}%", (x0 + bar_w + 8, y + 16), lay)
    return canvas


def write_png(path: str | Path, rgb: np.ndarray) -> Path:
    """Write an RGB picture as PNG (any path, also non-ASCII)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise OutputError("the folder to write the picture into does not exist", path=path.parent,
                          fix="create it first or choose another -o path")
    ok, data = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    if not ok:  # pragma: no cover - OpenCV encodes any uint8 RGB image
        raise OutputError("cannot encode the picture as PNG", path=path)
    try:
        path.write_bytes(data.tobytes())
    except OSError as exc:
        raise OutputError(f"cannot write the picture ({exc.strerror or exc})", path=path) from None
    return path


#: Percentiles a non-uint8 image is stretched between for display (per band): 2 and 98.
STRETCH_PERCENTILE = 2.0


def display_bands(image: np.ndarray, bands: Sequence[int] = (), percentile: float = STRETCH_PERCENTILE) -> np.ndarray:
    """An (H, W, C) stored image of any type as (H, W, 3) uint8 RGB to look at (never stored).

    ``bands``: 1-based bands shown as red, green, blue (``--bands 4,3,2``: a false-colour infrared), or one band as
    gray; by default the first three (RGB images as they are) or the first one of fewer. uint8 bands are shown
    as they are; other types stretched per band between their ``percentile`` and ``100 - percentile``
    percentiles (finite values only) to 0..255.
    """
    from .errors import ConfigError

    channels = image.shape[2] if image.ndim == 3 else 1
    img = image if image.ndim == 3 else image[:, :, None]
    chosen = list(bands) or ([1, 2, 3] if channels >= 3 else [1])
    if len(chosen) not in (1, 3) or not all(1 <= b <= channels for b in chosen):
        raise ConfigError(f"--bands {','.join(map(str, chosen))}: show draws 1 or 3 of this split's {channels} bands",
                          fix="choose three bands (red, green, blue) or one (gray) within 1.." + str(channels))
    picked = img[:, :, [b - 1 for b in chosen]]
    if picked.dtype != np.uint8:
        flat = picked.reshape(-1, len(chosen)).astype(np.float64)
        out = np.zeros(picked.shape, np.uint8)
        for k in range(len(chosen)):
            col = flat[:, k]
            finite = col[np.isfinite(col)]
            lo, hi = (np.percentile(finite, [percentile, 100 - percentile]) if finite.size else (0.0, 0.0))
            band = np.nan_to_num(picked[:, :, k].astype(np.float64), nan=lo)
            out[:, :, k] = np.rint(np.clip((band - lo) / (hi - lo), 0, 1) * 255) if hi > lo else 0
        picked = out
    return np.ascontiguousarray(np.repeat(picked, 3, axis=2) if len(chosen) == 1 else picked)


def show_sample(split_dir: str | Path, index: int, output: str | Path, *, alpha: float = 0.5,
                storage_options: dict[str, Any] | None = None, bands: Sequence[int] = ()) -> Path:
    """Render sample ``index`` of a converted split (a folder, or a URL such as ``s3://bucket/out/train`` read
    through the shard cache with ``storage_options``) to ``output`` (PNG); ``bands``: see :func:`display_bands`."""
    from .read.dataset import Dataset

    ds = Dataset(split_dir, labels="ids", storage_options=storage_options)
    if "volumes" in ds.manifest.source.extra:  # a slice of a volume: drawn with its neighbouring slices
        return write_png(output, render_volume_slice(ds, index, alpha=alpha, bands=bands))
    image, ids = ds[index]
    image = display_bands(np.asarray(image), bands)
    i = index % len(ds)
    title = f"{ds.manifest.split} #{i}: {ds.key(i)}"
    picture = render_sample(np.ascontiguousarray(image), np.ascontiguousarray(ids), ds.class_names,
                            ds.class_colours, ignore_index=ds.ignore_index, alpha=alpha, title=title)
    return write_png(output, picture)


def render_volume_slice(ds: Any, index: int, *, alpha: float = 0.5, bands: Sequence[int] = ()) -> np.ndarray:
    """Sample ``index`` of a volume split with its neighbouring slices
    (:func:`~shardkit.read.volumes.slice_neighbours`): one image | label | overlay row per slice, in slice order.
    ``bands``: one modality (1-based; default the first). One gray stretch over every row, so neighbours compare."""
    from .errors import ConfigError
    from .read.volumes import slice_neighbours

    if len(bands) > 1:
        raise ConfigError(f"--bands {','.join(map(str, bands))}: a volume slice is drawn one modality at a time",
                          fix="give one modality number, e.g. --bands 2 for the second")
    rows = slice_neighbours(ds, index, bands[0] if bands else 1)
    width = rows[0][1].shape[1]
    strip = display_bands(np.concatenate([image for _, image, _, _ in rows], axis=1)[:, :, None])
    return render_rows([(np.ascontiguousarray(strip[:, k * width:(k + 1) * width]), np.ascontiguousarray(ids), title)
                        for k, (_, _, ids, title) in enumerate(rows)], ds.class_names, ds.class_colours, alpha=alpha)


def show_augmented(split_dir: str | Path, index: int, output: str | Path, augment: str, *, draws: int = 8,
                   seed: int = 0, epoch: int = 0, alpha: float = 0.5,
                   storage_options: dict[str, Any] | None = None) -> Path:
    """Draw sample ``index`` as augmented in ``draws`` successive epochs (one row each) to ``output`` (PNG).

    Row k is ``aug(image, label, [index], seed=seed, epoch=epoch + k)``: what a model sees of that
    sample in epoch ``epoch + k``. ``augment`` is the :func:`shardkit.augment.parse` string form.
    """
    from . import augment as A
    from .read.dataset import Dataset

    aug = A.parse(augment)  # ConfigError before any shard is read
    ds = Dataset(split_dir, labels="ids", storage_options=storage_options)
    image, ids = ds[index]
    i = index % len(ds)
    ignore = 255 if ds.ignore_index is None else ds.ignore_index
    rows = []
    for k in range(draws):
        imgs, labs = aug([np.ascontiguousarray(image)], [np.ascontiguousarray(ids)], [i], seed=seed,
                         epoch=epoch + k, ignore_index=ignore)
        rows.append((imgs[0], labs[0], f"{ds.manifest.split} #{i}: {ds.key(i)}  seed {seed} epoch {epoch + k}"))
    return write_png(output, render_rows(rows, ds.class_names, ds.class_colours, alpha=alpha))


def class_share_basis(manifest: Any) -> str:
    """What a manifest's ``class_share`` counts, in words for a chart title: the pixels with a class id — the
    ignore class among them when the ignore index is a class (CamVid's 11), else not (255)."""
    from .store.stats import ignore_share

    classes = manifest.classes
    ignore, num = classes.ignore_index, classes.num_classes
    if ignore is None:
        return "class share of label pixels"
    if ignore < num:
        name = next((c.name for c in classes.classes if c.id == ignore), str(ignore))
        return f"class share of label pixels, ignore class {ignore} ({name}) included"
    share = ignore_share(manifest, ignore, num)
    counted = f", {100 * share:.2f} % of pixels" if share is not None else ""
    return f"class share of label pixels with a class id (ignore index {ignore}{counted}, not counted)"


def plot_classes(split_dir: str | Path, output: str | Path) -> Path:
    """Draw a split's class pixel-share chart (from its manifest; no shard is read) to ``output`` (PNG)."""
    from .store.source import open_bytes

    with open_bytes(Path(split_dir), lease=False) as source:
        m = source.manifest
    classes = m.classes.classes  # in id order (ClassTable checks it)
    names = [c.name for c in classes]
    colours = [None if c.colour is None else list(c.colour) for c in classes]
    shares = list(m.stats.class_share or ())
    title = f"{m.split}: {class_share_basis(m)} ({m.num_samples} samples)"
    return write_png(output, render_class_chart(names, shares, colours, title=title))
