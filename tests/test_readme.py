"""README is a landing page (#43): its links and pictures exist, and its chart is what the committed benchmark
JSON says (scripts/make_speed_chart.py reads the rows scripts/bench_peers.py writes)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_every_relative_link_and_picture_of_readme_exists_and_pictures_are_small() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert len(local) > 20 and [link for link in local if not (ROOT / link).exists()] == []
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README)
    assert len(pictures) == 3
    for picture in pictures:
        data = (ROOT / picture).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 300_000, (picture, len(data))


def test_the_speed_chart_reads_the_committed_benchmark_json() -> None:
    spec = importlib.util.spec_from_file_location("make_speed_chart", ROOT / "scripts" / "make_speed_chart.py")
    assert spec is not None and spec.loader is not None
    chart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chart)
    doc = json.loads((ROOT / "docs" / "perf" / "bench-peers.json").read_text())
    assert "scripts/bench_peers.py" in doc["command"]
    rows, limit = chart.bars(doc)
    rates = {r["name"]: r["samples_per_s"] for r in doc["reads"]}
    naive = rates[chart.NAIVE]
    npy = next(ratio for label, ratio, _ in rows if label == "shardkit npy batched")
    assert npy == rates["shardkit npy batched (ds.batch, sorted random batches of 32)"] / naive
    assert limit == rates[chart.LIMIT] / naive and [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)
    assert chart.draw(rows, limit, "t", ["f"]).shape[2] == 3
