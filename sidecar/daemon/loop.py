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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.advice.findings import findings
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
from sidecar.daemon.notify import SystemdNotifier
from sidecar.daemon.parts import WRITE_LOCK, Builders, HourRun, Parts, WindowResult
from sidecar.daemon.schedule import PlannedWindow
from sidecar.daemon.shell import HoldsShell, MakeCollector, Shell, Wake, start_uploads
from sidecar.daemon.uptime import Uptime, backoff
from sidecar.errors import AttachError
from sidecar.exporter import ExporterState
from sidecar.store.layout import SnapshotKind
from sidecar.target.discovery import (
    AmbiguousTarget,
    Deployment,
    configured_target,
    deployment_id,
    describe_server,
    servers_found,
)
from sidecar.target.procfs import ProcFs

log = logging.getLogger("vllm_sidecar")


class SeveralServers(Exception):
    """`run --discover` found several vLLM servers at once while its single daemon waited at
    start: `run` starts the fleet daemon instead (choice.py). The message names them."""


@dataclass(frozen=True, slots=True)
class Discovered:
    """How the single daemon of `run --discover` (choice.py) takes several servers.

    `hand_over`: several at its start end it with SeveralServers (nothing attached, nothing
    written), for the fleet to take over. `hint(name)`: how to choose, said in place of
    discovery's own advice (which is to run this very command) once it profiles one server
    (`name`: the one it profiled, None before any). `others(procfs)`: the servers found now;
    one beside the target in two looks in a row, a window apart, is said once."""

    hand_over: bool
    hint: Callable[[str | None], str]
    others: Callable[[ProcFs], list[Deployment]] = field(default=servers_found)


class Daemon(HoldsShell):
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
        make_collector: MakeCollector | None = None,
        discovered: Discovered | None = None,
    ) -> None:
        """`wait(timeout)` waits for the stop signal (True when it came); `find_target`,
        `alive` and `make_collector(target, first)` default to the real ones over the parts.
        `discovered`: the target is discovery's (`run --discover`), see `Discovered`."""
        self.shell = Shell(config, config_path, flags, environ, clock, wall_clock, wait=wait,
                           builders=builders, alive=alive,
                           make_collector=make_collector)  # fmt: skip
        self.clock, self.wall = clock, wall_clock
        self._find = find_target or self._configured_target
        self.target: Deployment | None = None
        self.uptime = Uptime(lambda: self.parts.store, self.state, clock, wall_clock)
        self._hour: HourRun | None = None  # continuous mode: the hour its baseline puts together
        self._discovered = discovered
        self._beside: set[tuple[int, int]] = set()  # other servers at the last look
        self._said: set[tuple[int, int]] = set()  # those said in the log (each once)
        self.always = AlwaysOn(lambda: self.parts, self.state, self.failures, self._keep_in,
                               clock, wall_clock, self.signals.stop)  # fmt: skip

    @property
    def notifier(self) -> SystemdNotifier:
        return self.shell.notifier

    @property
    def restarts(self) -> int:
        return self.uptime.restarts

    # ------------------------------------------------------------------ life

    def run(self) -> int:
        """The daemon as a process: signals, the exporter, the watchdog, then `serve`."""
        return self.shell.run(self.serve, self.state, self.always)

    def serve(self) -> int:
        """Wait for the target, then windows until stopped. Raises only for the start."""
        self.parts.store.cleanup_temp()
        start_uploads(self.parts, self.state)
        handing_over = False
        try:
            self.target = self._wait_for_target_at_start()
            if self.target is None:
                return 0  # stopped while waiting
            self.notifier.ready(f"profiling vLLM pid {self.target.root.pid}")
            while not self.signals.stop.is_set():
                self._step()
            self.uptime.close()
        except SeveralServers:
            handing_over = True  # the process goes on as the fleet daemon: not stopping
            raise
        finally:
            if not handing_over:
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
        wake = self.shell.sleep_until(planned.start, watch=self.target)
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
        result = self.shell.collect(target, parts, self.failures, planned.duration_s)
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
        if not self.shell.alive(target):
            partial = result.snapshot.window.partial_reason if result else None
            self._target_lost(partial or "the target exited")
        else:
            self._look_beside(target)

    def _look_beside(self, target: Deployment) -> None:
        """`run --discover`: say once a server found beside the target in two looks in a row
        (a window apart: a redeploy's old and new server overlap for less), which this daemon
        does not profile, and how to profile it."""
        if self._discovered is None:
            return
        found = {d.root.key: d for d in self._discovered.others(self.parts.procfs)}
        found.pop(target.root.key, None)
        for key in (found.keys() & self._beside) - self._said:
            self._said.add(key)
            log.warning("another vLLM server runs beside pid %d, which this daemon profiles: "
                        "%s is not profiled. %s", target.root.pid, describe_server(found[key]),
                        self._discovered.hint(deployment_id(target).name))  # fmt: skip
        self._beside = set(found)

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
            self._keep(result, PlannedWindow(SnapshotKind.BASELINE, self.clock(), start))

    def _keep(self, result: WindowResult, planned: PlannedWindow) -> None:
        keep_window(result, planned, self.parts, self.state, self.failures)

    def _keep_in(self, result: WindowResult, planned: PlannedWindow, parts: Parts) -> str | None:
        """A triggered snapshot's write (from the trigger thread)."""
        return keep_window(result, planned, parts, self.state, self.failures)

    # ------------------------------------------------------------------ the target

    def _configured_target(self) -> Deployment:
        return configured_target(self.parts.procfs, self.config.target)

    def _wait_for_target_at_start(self) -> Deployment | None:
        deadline = self.clock() + self.config.target.start_timeout_s
        return backoff(lambda: self._first_target(deadline), self.shell.sleep)

    def _first_target(self, deadline: float) -> Deployment | None:
        """The target, or None to wait on; past `deadline`, the finder's error (exit 4, or 2
        for more than one server) saying how long it waited."""
        try:
            target = self._find()
        except (AttachError, AmbiguousTarget) as exc:
            message = str(exc)
            if isinstance(exc, AmbiguousTarget):
                if self._discovered is not None and self._discovered.hand_over:
                    raise SeveralServers(exc.found) from None
                message = self._several(exc, None)
                self.failures.failed(Failure(WindowFailure.DISCOVERY_AMBIGUOUS, message))
            if self.clock() >= deadline:
                waited = self.config.target.start_timeout_s
                raise type(exc)(f"{message} (waited {waited:g} s)") from None
            log.info("waiting for the target: %s", message)
            return None
        self.failures.cleared(WindowFailure.DISCOVERY_AMBIGUOUS)
        self._attached(target)
        return target

    def _several(self, exc: AmbiguousTarget, profiled: str | None) -> str:
        """The message of several servers found: discovery's, or with `run --discover`'s
        hint in place of its advice to run `run --discover`."""
        if self._discovered is None:
            return str(exc)
        return exc.choosing(self._discovered.hint(profiled))

    def _target_lost(self, reason: str) -> None:
        if self.uptime.went(self.target, reason):
            log.warning("target lost (%s): rediscovering with backoff", reason)
        self.always.lost()
        self.target = None

    def _reacquire(self) -> bool:
        """Rediscover with backoff until found or stopped; the outage is recorded as one gap,
        and the schedule goes on at its next deadline on the grid."""
        target = backoff(self._replacement, self.shell.sleep)
        if target is None:
            return False
        self._attached(target)
        return True

    def _replacement(self) -> Deployment | None:
        """A deployment to profile after losing one; None while there is none (yet)."""
        try:
            target = self._find()
        except AmbiguousTarget as exc:  # a redeploy: old and new side by side for a while
            lost = self.uptime.lost
            message = self._several(exc, deployment_id(lost).name if lost else None)
            self.failures.failed(Failure(WindowFailure.DISCOVERY_AMBIGUOUS, message))
            return None
        except AttachError as exc:
            log.debug("still no target: %s", exc)
            return None
        self.failures.cleared(WindowFailure.DISCOVERY_AMBIGUOUS)
        if self.uptime.remnant(target):
            log.debug("vLLM %d lost a serving process and is shutting down", target.root.pid)
            return None
        return target

    def _attached(self, target: Deployment) -> None:
        """The first target starts the schedule; one found after an outage closes its gap,
        counts a restart, and the schedule goes on at its next deadline on the grid."""
        self.target = target
        if self.uptime.found():
            self.parts.schedule.skip_until(self.clock())
        else:
            self.parts.schedule.begin()
        roles = ", ".join(f"{p.pid} {p.role.value}" for p in target.processes)
        log.info("attached to vLLM deployment %d: %s", target.root.pid, roles)
        self.always.attached(target)


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
        snapshot, store, kind = result.snapshot, parts.store, planned.kind
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
