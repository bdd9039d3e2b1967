"""One daemon, several real vLLM CPU servers on this host (sidecar/daemon/multi_target.py): it profiles both,
one stops and a third starts, the others lose nothing, and the exporter tells them apart.

The daemon runs as operators run it (the console script, a config with `targets:`), signalled
with real signals. Two servers run at a time at most (the session's and one of the test's);
every process the test started is stopped at the end.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import sidecar_proc
from devtools.server import VllmServer, free_port
from sidecar.cli import main
from sidecar.store.layout import SNAPSHOT_NAME
from sidecar.trend.source import host_folders

pytestmark = pytest.mark.integration
SIDECAR = str(Path(sys.executable).with_name("vllm-sidecar"))
FILES = {"summary.json", "stacks.parquet", "stacks.collapsed"}


class Fleet:
    """The daemon process, its output folder and its exporter."""

    def __init__(self, tmp: Path) -> None:
        self.out, self.port = tmp / "out", free_port()
        self.log = tmp / "daemon.log"
        self.config = config = tmp / "fleet.yaml"
        config.write_text("targets:\n  - discover: true\ntrigger:\n  window_s: 3s\n")
        args = [SIDECAR, "run", "--config", str(config), "--out", str(self.out),
                "--exporter-listen", f"127.0.0.1:{self.port}", "--rate", "10",
                "--cpu-budget", "off", "--window", "2s", "--interval", "10s"]  # fmt: skip
        # A session of its own, as a service runs (devtools/sidecar_proc.py says why).
        with self.log.open("wb") as log:
            self.proc = sidecar_proc.spawn(args, stdout=log, stderr=subprocess.STDOUT)

    @staticmethod
    def deployment(server: VllmServer) -> str:
        return f"tiny@{server.port}"

    def folder(self, server: VllmServer) -> Path:
        return self.out / socket.gethostname() / self.deployment(server)

    def snapshots(self, server: VllmServer) -> list[Path]:
        folder = self.folder(server)
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.iterdir() if SNAPSHOT_NAME.match(p.name))

    def wait_for(self, server: VllmServer, count: int, timeout_s: float = 120) -> list[Path]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            if len(found := self.snapshots(server)) >= count:
                return found
            time.sleep(0.5)
        raise AssertionError(f"{len(self.snapshots(server))} snapshots of {server.port} after "
                             f"{timeout_s} s:\n" + self.log.read_text()[-3000:])  # fmt: skip

    def wait_down(self, server: VllmServer, timeout_s: float = 60) -> None:
        """Until the daemon has seen `server` go (its `target_up` 0)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if gauge(self.metrics(), "target_up", self.deployment(server)) == [0.0]:
                return
            time.sleep(0.5)
        raise AssertionError(f"{server.port} not seen down after {timeout_s} s:\n"
                             + self.log.read_text()[-3000:])  # fmt: skip

    def index(self, server: VllmServer) -> dict[str, object]:
        return json.loads((self.folder(server) / "index.json").read_text())  # type: ignore[no-any-return]

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return r.read().decode()  # type: ignore[no-any-return]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


@pytest.fixture
def fleets() -> Iterator[list[Fleet]]:
    started: list[Fleet] = []
    yield started
    for f in started:
        if f.proc.poll() is None:
            sidecar_proc.kill(f.proc, 30)


def gauge(metrics: str, name: str, deployment: str) -> list[float]:
    pattern = rf'^vllm_sidecar_{name}\{{[^}}]*deployment="{re.escape(deployment)}"[^}}]*\}} (\S+)$'
    return [float(v) for v in re.findall(pattern, metrics, re.M)]


def test_one_daemon_follows_two_servers_then_a_third(
    tmp_path: Path,
    fleets: list[Fleet],
    capsys: pytest.CaptureFixture[str],
    vllm_server: VllmServer,
) -> None:
    # The session's server is A (discovery would find it anyway): two servers at a time, and
    # one start fewer than three of the test's own.
    a = vllm_server
    with VllmServer(log_path=tmp_path / "b.log") as b:
        fleet = Fleet(tmp_path)  # after both are up: the wait at start is not under test
        fleets.append(fleet)
        fleet.wait_for(a, 2)
        fleet.wait_for(b, 2)
        both = fleet.metrics()
        # `vllm-sidecar trigger`: a snapshot of every deployment up, each folder a line.
        asked = subprocess.run([SIDECAR, "trigger", "--config", str(fleet.config), "--out",
                                str(fleet.out), "--reason", "fleet test"], capture_output=True,
                               text=True, timeout=180)  # fmt: skip
        assert asked.returncode == 0, asked.stderr + fleet.log.read_text()[-3000:]
        triggered = [Path(line) for line in asked.stdout.splitlines()]
    # A window of b's running when it stopped is kept (partial): count once the daemon saw it go.
    fleet.wait_down(b)
    b_stopped = len(fleet.snapshots(b))
    a_before = len(fleet.snapshots(a))
    with VllmServer(log_path=tmp_path / "c.log") as c:
        fleet.wait_for(c, 2)
        fleet.wait_for(a, a_before + 2)
        a_seen = len(fleet.snapshots(a))
        after = fleet.metrics()
        a_seen_after = len(fleet.snapshots(a))
        assert fleet.stop() == 0
    log = fleet.log.read_text()
    ta, tb, tc = (fleet.deployment(s) for s in (a, b, c))
    # Each server its own folder, every snapshot of it complete and of its own server.
    for server, name in ((a, ta), (b, tb), (c, tc)):
        found = fleet.snapshots(server)
        assert found, log[-3000:]
        for folder in found:
            assert {p.name for p in folder.iterdir()} == FILES, folder
            summary = json.loads((folder / "summary.json").read_text())
            assert summary["deployment"] == name
            assert summary["target"]["root_pid"] == server.pid
        assert fleet.index(server)["deployment"] == name
    # The trigger: one folder per deployment, each of its own server and marked with its cause.
    assert sorted(p.parent.name for p in triggered) == sorted((ta, tb)), asked.stdout
    for folder in triggered:
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["cause"]["kind"] == "socket" and summary["cause"]["detail"] == "fleet test"
    # Each deployment is watched for stalls: its engine state, labelled with its deployment.
    for name in (ta, tb):
        states = re.findall(rf'engine_state\{{[^}}]*deployment="{re.escape(name)}"[^}}]*'
                            r'state="(\w+)"\} 1', both)  # fmt: skip
        assert states and states[0] in {"idle", "ok"}, both
    # The stopped one: down, one gap, nothing written after it went; the others: no gap.
    assert len(fleet.snapshots(b)) == b_stopped
    assert len(fleet.index(b)["gaps"]) == 1  # type: ignore[arg-type]
    assert fleet.index(a)["gaps"] == [] and fleet.index(c)["gaps"] == []
    # A lost nothing: every window it began was written (no failure of any kind). The counter
    # moves after the folder appears (the store renames it into place, then counts it, then
    # the exporter hears): read between two counts of folders, it may lag the first by one.
    (written,) = gauge(after, "snapshots_written_total", ta)
    assert a_seen - 1 <= written <= a_seen_after, (a_seen, written, a_seen_after)
    assert not any(gauge(after, "window_failures_total", ta)), after
    # The exporter tells them apart: each deployment its own series and root start.
    assert gauge(both, "target_up", ta) == [1.0] and gauge(both, "target_up", tb) == [1.0]
    assert gauge(after, "target_up", tb) == [0.0] and gauge(after, "target_up", tc) == [1.0]
    roots = set(re.findall(r'sampling_samples_per_second\{[^}]*deployment="([^"]+)"'
                           r'[^}]*root_start="(\d+)"', both))  # fmt: skip
    assert {d for d, _ in roots} >= {ta, tb} and len({r for _, r in roots}) == len(roots)
    assert gauge(after, "sampling_samples_per_second", tb) == []  # a gone server's gauges go
    shares = re.findall(rf'phase_ratio\{{[^}}]*deployment="{re.escape(tc)}"[^}}]*\}}', after)
    assert shares, after
    # The readers take each deployment folder as they take a host folder.
    assert {p.name for p in host_folders(fleet.out, None)} >= {ta, tb, tc}
    host = socket.gethostname()
    assert main(["trend", str(fleet.out), "--host", f"{host}/{ta}", "--format", "json"]) == 0
    trend = json.loads(capsys.readouterr().out)
    assert trend["host"] == f"{host}/{ta}" and trend["rows"] == len(fleet.snapshots(a))
    assert main(["aggregate", str(fleet.out), "--format", "json"]) == 0
    report = capsys.readouterr().out
    assert all(name in report for name in (ta, tb, tc)) and f'"{host}"' in report
