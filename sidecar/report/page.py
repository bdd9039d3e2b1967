"""`vllm-sidecar report --format html`: one self-contained page for one snapshot.

Pure: the inputs (the typed summary, the findings, the flame graph's SVG, the trend's PNG and
the diff against the latest baseline, each or why it could not be made) are gathered by
sidecar/report/page_inputs.py; this module only writes HTML. Nothing is fetched when the page is
opened: the style and the little script are inline, the flame graph is our own SVG inline, the
trend plot a data: URI, so it works offline and as a mail attachment.

Every string that comes from a snapshot (process titles and command lines, model names, flags,
frame names such as `<module>`, notes) is escaped, in text and in attributes: a process title
is whatever the process chose to call itself.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sidecar.flame.svg import PHASE_COLOURS, UNKNOWN_PHASE_COLOUR, inline
from sidecar.records import Phase
from sidecar.records.summary import SnapshotSummary
from sidecar.report.build import caveats, memory_view, process_rows
from sidecar.report.page_assets import ERROR_SCRIPT, ERRORS_ATTR, STYLE
from sidecar.report.text import profile_block
from sidecar.report.threads import main_cpu_line, unseen_lines
from sidecar.report.views import (
    Device,
    GpuMemory,
    MemoryView,
    NotMeasured,
    OneGpuMemory,
    ProcessRow,
)
from sidecar.sizes import format_bytes, format_pair, format_share
from sidecar.tables import ROLE_COLUMNS, share_text
from sidecar.target.kvcache import kv_cache_text

SEVERITIES = ("critical", "warning", "info")
NOT_MEASURED = "not measured"


@dataclass(frozen=True, slots=True)
class Missing:
    """A part of the page that could not be made: the section says why instead."""

    why: str


class FindingLike(Protocol):
    """What the page reads of `sidecar.advice.findings.Finding` (built on another branch: the page
    renders anything of this shape)."""

    @property
    def id(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def evidence(self) -> tuple[str, ...]: ...
    @property
    def knob(self) -> str: ...
    @property
    def flags(self) -> tuple[str, ...]: ...
    @property
    def why(self) -> str: ...
    @property
    def docs(self) -> str: ...


@dataclass(frozen=True, slots=True)
class DiffView:
    """The diff against the latest baseline, as `vllm-sidecar diff --baseline` words it."""

    a: str  # the sides' labels
    b: str
    verdict: tuple[str, ...]
    headers: tuple[str, ...]
    significant: tuple[tuple[str, ...], ...]  # the significant changes' cells, largest first
    caveats: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PageInputs:
    summary: SnapshotSummary
    source: str  # the folder the page was made from
    findings: tuple[FindingLike, ...] | Missing
    flame_svg: str | Missing
    trend_png: bytes | Missing | None = None  # None: not asked for (a snapshot folder given)
    diff: DiffView | Missing | None = None
    generator: str = "vllm-sidecar"


def render_page(p: PageInputs) -> str:
    s = p.summary
    sections = [
        _profile(s),
        _findings(p.findings),
        _phases(s),
        _memory(s),
        _flame(p.flame_svg),
    ]
    if p.trend_png is not None:
        sections.append(_trend(p.trend_png))
    if p.diff is not None:
        sections.append(_diff(p.diff))
    nav = "".join(
        f'<a href="#{sid}">{_e(label)}</a>'
        for sid, label in _NAV
        if (sid != "trend" or p.trend_png is not None) and (sid != "diff" or p.diff is not None)
    )
    title = f"vllm-sidecar report: {s.name}"
    return f"""<!DOCTYPE html>
<html lang="en" {ERRORS_ATTR}="0">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="{_e(p.generator)}">
<title>{_e(title)}</title>
<script>{ERROR_SCRIPT}</script>
<style>{STYLE}</style>
</head>
<body>
<header>
<h1>{_e(title)}</h1>
<p class="meta">{_meta(s)}</p>
<nav>{nav}</nav>
</header>
<main>
{_caveats(s)}
{"".join(sections)}
</main>
<footer>Written by {_e(p.generator)} from {_e(p.source)}. One self-contained file: nothing is
fetched when it opens.</footer>
</body>
</html>
"""


_NAV = (("profile", "Profile"), ("findings", "Findings"), ("phases", "Phases"),
        ("memory", "Memory"), ("flame", "Flame graph"), ("trend", "Trend"),
        ("diff", "Diff vs baseline"))  # fmt: skip


# ----------------------------------------------------------------------------------- sections


def _meta(s: SnapshotSummary) -> str:
    sampling = s.sampling
    parts = [f"host {_e(s.host)}", f"created {_e(s.created_at)}"]
    if s.kind:
        parts.append(_e(s.kind))
    if s.deployment:
        parts.append(f"deployment {_e(s.deployment)}")
    parts.append(f"{sampling.samples:,} samples in {sampling.duration_s:.1f} s at "
                 f"{sampling.rate_hz:g} Hz, {sampling.errors:,} py-spy errors")  # fmt: skip
    parts.append(f"schema {s.schema}")
    return " · ".join(parts)


def _caveats(s: SnapshotSummary) -> str:
    found = caveats(s)
    if not found:
        return ""
    items = "".join(f"<li>{_e(c)}</li>" for c in found)
    return f'<aside class="caveats" id="caveats"><h2>Caveats</h2><ul>{items}</ul></aside>'


def _profile(s: SnapshotSummary) -> str:
    serving = s.serving
    kv = s.kv_cache
    cards = [
        ("requests_per_s", "Requests", _num(serving.requests_per_s, "{:.1f} req/s")),
        ("generation_tokens_per_s", "Generated tokens",
         _num(serving.generation_tokens_per_s, "{:.0f} tokens/s")),
        ("prompt_tokens_per_s", "Prompt tokens",
         _num(serving.prompt_tokens_per_s, "{:.0f} tokens/s")),
        ("ttft_p95", "Time to first token, p95", _num(serving.ttft_p95_s, "{:.0f} ms", 1000)),
        ("itl_p95", "Inter-token latency, p95", _num(serving.itl_p95_s, "{:.1f} ms", 1000)),
        ("kv_usage", "KV cache usage", _num(kv.usage if kv else None, "{:.1f}%", 100)),
    ]  # fmt: skip
    body = "".join(
        f'<div class="card" data-figure="{key}"><div class="label">{_e(label)}</div>'
        f'<div class="value{" missing" if value == NOT_MEASURED else ""}">{_e(value)}</div></div>'
        for key, label, value in cards
    )
    return _section(
        "profile",
        "Profile",
        f'<div class="cards">{body}</div>'
        f'<pre class="profile" id="profile-text">{_e(profile_block(s))}</pre>',
    )


def _findings(found: tuple[FindingLike, ...] | Missing) -> str:
    if isinstance(found, Missing):
        body = f'<p class="missing" id="findings-missing">{_e(found.why)}</p>'
    elif not found:
        body = '<p class="ok" id="no-finding">No finding: none of the advice rules fired on ' \
               "this snapshot.</p>"  # fmt: skip
    else:
        ranked = sorted(found, key=lambda f: _rank(f.severity))
        body = "".join(_finding(f) for f in ranked)
    return _section("findings", "Findings", body)


def _finding(f: FindingLike) -> str:
    severity = f.severity if f.severity in SEVERITIES else "info"
    evidence = "".join(f"<li>{_e(line)}</li>" for line in f.evidence)
    flags = " ".join(f"<code>{_e(flag)}</code>" for flag in f.flags)
    docs = (
        f'<a href="{_e(f.docs)}" rel="noreferrer">{_e(f.docs)}</a>'
        if f.docs.startswith(("https://", "http://"))  # a link, never javascript: or data:
        else _e(f.docs)
    )
    return (
        f'<article class="finding {severity}" data-finding="{_e(f.id)}">'
        f'<h3><span class="severity">{_e(f.severity)}</span> {_e(f.title)}</h3>'
        f'<ul class="evidence">{evidence}</ul>'
        f"<p><b>What to change:</b> {_e(f.knob)}{' (' + flags + ')' if flags else ''}</p>"
        f"<p><b>Why:</b> {_e(f.why)}</p>"
        f'<p class="docs">vLLM docs: {docs}</p></article>'
    )


def _phases(s: SnapshotSummary) -> str:
    body = (
        "<p>Each role's stack samples by phase (every thread of the role); the main threads "
        "below hold the engine loop, the model step and the API server's event loop.</p>"
        + _role_bars("by-role", s.by_role, s.role_samples)
    )
    if s.main_thread:
        body += "<h3>Main threads only</h3>" + _role_bars("main-thread", s.main_thread, None)
        # Beside the samples, the CPU the kernel counted (schema 5): an event loop's `idle`.
        body += "".join(f'<p class="proc-cpu">{_e(line)}</p>'
                        for line in [*main_cpu_line(s), *unseen_lines(s)])  # fmt: skip
    if not s.by_role:
        body = '<p class="missing">No stack samples in this snapshot.</p>'
    return _section("phases", "Phase shares per role", body)


def _role_bars(
    kind: str, shares: Mapping[str, Mapping[str, float]], samples: Mapping[str, int] | None
) -> str:
    roles = [r for r in ROLE_COLUMNS if r in shares] + sorted(
        r for r in shares if r not in ROLE_COLUMNS
    )
    blocks = []
    for role in roles:
        phases = sorted(
            ((p, v) for p, v in shares[role].items() if v), key=lambda pv: _phase_rank(pv[0])
        )
        stack = "".join(
            f'<span style="width:{100 * v:.3f}%;background:{_colour(p)}" '
            f'title="{_e(p)} {share_text(v)}"></span>'
            for p, v in phases
        )
        rows = "".join(
            f'<tr data-phase="{_e(p)}"><td class="phase"><i style="background:{_colour(p)}">'
            f"</i>{_e(p)}</td>"
            f'<td class="barcell"><span class="bar" style="width:{100 * v:.3f}%;'
            f'background:{_colour(p)}"></span></td><td class="num">{share_text(v)}</td></tr>'
            for p, v in phases
        )
        count = f" <small>{samples.get(role, 0):,} samples</small>" if samples else ""
        blocks.append(
            f'<div class="role" data-role="{_e(role)}"><h4>{_e(role)}{count}</h4>'
            f'<div class="stack">{stack}</div><table class="bars">{rows}</table></div>'
        )
    return f'<div class="roles {kind}">{"".join(blocks)}</div>'


def _memory(s: SnapshotSummary) -> str:
    m = memory_view(s)
    rows = [_gpu_row(s, m), _kv_row(m), _host_row(s)]
    body = '<table class="memory">' + "".join(rows) + "</table>"
    body += "<h3>Per process</h3>" + _processes(s, process_rows(s))
    return _section("memory", "Memory breakdown", body)


def _gpu_row(s: SnapshotSummary, m: MemoryView) -> str:
    r = m.reading
    gpus = r if isinstance(r, GpuMemory | OneGpuMemory) else None
    if m.device is not Device.GPU or gpus is None or gpus.used_bytes is None:
        missing = r.missing if isinstance(r, NotMeasured) else None
        why = s.gpu.reason or missing or "no GPU readings"
        return _memory_row("gpu", "GPU memory", None, f"{NOT_MEASURED} ({why})")
    used, total = gpus.used_bytes, gpus.total_bytes
    text = f"{format_pair(used, total)} ({format_share(used, total)})"
    if isinstance(gpus, OneGpuMemory) and gpus.util:
        text += f"; {gpus.util}"
    extra = "".join(f'<div class="sub">{_e(line)}</div>' for line in m.gpu_lines)
    return _memory_row("gpu", "GPU memory", used / total if total else None, text, extra)


def _kv_row(m: MemoryView) -> str:
    kv = m.kv_cache
    if kv is None:
        return _memory_row("kv", "KV cache", None,
                           f"{NOT_MEASURED} ({m.kv_cache_missing})")  # fmt: skip
    text = kv_cache_text(kv).removeprefix("KV Cache: ")
    usage = f"vLLM's usage at the window's end: {_pct(kv.usage)}" if kv.usage is not None else (
        f"vLLM's usage: {NOT_MEASURED}")  # fmt: skip
    extra = f'<div class="sub">{_e(usage)}</div>'
    extra += "".join(f'<div class="sub">{_e(c)}</div>' for c in kv.caveats)
    return _memory_row("kv", "KV cache", kv.share, text, extra)


def _host_row(s: SnapshotSummary) -> str:
    host = s.resources.host_memory
    if host is None:
        return _memory_row("host", "Host memory", None, f"{NOT_MEASURED} (no host reading)")
    used = host.total_bytes - host.available_bytes
    text = f"{format_pair(used, host.total_bytes)} ({format_share(used, host.total_bytes)})"
    return _memory_row("host", "Host memory", used / host.total_bytes if host.total_bytes else None,
                       text)  # fmt: skip


def _memory_row(key: str, label: str, share: float | None, text: str, extra: str = "") -> str:
    bar = (
        f'<span class="track"><span class="bar" '
        f'style="width:{100 * min(max(share, 0.0), 1.0):.2f}%"></span></span>'
        if share is not None
        else ""
    )
    missing = " missing" if text.startswith(NOT_MEASURED) else ""
    return (
        f'<tr data-memory="{key}"><th>{_e(label)}</th><td class="barcell">{bar}</td>'
        f'<td class="figure{missing}">{_e(text)}{extra}</td></tr>'
    )


def _processes(s: SnapshotSummary, rows: Sequence[ProcessRow]) -> str:
    if not rows:
        return f'<p class="missing">{NOT_MEASURED}: no processes recorded</p>'
    titles = {p.pid: p.title for p in s.target.processes}
    body = "".join(
        f'<tr data-pid="{r.pid}"><td class="num">{r.pid}</td><td>{_e(r.role.value)}</td>'
        f'<td class="title">{_e(titles.get(r.pid, ""))}</td>'
        f'<td class="num">{_e(format_bytes(r.rss_bytes, missing=NOT_MEASURED))}</td>'
        f'<td class="num">{_e(format_bytes(r.gpu_memory_bytes, missing=NOT_MEASURED))}</td>'
        f'<td class="num">{_e(_num(r.cpu_share, "{:.0f}%", 100))}</td>'
        f'<td class="num">{_e(_num(r.threads, "{:.0f}"))}</td></tr>'
        for r in rows
    )
    head = "".join(
        f"<th>{h}</th>" for h in ("pid", "role", "title", "RSS", "GPU memory", "CPU", "threads")
    )
    return f'<table class="processes"><tr>{head}</tr>{body}</table>'


def _flame(svg: str | Missing) -> str:
    if isinstance(svg, Missing):
        body = f'<p class="missing">{_e(svg.why)}</p>'
    else:
        body = (
            "<p>Click a frame to zoom into it, hover for its samples; colours are phases.</p>"
            f'<div class="flame">{inline(svg)}</div>'
        )
    return _section("flame", "Flame graph", body)


def _trend(png: bytes | Missing) -> str:
    if isinstance(png, Missing):
        body = f'<p class="missing">{_e(png.why)}</p>'
    else:
        data = base64.b64encode(png).decode("ascii")
        body = (
            f'<img class="trend" alt="trend of phase shares and serving figures" '
            f'src="data:image/png;base64,{data}">'
        )
    return _section("trend", "Trend", body)


def _diff(d: DiffView | Missing) -> str:
    if isinstance(d, Missing):
        return _section("diff", "Diff against the latest baseline",
                        f'<p class="missing">{_e(d.why)}</p>')  # fmt: skip
    verdict = "".join(f"<p>{_e(line)}</p>" for line in d.verdict)
    sides = f'<p class="sides">{_e(d.a)}<br>{_e(d.b)}</p>'
    notes = "".join(f'<p class="caveat">Caveat: {_e(c)}</p>' for c in d.caveats)
    if d.significant:
        head = "".join(f"<th>{_e(h)}</th>" for h in d.headers)
        rows = "".join(
            "<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in d.significant
        )
        table = f'<table class="changes"><tr>{head}</tr>{rows}</table>'
    else:
        table = '<p class="ok">No significant change.</p>'
    body = f'<div class="verdict" id="diff-verdict">{verdict}</div>{sides}{notes}{table}'
    return _section("diff", "Diff against the latest baseline", body)


# ------------------------------------------------------------------------------------ helpers


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{_e(title)}</h2>{body}</section>\n'


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return NOT_MEASURED if value is None else fmt.format(value * scale)


def _pct(share: float | None) -> str:
    return NOT_MEASURED if share is None else f"{100 * share:.1f}%"


def _rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


_KNOWN = [p.value for p in Phase]


def _phase_rank(phase: str) -> int:
    return _KNOWN.index(phase) if phase in _KNOWN else len(_KNOWN)


def _colour(phase: str) -> str:
    return PHASE_COLOURS.get(phase, UNKNOWN_PHASE_COLOUR)
