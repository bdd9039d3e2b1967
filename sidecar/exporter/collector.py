"""The Prometheus collector: each scrape builds its metric families from one `ExporterView`.

Unknown values are omitted, never exported as NaN: a NaN gauge looks like data to PromQL and
poisons `avg()`/`sum()`, while an absent series is what `absent()` and alerts expect.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sidecar.exporter.state import ExporterGroup, ExporterState, ExporterView, SnapshotMark
from sidecar.records import Phase
from sidecar.records.readings import KvCache, ServingFigures
from sidecar.records.summary import SnapshotSummary
from sidecar.version import sidecar_version

PREFIX = "vllm_sidecar_"
# A custom metric's unit (sidecar/vllm_metrics/custom.py) as the base-unit word its name ends in.
_BASE_UNITS = {"s": "seconds", "second": "seconds", "B": "bytes", "byte": "bytes",
               "%": "percent"}  # fmt: skip
DISK_STATES = ("ok", "low")
SEVERITIES = ("critical", "warning", "info")
ENGINE_STATES = ("ok", "idle", "long_step", "stalled", "unknown")
TRIGGER_KINDS = ("signal", "socket", "latency", "queue")
Family = CounterMetricFamily | GaugeMetricFamily

# name -> (type, help). Counters are named without `_total`: prometheus_client appends it.
HELP: Mapping[str, tuple[str, str]] = {
    "build_info": ("gauge", "Always 1; the sidecar's version as a label."),
    "phase_ratio": ("gauge", "Share of a role's samples (all threads) per phase."),
    "main_thread_phase_ratio": ("gauge", "Share of a role's main-thread samples per phase."),
    "samples": ("counter", "Stack samples in all snapshots since the sidecar started."),
    "sampling_errors": ("counter", "Failed samples in all snapshots since the sidecar started."),
    "sampling_samples_per_second": ("gauge", "Achieved sampling rate of the latest snapshot."),
    "sampler_cpu_ratio": ("gauge", "py-spy CPU time over window length, latest snapshot."),
    "sampler_cpu_budget_ratio": ("gauge", "The CPU budget the rate adapts to (sampling.cpu_budget, "
                                 "a share of one core); absent when off."),
    "sampling_behind_seconds": ("gauge", "How far py-spy fell behind its schedule."),
    "sidecar_cpu_ratio": ("gauge", "The whole sidecar's CPU over the window's wall time, of one "
                          "core: py-spy's (part=py_spy) and its own (part=self), as the budget "
                          "counts them."),
    "sampling_requested_samples_per_second": ("gauge", "Samples per second asked of py-spy for "
                                              "one process."),
    "sampling_achieved_samples_per_second": ("gauge", "Samples per second of one process's main "
                                             "thread seen."),
    "sampling_process_errors": ("gauge", "py-spy's failed samples of one process (continuous "
                                "mode: each process has its own py-spy)."),
    "sampling_process_behind_seconds": ("gauge", "How far one process's py-spy fell behind."),
    "sampler_process_cpu_ratio": ("gauge", "One process's py-spy CPU over its sampled time."),
    "stage_samples": ("gauge", "Model-step samples per stage (prefill, decode, unknown)."),
    "gpu_memory_used_bytes": ("gauge", "Device memory in use (NVML)."),
    "gpu_memory_total_bytes": ("gauge", "Device memory in total (NVML)."),
    "gpu_utilization_ratio": ("gauge", "Share of NVML's sample period with a kernel running."),
    "gpu_pcie_tx_bytes_per_second": ("gauge", "PCIe transmit throughput (NVML)."),
    "gpu_pcie_rx_bytes_per_second": ("gauge", "PCIe receive throughput (NVML)."),
    "gpu_power_watts": ("gauge", "Board power draw (NVML)."),
    "gpu_process_memory_bytes": ("gauge", "Device memory held by one target process on one GPU."),
    "kv_cache_bytes": ("gauge", "KV-cache size as vLLM configured it."),
    "kv_cache_memory_ratio": ("gauge", "KV-cache size over GPU memory (of=gpu) or host memory "
                              "(of=host)."),
    "kv_cache_usage_ratio": ("gauge", "vLLM's kv_cache_usage_perc at the window's end (1 = full)."),
    "serving_requests_per_second": ("gauge", "Finished requests per second."),
    "serving_prompt_tokens_per_second": ("gauge", "Prompt tokens per second."),
    "serving_generation_tokens_per_second": ("gauge", "Generated tokens per second."),
    "serving_prefill_mean_seconds": ("gauge", "Mean prefill time per request over the window."),
    "serving_decode_mean_seconds": ("gauge", "Mean decode time per request over the window."),
    # Window quantiles, one gauge each: a `quantile` label is reserved for summaries and
    # `promtool check metrics` rejects it on a gauge. Earlier builds exported
    # serving_ttft_seconds{quantile="0.5"|"0.95"} (README: "Prometheus and Grafana").
    "serving_ttft_p50_seconds": ("gauge", "Median time to first token over the window."),
    "serving_ttft_p95_seconds": ("gauge", "95th percentile time to first token, window."),
    "serving_itl_p50_seconds": ("gauge", "Median inter-token latency over the window."),
    "serving_itl_p95_seconds": ("gauge", "95th percentile inter-token latency, window."),
    "custom": ("gauge", "A custom metric (config custom_metrics) over the window: a rate per "
               "second, a mean or a last value, as `kind` says; absent when not measured. Its "
               "unit ends the name (custom_seconds, custom_bytes_per_second; none: custom)."),
    "last_snapshot_timestamp_seconds": ("gauge", "When the last snapshot of this kind was done."),
    "snapshot_age_seconds": ("gauge", "Seconds since the last snapshot of this kind."),
    "snapshot_lateness_seconds": ("gauge", "How late the latest window started."),
    "next_snapshot_timestamp_seconds": ("gauge", "When the next window is due."),
    "windows_missed": ("counter", "Windows skipped because the sidecar was too late for them."),
    "target_up": ("gauge", "1 while the vLLM target is attached, 0 while it is gone."),
    "target_down_since_timestamp_seconds": ("gauge", "When the target went away; absent while up."),
    "target_restarts": ("counter", "Times the target was found again after going away."),
    "disk_state": ("gauge", "1 for the output folder's current disk state, 0 for the others."),
    "disk_free_bytes": ("gauge", "Free bytes on the output folder's filesystem."),
    "output_bytes": ("gauge", "Bytes the sidecar's snapshots take in the output folder."),
    "snapshots_written": ("counter", "Snapshots written to disk."),
    "snapshots_skipped": ("counter", "Snapshots not written (disk low)."),
    "snapshots_deleted": ("counter", "Snapshots deleted by retention."),
    "upload_backlog": ("gauge", "Snapshot folders waiting for their upload to object storage."),
    "upload_last_success_timestamp_seconds": ("gauge", "When the last folder's upload was "
                                              "confirmed; absent before the first."),
    "upload_failures": ("counter", "Failed upload tries; each doubles the wait before the next."),
    "snapshots_uploaded": ("counter", "Snapshot folders uploaded and confirmed by a listing."),
    "stalled_seconds": ("gauge", "How long the engine has made no progress with work pending, "
                        "by the role it is stuck in (sidecar/daemon/hang.py); 0 when it is not."),
    "engine_state": ("gauge", "1 for the hang watch's latest judgement of the engine (ok, idle, "
                     "long_step, stalled, unknown), 0 for the others."),
    "stall_incidents": ("counter", "Stalls raised (each writes an incident with native dumps)."),
    "triggered_snapshots": ("counter", "Snapshots taken on a trigger, by cause (signal, socket, "
                            "latency, queue)."),
    "window_failures": ("counter", "Failures the daemon carried on through, by kind."),
    "finding": ("gauge", "1 for each finding of the latest snapshot (configs/advice.yaml); "
                "absent when it does not fire."),
    "findings": ("gauge", "How many findings the latest snapshot has, by severity."),
}  # fmt: skip
# Gauges from a snapshot describe its window; the HELP texts leave "latest snapshot" implied.

# (metric, summary key) for the serving figures and device fields exported as plain gauges.
SERVING = (
    ("serving_requests_per_second", "requests_per_s"),
    ("serving_prompt_tokens_per_second", "prompt_tokens_per_s"),
    ("serving_generation_tokens_per_second", "generation_tokens_per_s"),
    ("serving_prefill_mean_seconds", "prefill_time_mean_s"),
    ("serving_decode_mean_seconds", "decode_time_mean_s"),
    ("serving_ttft_p50_seconds", "ttft_p50_s"),
    ("serving_ttft_p95_seconds", "ttft_p95_s"),
    ("serving_itl_p50_seconds", "itl_p50_s"),
    ("serving_itl_p95_seconds", "itl_p95_s"),
)
GPU_FIELDS = (
    ("gpu_memory_used_bytes", "memory_used_bytes", 1.0),
    ("gpu_memory_total_bytes", "memory_total_bytes", 1.0),
    ("gpu_utilization_ratio", "util_gpu_pct", 0.01),
    ("gpu_pcie_tx_bytes_per_second", "pcie_tx_bytes_per_s", 1.0),
    ("gpu_pcie_rx_bytes_per_second", "pcie_rx_bytes_per_s", 1.0),
    ("gpu_power_watts", "power_w", 1.0),
)


class _Families:
    """Metric families by name, created on first use with their labels in the order given."""

    def __init__(self) -> None:
        self._families: dict[str, Family] = {}

    def add(self, name: str, labels: Mapping[str, str], value: Any) -> None:
        number = _number(value)
        if number is None:
            return  # unknown: omitted, never NaN
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _family(name, list(labels))
        family.add_metric(list(labels.values()), number)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


def custom_family(unit: str | None) -> str:
    """A custom metric's family: its unit folded into the name, as Prometheus' naming asks
    rather than a `unit` label (s -> custom_seconds, B/s -> custom_bytes_per_second,
    /s -> custom_per_second, requests -> custom_requests; none -> custom)."""
    parts = [_unit_word(part) for part in (unit or "").split("/", 1)]
    # A rate's denominator is singular: bytes_per_second, not bytes_per_seconds.
    words = [parts[0], *(f"per_{p.removesuffix('s') if p == 'seconds' else p}"
                         for p in parts[1:] if p)]  # fmt: skip
    return "_".join(["custom", *(w for w in words if w)])


def _unit_word(unit: str) -> str:
    unit = unit.strip()
    word = _BASE_UNITS.get(unit) or re.sub(r"[^a-z0-9]+", "_", unit.lower()).strip("_")
    return _BASE_UNITS.get(word, word)


def _family(name: str, labels: list[str]) -> Family:
    kind, doc = HELP["custom" if name.startswith("custom_") else name]
    if kind == "counter":
        return CounterMetricFamily(PREFIX + name, doc, labels=labels)
    return GaugeMetricFamily(PREFIX + name, doc, labels=labels)


def _number(value: Any) -> float | None:
    if not isinstance(value, int | float):
        return None  # None, or anything a hand-edited summary holds that is not a number
    number = float(value)
    return number if math.isfinite(number) else None


class SidecarCollector:
    """A custom collector: each scrape builds its families from one `ExporterView`."""

    def __init__(self, state: ExporterState | ExporterGroup) -> None:
        self.state = state

    def describe(self) -> list[Metric]:
        return []  # no names reserved: the registry is ours alone, and families come and go

    def collect(self) -> Iterator[Metric]:
        out = _Families()
        states = self.state.states() if isinstance(self.state, ExporterGroup) else (self.state,)
        for state in states:
            # One per deployment (and the daemon's own, `deployment=""`): the dashboard's
            # deployment selector lists `label_values(vllm_sidecar_build_info, deployment)`.
            out.add(
                "build_info", {"host": state.host, **state.labels, "version": sidecar_version()}, 1
            )
        for state in states:
            _add_state(out, state)
        yield from out


def _add_state(out: _Families, state: ExporterState) -> None:
    """One state's series; a fleet's carry its deployment's labels, so that a query tells the
    servers of one host apart (every state of a group has the same label names)."""
    view, now = state.view, state.clock()
    host = {"host": state.host, **state.labels}
    target = {**host, "target": "" if view.root_pid is None else str(view.root_pid),
              **state.instance_labels}  # fmt: skip
    # Counters and daemon state carry `host` (and a fleet's deployment) only: they outlive a
    # target's PID; a series that changed its labels on every vLLM restart would break rate().
    out.add("samples", host, view.samples_total)
    out.add("sampling_errors", host, view.errors_total)
    if view.summary is not None:
        _add_summary(out, view.summary, target, host)
        out.add("sampler_cpu_budget_ratio", target, view.cpu_budget)
        _add_findings(out, view, target)
    _add_marks(out, view.marks, host, now)
    _add_daemon(out, view, host)
    for kind, count in sorted(view.failures.items()):
        out.add("window_failures", {**host, "kind": kind}, count)


def _add_summary(
    out: _Families, summary: SnapshotSummary, target: dict[str, str], host: dict[str, str]
) -> None:
    sampling = summary.sampling
    out.add("sampling_samples_per_second", target, sampling.rate_hz)
    out.add("sampler_cpu_ratio", target, sampling.sampler_cpu_share)
    out.add("sampling_behind_seconds", target, sampling.behind_s)
    _add_efficiency(out, summary, target)
    for name, by_role in (("phase_ratio", summary.by_role),
                          ("main_thread_phase_ratio", summary.main_thread)):  # fmt: skip
        for role, shares in by_role.items():
            # Every phase, 0 where none was seen: a known zero keeps the series continuous.
            for phase in Phase:
                labels = {**target, "role": role, "phase": phase.value}
                out.add(name, labels, shares.get(phase.value, 0.0))
    for stage, n in summary.stages.items():
        out.add("stage_samples", {**target, "stage": stage}, n)
    _add_gpu(out, summary, target, host)
    _add_serving(out, summary.serving, summary.kv_cache, target)
    for m in summary.custom:  # one series per custom metric; None (not measured): absent
        out.add(custom_family(m.unit), {**target, "name": m.name, "kind": m.kind}, m.value)


def _add_efficiency(out: _Families, summary: SnapshotSummary, target: dict[str, str]) -> None:
    """The sampler's own efficiency: its CPU by part, and per process requested vs achieved."""
    s = summary.sampling
    wall = s.duration_s
    if wall > 0:
        out.add("sidecar_cpu_ratio", {**target, "part": "py_spy"}, s.sampler_cpu_s / wall)
        if s.self_cpu_s is not None:
            out.add("sidecar_cpu_ratio", {**target, "part": "self"}, s.self_cpu_s / wall)
    for p in s.processes:
        labels = {**target, "role": p.role.value, "pid": str(p.pid)}
        out.add("sampling_requested_samples_per_second", labels, p.requested_hz)
        out.add("sampling_achieved_samples_per_second", labels, p.achieved_hz)
        out.add("sampling_process_errors", labels, p.errors)
        out.add("sampling_process_behind_seconds", labels, p.behind_s)
        if p.cpu_s is not None and wall > 0:
            out.add("sampler_process_cpu_ratio", labels, p.cpu_s / wall)


def _add_findings(out: _Families, view: ExporterView, target: dict[str, str]) -> None:
    """One gauge per active finding, and the count by severity (0 for a severity with none, so
    `findings{severity="critical"} > 0` alerts and recovers without `absent()`)."""
    for f in view.findings:
        out.add("finding", {**target, "id": f.id, "severity": f.severity}, 1)
    for severity in SEVERITIES:
        out.add("findings", {**target, "severity": severity},
                sum(1 for f in view.findings if f.severity == severity))  # fmt: skip


def _add_gpu(
    out: _Families, summary: SnapshotSummary, target: dict[str, str], host: dict[str, str]
) -> None:
    if not summary.gpu.available:
        return
    roles = {p.pid: p.role.value for p in summary.target.processes}
    for device in summary.gpu.devices:
        labels = {**host, "gpu": device.label}
        for name, key, scale in GPU_FIELDS:
            value = getattr(device, key)
            out.add(name, labels, None if value is None else value * scale)
        for process in device.processes:
            pid = process.target_pid
            if pid is None:
                continue  # another tenant's process, or one the PID map could not place
            role = roles.get(pid, "other")
            proc_labels = {**target, "gpu": device.label, "pid": str(pid), "role": role}
            out.add("gpu_process_memory_bytes", proc_labels, process.used_memory_bytes)


def _add_serving(
    out: _Families, serving: ServingFigures, kv: KvCache | None, target: dict[str, str]
) -> None:
    for name, key in SERVING:
        out.add(name, target, getattr(serving, key))
    if kv:
        out.add("kv_cache_bytes", target, kv.bytes)
        if kv.share_of:
            out.add("kv_cache_memory_ratio", {**target, "of": kv.share_of}, kv.share)
        out.add("kv_cache_usage_ratio", target, kv.usage)


def _add_marks(
    out: _Families, marks: Mapping[str, SnapshotMark], host: dict[str, str], now: float
) -> None:
    for kind, mark in sorted(marks.items()):
        labels = {**host, "kind": kind}
        out.add("last_snapshot_timestamp_seconds", labels, mark.at)
        out.add("snapshot_age_seconds", labels, max(0.0, now - mark.at))


def _add_daemon(out: _Families, view: ExporterView, host: dict[str, str]) -> None:
    if view.schedule is not None:
        out.add("snapshot_lateness_seconds", host, view.schedule.lateness_s)
        out.add("next_snapshot_timestamp_seconds", host, view.schedule.next_deadline_wall)
        out.add("windows_missed", host, view.schedule.windows_missed)
    if view.target is not None:
        out.add("target_up", host, 1 if view.target.up else 0)
        out.add("target_restarts", host, view.target.restarts)
        out.add("target_down_since_timestamp_seconds", host, view.target.down_since)
    if view.disk is not None:
        d = view.disk
        for state in dict.fromkeys((*DISK_STATES, d.state)):
            out.add("disk_state", {**host, "state": state}, 1 if state == d.state else 0)
        out.add("disk_free_bytes", host, d.free_bytes)
        out.add("output_bytes", host, d.used_bytes)
        out.add("snapshots_written", host, d.written_total)
        out.add("snapshots_skipped", host, d.skipped_total)
        out.add("snapshots_deleted", host, d.deleted_total)
    if view.stall is not None:
        for role, seconds in sorted(view.stall.stalled_s.items()):
            out.add("stalled_seconds", {**host, "role": role}, seconds)
        for state in ENGINE_STATES:
            out.add("engine_state", {**host, "state": state}, int(state == view.stall.state))
        out.add("stall_incidents", host, view.incidents_total)
    for kind in TRIGGER_KINDS:
        out.add("triggered_snapshots", {**host, "cause": kind}, view.triggered.get(kind, 0))
    if view.upload is not None:
        u = view.upload
        out.add("upload_backlog", host, u.backlog)
        out.add("upload_last_success_timestamp_seconds", host, u.last_success_wall)
        out.add("upload_failures", host, u.failures_total)
        out.add("snapshots_uploaded", host, u.uploaded_total)
