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


def draw(snapshot: Path, out: str | None, min_width: float, exporter: str) -> list[Path]:
    """The flame graph of SNAPSHOT: <prefix>.svg and <prefix>.speedscope.json."""
    from sidecar.flame.graph import speedscope

    rows = _nonempty(read_stack_rows(snapshot), snapshot)
    snapshot = snapshot.resolve()  # `flamegraph .` is named after the folder
    text = plain_svg(rows, snapshot.name, min_width)
    prefix = output_prefix(out, f"flame-{snapshot.name}")
    svg, ss = (
        prefix.with_name(prefix.name + ".svg"),
        prefix.with_name(prefix.name + ".speedscope.json"),
    )
    document = speedscope(rows, snapshot.name, exporter)
    write_files([(svg, text), (ss, json_text(document, separators=(",", ":")))])
    return [svg, ss]


def snapshot_svg(snapshot: Path, min_width: float) -> str:
    """The flame graph of SNAPSHOT as SVG text (what `draw` writes; the HTML page embeds it)."""
    rows = _nonempty(read_stack_rows(snapshot), snapshot)
    return plain_svg(rows, snapshot.resolve().name, min_width)


def plain_svg(rows: tuple[StackRow, ...], name: str, min_width: float) -> str:
    """The plain graph of ROWS, headed with NAME, its samples per role and what was pruned."""
    from sidecar.flame.graph import build_tree, layout
    from sidecar.flame.svg import Heading, render_svg

    tree = build_tree(rows)
    shape = layout(tree, min_width)
    roles = ", ".join(f"{r.name} {100 * r.value / tree.value:.1f}%" for r in tree.children)
    heading = Heading(
        f"Flame graph: {name}",
        (
            f"{tree.value:,} samples ({roles}); width: samples; colour: the phase most of a "
            "frame's samples were classified as",
            _pruned(shape.hidden_frames, shape.hidden_share, min_width, "samples"),
        ),
    )
    return render_svg(shape, heading)


def draw_diff(before: Path, after: Path, out: str | None, min_width: float) -> list[Path]:
    """The differential flame graph of BEFORE (A) -> AFTER (B): <prefix>.svg only (speedscope
    has no differential view: `flamegraph AFTER` writes B's profile)."""
    from sidecar.flame.graph import build_diff_tree, layout
    from sidecar.flame.svg import Heading, render_diff_svg

    rows_a = _nonempty(read_stack_rows(before), before)
    rows_b = _nonempty(read_stack_rows(after), after)
    before, after = before.resolve(), after.resolve()
    tree = build_diff_tree(rows_a, rows_b)
    shape = layout(tree, min_width)
    heading = Heading(
        f"Differential flame graph: A {before.name} -> B {after.name}",
        (
            f"A {before} ({tree.base or 0:,} samples), B {after} ({tree.value:,} samples)",
            "width: B's share of its samples (a frame only in A: its share of A's); colour: the "
            "change in the frame's share of all samples, red grew, blue shrank",
            _pruned(shape.hidden_frames, shape.hidden_share, min_width, "the width"),
        ),
    )
    prefix = output_prefix(out, f"flamediff-{before.name}-{after.name}")
    svg = prefix.with_name(prefix.name + ".svg")
    write_files([(svg, render_diff_svg(shape, heading))])
    return [svg]


def _nonempty(rows: tuple[StackRow, ...], folder: Path) -> tuple[StackRow, ...]:
    if not sum(r.weight for r in rows):
        raise InputError(
            f"the snapshot in {folder} holds no stack samples, so there is nothing to draw: "
            "see sampling.errors in its summary.json, and take a longer window"
        )
    return rows


def _pruned(frames: int, share: float, min_width: float, of: str) -> str:
    if not frames:
        return f"every frame drawn (none narrower than {100 * min_width:g}% of the width)"
    return (
        f"{frames:,} frames narrower than {100 * min_width:g}% of the width not drawn "
        f"({100 * share:.2f}% of {of}); --min-width 0 draws them"
    )
