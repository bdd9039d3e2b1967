"""The sidecar's own Prometheus endpoint, so an existing Prometheus can scrape a fleet of them.

The daemon pushes what it knows into an `ExporterState` (one frozen `ExporterView`, replaced
whole under a lock); `SidecarCollector.collect()` reads that view once per scrape, so every
value in one scrape comes from the same state. The registry is private: nothing else in the
process (py-spy runner, vLLM client libraries) can add to or clash with our metrics.

Unknown values are omitted, never exported as NaN: a NaN gauge looks like data to PromQL and
poisons `avg()`/`sum()`, while an absent series is what `absent()` and alerts expect.

Listening: `127.0.0.1:9464` by default; `0.0.0.0:9464` or `[::]:9464` expose the profile
(stack-derived phase shares, process IDs) to the network: do that only behind a firewall or a
proxy. `off` (or empty) starts no endpoint.
"""

from __future__ import annotations

import errno
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sidecar import __version__
from sidecar.errors import ConfigError
from sidecar.records import Phase

PREFIX = "vllm_sidecar_"
DEFAULT_HOST = "127.0.0.1"
DISK_STATES = ("ok", "low")
OFF = ("", "off", "none", "false", "no")
Family = CounterMetricFamily | GaugeMetricFamily

# name -> (type, help). Counters are named without `_total`: prometheus_client appends it.
HELP: Mapping[str, tuple[str, str]] = {
    "build_info": ("gauge", "Always 1; the sidecar's version as a label."),
    "phase_share": ("gauge", "Share of a role's samples (all threads) per phase."),
    "main_thread_phase_share": ("gauge", "Share of a role's main-thread samples per phase."),
    "samples": ("counter", "Stack samples in all snapshots since the sidecar started."),
    "sampling_errors": ("counter", "Failed samples in all snapshots since the sidecar started."),
    "sampling_rate_hz": ("gauge", "Achieved sampling rate of the latest snapshot."),
    "sampler_cpu_share": ("gauge", "py-spy CPU time over window length, latest snapshot."),
    "sampling_behind_seconds": ("gauge", "How far py-spy fell behind its schedule."),
    "stage_samples": ("gauge", "Model-step samples per stage (prefill, decode, unknown)."),
    "gpu_memory_used_bytes": ("gauge", "Device memory in use (NVML)."),
    "gpu_memory_total_bytes": ("gauge", "Device memory in total (NVML)."),
    "gpu_utilization_ratio": ("gauge", "Share of NVML's sample period with a kernel running."),
    "gpu_pcie_tx_bytes_per_second": ("gauge", "PCIe transmit throughput (NVML)."),
    "gpu_pcie_rx_bytes_per_second": ("gauge", "PCIe receive throughput (NVML)."),
    "gpu_power_watts": ("gauge", "Board power draw (NVML)."),
    "gpu_process_memory_bytes": ("gauge", "Device memory held by one target process on one GPU."),
    "kv_cache_bytes": ("gauge", "KV-cache size as vLLM configured it."),
    "kv_cache_share": ("gauge", "KV-cache size over GPU memory (of=gpu) or host memory (of=host)."),
    "kv_cache_usage_ratio": ("gauge", "vLLM's kv_cache_usage_perc at the window's end (1 = full)."),
    "serving_requests_per_second": ("gauge", "Finished requests per second."),
    "serving_prompt_tokens_per_second": ("gauge", "Prompt tokens per second."),
    "serving_generation_tokens_per_second": ("gauge", "Generated tokens per second."),
    "serving_prefill_seconds_mean": ("gauge", "Mean prefill time per request over the window."),
    "serving_decode_seconds_mean": ("gauge", "Mean decode time per request over the window."),
    "serving_ttft_seconds": ("gauge", "Time to first token over the window, by quantile."),
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
    "window_failures": ("counter", "Failures the daemon carried on through, by kind."),
}  # fmt: skip
# Gauges from a snapshot describe its window; the HELP texts leave "latest snapshot" implied.

# (metric, summary key) for the serving figures and device fields exported as plain gauges.
SERVING = (
    ("serving_requests_per_second", "requests_per_s"),
    ("serving_prompt_tokens_per_second", "prompt_tokens_per_s"),
    ("serving_generation_tokens_per_second", "generation_tokens_per_s"),
    ("serving_prefill_seconds_mean", "prefill_time_mean_s"),
    ("serving_decode_seconds_mean", "decode_time_mean_s"),
)
GPU_FIELDS = (
    ("gpu_memory_used_bytes", "memory_used_bytes", 1.0),
    ("gpu_memory_total_bytes", "memory_total_bytes", 1.0),
    ("gpu_utilization_ratio", "util_gpu_pct", 0.01),
    ("gpu_pcie_tx_bytes_per_second", "pcie_tx_bytes_per_s", 1.0),
    ("gpu_pcie_rx_bytes_per_second", "pcie_rx_bytes_per_s", 1.0),
    ("gpu_power_watts", "power_w", 1.0),
)


# --------------------------------------------------------------------------------- the state


@dataclass(frozen=True, slots=True)
class SnapshotMark:
    kind: str
    at: float  # the state's clock (wall seconds) when the daemon handed the snapshot over
    written_path: str | None  # None: not written (disk low, or a dry run)


@dataclass(frozen=True, slots=True)
class TargetState:
    up: bool
    restarts: int
    down_since: float | None  # wall seconds


@dataclass(frozen=True, slots=True)
class DiskState:
    state: str  # "ok" or "low"
    free_bytes: int | None
    used_bytes: int
    written_total: int
    skipped_total: int
    deleted_total: int


@dataclass(frozen=True, slots=True)
class ScheduleState:
    next_deadline_wall: float
    lateness_s: float
    windows_missed: int


@dataclass(frozen=True, slots=True)
class ExporterView:
    """Everything one scrape reports. Replaced whole, never changed in place."""

    summary: Mapping[str, Any] | None = None
    root_pid: int | None = None
    samples_total: int = 0
    errors_total: int = 0
    marks: Mapping[str, SnapshotMark] = field(default_factory=dict)
    target: TargetState | None = None
    disk: DiskState | None = None
    schedule: ScheduleState | None = None
    failures: Mapping[str, int] = field(default_factory=dict)  # kind -> count


class ExporterState:
    """What the daemon knows, updated from its loop and read by scrapes on the server's thread.

    `clock` is wall time (seconds since the epoch), like every timestamp handed in: snapshot
    age is `clock()` at scrape time minus `clock()` when the snapshot was handed over.
    """

    def __init__(self, host: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.host = host or socket.gethostname()
        self.clock = clock
        self._lock = threading.Lock()
        self._view = ExporterView()

    @property
    def view(self) -> ExporterView:
        return self._view  # one attribute read: a consistent view without the lock

    def update_snapshot(
        self, summary: Mapping[str, Any], kind: str, written_path: str | None
    ) -> None:
        sampling = summary.get("sampling") or {}
        root_pid = (summary.get("target") or {}).get("root_pid")
        mark = SnapshotMark(kind, self.clock(), written_path)
        with self._lock:
            v = self._view
            self._view = replace(
                v,
                summary=summary,
                root_pid=root_pid if root_pid is not None else v.root_pid,
                samples_total=v.samples_total + int(sampling.get("samples") or 0),
                errors_total=v.errors_total + int(sampling.get("errors") or 0),
                marks={**v.marks, kind: mark},
            )

    def update_target(self, up: bool, restarts: int, down_since: float | None) -> None:
        with self._lock:
            self._view = replace(self._view, target=TargetState(up, restarts, down_since))

    def update_disk(
        self,
        state: str,
        free_bytes: int | None,
        used_bytes: int,
        written_total: int,
        skipped_total: int,
        deleted_total: int,
    ) -> None:
        disk = DiskState(state, free_bytes, used_bytes, written_total, skipped_total, deleted_total)
        with self._lock:
            self._view = replace(self._view, disk=disk)

    def update_schedule(
        self, next_deadline_wall: float, lateness_s: float, windows_missed: int
    ) -> None:
        schedule = ScheduleState(next_deadline_wall, lateness_s, windows_missed)
        with self._lock:
            self._view = replace(self._view, schedule=schedule)

    def update_failures(self, counts: Mapping[str, int]) -> None:
        with self._lock:
            self._view = replace(self._view, failures=dict(counts))

    def last_snapshot(self, kind: str) -> SnapshotMark | None:
        return self._view.marks.get(kind)


# ----------------------------------------------------------------------------- the collector


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


def _family(name: str, labels: list[str]) -> Family:
    kind, doc = HELP[name]
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

    def __init__(self, state: ExporterState) -> None:
        self.state = state

    def describe(self) -> list[Metric]:
        return []  # no names reserved: the registry is ours alone, and families come and go

    def collect(self) -> Iterator[Metric]:
        view, now = self.state.view, self.state.clock()
        host = {"host": self.state.host}
        target = {**host, "target": "" if view.root_pid is None else str(view.root_pid)}
        out = _Families()
        out.add("build_info", {**host, "version": __version__}, 1)
        # Counters and daemon state carry `host` only: they outlive a target's PID, and a
        # series that changed its labels on every vLLM restart would break rate() and alerts.
        out.add("samples", host, view.samples_total)
        out.add("sampling_errors", host, view.errors_total)
        if view.summary is not None:
            _add_summary(out, view.summary, target)
        _add_marks(out, view.marks, host, now)
        _add_daemon(out, view, host)
        for kind, count in sorted(view.failures.items()):
            out.add("window_failures", {**host, "kind": kind}, count)
        yield from out


def _add_summary(out: _Families, summary: Mapping[str, Any], target: dict[str, str]) -> None:
    sampling = summary.get("sampling") or {}
    out.add("sampling_rate_hz", target, sampling.get("rate_hz"))
    out.add("sampler_cpu_share", target, sampling.get("sampler_cpu_share"))
    out.add("sampling_behind_seconds", target, sampling.get("behind_s"))
    for name, key in (("phase_share", "by_role"), ("main_thread_phase_share", "main_thread")):
        for role, shares in (summary.get(key) or {}).items():
            # Every phase, 0 where none was seen: a known zero keeps the series continuous.
            for phase in Phase:
                labels = {**target, "role": role, "phase": phase.value}
                out.add(name, labels, shares.get(phase.value, 0.0))
    for stage, n in (summary.get("stages") or {}).items():
        out.add("stage_samples", {**target, "stage": stage}, n)
    _add_gpu(out, summary, target)
    _add_serving(out, summary.get("serving") or {}, summary.get("kv_cache"), target)


def _add_gpu(out: _Families, summary: Mapping[str, Any], target: dict[str, str]) -> None:
    gpu = summary.get("gpu") or {}
    if not gpu.get("available"):
        return
    roles = {p["pid"]: p["role"] for p in (summary.get("target") or {}).get("processes", [])}
    host = {"host": target["host"]}
    for device in gpu.get("devices", []):
        labels = {**host, "gpu": device["label"]}
        for name, key, scale in GPU_FIELDS:
            value = device.get(key)
            out.add(name, labels, None if value is None else value * scale)
        for process in device.get("processes", []):
            pid = process.get("target_pid")
            if pid is None:
                continue  # another tenant's process, or one the PID map could not place
            role = roles.get(pid, "other")
            proc_labels = {**target, "gpu": device["label"], "pid": str(pid), "role": role}
            out.add("gpu_process_memory_bytes", proc_labels, process.get("used_memory_bytes"))


def _add_serving(
    out: _Families,
    serving: Mapping[str, Any],
    kv: Mapping[str, Any] | None,
    target: dict[str, str],
) -> None:
    for name, key in SERVING:
        out.add(name, target, serving.get(key))
    for quantile, key in (("0.5", "ttft_p50_s"), ("0.95", "ttft_p95_s")):
        out.add("serving_ttft_seconds", {**target, "quantile": quantile}, serving.get(key))
    if kv:
        out.add("kv_cache_bytes", target, kv.get("bytes"))
        if kv.get("share_of"):
            out.add("kv_cache_share", {**target, "of": kv["share_of"]}, kv.get("share"))
        out.add("kv_cache_usage_ratio", target, kv.get("usage"))


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


# -------------------------------------------------------------------------------- the server


@dataclass(frozen=True, slots=True)
class ListenAddress:
    host: str
    port: int


def parse_listen(listen: str | None) -> ListenAddress | None:
    """`host:port`, `[v6]:port`, `:port` or `port` (both 127.0.0.1); `off` or empty: None."""
    text = (listen or "").strip()
    if text.lower() in OFF:
        return None
    host, port = _split(text)
    if not port.isdigit() or int(port) > 65535:
        raise ConfigError(
            f"exporter listen address {listen!r} has no valid port: write host:port "
            "(127.0.0.1:9464, [::1]:9464, :9464) or `off`"
        )
    return ListenAddress(host or DEFAULT_HOST, int(port))


def _split(text: str) -> tuple[str, str]:
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep or not host:
            raise ConfigError(f"exporter listen address {text!r}: write [::1]:9464")
        return host, port
    if text.count(":") > 1:
        raise ConfigError(f"exporter listen address {text!r}: put IPv6 addresses in brackets, "
                          "as in [::1]:9464")  # fmt: skip
    host, _, port = text.rpartition(":")
    return host, port


@dataclass(slots=True)
class ExporterHandle:
    """A running endpoint. `close()` stops serving and frees the port; calling it twice is fine."""

    server: WSGIServer
    thread: threading.Thread
    _closed: bool = False

    @property
    def host(self) -> str:
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self, timeout: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        self.server.shutdown()  # returns once serve_forever has left its loop
        self.server.server_close()
        self.thread.join(timeout)


def start_exporter(listen: str | None, state: ExporterState) -> ExporterHandle | None:
    """Serve `state` on `listen` from a daemon thread; None when `listen` is off."""
    address = parse_listen(listen)
    if address is None:
        return None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(state))
    try:
        server, thread = start_http_server(address.port, address.host, registry=registry)
    except OSError as error:
        raise ConfigError(_bind_failed(address, error)) from error
    return ExporterHandle(server, thread)


def _bind_failed(address: ListenAddress, error: OSError) -> str:
    where = f"port {address.port} on {address.host}"
    fix = "set exporter.listen / --exporter-listen to"
    if error.errno == errno.EADDRINUSE:
        return f"{where} is in use: {fix} a free port, or `off`"
    if error.errno == errno.EACCES:
        return f"{where} needs privileges: {fix} a port above 1023, or `off`"
    if error.errno == errno.EADDRNOTAVAIL or isinstance(error, socket.gaierror):
        return (f"{address.host} is not an address of this host ({error}): {fix} "
                "127.0.0.1:PORT, 0.0.0.0:PORT (all interfaces), or `off`")  # fmt: skip
    return f"cannot listen on {where} ({error}): {fix} another address, or `off`"
