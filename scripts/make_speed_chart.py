#!/usr/bin/env python
"""README's speed chart, drawn from the JSON ``scripts/bench_peers.py --json FILE`` writes (OpenCV only).

One bar per read row of that run — shardkit's batched readers, its torch loader, and each peer's reader when the
peers were installed — as samples/s divided by the naive pipeline's (decode the PNGs and crop, every epoch) in
the same run, so the ratios hold although absolute rates drift between runs on a shared machine. The limits
(memcpy, copying out of the mmap'd files) are drawn as a line. Run::

    python scripts/bench_peers.py --json docs/perf/bench-peers.json      # the measurement (minutes)
    python scripts/make_speed_chart.py docs/perf/bench-peers.json [-o docs/img/speed.png]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
NAIVE = "naive online: decode + crop (uint8, ids)"  # the baseline every bar is divided by
LIMIT = "limit: copy out of mmap'd shards, random"
SKIP = ("limit:", "naive online:")
FONT = cv2.FONT_HERSHEY_SIMPLEX
INK, GRID, BAR, PEER = (20, 20, 20), (225, 225, 225), (52, 101, 164), (150, 150, 150)

log = logging.getLogger("make_speed_chart")


def short(name: str) -> str:
    """A row name without the method note in parentheses (``… batched (ds.batch, …)`` → ``… batched``)."""
    return name.split(" (")[0] if name.startswith("shardkit") else name


def bars(doc: dict) -> tuple[list[tuple[str, float, bool]], float | None]:
    """``(label, ratio to the naive pipeline, is shardkit)`` per read row, and the mmap-copy limit's ratio."""
    reads = {r["name"]: float(r["samples_per_s"]) for r in doc["reads"]}
    if reads.get(NAIVE, 0.0) <= 0:
        raise SystemExit(f"the JSON has no {NAIVE!r} row to divide by: was it written by scripts/bench_peers.py?")
    base = reads[NAIVE]
    rows = [(short(n), v / base, n.startswith("shardkit")) for n, v in reads.items()
            if not n.startswith(SKIP) and "one-hot" not in n]
    limit = reads[LIMIT] / base if LIMIT in reads else None
    return sorted(rows, key=lambda r: -r[1]), limit


def draw(rows: list[tuple[str, float, bool]], limit: float | None, title: str, footer: list[str]) -> np.ndarray:
    """Horizontal bars, the value at each; RGB uint8."""
    scale, pad, row_h, bar_w = 0.5, 12, 26, 520
    label_w = max(cv2.getTextSize(t, FONT, scale, 1)[0][0] for t, _, _ in rows) + 2 * pad
    top = max([r for _, r, _ in rows] + [limit or 0.0])
    width = max([label_w + bar_w + 90] + [cv2.getTextSize(t, FONT, 0.42, 1)[0][0] + 2 * pad for t in footer]
                + [cv2.getTextSize(title, FONT, 0.55, 1)[0][0] + 2 * pad])
    height = 44 + row_h * len(rows) + 18 * len(footer) + 2 * pad
    img = np.full((height, width, 3), 255, np.uint8)
    cv2.putText(img, title, (pad, 26), FONT, 0.55, INK, 1, cv2.LINE_AA)
    y0 = 40
    for k, (text, ratio, ours) in enumerate(rows):
        y = y0 + k * row_h
        cv2.putText(img, text, (pad, y + 17), FONT, scale, INK, 1, cv2.LINE_AA)
        cv2.rectangle(img, (label_w, y + 4), (label_w + bar_w, y + row_h - 4), GRID, -1)
        length = max(1, round(bar_w * ratio / top))
        cv2.rectangle(img, (label_w, y + 4), (label_w + length, y + row_h - 4), BAR if ours else PEER, -1)
        cv2.putText(img, f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x", (label_w + bar_w + 8, y + 17), FONT,
                    scale, INK, 1, cv2.LINE_AA)
    if limit is not None:
        x = label_w + round(bar_w * limit / top)
        cv2.line(img, (x, y0), (x, y0 + row_h * len(rows)), (200, 60, 40), 1, cv2.LINE_AA)
    for k, text in enumerate(footer):
        cv2.putText(img, text, (pad, y0 + row_h * len(rows) + 20 + 18 * k), FONT, 0.42, INK, 1, cv2.LINE_AA)
    return img


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path, help="a file scripts/bench_peers.py --json wrote")
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "docs" / "img" / "speed.png")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    doc = json.loads(args.json.read_text(encoding="utf-8"))
    rows, limit = bars(doc)
    machine = doc.get("machine", {})
    load = doc.get("load")
    footer = [f"real CamVid at 352x480, {doc['samples']} samples, batches of {doc['batch_size']}, medians of "
              f"{doc['repeats']} passes; red line: copying the same bytes out of the mmap'd files",
              f"{machine.get('nproc', '?')} cores ({machine.get('cpu', '?')}), torch {machine.get('torch', '?')}"
              + (f", load {load[0]:.1f}-{load[1]:.1f}" if load else "") + f"; {doc['command']}"]
    picture = draw(rows, limit, "samples/s, x the naive pipeline (decode the PNGs + crop every epoch), one run", footer)
    ok, data = cv2.imencode(".png", cv2.cvtColor(picture, cv2.COLOR_RGB2BGR))
    if not ok:
        raise SystemExit("OpenCV could not encode the chart")
    args.output.write_bytes(data.tobytes())
    for text, ratio, _ in rows:
        log.info("%-40s %6.1fx", text, ratio)
    log.info("written to %s (%d KB)", args.output, len(data) // 1024)
    return 0


if __name__ == "__main__":
    sys.exit(main())
