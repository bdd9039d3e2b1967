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
from sidecar.gpu import (
    GpuFigures,
    GpuReading,
    GpuUtilization,
    NvmlReader,
    UtilizationPoller,
    gpu_figures,
    target_gpus,
)
from sidecar.kvcache import KvCache, kv_cache
from sidecar.modelconfig import kv_inputs, serve_args
from sidecar.pidmap import PidMap
from sidecar.procfs import ProcFs
from sidecar.records import ProcessInfo, Role
from sidecar.resources import PsutilReader
from sidecar.sampler import Sampler
from sidecar.snapshot import Readings, Snapshot, build_snapshot
from sidecar.vllm_metrics import (
    HttpMetricsSource,
    MetricsSource,
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
    # The last window's GPU figures (target GPUs, one line each, utilisation through the
    # window), until Readings carries them.
    last_gpu_figures: GpuFigures | None = field(default=None, init=False)

    def collect(self, duration_s: float, stop: Callable[[], bool] = lambda: False) -> Snapshot:
        processes = self.target.processes
        self.psutil_reader.start(processes)
        first = take_scrape(self.metrics) if self.metrics else None
        pidmap = self._pidmap()  # once a window: the target's PIDs do not change within it
        gpu_start = self.gpu.read(pidmap) if self.gpu else None
        poller = UtilizationPoller(self.gpu) if self.gpu else None
        if poller:
            poller.start()
        try:
            window = self.sampler.window(duration_s, stop)
        finally:
            utilization = poller.stop() if poller else ()
        gpu_end = self.gpu.read(pidmap) if self.gpu else None
        self.last_gpu_figures = self._gpu_figures(gpu_end, utilization)
        serving = (
            serving_figures(first, take_scrape(self.metrics)) if first and self.metrics else None
        )
        host = self.psutil_reader.host_memory()
        readings = Readings(
            process_stats=self.psutil_reader.finish(processes, window.duration_s),
            host_memory=host,
            gpu=gpu_end,
            gpu_util_start=_mean_util(gpu_start, self.last_gpu_figures),
            serving=serving,
            metrics_url=self.metrics.url if self.metrics else None,
        )
        readings = readings.with_kv_cache(self._kv_cache(readings))
        return build_snapshot(window, processes, self.classifier, readings=readings)

    def _pidmap(self) -> PidMap | None:
        if self.gpu is None:
            return None
        return PidMap.build(self.procfs, self.target.pids, host_procfs=self.host_procfs)

    def _gpu_figures(
        self, reading: GpuReading | None, utilization: tuple[GpuUtilization, ...]
    ) -> GpuFigures | None:
        if reading is None:
            return None
        api = self._api_server()
        world = serve_args(api.cmdline).world_size if api else None
        target = target_gpus(reading, self.target.pids, self.procfs.environ, world)
        return gpu_figures(reading, target, utilization)

    def _kv_cache(self, r: Readings) -> KvCache | None:
        if r.serving is None or not r.serving.cache_config:
            return None
        gpus = self.last_gpu_figures.memory_totals if self.last_gpu_figures else None
        host = r.host_memory.total_bytes if r.host_memory else None
        inputs = kv_inputs(self.procfs, self._api_server(), gpus, host)
        return kv_cache(r.serving.cache_config, r.serving.kv_cache_usage, inputs)

    def _api_server(self) -> ProcessInfo | None:
        return next((p for p in self.target.processes if p.role is Role.API_SERVER), None)


def _mean_util(reading: GpuReading | None, figures: GpuFigures | None) -> float | None:
    """Mean utilisation of the target's GPUs (all GPUs when they are unknown) in `reading`."""
    if reading is None or not reading.available:
        return None
    mine = set(figures.target.indexes) if figures else None
    utils = [d.util_gpu_pct for d in reading.devices
             if d.util_gpu_pct is not None and (mine is None or d.index in mine)]  # fmt: skip
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
