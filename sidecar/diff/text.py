"""`vllm-sidecar diff`'s verdict on two sides: as text, as JSON, and the gate of `--fail-on`
(the words themselves: sidecar/diff/verdict.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sidecar.advice.findings import FindingChanges, changes_json, render_changes
from sidecar.analyze.compare import (
    MIX_SHARE,
    Change,
    Comparison,
    Workload,
    detectable,
    regressions,
)
from sidecar.analyze.history import LOAD_RATIO, MIN_HISTORY
from sidecar.diff.verdict import (
    caveats,
    change_words,
    largest,
    serving_value,
    side_wide,
    times,
    untested_cell,
    verdict,
)
from sidecar.tables import share_text, table

__all__ = ["caveats", "change_words", "gate", "render_text", "significant_rows", "to_json",
           "verdict"]  # fmt: skip


def render_text(
    c: Comparison,
    fail: tuple[Change, ...] = (),
    found: FindingChanges | None = None,
    fail_on: float | None = None,
) -> str:
    wa, wb = c.workloads
    out = ["[Diff] " + line for line in verdict(c)]
    if found is not None and found.new:
        out.append(f"[Diff] New findings in B: {', '.join(f.id for f in found.new)} (below).")
    out += ["", c.a.label, c.b.label]
    out += [f"Caveat: {line}" for line in caveats(c)]
    if found is not None:
        out += ["", *render_changes(found)]
    if c.fingerprint:
        out += ["", "[Diff] Fingerprint (what ran differently):"]
        out += [f"- {f.words()}" for f in c.fingerprint]
    out += ["", "[Diff] Workload:", table(["", "A", "B"], _workload_rows(wa, wb))]
    out += ["", "[Diff] Phase shares per role (pp; simultaneous 95 % score intervals, each "
            f"share within 0-100 %, m = {c.tested}):"]  # fmt: skip
    out.append(table(["role", "phase", "A", "B", "change", "interval", ""],
                     [_share_row(ch) for ch in c.shares]))  # fmt: skip
    heads = ["role", "phase", "A", "B", "B/A", "interval", ""]
    out += ["", "[Diff] CPU time per phase, in cores (estimate: each role's measured CPU split "
            "by its busy samples; intervals of the ratio, on the log scale):"]  # fmt: skip
    out.append(table(heads, [_ratio_row(ch, _fixed("{:.3f}")) for ch in c.cores]))
    out += ["", "[Diff] CPU seconds per 1,000 generated tokens (the same split):"]
    out.append(table(heads, [_ratio_row(ch, _fixed("{:.3f}")) for ch in c.costs]))
    out += ["", "[Diff] CPU milliseconds per finished request (estimates, not tested):"]
    out.append(table(heads[:5], [_ratio_row(ch, _fixed("{:.2f}", 1000))[:5]
                                 for ch in c.per_request]))  # fmt: skip
    out += ["", "[Diff] Serving figures:"]
    out.append(table(["figure", "A", "B", "B/A", "interval", ""],
                     [_ratio_row(ch, _serving(ch))[1:] for ch in c.serving]))  # fmt: skip
    if c.custom:
        m = sum(ch.tested for ch in c.custom)
        out += ["", "[Diff] Custom metrics (mean of the windows' values; tested apart from the "
                f"figures above, simultaneous 95 % intervals over their own m = {m}):"]  # fmt: skip
        out.append(table(["metric", "A", "B", "B/A", "interval", ""],
                         [_ratio_row(ch, _fixed("{:.4g}"))[1:] for ch in c.custom]))  # fmt: skip
    if fail:
        beyond = "" if fail_on is None else f" {fail_on_words(fail_on)}"
        out += ["", f"[Diff] Regressions beyond --fail-on{beyond}:"]
        out += [f"- {change_words(ch)}" for ch in fail]
    return "\n".join(out)


def fail_on_words(threshold: float) -> str:
    """The --fail-on threshold as given (10%), or as a factor beyond x2 (a rise of 300 % is
    x4.0)."""
    rise = 1 + threshold
    return f"{100 * threshold:g}%" if rise < 2 else f"{100 * threshold:g}% ({times(rise)})"


SIGNIFICANT_HEADERS = ("what", "role", "figure", "A", "B", "change", "interval", "")


_KIND_WORDS = {"share": "phase share", "cores": "CPU cores", "cost": "CPU s / 1k tokens",
               "serving": "serving"}  # fmt: skip


def significant_rows(c: Comparison) -> list[list[str]]:
    """The significant changes, largest first, as the text tables print each kind (shares in
    %, a change in pp; CPU figures and serving figures with B/A): SIGNIFICANT_HEADERS' cells."""
    rows = []
    for ch in c.significant:
        if ch.kind == "share":
            cells = _share_row(ch)
        else:
            cells = _ratio_row(ch, _serving(ch) if ch.kind == "serving" else _fixed("{:.3f}"))
        rows.append([_KIND_WORDS.get(ch.kind, ch.kind), *cells])
    return rows


def _workload_rows(a: Workload, b: Workload) -> list[list[str]]:
    def f(v: float | None, fmt: str = "{:.0f}") -> str:
        return "-" if v is None else fmt.format(v)

    return [
        ["windows / units", f"{a.windows} / {a.units}", f"{b.windows} / {b.units}"],
        ["seconds", f(a.seconds, "{:.1f}"), f(b.seconds, "{:.1f}")],
        ["requests finished", f(a.requests), f(b.requests)],
        ["prompt tokens", f(a.prompt_tokens), f(b.prompt_tokens)],
        ["generated tokens", f(a.generation_tokens), f(b.generation_tokens)],
        ["prompt tokens / request", f(a.prompt_per_request, "{:.1f}"),
         f(b.prompt_per_request, "{:.1f}")],
        ["generated tokens / request", f(a.generated_per_request, "{:.1f}"),
         f(b.generated_per_request, "{:.1f}")],
        ["prompt share of tokens", _pct(a.prompt_share), _pct(b.prompt_share)],
    ]  # fmt: skip


def _share_row(ch: Change) -> list[str]:
    interval = f"{_pp(ch.low)} .. {_pp(ch.high)}" if ch.tested else untested_cell(ch)
    return [ch.role or "", ch.name, _pct(ch.a), _pct(ch.b), _pp(ch.change), interval,
            "significant" if ch.significant else ""]  # fmt: skip


Value = Callable[[float | None], str]


def _fixed(fmt: str, scale: float = 1.0) -> Value:
    return lambda v: "-" if v is None else fmt.format(v * scale)


def _serving(ch: Change) -> Value:
    return lambda v: serving_value(ch.name, v)


def _ratio_row(ch: Change, value: Value) -> list[str]:
    """role, figure, A, B, B/A, its interval (x0.82 .. x1.20), significant."""
    if ch.low is not None and ch.high is not None:
        interval = f"{times(ch.low)} .. {times(ch.high)}"
    else:
        interval = untested_cell(ch)
    change = "-" if ch.change is None else times(ch.change)
    return [ch.role or "", ch.name, value(ch.a), value(ch.b), change, interval,
            "significant" if ch.significant else ""]  # fmt: skip


def _pct(v: float | None) -> str:
    return "-" if v is None else share_text(v)


def _pp(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:+.1f} pp"


def to_json(
    c: Comparison, fail: tuple[Change, ...] = (), found: FindingChanges | None = None
) -> dict[str, Any]:
    """The diff as JSON. Its keys are a contract (operators' scripts read them): add, never
    rename (docs/guide/comparing.md)."""

    def change(ch: Change) -> dict[str, Any]:
        return {"kind": ch.kind, "role": ch.role, "name": ch.name, "a": _clean(ch.a),
                "b": _clean(ch.b), "scale": ch.scale, "change": _clean(ch.change),
                "low": _clean(ch.low), "high": _clean(ch.high), "significant": ch.significant,
                "p_adjusted": _clean(ch.p_adjusted), "note": ch.note,
                "untested_side_wide": side_wide(ch), "words": change_words(ch),
                "history_windows": ch.history_windows}  # fmt: skip

    def load(w: Workload) -> dict[str, Any]:
        return {"windows": w.windows, "units": w.units, "seconds": w.seconds,
                "requests": w.requests, "prompt_tokens": w.prompt_tokens,
                "generation_tokens": w.generation_tokens,
                "prompt_per_request": w.prompt_per_request,
                "generated_per_request": w.generated_per_request,
                "prompt_share": w.prompt_share}  # fmt: skip

    return {
        "verdict": verdict(c),
        "a": {"label": c.a.label, "snapshots": [s.name for s in c.a.summaries],
              "workload": load(c.workloads[0])},
        "b": {"label": c.b.label, "snapshots": [s.name for s in c.b.summaries],
              "workload": load(c.workloads[1])},
        "fingerprint": [{"field": f.field, "a": f.a, "b": f.b} for f in c.fingerprint],
        "caveats": caveats(c),
        "workload_differs": c.mix_differs,
        "method": {"alpha": c.alpha, "tested": c.tested, "intervals": "simultaneous "
                   "(Bonferroni), Welch t over py-spy segments (shares) or windows (CPU, "
                   "traffic, latencies), ratio-estimator variances; a difference of shares: "
                   "Newcombe's hybrid score interval on Wilson intervals at each side's "
                   "effective sample size; a ratio: on the log scale",
                   "history": HISTORY_METHOD},
        "shares": [change(ch) for ch in c.shares],
        "cores": [change(ch) for ch in c.cores],
        "costs": [change(ch) for ch in c.costs],
        "per_request": [change(ch) for ch in c.per_request],
        "serving": [change(ch) for ch in c.serving],
        "custom": [change(ch) for ch in c.custom],
        "significant": [change(ch) for ch in c.significant],
        "regressions": [change(ch) for ch in fail],
        "findings": changes_json(found) if found is not None else None,
        # The widest tested interval's half-width in each family: shares as `change` is (0.05:
        # 5 pp), CPU and serving figures as a factor (1.8: x/÷1.8); null: none tested.
        "detectable": {"shares": _clean(detectable(c.shares)),
                       "cpu": _clean(detectable((*c.cores, *c.costs))),
                       "serving": _clean(detectable(c.serving))},
        "largest": [change(ch) for ch in largest(c)],
        "history": history_json(c),
    }  # fmt: skip


HISTORY_METHOD = (
    "where a side has one window, CPU, traffic and latencies are tested against the pooled "
    "between-window variance (log scale) of the deployment's other windows of the same "
    f"fingerprint at a comparable load (requests/s within \u00d7/\u00f7{LOAD_RATIO:g}, prompt "
    f"share of tokens within {100 * MIX_SHARE:.0f} points): SE^2 = s^2 (1/n_A + 1/n_B), a "
    "window shorter than the history's median stretched by median / its length, df = "
    "windows - groups, in the same Bonferroni family; untested below "
    f"{MIN_HISTORY} windows' worth"
)


def history_json(c: Comparison) -> dict[str, Any] | None:
    """What the deployment's history did for this diff; null: none was consulted (each side
    had two windows or more, or the caller gave none)."""
    h = c.history
    if h is None:
        return None
    return {"consulted": not h.off, "windows": h.windows,
            "groups": [[s.name for s in g] for g in h.groups], "needed": MIN_HISTORY,
            "worth": h.depth, "enough": h.enough, "considered": h.considered,
            "other_fingerprint": h.other_fingerprint, "other_load": h.other_load,
            "overlapping": h.overlapping,
            "tested": len(c.history_tested),
            "words": h.words() if c.history_tested else h.shortfall()}  # fmt: skip


def _clean(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 6)


def gate(c: Comparison, fail_on: float | None) -> tuple[Change, ...]:
    return regressions(c, fail_on) if fail_on is not None else ()
