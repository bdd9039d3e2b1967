"""One window, every reader: stacks (py-spy), processes (psutil), GPU (NVML), vLLM's /metrics.

Used by `snapshot` (one window) and `run` (windows on a schedule). Each reader that fails
leaves its part of the snapshot empty with a reason; only the stack sampler's failed start is
fatal (STYLE.md 7).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.classifier import Classifier
from sidecar.discovery import Deployment
from sidecar.gpu import GpuReading, NvmlReader
from sidecar.pidmap import PidMap
from sidecar.procfs import ProcFs
from sidecar.records import Role
from sidecar.records.readings import KvCache
from sidecar.resources import PsutilReader, kv_bytes_per_token, kv_cache, model_dir_of
from sidecar.sampler import Sampler
from sidecar.snapshot import Readings, Snapshot, build_snapshot
from sidecar.vllm_metrics import (
    HttpMetricsSource,
    MetricsScrape,
    MetricsSource,
    ServingFigures,
    metrics_url_from_cmdline,
    serving_figures,
    take_scrape,
)

log = logging.getLogger("vllm_sidecar")


@dataclass
class Collector:
    target: Deployment
    sampler: Sampler
    classifier: Classifier
    procfs: ProcFs
    metrics: MetricsSource | None = None
    gpu: NvmlReader | None = None
    host_procfs: ProcFs | None = None
    psutil_reader: PsutilReader = field(default_factory=PsutilReader)
    metrics_unread: str | None = None  # why there is no `metrics` source, when there is none
    scrape: Callable[[MetricsSource], MetricsScrape] = take_scrape  # the daemon counts failures

    def collect(self, duration_s: float, stop: Callable[[], bool] = lambda: False) -> Snapshot:
        processes = self.target.processes
        self.psutil_reader.start(processes)
        first = self.scrape(self.metrics) if self.metrics else None
        pidmap = self._pidmap()  # once a window: the target's PIDs do not change within it
        gpu_start = self.gpu.read(pidmap) if self.gpu else None
        window = self.sampler.window(duration_s, stop)
        gpu_end = self.gpu.read(pidmap) if self.gpu else None
        serving = (
            serving_figures(first, self.scrape(self.metrics)) if first and self.metrics else None
        )
        if serving is None and self.metrics_unread is not None:
            serving = ServingFigures(reason=f"metrics not read: {self.metrics_unread}")
        host = self.psutil_reader.host_memory()
        readings = Readings(
            process_stats=self.psutil_reader.finish(processes, window.duration_s),
            host_memory=host,
            gpu=gpu_end,
            gpu_util_start=_mean_util(gpu_start),
            serving=serving,
            metrics_url=self.metrics.url if self.metrics else None,
        )
        readings = readings.with_kv_cache(self._kv_cache(readings))
        return build_snapshot(window, processes, self.classifier, readings=readings)

    def _pidmap(self) -> PidMap | None:
        if self.gpu is None:
            return None
        return PidMap.build(self.procfs, self.target.pids, host_procfs=self.host_procfs)

    def _kv_cache(self, r: Readings) -> KvCache | None:
        if r.serving is None or not r.serving.cache_config:
            return None
        api = next((p for p in self.target.processes if p.role is Role.API_SERVER), None)
        model = model_dir_of(api, self.procfs.root) if api else None
        per_token = (
            kv_bytes_per_token(model, r.serving.cache_config.get("cache_dtype")) if model else None
        )
        gpu_total = None
        if r.gpu and r.gpu.available and r.gpu.devices:
            gpu_total = sum(d.memory_total_bytes or 0 for d in r.gpu.devices if not d.mig) or None
        return kv_cache(r.serving.cache_config, r.serving.kv_cache_usage, gpu_total,
                        r.host_memory, per_token)  # fmt: skip


def _mean_util(reading: GpuReading | None) -> float | None:
    if reading is None or not reading.available:
        return None
    utils = [d.util_gpu_pct for d in reading.devices if d.util_gpu_pct is not None]
    return sum(utils) / len(utils) if utils else None


def metrics_source_for(target: Deployment, url: str | None, timeout_s: float) -> MetricsSource:
    """The configured URL, else the one the API server's command line implies."""
    if url is None:
        api = next((p for p in target.processes if p.role is Role.API_SERVER), target.root)
        url = metrics_url_from_cmdline(api.cmdline)
    return HttpMetricsSource(url, timeout_s=timeout_s)


def open_gpu_reader(enabled: bool = True) -> NvmlReader | None:
    """An open NVML reader, or None on a CPU host (said once, then the sidecar carries on)."""
    if not enabled:
        return None
    reader = NvmlReader()
    reason = reader.open()
    if reason is not None:
        log.info("%s", reason)
    return reader


def host_procfs(path: Path | None) -> ProcFs | None:
    return ProcFs(path) if path else None
