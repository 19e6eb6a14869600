"""The documentation site as a reader gets it: built strictly, self-contained (no asset from the web), and its
API reference listing the public types and members a user meets — and none of the internals."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")

ROOT = Path(__file__).resolve().parents[1]
#: what makes a browser fetch something: scripts, stylesheets, images, frames, media (a plain <a href> link does not)
ASSET = re.compile(r"<(?:script|link|img|iframe|source|video|audio|embed)\b[^>]*\b(?:src|href)=[\"']?(https?:)?//",
                   re.IGNORECASE)
CSS_REMOTE = re.compile(r"(?:url\(\s*[\"']?|@import\s+[\"']?)(?:https?:)?//", re.IGNORECASE)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_site_loads_no_asset_from_the_web(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 30
    remote = [f"{p.relative_to(site)}: {m.group(0)}" for p in pages for m in ASSET.finditer(p.read_text())]
    remote += [f"{p.relative_to(site)}: {m.group(0)}" for p in sorted(site.rglob("*.css"))
               for m in CSS_REMOTE.finditer(p.read_text(errors="replace"))]
    assert remote == []


def test_code_is_coloured_at_build_time(site: Path) -> None:
    page = (site / "tutorial" / "index.html").read_text()
    assert '<div class="highlight">' in page and "css/pygments.css" in page
    assert (site / "css" / "pygments.css").is_file()


def _headings(page: Path) -> set[str]:
    """The ids of the objects the API page documents (mkdocstrings gives each heading its dotted path)."""
    return set(re.findall(r'<h[2-4] id="([A-Za-z_][\w.]*)"', page.read_text()))


def test_api_reference_has_the_public_types(site: Path) -> None:
    found = _headings(site / "api" / "shardkit" / "index.html")
    for name in ("shardkit.open", "shardkit.convert", "shardkit.read.options.OpenOptions",
                 "shardkit.read.options.EpochPlan", "shardkit.conversion.config.ConvertConfig",
                 "shardkit.conversion.pipeline.ConvertSummary"):
        assert name in found, (name, sorted(found))


def test_convert_config_is_a_table_not_a_dump_of_option_calls(site: Path) -> None:
    page = (site / "api" / "shardkit" / "index.html").read_text()
    assert "option(" not in page
    from shardkit.conversion.config import cli_options

    for fld, _ in cli_options():
        assert f"<code>{fld.name}</code>" in page, fld.name


def test_dataset_page_shows_public_members_and_hides_internals(site: Path) -> None:
    found = _headings(site / "api" / "dataset" / "index.html")
    prefix = "shardkit.read.dataset.Dataset."
    for name in ("ignore_index", "num_classes", "onehot_channels", "class_names", "key", "manifest", "__len__",
                 "__getitem__", "batch", "iter_batches", "sampler", "class_presence", "look_hashes",
                 "class_weights"):
        assert prefix + name in found, name
    for name in ("read_stored_into", "empty_batch", "ring_layout", "_Ring", "readers", "batch_layout"):
        assert not any(h.endswith("." + name) for h in found), name


def test_tf_dataset_page_has_the_real_signature(site: Path) -> None:
    page = (site / "api" / "tf" / "index.html").read_text()
    assert "**kwargs" not in page
    for parameter in ("normalize", "augment", "with_keys", "cycle_length", "options"):
        assert parameter in page, parameter
    assert "uint8" in page


def test_adapter_pages_show_no_internals(site: Path) -> None:
    torch_page = _headings(site / "api" / "torch" / "index.html")
    assert "shardkit.read.torch.make_loader" in torch_page
    assert not any(h.endswith(".ring_layout") for h in torch_page)
    grain_page = _headings(site / "api" / "grain" / "index.html")
    assert {"shardkit.read.grain.ShardkitSource", "shardkit.read.grain.data_loader",
            "shardkit.read.grain.batch_loader", "shardkit.read.grain.XY"} <= grain_page
