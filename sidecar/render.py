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


# ------------------------------------------------------------------------- byte counts
# Binary units, as nvidia-smi and free(1) count them: an 80 GiB card (85,899,345,920 bytes)
# prints as "80.0 GiB", never as "85.9 GB".

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float | None, unit: str | None = None) -> str:
    """`3145728` -> "3.0 MiB"; `None` -> "n/a". `unit` fixes the unit (for a pair)."""
    if n is None:
        return "n/a"
    power = _UNITS.index(unit) if unit else _power(n)
    value = n / 1024**power
    return f"{value:.0f} B" if power == 0 else f"{value:.1f} {_UNITS[power]}"


def format_bytes_pair(used: float | None, total: float | None) -> str:
    """ "12.4/24.0 GiB": both in the total's unit, so they read as one fraction."""
    if used is None or total is None:
        return f"{format_bytes(used)}/{format_bytes(total)}"
    unit = _UNITS[_power(total)]
    left, right = format_bytes(used, unit), format_bytes(total, unit)
    return f"{left.rsplit(' ', 1)[0]}/{right}"


def _power(n: float) -> int:
    power = 0
    while abs(n) >= 1024 and power < len(_UNITS) - 1:
        n /= 1024
        power += 1
    return power
