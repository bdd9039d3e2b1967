"""The daemon driven through its seams with a fake clock: outages and gaps, remnants, backoff,
reloads, a full disk, the schedule and per-window failures, each in milliseconds.

The target finder, liveness, the collector, the store and the wait are fakes; the loop, the
schedule, the failure tally, the exporter state and (where a test says so) the real collector
wiring are the daemon's own. No processes, no sockets, no real sleep.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from sidecar import cli as cli_module
from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import RuleSet, load_rules
from sidecar.config.load import load_config
from sidecar.config.settings import Config, MetricsConfig, SamplingConfig, ScheduleConfig
from sidecar.daemon.failures import Failure, FailureTally, WindowFailure, reading_failures
from sidecar.daemon.loop import Daemon
from sidecar.daemon.parts import Builders, WindowResult
from sidecar.errors import AttachError, ConfigError, SamplerError
from sidecar.exporter import SidecarCollector
from sidecar.gpu import GpuReading
from sidecar.gpu.nvml import NvmlError, NvmlReturn
from sidecar.records import ProcessInfo, Role
from sidecar.records.gpu import CPU_MODE, GpuMode
from sidecar.records.window import SamplingMode, Window
from sidecar.sampling.pyspy import RecordOutcome, RecordRequest, SubprocessPySpy
from sidecar.store.folders import DiskState, WriteOutcome, check_writable
from sidecar.store.layout import SnapshotKind
from sidecar.target.discovery import AmbiguousTarget, Deployment
from sidecar.vllm_metrics.endpoint import MetricsUrlError
from sidecar.window.snapshot import Readings, Snapshot, build_snapshot

T0 = 1000.0  # the fake monotonic clock at start
WALL0 = 1_780_000_000.0  # the wall clock then; the next daily baseline is 12,800 s away
WINDOW, INTERVAL = 10.0, 60.0
SCHEDULE = ScheduleConfig(window_s=WINDOW, interval_s=INTERVAL, baseline_every_s=86400.0)
# The windows mode's schedule (continuous mode: test_continuous.py).
CONFIG = Config(schedule=SCHEDULE, sampling=SamplingConfig(mode=SamplingMode.WINDOWS), exporter_listen="off",
                gpu=False)  # fmt: skip


@cache
def rules(path: Path | None = None) -> RuleSet:
    return load_rules(path)


def iso(mono: float) -> str:
    return datetime.fromtimestamp(mono - T0 + WALL0, tz=UTC).isoformat(timespec="seconds")


class FakeTime:
    """A monotonic and a wall clock that move only when told, firing events on the way."""

    def __init__(self) -> None:
        self.now = T0
        self._events: list[tuple[float, int, Callable[[], object]]] = []
        self._seq = itertools.count()

    def clock(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now - T0 + WALL0

    def at(self, when: float, action: Callable[[], object]) -> None:
        heapq.heappush(self._events, (when, next(self._seq), action))

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while self._events and self._events[0][0] <= end:
            when, _, action = heapq.heappop(self._events)
            self.now = max(self.now, when)
            action()
        self.now = end


def deployment(root: int, *, engine: bool = True, api: tuple[str, ...] = ()) -> Deployment:
    """An API server `root` and its EngineCore `root + 1`; PIDs that no process has here."""
    cmdline = ("vllm", "serve", "m", *api)
    server = ProcessInfo(root + 2**22, root, 1, cmdline, " ".join(cmdline), Role.API_SERVER)
    core = ProcessInfo(root + 2**22 + 1, root + 1, server.pid, (), "VLLM::EngineCore",
                       Role.ENGINE_CORE)  # fmt: skip
    return Deployment(server, (server, core) if engine else (server,))


class FakeStore:
    """The store as the daemon uses it; `full` makes writes skip, as a nearly full disk does."""

    def __init__(self) -> None:
        self.disk_state = DiskState.OK
        self.free_bytes = 1 << 30
        self.total_bytes_used = 0
        self.snapshots_written = self.writes_skipped = self.deleted_total = 0
        self.full = False
        self.written: list[Snapshot] = []
        self.gaps: list[dict[str, str | None]] = []

    def write(self, snapshot: Snapshot, kind: SnapshotKind) -> WriteOutcome:
        if self.full:
            self.writes_skipped += 1
            self.disk_state = DiskState.LOW
            return WriteOutcome(None, "disk nearly full: 1 MiB free")
        self.snapshots_written += 1
        self.disk_state = DiskState.OK
        self.written.append(snapshot)
        return WriteOutcome(Path("/out") / snapshot.name)

    def record_gap(self, start_wall: float, end_wall: float | None, reason: str) -> None:
        """As SnapshotStore.record_gap: a gap left open is closed by the next with its start."""
        gap = {"from": _iso(start_wall), "to": _iso(end_wall) if end_wall else None,
               "reason": reason}  # fmt: skip
        if self.gaps and self.gaps[-1]["from"] == gap["from"] and self.gaps[-1]["to"] is None:
            self.gaps[-1] = gap
        else:
            self.gaps.append(gap)

    def cleanup_temp(self) -> tuple[str, ...]:
        return ()

    def set_hold(self, held: Callable[[str], bool] | None) -> None:
        self.held = held  # what the uploads hold back from retention (upload.url)


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, tz=UTC).isoformat(timespec="seconds")


@dataclass
class Seen:
    start: float
    root: int  # the deployment's root start time: which server the window profiled
    lateness: float | None  # what the exporter said of the schedule when the window began


class World:
    """vLLM as the daemon sees it, and the windows it ran."""

    def __init__(self) -> None:
        self.time = FakeTime()
        self.found: Deployment | Exception = AttachError("no vLLM server found")
        self.running: set[tuple[int, int]] = set()
        self.finds: list[float] = []
        self.windows: list[Seen] = []
        self.raise_in: dict[int, BaseException] = {}  # window number (from 1) -> raised there
        self.sampler_failure: str | None = None
        self.daemon: Daemon | None = None

    def start(self, d: Deployment) -> None:
        self.running |= {p.key for p in d.processes}
        self.found = d

    def kill(self, *processes: ProcessInfo) -> None:
        self.running -= {p.key for p in processes}

    def find(self) -> Deployment:
        self.finds.append(self.time.now)
        if isinstance(self.found, Exception):
            raise self.found
        return self.found

    def alive(self, d: Deployment) -> bool:
        return all(p.key in self.running for p in d.serving)

    def collector(self, target: Deployment, first: bool) -> FakeCollector:
        return FakeCollector(self, target)

    def wait(self, timeout: float) -> bool:
        self.time.advance(timeout)
        assert self.daemon is not None
        return self.daemon.signals.stop.is_set()

    def stop_at(self, when: float) -> None:
        assert self.daemon is not None
        self.time.at(when, self.daemon.signals.stop.set)

    def starts(self) -> list[float]:
        return [w.start for w in self.windows]


@dataclass
class FakeCollector:
    world: World
    target: Deployment

    def collect(self, duration_s: float, stop: Callable[[], bool]) -> WindowResult:
        w = self.world
        assert w.daemon is not None
        schedule = w.daemon.state.view.schedule
        w.windows.append(Seen(w.time.now, self.target.root.start_time,
                              schedule.lateness_s if schedule else None))  # fmt: skip
        wall = w.time.wall()
        w.time.advance(duration_s)
        if (error := w.raise_in.get(len(w.windows))) is not None:
            raise error  # at the window's end, as py-spy's exit or a last reading would
        window = Window(started_at=wall, duration_s=duration_s, rate_hz=5.0, stacks=(),
                        samples=10, errors=0, sampler_cpu_s=0.01, segments=1,
                        sampler_failure=w.sampler_failure)  # fmt: skip
        return WindowResult(build_snapshot(window, self.target.processes, Classifier(rules())))


def builders(fake_store: FakeStore, **overrides: Any) -> Builders:
    fields: dict[str, Any] = {
        "rules": rules,
        # the real lookup, of a file that exists and is executable: no process is started
        "py_spy": lambda path: SubprocessPySpy.find(path or sys.executable),
        "store": lambda config: fake_store,
        "gpu": lambda enabled: None,
    }
    return Builders(**(fields | overrides))


def make_daemon(
    world: World,
    config: Config = CONFIG,
    store: FakeStore | None = None,
    fake_collector: bool = True,
    **kw: Any,
) -> tuple[Daemon, FakeStore]:
    store = store or FakeStore()
    d = Daemon(
        config,
        environ={},
        clock=world.time.clock,
        wall_clock=world.time.wall,
        wait=world.wait,
        builders=kw.pop("builders", None) or builders(store),
        find_target=world.find,
        alive=world.alive,
        make_collector=world.collector if fake_collector else None,
        **kw,
    )
    world.daemon = d
    return d, store


def grid(*steps: int, start: float = T0) -> list[float]:
    return [start + INTERVAL * k for k in steps]


# ---------------------------------------------------------------- the schedule, the start


def test_windows_run_on_the_grid_and_are_written() -> None:
    world = World()
    world.start(deployment(100))
    d, store = make_daemon(world)
    world.stop_at(T0 + 4 * INTERVAL + 30)
    assert d.serve() == 0
    assert world.starts() == grid(0, 1, 2, 3, 4)
    assert len(store.written) == 5 and all(w.lateness == 0 for w in world.windows[1:])
    # The exporter has the latest window's findings (configs/advice.yaml), counted by severity.
    families = {m.name: m for m in SidecarCollector(d.state).collect()}
    counts = {s.labels["severity"]: s.value for s in families["vllm_sidecar_findings"].samples}
    assert set(counts) == {"critical", "warning", "info"}
    assert sum(counts.values()) == len(d.state.view.findings)


def test_the_wait_at_start_makes_no_window_late_and_backs_off() -> None:
    """vLLM up 100 s after the sidecar: the first window starts when it is found, not late by
    the wait (the schedule was made before the wait and thought its first deadline passed)."""
    world = World()
    d, _ = make_daemon(world)
    world.time.at(T0 + 100, lambda: world.start(deployment(100)))
    world.stop_at(T0 + 250)
    d.serve()
    assert [f - T0 for f in world.finds] == [0, 1, 3, 7, 15, 31, 61, 91, 121]
    assert world.starts() == grid(0, 1, 2, start=T0 + 121)
    assert d.parts.schedule.lateness_s == 0 and d.parts.schedule.missed == 0


@pytest.mark.parametrize(
    ("found", "error", "code"),
    [
        (AttachError("no vLLM server found"), AttachError, 4),
        (AmbiguousTarget("found 2 vLLM servers. Pick one with --pid."), AmbiguousTarget, 2),
    ],
)
def test_no_single_target_within_the_wait_at_start_exits(
    found: Exception, error: type[Exception], code: int
) -> None:
    world = World()
    world.found = found
    d, _ = make_daemon(world)
    with pytest.raises(error, match=r"\(waited 120 s\)") as raised:
        d.serve()
    assert raised.value.exit_code == code  # type: ignore[attr-defined]
    assert world.time.now - T0 == pytest.approx(121)


# ---------------------------------------------------------------- outages


def lose_and_replace(world: World, lost_at: float, back_at: float) -> Deployment:
    first, second = deployment(100), deployment(200)
    world.start(first)
    world.time.at(lost_at, lambda: (world.kill(*first.processes),
                                    setattr(world, "found", AttachError("none"))))  # fmt: skip
    world.time.at(back_at, lambda: world.start(second))
    return second


def test_an_outage_is_one_gap_and_the_schedule_stays_on_the_grid() -> None:
    world = World()
    lose_and_replace(world, lost_at=T0 + 75, back_at=T0 + 300)
    d, store = make_daemon(world)
    world.stop_at(T0 + 500)
    d.serve()
    # found again at +316 (backoff); the windows at +120 ... +300 were missed, and the next is
    # the grid's +360, not +316 (the old daemon ran the stale +120 window then, 196 s "late").
    assert world.starts() == grid(0, 1, 6, 7, 8)
    assert [w.root for w in world.windows] == [100, 100, 200, 200, 200]
    assert store.gaps == [{"from": iso(T0 + 75), "to": iso(T0 + 316),
                           "reason": "the target is gone"}]  # fmt: skip
    assert d.parts.schedule.missed == 4 and d.restarts == 1
    lateness = [w.lateness for w in world.windows] + [d.parts.schedule.lateness_s]
    assert all(late is None or late < 1 for late in lateness), lateness
    view = d.state.view
    assert view.target is not None and view.target.up and view.target.restarts == 1


def test_rediscovery_backs_off_1_2_4_up_to_30_s() -> None:
    world = World()
    lose_and_replace(world, lost_at=T0 + 75, back_at=T0 + 300)
    d, _ = make_daemon(world)
    world.stop_at(T0 + 320)
    d.serve()
    after = [f for f in world.finds if f >= T0 + 75]
    assert [b - a for a, b in itertools.pairwise(after)] == [1, 2, 4, 8, 16, 30, 30, 30, 30, 30,
                                                             30, 30]  # fmt: skip


def test_a_stop_during_an_outage_closes_its_gap() -> None:
    world = World()
    lose_and_replace(world, lost_at=T0 + 75, back_at=T0 + 10_000)
    d, store = make_daemon(world)
    world.stop_at(T0 + 200)
    d.serve()
    assert store.gaps == [{"from": iso(T0 + 75), "to": iso(T0 + 200),
                           "reason": "the target is gone"}]  # fmt: skip


def test_a_target_dying_mid_window_keeps_the_window_and_opens_the_gap() -> None:
    world = World()
    first = deployment(100)
    world.start(first)
    world.time.at(T0 + 65, lambda: (world.kill(*first.processes),
                                    setattr(world, "found", AttachError("none"))))  # fmt: skip
    d, store = make_daemon(world)
    world.stop_at(T0 + 90)
    d.serve()
    assert len(store.written) == 2
    assert store.gaps == [{"from": iso(T0 + 70), "to": iso(T0 + 90),
                           "reason": "the target exited"}]  # fmt: skip


def test_a_remnant_of_the_lost_server_is_not_reattached() -> None:
    """The API server outlives its EngineCore by seconds: the same root with fewer serving
    processes is waited out, and the next server is profiled."""
    world = World()
    first, second = deployment(100), deployment(200)
    remnant = deployment(100, engine=False)
    world.start(first)

    def engine_dies() -> None:
        world.kill(first.processes[1])
        world.found = remnant

    def server_exits() -> None:
        world.kill(first.root)
        world.found = AttachError("none")

    world.time.at(T0 + 75, engine_dies)
    world.time.at(T0 + 150, server_exits)
    world.time.at(T0 + 200, lambda: world.start(second))
    d, store = make_daemon(world)
    world.stop_at(T0 + 400)
    d.serve()
    assert [w.root for w in world.windows] == [100, 100, 200, 200, 200]
    assert world.starts() == grid(0, 1, 4, 5, 6)  # found at +226: nothing ran at +120, +180
    assert len(store.gaps) == 1 and d.restarts == 1


def test_two_servers_found_during_rediscovery_are_counted_logged_once_and_waited_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="vllm_sidecar")
    world = World()
    first, second = deployment(100), deployment(200)
    world.start(first)
    two = AmbiguousTarget("found 2 vLLM servers: pid 1; pid 2. Pick one with --pid.")
    world.time.at(T0 + 75, lambda: (world.kill(*first.processes), setattr(world, "found", two)))
    world.time.at(T0 + 200, lambda: world.start(second))
    d, _ = make_daemon(world)
    world.stop_at(T0 + 400)
    d.serve()
    assert [w.root for w in world.windows] == [100, 100, 200, 200, 200]
    ambiguous = len([f for f in world.finds if T0 + 75 <= f < T0 + 200])
    assert d.failures.counts["discovery_ambiguous"] == ambiguous > 3
    warned = [r for r in caplog.records if "discovery_ambiguous" in r.getMessage()]
    assert [r.levelno for r in warned] == [logging.WARNING, logging.INFO]  # failing, then cleared


# ---------------------------------------------------------------- failures in one window


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (MetricsUrlError("vLLM listens on the Unix socket /run/v.sock (--uds)"), "metrics_url"),
        (AmbiguousTarget("found 2 vLLM servers"), "discovery_ambiguous"),
        (NvmlError(NvmlReturn.UNKNOWN, "driver hiccup"), "nvml"),
        (SamplerError("py-spy failed on process 1: Error: boom"), "sampler"),
        (OSError(5, "Input/output error"), "reader"),
    ],
)
def test_a_window_that_raises_is_counted_logged_once_and_the_daemon_goes_on(
    error: Exception, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vllm_sidecar")
    world = World()
    world.start(deployment(100))
    world.raise_in = {2: error, 3: error}
    d, store = make_daemon(world)
    world.stop_at(T0 + 4 * INTERVAL + 30)
    assert d.serve() == 0
    assert world.starts() == grid(0, 1, 2, 3, 4)  # no window lost its place
    assert len(store.written) == 3 and d.failures.counts[kind] == 2
    said = [r for r in caplog.records if r.getMessage().startswith(f"{kind} ")]
    assert [r.levelno for r in said] == [logging.WARNING]
    families = {m.name: m for m in SidecarCollector(d.state).collect()}
    samples = {s.labels["kind"]: s.value for s in families["vllm_sidecar_window_failures"].samples}
    assert samples[kind] == 2 and set(samples) == {k.value for k in WindowFailure}


def test_a_bug_in_a_window_is_not_swallowed() -> None:
    world = World()
    world.start(deployment(100))
    world.raise_in = {2: TypeError("unsupported operand")}
    d, _ = make_daemon(world)
    with pytest.raises(TypeError):
        d.serve()


def test_a_refused_first_attach_is_a_failed_start_but_a_dead_target_is_an_outage() -> None:
    world = World()
    first = deployment(100)
    world.start(first)
    world.raise_in = {1: AttachError("py-spy was refused ptrace access to process 1")}
    d, _ = make_daemon(world)
    with pytest.raises(AttachError, match="ptrace"):
        d.serve()

    world = World()
    lose_and_replace(world, lost_at=T0 + 5, back_at=T0 + 100)
    world.raise_in = {1: AttachError("process 1 is gone")}
    d, store = make_daemon(world)
    world.stop_at(T0 + 200)
    d.serve()
    assert [w.root for w in world.windows] == [100, 200, 200]
    assert d.failures.counts["sampler"] == 1 and len(store.gaps) == 1


def test_py_spys_own_failure_in_the_snapshot_is_counted_and_clears() -> None:
    world = World()
    world.start(deployment(100))
    world.sampler_failure = "py-spy ignored SIGINT for 5 s and was killed"
    d, store = make_daemon(world)
    world.time.at(T0 + 100, lambda: setattr(world, "sampler_failure", None))
    world.stop_at(T0 + 200)
    d.serve()
    assert d.failures.counts["sampler"] == 2 and len(store.written) == 4
    assert WindowFailure.SAMPLER not in d.failures.failing


def test_a_full_disk_skips_writes_counts_them_and_recovers() -> None:
    world = World()
    world.start(deployment(100))
    d, store = make_daemon(world)
    world.time.at(T0 + 50, lambda: setattr(store, "full", True))
    world.time.at(T0 + 150, lambda: setattr(store, "full", False))
    world.stop_at(T0 + 4 * INTERVAL + 30)
    d.serve()
    assert world.starts() == grid(0, 1, 2, 3, 4)
    assert [s.window.started_at - WALL0 for s in store.written] == [0, 180, 240]
    assert d.failures.counts["write"] == 2 and WindowFailure.WRITE not in d.failures.failing
    disk = d.state.view.disk
    assert disk is not None and disk.skipped_total == 2 and disk.state == "ok"


# ---------------------------------------------------------------- the real collector wiring


@dataclass
class RecordedRunner:
    """py-spy, as recorded: one line of stacks per segment, at once."""

    def record(self, request: RecordRequest, stop: Callable[[], bool]) -> RecordOutcome:
        raw = 'process 1:"vllm serve";thread (1): MainThread;run (uvloop/__init__.py:92) 3\n'
        return RecordOutcome(raw, 0, "", 3, 0, 0.01, request.duration_s, False)


class GarbageSource:
    url = "http://vllm:8000/metrics"

    def fetch(self) -> str:
        return "<html><body>login</body></html>\n"


def real_wiring(world: World, config: Config = CONFIG) -> tuple[Daemon, FakeStore]:
    store = FakeStore()
    make = builders(store, py_spy=lambda path: RecordedRunner(),
                    metrics=lambda url, timeout: GarbageSource())  # fmt: skip
    return make_daemon(world, config, store, fake_collector=False, builders=make)


@pytest.mark.parametrize(
    ("flags", "why"),
    [(("--uds", "/run/vllm.sock"), "Unix socket /run/vllm.sock"), (("--port", "http"), "--port")],
)
def test_vllm_flags_without_a_metrics_url_leave_metrics_unread_not_the_daemon_dead(
    flags: tuple[str, ...], why: str
) -> None:
    world = World()
    world.start(deployment(100, api=flags))
    d, store = real_wiring(world)
    world.stop_at(T0 + INTERVAL + 30)
    assert d.serve() == 0
    assert len(store.written) == 2 and d.failures.counts["metrics_url"] == 2
    serving = store.written[0].summary().serving
    assert serving.url is None and serving.requests_per_s is None
    reason = serving.reason or ""
    assert reason.startswith("metrics not read: ") and why in reason


def test_metrics_garbage_is_a_counted_failure_and_the_window_is_kept() -> None:
    world = World()
    world.start(deployment(100))
    config = replace(CONFIG, metrics=replace(CONFIG.metrics, url="http://vllm:8000/metrics"))
    d, store = real_wiring(world, config)
    world.stop_at(T0 + INTERVAL + 30)
    d.serve()
    assert len(store.written) == 2 and d.failures.counts["metrics_scrape"] == 2
    assert "garbage" in (store.written[0].summary().serving.reason or "")
    assert store.written[0].window.samples == 3  # one 10 s segment of the recorded py-spy


# ---------------------------------------------------------------- reload


def write_config(path: Path, interval: str = "60s", extra: str = "") -> Path:
    path.write_text(f"schedule:\n  window_s: 10s\n  interval_s: {interval}\n"
                    f"  baseline_every_s: 1d\nexporter_listen: \"off\"\ngpu: false\n{extra}")  # fmt: skip
    return path


def reloading_daemon(
    world: World, path: Path, **overrides: Any
) -> tuple[Daemon, FakeStore, list[bool]]:
    store, opened = FakeStore(), []
    make = builders(store, gpu=lambda enabled: opened.append(enabled), **overrides)
    environ = {"VLLM_SIDECAR_SAMPLING_MODE": "windows"}  # these are the windows mode's
    d = Daemon(load_config(path, environ), config_path=path, environ=environ, clock=world.time.clock,
               wall_clock=world.time.wall, wait=world.wait, builders=make,
               find_target=world.find, alive=world.alive,
               make_collector=world.collector)  # fmt: skip
    world.daemon = d
    return d, store, opened


def test_a_reload_applies_the_new_config_and_keeps_the_parts_it_does_not_touch(
    tmp_path: Path,
) -> None:
    world = World()
    world.start(deployment(100))
    path = write_config(tmp_path / "sidecar.yaml")
    d, _, _ = reloading_daemon(world, path)
    before = d.parts

    def reload() -> None:
        write_config(path, interval="120s")
        d.signals.reload.set()

    world.time.at(T0 + 90, reload)
    world.stop_at(T0 + 400)
    d.serve()
    assert d.config.schedule.interval_s == 120
    # the new schedule starts at the reload, every 120 s from there
    assert world.starts() == [T0, T0 + 60, T0 + 90, T0 + 210, T0 + 330]
    assert d.parts.store is before.store and d.parts.controller is before.controller
    assert d.parts.schedule is not before.schedule
    # the target's fingerprint is the target's, whatever the config: read once, kept
    assert d.parts.fingerprints is before.fingerprints


def _raise(error: Exception) -> Any:
    raise error


@pytest.mark.parametrize(
    ("change", "overrides", "message"),
    [
        ("schedule: [not, a, mapping", {}, "not valid YAML"),
        ("sampling:\n  py_spy: /nonexistent/py-spy\n", {}, "py-spy not found"),
        ("output:\n  dir: {tmp}/a-file/out\n", {}, "cannot create the output folder"),
        ("metrics:\n  url: ftp://vllm/metrics\n", {}, "is not an http(s) URL"),
        ("target:\n  discover: false\n", {}, "no target"),
        ("", {"rules": "second call fails"}, "rules file broken"),
    ],
)
def test_a_failed_reload_keeps_the_whole_old_configuration_and_all_its_parts(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    change: str,
    overrides: dict[str, Any],
    message: str,
) -> None:
    (tmp_path / "a-file").write_text("a file where a folder should be")
    world = World()
    world.start(deployment(100))
    path = write_config(tmp_path / "sidecar.yaml")
    calls = itertools.count()
    if overrides:  # the packaged rules load once, then the rules file breaks
        overrides = {"rules": lambda path: rules(path) if next(calls) == 0 else _raise(
            ConfigError("rules file broken: rule 3 has no match"))}  # fmt: skip
    store = FakeStore()
    store_check = {"store": lambda config: (check_writable(config.output.dir), store)[1]}
    d, _, opened = reloading_daemon(world, path, **store_check, **overrides)
    before, config = d.parts, d.config

    def reload() -> None:
        # every change comes with a new interval and GPU setting: none of it may be applied
        write_config(path, interval="120s", extra="gpu: true\n" * (not change.startswith("gpu"))
                     + change.replace("{tmp}", str(tmp_path)))  # fmt: skip
        d.signals.reload.set()

    world.time.at(T0 + 90, reload)
    world.stop_at(T0 + 4 * INTERVAL + 30)
    d.serve()
    assert d.parts is before and d.config is config
    assert world.starts() == grid(0, 1, 2, 3, 4)  # still every 60 s
    assert opened == [False]  # no NVML session opened for the config that failed
    assert any("reload failed" in r.getMessage() and message in r.getMessage()
               for r in caplog.records)  # fmt: skip


# ---------------------------------------------------------------- pieces


def test_failures_in_a_snapshot_are_read_as_data() -> None:
    window = Window(WALL0, 10.0, 5.0, (), 10, 0, 0.0, 1)
    cases = [
        (GpuReading(0, 0, GpuMode.CPU_MODE, reason=f"{CPU_MODE} (no devices)"), []),
        (
            GpuReading(0, 0, GpuMode.UNAVAILABLE, reason="NVML did not start: NVMLError_Unknown"),
            ["nvml"],
        ),
        (GpuReading(0, 0, GpuMode.GPU, errors=("gpu0.power: NVMLError_Timeout",)), ["nvml"]),
        (GpuReading(0, 0, GpuMode.GPU), []),
        # The mode decides, not the reason's words.
        (GpuReading(0, 0, GpuMode.CPU_MODE, reason="libnvidia-ml.so.1 not found"), []),
        (GpuReading(0, 0, GpuMode.UNAVAILABLE, reason=f"{CPU_MODE}? no: Xid 79"), ["nvml"]),
        (None, []),
    ]
    for gpu, kinds in cases:
        snap = build_snapshot(window, (), Classifier(rules()), host="h", readings=Readings(gpu=gpu))
        assert [f.kind.value for f in reading_failures(snap)] == kinds, gpu
    failed = replace(window, sampler_failure="py-spy stopped early (exit 1): Error: x")
    snap = build_snapshot(failed, (), Classifier(rules()), host="h")
    assert reading_failures(snap) == [Failure(WindowFailure.SAMPLER, failed.sampler_failure)]


def test_the_tally_starts_every_kind_at_zero_and_counts_a_kind_once_a_window() -> None:
    heard: list[dict[str, int]] = []
    tally = FailureTally(lambda counts: heard.append(dict(counts)))
    assert heard == [{k.value: 0 for k in WindowFailure}]
    nvml = WindowFailure.NVML
    tally.settle([Failure(nvml, "a"), Failure(nvml, "b")], checked=[nvml])
    assert tally.counts["nvml"] == 1 and tally.failing == {nvml}
    tally.settle([], checked=[nvml])
    assert tally.failing == frozenset()


def test_main_prints_the_traceback_of_a_bug_and_exits_70(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def bug(**kwargs: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(cli_module.cli, "main", bug)
    assert cli_module.main(["run"]) == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "KeyError: 'a bug'" in err
    assert "please report it" in err


# ---------------------------------------------------------------- uploads (upload.url)


class FakeUploads:
    """The upload thread as the daemon drives it (sidecar/store/upload.py's UploadThread)."""

    def __init__(self, url: str | None, stops_in_time: bool = True) -> None:
        self.url, self.events = url, []  # type: ignore[var-annotated]
        self.stops_in_time = stops_in_time  # False: a request to the store hangs past the wait
        self.uploader = self  # the daemon reads `uploader.held` and sets `uploader.on_change`
        self.on_change: Callable[[Any], None] | None = None

    def held(self, name: str) -> bool:
        return True

    def status(self) -> str:
        return "status at start"

    def start(self, clean_staging: bool = True) -> None:
        self.events.append("start" if clean_staging else "start, staging kept")

    def wake(self) -> None:
        self.events.append("wake")

    def stop(self, timeout: float = 30.0) -> bool:
        self.events.append("stop")
        return self.stops_in_time


def test_uploads_start_with_the_daemon_hear_each_write_hold_retention_and_stop_with_it(
    tmp_path: Path,
) -> None:
    world = World()
    world.start(deployment(100))
    made: list[FakeUploads] = []

    def uploads(config: Config, store: Any) -> FakeUploads:
        made.append(FakeUploads(config.upload.url))
        return made[-1]

    path = write_config(tmp_path / "sidecar.yaml", extra="upload:\n  url: s3://bucket/a\n")
    d, store, _ = reloading_daemon(world, path, uploads=uploads)

    def reload() -> None:  # a new URL: the old thread stops before the new one starts
        write_config(path, extra="upload:\n  url: s3://bucket/b\n")
        d.signals.reload.set()

    world.time.at(T0 + 90, reload)
    world.stop_at(T0 + 150)
    d.serve()
    first, second = made
    assert (first.url, second.url) == ("s3://bucket/a", "s3://bucket/b")
    assert first.events == ["start", "wake", "wake", "stop"]  # two windows, then the reload
    assert second.events == ["start", "wake", "stop"]
    assert store.held == second.held and second.on_change == d.state.update_upload


def test_a_reload_keeps_the_staging_of_an_old_upload_thread_still_busy(tmp_path: Path) -> None:
    """The old thread did not end within its wait (a request hangs): the new thread starts
    without removing `.uploads/.upload-*`, where the old one may still be staging a row."""
    world = World()
    world.start(deployment(100))
    made: list[FakeUploads] = []

    def uploads(config: Config, store: Any) -> FakeUploads:
        made.append(FakeUploads(config.upload.url, stops_in_time=False))
        return made[-1]

    path = write_config(tmp_path / "sidecar.yaml", extra="upload:\n  url: s3://bucket/a\n")
    d, _, _ = reloading_daemon(world, path, uploads=uploads)

    def reload() -> None:
        write_config(path, extra="upload:\n  url: s3://bucket/b\n")
        d.signals.reload.set()

    world.time.at(T0 + 90, reload)
    world.stop_at(T0 + 100)
    d.serve()
    first, second = made
    assert first.events[0] == "start" and first.events[-1] == "stop"
    assert second.events[0] == "start, staging kept"


# ---------------------------------------------------------------- continuous mode


# A configured URL (GarbageSource answers it, no network): the hour's own readers scrape it.
CONTINUOUS = Config(schedule=ScheduleConfig(interval_s=60.0, baseline_every_s=300.0),
                    metrics=MetricsConfig(url="http://vllm:8000/metrics"),
                    exporter_listen="off", gpu=False)  # fmt: skip


def test_continuous_periods_end_on_the_wall_grid_and_each_baseline_is_its_hour() -> None:
    world = World()
    world.start(deployment(100))
    store = FakeStore()
    make = builders(store, metrics=lambda url, timeout: GarbageSource())
    d, _ = make_daemon(world, CONTINUOUS, store, builders=make)
    assert d.parts.planner is not None and d.parts.schedule.continuous
    world.stop_at(T0 + 20 + 9 * 60 + 1)  # 1 s into the period after 1_780_000_560
    assert d.serve() == 0
    walls = [w.start - T0 + WALL0 for w in world.windows]
    # The first boundary (1_780_000_020) is 20 s away: under a third of an interval, so the
    # first period runs on to the next one; then a period per interval, back to back.
    assert walls[:3] == [WALL0, WALL0 + 80, WALL0 + 140]
    assert all(b - a == 60 for a, b in itertools.pairwise(walls[1:]))
    baselines = [s for s in store.written if s.window.samples > 10]
    # The "hour" (300 s) ending at 1_780_000_200 holds the first three periods (the sidecar
    # attached within it: partial, and said so); the next, to 1_780_000_500, all five.
    assert [b.window.samples for b in baselines] == [30, 50]
    first, second = baselines
    assert first.window.partial and "covers" in str(first.window.partial_reason)
    assert not second.window.partial and second.window.started_at == WALL0 + 200
    assert second.window.duration_s == 300 and second.window.segments == 5


def test_a_period_that_runs_past_the_hour_still_ends_it() -> None:
    # Attached 20 s before an hour (here 300 s) ends: the first period runs on past it (20 s
    # is under half an interval of 60 s) and must still close the hour, or the hour would
    # take every later period and never be written.
    world = World()
    world.start(deployment(100))
    store = FakeStore()
    make = builders(store, metrics=lambda url, timeout: GarbageSource())
    world.time.now = T0 + 180  # wall 1_780_000_180: 20 s before 1_780_000_200
    d, _ = make_daemon(world, CONTINUOUS, store, builders=make)
    world.stop_at(T0 + 180 + 80 + 4 * 60 + 1)
    assert d.serve() == 0
    written = [(s.window.started_at - WALL0, s.window.samples) for s in store.written]
    # the first period (80 s: run on to the second multiple of 60), then at once the hour to
    # 1_780_000_200 it crossed; then four periods and the hour to 1_780_000_500 (and the
    # period begun before the stop came)
    assert written == [(180, 10), (180, 10), (260, 10), (320, 10), (380, 10), (440, 10),
                       (260, 40), (500, 10)]  # fmt: skip
    first, second = store.written[1], store.written[-2]
    assert "covers 80 of the hour's 300 s" in str(first.window.partial_reason)
    assert "covers 240 of the hour's 300 s" in str(second.window.partial_reason)
