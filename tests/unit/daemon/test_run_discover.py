"""`run --discover` on a host of several vLLM servers profiles them all (issue 23, item 5): the
choice between the single daemon and the fleet (sidecar/daemon/choice.py) over recorded /proc
trees, what the output folder already holds deciding first; the single daemon's hand-over at
start, its messages of several servers, and `snapshot --discover`'s. No processes: the /proc
root and the output folder are the seams, the daemons' loops are driven with fake clocks
(test_daemon_loop.py, test_fleet_loop.py).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import sidecar.daemon.choice as choice_module
from sidecar.cli import main
from sidecar.config.load import load_config
from sidecar.config.settings import Config, MetricsConfig, OutputConfig, TargetConfig
from sidecar.config.targets import TargetSpec
from sidecar.daemon.choice import EVERY_SERVER, Kind, choose, start_daemon
from sidecar.daemon.host_folder import Layout, layout_of, one_server_hint, take_for_deployments
from sidecar.daemon.loop import Discovered, SeveralServers
from sidecar.daemon.multi_target import MultiTargetDaemon
from sidecar.errors import ConfigError
from sidecar.records.window import SamplingMode
from sidecar.target.discovery import AmbiguousTarget, Deployment, discover, servers_found
from sidecar.target.procfs import ProcFs
from tests.unit.daemon.test_daemon_loop import (
    CONFIG,
    INTERVAL,
    T0,
    FakeStore,
    World,
    builders,
    deployment,
    make_daemon,
    write_config,
)
from tests.unit.daemon.test_fleet_loop import Host, server

PROC = Path(__file__).resolve().parents[2] / "fixtures" / "proc"
TWO = ProcFs(PROC / "two_deployments")  # opt-125m on 8000 (pid 5100), qwen2.5-0.5b on 8001 (6100)
ONE = ProcFs(PROC / "v1_cpu")  # one vLLM CPU server, pid 4100
NONE = ProcFs(PROC / "odd_comm")  # no vLLM at all
HOST = socket.gethostname()


def discovering(out: Path, **target: Any) -> Config:
    """`run --discover --out OUT` as the CLI builds it (discovery on: the daemon's default)."""
    return replace(CONFIG, target=TargetConfig(**target), output=OutputConfig(dir=out))


# ---------------------------------------------------------------- which daemon


def test_two_servers_start_the_fleet_over_every_server(tmp_path: Path) -> None:
    """Before: the single daemon, which waited for ever ("Pick one with --pid")."""
    chosen = choose(discovering(tmp_path), TWO, tmp_path / HOST)
    assert chosen.kind is Kind.FLEET
    assert chosen.config.targets == EVERY_SERVER == (TargetSpec(discover=True),)
    assert chosen.config.target == TargetConfig()  # nothing else changes
    assert chosen.why == (
        "found 2 vLLM servers: pid 6100 (model qwen2.5-0.5b, port 8001); "
        "pid 5100 (model opt-125m, port 8000)"
    )


@pytest.mark.parametrize("procfs", [ONE, NONE], ids=["one server", "none yet"])
def test_one_server_or_none_yet_keeps_the_single_daemon(tmp_path: Path, procfs: ProcFs) -> None:
    """Exactly as before: the same config, OUT/<host>/; several at its start hand over."""
    config = discovering(tmp_path)
    chosen = choose(config, procfs, tmp_path / HOST)
    assert chosen.kind is Kind.SINGLE and chosen.config is config and chosen.hand_over


def test_a_named_target_is_never_the_fleet(tmp_path: Path) -> None:
    for target in ({"pid": 5100}, {"pid_file": tmp_path / "v.pid"}, {"discover": False}):
        chosen = choose(discovering(tmp_path, **target), TWO, tmp_path / HOST)
        assert chosen.kind is Kind.SINGLE and not chosen.hand_over


def test_a_config_with_targets_is_the_fleet_it_names(tmp_path: Path) -> None:
    config = replace(discovering(tmp_path), targets=(TargetSpec(pid=5100),))
    chosen = choose(config, ONE, tmp_path / HOST)
    assert chosen.kind is Kind.FLEET and chosen.config is config


def test_a_folder_per_server_keeps_the_fleet_with_one_server_up(tmp_path: Path) -> None:
    """Restarted while one of two servers is down: it goes on writing where it wrote."""
    folder = tmp_path / HOST
    deployment_folder(folder / "opt-125m@8000")
    assert layout_of(folder) is Layout.DEPLOYMENTS
    chosen = choose(discovering(tmp_path), ONE, folder)
    assert chosen.kind is Kind.FLEET and chosen.config.targets == EVERY_SERVER
    assert "holds a folder per vLLM server (opt-125m@8000)" in chosen.why


def test_one_servers_snapshots_keep_the_single_daemon_with_two_servers(tmp_path: Path) -> None:
    """Deployment folders beside them would be hidden from the readers (and read as this
    host's): the single daemon, its messages saying how to profile them all."""
    folder = tmp_path / HOST
    snapshot_folder(folder / "20261120T060000Z", "opt-125m@8000")
    assert layout_of(folder) is Layout.ONE_SERVER
    chosen = choose(discovering(tmp_path), TWO, folder)
    assert chosen.kind is Kind.SINGLE and not chosen.hand_over
    hint = one_server_hint(folder)
    assert f"{folder} holds one server's snapshots (opt-125m@8000)" in hint
    assert f"move everything in {folder} into {folder}/opt-125m@8000/" in hint
    assert "`targets: [{discover: true}]`" in hint and "--pid PID" in hint


def test_an_index_that_lists_nothing_is_no_servers_folder(tmp_path: Path) -> None:
    """What a single daemon leaves that found no server: neither keeps the count from
    deciding, and the fleet removes it (the readers would take the folder as one host)."""
    folder = tmp_path / HOST
    folder.mkdir()
    (folder / "index.json").write_text(json.dumps({"schema": 1, "host": HOST, "folders": [],
                                                   "gaps": [], "latest": None}))  # fmt: skip
    assert layout_of(folder) is Layout.NOTHING
    assert choose(discovering(tmp_path), TWO, folder).kind is Kind.FLEET
    take_for_deployments(folder)
    assert not (folder / "index.json").exists()
    # One that lists a gap is a history: kept, and the folder is one server's.
    (folder / "index.json").write_text(json.dumps({"schema": 1, "gaps": [{"from": "x"}]}))
    assert layout_of(folder) is Layout.ONE_SERVER
    take_for_deployments(folder)
    assert (folder / "index.json").exists()


def test_a_metrics_url_with_several_servers_is_refused_naming_the_fix(tmp_path: Path) -> None:
    config = replace(discovering(tmp_path), metrics=MetricsConfig(url="http://h:8000/metrics"))
    with pytest.raises(ConfigError) as raised:
        choose(config, TWO, tmp_path / HOST)
    assert raised.value.exit_code == 2
    assert str(raised.value).startswith("found 2 vLLM servers: pid 6100")
    assert "leave it out to profile them all" in str(raised.value)


def test_servers_found_are_those_discovery_chooses_between() -> None:
    """A foreign `vllm serve` title beside a real server (issue 26, item 19) is no second
    server: the single daemon takes the real one, as before."""
    foreign = ProcFs(PROC.parent / "proc_listen" / "foreign_title")
    assert len(discover(foreign)) == 2
    assert [d.root.pid for d in servers_found(foreign)] == [7661]
    assert [d.root.pid for d in servers_found(TWO)] == [6100, 5100]


# ---------------------------------------------------------------- `run` itself


class Started:
    """Stand-ins for the two daemons: what `run` constructed and with what."""

    def __init__(self, several_at_start: bool = False) -> None:
        self.made: list[tuple[str, Config, dict[str, Any]]] = []
        self.several_at_start = several_at_start

    def single(self, config: Config, **kw: Any) -> Any:
        self.made.append(("single", config, kw))
        return self

    def fleet(self, config: Config, **kw: Any) -> Any:
        self.made.append(("fleet", config, kw))
        return self

    def run(self) -> int:
        if self.made[-1][0] == "single" and self.several_at_start:
            raise SeveralServers("found 2 vLLM servers: pid 1 (model a, port 1); pid 2 (...)")
        return 0


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Started:
    s = Started()
    monkeypatch.setattr(choice_module, "Daemon", s.single)
    monkeypatch.setattr(choice_module, "MultiTargetDaemon", s.fleet)
    return s


def run_discover(tmp_path: Path, proc: Path, *more: str) -> int:
    return main(["run", "--discover", "--proc-root", str(proc), "--out", str(tmp_path / "out"),
                 "--no-gpu", "--exporter-listen", "off", *more])  # fmt: skip


def test_run_discover_with_two_servers_starts_the_fleet(tmp_path: Path, started: Started) -> None:
    assert run_discover(tmp_path, TWO.root, "--window", "20s", "--interval", "30s") == 0
    [(kind, config, kw)] = started.made
    assert kind == "fleet" and config.targets == EVERY_SERVER
    assert config.schedule.window_s == 20 and config.target.proc_root == TWO.root
    # A reload reads the file over these defaults: the fleet stays the fleet.
    assert kw["defaults"].targets == EVERY_SERVER


def test_run_discover_with_one_server_starts_the_single_daemon(
    tmp_path: Path, started: Started
) -> None:
    assert run_discover(tmp_path, ONE.root) == 0
    [(kind, config, kw)] = started.made
    assert kind == "single" and not config.targets
    assert config.sampling.mode is SamplingMode.CONTINUOUS  # the daemon's default, as before
    discovered = kw["discovered"]
    assert isinstance(discovered, Discovered) and discovered.hand_over


def test_run_pid_starts_the_single_daemon_as_before(tmp_path: Path, started: Started) -> None:
    assert main(["run", "--pid", "5100", "--proc-root", str(TWO.root), "--out",
                 str(tmp_path), "--exporter-listen", "off"]) == 0  # fmt: skip
    [(kind, config, kw)] = started.made
    assert kind == "single" and config.target.pid == 5100 and "discovered" not in kw


def test_several_servers_at_the_single_daemons_start_hand_over_to_the_fleet(
    tmp_path: Path, started: Started
) -> None:
    started.several_at_start = True
    config = discovering(tmp_path)
    assert start_daemon(config, None, {}, NONE) == 0
    assert [kind for kind, _, _ in started.made] == ["single", "fleet"]
    assert started.made[1][1].targets == EVERY_SERVER


# ---------------------------------------------------------------- the single daemon of `run --discover`


def several(*roots: int) -> AmbiguousTarget:
    servers = tuple(deployment(r) for r in roots)
    return AmbiguousTarget(f"found {len(roots)} vLLM servers: ...", servers)


def hint(name: str | None) -> str:
    return f"HINT(profiled={name})"


def test_several_servers_at_start_raise_the_hand_over_not_stopping() -> None:
    world = World()
    world.found = several(100, 200)
    d, _ = make_daemon(world, discovered=Discovered(True, hint))
    stopping: list[str] = []
    d.notifier.stopping = lambda: stopping.append("stopping")  # type: ignore[method-assign]
    with pytest.raises(SeveralServers, match=r"^found 2 vLLM servers: \.\.\.$"):
        d.serve()
    assert world.windows == [] and stopping == []  # systemd is not told it stops


def test_without_the_hand_over_several_servers_say_the_hint_not_run_discover() -> None:
    """Its folder holds one server's snapshots: telling it to run `run --discover`, which it
    is, would send the operator in a circle."""
    world = World()
    world.found = several(100, 200)
    d, _ = make_daemon(world, discovered=Discovered(False, hint))
    with pytest.raises(AmbiguousTarget) as raised:
        d.serve()
    assert str(raised.value) == "found 2 vLLM servers: .... HINT(profiled=None) (waited 120 s)"
    assert raised.value.exit_code == 2


def test_after_its_server_went_several_say_the_hint_with_its_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="vllm_sidecar")
    world = World()
    first = deployment(100)
    world.start(first)
    world.time.at(T0 + 75, lambda: (world.kill(*first.processes),
                                    setattr(world, "found", several(200, 300))))  # fmt: skip
    d, _ = make_daemon(world, discovered=Discovered(True, hint))  # the start is long past
    world.stop_at(T0 + 200)
    d.serve()
    assert d.failures.counts["discovery_ambiguous"] > 1
    [said] = [r.getMessage() for r in caplog.records if "discovery_ambiguous" in r.getMessage()]
    assert said.startswith("discovery_ambiguous failure: found 2 vLLM servers: .... "
                           "HINT(profiled=m@8000);")  # fmt: skip


def test_a_server_beside_the_target_for_two_windows_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One beside it for a window only (a redeploy's overlap) is not."""
    caplog.set_level(logging.INFO, logger="vllm_sidecar")
    world = World()
    target, overlap, second = deployment(100), server(200, 8001), server(300, 8002)
    world.start(target)
    beside: list[Deployment] = []

    def others(procfs: ProcFs) -> list[Deployment]:
        return [target, *beside]

    world.time.at(T0 + 30, lambda: beside.append(overlap))
    world.time.at(T0 + 90, lambda: beside.remove(overlap))
    world.time.at(T0 + 150, lambda: beside.append(second))
    d, _ = make_daemon(world, discovered=Discovered(False, hint, others))
    world.stop_at(T0 + 6 * INTERVAL + 30)
    d.serve()
    said = [r.getMessage() for r in caplog.records if "runs beside" in r.getMessage()]
    assert said == [
        f"another vLLM server runs beside pid {target.root.pid}, which this daemon profiles: "
        f"pid {second.root.pid} (model m, port 8002) is not profiled. HINT(profiled=m@8000)"
    ]


# ---------------------------------------------------------------- the fleet of `run --discover`


def test_the_fleet_stays_the_fleet_through_a_reload(tmp_path: Path) -> None:
    """The file has no `targets:`: a reload reads it over the fleet's defaults, so it keeps
    every server (and the windows mode), with no 'targets: removed' warning."""
    host = Host()
    host.start(server(100, 8000))
    host.start(server(200, 8001))
    path = write_config(tmp_path / "sidecar.yaml")
    config = replace(load_config(path, {}), targets=EVERY_SERVER)
    d = MultiTargetDaemon(config, config_path=path, environ={}, clock=host.time.clock,
                          wall_clock=host.time.wall, wait=host.wait,
                          builders=builders(FakeStore(), deployment_store=lambda c, n: FakeStore()),
                          find_all_targets=host.find_all, alive=host.alive,
                          make_collector=host.collector,
                          defaults=replace(Config(), targets=EVERY_SERVER))  # fmt: skip
    host.daemon = d

    def reload() -> None:
        write_config(path, interval="120s")
        d.signals.reload.set()

    host.at(T0 + 90, reload)
    host.stop_at(T0 + 400)
    d.serve()
    assert d.config.targets == EVERY_SERVER and d.config.schedule.interval_s == 120
    for m in d.members.values():
        assert not m.parts.schedule.continuous
    assert sorted(host.starts("m@8000") + host.starts("m@8001"))  # both profiled


# ---------------------------------------------------------------- `snapshot --discover`


def test_snapshot_discover_with_two_servers_names_both_and_how_to_choose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `pid 6100 (/opt/venv/bin/python3 /opt/venv/bin/vllm serve /models/qwen2.5-0.`
    and "Pick one with --pid." alone."""
    code = main(["snapshot", "--discover", "--proc-root", str(TWO.root), "--out",
                 str(tmp_path), "--no-gpu"])  # fmt: skip
    assert code == ConfigError.exit_code == 2
    err = capsys.readouterr().err
    assert err.startswith("vllm-sidecar: error: found 2 vLLM servers: pid 6100 (model "
                          "qwen2.5-0.5b, port 8001); pid 5100 (model opt-125m, port 8000)")  # fmt: skip
    assert "Pick one with --pid PID, or profile them all with `vllm-sidecar run --discover`" in err
    assert "`targets: [{discover: true}]`" in err
    assert not any(tmp_path.iterdir())  # nothing written


# ---------------------------------------------------------------- helpers


def snapshot_folder(path: Path, deployment_name: str) -> None:
    os.makedirs(path)
    (path / "summary.json").write_text(json.dumps({"deployment": deployment_name}))


def deployment_folder(path: Path) -> None:
    snapshot_folder(path / "20261120T060000Z", path.name)
    (path / "index.json").write_text(json.dumps({"schema": 1, "host": HOST,
                                                 "deployment": path.name}))  # fmt: skip
