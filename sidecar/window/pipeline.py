"""One window, every stage, in the order they run (`profile_window` reads top to bottom):

    sample     py-spy over the deployment's process tree, in segments   (sampler, pyspy)
    parse      each segment's `record -f raw` text into stacks          (parsers.parse_raw)
    classify   each distinct stack to a role, phase and stage           (classifier)
    aggregate  phase shares per role and main thread, stage counts      (aggregate)
    readings   psutil, NVML, vLLM's /metrics, the KV cache's size,
               the operator's custom metrics                            (WindowReaders)
    fingerprint  what the target ran: read once per target, plus the
               window's attention backend and GPUs                      (fingerprint)
    snapshot   the frozen record of it all                              (snapshot)
    write      the caller's: `writers.write_snapshot` for `snapshot`, the store for `run`,
               which may skip a write on a full disk and counts that

Used by `snapshot` (one window) and `run` (windows on a schedule). A reader that fails leaves
its part of the snapshot empty with a reason; only the sampler's failed start is fatal
(STYLE.md 7).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.classify.classifier import Classifier
from sidecar.classify.groundtruth import cpu_over_window
from sidecar.classify.rules import RuleSet
from sidecar.gpu import (
    GpuFigures,
    GpuReading,
    GpuUtilization,
    NvmlReader,
    UtilizationPoller,
    gpu_figures,
    target_gpus,
)
from sidecar.records import ProcessInfo, Role
from sidecar.records.readings import CustomMetric, KvCache, ServingFigures, ThreadTime
from sidecar.records.summary import Fingerprint
from sidecar.records.window import Window
from sidecar.sampling.sampler import Sampler
from sidecar.target.discovery import Deployment
from sidecar.target.fingerprint import FingerprintCache, for_window, read_target
from sidecar.target.kvcache import kv_cache
from sidecar.target.modelconfig import kv_inputs, serve_args
from sidecar.target.pidmap import PidMap
from sidecar.target.procfs import ProcFs
from sidecar.target.resources import PsutilReader, cpu_time
from sidecar.target.serveflags import deployment_name
from sidecar.vllm_metrics import (
    HttpMetricsSource,
    MetricsScrape,
    MetricsSource,
    metrics_url_from_cmdline,
    serving_figures,
    take_scrape,
)
from sidecar.vllm_metrics.custom import CustomReader
from sidecar.vllm_metrics.endpoint import MetricsUrlError
from sidecar.window.snapshot import Readings, Snapshot, build_snapshot

log = logging.getLogger("vllm_sidecar")


def profile_window(
    target: Deployment,
    sampler: Sampler,
    classifier: Classifier,
    readers: WindowReaders,
    duration_s: float,
    stop: Callable[[], bool] = lambda: False,
    host: str | None = None,
) -> Snapshot:
    """Sample `target` for `duration_s` and turn it into a snapshot, stage by stage."""
    started = readers.start(target)  # CPU times, the first /metrics scrape, the GPUs' start
    # Each segment's CPU per role and vLLM's counters too: the units `diff` compares.
    # The first lap starts from the window's first scrape, and the window's figures end at the
    # last lap's: a segment boundary costs one scrape, the window no extra one.
    laps = SegmentLaps(target.processes, readers.metrics, readers.take, readers.cpu,
                       first=started.scrape)  # fmt: skip
    sampler.laps = laps
    # sample + parse: py-spy records a segment, its raw text is parsed as the segment ends
    # (the text lives in py-spy's temporary file), identical stacks are counted together.
    window = sampler.window(duration_s, stop)
    readings = readers.finish(started, target, window, last=laps.last_scrape)  # the same window
    fingerprint = readers.fingerprint(target, window, readings, classifier.rules)
    # classify -> aggregate -> snapshot (also what recorded windows go through in the tests)
    return build_snapshot(window, target.processes, classifier, host, readings,
                          deployment=deployment_of(target), fingerprint=fingerprint)  # fmt: skip


def deployment_of(target: Deployment) -> str | None:
    """`model@port` from the API server's command line; None without an API server."""
    api = _api_server(target)
    return deployment_name(api.cmdline) if api else None


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
        api = _api_server(target)
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
        inputs = kv_inputs(self.procfs, _api_server(target), gpus, host)
        return kv_cache(r.serving.cache_config, r.serving.kv_cache_usage, inputs)


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
    _last: tuple[float, dict[int, float], MetricsScrape | None] | None = None
    _lapped: bool = False

    def start(self) -> None:
        self._last = self._read(self.first)

    @property
    def last_scrape(self) -> MetricsScrape | None:
        """The scrape that ended the latest segment (None before the first lap)."""
        return self._last[2] if self._lapped and self._last is not None else None

    def lap(self) -> dict[str, float]:
        now = self._read()
        if self._last is None:
            self._last = now
            return {}
        (t0, cpu0, scrape0), (t1, cpu1, scrape1) = self._last, now
        self._last, self._lapped = now, True
        out: dict[str, float] = {"span_s": t1 - t0}
        for p in self.processes:
            if p.pid in cpu0 and p.pid in cpu1:
                key = f"cpu_s.{p.role.value}"
                out[key] = out.get(key, 0.0) + max(cpu1[p.pid] - cpu0[p.pid], 0.0)
        if scrape0 is not None and scrape1 is not None:
            figures = serving_figures(scrape0, scrape1)
            if figures.reason is None:
                for key, value in (("generation_tokens", figures.generation_tokens),
                                   ("prompt_tokens", figures.prompt_tokens),
                                   ("requests", figures.requests_finished)):  # fmt: skip
                    if value is not None:
                        out[key] = value
        return out

    def _read(
        self, scrape: MetricsScrape | None = None
    ) -> tuple[float, dict[int, float], MetricsScrape | None]:
        cpu = {p.pid: t for p in self.processes if (t := self.cpu(p.pid)) is not None}
        if scrape is None and self.metrics is not None:
            scrape = self.scrape(self.metrics)
        return self.clock(), cpu, scrape


def _api_server(target: Deployment) -> ProcessInfo | None:
    return next((p for p in target.processes if p.role is Role.API_SERVER), None)


def _mean_util(reading: GpuReading | None, figures: GpuFigures | None) -> float | None:
    """Mean utilisation of the target's GPUs (all GPUs when they are unknown) in `reading`."""
    if reading is None or not reading.available:
        return None
    mine = set(figures.target.indexes) if figures else None
    utils = [d.util_gpu_pct for d in reading.devices
             if d.util_gpu_pct is not None and (mine is None or d.index in mine)]  # fmt: skip
    return sum(utils) / len(utils) if utils else None


# ---------------------------------------------------------------------------------- wiring


def metrics_source_for(target: Deployment, url: str | None, timeout_s: float) -> MetricsSource:
    """The configured URL, else the one the API server's command line implies."""
    if url is None:
        api = _api_server(target) or target.root
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
