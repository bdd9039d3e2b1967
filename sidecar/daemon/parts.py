"""The daemon's parts: everything its config decides, built whole by `build_parts`, and the
real window collector over them (`real_collector`).

At start a part that cannot be built exits with its code (a bad rules file 2, no py-spy 5, an
output folder that cannot be written 6; any error not the project's own 2, as no restart
fixes it). On SIGHUP every part of the new config is built
before any replaces the running one, so a reload that fails anywhere keeps the whole running
configuration; a part the change does not touch is kept (a kept store keeps its counters, a
kept schedule its deadlines, a kept controller its rate).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from sidecar.advice.rules import AdviceRules, load_advice
from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import RuleSet, load_rules
from sidecar.config.settings import Config, load_named
from sidecar.daemon.failures import Failure, WindowFailure
from sidecar.daemon.schedule import Schedule
from sidecar.errors import ConfigError, SidecarError
from sidecar.gpu import NvmlReader
from sidecar.records.window import Window, merge_windows
from sidecar.sampling.continuous import RolePlanner, is_continuous
from sidecar.sampling.pyspy import PySpyRunner, SubprocessPySpy
from sidecar.sampling.sampler import RateController, Sampler
from sidecar.store.folders import (
    DiskState,
    Retention,
    SnapshotStore,
    StoredSnapshot,
    WriteOutcome,
    check_writable,
    hold_folder,
)
from sidecar.store.layout import SnapshotKind
from sidecar.store.upload import Uploader, UploadThread
from sidecar.target.discovery import Deployment
from sidecar.target.fingerprint import FingerprintCache
from sidecar.target.procfs import ProcFs
from sidecar.vllm_metrics import HttpMetricsSource, MetricsScrape, MetricsSource, take_scrape
from sidecar.window.pipeline import deployment_of, profile_window
from sidecar.window.readers import WindowReaders, open_gpu_reader, readers_for, sampler_for
from sidecar.window.snapshot import Snapshot, build_snapshot

log = logging.getLogger("vllm_sidecar")


class Store(Protocol):
    """What the daemon needs of the snapshot store (store.SnapshotStore)."""

    host: str
    dir: Path
    disk_state: DiskState
    free_bytes: int
    snapshots_written: int
    writes_skipped: int
    deleted_total: int

    @property
    def total_bytes_used(self) -> int: ...
    def write(self, snapshot: Snapshot, kind: SnapshotKind) -> WriteOutcome: ...
    def record_gap(self, start_wall: float, end_wall: float | None, reason: str) -> None: ...
    def cleanup_temp(self) -> tuple[str, ...]: ...
    def snapshots(self) -> tuple[StoredSnapshot, ...]: ...
    def set_hold(self, held: Callable[[str], bool] | None) -> None: ...


# One snapshot written at a time: the daemon's loop, its trigger thread and its hang watch.
WRITE_LOCK = threading.RLock()


@dataclass(frozen=True, slots=True)
class WindowResult:
    snapshot: Snapshot
    failures: tuple[Failure, ...] = ()  # what its readers saw fail, beside the snapshot's own


class WindowCollector(Protocol):
    def collect(self, duration_s: float, stop: Callable[[], bool]) -> WindowResult: ...


def open_store(config: Config) -> SnapshotStore:
    """The store under `output.dir/<host>`; a folder that cannot be written is an OutputError,
    one another daemon writes a ConfigError naming its PID (`hold_folder`, taken before the
    store reads or writes anything there, and kept for the process's life)."""
    o, host = config.output, socket.gethostname()
    check_writable(Path(o.dir) / host)
    hold_folder(Path(o.dir) / host)
    return SnapshotStore(o.dir, host, retention_of(config))


def open_deployment_store(config: Config, deployment: str) -> SnapshotStore:
    """One deployment's store of a fleet daemon, `output.dir/<host>/<deployment>`: a folder
    every reader (trend, diff, report, the uploader) takes as it takes a host folder.
    Retention applies per deployment: `max_total_mb` bounds each deployment's folder."""
    o, host = config.output, socket.gethostname()
    check_writable(Path(o.dir) / host / deployment)
    hold_folder(Path(o.dir) / host)  # the host folder's: one lock for all the deployments
    return SnapshotStore(o.dir, host, retention_of(config), deployment=deployment)


def retention_of(config: Config) -> Retention:
    """`0` days keeps that kind for ever, as most tools read it (issue 26, item 6: it deleted
    every earlier snapshot at each write); the size and free-space guards still apply."""
    o = config.output
    for key, days in (("retention_days", o.retention_days),
                      ("baseline_retention_days", o.baseline_retention_days)):  # fmt: skip
        if days == 0:
            log.warning("output.%s is 0: those snapshots are kept for ever (only output."
                        "max_total_mb and output.min_free_mb delete them)", key)  # fmt: skip
    return Retention(
        max_age_s=o.retention_days * 86400 or None,
        baseline_max_age_s=o.baseline_retention_days * 86400 or None,
        max_total_bytes=int(o.max_total_mb * 2**20),
        min_free_bytes=int(o.min_free_mb * 2**20),
    )


def open_uploader(config: Config, store: Store) -> UploadThread | None:
    """The uploads of `upload.url` over the store's folders; None when it is not set. s3fs is
    imported here, so a daemon that uploads nothing never loads it. Nothing on disk is touched:
    on a reload the running thread may still be staging a row here; the staging a killed
    uploader left is removed when the thread starts (UploadThread.start)."""
    u = config.upload
    if u.url is None:
        return None
    from sidecar.store.objectstore import open_object_store

    remote = open_object_store(u)
    return UploadThread(Uploader(store, remote, u.backoff_s, u.backoff_max_s))


@dataclass(frozen=True, slots=True)
class Builders:
    """How the parts are made; the defaults are the real ones, tests pass fakes."""

    rules: Callable[[Path | None], RuleSet] = load_rules  # the config's `rules`, or built-in
    advice: Callable[[Path | None], AdviceRules] = load_advice  # the config's `advice`, or built-in
    py_spy: Callable[[str | None], PySpyRunner] = SubprocessPySpy.find
    store: Callable[[Config], Store] = open_store
    gpu: Callable[[bool], NvmlReader | None] = open_gpu_reader
    metrics: Callable[[str, float], MetricsSource] = HttpMetricsSource  # a configured URL
    uploads: Callable[[Config, Store], UploadThread | None] = open_uploader
    # A fleet daemon's store of one deployment (sidecar/daemon/multi_target.py):
    # OUT/<host>/<deployment>/.
    deployment_store: Callable[[Config, str], Store] = open_deployment_store


@dataclass(frozen=True, slots=True)
class Parts:
    config: Config
    classifier: Classifier
    procfs: ProcFs
    runner: PySpyRunner
    metrics: MetricsSource | None  # the configured URL; None: the one vLLM's flags imply
    store: Store
    controller: RateController
    schedule: Schedule
    gpu: NvmlReader | None
    advice: AdviceRules  # the findings' rules, for the exporter's finding gauges
    # The target's fingerprint, read once per deployment and kept through reloads.
    fingerprints: FingerprintCache = field(default_factory=FingerprintCache)
    uploads: UploadThread | None = None  # upload.url's; the daemon starts and stops its thread
    planner: RolePlanner | None = None  # continuous mode's rates per process; None: windows


def build_parts(
    config: Config,
    make: Builders,
    clock: Callable[[], float],
    wall_clock: Callable[[], float],
    previous: Parts | None = None,
) -> Parts:
    """All parts of `config`, or a SidecarError before any running part is touched. Any other
    error a part raises (a RecursionError, a MemoryError, a library's ValueError) is a
    ConfigError, its traceback logged: at start the daemon exits 2, which the systemd units do
    not restart, rather than 70 and a restart every 15 s for ever; on SIGHUP the running
    configuration is kept (issue 26, item 12)."""
    try:
        return _build_parts(config, make, clock, wall_clock, previous)
    except SidecarError:
        raise
    except Exception as exc:
        log.error("the parts of %s failed to build", config.source, exc_info=True)
        raise ConfigError(f"{config.source}: the configuration cannot be built "
                          f"({type(exc).__name__}: {exc}); fix what it names, or report the "
                          "traceback logged above if it names no setting") from exc  # fmt: skip


def _build_parts(
    config: Config,
    make: Builders,
    clock: Callable[[], float],
    wall_clock: Callable[[], float],
    previous: Parts | None,
) -> Parts:
    t = config.target
    if t.pid is None and t.pid_file is None and not t.discover:
        raise ConfigError("no target: set target.pid, target.pid_file or target.discover")
    classifier = Classifier(load_named(config, "rules", make.rules))
    advice = load_named(config, "advice", make.advice)
    runner = make.py_spy(config.sampling.py_spy)
    url = config.metrics.url
    metrics = make.metrics(url, config.metrics.timeout_s) if url is not None else None
    kept = _kept(previous, config, "output")
    store = kept.store if kept else make.store(config)
    kept = _kept(previous, config, "upload") if kept else None
    uploads = kept.uploads if kept else make.uploads(config, store)
    # Opened last: nothing after it can fail, so a failed reload leaves no NVML session open.
    kept = _kept(previous, config, "gpu")
    gpu = kept.gpu if kept else make.gpu(config.gpu)
    kept = _kept(previous, config, "sampling")
    s = config.sampling
    controller = kept.controller if kept else RateController(s.rate_hz, s.cpu_budget)
    kept = _kept(previous, config, "schedule")
    continuous = is_continuous(config)
    if kept and kept.schedule.continuous == continuous:
        schedule = kept.schedule
    else:
        schedule = Schedule(config.schedule, clock, wall_clock, continuous=continuous)
    kept = _kept(previous, config, "sampling")
    planner = None
    if continuous:
        planner = kept.planner if kept and kept.planner else RolePlanner(
            s.continuous_budget, s.continuous_min_hz,
            horizon_s=config.schedule.interval_s)  # fmt: skip
    fingerprints = previous.fingerprints if previous else FingerprintCache()
    # Nothing can fail after this point: the hold changes only with the parts that apply it.
    store.set_hold(uploads.uploader.held if uploads else None)
    return Parts(config, classifier, ProcFs(t.proc_root), runner, metrics, store, controller,
                 schedule, gpu, advice, fingerprints, uploads, planner)  # fmt: skip


def _kept(previous: Parts | None, config: Config, section: str) -> Parts | None:
    """The running parts, when `section` of the config is the same in `config`."""
    if previous is not None and getattr(previous.config, section) == getattr(config, section):
        return previous
    return None


# ------------------------------------------------------------------ the real window


def real_collector(
    parts: Parts,
    target: Deployment,
    first: bool,
    alive: Callable[[], bool],
    clock: Callable[[], float],
    wall_clock: Callable[[], float],
    controller: RateController | None = None,
) -> WindowCollector:
    """The real readers over `target`: py-spy, psutil, NVML, vLLM's /metrics. `first`: the
    daemon's first window, whose failed attach is a failed start (the sampler raises).
    `controller`: a window of the windows mode at its rate (a triggered snapshot), whatever
    the configured mode."""
    config = parts.config
    # Continuous: one py-spy per process at the planner's rates.
    planner = parts.planner if controller is None else None
    sampler = sampler_for(config, parts.runner, target, config.schedule.window_s, alive,
                          controller=controller or parts.controller, planner=planner,
                          first=first, clock=clock, wall_clock=wall_clock)  # fmt: skip
    if planner is not None:
        planner.started()
    readers, watch = window_readers(parts, target)
    return _Window(target, sampler, parts.classifier, readers, watch)


def window_readers(parts: Parts, target: Deployment) -> tuple[WindowReaders, _ScrapeWatch]:
    """The readers beside the stacks over `target` (psutil, /proc, NVML, /metrics, custom),
    and the watch that keeps their scrapes' errors."""
    watch = _ScrapeWatch()
    readers = readers_for(parts.config, target, parts.procfs, parts.gpu, parts.metrics,
                          fingerprints=parts.fingerprints, scrape=watch.scrape)  # fmt: skip
    return readers, watch


class _ScrapeWatch:
    """Takes the window's scrapes and keeps what went wrong with them."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def scrape(self, source: MetricsSource) -> MetricsScrape:
        taken = take_scrape(source)
        if taken.error is not None:
            self.errors.append(taken.error)
        return taken


@dataclass(frozen=True, slots=True)
class _Window:
    """The real window: the pipeline's snapshot, with the failures only its readers saw."""

    target: Deployment
    sampler: Sampler
    classifier: Classifier
    readers: WindowReaders
    watch: _ScrapeWatch

    def collect(self, duration_s: float, stop: Callable[[], bool]) -> WindowResult:
        snapshot = profile_window(self.target, self.sampler, self.classifier, self.readers,
                                  duration_s, stop)  # fmt: skip
        return WindowResult(snapshot, reader_failures(self.readers, self.watch))


def reader_failures(readers: WindowReaders, watch: _ScrapeWatch) -> tuple[Failure, ...]:
    """What the readers of a window saw fail beside its snapshot's own."""
    failures = []
    if readers.metrics_unread is not None:
        failures.append(Failure(WindowFailure.METRICS_URL, readers.metrics_unread))
    if watch.errors:
        failures.append(Failure(WindowFailure.METRICS_SCRAPE, watch.errors[-1]))
    return tuple(failures)


class HourRun:
    """A continuous hour's baseline: its periods' windows put together, with the readings
    (CPU per process and thread, /metrics, memory, GPUs, custom metrics) taken over the whole
    hour from its first period's start."""

    def __init__(self, parts: Parts, target: Deployment, end_wall: float) -> None:
        self.target, self.end_wall = target, end_wall
        self._parts = parts
        self._readers, self._watch = window_readers(parts, target)
        self._started = self._readers.start(target)
        self.window: Window | None = None  # the periods so far, merged as they come
        self.periods = 0
        self.covered_s = 0.0  # the periods' wall time (py-spy's attaches and exits inside)

    def add(self, window: Window) -> None:
        """One more period: merged at once, so an hour holds one window's stacks, not twelve
        (`merge_windows` is associative: merging in steps gives the hour's merge)."""
        self.window = window if self.window is None else merge_windows([self.window, window])
        self.periods += 1
        self.covered_s += max(window.elapsed_s, window.duration_s)

    def finish(self, hour_s: float) -> WindowResult | None:
        """The baseline of the periods added; None when there are none. One that covers
        less than 90 % of the hour (attached late, or the target restarted) says so."""
        window, covered = self.window, self.covered_s
        if window is None:
            if self._started.poller is not None:
                self._started.poller.stop()
            return None
        if covered < 0.9 * hour_s and window.partial_reason is None:
            # In seconds for a short hour (tests, compressed schedules): "covers 2 of the
            # hour's 2 min" read as whole when it was 96 of 120 s.
            unit, per = ("s", 1.0) if hour_s < 600 else ("min", 60.0)
            window = replace(window, partial=True, partial_reason=(
                f"covers {covered / per:.0f} of the hour's {hour_s / per:.0f} {unit} "
                "(the sidecar attached, or vLLM restarted, within the hour)"))  # fmt: skip
        readers, target = self._readers, self.target
        readings = readers.finish(self._started, target, window)
        classifier = self._parts.classifier
        fingerprint = readers.fingerprint(target, window, readings, classifier.rules)
        snapshot = build_snapshot(window, target.processes, classifier, None, readings,
                                  deployment=deployment_of(target),
                                  fingerprint=fingerprint)  # fmt: skip
        return WindowResult(snapshot, reader_failures(readers, self._watch))
