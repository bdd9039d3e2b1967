"""The fleet daemon (sidecar/daemon/multi_target.py) driven through its seams with a fake clock: several
servers on one host, each its own deployment (store, schedule, exporter series); servers that
go, come back and appear; windows in turn. No processes, no sockets, no real sleep.

The fakes are test_daemon_loop's (clock, store, deployments); the loop, the schedules, the
exporter states and the collector wiring are the daemon's own.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import pytest

from sidecar.classify.classifier import Classifier
from sidecar.config.load import load_config
from sidecar.config.settings import Config
from sidecar.config.targets import TargetSpec, parse_targets
from sidecar.daemon.background import AlwaysOn, FleetAlwaysOn
from sidecar.daemon.multi_target import RESCAN_S, MultiTargetDaemon
from sidecar.daemon.parts import WindowResult
from sidecar.errors import AttachError, ConfigError
from sidecar.exporter import SidecarCollector
from sidecar.records import ProcessInfo, Role
from sidecar.records.summary import Cause, CauseKind
from sidecar.records.window import Window
from sidecar.target.discovery import Deployment, deployment_id, find_all
from sidecar.target.procfs import ProcFs
from sidecar.trend.source import host_folder, host_folders
from sidecar.window.snapshot import build_snapshot
from tests.unit.daemon.test_daemon_loop import (
    CONFIG,
    INTERVAL,
    T0,
    WINDOW,
    FakeStore,
    FakeTime,
    RecordedRunner,
    builders,
    iso,
    rules,
    write_config,
)

FLEET = replace(CONFIG, targets=(TargetSpec(discover=True),))


def server(root: int, port: int, model: str = "m") -> Deployment:
    """A `vllm serve MODEL --port PORT` API server `root` and its EngineCore `root + 1`."""
    cmdline = ("vllm", "serve", model, "--port", str(port))
    api = ProcessInfo(root + 2**22, root, 1, cmdline, " ".join(cmdline), Role.API_SERVER)
    core = ProcessInfo(root + 2**22 + 1, root + 1, api.pid, (), "VLLM::EngineCore",
                       Role.ENGINE_CORE)  # fmt: skip
    return Deployment(api, (api, core))


@dataclass
class Ran:
    name: str
    start: float
    end: float


class Host:
    """The vLLM servers on one host as the fleet daemon sees them, and the windows it ran."""

    def __init__(self) -> None:
        self.time = FakeTime()
        self.running: dict[tuple[int, int], Deployment] = {}
        self.windows: list[Ran] = []
        self.stores: dict[str, FakeStore] = {}
        self.daemon: MultiTargetDaemon | None = None

    def start(self, d: Deployment) -> None:
        self.running[d.root.key] = d

    def stop(self, d: Deployment) -> None:
        self.running.pop(d.root.key, None)

    def find_all(self) -> tuple[list[tuple[Deployment, TargetSpec]], list[str]]:
        return [(d, TargetSpec(discover=True)) for d in self.running.values()], []

    def alive(self, d: Deployment) -> bool:
        """Its root runs, and every serving process it had (a remnant has lost some)."""
        now = self.running.get(d.root.key)
        return now is not None and {p.key for p in d.serving} <= {p.key for p in now.processes}

    def collector(self, target: Deployment, first: bool) -> Collector:
        return Collector(self, target)

    def wait(self, timeout: float) -> bool:
        self.time.advance(timeout)
        assert self.daemon is not None
        return self.daemon.signals.stop.is_set()

    def stop_at(self, when: float) -> None:
        assert self.daemon is not None
        self.time.at(when, self.daemon.signals.stop.set)

    def at(self, when: float, action: Callable[[], object]) -> None:
        self.time.at(when, action)

    def starts(self, name: str) -> list[float]:
        return [w.start for w in self.windows if w.name == name]


@dataclass
class Collector:
    host: Host
    target: Deployment

    def collect(self, duration_s: float, stop: Callable[[], bool]) -> WindowResult:
        h, start = self.host, self.host.time.now
        wall = h.time.wall()
        h.time.advance(duration_s)
        h.windows.append(Ran(deployment_id(self.target).name, start, h.time.now))
        window = Window(started_at=wall, duration_s=duration_s, rate_hz=5.0, stacks=(),
                        samples=10, errors=0, sampler_cpu_s=0.01, segments=1)  # fmt: skip
        snapshot = build_snapshot(window, self.target.processes, Classifier(rules()))
        return WindowResult(snapshot)


def fleet(host: Host, config: Config = FLEET, **kw: Any) -> MultiTargetDaemon:
    def store(config: Config, name: str) -> FakeStore:
        return host.stores.setdefault(name, FakeStore())

    d = MultiTargetDaemon(
        config,
        environ={},
        clock=host.time.clock,
        wall_clock=host.time.wall,
        wait=host.wait,
        builders=builders(FakeStore(), deployment_store=store),
        find_all_targets=host.find_all,
        alive=host.alive,
        **({"make_collector": host.collector} | kw),
    )
    host.daemon = d
    return d


def samples(d: MultiTargetDaemon, name: str) -> list[tuple[dict[str, str], float]]:
    families = {m.name: m for m in SidecarCollector(d.group).collect()}
    family = families.get(name)
    return [(s.labels, s.value) for s in family.samples] if family else []


# ---------------------------------------------------------------- several servers, in turn


def test_two_servers_each_get_their_own_deployment_store_and_grid_in_turn() -> None:
    host = Host()
    host.start(server(100, 8000))
    host.start(server(200, 8001))
    d = fleet(host)
    host.stop_at(T0 + 3 * INTERVAL + 30)
    assert d.serve() == 0
    assert set(host.stores) == {"m@8000", "m@8001"}
    a, b = host.starts("m@8000"), host.starts("m@8001")
    # Windows in turn: one waits for the other's window, then both stay on their own grids.
    first, second = sorted([a, b])
    assert first == [T0 + INTERVAL * k for k in range(4)]
    assert second == [T0 + WINDOW + INTERVAL * k for k in range(4)]
    assert all(len(s.written) == 4 for s in host.stores.values())
    # Never two windows at once: the py-spy CPU budget holds for the host, not per server.
    ran = sorted(host.windows, key=lambda w: w.start)
    assert all(x.end <= y.start for x, y in itertools.pairwise(ran))


def test_more_servers_than_the_interval_holds_miss_windows_and_say_so() -> None:
    host = Host()
    for i in range(8):  # 8 x 10 s windows in a 60 s interval
        host.start(server(100 * (i + 1), 8000 + i))
    d = fleet(host)
    host.stop_at(T0 + 4 * INTERVAL)
    d.serve()
    ran = sorted(host.windows, key=lambda w: w.start)
    assert all(x.end <= y.start for x, y in itertools.pairwise(ran))
    missed = sum(m.parts.schedule.missed for m in d.members.values())
    # The loop ran without a pause, and the deadlines it could not serve are counted as missed.
    assert sum(w.end - w.start for w in ran) == pytest.approx(4 * INTERVAL, abs=WINDOW)
    assert missed > 0
    counted = sum(v for labels, v in samples(d, "vllm_sidecar_windows_missed"))
    assert counted == missed


def test_one_server_stops_and_a_third_starts_the_other_loses_nothing() -> None:
    host = Host()
    one, two, three = server(100, 8000), server(200, 8001), server(300, 8002)
    host.start(one)
    host.start(two)
    host.at(T0 + 75, lambda: host.stop(two))
    host.at(T0 + 130, lambda: host.start(three))
    d = fleet(host)
    host.stop_at(T0 + 5 * INTERVAL + 30)
    d.serve()
    assert host.starts("m@8000") == [T0 + INTERVAL * k for k in range(6)]  # not one missed
    assert host.starts("m@8001") == [T0 + WINDOW, T0 + WINDOW + INTERVAL]
    found_at = T0 + 130 + RESCAN_S  # picked up by the next rescan, its first window at once
    assert host.starts("m@8002")[0] == pytest.approx(found_at, abs=RESCAN_S)
    assert len(host.starts("m@8002")) == 4
    # It stopped inside its own window (+70 to +80): the window is kept, the gap starts after.
    gone = host.stores["m@8001"]
    assert len(gone.written) == 2
    assert gone.gaps == [{"from": iso(T0 + 80), "to": iso(T0 + 5 * INTERVAL + 30),
                          "reason": "the target exited"}]  # fmt: skip
    assert host.stores["m@8000"].gaps == [] and host.stores["m@8002"].gaps == []
    up = {labels["deployment"]: v for labels, v in samples(d, "vllm_sidecar_target_up")}
    assert up == {"m@8000": 1, "m@8001": 0, "m@8002": 1}
    # The gone server's window gauges go with it; the others' are told apart by their labels.
    rates = samples(d, "vllm_sidecar_sampling_samples_per_second")
    assert {(x["deployment"], x["model"], x["port"], x["root_start"]) for x, _ in rates} == {
        ("m@8000", "m", "8000", str(one.root.start_time)),
        ("m@8002", "m", "8002", str(three.root.start_time)),
    }


def test_a_server_back_under_its_name_continues_its_deployment() -> None:
    host = Host()
    first, again = server(100, 8000), server(500, 8000)
    host.start(first)
    host.at(T0 + 75, lambda: host.stop(first))
    host.at(T0 + 200, lambda: host.start(again))
    d = fleet(host)
    host.stop_at(T0 + 400)
    d.serve()
    assert list(host.stores) == ["m@8000"]
    m = d.members["m@8000"]
    assert m.restarts == 1 and m.target is again
    # Found by the rescan after +200; the schedule goes on at its grid (+240), no stale window.
    assert host.starts("m@8000") == [T0, T0 + INTERVAL, T0 + 4 * INTERVAL, T0 + 5 * INTERVAL,
                                     T0 + 6 * INTERVAL]  # fmt: skip
    [gap] = host.stores["m@8000"].gaps
    assert gap["from"] == iso(T0 + 75) and gap["to"] is not None  # seen within a tick
    [(labels, restarts)] = samples(d, "vllm_sidecar_target_restarts")
    assert labels["deployment"] == "m@8000" and restarts == 1


def test_a_server_restarted_during_another_window_counts_as_a_restart() -> None:
    """It exits and its successor starts while the loop is in the other server's window: the
    rescan after that window must not take the successor for the run it already follows."""
    host = Host()
    a, b, b_again = server(100, 8000), server(200, 8001), server(500, 8001)
    host.start(a)
    host.start(b)
    host.at(T0 + INTERVAL + 2, lambda: host.stop(b))  # inside a's second window
    host.at(T0 + INTERVAL + 5, lambda: host.start(b_again))
    d = fleet(host)
    host.stop_at(T0 + 3 * INTERVAL)
    d.serve()
    m = d.members["m@8001"]
    assert m.target is b_again and m.restarts == 1
    [gap] = host.stores["m@8001"].gaps
    assert gap["from"] == iso(T0 + INTERVAL + WINDOW) and gap["to"] is not None
    assert b.root.key not in d._by_root  # the gone run is forgotten


def test_a_remnant_of_a_server_is_not_taken_for_a_new_one() -> None:
    """Its EngineCore died and its API server lingers: down, and not attached again."""
    host = Host()
    whole = server(100, 8000)
    remnant = Deployment(whole.root, whole.processes[:1])
    host.start(whole)
    host.at(T0 + 75, lambda: host.start(remnant))  # the same root, the EngineCore gone
    host.at(T0 + 150, lambda: host.stop(remnant))
    d = fleet(host)
    host.stop_at(T0 + 300)
    d.serve()
    assert host.starts("m@8000") == [T0, T0 + INTERVAL]
    m = d.members["m@8000"]
    assert m.target is None and m.restarts == 0


def test_two_live_servers_of_one_name_are_two_deployments() -> None:
    """model@port twice (servers in two network namespaces): the second is named by its PID."""
    host = Host()
    host.start(server(100, 8000))
    host.start(server(200, 8000))
    d = fleet(host)
    host.stop_at(T0 + 30)
    d.serve()
    assert sorted(d.members) == ["m@8000", f"m@8000-{2**22 + 200}"]  # found second
    assert all(len(s.written) == 1 for s in host.stores.values()) and len(host.stores) == 2


def test_no_server_within_the_wait_at_start_exits_4() -> None:
    host = Host()
    d = fleet(host)
    with pytest.raises(AttachError, match=r"no vLLM server of targets.*waited 120 s") as raised:
        d.serve()
    assert raised.value.exit_code == 4


def test_the_daemon_series_have_the_deployment_labels_too() -> None:
    """Every state in the group has the same label names (an empty deployment for the daemon's
    own), so one family never mixes label sets."""
    host = Host()
    host.start(server(100, 8000))
    d = fleet(host)
    host.stop_at(T0 + 30)
    d.serve()
    for family in SidecarCollector(d.group).collect():
        names = {tuple(sorted(s.labels)) for s in family.samples}
        assert len(names) == 1, (family.name, names)
        assert "deployment" in next(iter(names)), family.name
    info = {labels["deployment"] for labels, _ in samples(d, "vllm_sidecar_build_info")}
    assert info == {"", "m@8000"}  # the dashboard's deployment selector lists these


# ---------------------------------------------------------------- names, config, folders


@pytest.mark.parametrize(
    ("cmdline", "name"),
    [
        (("vllm", "serve", "Qwen/Qwen2.5-0.5B", "--port", "8001"), "Qwen2.5-0.5B@8001"),
        (("vllm", "serve", "x", "--served-model-name", "chat"), "chat@8000"),
        (("vllm", "serve", "x", "--uds", "/run/v.sock"), "x@_run_v.sock"),
    ],
)
def test_deployment_names_are_model_at_port_and_safe_as_folders(
    cmdline: tuple[str, ...], name: str
) -> None:
    api = ProcessInfo(10, 5, 1, cmdline, " ".join(cmdline), Role.API_SERVER)
    assert deployment_id(Deployment(api, (api,))).name == name


def test_an_offline_engine_is_named_by_its_pid() -> None:
    core = ProcessInfo(42, 7, 1, (), "VLLM::EngineCore", Role.ENGINE_CORE)
    ident = deployment_id(Deployment(core, (core,)))
    assert (ident.name, ident.model, ident.port, ident.root_start) == ("pid-42", "pid-42", "", 7)


def test_targets_list_loads(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("targets:\n  - discover: true\n  - pid_file: /run/v.pid\n"
                    "    metrics_url: http://127.0.0.1:8001/metrics\n")  # fmt: skip
    config = load_config(path, environ={})
    assert config.targets == (
        TargetSpec(discover=True),
        TargetSpec(pid_file=Path("/run/v.pid"), metrics_url="http://127.0.0.1:8001/metrics"),
    )
    assert load_config(None, environ={}).targets == ()  # the single target, unchanged


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"discover": True}, "give a list of entries"),
        ([{"pid": 1, "discover": True}], r"targets\[0\]: give exactly one of pid"),
        ([{"pod": 1}], r"targets\[0\]: unknown keys \['pod'\]"),
        ([{"pid": "x"}], r"targets\[0\]\.pid: 'x'"),
        ([{"discover": True, "metrics_url": "http://a/metrics"}], "metrics_url names one server"),
        ([{"discover": True}, {"discover": True}], "given twice"),
    ],
)
def test_bad_targets_name_the_entry_and_the_fix(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_targets(raw, "file c.yaml")


def test_a_metrics_url_for_the_whole_fleet_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("targets: [{discover: true}]\nmetrics:\n  url: http://a:1/metrics\n")
    with pytest.raises(ConfigError, match="give metrics_url on the targets entry"):
        load_config(path, environ={})


def test_readers_find_deployment_folders_as_host_folders(tmp_path: Path) -> None:
    """OUT/<host>/<deployment>/ holds what OUT/<host>/ held: `--host h/m@8001` picks one, and
    the error without it lists them; an old single-target OUT/<host>/ reads as before."""
    for folder in ("h/m@8000", "h/m@8001", "old"):
        os.makedirs(tmp_path / folder / "20260101T000000Z")
    assert host_folder(tmp_path, "h/m@8001") == tmp_path / "h" / "m@8001"
    assert host_folder(tmp_path, "old") == tmp_path / "old"
    with pytest.raises(Exception, match=r"h/m@8000, h/m@8001, old"):
        host_folder(tmp_path, None)
    assert host_folders(tmp_path, None) == [tmp_path / p for p in ("h/m@8000", "h/m@8001", "old")]
    assert host_folder(tmp_path / "h" / "m@8000", None) == tmp_path / "h" / "m@8000"


# ---------------------------------------------------------------- the real wiring, reloads


class UrlSource:
    """A vLLM /metrics that answers with nothing: the URL the window used is what is tested."""

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        self.url = url

    def fetch(self) -> str:
        return ""


def test_each_deployment_reads_its_own_metrics_url_with_its_own_controller() -> None:
    """The real collector over each member's parts: a pid entry's metrics_url is that server's;
    a discovered server's URL comes from its own --port."""
    host = Host()
    listed, found = server(100, 8000), server(200, 8001)
    host.start(listed)
    host.start(found)
    given = "http://10.0.0.5:9000/metrics"
    specs = {listed.root.key: TargetSpec(pid=100, metrics_url=given)}
    host.find_all = lambda: (  # type: ignore[method-assign]
        [(d, specs.get(d.root.key, TargetSpec(discover=True))) for d in host.running.values()],
        [],
    )

    def store(config: Config, name: str) -> FakeStore:
        return host.stores.setdefault(name, FakeStore())

    make = builders(FakeStore(), deployment_store=store, py_spy=lambda path: RecordedRunner(),
                    metrics=UrlSource)  # fmt: skip
    d = MultiTargetDaemon(FLEET, environ={}, clock=host.time.clock, wall_clock=host.time.wall,
                    wait=host.wait, builders=make, find_all_targets=host.find_all,
                    alive=host.alive)  # fmt: skip
    host.daemon = d
    host.stop_at(T0 + 30)
    d.serve()
    urls = {name: s.written[0].summary().serving.url for name, s in host.stores.items()}
    assert urls["m@8000"] == given
    assert urls["m@8001"] is not None and ":8001/" in urls["m@8001"]
    a, b = d.members["m@8000"].parts, d.members["m@8001"].parts
    assert a.controller is not b.controller and a.schedule is not b.schedule


def test_a_reload_gives_every_deployment_the_new_schedule_and_keeps_its_store(
    tmp_path: Path,
) -> None:
    host = Host()
    host.start(server(100, 8000))
    host.start(server(200, 8001))
    path = write_config(tmp_path / "sidecar.yaml", extra="targets: [{discover: true}]\n")

    made: list[str] = []

    def store(config: Config, name: str) -> FakeStore:
        made.append(name)
        return host.stores.setdefault(name, FakeStore())

    d = MultiTargetDaemon(load_config(path, {}), config_path=path, environ={}, clock=host.time.clock,
                    wall_clock=host.time.wall, wait=host.wait,
                    builders=builders(FakeStore(), deployment_store=store),
                    find_all_targets=host.find_all, alive=host.alive,
                    make_collector=host.collector)  # fmt: skip
    host.daemon = d

    def reload() -> None:
        write_config(path, interval="120s", extra="targets: [{discover: true}]\n")
        d.signals.reload.set()

    host.at(T0 + 90, reload)
    host.stop_at(T0 + 400)
    d.serve()
    for m in d.members.values():
        assert m.parts.schedule.config.interval_s == 120
    assert sorted(made) == ["m@8000", "m@8001"]  # each store kept: `output` did not change
    starts = sorted(host.starts("m@8000") + host.starts("m@8001"))
    after = [s for s in starts if s >= T0 + 90]
    assert len(after) == 6  # two deployments, every 120 s from the reload: 3 windows each
    assert all(len(s.written) == 5 for s in host.stores.values())


# ---------------------------------------------------------------- find_all over a /proc tree

TWO = ProcFs(Path(__file__).resolve().parents[2] / "fixtures" / "proc" / "two_deployments")


def test_discovery_finds_both_servers_of_a_host_each_named() -> None:
    found, missing = find_all(TWO, (TargetSpec(discover=True),))
    assert missing == []
    assert sorted(deployment_id(d).name for d, _ in found) == ["opt-125m@8000",
                                                               "qwen2.5-0.5b@8001"]  # fmt: skip


def test_a_listed_server_is_found_once_with_its_own_entry(tmp_path: Path) -> None:
    """A pid entry before discovery: that server once, with the entry's metrics_url; a pid
    file that is not there (yet) is reported, not an error: the daemon waits for it."""
    listed = TargetSpec(pid=5180, metrics_url="http://127.0.0.1:9000/metrics")  # its EngineCore
    later = TargetSpec(pid_file=tmp_path / "later.pid")
    found, missing = find_all(TWO, (listed, later, TargetSpec(discover=True)))
    by_root = {d.root.pid: spec for d, spec in found}
    assert by_root == {5100: listed, 6100: TargetSpec(discover=True)}
    assert len(missing) == 1 and missing[0].startswith(f"pid file {tmp_path / 'later.pid'}: ")


def test_a_discovery_that_finds_none_says_how_to_make_a_server_visible(tmp_path: Path) -> None:
    """The daemon's start timeout and doctor quote it: an empty /proc names the fix."""
    found, missing = find_all(ProcFs(tmp_path), (TargetSpec(discover=True),))
    assert found == []
    assert missing == [f"discovery: no vLLM server found under {tmp_path}: start vLLM, pass "
                       "--pid, or mount the host's /proc and pass --proc-root /host_proc "
                       '(Docker: pid: host or pid: "service:vllm")']  # fmt: skip


def test_doctor_checks_each_server_of_targets(tmp_path: Path) -> None:
    from sidecar.config.settings import MetricsConfig, OutputConfig, SamplingConfig, TargetConfig
    from sidecar.doctor import Status, run_checks

    config = Config(
        target=TargetConfig(proc_root=TWO.root),
        # py-spy not found: ptrace is not tried against the fixture's PIDs
        sampling=SamplingConfig(py_spy=str(tmp_path / "no-py-spy")),
        output=OutputConfig(dir=tmp_path / "out"),
        metrics=MetricsConfig(timeout_s=0.5),
        gpu=False,
        targets=(TargetSpec(discover=True), TargetSpec(pid_file=tmp_path / "later.pid")),
    )
    checks = {c.name: c for c in run_checks(config)}
    assert checks["target opt-125m@8000"].status is Status.OK
    assert checks["target qwen2.5-0.5b@8001"].status is Status.OK
    assert checks["target"].status is Status.WARN and "later.pid" in checks["target"].detail


def test_doctor_discover_on_two_servers_checks_each(tmp_path: Path) -> None:
    """`doctor --discover` (no targets:) where `run --discover` would profile two servers:
    each is checked; it used to FAIL with 'found 2 vLLM servers ... Pick one with --pid'."""
    from sidecar.config.settings import MetricsConfig, OutputConfig, SamplingConfig, TargetConfig
    from sidecar.doctor import Status, run_checks

    config = Config(
        target=TargetConfig(proc_root=TWO.root, discover=True),
        sampling=SamplingConfig(py_spy=str(tmp_path / "no-py-spy")),
        output=OutputConfig(dir=tmp_path / "out"),
        metrics=MetricsConfig(timeout_s=0.5),
        gpu=False,
    )
    checks = {c.name: c for c in run_checks(config)}
    assert "2 vLLM servers found" in checks["targets"].detail
    assert checks["target opt-125m@8000"].status is Status.OK
    assert checks["target qwen2.5-0.5b@8001"].status is Status.OK
    assert "target" not in checks


def test_aggregate_takes_the_host_of_a_deployment_folder_from_its_index(tmp_path: Path) -> None:
    """`aggregate OUT` over a multi-target daemon's OUT/<host>/<deployment>/ folders: the host
    is the index's, not the deployment folder's name; an old OUT/<host>/ reads as before."""
    import json

    from sidecar.fleet.source import local_host_folders

    for folder, index in (("h/m@8000", {"host": "h", "deployment": "m@8000"}),
                          ("old", {"host": "old"})):  # fmt: skip
        os.makedirs(tmp_path / folder / "20260101T000000Z")
        (tmp_path / folder / "index.json").write_text(json.dumps({"schema": 1, **index}))
    assert local_host_folders(tmp_path) == [("h", tmp_path / "h" / "m@8000"),
                                            ("old", tmp_path / "old")]  # fmt: skip
    assert local_host_folders(tmp_path / "h") == [("h", tmp_path / "h" / "m@8000")]


# ---------------------------------------------------------------- one server's target beside targets:


@pytest.mark.parametrize(
    ("args", "env", "file"),
    [
        (["--pid", "4242"], {}, ""),
        (["--pid-file", "/run/vllm.pid"], {}, ""),
        ([], {"VLLM_SIDECAR_TARGET_PID": "4242"}, ""),
        ([], {}, "target:\n  pid: 4242\n"),
    ],
)
@pytest.mark.parametrize("command", ["run", "doctor"])
def test_run_and_doctor_refuse_a_single_target_beside_targets(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    args: list[str],
    env: dict[str, str],
    file: str,
) -> None:
    """targets: follows the servers its entries name: a --pid (or target.pid, pid_file) would
    be silently ignored; refused at start (exit 2), naming the fix. Neither the daemon nor
    the checks run (stubs here: without the refusal they would be called)."""
    import sidecar.daemon.multi_target
    import sidecar.doctor
    from sidecar.cli import main

    called: list[str] = []
    monkeypatch.setattr(sidecar.daemon.multi_target, "MultiTargetDaemon",
                        lambda *a, **k: called.append("daemon"))  # fmt: skip
    monkeypatch.setattr(sidecar.doctor, "run_checks", lambda config: called.append("doctor") or [])
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = write_config(tmp_path / "sidecar.yaml", extra=f"targets: [{{discover: true}}]\n{file}")
    assert main([command, "--config", str(path), *args]) == 2
    err = capsys.readouterr().err
    assert "lists the servers this daemon follows" in err
    assert "add it to targets: as an entry" in err and "or remove targets:" in err
    assert called == []


def test_snapshot_takes_one_server_from_a_config_that_lists_a_fleet(tmp_path: Path) -> None:
    """`snapshot --pid N --config fleet.yaml` is legal: the refusal is run's and doctor's."""
    from sidecar.config.settings import SNAPSHOT_DEFAULTS

    path = write_config(tmp_path / "sidecar.yaml", extra="targets: [{discover: true}]\n")
    config = load_config(path, {}, {"target.pid": 4242}, defaults=SNAPSHOT_DEFAULTS)
    assert config.target.pid == 4242 and config.targets


def test_a_reload_that_adds_a_single_target_beside_targets_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    caplog.set_level(logging.INFO, logger="vllm_sidecar")
    host = Host()
    host.start(server(100, 8000))
    path = write_config(tmp_path / "sidecar.yaml", extra="targets: [{discover: true}]\n")
    d = MultiTargetDaemon(load_config(path, {}), config_path=path, environ={}, clock=host.time.clock,
                          wall_clock=host.time.wall, wait=host.wait,
                          builders=builders(FakeStore(), deployment_store=lambda c, n: FakeStore()),
                          find_all_targets=host.find_all, alive=host.alive,
                          make_collector=host.collector)  # fmt: skip
    host.daemon = d
    before = d.config

    def reload() -> None:
        write_config(path, interval="120s",
                     extra="targets: [{discover: true}]\ntarget:\n  pid: 4242\n")  # fmt: skip
        d.signals.reload.set()

    host.at(T0 + 90, reload)
    host.stop_at(T0 + 200)
    d.serve()
    assert d.config is before
    assert any("reload failed" in r.getMessage() and "target.pid 4242" in r.getMessage()
               for r in caplog.records)  # fmt: skip


# ---------------------------------------------------------------- upload threads at stop and reload


class StuckUploads:
    """An upload thread whose store never answers: each join waits its whole timeout (on the
    fake clock) and the thread runs on. Its events go to one log shared by all."""

    def __init__(self, name: str, url: str | None, log: list[tuple[str, str, float]],
                 host: Host) -> None:  # fmt: skip
        self.name, self.url, self.log, self.host = name, url, log, host
        self.uploader = self
        self.on_change: Callable[[Any], None] | None = None

    def held(self, name: str) -> bool:
        return True

    def status(self) -> str:
        return "status"

    def start(self, clean_staging: bool = True) -> None:
        self.log.append(("start" if clean_staging else "start, staging kept", self.name, 0.0))

    def wake(self) -> None:
        pass

    def request_stop(self) -> None:
        self.log.append(("request_stop", self.name, 0.0))

    def join(self, timeout: float) -> bool:
        self.log.append(("join", self.name, timeout))
        self.host.time.advance(timeout)
        return False

    def stop(self, timeout: float = 30.0) -> bool:
        self.request_stop()
        return self.join(timeout)


def stuck_fleet(host: Host, path: Path, log: list[tuple[str, str, float]]) -> MultiTargetDaemon:
    def uploads(config: Config, store: Any) -> StuckUploads:
        return StuckUploads(store.name, config.upload.url, log, host)

    def store(config: Config, name: str) -> FakeStore:
        s = host.stores.setdefault(name, FakeStore())
        s.name = name  # type: ignore[attr-defined]
        return s

    d = MultiTargetDaemon(load_config(path, {}), config_path=path, environ={},
                          clock=host.time.clock, wall_clock=host.time.wall, wait=host.wait,
                          builders=builders(FakeStore(), deployment_store=store, uploads=uploads),
                          find_all_targets=host.find_all, alive=host.alive,
                          make_collector=host.collector)  # fmt: skip
    host.daemon = d
    return d


def test_at_stop_every_upload_thread_is_asked_first_then_all_waited_for_together(
    tmp_path: Path,
) -> None:
    """Three deployments whose store hangs: all three are asked to stop before any is waited
    for, and the waits share one bound (30 s), not 3 x 30 s."""
    host = Host()
    for i in range(3):
        host.start(server(100 * (i + 1), 8000 + i))
    path = write_config(tmp_path / "sidecar.yaml",
                        extra="targets: [{discover: true}]\nupload:\n  url: s3://b/a\n")  # fmt: skip
    log: list[tuple[str, str, float]] = []
    d = stuck_fleet(host, path, log)
    host.stop_at(T0 + 30)
    d.serve()
    stopping = [e for e in log if e[0] != "start"]
    assert [e[0] for e in stopping] == ["request_stop"] * 3 + ["join"] * 3
    assert sum(timeout for _, _, timeout in stopping) == 30.0


def test_a_reload_stops_the_replaced_upload_threads_together_before_any_new_one_starts(
    tmp_path: Path,
) -> None:
    host = Host()
    for i in range(3):
        host.start(server(100 * (i + 1), 8000 + i))
    fleet_yaml = "targets: [{discover: true}]\nupload:\n  url: s3://b/%s\n"
    path = write_config(tmp_path / "sidecar.yaml", extra=fleet_yaml % "a")
    log: list[tuple[str, str, float]] = []
    d = stuck_fleet(host, path, log)

    def reload() -> None:
        write_config(path, extra=fleet_yaml % "b")
        d.signals.reload.set()

    host.at(T0 + 90, reload)
    host.stop_at(T0 + 200)
    d.serve()
    at_reload = log[3:9]  # after the three first starts, before the three new ones
    assert [e[0] for e in at_reload] == ["request_stop"] * 3 + ["join"] * 3
    assert sum(timeout for _, _, timeout in at_reload) == 30.0
    # the old threads never ended: their staging is left for the next start to remove
    assert [e[0] for e in log[9:12]] == ["start, staging kept"] * 3


# ---------------------------------------------------------------- a server removed for good


def target_up(d: MultiTargetDaemon) -> dict[str, float]:
    return {labels["deployment"]: v for labels, v in samples(d, "vllm_sidecar_target_up")}


def test_a_server_down_past_forget_after_leaves_the_exporter_and_keeps_its_folder() -> None:
    """m@8001 stops for good: `target_up 0` while it may come back, then after
    target.forget_after_s none of its series (so VllmTargetDown resolves); its store and open
    gap are kept. The default is an hour."""
    assert Config().target.forget_after_s == 3600
    host = Host()
    one, two = server(100, 8000), server(200, 8001)
    host.start(one)
    host.start(two)
    host.at(T0 + 75, lambda: host.stop(two))
    config = replace(FLEET, target=replace(FLEET.target, forget_after_s=600.0))
    d = fleet(host, config)
    seen: dict[float, dict[str, float]] = {}

    def look(when: float) -> None:
        host.at(when, lambda: seen.__setitem__(when, target_up(d)))

    look(T0 + 600)  # down 525 s: still exported as down
    look(T0 + 700)  # down 625 s: forgotten
    host.stop_at(T0 + 800)
    d.serve()
    assert seen[T0 + 600] == {"m@8000": 1, "m@8001": 0}
    assert seen[T0 + 700] == {"m@8000": 1}
    exported = {labels.get("deployment") for family in SidecarCollector(d.group).collect()
                for labels in (s.labels for s in family.samples)}  # fmt: skip
    assert "m@8001" not in exported and "m@8000" in exported
    gone = host.stores["m@8001"]
    assert len(gone.written) == 2 and gone.gaps[0]["from"] == iso(T0 + 80)
    assert "m@8001" in d.members  # its folder and upload backlog go on


def test_a_forgotten_server_that_comes_back_is_exported_again_with_its_counters() -> None:
    host = Host()
    first, again = server(100, 8000), server(500, 8000)
    host.start(first)
    host.at(T0 + 75, lambda: host.stop(first))
    host.at(T0 + 1000, lambda: host.start(again))
    config = replace(FLEET, target=replace(FLEET.target, forget_after_s=600.0))
    d = fleet(host, config)
    host.stop_at(T0 + 1100)
    d.serve()
    assert target_up(d) == {"m@8000": 1}
    [(_, restarts)] = samples(d, "vllm_sidecar_target_restarts")
    assert restarts == 1


def test_forget_after_off_keeps_a_down_server_exported() -> None:
    host = Host()
    host.start(server(100, 8000))
    two = server(200, 8001)
    host.start(two)
    host.at(T0 + 75, lambda: host.stop(two))
    config = replace(FLEET, target=replace(FLEET.target, forget_after_s=None))
    d = fleet(host, config)
    host.stop_at(T0 + 3 * 3600)
    d.serve()
    assert target_up(d) == {"m@8000": 1, "m@8001": 0}


def test_forget_after_is_a_duration_or_null(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c.yaml", extra="target:\n  forget_after_s: 2h\n")
    assert load_config(path, {}).target.forget_after_s == 7200
    path = write_config(tmp_path / "c.yaml", extra="target:\n  forget_after_s: null\n")
    assert load_config(path, {}).target.forget_after_s is None
    env = {"VLLM_SIDECAR_TARGET_FORGET_AFTER_S": "0"}
    with pytest.raises(ConfigError, match=r"target\.forget_after_s"):
        load_config(None, env)


# ---------------------------------------------------------------- a window that raises


class Raising:
    """A collector whose window raises `error` (for `name` only; the others run as usual)."""

    def __init__(self, host: Host, name: str, error: Exception) -> None:
        self.host, self.name, self.error = host, name, error
        self.firsts: list[bool] = []

    def __call__(self, target: Deployment, first: bool) -> Any:
        self.firsts.append(first)
        if deployment_id(target).name == self.name:
            raise self.error
        return Collector(self.host, target)


def failures(d: MultiTargetDaemon, kind: str) -> dict[str, float]:
    return {labels["deployment"]: v for labels, v in samples(d, "vllm_sidecar_window_failures")
            if labels["kind"] == kind}  # fmt: skip


def test_a_window_that_raises_is_counted_on_its_own_deployment_and_the_loop_goes_on() -> None:
    host = Host()
    host.start(server(100, 8000))
    host.start(server(200, 8001))
    collector = Raising(host, "m@8001", OSError(5, "Input/output error"))
    d = fleet(host, make_collector=collector)
    host.stop_at(T0 + 2 * INTERVAL + 30)
    d.serve()
    assert len(host.stores["m@8000"].written) == 3 and host.stores["m@8001"].written == []
    # the daemon's own state (deployment "") has none; the healthy deployment none
    assert failures(d, "reader") == {"": 0, "m@8000": 0, "m@8001": 3}
    assert collector.firsts[0] is True and not any(collector.firsts[2:])


def test_the_daemons_first_window_failing_to_attach_to_a_live_server_is_a_failed_start() -> None:
    """ptrace is the host's, not one server's: the first window of all refused is exit 4."""
    host = Host()
    host.start(server(100, 8000))
    d = fleet(host, make_collector=Raising(host, "m@8000", AttachError("ptrace refused")))
    with pytest.raises(AttachError, match="ptrace refused"):
        d.serve()


def test_a_bug_in_a_window_is_not_counted_but_raised() -> None:
    host = Host()
    host.start(server(100, 8000))
    d = fleet(host, make_collector=Raising(host, "m@8000", KeyError("a bug")))
    with pytest.raises(KeyError):
        d.serve()


# ---------------------------------------------------------------- always on, per deployment


def test_each_deployment_is_watched_while_it_is_up() -> None:
    host = Host()
    one, two = server(100, 8000), server(200, 8001)
    host.start(one)
    host.start(two)
    host.at(T0 + 75, lambda: host.stop(two))
    d = fleet(host)
    seen: dict[str, object] = {}
    host.at(T0 + 30, lambda: seen.update(
        {f"{n} up": m.always.target for n, m in d.members.items() if m.always}))  # fmt: skip
    host.stop_at(T0 + 2 * INTERVAL)
    d.serve()
    assert seen == {"m@8000 up": one, "m@8001 up": two}
    watched = {n: m.always.target for n, m in d.members.items() if m.always}
    assert watched == {"m@8000": one, "m@8001": None}  # the stopped one: no watch
    # Not run as a process (`serve`, not `run`): no threads were started for them.
    assert not any(m.always.running for m in d.members.values() if m.always)


@dataclass
class StubMember:
    """A deployment's AlwaysOn as FleetAlwaysOn sees it: its target and its `take`."""

    target: object
    answer: tuple[tuple[str, ...], str | None] | Exception
    closed: bool = False
    took: float | None = None

    def take(self, cause: Cause) -> tuple[tuple[str, ...], str | None]:
        self.took = time.monotonic()
        time.sleep(0.2)  # a snapshot takes a while: all deployments' run at once
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def close(self) -> None:
        self.closed = True


def fleet_trigger(members: dict[str, StubMember]) -> FleetAlwaysOn:
    stop = threading.Event()
    return FleetAlwaysOn(lambda: cast(dict[str, AlwaysOn], members), lambda: None, None, None,
                         None, time.monotonic, time.time, stop)  # fmt: skip


def test_a_fleet_trigger_takes_every_deployment_up_at_once_and_answers_every_folder() -> None:
    members = {
        "m@8001": StubMember(object(), (("/out/h/m@8001/20261202T120000Z",), None)),
        "m@8000": StubMember(object(), (("/out/h/m@8000/20261202T120000Z",), None)),
        "m@8002": StubMember(None, (("/never",), None)),  # down: not asked
        "m@8003": StubMember(object(), ((), "not sampled: py-spy could not attach")),
        "m@8004": StubMember(object(), RuntimeError("a bug")),
    }
    always = fleet_trigger(members)
    cause = Cause(CauseKind.SIGNAL, "SIGUSR1", "2026-12-02T12:00:00Z")
    folders, error = always.take(cause)
    assert error is None and folders
    # Every folder taken, in the deployments' order; the failed ones are logged.
    assert list(folders) == ["/out/h/m@8000/20261202T120000Z",
                             "/out/h/m@8001/20261202T120000Z"]  # fmt: skip
    assert members["m@8002"].took is None
    took = [m.took for m in members.values() if m.took is not None]
    assert max(took) - min(took) < 0.2  # at once, not one after another
    always.close()
    assert all(m.closed for m in members.values())


def test_a_fleet_trigger_says_why_when_no_deployment_gave_a_snapshot() -> None:
    assert fleet_trigger({}).take(Cause(CauseKind.SOCKET, "x", "2026-12-02T12:00:00Z")) == (
        (), "no vLLM server of targets: is up now")  # fmt: skip
    failed = {"m@8000": StubMember(object(), ((), "not sampled: gone")),
              "m@8001": StubMember(object(), RuntimeError("a bug"))}  # fmt: skip
    folders, error = fleet_trigger(failed).take(
        Cause(CauseKind.SOCKET, "x", "2026-12-02T12:00:00Z"))  # fmt: skip
    assert folders == ()
    assert error == "m@8000: not sampled: gone; m@8001: RuntimeError: a bug"
