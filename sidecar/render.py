"""Plain-text tables for people: the phase table per role and the classify listing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sidecar.records import Phase

ROLE_COLUMNS = ("api_server", "engine_core", "worker", "other")


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    body = [[str(c) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in body]
    return "\n".join(line.rstrip() for line in lines)


def phase_table(summary: Mapping[str, object]) -> str:
    """Phases down, roles across: each cell is that phase's share of the role's samples."""
    by_role = summary["by_role"]
    role_samples = summary["role_samples"]
    assert isinstance(by_role, Mapping) and isinstance(role_samples, Mapping)
    roles = [r for r in ROLE_COLUMNS if r in by_role]
    phases = summary["phases"]
    assert isinstance(phases, Mapping)
    rows = []
    for phase in Phase:
        if not phases[phase.value]["samples"]:
            continue
        cells = [_pct(by_role[r].get(phase.value)) for r in roles]
        rows.append([phase.value, *cells, _pct(phases[phase.value]["share"])])
    total = sum(int(role_samples[r]) for r in roles)
    rows.append(["samples", *(str(role_samples[r]) for r in roles), str(total)])
    return table(["phase", *roles, "all"], rows)


def _pct(share: object) -> str:
    if not isinstance(share, int | float) or share == 0:
        return "-"
    return f"{100 * share:.1f}%"
