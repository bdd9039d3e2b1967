"""Plain-text tables for people: the phase table per role and the classify listing; and the
two ways any command prints what it read from outside (issue 26, item 18): text with its control
characters escaped (a frame name holding an OSC sequence must not retitle the terminal), and
JSON that is JSON (no bare NaN or Infinity)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from sidecar.records import Phase
from sidecar.records.summary import SnapshotSummary

ROLE_COLUMNS = ("api_server", "engine_core", "worker", "other")


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character but tab and newline shown as a `\\x..` escape."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def share_text(share: float) -> str:
    """A phase's share: one decimal, and "<0.1%" rather than a misleading 0.0%."""
    return "<0.1%" if 0 < share < 0.0005 else f"{100 * share:.1f}%"


def json_text(doc: Any, **options: Any) -> str:
    """`json.dumps` whose output every JSON reader takes: NaN and the infinities become null."""
    return json.dumps(_finite(doc), allow_nan=False, **options)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    body = [[printable(str(c)) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in body]
    return "\n".join(line.rstrip() for line in lines)


def phase_table(summary: SnapshotSummary) -> str:
    """Phases down, roles across: each cell is that phase's share of the role's samples."""
    by_role, role_samples = summary.by_role, summary.role_samples
    roles = [r for r in ROLE_COLUMNS if r in by_role]
    rows = []
    for phase in Phase:
        count = summary.phases.get(phase.value)
        if count is None or not count.samples:
            continue
        cells = [_pct(by_role[r].get(phase.value)) for r in roles]
        rows.append([phase.value, *cells, _pct(count.share)])
    total = sum(role_samples.get(r, 0) for r in roles)
    rows.append(["samples", *(str(role_samples.get(r, 0)) for r in roles), str(total)])
    return table(["phase", *roles, "all"], rows)


def _pct(share: object) -> str:
    if not isinstance(share, int | float) or share == 0:
        return "-"
    return f"{100 * share:.1f}%"
