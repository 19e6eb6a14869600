"""The audit page opened in a real browser (Chromium, headless, from the distribution's packages): it loads from
disk with no console message, its pictures decode, its charts have a size, and a screenshot of it is not blank.

Chromium is required, never skipped: ``.ci/run`` installs it (``apt-get install chromium``) before the tests.
Each check is first shown to catch what it looks for, on a page made to fail it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from shardkit.cli import main

from .conftest import SEQUENCE

#: a page that opens the report in a frame and, once everything has loaded, writes what rendered into its DOM
#: (``--dump-dom`` prints it): every picture decoded, every chart laid out with a size
HARNESS = """<!DOCTYPE html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"></head><body>
<iframe id="report" src="REPORT" width="1200" height="3000"></iframe>
<script>
window.addEventListener("load", function () {
  var d = document.getElementById("report").contentDocument;
  var images = Array.from(d.images);
  var charts = Array.from(d.querySelectorAll("svg"));
  var result = {
    title: d.title,
    images: images.length,
    broken: images.filter(function (i) { return !(i.complete && i.naturalWidth > 0); }).map(function (i) {
      return i.alt; }),
    charts: charts.length,
    empty_charts: charts.filter(function (s) { var b = s.getBBox(); return !(b.width > 0 && b.height > 0); }).length,
    bars: d.querySelectorAll("svg rect").length,
    sections: Array.from(d.querySelectorAll("section")).map(function (s) { return s.id; })
  };
  var out = document.createElement("pre");
  out.id = "result";
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
</script></body></html>
"""


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed: the audit page is tested in a real browser — install it with "
                    "`apt-get install -y chromium` (.ci/run does)")
    return found


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           *args], capture_output=True, text=True, timeout=120, check=False)


def console_messages(page: Path, screenshot: Path) -> list[str]:
    """Open ``page`` and screenshot it; → the page's console messages as Chromium logs them."""
    got = _run("--enable-logging=stderr", "--v=0", "--window-size=1200,3000", f"--screenshot={screenshot}",
               page.resolve().as_uri())
    assert got.returncode == 0, got.stderr[-2000:]
    return [line for line in got.stderr.splitlines() if ":CONSOLE" in line]


def rendered(page: Path, folder: Path) -> dict[str, object]:
    """What the browser rendered of ``page``, from the harness's DOM."""
    harness = folder / f"harness-{page.stem}.html"
    harness.write_text(HARNESS.replace("REPORT", page.resolve().as_uri()), encoding="utf-8")
    got = _run("--allow-file-access-from-files", "--virtual-time-budget=10000", "--dump-dom", harness.as_uri())
    assert got.returncode == 0, got.stderr[-2000:]
    found = re.search(r'<pre id="result">(.*?)</pre>', got.stdout, re.S)
    assert found is not None, got.stdout[-2000:]
    result: dict[str, object] = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return result


@pytest.fixture(scope="module")
def report(audited: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("audit-browser") / "audit.html"
    got = CliRunner().invoke(main, ["audit", str(audited), "--html", str(target), "--group-by", SEQUENCE,
                                    "--samples", "4"])
    assert got.exit_code == 0, got.output
    return target


def test_the_page_loads_without_console_messages_and_its_screenshot_is_not_blank(report: Path,
                                                                                    tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    assert console_messages(report, shot) == []
    picture = cv2.imread(str(shot), cv2.IMREAD_COLOR)
    assert picture is not None and picture.shape[:2] == (3000, 1200)
    colours = np.unique(picture.reshape(-1, 3), axis=0)
    assert len(colours) > 200  # text (antialiased) and bars in the class colours: far from one colour
    # the bars are drawn in the class colours: CamVid's Building (128, 0, 0) and Road (128, 64, 128) are on it
    for rgb in ((128, 0, 0), (128, 64, 128)):
        assert (np.abs(picture.astype(int) - rgb[::-1]).sum(axis=2) == 0).sum() > 500


def test_the_console_check_sees_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body><p>x</p>'
                   "<script>console.error('broken chart')</script></body></html>")
    assert any("broken chart" in line for line in console_messages(bad, tmp_path / "bad.png"))


def test_every_picture_decodes_and_every_chart_has_a_size(report: Path, audited: Path, tmp_path: Path) -> None:
    got = rendered(report, tmp_path)
    assert got["title"] == f"shardkit audit: {audited.name}"
    assert got["images"] == 8 + 4 and got["broken"] == []  # --samples 4, two splits; the leak and copy pairs
    assert got["charts"] == 4 and got["empty_charts"] == 0  # pixel share and images per class, per split
    assert got["bars"] == 4 * 2 * 12
    assert got["sections"] == ["summary", "classes", "groups", "leaks", "duplicates", "near", "sanity", "tiles",
                               "samples", "provenance"]


def test_the_render_check_sees_a_broken_picture(report: Path, tmp_path: Path) -> None:
    page = report.read_text(encoding="utf-8")
    first = page.index("data:image/png;base64,") + len("data:image/png;base64,")
    broken = tmp_path / "broken.html"
    broken.write_text(page[:first] + "AAAA" + page[first + 4000:], encoding="utf-8")  # a PNG cut short
    got = rendered(broken, tmp_path)
    assert got["images"] == 12 and len(got["broken"]) == 1  # type: ignore[arg-type]
