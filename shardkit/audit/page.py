"""The audit report: one self-contained HTML page a person opens from disk (``shardkit audit OUT --html FILE``).

No script, no server, no network: the style is inline, the charts are inline SVG, the sample pictures are PNG data
URIs drawn by ``shardkit show``'s :func:`~shardkit.show.render_sample` (this module is a front module for that
reason: it belongs to the ``front`` layer although it lives beside the audit facts). The facts come from
:mod:`.facts` (manifests and sidecars); only the drawn samples' labels are read.
"""

from __future__ import annotations

import base64
import html
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import cv2
import numpy as np

from ..labels.raster import report_lines
from ..read.dataset import Dataset
from ..show import class_share_basis, display_bands, palette, render_sample
from ..store.duplicates import group_lines
from ..store.publish import atomic_write_bytes
from .facts import (
    ONE_CLASS_SHARE,
    PICTURED,
    TINY_COMPONENT,
    AuditFacts,
    LabelSanity,
    SplitFacts,
    draw_indices,
    label_sanity,
)
from .near import KINDS

log = logging.getLogger(__name__)

#: widest sample picture on the page, in pixels (pictures are drawn by show, then made smaller)
THUMB_WIDTH = 640
#: samples drawn per split at most
MAX_SAMPLES = 64

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:#1b1b1b;background:#fff;margin:0 auto;
max-width:1100px;padding:16px 24px}
h1{font-size:24px;margin:8px 0}h2{font-size:19px;margin-top:28px;border-bottom:1px solid #ccc}h3{font-size:16px}
nav a{margin-right:12px}table{border-collapse:collapse;margin:6px 0 12px}
td,th{border:1px solid #d5d5d5;padding:2px 8px;text-align:left}td.n,th.n{text-align:right}
th{background:#f2f2f2}.warn{color:#a01010;font-weight:600}.ok{color:#176017;font-weight:600}
.note{color:#555}.grid{display:flex;flex-wrap:wrap;gap:12px}
figure{margin:0;flex:0 1 520px}figure img{width:100%;border:1px solid #bbb}figcaption{font-size:12px;color:#444}
svg text{font:12px system-ui,sans-serif}code{background:#f4f4f4;padding:0 3px}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _pct(share: float | None, digits: int = 2) -> str:
    return "–" if share is None else f"{100 * share:.{digits}f} %"


def _hex(colour: Sequence[int] | np.ndarray) -> str:
    return "#" + "".join(f"{int(v):02x}" for v in colour)


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float], colours: Sequence[str],
              texts: Sequence[str]) -> str:
    """A horizontal bar chart as inline SVG: one row per label, bars scaled to the largest value."""
    row, label_w, bar_w, top = 20, 190, 460, 26
    height = top + row * len(labels) + 8
    width = label_w + bar_w + 110
    most = max([float(v) for v in values] + [1e-12])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}"><title>{_e(title)}</title>',
             f'<text x="4" y="16" font-weight="600">{_e(title)}</text>']
    for k, (label, value, colour, text) in enumerate(zip(labels, values, colours, texts, strict=True)):
        y = top + k * row
        length = bar_w * float(value) / most
        parts.append(f'<text x="4" y="{y + 14}">{_e(label)}</text>'
                     f'<rect x="{label_w}" y="{y + 3}" width="{bar_w}" height="{row - 6}" fill="#eeeeee"/>'
                     f'<rect x="{label_w}" y="{y + 3}" width="{length:.1f}" height="{row - 6}" fill="{colour}" '
                     f'stroke="#5a5a5a" stroke-width="0.6"/>'
                     f'<text x="{label_w + bar_w + 6}" y="{y + 14}">{_e(text)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(head: Sequence[str], rows: Iterable[Sequence[object]], numeric: Sequence[bool] = ()) -> str:
    num = list(numeric) + [False] * len(head)
    out = ["<table><tr>" + "".join(f'<th{" class=n" if num[k] else ""}>{_e(h)}</th>' for k, h in enumerate(head))
           + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(f'<td{" class=n" if num[k] else ""}>{_e(v)}</td>' for k, v in enumerate(r))
                   + "</tr>")
    return "".join(out) + "</table>"


def _colours(s: SplitFacts) -> list[str]:
    pal = palette(len(s.classes), [c.colour for c in s.classes])
    return [_hex(p) for p in pal]


def _classes_section(s: SplitFacts, basis: str) -> str:
    labels = [f"{c.id} {c.name}" for c in s.classes]
    colours = _colours(s)
    out = [f'<h3 id="classes-{_e(s.split)}">{_e(s.split)}</h3>',
           bar_chart(f"{s.split}: {basis}", labels, [c.pixel_share for c in s.classes],
                     colours, [_pct(c.pixel_share) for c in s.classes])]
    if s.classes and s.classes[0].images is not None:
        shares = [(c.images or 0) / max(s.samples, 1) for c in s.classes]
        out.append(bar_chart(f"{s.split}: share of images containing the class", labels, shares, colours,
                             [f"{c.images} of {s.samples}" for c in s.classes]))
    out.append(_table(["id", "class", "pixels", "pixel share", "images", "image share"],
                      [(c.id, c.name, c.pixels, _pct(c.pixel_share), "–" if c.images is None else c.images,
                        "–" if c.images is None else _pct(c.images / max(s.samples, 1), 1)) for c in s.classes],
                      [True, False, True, True, True, True]))
    return "".join(out)


def _groups_section(facts: AuditFacts) -> str:
    out = [f"<p>groups by {_e(facts.rule)}: <b>{facts.groups}</b> groups of "
           f"{sum(s.samples for s in facts.splits)} samples.</p>",
           "<h3>largest groups</h3>", _table(["group", "samples"], facts.group_sizes, [False, True]),
           "<h3>group sizes</h3>", _table(["samples in the group", "groups"], facts.group_size_counts.items(),
                                          [True, True])]
    return "".join(out)


Picture = Callable[[str, int], str]  # (split, index) → a <figure> of that sample


def _side_by_side(title: str, figures: Sequence[str]) -> str:
    return f'<h3>{_e(title)}</h3><div class="grid pair">{"".join(figures)}</div>'


def _leaks_section(facts: AuditFacts, picture: Picture) -> str:
    if not facts.shared_groups:
        return f'<p class="ok">no group is in more than one split (groups by {_e(facts.rule)}).</p>'
    rows = list(facts.shared_groups.items())
    pairs = "".join(_side_by_side(f"group {g}: its first sample in each split", [picture(s, i) for s, i in where])
                    for g, where in facts.leak_examples)
    return (f'<p class="warn">{len(rows)} group(s) are in more than one split (groups by {_e(facts.rule)}): '
            "their samples are near copies of each other across the splits.</p>"
            + _table(["group", "splits"], [(g, ", ".join(s)) for g, s in rows[:50]])
            + (f"<p>… and {len(rows) - 50} more</p>" if len(rows) > 50 else "") + pairs)


def _duplicates_section(facts: AuditFacts, picture: Picture) -> str:
    report = facts.duplicates
    cls = "warn" if report.groups else "ok"
    lines = "".join(f"<li>{_e(line)}</li>" for line in group_lines(report))
    tiled = {s.split for s in facts.splits if s.tiles is not None}  # their copies are whole sources, not samples
    pairs = "".join(_side_by_side(f"{len(g.copies)} copies", [picture(c.split, c.index) for c in g.copies[:2]])
                    for g in report.groups[:PICTURED] if not {c.split for c in g.copies[:2]} & tiled)
    return (f'<p class="{cls}">{_e(report.line())}</p>' + (f"<ul>{lines}</ul>" if lines else "") + pairs
            + '<p class="note">identical decoded pixels, from the pixel hashes the samples sidecars keep '
              "(<code>shardkit verify</code> recomputes them); re-encoded or resized copies are not found.</p>")


def _near_section(facts: AuditFacts, picture: Picture) -> str:
    report = facts.near
    if report is None:
        return '<p class="note">not searched: a split keeps no look hashes (see the notes above).</p>'
    cls = "warn" if report.leaks else "ok"
    rows = [(kind, n) for kind, n in report.counts.items()]
    pairs = "".join(_side_by_side(f"{a[0]}/#{a[1]} and {b[0]}/#{b[1]}: {bits} of 64 bits differ",
                                  [picture(*a), picture(*b)]) for a, b, bits in
                    facts.near_examples.get(KINDS[0], [])[:PICTURED])
    return (f'<p class="{cls}">{_e(report.line())}</p>' + _table(["pair", "pairs"], rows, [False, True]) + pairs
            + f'<p class="note">look hashes (64-bit difference hashes the samples sidecars keep) within '
              f"{report.threshold} bits: a JPEG re-encoding or a resize moves 0–2. Pairs inside one group (frames of "
              "one sequence, tiles of one scene) are similar by nature and counted apart; pairs in two splits and two "
              "groups are leaks the groups do not explain (pictured).</p>")


def _sanity_section(s: SplitFacts, drawn: Sequence[tuple[int, str, LabelSanity]]) -> str:
    names = [c.name for c in s.classes]
    never = ", ".join(f"{c} {names[c]}" for c in s.never_present)
    out = [f'<h3 id="sanity-{_e(s.split)}">{_e(s.split)}</h3><ul>',
           f'<li>classes never present: <span class="{"warn" if never else "ok"}">{_e(never or "none")}</span></li>',
           f"<li>ignore index: {_e(s.ignore_index if s.ignore_index is not None else 'none')}, "
           f"{_pct(s.ignore_share)} of label pixels</li>"]
    if s.one_class is not None:
        keys = ", ".join(f"{k}: {c} {names[c]}" for k, c in s.one_class_keys)
        keys += " …" if s.one_class > len(s.one_class_keys) else ""
        out.append(f"<li>images whose label holds one class only (class bitmaps): <b>{s.one_class}</b>"
                   + (f" ({_e(keys)})" if keys else "") + "</li>")
    out.append("</ul>")
    if drawn:
        almost = sum(d.almost_one_class for _, _, d in drawn)
        tiny = sum(d.tiny_components for _, _, d in drawn)
        out.append(f'<p class="note">read in full: the {len(drawn)} sample(s) drawn below (not every label): '
                   f"{almost} with one class on at least {ONE_CLASS_SHARE:.0%} of its pixels, {tiny} connected "
                   f"region(s) smaller than {TINY_COMPONENT} pixels.</p>")
        out.append(_table(["#", "key", "ignore share", "largest class", "its share", "regions",
                           f"regions < {TINY_COMPONENT} px"],
                          [(i, key, _pct(d.ignore_share), f"{d.top_class} {names[d.top_class]}", _pct(d.top_share),
                            d.components, d.tiny_components) for i, key, d in drawn],
                          [True, False, True, False, True, True, True]))
    return "".join(out)


def _tiles_section(s: SplitFacts) -> str:
    if s.tiles is None:
        return (f"<p><b>{_e(s.split)}</b>: not tiled; {s.sources} source image(s) for {s.samples} samples.</p>")
    t = s.tiles
    return (f"<p><b>{_e(s.split)}</b>: tiles {_e(t['tile'])}; {t['sources']} sources, tiles per source min "
            f"{t['min']}, median {t['median']:g}, max {t['max']}.</p>")


def _provenance_section(s: SplitFacts) -> str:
    out = [f"<h3>{_e(s.split)}</h3><ul><li>class table from {_e(s.class_source)}</li>"]
    out += [f"<li><code>{_e(k)}</code>: {_e(v)}</li>" for k, v in s.label_options.items()]
    out.append(f"<li>inputs skipped at convert: {s.skipped}</li></ul>")
    lines = report_lines(s.annotations)
    if lines:
        out.append("<p>rasterisation of the annotation sources:</p><pre>" + _e("\n".join(lines)) + "</pre>")
    else:
        out.append('<p class="note">labels from mask images: no rasterisation report.</p>')
    return "".join(out)


def thumbnail(ds: Dataset, image: np.ndarray, ids: np.ndarray, title: str) -> str:
    """A sample of ``ds`` drawn by ``show`` (image | label | overlay, legend), at most :data:`THUMB_WIDTH` wide, as
    a PNG data URI."""
    picture = render_sample(display_bands(np.asarray(image)), np.ascontiguousarray(ids), ds.class_names,
                            ds.class_colours, ignore_index=ds.ignore_index, title=title)
    h, w = picture.shape[:2]
    if w > THUMB_WIDTH:
        picture = cv2.resize(picture, (THUMB_WIDTH, max(1, round(h * THUMB_WIDTH / w))), interpolation=cv2.INTER_AREA)
    ok, data = cv2.imencode(".png", cv2.cvtColor(picture, cv2.COLOR_RGB2BGR))
    if not ok:  # pragma: no cover - OpenCV encodes any uint8 RGB picture
        raise RuntimeError("cannot encode a PNG")
    return "data:image/png;base64," + base64.b64encode(data.tobytes()).decode("ascii")


def _figure(ds: Dataset, split: str, index: int, key: str, image: np.ndarray, ids: np.ndarray) -> str:
    uri = thumbnail(ds, image, ids, f"{split} #{index}: {key}")
    return (f'<figure><img alt="{_e(split)} #{index}" src="{uri}"><figcaption>{_e(split)} #{index}: {_e(key)}'
            "</figcaption></figure>")


def render(facts: AuditFacts, datasets: Sequence[Dataset], title: str, samples: int = 8, seed: int = 0) -> str:
    """The report page of ``facts`` (``datasets``: the same splits, opened with class-id labels, for the
    ``samples`` pictures drawn per split from ``seed``)."""
    count = max(0, min(samples, MAX_SAMPLES))
    grids, sanity = [], []
    for s, ds in zip(facts.splits, datasets, strict=True):
        figures, drawn = [], []
        for i in draw_indices(len(ds), count, seed):
            key = ds.key(i)
            image, ids = (np.asarray(a) for a in ds[i])
            drawn.append((i, key, label_sanity(ids, len(s.classes), s.ignore_index)))
            figures.append(_figure(ds, s.split, i, key, image, ids))
        grids.append(f'<h3 id="samples-{_e(s.split)}">{_e(s.split)}: {len(figures)} of {s.samples} samples '
                     f'(drawn with seed {seed})</h3><div class="grid">{"".join(figures)}</div>')
        sanity.append(_sanity_section(s, drawn))
    by_split = {s.split: ds for s, ds in zip(facts.splits, datasets, strict=True)}

    def picture(split: str, index: int) -> str:
        ds = by_split[split]
        image, ids = (np.asarray(a) for a in ds[index])
        return _figure(ds, split, index, ds.key(index), image, ids)

    summary = _table(["split", "samples", "shards", "MB", "format", "sources", "classes", "ignore share"],
                     [(s.split, s.samples, s.shards, f"{s.bytes / 1e6:.1f}", s.format, s.sources, len(s.classes),
                       _pct(s.ignore_share)) for s in facts.splits], [False, True, True, True, False, True, True, True])
    sections = [
        ("summary", "Summary", summary + "".join(f'<p class="note">{_e(n)}</p>' for n in facts.notes)),
        ("classes", "Classes per split", "".join(_classes_section(s, class_share_basis(ds.manifest))
                                                   for s, ds in zip(facts.splits, datasets, strict=True))),
        ("groups", "Groups", _groups_section(facts)),
        ("leaks", "Groups shared between splits", _leaks_section(facts, picture)),
        ("duplicates", "Exact duplicates", _duplicates_section(facts, picture)),
        ("near", "Near-duplicates", _near_section(facts, picture)),
        ("sanity", "Label sanity", "".join(sanity)),
        ("tiles", "Tiles per source", "".join(_tiles_section(s) for s in facts.splits)),
        ("samples", "Samples", "".join(grids)),
        ("provenance", "How the labels were made", "".join(_provenance_section(s) for s in facts.splits)),
    ]
    nav = "".join(f'<a href="#{k}">{_e(t)}</a>' for k, t, _ in sections)
    body = "".join(f'<section id="{k}"><h2>{_e(t)}</h2>{content}</section>' for k, t, content in sections)
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
            f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{_e(title)}</h1><nav>{nav}</nav>{body}</body></html>\n")


def write_report(path: Path, page: str) -> Path:
    """Write the page whole or not at all."""
    atomic_write_bytes(path, page.encode("utf-8"))
    log.info("audit report written to %s (%d bytes)", path, len(page))
    return path


def audit_title(out: Path) -> str:
    return f"shardkit audit: {Path(out).resolve().name}"
