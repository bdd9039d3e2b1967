"""`vllm-sidecar report SNAPSHOT`: the operator's view of one snapshot, as text and as JSON.

The text opens with a header (`header_lines`: which snapshot, when, how long, how sampled, and
its caveats) before the `[Profile]` blocks.

Both come from one `ReportView`, built once from the typed summary (sidecar/report/build.py):
`--format json` prints its `to_jsonable`, and the text reads its attributes. A part that was not
measured says so ("not measured: ...") instead of printing a zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from sidecar.advice.findings import Evaluation, evaluate, render_findings
from sidecar.advice.rules import AdviceRules
from sidecar.analyze.computation import PER_REQUEST_QUESTION, STEP_QUESTION
from sidecar.records import Phase
from sidecar.records.readings import CustomMetric, KvCache
from sidecar.records.summary import SnapshotSummary
from sidecar.report.build import (
    caveats,
    computation_view,
    memory_view,
    report_view,
    software_view,
    throughput_view,
)
from sidecar.report.threads import main_cpu_line, render_threads, unseen_lines
from sidecar.report.views import (
    ComputationView,
    Device,
    HeaderView,
    MemoryView,
    ModelSteps,
    NotMeasured,
    OneGpuMemory,
    PerRequest,
    ProcessRow,
    ReportView,
    SoftwareView,
    StagesView,
    ThreadsView,
    ThroughputView,
    to_jsonable,
)
from sidecar.sizes import format_pair, format_share
from sidecar.tables import ROLE_COLUMNS, phase_table, table
from sidecar.target.kvcache import kv_cache_text

__all__ = ["caveats", "custom_value", "header_lines", "profile_block", "render", "render_report",
           "report_data"]  # fmt: skip


def report_data(
    s: SnapshotSummary, advice: AdviceRules | None = None, source: str | None = None
) -> dict[str, Any]:
    """The report as JSON-ready data: what `--format json` prints, `to_jsonable` of the view
    the text is rendered from. `advice`: the rules the findings come from (None: the packaged
    configs/advice.yaml); `source`: the snapshot folder chosen from an output folder."""
    data: dict[str, Any] = to_jsonable(report_view(s, evaluate(s, advice), source))
    return data


def profile_block(s: SnapshotSummary) -> str:
    """The `[Profile]` sections (memory, computation time, throughput, software): the text
    report's head without its findings, which the HTML page shows in a section of their own."""
    head = _profile_head(memory_view(s), computation_view(s), throughput_view(s), s.custom)
    return "\n".join([*head, _render_software(software_view(s))])


def render_report(
    s: SnapshotSummary, advice: AdviceRules | None = None, source: str | None = None
) -> str:
    """What `vllm-sidecar report` prints: the header (which snapshot, when, how long, how
    sampled) and the caveats first, then `render`'s `[Profile]` blocks and breakdowns.
    `source`: the snapshot folder chosen, when the command was pointed at the folder holding
    it."""
    ev = evaluate(s, advice)
    v = report_view(s, ev, source)
    return "\n".join([*header_lines(v.header, s.name, v.caveats), "", *_body(s, ev, v)])


def render(s: SnapshotSummary, advice: AdviceRules | None = None) -> str:
    """The report without its header: the `[Profile]` blocks, the breakdowns, and the caveats
    last (the header's place for them in `render_report`)."""
    ev = evaluate(s, advice)
    v = report_view(s, ev)
    notes = ["", "Caveats:", *(f"- {c}" for c in v.caveats)] if v.caveats else []
    return "\n".join(_body(s, ev, v) + notes)


def _body(s: SnapshotSummary, ev: Evaluation, v: ReportView) -> list[str]:
    findings = render_findings(ev, gpu_host=s.gpu.available)
    parts = [*_profile_head(v.memory, v.computation, v.throughput, v.custom),
             "\n".join(findings), _render_software(v.software), "",
             "Memory breakdown:", _render_processes(v.processes, v.memory.kv_cache), "",
             "Computation breakdown (share of each role's samples):", phase_table(s)]  # fmt: skip
    return parts + _tail(s, v)


def _profile_head(
    memory: MemoryView,
    computation: ComputationView,
    throughput: ThroughputView | NotMeasured,
    custom: tuple[CustomMetric, ...],
) -> list[str]:
    return [_render_memory(memory), _render_computation(computation),
            _render_throughput(throughput), *_render_custom(custom)]  # fmt: skip


def _tail(s: SnapshotSummary, v: ReportView) -> list[str]:
    """Under the role table: the main threads, the threads against /proc and the stages."""
    parts: list[str] = []
    if v.phases.main_thread:
        parts += ["", "Main threads only:", _main_table(v.phases.main_thread),
                  *main_cpu_line(s), *unseen_lines(s)]  # fmt: skip
    if isinstance(v.threads, ThreadsView):
        parts += ["", render_threads(v.threads)]
    parts += ["", _render_stages(v.stages)]
    return parts


def header_lines(h: HeaderView, name: str, notes: Iterable[str] = ()) -> list[str]:
    """`[Snapshot] NAME: KIND of DEPLOYMENT on host HOST`, the window's start (UTC), length and
    sampling, the folder chosen and why the snapshot was taken, then the caveats (NOTES)."""
    of = f" of {h.deployment}" if h.deployment else ""
    kind = "one-shot snapshot (vllm-sidecar snapshot)" if h.kind == "one-shot" else h.kind
    lines = [f"[Snapshot] {name}: {kind}{of} on host {h.host}",
             f"- Window: {_utc(h.started)}, {h.duration_s:.1f} s, sampled at "
             f"{h.rate_hz:g} Hz ({h.mode} mode)"]  # fmt: skip
    if h.source is not None:
        lines.append(f"- Chosen: {h.source} (the latest snapshot in the folder given)")
    if h.cause is not None:
        lines.append(f"- Taken out of schedule: {h.cause}")
    notes = list(notes)
    if notes:
        lines += ["Caveats:", *(f"- {c}" for c in notes)]
    return lines


def _utc(started: str) -> str:
    """`2026-12-01 14:44:54 UTC` from summary.json's ISO time (as written where unreadable)."""
    try:
        when = datetime.fromisoformat(started)
        if when.tzinfo is None:
            return f"{when:%Y-%m-%d %H:%M:%S} (time zone not recorded)"
        return f"{when.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    except (ValueError, OverflowError):  # not an ISO time, or out of datetime's range in UTC
        return started


def _render_memory(m: MemoryView) -> str:
    lines = ["[Profile] Memory Usage:"]
    r = m.reading
    if isinstance(r, NotMeasured):
        lines.append(f"- Memory: not measured ({r.missing})")
    else:
        what = "GPU" if m.device is Device.GPU else "Host (CPU host, no GPU memory)"
        used, total = r.used_bytes, r.total_bytes
        util = f"; {r.util}" if isinstance(r, OneGpuMemory) and r.util else ""
        lines.append(f"- {what}: {format_pair(used, total)} ({format_share(used, total)}){util}")
    lines += [f"  - {line}" for line in m.gpu_lines]
    if m.kv_cache is not None:
        lines.append(f"- {kv_cache_text(m.kv_cache)}")
    else:
        lines.append(f"- KV Cache: not measured ({m.kv_cache_missing})")
    return "\n".join(lines)


def _render_computation(c: ComputationView) -> str:
    """The familiar two lines (vLLM's time per request), with the model steps' split beside
    them, and one line naming what each measures and which question it answers."""
    steps = c.model_steps if isinstance(c.model_steps, ModelSteps) else None
    est = " (estimate)" if steps is not None and steps.estimated else ""
    per = c.per_request
    if isinstance(per, PerRequest):
        lines = _per_request_lines(per, steps, est)
        lines.append(
            f"  per request (left): vLLM's request_prefill/decode_time, {PER_REQUEST_QUESTION}"
        )
    else:
        lines = [f"- Prefill/Decoding: not measured ({per.missing})"]
        if steps is not None:
            lines.append(f"- Model steps: prefill {_pct_share(steps.prefill_share)}, decode "
                         f"{_pct_share(steps.decode_share)}{est}")  # fmt: skip
    if steps is not None:
        how = "; an estimate: V1 batches mix both, split by prompt vs generated tokens"
        how = how if est else ""
        lines.append(f"  model steps (right): the worker's stack samples, {STEP_QUESTION}{how}")
    return "\n".join(["[Profile] Computation Time:", *lines])


def _per_request_lines(per: PerRequest, steps: ModelSteps | None, est: str) -> list[str]:
    """`- Prefill: 120ms (40%)` and `- Decoding: ...`, with the model steps' shares beside."""
    side = ("", "") if steps is None else (
        f" | model steps {_pct_share(steps.prefill_share)}{est}",
        f" | model steps {_pct_share(steps.decode_share)}{est}")  # fmt: skip
    prefill = f"- Prefill: {per.prefill_ms:.0f}ms ({_pct_share(per.prefill_share)})"
    decode = f"- Decoding: {per.decode_ms:.0f}ms ({_pct_share(per.decode_share)})"
    width = max(len(prefill), len(decode))
    return [prefill.ljust(width) + side[0], decode.ljust(width) + side[1]]


def _render_throughput(t: ThroughputView | NotMeasured) -> str:
    if isinstance(t, NotMeasured):
        return f"[Profile] Throughput:\n- not measured ({t.missing})"
    prompt = t.prompt_tokens_per_s
    return (f"[Profile] Throughput:\n- Requests: {t.requests_per_s:.1f} req/s\n"
            f"- Tokens: {_rate(t.generation_tokens_per_s)} tokens/s"
            f"{f' (prompt: {prompt:.0f} tokens/s)' if prompt is not None else ''}")  # fmt: skip


def _render_custom(metrics: tuple[CustomMetric, ...]) -> list[str]:
    """`[Profile] Custom metrics:` the config's custom_metrics (no block when none is set)."""
    if not metrics:
        return []
    lines = ["[Profile] Custom metrics:"]
    for m in metrics:
        where = f"{m.metric}{_labels(m.labels)} at {m.source or 'vLLM /metrics'}"
        if m.value is None:
            lines.append(f"- {m.name}: not measured ({m.reason or 'no value'}; {where})")
            continue
        how = f"; {m.how}" if m.how else ""
        lines.append(f"- {m.name}: {custom_value(m)} ({m.kind}; {where}{how})")
    return ["\n".join(lines)]


def custom_value(m: CustomMetric) -> str:
    """`12.5 /s`, `0.031 s`, `n/a`: a custom metric's value with its unit."""
    if m.value is None:
        return "n/a"
    unit = f" {m.unit}" if m.unit else ""
    return f"{m.value:.4g}{unit}"


def _labels(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""


def _render_software(f: SoftwareView) -> str:
    """`[Profile] Software:` vLLM, torch, Python and backend; GPUs, driver and CUDA; the CPU;
    the model and the flags given (absent ones are vLLM's defaults); sidecar and rules."""
    fp = f.recorded
    if isinstance(fp, NotMeasured):
        return f"[Profile] Software:\n- {fp.missing}"
    backend = fp.attention_backend or "not seen in the stacks"
    lines = [f"- vLLM {_na(fp.vllm)}, torch {_na(fp.torch)}, Python {_na(fp.python)}; "
             f"attention backend {backend}"]  # fmt: skip
    if fp.nvidia_driver or fp.gpus:
        gpus = ", ".join(f"{n}x {name}" for name, n in _counted(fp.gpus)) or "n/a"
        lines.append(f"- GPUs: {gpus}; NVIDIA driver {_na(fp.nvidia_driver)}, "
                     f"CUDA {_na(fp.cuda)}")  # fmt: skip
    else:
        lines.append(f"- GPUs: no NVML ({fp.notes.get('nvidia_driver', 'no driver version')})")
    cores = f"{fp.cpu_cores} logical CPUs" if fp.cpu_cores else "n/a CPUs"
    lines.append(f"- CPU: {_na(fp.cpu_model)}, {cores}")
    where = f" (deployment {f.deployment})" if f.deployment else ""
    lines.append(f"- Model: {_na(fp.model)}{where}")
    flags = " ".join(f"--{k}" if v == "true" else f"--no-{k}" if v == "false" else f"--{k} {v}"
                     for k, v in fp.serving.items())  # fmt: skip
    given = f"{flags} (others at" if flags else "none given (all at"
    lines.append(f"- Flags: {given} vLLM's defaults)")
    lines.append(f"- vllm-sidecar {_na(fp.sidecar)}, rules {_na(fp.rules)}")
    return "\n".join(["[Profile] Software:", *lines])


def _counted(names: Iterable[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return list(counts.items())


def _na(value: object) -> str:
    return "n/a" if value is None else str(value)


def _render_processes(rows: tuple[ProcessRow, ...], kv: KvCache | None) -> str:
    """One row per process, then the KV cache's (KV: the measured one, else None)."""
    body = [[r.pid, r.role.value, _gb_or(r.rss_bytes), _gb_or(r.gpu_memory_bytes),
             f"{100 * r.cpu_share:.0f}%" if r.cpu_share is not None else "n/a",
             r.threads if r.threads is not None else "n/a"] for r in rows]  # fmt: skip
    if kv is not None:  # on a CPU host the KV cache lives inside the worker's RSS
        on_gpu = kv.share_of == "gpu"
        size = _gb_or(kv.bytes)
        usage = f"usage {100 * kv.usage:.1f}%" if kv.usage is not None else "usage n/a"
        body.append(["-", "kv_cache", "-" if on_gpu else f"({size})", size if on_gpu else "-",
                     "-", usage])  # fmt: skip
    return table(["pid", "role", "rss GiB", "gpu GiB", "cpu", "threads"], body)


def _main_table(main: Mapping[str, Mapping[str, float]]) -> str:
    known = [ph.value for ph in Phase]
    phases = sorted({p for shares in main.values() for p in shares},
                    key=lambda p: known.index(p) if p in known else len(known))  # fmt: skip
    roles = [r for r in ROLE_COLUMNS if r in main]
    rows = [[p, *(f"{100 * main[r].get(p, 0):.1f}%" if main[r].get(p) else "-" for r in roles)]
            for p in phases]  # fmt: skip
    return table(["phase", *roles], rows)


def _render_stages(st: StagesView) -> str:
    counts = ", ".join(f"{k} {st.samples.get(k, 0)}" for k in ("prefill", "decode", "unknown"))
    line = f"Stages (model-step samples): {counts}"
    est = st.estimate
    if est is not None:
        total = est.prefill + est.decode
        line += (f"\nEstimated split: prefill {100 * est.prefill / total:.0f}%, decode "
                 f"{100 * est.decode / total:.0f}% ({est.how})")  # fmt: skip
    return line


def _gb_or(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f}"


def _pct_share(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"
