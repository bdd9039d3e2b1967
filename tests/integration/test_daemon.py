"""`vllm-sidecar run` against a real vLLM CPU server, with intervals of seconds.

The daemon runs as operators run it: the console script in its own process, signalled with
real signals. Every test stops what it started, even when it fails.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import sidecar_proc
from devtools.server import VllmServer, free_port
from sidecar.store.folders import StoredSnapshot
from sidecar.store.layout import LOCK_NAME
from sidecar.store.trend_table import PARTS_DIR

pytestmark = pytest.mark.integration
SIDECAR = str(Path(sys.executable).with_name("vllm-sidecar"))
FILES = {"summary.json", "stacks.parquet", "stacks.collapsed"}


class Running:
    """One daemon process and where it writes."""

    def __init__(self, out: Path, pid_file: Path, *extra: str, budget: str = "off") -> None:
        self.out, self.port = out, free_port()
        self.log = out.parent / f"daemon-{self.port}.log"
        # The windows mode's schedule (continuous mode: test_always_on_live.py).
        args = [SIDECAR, "run", "--mode", "windows", "--pid-file", str(pid_file),
                "--out", str(out), "--exporter-listen", f"127.0.0.1:{self.port}", "--rate", "10",
                "--cpu-budget", budget, *extra]  # fmt: skip
        # A session of its own, as a service runs (devtools/sidecar_proc.py says why).
        with self.log.open("wb") as log:
            self.proc = sidecar_proc.spawn(args, stdout=log, stderr=subprocess.STDOUT)

    def host_dir(self) -> Path:
        dirs = [d for d in self.out.iterdir() if d.is_dir()] if self.out.exists() else []
        return dirs[0] if dirs else self.out / "missing"

    def snapshots(self) -> list[Path]:
        host = self.host_dir()
        if not host.exists():
            return []
        return sorted(d for d in host.iterdir() if d.is_dir() and not d.name.startswith("."))

    def wait_for(self, count: int, timeout_s: float = 90) -> list[Path]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            if len(found := self.snapshots()) >= count:
                return found
            time.sleep(0.2)
        raise AssertionError(f"{len(self.snapshots())} snapshots after {timeout_s} s:\n"
                             + self.log.read_text()[-3000:])  # fmt: skip

    def index(self) -> dict[str, object]:
        return json.loads((self.host_dir() / "index.json").read_text())  # type: ignore[no-any-return]

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return r.read().decode()  # type: ignore[no-any-return]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL the daemon's whole group (py-spy included) and reap it."""
        sidecar_proc.kill(self.proc, 30)


def leftovers(host: Path) -> list[str]:
    """What a writer left half-done: hidden names in the host folder (but the store's own: the
    trend table's parts folder, and the daemon's lock file, kept between runs as flock locks
    are) and temporary files inside that folder."""
    own = (PARTS_DIR, LOCK_NAME)
    out = [p.name for p in host.iterdir() if p.name.startswith(".") and p.name not in own]
    parts = host / PARTS_DIR
    return out + ([p.name for p in parts.iterdir() if p.name.startswith(".")]
                  if parts.is_dir() else [])  # fmt: skip


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for d in started:
        if d.proc.poll() is None:
            d.kill()


@pytest.fixture
def pid_file(tmp_path: Path, vllm_server: VllmServer) -> Path:
    path = tmp_path / "vllm.pid"
    path.write_text(f"{vllm_server.pid}\n")
    return path


def complete(folder: Path) -> bool:
    names = {f.name for f in folder.iterdir()}
    if names != FILES:
        return False
    summary = json.loads((folder / "summary.json").read_text())
    return {"target", "sampling", "phases", "by_role", "serving", "gpu"} <= set(summary)


def test_snapshots_on_schedule_baselines_and_exporter(
    tmp_path: Path, pid_file: Path, daemons: list[Running], vllm_server: VllmServer
) -> None:
    # The default CPU budget (2%) is on here: the rate adapts between windows.
    d = Running(tmp_path / "out", pid_file, "--window", "2s", "--interval", "6s",
                "--baseline-every", "12s", budget="2%")  # fmt: skip
    daemons.append(d)
    found = d.wait_for(5)
    metrics = d.metrics()
    assert d.stop() == 0
    names = [f.name for f in found]
    assert any(n.endswith("-baseline") for n in names), names
    assert any(not n.endswith("-baseline") for n in names), names
    starts = [StoredSnapshot.parse(f).started for f in found]  # type: ignore[union-attr]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # Every 6 s, baselines on 12 s multiples in between (a 2 s window plus py-spy's attach,
    # a few seconds here); a window that overruns misses the next deadline instead of pushing
    # the schedule (schedule.py), so a gap may be 12 s.
    assert all(1.0 <= g <= 19.0 for g in gaps), gaps
    index = d.index()
    assert index["latest"]["name"] == d.snapshots()[-1].name  # type: ignore[index]
    assert str(index["latest_baseline"]["name"]).endswith("-baseline")  # type: ignore[index]
    for folder in d.snapshots():
        assert complete(folder), folder
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["target"]["root_pid"] == vllm_server.pid
        sampling = summary["sampling"]  # a window without samples must say why
        assert sampling["samples"] > 0 or sampling["partial_reason"], sampling
        assert summary["kind"] in ("snapshot", "baseline")
        # the daemon's windows carry the fingerprint (read once per deployment) and its name
        assert summary["deployment"] == f"tiny@{vllm_server.port}"
        assert summary["fingerprint"]["vllm"] and summary["fingerprint"]["python"]
    sampled = [json.loads((f / "summary.json").read_text())["sampling"]["samples"] for f in found]
    assert sum(1 for n in sampled if n > 0) >= len(sampled) / 2, sampled
    assert re.search(r"^vllm_sidecar_target_up\{[^}]*\} 1\.0$", metrics, re.M), metrics
    # The phase shares exported are those of the latest window the daemon handed over: a
    # window whose py-spy failed on this loaded box exports none (absent, never stale) and
    # counts the failure instead.
    exported = set(re.findall(r'vllm_sidecar_phase_ratio\{[^}]*role="(\w+)"', metrics))
    windows = [set(json.loads((f / "summary.json").read_text())["by_role"]) for f in d.snapshots()]
    assert exported in windows, (exported, windows)
    if not exported:
        assert re.search(r'window_failures_total\{[^}]*kind="sampler"\} [1-9]', metrics)
    assert not leftovers(d.host_dir())


def test_sigterm_mid_window_writes_a_complete_cut_window(
    tmp_path: Path, pid_file: Path, daemons: list[Running]
) -> None:
    d = Running(tmp_path / "out", pid_file, "--window", "20s", "--interval", "30s")
    daemons.append(d)
    time.sleep(6)  # inside the first 20 s window
    started = time.monotonic()
    assert d.stop() == 0
    assert time.monotonic() - started < 15, "SIGTERM must cut the window, not wait it out"
    (folder,) = d.snapshots()
    assert complete(folder)
    sampling = json.loads((folder / "summary.json").read_text())["sampling"]
    assert sampling["partial"] is True and "signal" in sampling["partial_reason"]
    assert sampling["samples"] > 0
    assert not leftovers(d.host_dir())


def test_kill_9_never_leaves_a_partial_snapshot_visible(
    tmp_path: Path, pid_file: Path, daemons: list[Running]
) -> None:
    out = tmp_path / "out"
    for delay in (2.2, 3.1, 4.4):  # different moments of the window / write cycle
        d = Running(out, pid_file, "--window", "1s", "--interval", "1s")
        daemons.append(d)
        d.wait_for(1 + len(d.snapshots()), timeout_s=90)
        time.sleep(delay % 1.0)
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait(30)
        for folder in d.snapshots():
            assert complete(folder), f"visible but incomplete after kill -9: {folder}"
    restarted = Running(out, pid_file, "--window", "1s", "--interval", "1s")
    daemons.append(restarted)
    restarted.wait_for(len(restarted.snapshots()) + 1)
    assert restarted.stop() == 0
    assert leftovers(restarted.host_dir()) == [], "a restart cleans what a killed writer left"


def test_vllm_restart_is_a_gap_then_profiling_goes_on(
    tmp_path: Path, daemons: list[Running], vllm_server: VllmServer
) -> None:
    """Kill vLLM, point the pid file at another one (new PIDs): the daemon records the outage as
    a gap and profiles the new server; only the windows it was down are lost. The new one is the
    session's server, which the daemon had never seen (one server start fewer than a second of
    the test's own: the daemon learns of it only through the pid file, as after a restart)."""
    pid_file = tmp_path / "vllm.pid"
    with VllmServer(log_path=tmp_path / "first.log") as first:
        pid_file.write_text(str(first.pid))
        d = Running(tmp_path / "out", pid_file, "--window", "1s", "--interval", "2s")
        daemons.append(d)
        d.wait_for(2)
        down_at = time.time()
    second = vllm_server
    up_at = time.time()
    pid_file.write_text(str(second.pid))
    before = len(d.snapshots())
    found = d.wait_for(before + 2, timeout_s=120)
    assert d.stop() == 0
    roots = {json.loads((f / "summary.json").read_text())["target"]["root_pid"] for f in found}
    assert roots == {first.pid, second.pid}
    gaps = d.index()["gaps"]
    assert isinstance(gaps, list) and len(gaps) == 1, gaps
    missed_windows = (up_at - down_at) / 2 + 2
    assert len(found) >= before, "no snapshot from before the outage was lost"
    assert missed_windows > 0
