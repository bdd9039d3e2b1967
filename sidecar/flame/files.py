"""The flame graph's edges: a snapshot folder's stacks in, the SVG and speedscope files out.

stacks.parquet is read with pyarrow (only the columns a flame graph needs, so snapshots of
every schema read alike: schema 1 and 2 lack host, deployment, snapshot, time and kind); a
folder without it falls back to stacks.collapsed (`role;phase;frames weight` lines).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from sidecar.errors import InputError, OutputError
from sidecar.store.atomic import write_file
from sidecar.store.stacks import StackRow, read_stack_rows
from sidecar.tables import json_text


def write_files(files: Iterable[tuple[Path, str]]) -> None:
    """Each (path, text) written atomically (sidecar/store/atomic.py)."""
    for path, text in files:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_file(path, text, durable=False)
        except OSError as exc:
            raise OutputError(
                f"cannot write {path} ({exc.strerror or exc}): point --out at a writable folder"
            ) from exc


# ------------------------------------------------------------------------------------ command


def output_prefix(out: str | None, default_name: str) -> Path:
    """--out: a folder (existing, or written with a trailing slash) gets DEFAULT_NAME inside;
    anything else is the prefix itself; none means DEFAULT_NAME in the working folder."""
    if not out:
        return Path(default_name)
    if Path(out).is_dir() or out.endswith(os.sep):
        return Path(out) / default_name
    return Path(out)


def draw(
    snapshot: Path, out: str | None, min_width: float, exporter: str, idle: bool = False
) -> list[Path]:
    """The flame graph of SNAPSHOT: <prefix>.svg and <prefix>.speedscope.json; both without
    the stacks classified idle unless IDLE (as py-spy's --idle)."""
    from sidecar.flame.graph import speedscope, split_idle

    rows = _nonempty(read_stack_rows(snapshot), snapshot, idle)
    snapshot = snapshot.resolve()  # `flamegraph .` is named after the folder
    text = plain_svg(rows, snapshot.name, min_width, idle=idle)
    if not idle:
        rows = split_idle(rows)[0]
    prefix = output_prefix(out, f"flame-{snapshot.name}")
    svg, ss = (
        prefix.with_name(prefix.name + ".svg"),
        prefix.with_name(prefix.name + ".speedscope.json"),
    )
    document = speedscope(rows, snapshot.name, exporter)
    write_files([(svg, text), (ss, json_text(document, separators=(",", ":")))])
    return [svg, ss]


def snapshot_svg(snapshot: Path, min_width: float, idle: bool = False) -> str:
    """The flame graph of SNAPSHOT as SVG text (what `draw` writes; the HTML page embeds it),
    without idle stacks unless IDLE."""
    rows = _nonempty(read_stack_rows(snapshot), snapshot, idle)
    return plain_svg(rows, snapshot.resolve().name, min_width, idle=idle)


def plain_svg(
    rows: tuple[StackRow, ...], name: str, min_width: float, *, idle: bool = False
) -> str:
    """The plain graph of ROWS, headed with NAME, its samples per role, the idle samples left
    out (all of them unless IDLE) and what was pruned."""
    from sidecar.flame.graph import build_tree, layout, split_idle
    from sidecar.flame.svg import Heading, render_svg

    tree = build_tree(rows, idle=idle)
    idle_samples = 0 if idle else split_idle(rows)[1]
    shape = layout(tree, min_width)
    roles = ", ".join(f"{r.name} {100 * r.value / tree.value:.1f}%" for r in tree.children)
    heading = Heading(
        f"Flame graph: {name}",
        (
            f"{tree.value:,} samples ({roles}); width: samples; colour: the phase most of a "
            "frame's samples were classified as",
            *_idle_left_out(("", idle_samples, tree.value + idle_samples)),
            _pruned(shape.hidden_frames, shape.hidden_share, min_width, "samples"),
        ),
    )
    return render_svg(shape, heading)


def draw_diff(
    before: Path, after: Path, out: str | None, min_width: float, idle: bool = False
) -> list[Path]:
    """The differential flame graph of BEFORE (A) -> AFTER (B): <prefix>.svg only (speedscope
    has no differential view: `flamegraph AFTER` writes B's profile). Idle stacks are left out
    of both unless IDLE."""
    from sidecar.flame.graph import build_diff_tree, layout, split_idle
    from sidecar.flame.svg import Heading, render_diff_svg

    rows_a = _nonempty(read_stack_rows(before), before, idle)
    rows_b = _nonempty(read_stack_rows(after), after, idle)
    before, after = before.resolve(), after.resolve()
    tree = build_diff_tree(rows_a, rows_b, idle=idle)
    idle_a = 0 if idle else split_idle(rows_a)[1]
    idle_b = 0 if idle else split_idle(rows_b)[1]
    shape = layout(tree, min_width)
    heading = Heading(
        f"Differential flame graph: A {before.name} -> B {after.name}",
        (
            f"A {before} ({tree.base or 0:,} samples), B {after} ({tree.value:,} samples)",
            "width: B's share of its samples (a frame only in A: its share of A's); colour: the "
            "change in the frame's share of all samples, red grew, blue shrank",
            *_idle_left_out(
                ("A ", idle_a, (tree.base or 0) + idle_a), ("B ", idle_b, tree.value + idle_b)
            ),
            _pruned(shape.hidden_frames, shape.hidden_share, min_width, "the width"),
        ),
    )
    prefix = output_prefix(out, f"flamediff-{before.name}-{after.name}")
    svg = prefix.with_name(prefix.name + ".svg")
    write_files([(svg, render_diff_svg(shape, heading))])
    return [svg]


def _nonempty(rows: tuple[StackRow, ...], folder: Path, idle: bool) -> tuple[StackRow, ...]:
    from sidecar.flame.graph import split_idle

    total = sum(r.weight for r in rows)
    if not total:
        raise InputError(
            f"the snapshot in {folder} holds no stack samples, so there is nothing to draw: "
            "see sampling.errors in its summary.json, and take a longer window"
        )
    if not idle and split_idle(rows)[1] == total:
        raise InputError(
            f"all {total:,} stack samples of the snapshot in {folder} are idle, and flame "
            "graphs leave idle out: `flamegraph --idle` draws them"
        )
    return rows


def _idle_left_out(*sides: tuple[str, int, int]) -> tuple[str, ...]:
    """The heading's line on idle samples left out, for each (label, idle, all samples) side
    that had any; no line when none was left out."""
    said = [
        f"{label}{n:,} of {total:,} samples ({100 * n / total:.1f}%)"
        for label, n, total in sides
        if n
    ]
    if not said:
        return ()
    return (f"idle left out: {', '.join(said)} were idle; --idle draws them",)


def _pruned(frames: int, share: float, min_width: float, of: str) -> str:
    if not frames:
        return f"every frame drawn (none narrower than {100 * min_width:g}% of the width)"
    return (
        f"{frames:,} frames narrower than {100 * min_width:g}% of the width not drawn "
        f"({100 * share:.2f}% of {of}); --min-width 0 draws them"
    )
