"""Flame graphs (sidecar/flame/graph.py, flame_svg.py, flame_io.py) of real snapshots.

The snapshots are real: tests/fixtures/flame/ holds a prefill-heavy and a decode-heavy window of
one vLLM server (schema 3, recorded with record_pair.py there), tests/fixtures/schema1/ one
written by vllm-sidecar 0.1 (without host, deployment, snapshot, time and kind columns). The
SVG is parsed with ElementTree and checked for flamegraph.pl's structure; the speedscope file
against a JSON Schema written from speedscope's own file-format spec.
"""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import jsonschema
import pytest

from sidecar.cli import main
from sidecar.errors import InputError
from sidecar.flame.files import draw_diff, output_prefix, snapshot_svg
from sidecar.flame.graph import (
    ROOT_NAME,
    SPEEDSCOPE_SCHEMA,
    FlameNode,
    build_diff_tree,
    build_tree,
    change,
    frame_record,
    layout,
    speedscope,
)
from sidecar.flame.svg import (
    CHAR_W,
    PAD,
    PHASE_COLOURS,
    STRUCTURE_COLOUR,
    UNCHANGED_COLOUR,
    WIDTH,
    Heading,
    fit_label,
    render_diff_svg,
    render_svg,
)
from sidecar.records import Phase
from sidecar.store.stacks import StackRow, read_collapsed, read_stack_rows

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PREFILL = FIXTURES / "flame" / "prefill-heavy"
DECODE = FIXTURES / "flame" / "decode-heavy"
SCHEMA1 = FIXTURES / "schema1" / "20261201T112537Z"
SNAPSHOTS = [PREFILL, DECODE, SCHEMA1]
SPEEDSCOPE_JSON_SCHEMA = json.loads(
    (FIXTURES / "flame" / "speedscope-file-format-schema.json").read_text()
)
SVG = "{http://www.w3.org/2000/svg}"


def rows_of(folder: Path) -> tuple[StackRow, ...]:
    return read_stack_rows(folder)


def frames_of(svg: str) -> list[ET.Element]:
    return ET.fromstring(svg).findall(f".//{SVG}g[@class='frame']")


def rgb(fill: str) -> tuple[int, int, int]:
    r, g, b = (int(v) for v in re.fullmatch(r"rgb\((\d+),(\d+),(\d+)\)", fill).groups())  # type: ignore[union-attr]
    return r, g, b


def prefix_samples(rows: tuple[StackRow, ...]) -> Counter[tuple[str, ...]]:
    """Samples of the rows under each path (role, frames...): each frame's value, counted
    straight from the rows rather than from the tree."""
    out = Counter[tuple[str, ...]]()
    for r in rows:
        path = (r.role, *r.frames)
        for n in range(1, len(path) + 1):
            out[path[:n]] += r.weight
    return out


# ------------------------------------------------------------------------------------ reading


@pytest.mark.parametrize("folder", SNAPSHOTS, ids=lambda p: p.name)
def test_parquet_and_collapsed_hold_the_same_stacks(folder: Path) -> None:
    parquet = rows_of(folder)
    collapsed = read_collapsed((folder / "stacks.collapsed").read_text())
    assert parquet and Counter(parquet) == Counter(collapsed)


def test_a_folder_without_parquet_is_drawn_from_its_collapsed_file(tmp_path: Path) -> None:
    shutil.copy(SCHEMA1 / "stacks.collapsed", tmp_path / "stacks.collapsed")
    assert Counter(read_stack_rows(tmp_path)) == Counter(rows_of(SCHEMA1))


@pytest.mark.parametrize(
    ("sub", "files", "words"),
    [
        ("absent", {}, "is not a folder: point at a snapshot folder"),
        ("", {}, "no stacks.parquet or stacks.collapsed"),
        ("", {"stacks.parquet": "not parquet"}, "take the snapshot again.*delete it to draw"),
        ("", {"stacks.collapsed": "worker;idle;f (a.py:1) x\n"}, "line 1: not `role;phase"),
    ],
    ids=["no-folder", "empty-folder", "garbled-parquet", "garbled-collapsed"],
)
def test_unreadable_inputs_name_the_fix(
    tmp_path: Path, sub: str, files: dict[str, str], words: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match=words):
        read_stack_rows(tmp_path / sub if sub else tmp_path)


def test_a_parquet_without_the_stack_columns_is_refused(tmp_path: Path) -> None:
    import pandas as pd

    frame = pd.read_parquet(SCHEMA1 / "stacks.parquet").drop(columns=["stack"])
    frame.to_parquet(tmp_path / "stacks.parquet")
    with pytest.raises(InputError, match=r"lacks the column.*stack.*take the snapshot again"):
        read_stack_rows(tmp_path)


# --------------------------------------------------------------------------------------- tree


@pytest.mark.parametrize("folder", SNAPSHOTS, ids=lambda p: p.name)
def test_the_tree_counts_every_sample_once_with_roles_under_all(folder: Path) -> None:
    rows = rows_of(folder)
    tree = build_tree(rows, idle=True)
    assert tree.name == ROOT_NAME
    assert tree.value == sum(r.weight for r in rows)
    assert {c.name for c in tree.children} == {r.role for r in rows}
    for node in tree.walk():
        assert sum(c.value for c in node.children) <= node.value
        assert sum(n for _, n in node.phases) == node.value
    samples = prefix_samples(rows)
    for box in layout(tree, 0.0).boxes[1:]:
        assert box.node.value == samples[box.path]


def test_a_frame_takes_the_phase_most_of_its_samples_have() -> None:
    rows = rows_of(PREFILL)
    tree = build_tree(rows, idle=True)
    checked = 0
    for role in tree.children:
        for child in role.children:
            path = (role.name, child.name)
            by_phase = Counter[str]()
            for r in rows:
                if (r.role, *r.frames)[:2] == path:
                    by_phase[r.phase] += r.weight
            top = max(by_phase.values())
            assert by_phase[child.phase] == top
            checked += 1
    assert checked >= 4


# ------------------------------------------------------------------------------------- layout


@pytest.mark.parametrize("folder", SNAPSHOTS, ids=lambda p: p.name)
def test_widths_are_shares_of_samples_and_children_sit_inside_parents(folder: Path) -> None:
    tree = build_tree(rows_of(folder), idle=True)
    shape = layout(tree, min_width=0.0)
    assert len(shape.boxes) == sum(1 for _ in tree.walk()) and shape.hidden_frames == 0
    parents: dict[tuple[str, ...], tuple[float, float]] = {}
    for box in shape.boxes:
        assert box.width == pytest.approx(box.node.value / tree.value)
        parents[box.path] = (box.x, box.width)
        if box.depth:
            px, pw = parents[box.path[:-1]]
            assert px - 1e-12 <= box.x and box.x + box.width <= px + pw + 1e-12


def test_narrow_frames_are_left_out_and_counted() -> None:
    tree = build_tree(rows_of(SCHEMA1), idle=True)
    full, pruned = layout(tree, 0.0), layout(tree, 0.001)
    assert all(b.width >= 0.001 for b in pruned.boxes)
    assert pruned.hidden_frames == len(full.boxes) - len(pruned.boxes) > 0
    drawn = {b.path for b in pruned.boxes}
    hidden_tops = [b for b in full.boxes if b.path not in drawn and b.path[:-1] in drawn]
    assert pruned.hidden_share == pytest.approx(sum(b.width for b in hidden_tops))


# ---------------------------------------------------------------------------------------- SVG


def plain_svg(folder: Path, min_width: float = 0.001) -> tuple[FlameNode, str]:
    tree = build_tree(rows_of(folder), idle=True)
    return tree, render_svg(layout(tree, min_width), Heading(folder.name, ("a line",)))


@pytest.mark.parametrize("folder", SNAPSHOTS, ids=lambda p: p.name)
def test_the_svg_has_a_rect_and_title_per_frame_sized_by_samples(folder: Path) -> None:
    tree, svg = plain_svg(folder)
    frames = frames_of(svg)
    assert len(frames) == len(layout(tree, 0.001).boxes)
    px_per_sample = (WIDTH - 2 * PAD) / tree.value
    for g in frames:
        rect, title, text = g.find(f"{SVG}rect"), g.find(f"{SVG}title"), g.find(f"{SVG}text")
        assert rect is not None and title is not None and text is not None
        name, value = g.get("data-n"), int(g.get("data-v", "-1"))
        assert title.text and title.text.startswith(f"{name} ({value:,} samples, ")
        width = float(rect.get("width", "0")) + 0.5  # the gap between neighbours
        assert width == pytest.approx(value * px_per_sample, abs=0.02)
        label = text.text or ""
        assert not label or len(label) * CHAR_W <= width - 6 + 1e-9
        assert (name or "").startswith(label.removesuffix(".."))


@pytest.mark.parametrize("folder", SNAPSHOTS, ids=lambda p: p.name)
def test_roles_are_the_level_above_all_and_children_fit_in_parents(folder: Path) -> None:
    tree, svg = plain_svg(folder)
    frames = frames_of(svg)
    by_depth: dict[int, list[ET.Element]] = {}
    for g in frames:
        by_depth.setdefault(int(g.get("data-d", "-1")), []).append(g)
    assert [g.get("data-n") for g in by_depth[0]] == [ROOT_NAME]
    assert [g.get("data-n") for g in by_depth[1]] == [c.name for c in tree.children]
    # Frames are drawn root first (flame layout: deeper frames higher up, y decreasing).
    ys = {d: {float(g.find(f"{SVG}rect").get("y")) for g in gs} for d, gs in by_depth.items()}  # type: ignore[union-attr]
    assert all(len(v) == 1 for v in ys.values())
    assert [ys[d] for d in sorted(ys)] == sorted(ys.values(), reverse=True)
    for depth in sorted(by_depth)[1:]:
        for g in by_depth[depth]:
            x, w = float(g.get("data-x")), float(g.get("data-w"))  # type: ignore[arg-type]
            assert any(
                float(p.get("data-x")) - 1e-8 <= x  # type: ignore[arg-type]
                and x + w <= float(p.get("data-x")) + float(p.get("data-w")) + 1e-8  # type: ignore[arg-type]
                for p in by_depth[depth - 1]
            )


@pytest.mark.parametrize("folder", SNAPSHOTS, ids=lambda p: p.name)
def test_frames_take_their_phase_colour_and_the_legend_lists_present_phases(folder: Path) -> None:
    tree, svg = plain_svg(folder)
    present = {r.phase for r in rows_of(folder)}
    root = ET.fromstring(svg)
    keys = [e.get("data-key") for e in root.findall(f".//{SVG}g[@class='legend-entry']")]
    assert set(keys) == present and keys == [p.value for p in Phase if p.value in present]
    for entry in root.findall(f".//{SVG}g[@class='legend-entry']"):
        assert entry.find(f"{SVG}rect").get("fill") == PHASE_COLOURS[entry.get("data-key")]  # type: ignore[union-attr,index]
    nodes = {b.path: b.node for b in layout(tree, 0.001).boxes}
    boxes = layout(tree, 0.001).boxes
    for g, box in zip(frames_of(svg), boxes, strict=True):
        fill = g.find(f"{SVG}rect").get("fill")  # type: ignore[union-attr]
        assert fill == (STRUCTURE_COLOUR if box.depth < 2 else PHASE_COLOURS[nodes[box.path].phase])
        if box.depth >= 2:
            assert f"role: {box.path[0]}" in g.find(f"{SVG}title").text  # type: ignore[union-attr,operator]


def test_the_svg_is_self_contained_with_its_search_and_zoom_script() -> None:
    _, svg = plain_svg(PREFILL)
    root = ET.fromstring(svg)
    scripts = root.findall(f"{SVG}script")
    assert len(scripts) == 1 and "RegExp" in (scripts[0].text or "")
    assert "zoom" in (scripts[0].text or "") and "ctrlKey" in (scripts[0].text or "")
    assert {"search", "unzoom", "matched", "details"} <= {e.get("id") for e in root.iter()}
    for element in root.iter():
        assert element.tag.split("}")[1] not in {"image", "use", "foreignObject", "a"}
        assert not any(k.endswith("href") or k == "src" for k in element.attrib)
    code = (scripts[0].text or "") + (root.find(f"{SVG}style").text or "")  # type: ignore[union-attr]
    assert "http" not in code and "url(" not in code and "@import" not in code


def test_labels_are_cut_to_fit() -> None:
    assert fit_label("Module._call_impl (torch/nn/modules/module.py:1773)", 1000).endswith(")")
    assert fit_label("Module._call_impl (torch/nn/modules/module.py:1773)", 60) == "Modul.."
    assert fit_label("abc", 10) == ""


# --------------------------------------------------------------------------------------- diff


def diff_svg(a: tuple[StackRow, ...], b: tuple[StackRow, ...], min_width: float = 0.0) -> str:
    tree = build_diff_tree(a, b, idle=True)
    return render_diff_svg(layout(tree, min_width), Heading("diff"))


def test_a_profile_against_itself_or_a_scaled_copy_is_all_neutral() -> None:
    rows = rows_of(DECODE)
    doubled = tuple(StackRow(r.role, r.phase, r.frames, 3 * r.weight) for r in rows)
    for other in (rows, doubled):
        frames = frames_of(diff_svg(rows, other))
        assert frames and {g.find(f"{SVG}rect").get("fill") for g in frames} == {UNCHANGED_COLOUR}  # type: ignore[union-attr]
        for g in frames:
            assert "(+0.00 pp)" in g.find(f"{SVG}title").text  # type: ignore[union-attr,operator]


def test_growth_is_red_and_shrinkage_blue_by_the_change_in_share() -> None:
    a, b = rows_of(PREFILL), rows_of(DECODE)
    total_a, total_b = sum(r.weight for r in a), sum(r.weight for r in b)
    samples_a, samples_b = prefix_samples(a), prefix_samples(b)
    tree = build_diff_tree(a, b, idle=True)
    boxes = layout(tree, 0.0).boxes
    counts = Counter[int]()
    for g, box in zip(frames_of(diff_svg(a, b)), boxes, strict=True):
        share_a = samples_a[box.path] / total_a if box.depth else 1.0
        share_b = samples_b[box.path] / total_b if box.depth else 1.0
        r, gr, bl = rgb(g.find(f"{SVG}rect").get("fill"))  # type: ignore[union-attr,arg-type]
        title = g.find(f"{SVG}title").text or ""  # type: ignore[union-attr]
        points = 100 * (share_b - share_a)
        assert f"A {100 * share_a:.2f}% -> B {100 * share_b:.2f}% ({points:+.2f} pp)" in title
        sign = change(box.node, tree).sign
        if abs(points) > 1e-9:
            assert sign == (1 if points > 0 else -1)
        if sign > 0:
            assert r == 255 and gr == bl < 255
        elif sign < 0:
            assert bl == 255 and r == gr < 255
        else:
            assert r == gr == bl
        counts[sign] += 1
    assert counts[1] and counts[-1]


def test_the_largest_change_is_the_most_saturated_and_one_sided_frames_are_drawn() -> None:
    a, b = rows_of(PREFILL), rows_of(DECODE)
    tree = build_diff_tree(a, b, idle=True)
    frames = frames_of(diff_svg(a, b))
    boxes = layout(tree, 0.0).boxes
    points = [abs(change(box.node, tree).points) for box in boxes]
    strongest = frames[points.index(max(points))]
    assert 0 in rgb(strongest.find(f"{SVG}rect").get("fill"))  # type: ignore[union-attr,arg-type]
    titles = [g.find(f"{SVG}title").text or "" for g in frames]  # type: ignore[union-attr]
    only_a = [t for t in titles if t.endswith("only in A")]
    only_b = [t for t in titles if t.endswith("only in B")]
    assert only_a and only_b
    assert all("-> B 0.00%" in t for t in only_a) and all("A 0.00% ->" in t for t in only_b)
    # Frames only in A widen their parents: the layout still nests.
    shape = layout(tree, 0.0)
    ends = {bx.path: bx.x + bx.width for bx in shape.boxes}
    for bx in shape.boxes[1:]:
        assert bx.x + bx.width <= ends[bx.path[:-1]] + 1e-9


# --------------------------------------------------------------------------------- speedscope


@pytest.mark.parametrize("folder", SNAPSHOTS, ids=lambda p: p.name)
def test_speedscope_file_is_valid_and_keeps_every_sample(folder: Path) -> None:
    rows = rows_of(folder)
    document = json.loads(json.dumps(speedscope(rows, folder.name, "vllm-sidecar@test")))
    jsonschema.validate(document, SPEEDSCOPE_JSON_SCHEMA)
    assert document["$schema"] == SPEEDSCOPE_SCHEMA
    frames, profiles = document["shared"]["frames"], document["profiles"]
    assert [p["name"].split()[-1] for p in profiles] == [
        c.name for c in build_tree(rows, idle=True).children
    ]
    assert 0 <= document["activeProfileIndex"] < len(profiles)
    by_role = Counter[str]()
    for r in rows:
        by_role[r.role] += r.weight
    for profile in profiles:
        assert profile["type"] == "sampled" and profile["unit"] == "none"
        assert len(profile["samples"]) == len(profile["weights"])
        assert profile["endValue"] - profile["startValue"] == sum(profile["weights"])
        assert sum(profile["weights"]) == by_role[profile["name"].split()[-1]]
        assert all(0 <= i < len(frames) for s in profile["samples"] for i in s)
    assert sum(sum(p["weights"]) for p in profiles) == sum(r.weight for r in rows)
    # Root first, as speedscope's StackListProfileBuilder.appendSample takes them.
    labels = [_label(f) for f in frames]
    rebuilt = Counter(
        (p["name"].split()[-1], tuple(labels[i] for i in s), w)
        for p in profiles
        for s, w in zip(p["samples"], p["weights"], strict=True)
    )
    assert rebuilt == Counter((r.role, r.frames, r.weight) for r in rows)


def _label(frame: dict[str, object]) -> str:
    if "file" not in frame:
        return str(frame["name"])
    line = f":{frame['line']}" if "line" in frame else ""
    return f"{frame['name']} ({frame['file']}{line})"


@pytest.mark.parametrize(
    ("label", "record"),
    [
        ("EngineCore.step (vllm/v1/engine/core.py:676)",
         {"name": "EngineCore.step", "file": "vllm/v1/engine/core.py", "line": 676}),
        ("<module> (<string>:1)", {"name": "<module>", "file": "<string>", "line": 1}),
        ("cudaStreamSynchronize (libcudart.so.12)",
         {"name": "cudaStreamSynchronize", "file": "libcudart.so.12"}),
        ("fault_tolerant_wrapper.<locals>.run (vllm/v1/x.py:178)",
         {"name": "fault_tolerant_wrapper.<locals>.run", "file": "vllm/v1/x.py", "line": 178}),
        ("epoll_wait", {"name": "epoll_wait"}),
    ],
)  # fmt: skip
def test_frame_labels_become_speedscope_frames(label: str, record: dict[str, object]) -> None:
    assert frame_record(label) == record
    assert _label(record) == label


# ---------------------------------------------------------------------------------------- CLI


def test_the_command_writes_both_files_and_prints_their_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["flamegraph", str(SCHEMA1), "-o", str(tmp_path), "--idle"]) == 0
    printed = capsys.readouterr().out.split()
    svg, ss = (
        tmp_path / f"flame-{SCHEMA1.name}.svg",
        tmp_path / f"flame-{SCHEMA1.name}.speedscope.json",
    )
    assert printed == [str(svg), str(ss)]
    ET.parse(svg)
    jsonschema.validate(json.loads(ss.read_text()), SPEEDSCOPE_JSON_SCHEMA)
    assert "not drawn" in svg.read_text()  # the 0.1% default leaves single samples out here
    assert main(["flamegraph", str(SCHEMA1), "--out", str(tmp_path / "x"), "--min-width", "0"]) == 0
    assert "every frame drawn" in (tmp_path / "x.svg").read_text()


def test_the_diff_command_writes_one_svg(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["flamegraph", str(PREFILL), "--diff", str(DECODE), "-o", str(tmp_path / "d")]) == 0
    out = capsys.readouterr()
    assert out.out.split() == [str(tmp_path / "d.svg")] and "no speedscope file" in out.err
    title = ET.parse(tmp_path / "d.svg").getroot().find(f"{SVG}text[@id='title']")
    assert (
        title is not None
        and title.text == "Differential flame graph: A prefill-heavy -> B decode-heavy"
    )


def test_the_command_exits_with_the_input_error_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["flamegraph", str(tmp_path / "nothing")]) == InputError.exit_code
    assert "point at a snapshot folder" in capsys.readouterr().err


def test_out_is_a_folder_or_a_prefix(tmp_path: Path) -> None:
    assert output_prefix(None, "flame-x") == Path("flame-x")
    assert output_prefix(str(tmp_path), "flame-x") == tmp_path / "flame-x"
    assert output_prefix(f"{tmp_path}/new/", "flame-x") == tmp_path / "new" / "flame-x"
    assert output_prefix(str(tmp_path / "mine"), "flame-x") == tmp_path / "mine"


def test_a_graph_of_the_working_folder_is_named_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(SCHEMA1)
    assert main(["flamegraph", ".", "-o", f"{tmp_path}/new/"]) == 0
    assert capsys.readouterr().out.split()[0] == str(tmp_path / "new" / f"flame-{SCHEMA1.name}.svg")


def test_a_stack_thousands_of_frames_deep_is_drawn() -> None:
    # Issue 26, item 16: building the tree recursively failed near 490 frames (RecursionError).
    deep = tuple(f"layer_{i} (model.py:{i})" for i in range(3000))
    rows = (StackRow("worker", "forward", deep, 5), StackRow("worker", "idle", deep[:10], 1))
    tree = build_tree(rows, idle=True)
    assert sum(1 for _ in tree.walk()) == 3000 + 2  # all, the role, every frame once
    shape = layout(tree, 0.0)
    assert shape.depth == 3001
    ET.fromstring(render_svg(shape, Heading("deep", ())).partition("?>")[2])
    diff = build_diff_tree(rows[1:], rows, idle=True)
    assert render_diff_svg(layout(diff, 0.0), Heading("deep", ()))
    assert speedscope(rows, "deep", "test")["profiles"]


# ------------------------------------------------------------------------------------ idle


def test_idle_stacks_are_left_out_by_default_and_kept_with_idle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """py-spy's default: idle threads would take 90% of the prefill-heavy window's width."""
    rows = rows_of(PREFILL)
    idle = sum(r.weight for r in rows if r.phase == Phase.IDLE.value)
    total = sum(r.weight for r in rows)
    assert idle > 0.5 * total
    tree = build_tree(rows)
    assert tree.value == total - idle
    assert all(n.phase != Phase.IDLE.value for n in tree.walk())
    assert build_tree(rows, idle=True).value == total
    assert main(["flamegraph", str(PREFILL), "-o", str(tmp_path / "busy")]) == 0
    assert main(["flamegraph", str(PREFILL), "-o", str(tmp_path / "all"), "--idle"]) == 0
    busy_svg, all_svg = (tmp_path / "busy.svg").read_text(), (tmp_path / "all.svg").read_text()
    said = f"idle left out: {idle:,} of {total:,} samples ({100 * idle / total:.1f}%) were idle"
    assert said in busy_svg and "--idle draws them" in busy_svg
    assert "idle left out" not in all_svg
    keys = {e.get("data-key") for e in ET.fromstring(busy_svg).iter(f"{SVG}g")}
    assert Phase.IDLE.value not in keys
    assert Phase.IDLE.value in {e.get("data-key") for e in ET.fromstring(all_svg).iter(f"{SVG}g")}
    busy = json.loads((tmp_path / "busy.speedscope.json").read_text())
    every = json.loads((tmp_path / "all.speedscope.json").read_text())
    assert sum(sum(p["weights"]) for p in busy["profiles"]) == total - idle
    assert sum(sum(p["weights"]) for p in every["profiles"]) == total


def test_the_page_graph_leaves_idle_out_and_a_diff_says_what_each_side_left_out(
    tmp_path: Path,
) -> None:
    assert "idle left out: " in snapshot_svg(PREFILL, 0.001)
    assert "idle left out" not in snapshot_svg(PREFILL, 0.001, idle=True)
    (svg,) = draw_diff(PREFILL, DECODE, str(tmp_path / "d"), 0.001)
    text = svg.read_text()
    assert re.search(r"idle left out: A [\d,]+ of [\d,]+ samples \([\d.]+%\), B [\d,]+ of", text)
    tree = build_diff_tree(rows_of(PREFILL), rows_of(DECODE))
    assert all(n.phase != Phase.IDLE.value for n in tree.walk() if n.value)


def test_a_snapshot_of_idle_stacks_only_says_how_to_draw_them(tmp_path: Path) -> None:
    (tmp_path / "stacks.collapsed").write_text("worker;idle;f (a.py:1);g (a.py:2) 7\n")
    with pytest.raises(InputError, match=r"all 7 stack samples .* are idle.*--idle"):
        snapshot_svg(tmp_path, 0.001)
    assert main(["flamegraph", str(tmp_path), "-o", str(tmp_path / "x"), "--idle"]) == 0
