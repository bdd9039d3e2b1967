"""Findings: what the snapshot's figures say to change, with the evidence measured.

`findings(summary)` evaluates the advice rules (configs/advice.yaml, or the operator's own) over
one summary's figures and returns the rules that fire, each with its evidence lines filled in
with the numbers. Findings are computed from a summary when needed, never stored in
summary.json, so snapshots of any schema version get today's advice. `report`, `diff` and the
exporter read them from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache

from sidecar.advice.expr import evaluate as evaluate_expr
from sidecar.advice.expr import names
from sidecar.advice.figures import Figures, figures_of
from sidecar.advice.rules import AdviceRule, AdviceRules, Placeholder, Template, load_advice
from sidecar.records.summary import SnapshotSummary
from sidecar.sizes import format_bytes

SEVERITY_ORDER = ("critical", "warning", "info")


@dataclass(frozen=True, slots=True)
class Finding:
    id: str  # e.g. "kv-cache-exhausted"
    severity: str  # "info" | "warning" | "critical"
    title: str  # one line
    evidence: tuple[str, ...]  # lines with the measured numbers
    knob: str  # what to change, in words
    flags: tuple[str, ...]  # exact vLLM flags, e.g. ("--max-num-seqs",)
    why: str
    docs: str  # URL into docs.vllm.ai


@dataclass(frozen=True, slots=True)
class Unevaluated:
    """A rule whose condition could not be decided: the figures it lacked, and why."""

    id: str
    missing: Mapping[str, str]  # figure -> why it is missing


@dataclass(frozen=True, slots=True)
class Evaluation:
    findings: tuple[Finding, ...]
    unevaluated: tuple[Unevaluated, ...]
    rules: int  # how many rules were evaluated
    source: str


@cache
def default_rules() -> AdviceRules:
    return load_advice()


def findings(summary: SnapshotSummary, rules: AdviceRules | None = None) -> tuple[Finding, ...]:
    """The findings that fire on SUMMARY, most severe first (rules=None: configs/advice.yaml)."""
    return evaluate(summary, rules).findings


def evaluate(summary: SnapshotSummary, rules: AdviceRules | None = None) -> Evaluation:
    rules = rules or default_rules()
    figures = figures_of(summary)
    fired, unknown = [], []
    for rule in rules.rules:
        verdict = evaluate_expr(rule.when, figures.get)
        if verdict is True:
            fired.append(_finding(rule, figures, summary))
        elif verdict is None:
            lacking = [n for n in names(rule.when) if figures.get(n) is None]
            unknown.append(Unevaluated(rule.id, {n: figures.why_missing(n) for n in lacking}))
    fired.sort(key=lambda f: SEVERITY_ORDER.index(f.severity))
    return Evaluation(tuple(fired), tuple(unknown), len(rules.rules), rules.source)


def _finding(rule: AdviceRule, figures: Figures, summary: SnapshotSummary) -> Finding:
    lines = (_fill(t, figures, summary) for t in rule.evidence)
    return Finding(rule.id, rule.severity.value, rule.title, tuple(x for x in lines if x),
                   rule.knob, rule.flags, rule.why, rule.docs)  # fmt: skip


def _fill(template: Template, figures: Figures, summary: SnapshotSummary) -> str | None:
    """The line with its numbers; None (left out) when a figure in it is missing."""
    out = []
    for part in template.parts:
        if isinstance(part, str):
            out.append(part)
            continue
        text = _placeholder(part, figures, summary)
        if text is None:
            return None
        out.append(text)
    return "".join(out)


def _placeholder(p: Placeholder, figures: Figures, summary: SnapshotSummary) -> str | None:
    if p.kind == "flag":
        given = figures.flags.get(p.arg)
        return f"--{p.arg} {given}" if given is not None else f"--{p.arg} (vLLM's default)"
    if p.kind == "busiest":
        prefix, _, role = p.arg.partition(".")
        shares = (summary.main_thread if prefix == "main" else summary.by_role).get(role)
        if not shares:
            return None
        top = sorted(((v, k) for k, v in shares.items() if k != "idle" and v >= 0.005),
                     reverse=True)[:3]  # fmt: skip
        return ", ".join(f"{k} {100 * v:.0f}%" for v, k in top) or "nothing but idle"
    assert p.node is not None
    value = evaluate_expr(p.node, figures.get)
    if value is None or isinstance(value, bool):
        return None
    return fmt_number(float(value), p.fmt)


def fmt_number(value: float, fmt: str) -> str:
    if fmt == "pct":
        return f"{100 * value:.0f}%"
    if fmt == "pct1":
        return f"{100 * value:.1f}%"
    if fmt == "s":
        return f"{value:.2f} s" if abs(value) >= 1 else f"{1000 * value:.0f} ms"
    if fmt == "int":
        return f"{value:,.0f}"
    if fmt == "bytes":
        return format_bytes(value)
    if fmt == "cores":
        return f"{value:.2f} cores"
    if fmt == "x":
        return f"x{value:.1f}"
    return f"{value:.3g}"


# ---------------------------------------------------------------------------------- text


def render_findings(ev: Evaluation, *, gpu_host: bool) -> list[str]:
    """The `[Profile] Findings:` block: each finding with its evidence, knob, flags, why and
    docs; "no finding" when none fires; the rules that could not be decided, where useful."""
    lines = ["[Profile] Findings:"]
    if not ev.findings:
        lines.append(f"- no finding: none of the {ev.rules} rules fired on this window")
    for f in ev.findings:
        lines.append(f"- [{f.severity}] {f.title} ({f.id})")
        lines += [f"    evidence: {e}" for e in f.evidence]
        lines.append(f"    change: {f.knob}")
        if f.flags:
            lines.append(f"    flags: {' '.join(f.flags)}")
        lines.append(f"    why: {f.why}")
        lines.append(f"    docs: {f.docs}")
    useful = useful_unevaluated(ev, gpu_host=gpu_host)
    if useful:
        lines.append("- not evaluated (figures missing): " + "; ".join(
            f"{u.id} ({_why(u.missing)})" for u in useful))  # fmt: skip
    return lines


def useful_unevaluated(ev: Evaluation, *, gpu_host: bool) -> tuple[Unevaluated, ...]:
    """The undecided rules worth mentioning: not GPU rules on a host without GPU readings (they
    can never apply there), and not those that lack only what an idle window lacks."""
    out = []
    for u in ev.unevaluated:
        if not gpu_host and any(n.startswith("gpu.") for n in u.missing):
            continue
        out.append(u)
    return tuple(out)


def _why(missing: Mapping[str, str]) -> str:
    reasons: dict[str, list[str]] = {}
    for name, why in missing.items():
        reasons.setdefault(why, []).append(name)
    return "; ".join(f"{', '.join(ns)}: {why}" for why, ns in reasons.items())


def to_json(ev: Evaluation) -> dict[str, object]:
    return {
        "rules": ev.rules,
        "source": ev.source,
        "findings": [_finding_json(f) for f in ev.findings],
        "not_evaluated": [{"id": u.id, "missing": dict(u.missing)} for u in ev.unevaluated],
    }


def _finding_json(f: Finding) -> dict[str, object]:
    return {"id": f.id, "severity": f.severity, "title": f.title, "evidence": list(f.evidence),
            "knob": f.knob, "flags": list(f.flags), "why": f.why, "docs": f.docs}  # fmt: skip


# ---------------------------------------------------------------------------------- diff


@dataclass(frozen=True, slots=True)
class FindingChanges:
    """Findings of side B against side A: a finding counts on a side when it fired in any of
    its windows (`a_counts`/`b_counts`: in how many)."""

    new: tuple[Finding, ...]  # in B, not in A
    gone: tuple[Finding, ...]  # in A, not in B
    kept: tuple[Finding, ...]  # in both (B's evidence)
    a_counts: Mapping[str, int]
    b_counts: Mapping[str, int]
    a_windows: int
    b_windows: int


def finding_changes(
    a: Iterable[SnapshotSummary], b: Iterable[SnapshotSummary], rules: AdviceRules | None = None
) -> FindingChanges:
    a_latest, a_counts, a_n = _side(a, rules)
    b_latest, b_counts, b_n = _side(b, rules)
    return FindingChanges(
        new=tuple(f for i, f in b_latest.items() if i not in a_latest),
        gone=tuple(f for i, f in a_latest.items() if i not in b_latest),
        kept=tuple(f for i, f in b_latest.items() if i in a_latest),
        a_counts=a_counts, b_counts=b_counts, a_windows=a_n, b_windows=b_n,
    )  # fmt: skip


def _side(
    summaries: Iterable[SnapshotSummary], rules: AdviceRules | None
) -> tuple[dict[str, Finding], dict[str, int], int]:
    """The latest window's evidence of each finding that fired on the side, and its count."""
    latest: dict[str, Finding] = {}
    counts: dict[str, int] = {}
    n = 0
    for s in summaries:
        n += 1
        for f in findings(s, rules):
            latest[f.id] = f
            counts[f.id] = counts.get(f.id, 0) + 1
    return latest, counts, n


def render_changes(ch: FindingChanges) -> list[str]:
    lines = ["[Diff] Findings (configs/advice.yaml on each side's windows):"]

    def seen(fid: str, counts: Mapping[str, int], n: int) -> str:
        return f"{counts.get(fid, 0)} of {n} windows"

    for f in ch.new:
        lines.append(f"- new in B: [{f.severity}] {f.title} ({f.id}; "
                     f"{seen(f.id, ch.b_counts, ch.b_windows)})")  # fmt: skip
        lines += [f"    evidence: {e}" for e in f.evidence]
        lines.append(f"    change: {f.knob}")
    for f in ch.gone:
        lines.append(f"- gone in B: [{f.severity}] {f.title} ({f.id}; was in "
                     f"{seen(f.id, ch.a_counts, ch.a_windows)})")  # fmt: skip
    for f in ch.kept:
        lines.append(f"- in both: [{f.severity}] {f.title} ({f.id}; A "
                     f"{seen(f.id, ch.a_counts, ch.a_windows)}, B "
                     f"{seen(f.id, ch.b_counts, ch.b_windows)})")  # fmt: skip
    if not (ch.new or ch.gone or ch.kept):
        lines.append("- no finding on either side")
    return lines


def changes_json(ch: FindingChanges) -> dict[str, object]:
    return {
        "new": [_finding_json(f) for f in ch.new],
        "gone": [_finding_json(f) for f in ch.gone],
        "kept": [_finding_json(f) for f in ch.kept],
        "a_counts": dict(ch.a_counts), "b_counts": dict(ch.b_counts),
        "a_windows": ch.a_windows, "b_windows": ch.b_windows,
    }  # fmt: skip
