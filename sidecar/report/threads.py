"""The report's part on threads against /proc (schema 5, sidecar.classify.groundtruth): counts, the
flagged threads with their reasons, and the line under the main-thread table that keeps a busy
event loop from being shown idle. Built from the summary alone, as the rest of the report."""

from __future__ import annotations

from sidecar.records import MAIN_THREAD
from sidecar.records.summary import Agreement, SnapshotSummary
from sidecar.report.views import NotMeasured, ThreadsView

FLAGGED = (Agreement.CPU_ABOVE, Agreement.CPU_BELOW)
GROUND_TRUTH_HOW = (
    "busy = samples outside idle, 99 % Wilson interval; CPU measured from /proc/PID/task/TID/stat"
)
AGREEMENT_WORDS = {
    "agree": "agree",
    "cpu_above": "flagged: /proc busier",
    "cpu_below": "flagged: samples busier",
    "spins": "spin while waiting (not compared)",
    "unmeasured": "not measured",
}


def threads_view(s: SnapshotSummary) -> ThreadsView | NotMeasured:
    """Each sampled thread's busy share against its CPU time measured from /proc (schema 5)."""
    if not s.threads:
        return NotMeasured("not measured (written before schema 5, or no thread was read)")
    counts: dict[str, int] = {}
    for t in s.threads:
        counts[t.agreement.value] = counts.get(t.agreement.value, 0) + 1
    flagged = tuple(t for t in s.threads if t.agreement in FLAGGED)
    return ThreadsView(counts=counts, flagged=flagged, how=GROUND_TRUTH_HOW)


def main_cpu_line(s: SnapshotSummary) -> list[str]:
    """Under the main-thread table, each main thread's CPU measured from /proc: the samples'
    `idle` of an event loop is not the loop's CPU, and the operator sees both side by side."""
    mains = [t for t in s.threads if t.name == MAIN_THREAD and t.cpu_share is not None]
    if not mains:
        return []
    parts = [f"{t.role.value} {_pct1(t.cpu_share)}" + (" (spins)" if t.agreement is
             Agreement.SPINS else "") for t in mains]  # fmt: skip
    return [f"CPU measured from /proc, share of a core per main thread: {', '.join(parts)}"]


def unseen_lines(s: SnapshotSummary) -> list[str]:
    """Under the main-thread table: a main thread whose /proc CPU time the samples cannot see
    (an event loop working in C looks idle), so that a busy API server is never shown idle."""
    out = []
    for t in s.threads:
        if t.name == MAIN_THREAD and t.agreement is Agreement.CPU_ABOVE and t.cpu_share:
            out.append(
                f"- {t.role.value} main thread (pid {t.pid}): {_pct1(t.cpu_share)} of a core "
                f"measured from /proc, {_pct1(t.busy_share)} of its samples busy: "
                f"{_pct1(t.unseen_cpu_share)} of a core is work its stacks do not show "
                f"({t.reason})"
            )
    return out


def render_threads(th: ThreadsView) -> str:
    said = ", ".join(f"{n} {AGREEMENT_WORDS.get(k, k)}" for k, n in th.counts.items())
    lines = [f"Threads against /proc ({th.how}): {said}"]
    for t in th.flagged:
        name = t.name or f"tid {t.tid}"
        lines.append(
            f"- {t.role} {name} (pid {t.pid}, tid {t.tid}): samples "
            f"{_pct1(t.busy_share)} busy [{_pct1(t.busy_low)}-{_pct1(t.busy_high)}] "
            f"of {t.samples}, /proc {_pct1(t.cpu_share)} of a core: {t.reason}"
        )
    return "\n".join(lines)


def _pct1(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.1f}%"
