"""The daemon's threads beside its windows: the hang watch over the target, the trigger thread
that takes a snapshot per request (SIGUSR1, the control socket, the latency and queue
triggers), and the control socket. The loop tells them when the target is found or lost.

Each thread survives its own failures (logged with the fix, counted as window failures where
one fits); none of them can end the daemon.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from sidecar.daemon.failures import Failure, FailureTally, WindowFailure, classify
from sidecar.daemon.hang import (
    ENGINE_ROLES,
    HangWatch,
    Stall,
    StallJudge,
    Verdict,
    dumps_of,
    held_after_s,
    stall_line,
)
from sidecar.daemon.parts import WRITE_LOCK, Parts, WindowResult, real_collector
from sidecar.daemon.schedule import PlannedWindow
from sidecar.daemon.triggers import (
    ControlSocket,
    LatencyTrigger,
    TriggerQueue,
    TriggerRequest,
    cause_now,
    socket_path,
)
from sidecar.errors import SidecarError
from sidecar.exporter import ExporterState
from sidecar.records.summary import Cause, CauseKind
from sidecar.sampling.sampler import RateController
from sidecar.store.incidents import incident_snapshot, prune_incidents, write_incident
from sidecar.store.layout import SnapshotKind
from sidecar.target.discovery import Deployment
from sidecar.vllm_metrics import MetricsScrape
from sidecar.window.pipeline import deployment_of
from sidecar.window.readers import metrics_for

log = logging.getLogger("vllm_sidecar")
Keep = Callable[[WindowResult, PlannedWindow, Parts], str | None]


class AlwaysOn:
    def __init__(
        self,
        parts: Callable[[], Parts],
        state: ExporterState,
        failures: FailureTally,
        keep: Keep,
        clock: Callable[[], float],
        wall: Callable[[], float],
        stop: threading.Event,
    ) -> None:
        self._parts, self.state, self.failures, self._keep = parts, state, failures, keep
        self.clock, self.wall, self._stop = clock, wall, stop
        self.triggers = TriggerQueue()
        self._target: Deployment | None = None
        self._watch: HangWatch | None = None
        self._latency: LatencyTrigger | None = None
        self._socket: ControlSocket | None = None
        self._thread: threading.Thread | None = None
        self._running = False  # `start` was called: the daemon runs as a process
        self._judging = False  # hang.enabled (the watch may run for the latency trigger alone)

    # ------------------------------------------------------------------ life

    @property
    def running(self) -> bool:
        """`start` was called: the daemon runs as a process (its threads are on)."""
        return self._running

    @property
    def target(self) -> Deployment | None:
        """The deployment watched now (None: none attached)."""
        return self._target

    def start(self, control: bool = True) -> None:
        """The trigger thread, and the control socket unless `control` is off (a fleet's
        deployment: the daemon's socket serves them all). A process: `run`, not `serve`."""
        self._running = True
        if control:
            config = self._parts().config
            path = socket_path(config.trigger.socket, Path(config.output.dir))
            self._socket = ControlSocket(path, self.triggers, config.trigger.window_s + 120)
            self._socket.start()
        self.start_triggers()

    def start_triggers(self) -> None:
        self._thread = threading.Thread(target=self._trigger_loop, name="triggers", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.lost()
        if self._socket is not None:
            self._socket.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def signal(self, name: str) -> None:
        """From a signal handler: a snapshot now (the trigger thread takes it)."""
        self.triggers.put(TriggerRequest(cause_now(CauseKind.SIGNAL, name, self.wall())))

    def attached(self, target: Deployment) -> None:
        """The loop found `target`: watch it."""
        self.lost()
        self._target = target
        if not self._running:
            return
        parts = self._parts()
        c = parts.config
        self._latency = LatencyTrigger(c.trigger)
        metrics, unread = metrics_for(target, parts.metrics, c.metrics.timeout_s)
        if not c.hang.enabled and not self._latency.enabled:
            return
        if metrics is None:
            log.warning("hang detection and the latency trigger are off: vLLM's /metrics "
                        "cannot be read (%s); set metrics.url", unread)  # fmt: skip
            return
        h = c.hang
        self._watch = HangWatch(
            processes=target.processes, metrics=metrics, dump=self._dump(parts),
            procfs=parts.procfs, classifier=parts.classifier,
            judge=StallJudge(h.stack_after_s, h.stall_after_s,
                             held_after_s(parts.procfs, target.processes)),
            check_s=h.check_s,
            on_stall=self._on_stall, on_clear=self._on_clear, on_verdict=self._on_verdict,
            on_scrape=self._on_scrape, clock=self.clock, dumps=h.enabled,
        )  # fmt: skip
        self._judging = h.enabled
        self._watch.start()

    def lost(self) -> None:
        """The target went away (or the daemon stops): no watch, nothing to judge."""
        watch, self._watch, self._target = self._watch, None, None
        if watch is not None:
            watch.close()
            if watch.stall is not None:
                log.warning("%s %d: stall ended with the target gone", watch.stall.role.value,
                            watch.stall.pid)  # fmt: skip
            self.state.update_stall("unknown", {})

    # ------------------------------------------------------------------ the hang watch

    def _on_verdict(self, verdict: Verdict, stall: Stall | None) -> None:
        if not self._judging:
            return
        target = self._target
        roles = {p.role.value for p in target.processes if p.role in ENGINE_ROLES} if target else ()
        stalled = {r: 0.0 for r in roles}
        if stall is not None:
            stalled[stall.role.value] = max(verdict.flat_s, stall.verdict.flat_s)
        self.state.update_stall(verdict.state.value, stalled)

    def _on_stall(self, stall: Stall) -> None:
        if not self._judging:
            return
        log.error("%s", stall_line(stall))
        self.state.count_incident()
        target, parts = self._target, self._parts()
        if target is None:
            return
        cause = cause_now(CauseKind.STALL, stall_line(stall), self.wall())
        try:
            dumps = dumps_of(target.processes, self._dump(parts))
            snapshot = incident_snapshot(dumps, target.processes, parts.classifier, cause,
                                         self.wall(), deployment_of(target))  # fmt: skip
            with WRITE_LOCK:
                path = write_incident(parts.store.dir, snapshot, dumps, target.processes,
                                      int(parts.config.output.min_free_mb * 2**20))  # fmt: skip
                prune_incidents(parts.store.dir,
                                parts.config.output.baseline_retention_days * 86400)  # fmt: skip
        except SidecarError as exc:
            log.error("stall incident not written: %s", exc)
            self.failures.failed(Failure(WindowFailure.WRITE, str(exc)))
            return
        log.error("stall incident written: %s (py-spy dumps of %d processes)", path, len(dumps))

    def _dump(self, parts: Parts) -> Callable[[int, bool], tuple[int, str]]:
        dump = parts.runner.dump
        timeout = parts.config.hang.dump_timeout_s
        return lambda pid, native: dump(pid, timeout, native=native)

    def _on_clear(self, stall: Stall, seconds: float) -> None:
        if self._judging:
            log.warning("%s %d progressing again: the stall is cleared", stall.role.value,
                        stall.pid)  # fmt: skip

    def _on_scrape(self, scrape: MetricsScrape) -> None:
        latency = self._latency
        if latency is None:
            return
        cause = latency.check(scrape)
        if cause is not None:
            log.warning("trigger: %s", cause.detail)
            self.triggers.put(TriggerRequest(cause))

    # ------------------------------------------------------------------ triggered snapshots

    def _trigger_loop(self) -> None:
        while not self._stop.is_set():
            request = self.triggers.get(1.0)
            if request is None:
                continue
            try:
                request.reply(*self.take(request.cause))
            except Exception as exc:  # a bug here costs this snapshot, never the daemon
                log.exception("triggered snapshot failed")
                request.reply((), f"{type(exc).__name__}: {exc}")

    def take(self, cause: Cause) -> tuple[tuple[str, ...], str | None]:
        """One snapshot now, of `trigger.window_s` at `sampling.rate_hz`, marked with its
        cause: ((its folder,), None) or ((), why not)."""
        target, parts = self._target, self._parts()
        if target is None:
            return (), "no vLLM target attached now"
        c = parts.config
        log.info("taking a snapshot on a trigger (%s: %s)", cause.kind, cause.detail)
        controller = RateController(c.sampling.rate_hz, None)
        collector = real_collector(parts, target, False, lambda: True, self.clock, self.wall,
                                   controller=controller)  # fmt: skip
        try:
            result = collector.collect(c.trigger.window_s, self._stop.is_set)
        except Exception as exc:
            if classify(exc) is None:
                raise
            return (), f"not sampled: {exc}"
        snapshot = replace(result.snapshot, cause=cause)
        planned = PlannedWindow(SnapshotKind.SNAPSHOT, self.clock(), snapshot.window.started_at)
        path = self._keep(replace(result, snapshot=snapshot), planned, parts)
        self.state.count_triggered(cause.kind)
        return ((path,), None) if path else ((), "not written (the disk is low: see the log)")


class FleetAlwaysOn(AlwaysOn):
    """A fleet daemon's (`targets:`): SIGUSR1 and the control socket take a snapshot of every
    deployment up, all at once (one thread each: the moment is what an operator asks for),
    and answer with every folder. Each deployment has an `AlwaysOn` of its own (`members`)
    that watches it for stalls and fires its latency triggers."""

    def __init__(self, members: Callable[[], Mapping[str, AlwaysOn]], *args: Any) -> None:
        super().__init__(*args)
        self._members = members

    def take(self, cause: Cause) -> tuple[tuple[str, ...], str | None]:
        """Every deployment's folder, in the deployments' order; ((), why) when none was
        taken, each deployment's reason."""
        up = {name: a for name, a in sorted(self._members().items()) if a.target is not None}
        if not up:
            return (), "no vLLM server of targets: is up now"
        taken: dict[str, tuple[tuple[str, ...], str | None]] = {}

        def one(name: str, member: AlwaysOn) -> None:
            try:
                taken[name] = member.take(cause)
            except Exception as exc:  # a bug costs this deployment's snapshot, not the others'
                log.exception("deployment %s: triggered snapshot failed", name)
                taken[name] = ((), f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=one, args=(name, member), name=f"trigger-{name}")
                   for name, member in up.items()]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # In the deployments' order, not the order their threads ended in.
        folders = tuple(folder for name in up for folder in taken[name][0])
        errors = [f"{name}: {taken[name][1]}" for name in up if not taken[name][0]]
        for line in errors:
            log.warning("triggered snapshot not taken for deployment %s", line)
        if not folders:
            return (), "; ".join(errors)
        return folders, None

    def close(self) -> None:
        super().close()
        for member in self._members().values():
            member.close()
