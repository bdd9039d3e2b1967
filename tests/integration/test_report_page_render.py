"""The HTML report as a browser shows it: headless Chromium (Debian's package, as for the flame
graphs) opens the page with every host name unresolvable, so anything it tried to fetch would
fail, and dumps the DOM after the load event. The page counts its own script errors and failed
loads on <html> (`data-page-errors`, and the images that did not decode); a deliberately broken
copy shows that the count sees both.

Skipped, saying why, where Chromium is not installed (`make browser`).
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sidecar.cli import main
from sidecar.flame.graph import build_tree, layout
from sidecar.flame.svg import PHASE_COLOURS
from sidecar.report.page_assets import BROKEN_ATTR, ERRORS_ATTR, LOADED_ATTR
from sidecar.report.text import profile_block
from sidecar.store.stacks import read_stack_rows
from sidecar.store.summary_io import read_summary
from tests.html_dom import Node, cells, parse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flame"
BASELINE, LATEST = FIXTURES / "prefill-heavy", FIXTURES / "decode-heavy"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make browser)"),
]


def chromium(tmp_path: Path, *args: str) -> tuple[str, str]:
    """Headless Chromium, offline, with its own profile and console messages on stderr."""
    assert CHROMIUM is not None
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            OFFLINE, "--enable-logging=stderr", "--v=0",
            f"--user-data-dir={tmp_path / 'profile'}", *args]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=True)
    return done.stdout, done.stderr


@pytest.fixture
def page(tmp_path: Path) -> Path:
    """The page of a small daemon output: two real snapshots, the older one the baseline."""
    host = tmp_path / "out" / "devhost"
    shutil.copytree(BASELINE, host / "20261201T141054Z-baseline")
    shutil.copytree(LATEST, host / "20261201T141110Z")
    path = tmp_path / "page.html"
    assert main(["report", str(tmp_path / "out"), "--format", "html", "-o", str(path)]) == 0
    return path


def rendered(tmp_path: Path, page: Path) -> tuple[Node, str]:
    dom, log = chromium(tmp_path, "--dump-dom", page.as_uri())
    return parse(dom.removeprefix("<!DOCTYPE html>")), log


def html_of(dom: Node) -> Node:
    return dom.find("html")


def test_the_page_loads_offline_without_errors_and_shows_the_key_figures(
    page: Path, tmp_path: Path
) -> None:
    dom, log = rendered(tmp_path, page)
    root = html_of(dom)
    assert root.attrs[LOADED_ATTR] == "1"
    assert root.attrs[ERRORS_ATTR] == "0", root.attrs.get("data-page-error-list")
    assert root.attrs[BROKEN_ATTR] == "0"  # the trend PNG decoded from its data: URI
    assert ":CONSOLE" not in log and "Uncaught" not in log  # nothing written to the console
    summary = read_summary(LATEST)
    assert dom.by_id("profile-text").all_text() == profile_block(summary)
    requests = dom.find("div", data_figure="requests_per_s").all_text()
    assert f"{summary.serving.requests_per_s:.1f} req/s" in requests
    worker = dom.find("div", class_="by-role").find("div", data_role="worker")
    forward = worker.find("tr", data_phase="forward")
    assert cells(forward)[-1] == f"{100 * summary.by_role['worker']['forward']:.1f}%"
    boxes = layout(build_tree(read_stack_rows(LATEST)), 0.001).boxes
    assert len(dom.find("svg", class_="flamegraph").find_all("g", class_="frame")) == len(boxes)
    assert dom.find("img", class_="trend")
    assert dom.by_id("diff-verdict").all_text().startswith("No significant change")


def test_a_broken_copy_of_the_page_is_counted(page: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    extra = '<img src="http://example.invalid/x.png"><script>undefinedFunction();</script>'
    broken.write_text(page.read_text().replace("</body>", extra + "</body>"))
    root = html_of(rendered(tmp_path, broken)[0])
    assert root.attrs[ERRORS_ATTR] == "2" and root.attrs[BROKEN_ATTR] == "1"
    assert "undefinedFunction is not defined" in root.attrs["data-page-error-list"]
    assert "failed to load http://example.invalid/x.png" in root.attrs["data-page-error-list"]


def test_the_flame_graph_zooms_inside_the_page(page: Path, tmp_path: Path) -> None:
    clicked = tmp_path / "clicked.html"
    click = ("<script>document.querySelector('svg.flamegraph g.frame[data-n=\"worker\"]')"
             '.dispatchEvent(new MouseEvent("click"));</script></body>')  # fmt: skip
    clicked.write_text(page.read_text().replace("</body>", click))
    dom, _ = rendered(tmp_path, clicked)
    assert html_of(dom).attrs[ERRORS_ATTR] == "0"
    frames = {
        g.attrs["data-n"]: g for g in dom.find_all("g", class_="frame") if g.attrs["data-d"] == "1"
    }
    rect = frames["worker"].find("rect")
    assert float(rect.attrs["x"]) == 10 and float(rect.attrs["width"]) == pytest.approx(1179.5)
    assert "hide" in frames["api_server"].attrs["class"].split()
    assert dom.by_id("unzoom").attrs["class"] == "control"  # "Reset Zoom" shown


def test_the_screenshot_shows_the_header_the_bars_and_the_flame_graph(
    page: Path, tmp_path: Path
) -> None:
    png = tmp_path / "page.png"
    chromium(tmp_path, f"--screenshot={png}", "--window-size=1280,4200", page.as_uri())
    image = Image.open(png).convert("RGB")
    assert image.size == (1280, 4200)
    pixels = Counter(map(tuple, np.asarray(image).reshape(-1, 3).tolist()))
    assert pixels[(0x23, 0x30, 0x3F)] > 1280 * 40  # the header band
    for phase in ("forward", "model_wait", "idle", "input_processing"):
        colour = PHASE_COLOURS[phase]
        rgb = tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
        assert pixels[rgb] > 50, f"no {phase} ({colour}) pixels"
