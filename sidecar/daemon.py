"""`vllm-sidecar run`: windows on a schedule for weeks, through restarts of vLLM.

A failed tick is data, a failed start is fatal (STYLE.md 7): a target that vanishes is a gap
in the record and a rediscovery with backoff; a full disk is a skipped write; a bad config,
a missing py-spy or no target at start exit non-zero so systemd's restart policy applies.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from sidecar.classifier import Classifier
from sidecar.collect import Collector, host_procfs, metrics_source_for, open_gpu_reader
from sidecar.config import Config, load_config
from sidecar.discovery import Deployment, configured_target
from sidecar.errors import AttachError, SidecarError
from sidecar.exporter import ExporterState, start_exporter
from sidecar.gpu import NvmlReader
from sidecar.notify import SystemdNotifier, watchdog_interval
from sidecar.procfs import ProcFs
from sidecar.pyspy import SubprocessPySpy
from sidecar.rules import load_rules
from sidecar.sampler import RateController, Sampler
from sidecar.schedule import PlannedWindow, Schedule
from sidecar.store import Retention, SnapshotStore

log = logging.getLogger("vllm_sidecar")
BACKOFF_MAX_S = 30.0


@dataclass
class _Signals:
    """What the signal handlers ask for; read by the loop, which alone acts on them."""

    stop: threading.Event = field(default_factory=threading.Event)
    reload: threading.Event = field(default_factory=threading.Event)
    heartbeat: float = field(default_factory=time.monotonic)


class Daemon:
    def __init__(
        self,
        config: Config,
        config_path: Path | None = None,
        flags: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._config_path, self._flags = config_path, dict(flags or {})
        self._environ = dict(os.environ if environ is None else environ)
        self.clock, self.wall = clock, wall_clock
        self.signals = _Signals()
        self.notifier = SystemdNotifier(self._environ)
        self.state = ExporterState()
        self.target: Deployment | None = None
        self.restarts = 0
        self._down_since: float | None = None
        self._gap_reason = ""
        self._lost: Deployment | None = None  # the deployment last lost, until another is found
        self._had_window = False
        self.gpu: NvmlReader | None = None
        self._build(config)

    # ------------------------------------------------------------------ wiring

    def _build(self, config: Config, previous: Config | None = None) -> None:
        """Everything the config decides; at start, and on SIGHUP what changed (a kept store
        keeps its counters, a kept schedule its deadlines, a kept controller its rate)."""
        self.rules = load_rules()
        self.classifier = Classifier(self.rules)
        self.procfs = ProcFs(config.target.proc_root)
        self.runner = SubprocessPySpy.find(config.sampling.py_spy)
        if previous is None or previous.sampling != config.sampling:
            self.controller = RateController(config.sampling.rate_hz, config.sampling.cpu_budget)
        if previous is None or previous.schedule != config.schedule:
            self.schedule = Schedule(config.schedule, self.clock, self.wall)
        if previous is None or previous.output != config.output:
            self.store = self._store(config)
        if previous is None or previous.gpu != config.gpu:
            if previous is not None and self.gpu is not None:
                self.gpu.close()
            self.gpu = open_gpu_reader(config.gpu)

    def _store(self, config: Config) -> SnapshotStore:
        host = socket.gethostname()
        o = config.output
        return SnapshotStore(
            o.dir,
            host,
            Retention(
                max_age_s=o.retention_days * 86400,
                baseline_max_age_s=o.baseline_retention_days * 86400,
                max_total_bytes=int(o.max_total_mb * 2**20),
                min_free_bytes=int(o.min_free_mb * 2**20),
            ),
        )

    def _install_signals(self) -> None:
        def on_stop(signum: int, frame: FrameType | None) -> None:
            log.info("%s: finishing the current window, then exiting", signal.Signals(signum).name)
            self.signals.stop.set()

        def on_hup(signum: int, frame: FrameType | None) -> None:
            self.signals.reload.set()

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)

    # ------------------------------------------------------------------ main loop

    def run(self) -> int:
        self._install_signals()
        self.store.cleanup_temp()
        exporter = start_exporter(self.config.exporter_listen, self.state)
        watchdog = self._start_watchdog()
        try:
            self.target = self._wait_for_target_at_start()
            if self.target is None:
                return 0  # stopped while waiting
            self.notifier.ready(f"profiling vLLM pid {self.target.root.pid}")
            while not self.signals.stop.is_set():
                self._tick()
                if self.signals.reload.is_set():
                    self._reload()
        finally:
            self.notifier.stopping()
            if exporter is not None:
                exporter.close()
            if self.gpu is not None:
                self.gpu.close()
            if watchdog is not None:
                self.signals.stop.set()
        return 0

    def _tick(self) -> None:
        planned = self.schedule.plan()
        self.state.update_schedule(planned.start_wall, self.schedule.lateness_s,
                                   self.schedule.missed)  # fmt: skip
        if not self._sleep_until(planned.start):
            return
        if self.target is None or not self.target.still_alive(self.procfs):
            self._target_lost("the target is gone")
            if not self._reacquire():
                return
        self._window(planned)

    def _window(self, planned: PlannedWindow) -> None:
        assert self.target is not None
        self.schedule.started(planned)
        snapshot = self._collector(self.target).collect(
            self.config.schedule.window_s, stop=self._should_stop
        )
        self._had_window = True
        outcome = self.store.write(snapshot, planned.kind.value)
        self.schedule.done(planned)
        summary = snapshot.summary_dict()
        self.state.update_snapshot(summary, planned.kind.value,
                                   str(outcome.path) if outcome.path else None)  # fmt: skip
        self._report_store()
        if outcome.path is not None:
            log.info("%s written: %s (%d samples%s)", planned.kind.value, outcome.path,
                     snapshot.window.samples,
                     f"; partial: {snapshot.window.partial_reason}" if snapshot.window.partial
                     else "")  # fmt: skip
        else:  # the store warns once per change of disk state; this is the per-tick detail
            log.debug("%s not written: %s", planned.kind.value, outcome.skipped_reason)
        if snapshot.window.partial and not self.target.still_alive(self.procfs):
            self._target_lost(snapshot.window.partial_reason or "the target exited")

    def _collector(self, target: Deployment) -> Collector:
        sampler = Sampler(
            runner=self.runner,
            pid=target.root.pid,
            controller=self.controller,
            segment_s=min(15.0, self.config.schedule.window_s),
            alive=lambda: target.still_alive(self.procfs),
            fail_fast=not self._had_window,  # only a failed *start* is fatal
        )
        return Collector(
            target=target,
            sampler=sampler,
            classifier=self.classifier,
            procfs=self.procfs,
            metrics=metrics_source_for(
                target, self.config.metrics.url, self.config.metrics.timeout_s
            ),
            gpu=self.gpu,
            host_procfs=host_procfs(self.config.target.host_proc),
        )

    # ------------------------------------------------------------------ target

    def _find_target(self) -> Deployment:
        return configured_target(self.procfs, self.config.target)

    def _wait_for_target_at_start(self) -> Deployment | None:
        deadline = self.clock() + self.config.target.start_timeout_s
        delay = 1.0
        while True:
            try:
                target = self._find_target()
                self._attached(target)
                return target
            except AttachError as exc:
                if self.clock() >= deadline:
                    waited = self.config.target.start_timeout_s
                    raise AttachError(f"{exc} (waited {waited:g} s)") from None
                log.info("waiting for the target: %s", exc)
            if not self._sleep_until(self.clock() + delay):
                return None
            delay = min(delay * 2, BACKOFF_MAX_S)

    def _target_lost(self, reason: str) -> None:
        if self._down_since is None:
            self._down_since = self.wall()
            self._gap_reason = reason
            log.warning("target lost (%s): rediscovering with backoff", reason)
            self.state.update_target(False, self.restarts, self._down_since)
        if self.target is not None:
            self._lost = self.target
        self.target = None

    def _reacquire(self) -> bool:
        """Rediscover with backoff until found or stopped; the outage is recorded as a gap."""
        delay = 1.0
        while not self.signals.stop.is_set():
            target, why = self._replacement()
            if target is None:
                log.debug("still no target: %s", why)
                if not self._sleep_until(self.clock() + delay):
                    return False
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            self._lost = None
            self.restarts += 1
            self.store.record_gap(self._down_since or self.wall(), self.wall(), self._gap_reason)
            self._down_since = None
            self.schedule.skip_until(self.clock())
            self._attached(target)
            return True
        return False

    def _replacement(self) -> tuple[Deployment | None, str]:
        """A deployment to profile after losing one, or why there is none yet."""
        try:
            target = self._find_target()
        except AttachError as exc:
            return None, str(exc)
        if self._lost is not None and target.is_remnant_of(self._lost):
            return None, f"vLLM {target.root.pid} lost a serving process and is shutting down"
        return target, ""

    def _attached(self, target: Deployment) -> None:
        self.target = target
        roles = ", ".join(f"{p.pid} {p.role.value}" for p in target.processes)
        log.info("attached to vLLM deployment %d: %s", target.root.pid, roles)
        self.state.update_target(True, self.restarts, None)

    # ------------------------------------------------------------------ signals, waiting

    def _should_stop(self) -> bool:
        self.signals.heartbeat = self.clock()  # the sampler polls this every ~50 ms
        return self.signals.stop.is_set()

    def _sleep_until(self, deadline: float) -> bool:
        """Sleep to an absolute deadline; False when asked to stop meanwhile."""
        while (left := deadline - self.clock()) > 0:
            self.signals.heartbeat = self.clock()
            if self.signals.stop.wait(min(left, 1.0)):
                return False
            if self.signals.reload.is_set():
                self._reload()
        return not self.signals.stop.is_set()

    def _reload(self) -> None:
        self.signals.reload.clear()
        self.notifier.reloading()
        try:
            config = load_config(self._config_path, self._environ, self._flags)
            listen_changed = config.exporter_listen != self.config.exporter_listen
            self._build(config, previous=self.config)
            self.config = config
            log.info("configuration reloaded from %s", config.source)
            if listen_changed:
                log.warning("exporter_listen changed: takes effect at the next restart")
        except SidecarError as exc:
            log.error("reload failed, keeping the running configuration: %s", exc)
        self.notifier.ready("configuration reloaded")

    def _start_watchdog(self) -> threading.Thread | None:
        """Ping systemd's watchdog while the main loop shows signs of life."""
        period = watchdog_interval(self._environ)
        if period is None:
            return None

        def ping() -> None:
            while not self.signals.stop.wait(period):
                if self.clock() - self.signals.heartbeat < 4 * period:
                    self.notifier.watchdog()

        thread = threading.Thread(target=ping, name="watchdog", daemon=True)
        thread.start()
        return thread

    def _report_store(self) -> None:
        s = self.store
        self.state.update_disk(s.disk_state, s.free_bytes, s.total_bytes_used,
                               s.snapshots_written, s.writes_skipped, s.deleted_total)  # fmt: skip
