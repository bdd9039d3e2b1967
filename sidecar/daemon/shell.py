"""What every daemon has, whatever it profiles (one target: loop.py; `targets:`: multi_target.py):
the clocks, the signals and the systemd watchdog, the config and its parts rebuilt on SIGHUP,
the exporter, the waits to absolute deadlines, and a window's collection with its failures
counted. Each daemon holds a `Shell` and hands it what differs (what it exports, what a reload
must check, what a reload must rebuild beside the daemon's own parts).
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
from typing import Any, Protocol

from sidecar import outproc
from sidecar.config.load import load_config
from sidecar.config.settings import Config
from sidecar.daemon.failures import Failure, FailureTally, classify
from sidecar.daemon.notify import SystemdNotifier, watchdog_interval
from sidecar.daemon.parts import (
    Builders,
    Parts,
    WindowCollector,
    WindowResult,
    build_parts,
    real_collector,
)
from sidecar.errors import AttachError, SamplerError, SidecarError
from sidecar.exporter import ExporterGroup, ExporterState, start_exporter
from sidecar.store.folders import hold_folder
from sidecar.target.discovery import Deployment

log = logging.getLogger("vllm_sidecar")
TICK_S = 1.0  # how often a wait wakes: reloads, the watchdog's heartbeat, the target's liveness

# make_collector(target, first): the window's collector over the daemon's parts (tests: fakes).
MakeCollector = Callable[[Deployment, bool], WindowCollector]


class Wake(Enum):
    DUE = "due"  # the deadline came
    STOP = "stop"  # asked to stop
    LOST = "lost"  # the target went away meanwhile
    REPLAN = "replan"  # a reload replaced the schedule


@dataclass
class Signals:
    """What the signal handlers ask for; read by the loop, which alone acts on them."""

    stop: threading.Event = field(default_factory=threading.Event)
    reload: threading.Event = field(default_factory=threading.Event)
    heartbeat: float = 0.0


class Background(Protocol):
    """The threads beside the windows (background.AlwaysOn), as the process runs them."""

    def start(self) -> None: ...
    def close(self) -> None: ...
    def signal(self, name: str) -> None: ...


class Shell:
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
        alive: Callable[[Deployment], bool] | None = None,
        make_collector: MakeCollector | None = None,
        check_reload: Callable[[Config], None] = lambda config: None,
        reloaded: Callable[[], None] = lambda: None,
        defaults: Config = Config(),  # frozen: one shared instance is safe
    ) -> None:
        """`wait(timeout)` waits for the stop signal (True when it came); `alive` and
        `make_collector(target, first)` default to the real ones over the parts (a fleet's:
        each deployment's). `check_reload(config)`: what `run` checks beyond load_config,
        again for a reload (a ConfigError keeps the running configuration); `reloaded()`:
        what follows a reload that replaced the parts (a fleet: its deployments' parts).
        `defaults`: what a reload reads the file over (`run --discover`'s fleet: its
        `targets:`, which no file gave)."""
        self._config_path, self._flags = config_path, dict(flags or {})
        self._defaults = defaults
        self._environ = dict(os.environ if environ is None else environ)
        self.clock, self.wall = clock, wall_clock
        self.signals = Signals(heartbeat=clock())
        self._wait = wait or self.signals.stop.wait
        self._builders = builders or Builders()
        self._check_reload, self._reloaded = check_reload, reloaded
        self.notifier = SystemdNotifier(self._environ)
        self.state = ExporterState()
        self.failures = FailureTally(self.state.update_failures)
        self.parts = build_parts(config, self._builders, clock, wall_clock)
        self.alive = alive or self._still_alive
        self._make_collector = self._injected(make_collector) if make_collector else self._real
        self._had_window = False

    @property
    def config(self) -> Config:
        return self.parts.config

    # ------------------------------------------------------------------ the process

    def run(
        self, serve: Callable[[], int], exported: ExporterState | ExporterGroup, always: Background
    ) -> int:
        """The daemon as a process: signals, the exporter (serving `exported`), the watchdog
        and the threads beside the windows, then `serve`."""
        # Before the exporter and the control socket (output.dir/control.sock): a second daemon
        # on this host folder ends here, with the first one's PID (issue 26, item 9). The
        # single daemon's store took the lock already; the fleet's take it when they open.
        hold_folder(self.parts.store.dir)
        self._install_signals(always)
        exporter = start_exporter(self.config.exporter_listen, exported)
        self._start_watchdog()
        outproc.enable()  # Parquet written in a child: pandas and pyarrow never stay loaded
        always.start()
        try:
            return serve()
        finally:
            self.signals.stop.set()  # ends the watchdog thread
            always.close()
            if exporter is not None:
                exporter.close()

    def _install_signals(self, always: Background) -> None:
        def on_stop(signum: int, frame: FrameType | None) -> None:
            log.info("%s: finishing the current window, then exiting", signal.Signals(signum).name)
            self.signals.stop.set()

        def on_hup(signum: int, frame: FrameType | None) -> None:
            self.signals.reload.set()

        def on_usr1(signum: int, frame: FrameType | None) -> None:
            always.signal("SIGUSR1")

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

    # ------------------------------------------------------------------ one window

    def collect(
        self,
        target: Deployment,
        parts: Parts,
        failures: FailureTally,
        duration_s: float | None = None,
    ) -> WindowResult | None:
        """The window's snapshot over `parts`, or None when a reader raised: that is counted in
        `failures` (the daemon's; a fleet's: the deployment's), unless it is a bug (re-raised)
        or the daemon's very first attach failing on a live target (a failed start: ptrace is
        the host's, not one server's)."""
        first = not self._had_window
        try:
            collector = self._make_collector(parts, target, first)
            seconds = self.config.schedule.window_s if duration_s is None else duration_s
            result = collector.collect(seconds, self.should_stop)
        except Exception as exc:
            kind = classify(exc)
            start_failed = first and isinstance(exc, AttachError | SamplerError)
            if kind is None or (start_failed and self.alive(target)):
                raise
            failures.failed(Failure(kind, str(exc) or type(exc).__name__))
            return None
        self._had_window = True
        return result

    def _real(self, parts: Parts, target: Deployment, first: bool) -> WindowCollector:
        def alive() -> bool:
            return self.alive(target)

        return real_collector(parts, target, first, alive, self.clock, self.wall)

    @staticmethod
    def _injected(make: MakeCollector) -> Callable[[Parts, Deployment, bool], WindowCollector]:
        """A collector given from outside (tests) brings its own readers: no parts."""
        return lambda parts, target, first: make(target, first)

    def _still_alive(self, target: Deployment) -> bool:
        return target.still_alive(self.parts.procfs)

    # ------------------------------------------------------------------ waiting

    def should_stop(self) -> bool:
        self.signals.heartbeat = self.clock()  # the sampler polls this every ~0.2 s
        return self.signals.stop.is_set()

    def sleep(self, seconds: float) -> bool:
        """Sleep `seconds` (reloads on the way): True when asked to stop meanwhile."""
        return self.sleep_until(self.clock() + seconds) is Wake.STOP

    def sleep_until(self, deadline: float, watch: Deployment | None = None) -> Wake:
        """Sleep to an absolute deadline; reloads on the way, and wakes early when asked to stop,
        when a reload replaced the schedule, or when `watch` goes away (so an outage's gap
        starts when it did)."""
        while (left := deadline - self.clock()) > 0:
            self.signals.heartbeat = self.clock()
            if self._wait(min(left, TICK_S)):
                return Wake.STOP
            if self.signals.reload.is_set():
                schedule = self.parts.schedule
                self.reload()
                if self.parts.schedule is not schedule:
                    return Wake.REPLAN
            if watch is not None and not self.alive(watch):
                return Wake.LOST
        return Wake.STOP if self.signals.stop.is_set() else Wake.DUE

    # ------------------------------------------------------------------ reloads

    def reload(self) -> None:
        """Every part of the new config is built before any replaces the running one: a reload
        that fails anywhere, with any error (an Exception, not KeyboardInterrupt or SystemExit),
        keeps the whole running configuration and all its parts."""
        self.signals.reload.clear()
        self.notifier.reloading()
        old = self.parts
        try:
            config = load_config(self._config_path, self._environ, self._flags, self._defaults)
            self._check_reload(config)
            new = build_parts(config, self._builders, self.clock, self.wall, previous=old)
        except Exception as exc:  # any failure keeps it (issue 26, item 12); a stop still stops
            own = isinstance(exc, SidecarError)
            log.error("reload failed, keeping the running configuration: %s",
                      exc if own else f"{type(exc).__name__}: {exc}",
                      exc_info=not own)  # fmt: skip
            self.notifier.ready("configuration reloaded")
            return
        self._replace(old, new)
        self.notifier.ready("configuration reloaded")
        self._reloaded()

    def _replace(self, old: Parts, new: Parts) -> None:
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
        if new.config.log_level != old.config.log_level:  # setup_logging's, at start
            log.setLevel(new.config.log_level.upper())
        log.info("configuration reloaded from %s", new.config.source)
        if new.config.exporter_listen != old.config.exporter_listen:
            log.warning("exporter_listen changed: takes effect at the next restart")


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


class HoldsShell:
    """A daemon that holds a `Shell`: the shell's parts by the names the CLI and the tests
    know (the single daemon and the fleet alike)."""

    shell: Shell

    @property
    def parts(self) -> Parts:
        return self.shell.parts

    @property
    def config(self) -> Config:
        return self.shell.config

    @property
    def signals(self) -> Signals:
        return self.shell.signals

    @property
    def state(self) -> ExporterState:
        return self.shell.state

    @property
    def failures(self) -> FailureTally:
        return self.shell.failures
