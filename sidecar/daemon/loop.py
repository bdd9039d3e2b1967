"""`vllm-sidecar run`: windows on a schedule for weeks, through restarts of vLLM.

A failed tick is data, a failed start is fatal (STYLE.md 7), decided once: a bad config, a
missing py-spy, an output folder that cannot be written, no target within the wait at start or
a refused first attach exit non-zero (exit codes in errors.py), so systemd's restart policy
applies. After that nothing one window meets ends the daemon: a vanished target is a gap and a
rediscovery with backoff, a failed reader or write a counted failure (failures.py). Only an
exception no module expected (a bug) ends it: `cli.main` prints its traceback and exits 70.

Everything the daemon touches is injected (parts.py builds the real ones from the config; the
target finder, liveness and the collector default to the real ones), so unit tests drive it
with a fake clock in milliseconds.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import Any

from sidecar import outproc
from sidecar.advice.findings import findings
from sidecar.config.load import load_config
from sidecar.config.settings import Config
from sidecar.daemon.background import AlwaysOn
from sidecar.daemon.failures import (
    WINDOW_KINDS,
    Failure,
    FailureTally,
    WindowFailure,
    classify,
    reading_failures,
)
from sidecar.daemon.notify import SystemdNotifier, watchdog_interval
from sidecar.daemon.parts import (
    WRITE_LOCK,
    Builders,
    HourRun,
    Parts,
    WindowCollector,
    WindowResult,
    build_parts,
    real_collector,
)
from sidecar.daemon.schedule import PlannedWindow, WindowKind
from sidecar.daemon.uptime import backoff
from sidecar.errors import AttachError, SamplerError, SidecarError
from sidecar.exporter import ExporterGroup, ExporterState, start_exporter
from sidecar.target.discovery import AmbiguousTarget, Deployment, configured_target

log = logging.getLogger("vllm_sidecar")
TICK_S = 1.0  # how often a wait wakes: reloads, the watchdog's heartbeat, the target's liveness


class Wake(Enum):
    DUE = "due"  # the deadline came
    STOP = "stop"  # asked to stop
    LOST = "lost"  # the target went away meanwhile
    REPLAN = "replan"  # a reload replaced the schedule


@dataclass(frozen=True, slots=True)
class _Outage:
    since_wall: float
    reason: str


@dataclass
class _Signals:
    """What the signal handlers ask for; read by the loop, which alone acts on them."""

    stop: threading.Event = field(default_factory=threading.Event)
    reload: threading.Event = field(default_factory=threading.Event)
    heartbeat: float = 0.0


class Daemon:
    def __init__(
        self,
        config: Config,
        config_path: Path | None = None,
        flags: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        *,
        wait: Callable[[float], bool] | None = None,
        builders: Builders | None = None,
        find_target: Callable[[], Deployment] | None = None,
        alive: Callable[[Deployment], bool] | None = None,
        make_collector: Callable[[Deployment, bool], WindowCollector] | None = None,
    ) -> None:
        """`wait(timeout)` waits for the stop signal (True when it came); `find_target`,
        `alive` and `make_collector(target, first)` default to the real ones over the parts."""
        self._config_path, self._flags = config_path, dict(flags or {})
        self._environ = dict(os.environ if environ is None else environ)
        self.clock, self.wall = clock, wall_clock
        self.signals = _Signals(heartbeat=clock())
        self._wait = wait or self.signals.stop.wait
        self._builders = builders or Builders()
        self.notifier = SystemdNotifier(self._environ)
        self.state = ExporterState()
        self.failures = FailureTally(self.state.update_failures)
        self.parts = build_parts(config, self._builders, clock, wall_clock)
        self._find = find_target or self._configured_target
        self._alive = alive or self._still_alive
        self._make_collector = make_collector or self._collector
        self.target: Deployment | None = None
        self.restarts = 0
        self._outage: _Outage | None = None
        self._lost: Deployment | None = None  # the deployment last lost, until another is found
        self._had_window = False
        self._hour: HourRun | None = None  # continuous mode: the hour its baseline puts together
        self.always = AlwaysOn(lambda: self.parts, self.state, self.failures, self._keep_in,
                               clock, wall_clock, self.signals.stop)  # fmt: skip

    @property
    def config(self) -> Config:
        return self.parts.config

    # ------------------------------------------------------------------ life

    def run(self) -> int:
        """The daemon as a process: signals, the exporter, the watchdog, then `serve`."""
        self._install_signals()
        exporter = start_exporter(self.config.exporter_listen, self.exported())
        self._start_watchdog()
        outproc.enable()  # Parquet written in a child: pandas and pyarrow never stay loaded
        self.always.start()
        try:
            return self.serve()
        finally:
            self.signals.stop.set()  # ends the watchdog thread
            self.always.close()
            if exporter is not None:
                exporter.close()

    def exported(self) -> ExporterState | ExporterGroup:
        """What the exporter serves: this daemon's one state (a fleet: a group of them)."""
        return self.state

    def serve(self) -> int:
        """Wait for the target, then windows until stopped. Raises only for the start."""
        self.parts.store.cleanup_temp()
        start_uploads(self.parts, self.state)
        try:
            self.target = self._wait_for_target_at_start()
            if self.target is None:
                return 0  # stopped while waiting
            self.parts.schedule.begin()
            self.notifier.ready(f"profiling vLLM pid {self.target.root.pid}")
            while not self.signals.stop.is_set():
                self._step()
            if self._outage is not None:  # a gap ends where the record ends
                self.parts.store.record_gap(self._outage.since_wall, self.wall(),
                                            self._outage.reason)  # fmt: skip
        finally:
            self.notifier.stopping()
            if self.parts.uploads is not None:
                self.parts.uploads.stop()
            if self.parts.gpu is not None:
                self.parts.gpu.close()
        return 0

    def _step(self) -> None:
        if self.target is None and not self._reacquire():
            return
        assert self.target is not None
        schedule = self.parts.schedule
        planned = schedule.plan()
        self.state.update_schedule(planned.start_wall, schedule.lateness_s, schedule.missed)
        wake = self._sleep_until(planned.start, watch=self.target)
        if wake is Wake.LOST:
            self._target_lost("the target is gone")
        elif wake is Wake.DUE:
            self._window(planned)

    # ------------------------------------------------------------------ one window

    def _window(self, planned: PlannedWindow) -> None:
        target, parts = self.target, self.parts
        assert target is not None
        parts.schedule.started(planned)
        hour = self._hour_of(target, planned) if parts.planner is not None else None
        result = self._collect(target, duration_s=planned.duration_s)
        parts.schedule.done(planned)
        if result is not None:
            self._keep(result, planned)
            if hour is not None:
                hour.add(result.snapshot.window)
        # The hour ends with the period that reaches its end (one that ran late, or a first
        # period run on past it, crosses it: the baseline must not wait for an exact match).
        end_wall = planned.start_wall + (planned.duration_s or 0.0)
        if hour is not None and end_wall >= hour.end_wall - 1.0:
            self._baseline()
        if not self._alive(target):
            partial = result.snapshot.window.partial_reason if result else None
            self._target_lost(partial or "the target exited")

    # ------------------------------------------------------------------ continuous hours

    def _hour_of(self, target: Deployment, planned: PlannedWindow) -> HourRun:
        """The hour this continuous period belongs to: a new one at the hour's first period
        or when the target changed (the old target's part of its hour is kept, partial)."""
        if self._hour is not None and self._hour.target is not target:
            self._baseline()
        if self._hour is None:
            every = self.config.schedule.baseline_every_s
            end = (planned.start_wall // every + 1) * every
            self._hour = HourRun(self.parts, target, end)
        return self._hour

    def _baseline(self) -> None:
        """Write the hour's baseline (its periods put together) and start a new hour."""
        hour, self._hour = self._hour, None
        if hour is None:
            return
        try:
            result = hour.finish(self.config.schedule.baseline_every_s)
        except Exception as exc:  # the periods are written: a baseline lost is no lost data
            kind = classify(exc)
            if kind is None:
                log.exception("the hour's baseline was not put together (its periods are "
                              "written; `diff` and `aggregate` read them as a range)")  # fmt: skip
                return
            self.failures.failed(Failure(kind, str(exc) or type(exc).__name__))
            return
        if result is not None:
            start = result.snapshot.window.started_at
            self._keep(result, PlannedWindow(WindowKind.BASELINE, self.clock(), start))

    def _collect(
        self,
        target: Deployment,
        failures: FailureTally | None = None,
        duration_s: float | None = None,
    ) -> WindowResult | None:
        """The window's snapshot, or None when a reader raised: that is counted in `failures`
        (default: the daemon's; a fleet's: the deployment's), unless it is a bug (re-raised)
        or the daemon's very first attach failing on a live target (a failed start: ptrace is
        the host's, not one server's)."""
        first = not self._had_window
        try:
            collector = self._make_collector(target, first)
            seconds = self.config.schedule.window_s if duration_s is None else duration_s
            result = collector.collect(seconds, self._should_stop)
        except Exception as exc:
            kind = classify(exc)
            start_failed = first and isinstance(exc, AttachError | SamplerError)
            if kind is None or (start_failed and self._alive(target)):
                raise
            tally = self.failures if failures is None else failures
            tally.failed(Failure(kind, str(exc) or type(exc).__name__))
            return None
        self._had_window = True
        return result

    def _keep(self, result: WindowResult, planned: PlannedWindow) -> None:
        keep_window(result, planned, self.parts, self.state, self.failures)

    def _keep_in(self, result: WindowResult, planned: PlannedWindow, parts: Parts) -> str | None:
        """A triggered snapshot's write (from the trigger thread)."""
        return keep_window(result, planned, parts, self.state, self.failures)

    def _collector(self, target: Deployment, first: bool) -> WindowCollector:
        def alive() -> bool:
            return self._alive(target)

        return real_collector(self.parts, target, first, alive, self.clock, self.wall)

    # ------------------------------------------------------------------ the target

    def _configured_target(self) -> Deployment:
        return configured_target(self.parts.procfs, self.config.target)

    def _still_alive(self, target: Deployment) -> bool:
        return target.still_alive(self.parts.procfs)

    def _wait_for_target_at_start(self) -> Deployment | None:
        deadline = self.clock() + self.config.target.start_timeout_s
        return backoff(lambda: self._first_target(deadline), self._sleep)

    def _first_target(self, deadline: float) -> Deployment | None:
        """The target, or None to wait on; past `deadline`, the finder's error (exit 4, or 2
        for more than one server) saying how long it waited."""
        try:
            target = self._find()
        except (AttachError, AmbiguousTarget) as exc:
            if isinstance(exc, AmbiguousTarget):
                self.failures.failed(Failure(WindowFailure.DISCOVERY_AMBIGUOUS, str(exc)))
            if self.clock() >= deadline:
                waited = self.config.target.start_timeout_s
                raise type(exc)(f"{exc} (waited {waited:g} s)") from None
            log.info("waiting for the target: %s", exc)
            return None
        self.failures.cleared(WindowFailure.DISCOVERY_AMBIGUOUS)
        self._attached(target)
        return target

    def _target_lost(self, reason: str) -> None:
        if self._outage is None:
            self._outage = _Outage(self.wall(), reason)
            log.warning("target lost (%s): rediscovering with backoff", reason)
            self.parts.store.record_gap(self._outage.since_wall, None, reason)  # open till found
            self.state.update_target(False, self.restarts, self._outage.since_wall)
        self.always.lost()
        if self.target is not None:
            self._lost = self.target
        self.target = None

    def _reacquire(self) -> bool:
        """Rediscover with backoff until found or stopped; the outage is recorded as one gap,
        and the schedule goes on at its next deadline on the grid."""
        target = backoff(self._replacement, self._sleep)
        if target is None:
            return False
        if self._outage is not None:
            self.parts.store.record_gap(self._outage.since_wall, self.wall(), self._outage.reason)
        self._outage, self._lost = None, None
        self.restarts += 1
        self.parts.schedule.skip_until(self.clock())
        self._attached(target)
        return True

    def _replacement(self) -> Deployment | None:
        """A deployment to profile after losing one; None while there is none (yet)."""
        try:
            target = self._find()
        except AmbiguousTarget as exc:  # a redeploy: old and new side by side for a while
            self.failures.failed(Failure(WindowFailure.DISCOVERY_AMBIGUOUS, str(exc)))
            return None
        except AttachError as exc:
            log.debug("still no target: %s", exc)
            return None
        self.failures.cleared(WindowFailure.DISCOVERY_AMBIGUOUS)
        if self._lost is not None and target.is_remnant_of(self._lost):
            log.debug("vLLM %d lost a serving process and is shutting down", target.root.pid)
            return None
        return target

    def _attached(self, target: Deployment) -> None:
        self.target = target
        roles = ", ".join(f"{p.pid} {p.role.value}" for p in target.processes)
        log.info("attached to vLLM deployment %d: %s", target.root.pid, roles)
        self.state.update_target(True, self.restarts, None)
        self.always.attached(target)

    # ------------------------------------------------------------------ signals, waiting

    def _should_stop(self) -> bool:
        self.signals.heartbeat = self.clock()  # the sampler polls this every ~0.2 s
        return self.signals.stop.is_set()

    def _sleep(self, seconds: float) -> bool:
        """Sleep `seconds` (reloads on the way): True when asked to stop meanwhile."""
        return self._sleep_until(self.clock() + seconds) is Wake.STOP

    def _sleep_until(self, deadline: float, watch: Deployment | None = None) -> Wake:
        """Sleep to an absolute deadline; reloads on the way, and wakes early when asked to stop,
        when a reload replaced the schedule, or when `watch` goes away (so an outage's gap
        starts when it did)."""
        while (left := deadline - self.clock()) > 0:
            self.signals.heartbeat = self.clock()
            if self._wait(min(left, TICK_S)):
                return Wake.STOP
            if self.signals.reload.is_set():
                schedule = self.parts.schedule
                self._reload()
                if self.parts.schedule is not schedule:
                    return Wake.REPLAN
            if watch is not None and not self._alive(watch):
                return Wake.LOST
        return Wake.STOP if self.signals.stop.is_set() else Wake.DUE

    def _reload(self) -> None:
        """Every part of the new config is built before any replaces the running one: a reload
        that fails anywhere keeps the whole running configuration and all its parts."""
        self.signals.reload.clear()
        self.notifier.reloading()
        old = self.parts
        try:
            config = load_config(self._config_path, self._environ, self._flags)
            self._check_reload(config)
            new = build_parts(config, self._builders, self.clock, self.wall, previous=old)
        except SidecarError as exc:
            log.error("reload failed, keeping the running configuration: %s", exc)
        else:
            self.parts = new
            if old.gpu is not None and old.gpu is not new.gpu:
                old.gpu.close()
            if new.store is not old.store:
                new.store.cleanup_temp()
            if new.uploads is not old.uploads:
                # The old thread's staging is removed only once it has ended: it may be putting
                # a row staged there (what a thread still busy leaves, the next start removes).
                stopped = old.uploads.stop() if old.uploads is not None else True
                start_uploads(new, self.state, clean_staging=stopped)
            log.info("configuration reloaded from %s", config.source)
            if config.exporter_listen != old.config.exporter_listen:
                log.warning("exporter_listen changed: takes effect at the next restart")
        self.notifier.ready("configuration reloaded")

    def _check_reload(self, config: Config) -> None:
        """What `run` checks beyond load_config, again for a reload (a ConfigError keeps the
        running configuration)."""

    def _install_signals(self) -> None:
        def on_stop(signum: int, frame: FrameType | None) -> None:
            log.info("%s: finishing the current window, then exiting", signal.Signals(signum).name)
            self.signals.stop.set()

        def on_hup(signum: int, frame: FrameType | None) -> None:
            self.signals.reload.set()

        def on_usr1(signum: int, frame: FrameType | None) -> None:
            self.always.signal("SIGUSR1")

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)
        signal.signal(signal.SIGUSR1, on_usr1)

    def _start_watchdog(self) -> None:
        """Ping systemd's watchdog while the main loop shows signs of life."""
        period = watchdog_interval(self._environ)
        if period is None:
            return

        def ping() -> None:
            while not self.signals.stop.wait(period):
                if self.clock() - self.signals.heartbeat < 4 * period:
                    self.notifier.watchdog()

        threading.Thread(target=ping, name="watchdog", daemon=True).start()


def keep_window(
    result: WindowResult,
    planned: PlannedWindow,
    parts: Parts,
    state: ExporterState,
    failures: FailureTally,
) -> str | None:
    """Write a window's snapshot to `parts.store`, settle its failures, tell the exporter;
    the folder written, or None."""
    with WRITE_LOCK:  # the trigger and hang threads write too
        snapshot, store, kind = result.snapshot, parts.store, planned.kind.value
        seen = [*result.failures, *reading_failures(snapshot)]
        outcome = store.write(snapshot, kind)
        if outcome.path is None:
            seen.append(Failure(WindowFailure.WRITE, outcome.skipped_reason or "not written"))
        failures.settle(seen, checked=WINDOW_KINDS)
        if outcome.path is not None and parts.uploads is not None:
            parts.uploads.wake()
        written = str(outcome.path) if outcome.path else None
        summary = snapshot.summary(kind)
        sampling = parts.config.sampling
        budget = sampling.continuous_budget if parts.planner is not None else sampling.cpu_budget
        state.update_snapshot(summary, kind, written, findings(summary, parts.advice),
                              cpu_budget=budget)  # fmt: skip
        state.update_disk(store.disk_state, store.free_bytes, store.total_bytes_used,
                          store.snapshots_written, store.writes_skipped,
                          store.deleted_total)  # fmt: skip
        w = snapshot.window
        if outcome.path is not None:
            log.info("%s written: %s (%d samples%s)", kind, outcome.path, w.samples,
                     f"; partial: {w.partial_reason}" if w.partial else "")  # fmt: skip
        else:  # the store warns once per change of disk state; this is the per-tick detail
            log.debug("%s not written: %s", kind, outcome.skipped_reason)
        return written


def start_uploads(parts: Parts, state: ExporterState, clean_staging: bool = True) -> None:
    """The upload thread (upload.url): its own thread, so that no request to the object
    store can hold up a window's deadline (sidecar/store/upload.py). `clean_staging`: no other
    upload thread runs over the store (UploadThread.start)."""
    if parts.uploads is None:
        state.update_upload(None)
        return
    uploader = parts.uploads.uploader
    uploader.on_change = state.update_upload
    state.update_upload(uploader.status())  # the backlog on disk, before any try
    parts.uploads.start(clean_staging)
