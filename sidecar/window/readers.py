"""What a window reads beside the stacks, and the one wiring of a window's parts from the config
(`readers_for`, `sampler_for`), for `snapshot` (one window) and `run` (the daemon's windows).

    WindowReaders  psutil, /proc, NVML, vLLM's /metrics, the KV cache, the custom metrics: read
                   as the window opens (`start`) and as it ends (`finish`)
    SegmentLaps    CPU per role and vLLM's counters at each segment boundary (the sampler's `Lap`)

Each reader sits behind its own OS boundary; one that fails leaves its part of the snapshot empty
with a reason (STYLE.md 7).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.classify.groundtruth import cpu_over_window
from sidecar.classify.rules import RuleSet
from sidecar.gpu import (
    GpuFigures,
    GpuReading,
    GpuUtilization,
    NvmlApi,
    NvmlReader,
    UtilizationPoller,
    gpu_figures,
    target_gpus,
)
from sidecar.records import ProcessInfo, Role
from sidecar.records.readings import CustomMetric, KvCache, ServingFigures, ThreadTime
from sidecar.records.summary import Fingerprint
from sidecar.records.window import LapReading, Window
from sidecar.sampling.pyspy import ProcessRate, PySpyRunner
from sidecar.sampling.sampler import RateController, Sampler
from sidecar.target.discovery import Deployment
from sidecar.target.fingerprint import FingerprintCache, for_window, read_target
from sidecar.target.kvcache import kv_cache
from sidecar.target.modelconfig import kv_inputs, serve_args
from sidecar.target.pidmap import PidMap
from sidecar.target.procfs import ProcFs
from sidecar.target.resources import PsutilReader, cpu_time
from sidecar.vllm_metrics import (
    HttpMetricsSource,
    MetricsScrape,
    MetricsSource,
    metrics_url_from_cmdline,
    serving_figures,
    take_scrape,
)
from sidecar.vllm_metrics.custom import CustomReader, custom_reader
from sidecar.vllm_metrics.endpoint import MetricsUrlError
from sidecar.window.snapshot import Readings

if TYPE_CHECKING:
    from sidecar.config.settings import Config
    from sidecar.sampling.continuous import RolePlanner

log = logging.getLogger("vllm_sidecar")


# ---------------------------------------------------------------------------------- wiring


def readers_for(
    config: Config,
    target: Deployment,
    procfs: ProcFs,
    gpu: NvmlReader | None,
    metrics: MetricsSource | None,
    fingerprints: FingerprintCache | None = None,
    scrape: Callable[[MetricsSource], MetricsScrape] = take_scrape,
) -> WindowReaders:
    """The readers of `target`'s windows: `metrics` is the configured /metrics (None: the one
    vLLM's flags imply; none at all leaves `metrics_unread` saying why), `gpu` an open NVML
    reader or None, `fingerprints` what was read of the target before (the daemon's)."""
    timeout = config.metrics.timeout_s
    source, unread = metrics_for(target, metrics, timeout)
    custom = custom_reader(config.custom_metrics, timeout, source.url if source else None)
    return WindowReaders(procfs=procfs, metrics=source, gpu=gpu,
                         host_procfs=host_procfs(config.target.host_proc),
                         metrics_unread=unread, scrape=scrape,
                         fingerprints=FingerprintCache() if fingerprints is None else fingerprints,
                         custom=custom)  # fmt: skip


def configured_metrics(config: Config) -> MetricsSource | None:
    """`metrics.url`, when the config sets one (None: the one vLLM's flags imply)."""
    url = config.metrics.url
    return HttpMetricsSource(url, timeout_s=config.metrics.timeout_s) if url else None


MAX_SLICES = 30  # a window's time slices at most (`slice_length`)


def sampler_for(
    config: Config,
    runner: PySpyRunner,
    target: Deployment,
    window_s: float,
    alive: Callable[[], bool],
    controller: RateController | None = None,
    planner: RolePlanner | None = None,
    first: bool = True,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
) -> Sampler:
    """The sampler of `target`'s windows of `window_s`: py-spy over the tree at `controller`'s
    rate (None: a new one at `sampling.rate_hz` within `cpu_budget`) in segments of
    `sampling.segment_s`, or with `planner` continuous mode's one py-spy per process at the
    planner's rates, in segments of `continuous_segment_s`. `first`: a failed attach is a
    failed start (the sampler raises)."""
    s = config.sampling
    rate = controller or RateController(rate_hz=s.rate_hz, budget=s.cpu_budget)
    unit_s = slice_length(s.unit_s, window_s)
    if planner is None:
        return Sampler(runner=runner, pid=target.root.pid, controller=rate,
                       segment_s=min(s.segment_s, window_s), alive=alive, clock=clock,
                       wall_clock=wall_clock, fail_fast=first, unit_s=unit_s)  # fmt: skip
    plans = planner  # bound for the closure: mypy narrows no captured argument

    def plan() -> tuple[ProcessRate, ...]:
        return plans.plan(target.processes)

    return Sampler(runner=runner, pid=target.root.pid, controller=rate,
                   segment_s=s.continuous_segment_s, alive=alive, clock=clock,
                   wall_clock=wall_clock, fail_fast=first, plan=plan,
                   on_segment=planner.update, unit_s=unit_s)  # fmt: skip


def slice_length(unit_s: float | None, window_s: float) -> float | None:
    """The slices' length for a window of `window_s`: `sampling.unit_s`, or longer so that a
    window holds at most MAX_SLICES (a 5 min period: 30 slices of 10 s, not 150 of 2 s; more
    units add little power and grow summary.json)."""
    if unit_s is None:
        return None
    return max(unit_s, window_s / MAX_SLICES)


# ---------------------------------------------------------------------------------- readers


@dataclass(frozen=True, slots=True)
class Started:
    """What the readers took when the window opened."""

    scrape: MetricsScrape | None
    pidmap: PidMap | None
    gpu: GpuReading | None
    poller: UtilizationPoller | None
    custom: Mapping[str, MetricsScrape] = field(default_factory=dict)  # other URLs' first
    threads: tuple[ThreadTime, ...] = ()  # every target thread's CPU time so far (/proc)
    threads_at: float = 0.0  # when they were read (the readers' monotonic clock)


@dataclass
class WindowReaders:
    """Everything a window reads beside the stacks, each behind its own OS boundary."""

    procfs: ProcFs
    metrics: MetricsSource | None = None
    gpu: NvmlReader | None = None
    host_procfs: ProcFs | None = None
    psutil_reader: PsutilReader = field(default_factory=PsutilReader)
    metrics_unread: str | None = None  # why there is no `metrics` source, when there is none
    scrape: Callable[[MetricsSource], MetricsScrape] = take_scrape  # the daemon counts failures
    fingerprints: FingerprintCache = field(default_factory=FingerprintCache)  # the daemon's lasts
    cpu: Callable[[int], float | None] = cpu_time  # a process's CPU seconds (psutil)
    custom: CustomReader | None = None  # the config's custom_metrics; None: none configured
    # This window's scrapes of vLLM's /metrics, in order: first, segment boundaries, last (a
    # custom gauge on vLLM's URL is the mean of them all).
    window_scrapes: list[MetricsScrape] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic

    def thread_times(self, target: Deployment) -> tuple[ThreadTime, ...]:
        """Every thread of the target's processes, its CPU time now (/proc/PID/task)."""
        return tuple(t for pid in target.pids for t in self.procfs.thread_times(pid))

    def take(self, source: MetricsSource) -> MetricsScrape:
        """One scrape of vLLM's /metrics, kept for the window's custom metrics."""
        scrape = self.scrape(source)
        self.window_scrapes.append(scrape)
        return scrape

    def start(self, target: Deployment) -> Started:
        self.psutil_reader.start(target.processes)
        self.window_scrapes = []
        scrape = self.take(self.metrics) if self.metrics else None
        custom = self.custom.start() if self.custom else {}
        threads, threads_at = self.thread_times(target), self.clock()
        if self.gpu is None:
            return Started(scrape, None, None, None, custom, threads, threads_at)
        # Once a window (the target's PIDs do not change within it), and only for NVML.
        pidmap = PidMap.build(self.procfs, target.pids, host_procfs=self.host_procfs)
        at_start = self.gpu.read(pidmap)  # opens NVML if it is not yet: before the poller
        poller = UtilizationPoller(self.gpu)
        poller.start()
        return Started(scrape, pidmap, at_start, poller, custom, threads, threads_at)

    def finish(
        self,
        started: Started,
        target: Deployment,
        window: Window,
        last: MetricsScrape | None = None,
    ) -> Readings:
        """The readings at the window's end; `last` is a good scrape taken as it ended (the
        last segment's), else /metrics is scraped now."""
        threads_end = self.thread_times(target)  # first: the window's end, not the readers'
        thread_cpu = cpu_over_window(started.threads, threads_end,
                                     self.clock() - started.threads_at)  # fmt: skip
        utilization = started.poller.stop() if started.poller else ()
        gpu_end = self.gpu.read(started.pidmap) if self.gpu else None
        figures = self._gpu_figures(target, gpu_end, utilization)
        readings = Readings(
            process_stats=self.psutil_reader.finish(target.processes, window.duration_s),
            host_memory=self.psutil_reader.host_memory(),
            gpu=gpu_end,
            gpu_figures=figures,
            gpu_util_start=_mean_util(started.gpu, figures),
            serving=self._serving(started.scrape, last),
            custom=self._custom(started),
            thread_cpu=thread_cpu,
        )
        return readings.with_kv_cache(self._kv_cache(target, readings, figures))

    def _custom(self, started: Started) -> tuple[CustomMetric, ...]:
        """The custom metrics; a bug here costs them (each None, with why), never the window."""
        if self.custom is None:
            return ()
        url = self.metrics.url if self.metrics else None
        try:
            return self.custom.finish(started.custom, url, self.window_scrapes,
                                      self.metrics_unread)  # fmt: skip
        except Exception as exc:
            log.warning("custom metrics not read: %s", exc, exc_info=True)
            why = f"not read: {type(exc).__name__}: {exc}"
            return tuple(CustomMetric(name=s.name, kind="mean", value=None, reason=why,
                                      metric=s.metric) for s in self.custom.specs)  # fmt: skip

    def fingerprint(
        self, target: Deployment, window: Window, r: Readings, rules: RuleSet
    ) -> Fingerprint:
        """What the target ran; a failure here costs the fingerprint, never the window."""
        try:
            base = self.fingerprints.get(target, lambda: read_target(
                self.procfs, target, self.gpu.system() if self.gpu else None))  # fmt: skip
            return for_window(base, window.stacks, r.gpu, r.gpu_figures, rules)
        except Exception as exc:  # a bug in reading it must not lose a week of windows
            log.warning("fingerprint not read: %s", exc, exc_info=True)
            return Fingerprint(notes={"fingerprint": f"not read: {type(exc).__name__}: {exc}"})

    def _serving(self, first: MetricsScrape | None, last: MetricsScrape | None) -> ServingFigures:
        if first is not None and self.metrics is not None:
            end = last if last is not None and last.ok else self.take(self.metrics)
            return serving_figures(first, end)
        if self.metrics_unread is not None:
            return ServingFigures(reason=f"metrics not read: {self.metrics_unread}")
        return ServingFigures(reason="vLLM /metrics not read")

    def _gpu_figures(
        self,
        target: Deployment,
        reading: GpuReading | None,
        utilization: tuple[GpuUtilization, ...],
    ) -> GpuFigures | None:
        if reading is None:
            return None
        api = target.api_server
        world = serve_args(api.cmdline).world_size if api else None
        gpus = target_gpus(reading, target.pids, self.procfs.environ, world)
        return gpu_figures(reading, gpus, utilization)

    def _kv_cache(
        self, target: Deployment, r: Readings, figures: GpuFigures | None
    ) -> KvCache | None:
        if r.serving is None or not r.serving.cache_config:
            return None
        gpus = figures.memory_totals if figures else None
        host = r.host_memory.total_bytes if r.host_memory else None
        inputs = kv_inputs(self.procfs, target.api_server, gpus, host)
        return kv_cache(r.serving.cache_config, r.serving.kv_cache_usage, inputs)


@dataclass(frozen=True, slots=True)
class _Mark:
    """The readings at one segment boundary."""

    at: float  # the laps' monotonic clock
    cpu: Mapping[int, float]  # PID -> CPU seconds so far (psutil)
    scrape: MetricsScrape | None


@dataclass
class SegmentLaps:
    """Per segment: CPU seconds per role (psutil) and vLLM's token and request counters
    (/metrics), so a comparison has them per unit. One scrape per segment boundary; a failed
    one leaves that segment's counters out (None), never the window."""

    processes: tuple[ProcessInfo, ...]
    metrics: MetricsSource | None
    scrape: Callable[[MetricsSource], MetricsScrape]
    cpu: Callable[[int], float | None]
    clock: Callable[[], float] = time.monotonic
    first: MetricsScrape | None = None  # taken as the window opened: the first lap's start
    _last: _Mark | None = None
    _lapped: bool = False

    def start(self) -> None:
        self._last = self._read(self.first)

    @property
    def last_scrape(self) -> MetricsScrape | None:
        """The scrape that ended the latest segment (None before the first lap)."""
        return self._last.scrape if self._lapped and self._last is not None else None

    def lap(self) -> LapReading:
        was, now = self._last, self._read()
        if was is None:
            raise RuntimeError("SegmentLaps.lap() before start(): the first lap has no start")
        self._last, self._lapped = now, True
        cpu: dict[Role, float] = {}
        for p in self.processes:
            if p.pid in was.cpu and p.pid in now.cpu:
                cpu[p.role] = cpu.get(p.role, 0.0) + max(now.cpu[p.pid] - was.cpu[p.pid], 0.0)
        span = now.at - was.at
        if was.scrape is None or now.scrape is None:
            return LapReading(span, cpu)
        figures = serving_figures(was.scrape, now.scrape)
        if figures.reason is not None:
            return LapReading(span, cpu)
        return LapReading(span, cpu, generation_tokens=figures.generation_tokens,
                          prompt_tokens=figures.prompt_tokens,
                          requests=figures.requests_finished)  # fmt: skip

    def _read(self, scrape: MetricsScrape | None = None) -> _Mark:
        cpu = {p.pid: t for p in self.processes if (t := self.cpu(p.pid)) is not None}
        if scrape is None and self.metrics is not None:
            scrape = self.scrape(self.metrics)
        return _Mark(self.clock(), cpu, scrape)


def _mean_util(reading: GpuReading | None, figures: GpuFigures | None) -> float | None:
    """Mean utilisation of the target's GPUs (all GPUs when they are unknown) in `reading`."""
    if reading is None or not reading.available:
        return None
    mine = set(figures.target.indexes) if figures else None
    utils = [d.util_gpu_pct for d in reading.devices
             if d.util_gpu_pct is not None and (mine is None or d.index in mine)]  # fmt: skip
    return sum(utils) / len(utils) if utils else None


# ---------------------------------------------------------------------- opening the sources


def metrics_source_for(target: Deployment, url: str | None, timeout_s: float) -> MetricsSource:
    """The configured URL, else the one the API server's command line implies."""
    if url is None:
        api = target.api_server or target.root
        url = metrics_url_from_cmdline(api.cmdline)
    return HttpMetricsSource(url, timeout_s=timeout_s)


def metrics_for(
    target: Deployment, configured: MetricsSource | None, timeout_s: float
) -> tuple[MetricsSource | None, str | None]:
    """The configured /metrics, else the one vLLM's flags imply; or None and why there is
    none (vLLM on a Unix socket, a --port that is no port): the window goes on without it."""
    if configured is not None:
        return configured, None
    try:
        return metrics_source_for(target, None, timeout_s), None
    except MetricsUrlError as exc:
        return None, str(exc)


def open_gpu_reader(enabled: bool = True, api: NvmlApi | None = None) -> NvmlReader | None:
    """An open NVML reader (`api`: pynvml's unless given); on a CPU host it says so once (the
    reader logs why NVML did not start, at info for CPU mode), and the sidecar carries on.
    None: disabled."""
    if not enabled:
        return None
    reader = NvmlReader(api)
    reader.open()
    return reader


def host_procfs(path: Path | None) -> ProcFs | None:
    return ProcFs(path) if path else None
