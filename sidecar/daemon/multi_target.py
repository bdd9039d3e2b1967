"""`vllm-sidecar run` with `targets:`: one daemon, every vLLM server on the host.

Each server is a deployment (`model@port`, discovery.deployment_id) with parts of its own: a
store under OUT/<host>/<deployment>/ (a folder every reader takes as a host folder), a schedule
(its windows and hourly baselines), a rate controller, its own metrics URL (from its --port, or
the entry's metrics_url), its upload thread and its exporter series, labelled `deployment`,
`model`, `port` (and `root_start` on the per-window series). The rules, py-spy, NVML and the
fingerprint cache are shared.

Servers come and go without a restart: the known ones are checked every tick (TICK_S), the
`targets:` entries are rediscovered every `target.rescan_s` (5 s; a full /proc scan, about
0.2 ms of CPU per process on the host, so not every tick). A server that goes away is marked
down (its gap recorded in its own index, `target_up 0`, its window gauges dropped); one found
again under the same name continues its folder, schedule and counters (`target_restarts` + 1);
a new one gets a deployment of its own. One down longer than `target.forget_after_s` (1 h) is
dropped from the exporter, its folder kept, so a server removed for good stops alerting.

The CPU budget is shared by taking windows in turn: the loop runs one window at a time, the
deployment whose deadline comes first, so at most one py-spy runs at any moment, and each
deployment's RateController keeps its py-spy within `sampling.cpu_budget` of one core (its rate
adapted to its own cost, which grows with its process count). The sampler's CPU averaged over
time is then at most the budget, whatever the number of servers. A deadline that falls inside
another deployment's window waits for it (its lateness, in the exporter); one that passes
entirely is a missed window: with N servers, `N x window_s` above `interval_s` misses windows,
and `windows_missed` says so. (So a fleet keeps the windows mode: continuous sampling would run
a py-spy per server at all times.)

Each deployment is watched for stalls and fires its latency and queue triggers as a single
daemon's target is (always_on.py, hang.py: a thread per deployment scraping its /metrics every
`hang.check_s`, dumps only while suspect), with its own `engine_state` and `stalled_seconds`
series and incidents under its own folder. SIGUSR1 and `vllm-sidecar trigger` take a snapshot
of every deployment up, at once, and answer with every folder.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sidecar.config.load import check_fleet_target
from sidecar.config.settings import Config
from sidecar.config.targets import TargetSpec
from sidecar.daemon.background import AlwaysOn, FleetAlwaysOn
from sidecar.daemon.failures import FailureTally
from sidecar.daemon.host_folder import take_for_deployments
from sidecar.daemon.loop import keep_window
from sidecar.daemon.parts import Builders, Parts, Store, WindowResult, build_parts
from sidecar.daemon.schedule import PlannedWindow
from sidecar.daemon.shell import (
    TICK_S,
    HoldsShell,
    MakeCollector,
    Shell,
    Wake,
    start_uploads,
)
from sidecar.daemon.uptime import Uptime, backoff
from sidecar.errors import AttachError, SidecarError
from sidecar.exporter import ExporterGroup, ExporterState
from sidecar.store.folders import DiskState, StoredSnapshot, WriteOutcome, hold_folder
from sidecar.store.layout import SnapshotKind
from sidecar.store.upload import stop_all
from sidecar.target.discovery import Deployment, DeploymentId, deployment_id, find_all

log = logging.getLogger("vllm_sidecar")
RESCAN_S = 5.0  # target.rescan_s's default: a /proc scan costs ~0.2 ms CPU per process
DEPLOYMENT_LABELS = ("deployment", "model", "port")

Found = tuple[list[tuple[Deployment, TargetSpec]], list[str]]


@dataclass
class Member:
    """One deployment of the fleet and what the loop knows of it."""

    id: DeploymentId
    spec: TargetSpec
    parts: Parts
    state: ExporterState
    failures: FailureTally
    uptime: Uptime  # its outages: gaps, `target_up`, restarts (the single daemon's bookkeeping)
    target: Deployment | None = None
    planned: PlannedWindow | None = None
    forgotten: bool = False  # down past target.forget_after_s: not in the exporter
    always: AlwaysOn | None = None  # its hang watch and latency triggers (daemon.py's)

    @property
    def restarts(self) -> int:
        return self.uptime.restarts


class MultiTargetDaemon(HoldsShell):
    """The daemon over every server `config.targets` names; signals, reloads, the watchdog and
    the exporter's endpoint are every daemon's (shell.py), outages each deployment's as the
    single daemon's (uptime.py)."""

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
        find_all_targets: Callable[[], Found] | None = None,
        alive: Callable[[Deployment], bool] | None = None,
        make_collector: MakeCollector | None = None,
        defaults: Config = Config(),  # frozen: one shared instance is safe
    ) -> None:
        """`find_all_targets()`: the deployments the entries name and why some found none
        (default: discovery.find_all over the config's proc_root); `defaults`: what a reload
        reads the file over (Shell's: `run --discover`'s fleet keeps its targets there); the
        rest as Daemon's."""
        make = builders or Builders()
        # The daemon's own parts hold no store and no uploads: each deployment has its own,
        # and an index at OUT/<host>/ would hide the deployment folders from the readers.
        host_only = replace(make, store=_host_only, uploads=lambda config, store: None)
        self.shell = Shell(config, config_path, flags, environ, clock, wall_clock, wait=wait,
                           builders=host_only, alive=alive, make_collector=make_collector,
                           check_reload=check_fleet_target,  # target.pid beside targets: ignored
                           reloaded=self._reload_members, defaults=defaults)  # fmt: skip
        self.clock, self.wall = clock, wall_clock
        self._member_builders = make
        self._find_all = find_all_targets or self._configured_targets
        self._targets = config.targets
        self.state.labels = dict.fromkeys(DEPLOYMENT_LABELS, "")  # the same names as members'
        self.group = ExporterGroup(self.state)
        self.members: dict[str, Member] = {}
        self._by_root: dict[tuple[int, int], str] = {}  # a running server's root -> its member
        self._next_scan = self.clock()
        # SIGUSR1 and the control socket: a snapshot of every deployment up, at once.
        self.always = FleetAlwaysOn(
            lambda: {n: m.always for n, m in self.members.items() if m.always is not None},
            lambda: self.parts, self.state, self.failures, self._keep_in, self.clock,
            self.wall, self.signals.stop,
        )  # fmt: skip

    # ------------------------------------------------------------------ life

    def run(self) -> int:
        """The daemon as a process: signals, the exporter (every deployment's series), the
        watchdog, then `serve`."""
        hold_folder(self.parts.store.dir)  # Shell.run's lock (taken once), before anything in it
        take_for_deployments(self.parts.store.dir)
        return self.shell.run(self.serve, self.group, self.always)

    def serve(self) -> int:
        try:
            if not self._wait_for_any_at_start():
                return 0  # stopped while waiting
            up = [m.id.name for m in self.members.values() if m.target is not None]
            self.shell.notifier.ready(f"profiling {len(up)} vLLM servers: {', '.join(up)}")
            while not self.signals.stop.is_set():
                self._step()
            for m in self.members.values():
                m.uptime.close()
        finally:
            self.shell.notifier.stopping()
            # All asked to stop, then one bounded wait: not N waits in turn.
            stop_all(
                (m.parts.uploads for m in self.members.values() if m.parts.uploads),
                clock=self.clock,
            )
            if self.parts.gpu is not None:
                self.parts.gpu.close()
        return 0

    def _step(self) -> None:
        # Liveness first: a server that exited and was restarted while the loop sat in another
        # deployment's window must be seen down before the rescan finds its successor, or the
        # successor is attached as if nothing happened (no gap, no restart counted).
        self._check_alive()
        if self.clock() >= self._next_scan:
            self._rescan()
        member = self._next_member()
        until = self._next_scan if member is None else min(self._next_planned(member),
                                                           self._next_scan)  # fmt: skip
        wake = self.shell.sleep_until(min(until, self.clock() + TICK_S))
        if wake is Wake.REPLAN:
            self._replan()
        elif wake is Wake.DUE and member is not None and member.target is not None:
            assert member.planned is not None
            if self.clock() >= member.planned.start:
                self._member_window(member, member.planned)

    def _wait_for_any_at_start(self) -> bool:
        """Rediscover with backoff until a server is found: False when stopped meanwhile; an
        AttachError naming every entry after `target.start_timeout_s` (exit 4)."""
        deadline = self.clock() + self.config.target.start_timeout_s
        return backoff(lambda: self._any_up(deadline), self.shell.sleep) is not None

    def _any_up(self, deadline: float) -> bool | None:
        """True once a server is up; None to wait on; past `deadline` an AttachError."""
        missing = self._rescan()
        if any(m.target is not None for m in self.members.values()):
            return True
        if self.clock() >= deadline:
            why = "; ".join(missing) or "no vLLM server found"
            timeout = self.config.target.start_timeout_s
            raise AttachError(f"no vLLM server of targets: {why} (waited {timeout:g} s)")
        log.info("waiting for a vLLM server: %s", "; ".join(missing) or "none found")
        return None

    # ------------------------------------------------------------------ who is there

    def _configured_targets(self) -> Found:
        targets = self.config.targets or self._targets  # a reload cannot turn the fleet off
        return find_all(self.parts.procfs, targets, self.config.target.any_python)

    def _rescan(self) -> list[str]:
        """Rediscover: new servers get a deployment, returning ones come up again."""
        self._next_scan = self.clock() + self.config.target.rescan_s
        found, missing = self._find_all()
        for line in missing:
            log.debug("targets: %s", line)
        for target, spec in found:
            if target.root.key not in self._by_root:
                self._found(target, spec)
        return missing

    def _found(self, target: Deployment, spec: TargetSpec) -> None:
        ident = deployment_id(target)
        m = self.members.get(ident.name)
        if m is not None and m.target is not None and self.shell.alive(m.target):
            # Another live server of the same name (model@port in another network namespace):
            # a deployment of its own, named by its root PID.
            ident = replace(ident, name=f"{ident.name}-{target.root.pid}")
            m = self.members.get(ident.name)
        if m is not None and m.uptime.remnant(target):
            log.debug("vLLM %d lost a serving process and is shutting down", target.root.pid)
            return
        if m is None:
            m = self._new_member(ident, spec)
            if m is None:
                return
        self._attach(m, target, ident)

    def _new_member(self, ident: DeploymentId, spec: TargetSpec) -> Member | None:
        labels = {"deployment": ident.name, "model": ident.model, "port": ident.port}
        state = ExporterState(self.state.host, self.state.clock, labels)
        try:
            parts = self._member_parts(ident.name, spec, None)
        except SidecarError as exc:
            if not self.members:
                raise  # at start (an output folder that cannot be written, exit 6): fatal
            log.error("cannot profile deployment %s: %s", ident.name, exc)  # the others go on
            return None

        def store() -> Store:  # the member's, as a reload leaves it
            return m.parts.store

        uptime = Uptime(store, state, self.clock, self.wall)
        m = Member(ident, spec, parts, state, FailureTally(state.update_failures), uptime)

        def keep(result: WindowResult, planned: PlannedWindow, parts: Parts) -> str | None:
            return keep_window(result, planned, parts, m.state, m.failures)

        m.always = AlwaysOn(lambda: m.parts, state, m.failures, keep, self.clock, self.wall,
                            self.signals.stop)  # fmt: skip
        if self.always.running:  # the daemon runs as a process: its threads, no socket
            m.always.start(control=False)
        parts.store.cleanup_temp()
        start_uploads(parts, state)
        self.members[ident.name] = m
        self.group.add(ident.name, state)
        return m

    def _member_parts(self, name: str, spec: TargetSpec, previous: Parts | None) -> Parts:
        """The daemon's parts with this deployment's store, uploads, schedule and controller;
        the GPU reader is the daemon's (one NVML session for all)."""
        make = replace(self._member_builders,
                       store=lambda config: self._member_builders.deployment_store(config, name),
                       gpu=lambda enabled: self.parts.gpu)  # fmt: skip
        parts = build_parts(self.config, make, self.clock, self.wall, previous=previous)
        if spec.metrics_url is not None:
            url, timeout = spec.metrics_url, self.config.metrics.timeout_s
            parts = replace(parts, metrics=make.metrics(url, timeout))
        return parts

    def _attach(self, m: Member, target: Deployment, ident: DeploymentId) -> None:
        """Its first server starts its schedule; one found after an outage closes its gap,
        counts a restart, and its schedule goes on at its next deadline on the grid."""
        m.target, m.id, m.planned = target, ident, None
        if m.uptime.found():
            m.parts.schedule.skip_until(self.clock())
        else:
            m.parts.schedule.begin()
        if m.forgotten:  # back after being dropped: its series (and counters) again
            m.forgotten = False
            self.group.add(m.id.name, m.state)
        self._by_root[target.root.key] = m.id.name
        m.state.instance_labels = {"root_start": str(target.root.start_time)}
        roles = ", ".join(f"{p.pid} {p.role.value}" for p in target.processes)
        log.info("deployment %s: attached to vLLM %d: %s", m.id.name, target.root.pid, roles)
        if m.always is not None:
            m.always.attached(target)

    def _check_alive(self) -> None:
        for m in self.members.values():
            if m.target is not None and not self.shell.alive(m.target):
                self._down(m, "the target is gone")
        self._forget_long_down()

    def _forget_long_down(self) -> None:
        """Drop from the exporter the deployments down longer than target.forget_after_s: a
        server removed for good stops showing `target_up 0` (and firing VllmTargetDown). Its
        folder, index (the gap stays open) and upload backlog are kept, and so is its member:
        found again, it is exported again with its counters."""
        after = self.config.target.forget_after_s
        if after is None:
            return
        for m in self.members.values():
            if (
                m.uptime.since_clock is not None
                and not m.forgotten
                and self.clock() - m.uptime.since_clock >= after
            ):
                m.forgotten = True
                self.group.remove(m.id.name)
                log.info("deployment %s: down for %g s (target.forget_after_s): its series are "
                         "no longer exported; its folder is kept", m.id.name, after)  # fmt: skip

    def _down(self, m: Member, reason: str) -> None:
        assert m.target is not None
        if m.always is not None:
            m.always.lost()
        self._by_root.pop(m.target.root.key, None)
        m.uptime.went(m.target, reason)
        m.target, m.planned = None, None
        m.state.clear_snapshot()
        log.warning("deployment %s: target lost (%s); rediscovering every %g s",
                    m.id.name, reason, self.config.target.rescan_s)  # fmt: skip
        self._next_scan = min(self._next_scan, self.clock() + 1.0)  # a redeploy: look soon

    # ------------------------------------------------------------------ windows in turn

    def _next_member(self) -> Member | None:
        """The running deployment whose next window comes first."""
        up = [m for m in self.members.values() if m.target is not None]
        return min(up, key=self._next_planned, default=None)

    def _next_planned(self, m: Member) -> float:
        if m.planned is None:  # planned once per window: the jitter is drawn once
            schedule = m.parts.schedule
            m.planned = schedule.plan()
            m.state.update_schedule(m.planned.start_wall, schedule.lateness_s, schedule.missed)
        return m.planned.start

    def _member_window(self, m: Member, planned: PlannedWindow) -> None:
        target, schedule = m.target, m.parts.schedule
        assert target is not None
        schedule.started(planned)
        m.state.update_schedule(planned.start_wall, schedule.lateness_s, schedule.missed)
        result = self.shell.collect(target, m.parts, m.failures)
        schedule.done(planned)
        m.planned = None
        self._next_planned(m)  # the exporter's next deadline and missed count, at once
        if result is not None:
            keep_window(result, planned, m.parts, m.state, m.failures)
        if not self.shell.alive(target):
            partial = result.snapshot.window.partial_reason if result else None
            self._down(m, partial or "the target exited")

    def _keep_in(self, result: WindowResult, planned: PlannedWindow, parts: Parts) -> str | None:
        """The write of a snapshot the daemon's own trigger thread took (FleetAlwaysOn takes
        each deployment's through that deployment's AlwaysOn, which writes to its store)."""
        return keep_window(result, planned, parts, self.state, self.failures)

    # ------------------------------------------------------------------ reloads

    def _reload_members(self) -> None:
        """After the daemon's parts were reloaded (all or nothing, shell.py): each deployment's
        over the new config; a deployment keeps the parts whose section did not change."""
        if not self.config.targets:
            log.warning("targets: removed from the config: takes effect at the next restart")
        rebuilt: list[tuple[Member, Parts]] = []
        for m in self.members.values():
            try:
                rebuilt.append((m, self._member_parts(m.id.name, m.spec, m.parts)))
            except SidecarError as exc:
                log.error("deployment %s keeps its parts: %s", m.id.name, exc)
        # The replaced upload threads stop together (one bounded wait), before any new starts;
        # a deployment's staging is removed only once its old thread has ended.
        replaced = [m.parts.uploads for m, parts in rebuilt if parts.uploads is not m.parts.uploads]
        busy = stop_all((u for u in replaced if u is not None), clock=self.clock)
        for m, parts in rebuilt:
            if parts.uploads is not m.parts.uploads:
                start_uploads(parts, m.state, clean_staging=m.parts.uploads not in busy)
            if parts.schedule is not m.parts.schedule and m.target is not None:
                parts.schedule.begin()
            m.parts = parts

    def _replan(self) -> None:
        for m in self.members.values():
            m.planned = None


def _host_only(config: Config) -> Store:
    """The fleet daemon's own `store`: it writes nothing; each deployment has a store."""
    return _NoStore(Path(config.output.dir) / socket.gethostname())


class _NoStore:
    """A Store that holds nothing: the fleet's snapshots go to each deployment's store."""

    disk_state = DiskState.OK
    free_bytes = snapshots_written = writes_skipped = deleted_total = total_bytes_used = 0

    def __init__(self, folder: Path) -> None:
        self.host, self.dir = folder.name, folder

    def write(self, snapshot: Any, kind: SnapshotKind) -> WriteOutcome:
        raise AssertionError("the fleet daemon writes to its deployments' stores")

    def record_gap(self, start_wall: float, end_wall: float | None, reason: str) -> None:
        pass

    def cleanup_temp(self) -> tuple[str, ...]:
        return ()

    def snapshots(self) -> tuple[StoredSnapshot, ...]:
        return ()

    def set_hold(self, held: Callable[[str], bool] | None) -> None:
        pass
