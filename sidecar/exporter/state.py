"""What the daemon knows, for the exporter: one frozen `ExporterView`, replaced whole under a
lock by the daemon's loop and read once per scrape on the server's thread, so every value in one
scrape comes from the same state."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from sidecar.advice.findings import Finding
from sidecar.records.summary import SnapshotSummary
from sidecar.store.upload import UploadStatus


@dataclass(frozen=True, slots=True)
class SnapshotMark:
    kind: str
    at: float  # the state's clock (wall seconds) when the daemon handed the snapshot over
    written_path: str | None  # None: not written (disk low, or a dry run)


@dataclass(frozen=True, slots=True)
class TargetState:
    up: bool
    restarts: int
    down_since: float | None  # wall seconds


@dataclass(frozen=True, slots=True)
class DiskState:
    state: str  # "ok" or "low"
    free_bytes: int | None
    used_bytes: int
    written_total: int
    skipped_total: int
    deleted_total: int


@dataclass(frozen=True, slots=True)
class ScheduleState:
    next_deadline_wall: float
    lateness_s: float
    windows_missed: int


@dataclass(frozen=True, slots=True)
class StallState:
    """The hang watch's latest judgement (sidecar/daemon/hang.py)."""

    state: str  # unknown, idle, ok, long_step, stalled
    stalled_s: Mapping[str, float]  # role -> seconds stalled (0 for the engine roles not)


@dataclass(frozen=True, slots=True)
class ExporterView:
    """Everything one scrape reports. Replaced whole, never changed in place."""

    summary: SnapshotSummary | None = None
    findings: tuple[Finding, ...] = ()  # the latest snapshot's (configs/advice.yaml)
    cpu_budget: float | None = None  # the sampler's CPU budget then; None: off (fixed rate)
    root_pid: int | None = None
    samples_total: int = 0
    errors_total: int = 0
    marks: Mapping[str, SnapshotMark] = field(default_factory=dict)
    target: TargetState | None = None
    disk: DiskState | None = None
    schedule: ScheduleState | None = None
    failures: Mapping[str, int] = field(default_factory=dict)  # kind -> count
    upload: UploadStatus | None = None  # None: upload.url is not set
    stall: StallState | None = None  # None: hang detection off or not started
    incidents_total: int = 0
    triggered: Mapping[str, int] = field(default_factory=dict)  # cause kind -> snapshots


class ExporterState:
    """What the daemon knows, updated from its loop and read by scrapes on the server's thread.

    `clock` is wall time (seconds since the epoch), like every timestamp handed in: snapshot
    age is `clock()` at scrape time minus `clock()` when the snapshot was handed over.
    """

    def __init__(
        self,
        host: str | None = None,
        clock: Callable[[], float] = time.time,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """`labels`: what every series of this state carries besides `host`; a fleet daemon
        gives each deployment its `deployment`, `model` and `port`
        (sidecar/daemon/multi_target.py)."""
        self.host = host or socket.gethostname()
        self.clock = clock
        self.labels: dict[str, str] = dict(labels or {})
        # Labels of the per-snapshot series only: the running server's `root_start`, which
        # changes with each restart of vLLM (counters keep `labels` alone, so rate() holds).
        self.instance_labels: dict[str, str] = {}
        self._lock = threading.Lock()
        self._view = ExporterView()

    @property
    def view(self) -> ExporterView:
        return self._view  # one attribute read: a consistent view without the lock

    def update_snapshot(
        self,
        summary: SnapshotSummary,
        kind: str,
        written_path: str | None,
        findings: tuple[Finding, ...] = (),
        cpu_budget: float | None = None,
    ) -> None:
        root_pid = summary.target.root_pid
        mark = SnapshotMark(kind, self.clock(), written_path)
        with self._lock:
            v = self._view
            self._view = replace(
                v,
                summary=summary,
                findings=findings,
                cpu_budget=cpu_budget,
                root_pid=root_pid if root_pid is not None else v.root_pid,
                samples_total=v.samples_total + summary.sampling.samples,
                errors_total=v.errors_total + summary.sampling.errors,
                marks={**v.marks, kind: mark},
            )

    def update_target(self, up: bool, restarts: int, down_since: float | None) -> None:
        with self._lock:
            self._view = replace(self._view, target=TargetState(up, restarts, down_since))

    def update_disk(
        self,
        state: str,
        free_bytes: int | None,
        used_bytes: int,
        written_total: int,
        skipped_total: int,
        deleted_total: int,
    ) -> None:
        disk = DiskState(state, free_bytes, used_bytes, written_total, skipped_total, deleted_total)
        with self._lock:
            self._view = replace(self._view, disk=disk)

    def update_schedule(
        self, next_deadline_wall: float, lateness_s: float, windows_missed: int
    ) -> None:
        schedule = ScheduleState(next_deadline_wall, lateness_s, windows_missed)
        with self._lock:
            self._view = replace(self._view, schedule=schedule)

    def update_stall(self, state: str, stalled_s: Mapping[str, float]) -> None:
        with self._lock:
            self._view = replace(self._view, stall=StallState(state, dict(stalled_s)))

    def count_incident(self) -> None:
        with self._lock:
            self._view = replace(self._view, incidents_total=self._view.incidents_total + 1)

    def count_triggered(self, kind: str) -> None:
        with self._lock:
            v = self._view
            self._view = replace(v, triggered={**v.triggered, kind: v.triggered.get(kind, 0) + 1})

    def update_failures(self, counts: Mapping[str, int]) -> None:
        with self._lock:
            self._view = replace(self._view, failures=dict(counts))

    def clear_snapshot(self) -> None:
        """The deployment went away: its last window's gauges go with it (its counters stay)."""
        with self._lock:
            self._view = replace(self._view, summary=None, findings=(), root_pid=None)

    def update_upload(self, status: UploadStatus | None) -> None:
        """From the upload thread (sidecar/store/upload.py): the lock makes the swap whole."""
        with self._lock:
            self._view = replace(self._view, upload=status)


class ExporterGroup:
    """Several states behind one endpoint: the fleet daemon's, one per deployment, plus the
    daemon's own (discovery failures). Members come and go while scrapes read them."""

    def __init__(self, daemon: ExporterState) -> None:
        self.daemon = daemon
        self.host, self.clock = daemon.host, daemon.clock
        self._members: dict[str, ExporterState] = {}
        self._lock = threading.Lock()

    def add(self, name: str, state: ExporterState) -> None:
        with self._lock:
            self._members = {**self._members, name: state}

    def remove(self, name: str) -> None:
        """Drop a member's series from the endpoint (a deployment gone for good)."""
        with self._lock:
            self._members = {k: v for k, v in self._members.items() if k != name}

    def states(self) -> tuple[ExporterState, ...]:
        members = self._members  # replaced whole: one read is consistent
        return (self.daemon, *(members[name] for name in sorted(members)))
