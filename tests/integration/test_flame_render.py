"""The flame graph SVG as a browser shows it: headless Chromium renders it to PNG and runs its
script (search by `?s=`, zoom by a click), the way an operator opens the file.

Skipped, saying why, where Chromium is not installed (`apt-get install chromium`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sidecar.cli import main
from sidecar.flame.graph import build_tree, layout
from sidecar.flame.svg import PHASE_COLOURS, STRUCTURE_COLOUR
from sidecar.store.stacks import read_stack_rows

SNAPSHOT = Path(__file__).resolve().parents[1] / "fixtures" / "flame" / "prefill-heavy"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"
    ),
]


def chromium(tmp_path: Path, *args: str) -> str:
    """Run headless Chromium with its own profile folder; its stdout."""
    assert CHROMIUM is not None
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}", *args]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=True)
    return done.stdout


@pytest.fixture
def svg(tmp_path: Path) -> Path:
    assert main(["flamegraph", str(SNAPSHOT), "-o", str(tmp_path / "flame")]) == 0
    return tmp_path / "flame.svg"


def test_the_rendered_graph_shows_its_frames_in_phase_colours(svg: Path, tmp_path: Path) -> None:
    png = tmp_path / "flame.png"
    chromium(tmp_path, f"--screenshot={png}", "--window-size=1200,800", svg.as_uri())
    image = Image.open(png).convert("RGB")
    assert image.size == (1200, 800)
    pixels = Counter(map(tuple, np.asarray(image).reshape(-1, 3).tolist()))
    background = pixels.most_common(1)[0][1]
    assert background < 0.8 * 1200 * 800  # not blank: frames, text, legend cover a fifth
    rows = read_stack_rows(SNAPSHOT)
    drawn = {b.node.phase for b in layout(build_tree(rows)).boxes if b.depth >= 2}
    for colour in [STRUCTURE_COLOUR, *(PHASE_COLOURS[p] for p in drawn)]:
        rgb = tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
        assert pixels[rgb] > 20, f"no {colour} pixels"  # every drawn phase is visible


def test_search_and_zoom_run_in_the_browser(svg: Path, tmp_path: Path) -> None:
    # Search, as flamegraph.pl's `?s=` does on load: the share matched is the frames' widths.
    dom = chromium(tmp_path, "--dump-dom", svg.as_uri() + "?s=LlamaModel%5C.forward")
    tree = build_tree(read_stack_rows(SNAPSHOT))
    boxes = [b for b in layout(tree).boxes if re.search(r"LlamaModel\.forward", b.node.name)]
    expected = 100 * sum(b.width for b in boxes)
    found = re.search(r"Matched: ([\d.]+)% \((\d+) frames\)", dom)
    assert found and float(found[1]) == pytest.approx(expected, abs=0.01)
    assert int(found[2]) == len(boxes) > 0
    # Zoom: a click on the worker frame spreads it over the whole width, hides the others.
    clicked = tmp_path / "zoomed.svg"
    click = '<script>document.querySelector(\'g.frame[data-n="worker"]\').dispatchEvent(new MouseEvent("click"));</script></svg>'
    clicked.write_text(svg.read_text().replace("</svg>", click))
    dom = chromium(tmp_path, "--dump-dom", clicked.as_uri())
    worker = re.search(
        r'<g class="frame[^"]*" data-n="worker".*?<rect x="([\d.]+)" [^>]*width="([\d.]+)"',
        dom,
        re.S,
    )
    assert worker and float(worker[1]) == 10 and float(worker[2]) == pytest.approx(1179.5)
    api = re.search(r'<g class="frame([^"]*)" data-n="api_server"', dom)
    assert api and "hide" in api[1]
