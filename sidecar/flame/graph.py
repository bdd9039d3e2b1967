"""Flame graphs of a snapshot's stacks: rows -> tree -> layout, and speedscope's file format.

Pure functions over frozen records; reading the snapshot and writing the files happen in
sidecar/flame/files.py, drawing the SVG in sidecar/flame/svg.py. The conventions are Brendan
Gregg's flamegraph.pl (github.com/brendangregg/FlameGraph): "all" at the root, frames merged by
name along the path from the root, children in name order, a frame's width proportional to its
samples, frames too narrow to see left out; here the level under "all" is the process role, and
a frame takes the colour of the phase that most of its samples were classified as.

A differential graph follows flamegraph.pl's difffolded.pl: the layout is the second (newer)
profile's, and each frame's colour says how its share of all samples changed from the first to
the second. Shares, not counts, so that two windows of different lengths or rates compare.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.records import Phase, Role
from sidecar.store.stacks import StackRow

ROOT_NAME = "all"
SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"
_PHASE_ORDER = {p.value: i for i, p in enumerate(Phase)}
_ROLE_ORDER = {r.value: i for i, r in enumerate(Role)}


@dataclass(frozen=True, slots=True)
class FlameNode:
    """A frame in the merged call tree. `value` is its samples (the newer side's in a diff),
    `base` the older side's in a diff (None in a plain graph); `phases` counts the samples
    under it by phase, the larger first."""

    name: str
    value: int
    phases: tuple[tuple[str, int], ...]
    children: tuple[FlameNode, ...] = ()
    base: int | None = None

    @property
    def phase(self) -> str:
        return self.phases[0][0] if self.phases else Phase.OTHER.value

    def walk(self) -> Iterable[FlameNode]:
        """This node and every one under it, depth first, parents before children. Loops, not
        recursion, here and in every tree walk of this module: a stack 1,000 frames deep (a
        recursive model, a deep torch.compile graph) must not hit Python's recursion limit."""
        todo = [self]
        while todo:
            node = todo.pop()
            yield node
            todo.extend(reversed(node.children))


@dataclass(slots=True)
class _Builder:
    """The mutable tree while rows are merged in; frozen into FlameNode once complete."""

    value: int = 0
    base: int = 0
    phases: dict[str, int] = field(default_factory=dict)
    children: dict[str, _Builder] = field(default_factory=dict)

    def add(self, path: Iterable[str], phase: str, weight: int, *, base: bool) -> None:
        node = self
        node._count(phase, weight, base)
        for name in path:
            node = node.children.setdefault(name, _Builder())
            node._count(phase, weight, base)

    def _count(self, phase: str, weight: int, base: bool) -> None:
        if base:
            self.base += weight
            return
        self.value += weight
        self.phases[phase] = self.phases.get(phase, 0) + weight

    def freeze(self, name: str, *, diff: bool, order: Mapping[str, int] | None = None) -> FlameNode:
        """The frozen tree, children before their parent (a loop, not recursion)."""
        frozen: dict[int, FlameNode] = {}
        todo: list[tuple[_Builder, str, Mapping[str, int] | None, bool]] = [
            (self, name, order, False)
        ]
        while todo:
            node, label, rank, children_done = todo.pop()
            names = sorted(node.children, key=lambda n: ((rank or {}).get(n, len(rank or {})), n))
            if not children_done:
                todo.append((node, label, rank, True))
                todo.extend((node.children[n], n, None, False) for n in names)
                continue
            ranked = sorted(
                node.phases.items(), key=lambda kv: (-kv[1], _PHASE_ORDER.get(kv[0], 99))
            )
            frozen[id(node)] = FlameNode(
                name=label,
                value=node.value,
                phases=tuple(ranked),
                children=tuple(frozen.pop(id(node.children[n])) for n in names),
                base=node.base if diff else None,
            )
        return frozen[id(self)]


def split_idle(rows: Iterable[StackRow]) -> tuple[tuple[StackRow, ...], int]:
    """ROWS without the stacks classified idle, and the samples those held. Flame graphs leave
    idle out by default, as py-spy does (its --idle keeps them): in a busy window idle threads
    take most of the width and squeeze the model's work into a sliver."""
    kept: list[StackRow] = []
    idle = 0
    for row in rows:
        if row.phase == Phase.IDLE.value:
            idle += row.weight
        else:
            kept.append(row)
    return tuple(kept), idle


def build_tree(rows: Iterable[StackRow], *, idle: bool = False) -> FlameNode:
    """ "all" -> role -> frames root first; identical paths merged, children in name order.
    Stacks classified idle are left out unless IDLE (split_idle)."""
    if not idle:
        rows = split_idle(rows)[0]
    root = _Builder()
    for row in rows:
        root.add((row.role, *row.frames), row.phase, row.weight, base=False)
    return root.freeze(ROOT_NAME, diff=False, order=_ROLE_ORDER)


def build_diff_tree(
    before: Iterable[StackRow], after: Iterable[StackRow], *, idle: bool = False
) -> FlameNode:
    """Both profiles in one tree: `base` counts BEFORE's samples and `value` AFTER's. A frame
    only in BEFORE has value 0 (and takes its phases from BEFORE, for its title). Idle stacks
    are left out of both unless IDLE, so shares are of the busy samples."""
    if not idle:
        before, after = split_idle(before)[0], split_idle(after)[0]
    root = _Builder()
    for row in after:
        root.add((row.role, *row.frames), row.phase, row.weight, base=False)
    gone = _Builder()  # BEFORE's phases, for frames AFTER lacks
    for row in before:
        root.add((row.role, *row.frames), row.phase, row.weight, base=True)
        gone.add((row.role, *row.frames), row.phase, row.weight, base=False)
    _borrow_phases(root, gone)
    return root.freeze(ROOT_NAME, diff=True, order=_ROLE_ORDER)


def _borrow_phases(node: _Builder, other: _Builder) -> None:
    todo = [(node, other)]
    while todo:
        mine, theirs = todo.pop()
        if not mine.phases:
            mine.phases = dict(theirs.phases)
        todo.extend(
            (child, theirs.children[name])
            for name, child in mine.children.items()
            if name in theirs.children
        )


# ------------------------------------------------------------------------------------- layout


@dataclass(frozen=True, slots=True)
class Box:
    """One frame's rectangle: depth 0 is "all"; x and width are fractions of the root's width."""

    node: FlameNode
    depth: int
    x: float
    width: float
    path: tuple[str, ...]  # the names from the root's child down to this frame


@dataclass(frozen=True, slots=True)
class Layout:
    boxes: tuple[Box, ...]
    depth: int  # the deepest level drawn
    hidden_frames: int  # frames left out as narrower than min_width (with all under them)
    hidden_share: float  # the share of the root's width they stood for
    min_width: float


def layout(tree: FlameNode, min_width: float = 0.001) -> Layout:
    """Boxes for every frame at least `min_width` of the root wide (flamegraph.pl's
    --minwidth, as a fraction); narrower frames and everything above them are left out."""
    widths = _widths(tree, tree.base is not None)
    total = widths[id(tree)] or 1.0
    boxes: list[Box] = []
    hidden_frames, hidden_share = 0, 0.0

    todo: list[tuple[FlameNode, int, float, tuple[str, ...]]] = [(tree, 0, 0.0, ())]
    while todo:  # depth first, parents before children, children left to right
        node, depth, x, path = todo.pop()
        width = widths[id(node)] / total
        if depth and width < min_width:
            hidden_frames += sum(1 for _ in node.walk())
            hidden_share += width
            continue
        boxes.append(Box(node, depth, x, width, path))
        placed = []
        for child in node.children:
            placed.append((child, depth + 1, x, (*path, child.name)))
            x += widths[id(child)] / total
        todo.extend(reversed(placed))
    depth = max((b.depth for b in boxes), default=0)
    return Layout(tuple(boxes), depth, hidden_frames, hidden_share, min_width)


def _widths(tree: FlameNode, diff: bool) -> dict[int, float]:
    """Each node's width in layout units: its samples in a plain graph. In a diff, its share
    of the newer profile's samples; a frame gone from the newer profile keeps its share of the
    older one, and a frame widens to hold its children (so frames that vanished stay visible)."""
    out: dict[int, float] = {}
    total_a = max(tree.base or 0, 1)
    total_b = max(tree.value, 1)

    for node in reversed(list(tree.walk())):  # children before their parents
        inner = sum(out[id(c)] for c in node.children)
        if not diff:
            own = float(node.value)
        elif node.value:
            own = node.value / total_b
        else:
            own = (node.base or 0) / total_a
        out[id(node)] = max(own, inner)
    return out


# --------------------------------------------------------------------------------------- diff


@dataclass(frozen=True, slots=True)
class Change:
    """A frame's share of all samples in each profile, and the change in percentage points."""

    before: float
    after: float
    sign: int  # -1 shrank, 0 unchanged, +1 grew: decided on integers, so ties are exact

    @property
    def points(self) -> float:
        return 100 * (self.after - self.before)


def change(node: FlameNode, root: FlameNode) -> Change:
    """NODE's normalised share in both profiles of a diff tree rooted at ROOT."""
    a, b = node.base or 0, node.value
    total_a, total_b = root.base or 0, root.value
    lhs, rhs = b * total_a, a * total_b  # b/total_b vs a/total_a without rounding
    sign = (lhs > rhs) - (lhs < rhs)
    return Change(a / total_a if total_a else 0.0, b / total_b if total_b else 0.0, sign)


# ---------------------------------------------------------------------------------- speedscope

_LABEL = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def frame_record(label: str) -> dict[str, Any]:
    """A stack label ("func (file:line)", "func (lib.so)", or a bare name) as speedscope's
    Frame: {name, file?, line?}."""
    m = _LABEL.match(label)
    if not m:
        return {"name": label}
    out: dict[str, Any] = {"name": m["name"], "file": m["file"]}
    if m["line"] is not None:
        out["line"] = int(m["line"])
    return out


def speedscope(rows: Iterable[StackRow], name: str, exporter: str) -> dict[str, Any]:
    """speedscope's file format (jlfwong/speedscope src/lib/file-format-spec.ts): the frames
    shared, one "sampled" profile per role, each sample a list of frame indices root first with
    its weight in samples (unit "none"). EXPORTER: "name@version", as the spec recommends."""
    frames: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    by_role: dict[str, tuple[list[list[int]], list[int]]] = {}
    for row in rows:
        stack = []
        for label in row.frames:
            if label not in index:
                index[label] = len(frames)
                frames.append(frame_record(label))
            stack.append(index[label])
        samples, weights = by_role.setdefault(row.role, ([], []))
        samples.append(stack)
        weights.append(row.weight)
    roles = sorted(by_role, key=lambda r: (_ROLE_ORDER.get(r, len(_ROLE_ORDER)), r))
    profiles = [_profile(f"{name} {role}", *by_role[role]) for role in roles]
    heaviest = max(range(len(profiles)), key=lambda i: profiles[i]["endValue"], default=0)
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "name": name,
        "exporter": exporter,
        "activeProfileIndex": heaviest,
        "shared": {"frames": frames},
        "profiles": profiles,
    }


def _profile(name: str, samples: list[list[int]], weights: list[int]) -> dict[str, Any]:
    return {
        "type": "sampled",
        "name": name,
        "unit": "none",
        "startValue": 0,
        "endValue": sum(weights),
        "samples": samples,
        "weights": weights,
    }
