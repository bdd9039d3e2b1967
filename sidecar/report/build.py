"""The report's views (sidecar/report/views.py), built once from the typed summary.

Built from the summary alone, so a report can be made on another machine, long after, from a
snapshot of any schema version (`sidecar.store.summary_io`). A part that was not measured is a
`NotMeasured` with the reason instead of a zero, and any figure may be missing: a summary with
requests/s but no token rate still makes a report.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePath

from sidecar.advice.findings import Evaluation
from sidecar.analyze.computation import PER_REQUEST_QUESTION, SPLIT_HOW, STEP_QUESTION, step_split
from sidecar.gpu import GpuFigures, figures_of
from sidecar.records.readings import ServingFigures
from sidecar.records.summary import SnapshotSummary
from sidecar.report.threads import threads_view
from sidecar.report.views import (
    ComputationView,
    Device,
    FindingsView,
    GpuMemory,
    HeaderView,
    HostOnlyMemory,
    Latency,
    MemoryReading,
    MemoryView,
    ModelSteps,
    NotMeasured,
    OneGpuMemory,
    PerRequest,
    PhasesView,
    ProcessRow,
    ReportView,
    SoftwareView,
    StageEstimate,
    StagesView,
    ThroughputView,
)
from sidecar.store.layout import parse_name

PER_REQUEST_SOURCE = "vLLM request_prefill/decode_time_seconds, mean per request over the window"
STAGE_HOW = "model-step samples by the stage their stack shows"
NO_STEP_SPLIT = "no model-step samples, or no token counts to split them by"
# schema 1 said nothing of which GPUs were the target's: say so where it matters
ALL_GPUS = "all of this host's GPUs: which ones the target uses is unknown"


def report_view(s: SnapshotSummary, ev: Evaluation, source: str | None = None) -> ReportView:
    """The whole report of S, with EV, the advice rules' verdicts on it; SOURCE: the snapshot
    folder chosen, when the report was pointed at the folder holding it."""
    return ReportView(
        snapshot=s.name,
        schema=s.schema,
        header=header_view(s, source),
        memory=memory_view(s),
        computation=computation_view(s),
        throughput=throughput_view(s),
        findings=findings_view(ev),
        custom=s.custom,
        software=software_view(s),
        phases=PhasesView(by_role=s.by_role, main_thread=s.main_thread),
        stages=stages_view(s),
        processes=process_rows(s),
        threads=threads_view(s),
        caveats=tuple(caveats(s)),
    )


def header_view(s: SnapshotSummary, source: str | None = None) -> HeaderView:
    """Which snapshot, when, for how long, at what rate: what the report opens with."""
    sampling, cause = s.sampling, s.cause
    named = parse_name(PurePath(source).name) if source is not None else None
    return HeaderView(
        # a summary without a kind: one-shot, unless a store's folder name says (a copy)
        kind=s.kind or (named[0].value if named else "one-shot"),
        host=s.host,
        deployment=s.deployment,
        started=s.created_at,
        duration_s=sampling.duration_s,
        rate_hz=sampling.rate_hz,
        mode=sampling.mode or "windows",
        cause=None if cause is None else f"{cause.kind.value}: {cause.detail} (at {cause.at})",
        source=source,
    )


def caveats(s: SnapshotSummary) -> list[str]:
    """What limits how far this snapshot's stack shares can be trusted, in the sampler's words."""
    sampling = s.sampling
    out = [f"partial window: {sampling.partial_reason}"] if sampling.partial else []
    return out + list(sampling.warnings)


# ---------------------------------------------------------------------------------- memory


def memory_view(s: SnapshotSummary) -> MemoryView:
    reading = _memory_reading(s)
    on_gpu = s.gpu.available and not isinstance(reading, HostOnlyMemory)
    kv = s.kv_cache
    measured = kv if kv and kv.bytes else None
    return MemoryView(
        device=Device.GPU if on_gpu else Device.HOST,
        reading=reading,
        kv_cache=measured,
        kv_cache_missing=None if measured else kv.source if kv else _serving_reason(s.serving),
    )


def _memory_reading(s: SnapshotSummary) -> MemoryReading:
    gpu, host = s.gpu, s.resources.host_memory
    figures = _gpu_figures(s)
    devices = [d for d in gpu.devices if not d.mig]
    if figures is not None and figures.devices:
        return _target_gpus(figures, host_gpus=len(devices))
    if gpu.available and devices:  # schema 1, or no device could be told the target's
        used = _sum(d.memory_used_bytes for d in devices)
        total = _sum(d.memory_total_bytes for d in devices)
        return GpuMemory(used, total, len(devices), (ALL_GPUS,) if len(devices) > 1 else ())
    if host:
        used_host = host.total_bytes - host.available_bytes
        return HostOnlyMemory(used_host, host.total_bytes, gpu.reason or "no GPU readings")
    return NotMeasured("no memory readings in this snapshot")


def _target_gpus(figures: GpuFigures, host_gpus: int) -> GpuMemory | OneGpuMemory:
    used = _sum(d.memory_used_bytes for d in figures.devices)
    total = _sum(d.memory_total_bytes for d in figures.devices)
    count = len(figures.devices)
    if count == host_gpus == 1:  # the host's one GPU: its utilisation on the GPU line itself
        util = figures.devices[0].utilization
        notes = tuple(figures.target.caveats)
        return OneGpuMemory(used, total, count, util.text if util else None, notes)
    # a subset of the host's GPUs, or tensor parallelism: one line per GPU
    return GpuMemory(used, total, count, tuple(figures.lines()))


def _gpu_figures(s: SnapshotSummary) -> GpuFigures | None:
    if not s.gpu.available or s.gpu.target is None:
        return None
    return figures_of(s.gpu.devices, s.gpu.target, s.gpu.utilization)


# ----------------------------------------------------------------------------- computation


def computation_view(s: SnapshotSummary) -> ComputationView:
    """Two prefill/decode figures (sidecar/analyze/computation.py): vLLM's wall time per
    request, and the split of the worker's model-step samples; each says which question it
    answers."""
    return ComputationView(per_request=_per_request(s.serving), model_steps=_model_steps(s))


def _per_request(serving: ServingFigures) -> PerRequest | NotMeasured:
    prefill, decode = serving.prefill_time_mean_s, serving.decode_time_mean_s
    if prefill is None or decode is None:
        return NotMeasured(_serving_reason(serving))
    total = prefill + decode
    return PerRequest(
        source=PER_REQUEST_SOURCE,
        answers=PER_REQUEST_QUESTION,
        prefill_ms=prefill * 1000,
        decode_ms=decode * 1000,
        prefill_share=prefill / total if total else None,
        decode_share=decode / total if total else None,
        ttft_ms=_ms(serving.ttft_mean_s, serving.ttft_p50_s, serving.ttft_p95_s),
        itl_ms=_ms(serving.itl_mean_s, serving.itl_p50_s, serving.itl_p95_s),
    )


def _model_steps(s: SnapshotSummary) -> ModelSteps | NotMeasured:
    split = step_split(s)
    if split is None or split.prefill_share is None:
        return NotMeasured(NO_STEP_SPLIT)
    return ModelSteps(
        prefill_share=split.prefill_share,
        decode_share=split.decode_share,
        samples=split.samples,
        estimated=split.estimated,
        how=SPLIT_HOW if split.estimated else STAGE_HOW,
        answers=STEP_QUESTION,
    )


# ------------------------------------------------------------------------ the other sections


def throughput_view(s: SnapshotSummary) -> ThroughputView | NotMeasured:
    v = s.serving
    if v.requests_per_s is None:
        return NotMeasured(_serving_reason(v))
    return ThroughputView(
        requests_per_s=v.requests_per_s,
        prompt_tokens_per_s=v.prompt_tokens_per_s,
        generation_tokens_per_s=v.generation_tokens_per_s,
        requests_running=v.requests_running,
        requests_waiting=v.requests_waiting,
        preemptions=v.preemptions,
        kv_cache_usage=v.kv_cache_usage,
    )


def findings_view(ev: Evaluation) -> FindingsView:
    return FindingsView(
        rules=ev.rules, source=ev.source, findings=ev.findings, not_evaluated=ev.unevaluated
    )


def software_view(s: SnapshotSummary) -> SoftwareView:
    if s.fingerprint is None:
        return SoftwareView(s.deployment, NotMeasured("not recorded (written before schema 3)"))
    return SoftwareView(s.deployment, s.fingerprint)


def stages_view(s: SnapshotSummary) -> StagesView:
    """Stack samples per stage; unknown-stage model time apportioned by token counts, flagged."""
    split = step_split(s)
    if split is None or not split.estimated:
        return StagesView(samples=dict(s.stages))
    return StagesView(dict(s.stages), StageEstimate(split.prefill, split.decode, SPLIT_HOW))


def process_rows(s: SnapshotSummary) -> tuple[ProcessRow, ...]:
    """The target's processes: RSS, CPU and threads from /proc, memory on the GPUs from NVML."""
    stats = {p.pid: p for p in s.resources.processes}
    gpu_mem: dict[int, int] = {}
    for d in s.gpu.devices:
        for p in d.processes:
            if p.target_pid is not None and p.used_memory_bytes:
                gpu_mem[p.target_pid] = gpu_mem.get(p.target_pid, 0) + p.used_memory_bytes
    rows = []
    for proc in s.target.processes:
        st = stats.get(proc.pid)
        rows.append(
            ProcessRow(
                pid=proc.pid,
                role=proc.role,
                rss_bytes=st.rss_bytes if st else None,
                cpu_share=st.cpu_share if st else None,
                threads=st.threads if st else None,
                gpu_memory_bytes=gpu_mem.get(proc.pid),
            )
        )
    return tuple(rows)


def _serving_reason(serving: ServingFigures) -> str:
    if serving.reason:
        return serving.reason
    if not serving.requests_finished:
        return "no request finished during the window (was the server idle?)"
    return "vLLM /metrics not read"


def _ms(mean: float | None, p50: float | None, p95: float | None) -> Latency:
    def ms(v: float | None) -> float | None:
        return v * 1000 if v is not None else None

    return Latency(mean=ms(mean), p50=ms(p50), p95=ms(p95))


def _sum(values: Iterable[int | None]) -> int | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None
