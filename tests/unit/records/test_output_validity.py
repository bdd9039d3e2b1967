"""What a command prints from outside input stays valid output (issue 26, item 18): JSON without
bare NaN/Infinity, an SVG that parses as XML whatever a frame is named, text without raw control
characters (an OSC sequence in a frame name must not reach the terminal)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

from sidecar.flame.graph import build_tree, layout
from sidecar.flame.svg import Heading, render_svg
from sidecar.store.stacks import read_stack_rows
from sidecar.tables import json_text, printable, table

PREFILL = Path(__file__).resolve().parents[2] / "fixtures" / "flame" / "prefill-heavy"

HOSTILE = "evil\x1b]0;owned\x07\x00name\x0b"


def test_json_text_writes_null_for_what_json_cannot_hold() -> None:
    doc = {"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5], "c": (2, None)}
    text = json_text(doc)
    assert json.loads(text) == {"a": None, "b": [None, None, 1.5], "c": [2, None]}
    assert "NaN" not in text and "Infinity" not in text


def test_text_tables_escape_control_characters() -> None:
    out = table(["frame"], [[HOSTILE]])
    assert "\x1b" not in out and "\x07" not in out and "\x00" not in out
    assert "\\x1b]0;owned\\x07" in out
    assert printable("tab\tand\nnewline") == "tab\tand\nnewline"


def test_an_svg_stays_xml_whatever_a_frame_is_named() -> None:
    rows = read_stack_rows(PREFILL)
    hostile = [replace(r, frames=(*r.frames[:-1], HOSTILE)) for r in rows]
    svg = render_svg(layout(build_tree(tuple(hostile)), 0.0), Heading(HOSTILE, (HOSTILE,)))
    ET.fromstring(svg.partition("?>")[2])  # raises on an XML-illegal character
    assert "\x1b" not in svg and "\x00" not in svg
