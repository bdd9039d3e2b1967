"""A flame graph (sidecar/flame/graph.py's layout) as one self-contained, interactive SVG.

flamegraph.pl's conventions (github.com/brendangregg/FlameGraph): the root at the bottom, a
<title> per frame (the browser shows it on hover, and the frame's line at the bottom), click a
frame to zoom into it, "Search" or Ctrl-F to highlight frames matching a regular expression and
show the share they cover, Escape to clear it. The script and style are inline: the file opens
from disk or an attachment with nothing fetched. Plain graphs colour a frame by its phase (a
legend lists the phases present); differential ones red where a frame's share of all samples
grew and blue where it shrank, more saturated the larger the change (difffolded.pl's colours).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from xml.sax.saxutils import escape as _escape
from xml.sax.saxutils import quoteattr as _quoteattr

from sidecar.flame.graph import Box, FlameNode, Layout, change
from sidecar.records import Phase

# Characters XML 1.0 does not allow at all (escaping cannot help): a frame name holding one
# would make the whole SVG unreadable (issue 26, item 18). Shown as U+FFFD.
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def escape(text: str) -> str:
    return _escape(_XML_ILLEGAL.sub("\ufffd", text))


def quoteattr(text: str) -> str:
    return _quoteattr(_XML_ILLEGAL.sub("\ufffd", text))


# One colour per phase (docs/PHASES.md): model work warm, request handling green, engine
# bookkeeping purple, waits blue, idle a light grey so that the busy frames stand out.
PHASE_COLOURS: dict[str, str] = {
    Phase.STARTUP: "#9d7660",
    Phase.INPUT_PROCESSING: "#59a14f",
    Phase.SCHEDULING: "#b07aa1",
    Phase.KV_CACHE: "#d4a6c8",
    Phase.PREFILL: "#d37295",
    Phase.DECODE: "#ff9d9a",
    Phase.FORWARD: "#e15759",
    Phase.ATTENTION: "#f28e2b",
    Phase.SAMPLING: "#edc948",
    Phase.OUTPUT_PROCESSING: "#8cd17d",
    Phase.COMMUNICATION: "#4e79a7",
    Phase.MODEL_WAIT: "#a0cbe8",
    Phase.GPU_WAIT: "#499894",
    Phase.IDLE: "#d7d7d7",
    Phase.OTHER: "#8a817c",
}
STRUCTURE_COLOUR = "#f4f1ea"  # "all" and the role frames: structure, not code
UNCHANGED_COLOUR = "rgb(235,235,235)"
UNKNOWN_PHASE_COLOUR = "#ffffff"  # a phase name this version does not know (newer rules)

WIDTH = 1200
PAD = 10
FRAME_H = 16
FONT = 12
CHAR_W = FONT * 0.59  # flamegraph.pl's estimate of a Verdana character's width
GAP = 0.5  # between neighbouring frames, so that two of one colour stay apart


@dataclass(frozen=True, slots=True)
class Heading:
    """What the SVG says above the frames: a title and lines under it."""

    title: str
    lines: tuple[str, ...] = ()


def render_svg(layout: Layout, heading: Heading) -> str:
    """The plain graph: frames coloured by phase, a legend of the phases present."""
    root = layout.boxes[0].node
    legend = [
        (PHASE_COLOURS.get(phase, UNKNOWN_PHASE_COLOUR), f"{phase} {_share(n, root.value)}")
        for phase, n in sorted(root.phases, key=lambda kv: _phase_rank(kv[0]))
    ]
    return _document(layout, heading, legend, _phase_fill, lambda b: _title(b, root))


def render_diff_svg(layout: Layout, heading: Heading) -> str:
    """The differential graph: red where a frame's share grew from A to B, blue where it shrank,
    grey where it held; the intensity scales with the change over the largest change drawn."""
    root = layout.boxes[0].node
    largest = max((abs(change(b.node, root).points) for b in layout.boxes[1:]), default=0.0)
    legend = [
        (_diff_colour(1, 1.0), "share grew (A -> B)"),
        (_diff_colour(-1, 1.0), "share shrank"),
        (UNCHANGED_COLOUR, "unchanged"),
        ("none", f"full colour = {largest:.2f} percentage points, the largest change"),
    ]

    def fill(box: Box) -> str:
        c = change(box.node, root)
        return _diff_colour(c.sign, abs(c.points) / largest if largest else 0.0)

    return _document(layout, heading, legend, fill, lambda b: _diff_title(b, root))


def inline(svg: str) -> str:
    """SVG as an HTML page embeds it: the element alone, without the XML declaration (its
    style and script are scoped to the graph's root, so they keep to it in the page)."""
    return svg.partition("?>")[2].lstrip() if svg.startswith("<?xml") else svg


# ---------------------------------------------------------------------------------- document


def _document(
    layout: Layout,
    heading: Heading,
    legend: list[tuple[str, str]],
    fill: Callable[[Box], str],
    title: Callable[[Box], str],
) -> str:
    legend_top = 36 + 16 * len(heading.lines)  # under the last line (baselines 44, 60, ...)
    legend_svg, legend_h = _legend(legend, top=legend_top)
    top = legend_top + legend_h + 10
    height = top + (layout.depth + 1) * FRAME_H + 34
    frames = "\n".join(_frame(b, fill(b), title(b), top, layout.depth) for b in layout.boxes)
    lines = "\n".join(
        f'<text class="sub" x="{PAD}" y="{44 + 16 * i}">{escape(line)}</text>'
        for i, line in enumerate(heading.lines)
    )
    return f"""<?xml version="1.0" standalone="no"?>
<svg version="1.1" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" \
viewBox="0 0 {WIDTH} {height}" class="flamegraph" data-pad="{PAD}" data-font="{FONT}">
<style>{_STYLE}</style>
<rect class="background" x="0" y="0" width="{WIDTH}" height="{height}" fill="#fdfdfd"/>
<text id="title" x="{WIDTH / 2}" y="22" text-anchor="middle">{escape(heading.title)}</text>
{lines}
<text id="unzoom" class="control hide" x="{PAD}" y="22">Reset Zoom</text>
<text id="search" class="control" x="{WIDTH - PAD}" y="22" text-anchor="end">Search</text>
{legend_svg}
<g id="frames">
{frames}
</g>
<text id="details" x="{PAD}" y="{height - 12}"> </text>
<text id="matched" x="{WIDTH - PAD}" y="{height - 12}" text-anchor="end"> </text>
<script><![CDATA[{_SCRIPT}]]></script>
</svg>
"""


def _legend(entries: list[tuple[str, str]], top: int) -> tuple[str, int]:
    """Swatches and labels flowing left to right, wrapping at the width; and their height."""
    out, x, y = [], float(PAD), top
    for colour, label in entries:
        w = (14 if colour != "none" else 0) + len(label) * CHAR_W + 18
        if x + w > WIDTH - PAD and x > PAD:
            x, y = float(PAD), y + 18
        swatch = (
            f'<rect x="{x:.1f}" y="{y}" width="12" height="12" rx="2" fill="{colour}" '
            'stroke="#999" stroke-width="0.5"/>'
            if colour != "none"
            else ""
        )
        tx = x + (16 if colour != "none" else 0)
        key = label.split(" ")[0]
        out.append(
            f'<g class="legend-entry" data-key={quoteattr(key)}>{swatch}'
            f'<text x="{tx:.1f}" y="{y + 10}">{escape(label)}</text></g>'
        )
        x += w
    return f'<g id="legend">{"".join(out)}</g>', y + 18 - top


def _frame(box: Box, fill: str, title: str, top: int, depth: int) -> str:
    x, w = PAD + box.x * (WIDTH - 2 * PAD), box.width * (WIDTH - 2 * PAD)
    y = top + (depth - box.depth) * FRAME_H
    text_fill = ' fill="#fff"' if _dark(fill) else ""
    return (
        f'<g class="frame" data-n={quoteattr(box.node.name)} data-x="{box.x:.9g}" '
        f'data-w="{box.width:.9g}" data-d="{box.depth}" data-v="{box.node.value}">'
        f"<title>{escape(title)}</title>"
        f'<rect x="{x:.2f}" y="{y}" width="{max(w - GAP, 0.1):.2f}" height="{FRAME_H - 1}" '
        f'rx="2" fill="{fill}"/>'
        f'<text x="{x + 3:.2f}" y="{y + FRAME_H - 4.5}"{text_fill}>'
        f"{escape(fit_label(box.node.name, w))}</text></g>"
    )


def fit_label(name: str, width_px: float) -> str:
    """NAME cut to fit WIDTH_PX, with ".." where cut; empty below three characters (what the
    script does again on zoom)."""
    n = int((width_px - 6) // CHAR_W)
    if n < 3:
        return ""
    return name if len(name) <= n else name[: n - 2] + ".."


# ---------------------------------------------------------------------------------- colours


def _phase_rank(phase: str) -> int:
    return list(PHASE_COLOURS).index(phase) if phase in PHASE_COLOURS else len(PHASE_COLOURS)


def _phase_fill(box: Box) -> str:
    if box.depth < 2:
        return STRUCTURE_COLOUR
    return PHASE_COLOURS.get(box.node.phase, UNKNOWN_PHASE_COLOUR)


def _diff_colour(sign: int, intensity: float) -> str:
    if sign == 0:
        return UNCHANGED_COLOUR
    other = round(235 * (1 - min(max(intensity, 0.0), 1.0)))
    return f"rgb(255,{other},{other})" if sign > 0 else f"rgb({other},{other},255)"


def _dark(fill: str) -> bool:
    """Whether black text would be hard to read on FILL (#rrggbb or rgb(r,g,b))."""
    if fill.startswith("#") and len(fill) == 7:
        r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    elif fill.startswith("rgb("):
        r, g, b = (int(v) for v in fill[4:-1].split(","))
    else:
        return False
    return 0.299 * r + 0.587 * g + 0.114 * b < 110


# ----------------------------------------------------------------------------------- titles


def _title(box: Box, root: FlameNode) -> str:
    node = box.node
    lines = [f"{node.name} ({node.value:,} samples, {_pct(node.value, root)})"]
    lines.append(_phases_line(node))
    if box.depth >= 2:
        lines.append(f"role: {box.path[0]}")
    return "\n".join(lines)


def _diff_title(box: Box, root: FlameNode) -> str:
    node, c = box.node, change(box.node, root)
    a, b = node.base or 0, node.value
    lines = [
        node.name,
        f"A {100 * c.before:.2f}% -> B {100 * c.after:.2f}% ({c.points:+.2f} pp)",
        f"A {a:,} of {root.base or 0:,} samples, B {b:,} of {root.value:,}",
        _phases_line(node),
    ]
    if box.depth >= 2:
        lines.append(f"role: {box.path[0]}")
    if (a == 0) != (b == 0):
        lines.append("only in A" if b == 0 else "only in B")
    return "\n".join(lines)


def _phases_line(node: FlameNode) -> str:
    total = sum(n for _, n in node.phases)
    if len(node.phases) == 1 or not total:
        return f"phase: {node.phase}"
    shown = ", ".join(f"{p} {100 * n / total:.1f}%" for p, n in node.phases[:3])
    more = f" (+{len(node.phases) - 3} more)" if len(node.phases) > 3 else ""
    return f"phases: {shown}{more}"


def _share(n: int, total: int) -> str:
    """A legend's share: one decimal, and "<0.1%" rather than a misleading 0.0%."""
    return "<0.1%" if 0 < n < total / 1000 else f"{100 * n / total:.1f}%"


def _pct(value: int, root: FlameNode) -> str:
    return f"{100 * value / root.value:.2f}%" if root.value else "0%"


# ---------------------------------------------------------------------------- style, script

# Scoped to the graph's root, so that the rules stay inside it when a page embeds the SVG inline
# (`vllm-sidecar report --format html`).
_STYLE = """
svg.flamegraph text { font-family: Verdana, "DejaVu Sans", sans-serif; font-size: 12px;
  fill: #000; }
svg.flamegraph #title { font-size: 17px; }
svg.flamegraph text.sub { fill: #444; }
svg.flamegraph .control { cursor: pointer; fill: #1f4e9c; }
svg.flamegraph .control.active { fill: rgb(230,0,230); }
svg.flamegraph .hide { display: none; }
svg.flamegraph g.frame { cursor: pointer; }
svg.flamegraph g.frame text { pointer-events: none; }
svg.flamegraph g.frame:hover rect { stroke: #000; stroke-width: 0.7; }
svg.flamegraph g.frame.match rect { fill: rgb(230,0,230); }
svg.flamegraph g.frame.parent { opacity: 0.55; }
svg.flamegraph #details, svg.flamegraph #matched { fill: #222; }
"""

# flamegraph.pl's interactions, rewritten small: zoom by click, search by regular expression.
_SCRIPT = r"""
(function () {
  "use strict";
  // The graph's own root: the document in a standalone file, the <svg> element in a page that
  // embeds it inline (then the page keeps Ctrl-F and its URL parameters).
  var me = document.currentScript;
  var svg = (me && me.ownerSVGElement) || document.documentElement;
  var standalone = svg === document.documentElement;
  var PAD = +svg.getAttribute("data-pad"), CHAR = +svg.getAttribute("data-font") * 0.59;
  var AVAIL = +svg.getAttribute("width") - 2 * PAD, GAP = 0.5, EPS = 1e-7;
  var frames = Array.prototype.slice.call(svg.querySelectorAll("g.frame"));
  var details = svg.querySelector("#details"), matched = svg.querySelector("#matched");
  var unzoomButton = svg.querySelector("#unzoom");
  var searchButton = svg.querySelector("#search");
  var term = null;

  function num(g, key) { return parseFloat(g.getAttribute("data-" + key)); }
  function label(name, px) {
    var n = Math.floor((px - 6) / CHAR);
    if (n < 3) return "";
    return name.length <= n ? name : name.slice(0, n - 2) + "..";
  }
  function place(g, x, w) {  // x, w: fractions of the frame zoomed into
    var rect = g.querySelector("rect"), text = g.querySelector("text");
    var px = PAD + x * AVAIL, pw = w * AVAIL;
    rect.setAttribute("x", px.toFixed(2));
    rect.setAttribute("width", Math.max(pw - GAP, 0.1).toFixed(2));
    text.setAttribute("x", (px + 3).toFixed(2));
    text.textContent = label(g.getAttribute("data-n"), pw);
  }
  function zoom(z) {
    var zx = num(z, "x"), zw = num(z, "w"), zd = num(z, "d");
    frames.forEach(function (g) {
      var x = num(g, "x"), w = num(g, "w"), d = num(g, "d");
      g.classList.remove("parent", "hide");
      if (d < zd && x <= zx + EPS && x + w >= zx + zw - EPS) {
        g.classList.add("parent");
        place(g, 0, 1);
      } else if (d >= zd && x >= zx - EPS && x + w <= zx + zw + EPS) {
        place(g, (x - zx) / zw, w / zw);
      } else {
        g.classList.add("hide");
      }
    });
    unzoomButton.classList.remove("hide");
    if (term !== null) search(term);
  }
  function unzoom() {
    frames.forEach(function (g) {
      g.classList.remove("parent", "hide");
      place(g, num(g, "x"), num(g, "w"));
    });
    unzoomButton.classList.add("hide");
    if (term !== null) search(term);
  }
  function pattern(t) {
    try { return new RegExp(t); }
    catch (e) { return new RegExp(t.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")); }
  }
  function search(t) {
    var re = pattern(t), hits = [];
    frames.forEach(function (g) {
      var hit = re.test(g.getAttribute("data-n"));
      g.classList.toggle("match", hit);
      if (hit) hits.push([num(g, "x"), num(g, "w")]);
    });
    // The share the matches cover: nested matches (a recursion, a caller and its callee)
    // count once, as the union of their ranges.
    hits.sort(function (a, b) { return a[0] - b[0] || b[1] - a[1]; });
    var covered = 0, end = -1;
    hits.forEach(function (h) {
      var lo = Math.max(h[0], end), hi = h[0] + h[1];
      if (hi > lo) { covered += hi - lo; end = hi; }
    });
    term = t;
    searchButton.classList.add("active");
    searchButton.textContent = "Reset Search";
    matched.textContent =
      "Matched: " + (100 * covered).toFixed(2) + "% (" + hits.length + " frames)";
  }
  function resetSearch() {
    frames.forEach(function (g) { g.classList.remove("match"); });
    term = null;
    searchButton.classList.remove("active");
    searchButton.textContent = "Search";
    matched.textContent = " ";
  }
  function askSearch() {
    var t = window.prompt("Search frames (regular expression):", term || "");
    if (t) search(t); else if (t !== null) resetSearch();
  }
  frames.forEach(function (g) {
    g.addEventListener("click", function () { zoom(g); });
    g.addEventListener("mouseover", function () {
      var lines = g.querySelector("title").textContent.split("\n");
      details.textContent = lines.slice(0, 2).join("  |  ");
    });
    g.addEventListener("mouseout", function () { details.textContent = " "; });
  });
  unzoomButton.addEventListener("click", unzoom);
  searchButton.addEventListener("click", function () {
    if (term === null) askSearch(); else resetSearch();
  });
  if (!standalone) return;
  window.addEventListener("keydown", function (e) {
    if ((e.ctrlKey || e.metaKey) && (e.key === "f" || e.key === "F")) {
      e.preventDefault();
      askSearch();
    } else if (e.key === "Escape") {
      resetSearch();
    }
  });
  // flamegraph.pl's URL parameters: file.svg?s=REGEX searches on load.
  var s = new URLSearchParams(window.location.search).get("s");
  if (s) search(s);
})();
"""
