"""Plain-text tables for people: the phase table per role and the classify listing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sidecar.records import Phase
from sidecar.records.summary import SnapshotSummary

ROLE_COLUMNS = ("api_server", "engine_core", "worker", "other")


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    body = [[str(c) for c in r] for r in rows]
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
