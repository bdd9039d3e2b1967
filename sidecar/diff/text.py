"""`vllm-sidecar diff`'s verdict on two sides: as text, as JSON, and the gate of `--fail-on`."""

from __future__ import annotations

import math
from typing import Any

from sidecar.advice.findings import FindingChanges, changes_json, render_changes
from sidecar.analyze.compare import Change, Comparison, Workload, regressions
from sidecar.sampling.pyspy import LATE_S
from sidecar.tables import table


def verdict(c: Comparison, top: int = 6) -> list[str]:
    """The largest significant changes in plain words, the fingerprint first."""
    lines = (
        [f"Ran differently: {', '.join(f.words() for f in c.fingerprint)}."]
        if c.fingerprint
        else []
    )
    for label in c.mixed:
        lines.append(f"Note: {label.split(':')[0]} mixes windows of different fingerprints.")
    if c.mix_differs:
        lines.append(f"The workload differs ({c.mix_differs}): costs per token and per "
                     "request and latencies compare unlike work, and --fail-on does not gate "
                     "on them.")  # fmt: skip
    custom = [ch for ch in c.custom if ch.significant]
    if custom:
        lines.append(
            "Custom metrics (tested apart): "
            + "; ".join(f"{ch.name} {_ratio_words(ch.change)}" for ch in custom)
            + "."
        )
    found = c.significant
    if not found:
        lines.append(
            f"No significant change: none of the {c.tested} tested differences is outside its "
            f"interval (family-wise {100 * (1 - c.alpha):.0f} %)."
        )
        return lines
    # What vLLM served (latency, throughput), then where the time goes (shares), then CPU;
    # the largest of each first.
    quota = (("serving", 2), ("share", 2), ("cost", 1), ("cores", 1))
    picked = [ch for kind, n in quota for ch in [x for x in found if x.kind == kind][:n]][:top]
    more = f" (and {len(found) - len(picked)} more)" if len(found) > len(picked) else ""
    lines.append("Significant: " + "; ".join(change_words(ch) for ch in picked) + more + ".")
    return lines


def change_words(ch: Change) -> str:
    who = f"{ch.role.replace('_', ' ')} " if ch.role else ""
    if ch.kind == "share":
        direction = "up" if (ch.change or 0) > 0 else "down"
        size = abs(ch.change or 0.0) * 100
        return (f"{who}{ch.name.replace('_', ' ')} {direction} "
                f"{size:.1f} pp ({_pct(ch.a)} \u2192 {_pct(ch.b)} of its samples)")  # fmt: skip
    what = ch.name
    phase = "" if ch.name == "all" else f" in {ch.name.replace('_', ' ')}"
    if ch.kind == "cost":
        what = f"{who}CPU per 1k generated tokens{phase}"
    elif ch.kind == "cores":
        what = f"{who}CPU time{phase}"
    return f"{what} {_ratio_words(ch.change)}"


def render_text(
    c: Comparison, fail: tuple[Change, ...] = (), found: FindingChanges | None = None
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
    out += ["", f"[Diff] Phase shares per role (pp; simultaneous 95 % intervals, m = {c.tested}):"]
    out.append(table(["role", "phase", "A", "B", "change", "interval", ""],
                     [_share_row(ch) for ch in c.shares]))  # fmt: skip
    heads = ["role", "phase", "A", "B", "B/A", "interval", ""]
    out += ["", "[Diff] CPU time per phase, in cores (estimate: each role's measured CPU split "
            "by its busy samples):"]  # fmt: skip
    out.append(table(heads, [_ratio_row(ch, ch.role or "", "{:.3f}") for ch in c.cores]))
    out += ["", "[Diff] CPU seconds per 1,000 generated tokens (the same split):"]
    out.append(table(heads, [_ratio_row(ch, ch.role or "", "{:.3f}") for ch in c.costs]))
    out += ["", "[Diff] CPU milliseconds per finished request (estimates, not tested):"]
    out.append(table(heads[:5], [_ratio_row(ch, ch.role or "", "{:.2f}", 1000)[:5]
                                 for ch in c.per_request]))  # fmt: skip
    out += ["", "[Diff] Serving figures:"]
    out.append(table(["figure", "A", "B", "B/A", "interval", ""],
                     [_ratio_row(ch, None, "{:.4g}")[1:] for ch in c.serving]))  # fmt: skip
    if c.custom:
        m = sum(ch.tested for ch in c.custom)
        out += ["", "[Diff] Custom metrics (mean of the windows' values; tested apart from the "
                f"figures above, simultaneous 95 % intervals over their own m = {m}):"]  # fmt: skip
        out.append(table(["metric", "A", "B", "B/A", "interval", ""],
                         [_ratio_row(ch, None, "{:.4g}")[1:] for ch in c.custom]))  # fmt: skip
    if fail:
        out += ["", "[Diff] Regressions beyond --fail-on:"]
        out += [f"- {change_words(ch)}" for ch in fail]
    return "\n".join(out)


def caveats(c: Comparison) -> list[str]:
    """Windows whose sampling the sidecar itself flagged: kept, but said."""
    out = []
    for side in (c.a, c.b):
        for s in side.summaries:
            sampling = s.sampling
            if sampling.partial:
                out.append(f"{side.label[0]}: {s.name} is partial ({sampling.partial_reason})")
            elif sampling.behind_s >= LATE_S:
                out.append(f"{side.label[0]}: py-spy fell {sampling.behind_s:.1f} s behind in "
                           f"{s.name}")  # fmt: skip
    return out


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
            cells = _ratio_row(ch, ch.role or "", "{:.4g}" if ch.kind == "serving" else "{:.3f}")
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
    interval = f"{_pp(ch.low)} .. {_pp(ch.high)}" if ch.tested else (ch.note or "-")
    return [ch.role or "", ch.name, _pct(ch.a), _pct(ch.b), _pp(ch.change), interval,
            "significant" if ch.significant else ""]  # fmt: skip


def _ratio_row(ch: Change, role: str | None, fmt: str, scale: float = 1.0) -> list[str]:
    def f(v: float | None) -> str:
        return "-" if v is None else fmt.format(v * scale)

    interval = f"{ch.low:.2f} .. {ch.high:.2f}" if ch.tested else (ch.note or "-")
    change = "-" if ch.change is None else f"{ch.change:.2f}"
    return [role or "", ch.name, f(ch.a), f(ch.b), change, interval,
            "significant" if ch.significant else ""]  # fmt: skip


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _pp(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:+.1f} pp"


def _ratio_words(v: float | None) -> str:
    if v is None:
        return "changed"
    return f"{'up' if v > 1 else 'down'} {abs(v - 1) * 100:.0f} % (\u00d7{v:.2f})"


def to_json(
    c: Comparison, fail: tuple[Change, ...] = (), found: FindingChanges | None = None
) -> dict[str, Any]:
    def change(ch: Change) -> dict[str, Any]:
        return {"kind": ch.kind, "role": ch.role, "name": ch.name, "a": _clean(ch.a),
                "b": _clean(ch.b), "scale": ch.scale, "change": _clean(ch.change),
                "low": _clean(ch.low), "high": _clean(ch.high), "significant": ch.significant,
                "p_adjusted": _clean(ch.p_adjusted), "note": ch.note}  # fmt: skip

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
        "method": {"alpha": c.alpha, "tested": c.tested, "intervals": "simultaneous (Bonferroni), "
                   "Welch t over py-spy segments, ratio-estimator variances"},
        "shares": [change(ch) for ch in c.shares],
        "cores": [change(ch) for ch in c.cores],
        "costs": [change(ch) for ch in c.costs],
        "per_request": [change(ch) for ch in c.per_request],
        "serving": [change(ch) for ch in c.serving],
        "custom": [change(ch) for ch in c.custom],
        "significant": [change(ch) for ch in c.significant],
        "regressions": [change(ch) for ch in fail],
        "findings": changes_json(found) if found is not None else None,
    }  # fmt: skip


def _clean(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 6)


def gate(c: Comparison, fail_on: float | None) -> tuple[Change, ...]:
    return regressions(c, fail_on) if fail_on is not None else ()
