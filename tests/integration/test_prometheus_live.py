"""A real Prometheus (Debian's binary) scraping a real `vllm-sidecar run` beside the session's real
vLLM: the phase shares on disk come back through PromQL, the alert rules load and evaluate, and
every query of the Grafana dashboard runs. promtool checks the rules, their unit tests and the
live exporter's output.

Prometheus runs with its own config and data folder under the test's temporary folder, on a free
loopback port, and is killed at the end even when a test fails. Without the binaries (`make
prometheus` installs Debian's package without starting it) these tests skip and say so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devtools.server import VllmServer, free_port
from tests import promtools

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "vllm-sidecar-rules.yml"
RULE_TESTS = RULES_DIR / "vllm-sidecar-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "vllm-sidecar.json"
READY_TIMEOUT_S = 60.0  # Prometheus' start, the daemon's attach and its first window
# The dashboard's variables as Grafana's "All" sends them, and its interval macros.
GRAFANA_VARS = {"$host": ".*", "$deployment": ".*", "$role": ".*", "$__rate_interval": "1m"}


def tool(name: str) -> Path:
    found = promtools.find(name)
    if found is None:
        pytest.skip(promtools.MISSING.format(name=name))
    return found


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool("promtool")), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)  # fmt: skip


# --- promtool over the files ------------------------------------------------------------------


def test_rules_pass_promtool_check() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 8 rules found" in checked.stdout


def test_rule_unit_tests_pass() -> None:
    ran = promtool("test", "rules", str(RULE_TESTS))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "SUCCESS" in ran.stdout


def test_rule_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """A threshold moved by mistake fails the rule tests: they test something."""
    broken = RULES.read_text().replace("vllm_sidecar_disk_state{state=\"low\"} == 1",
                                       "vllm_sidecar_disk_state{state=\"low\"} == 2")  # fmt: skip
    assert broken != RULES.read_text()
    (tmp_path / RULES.name).write_text(broken)
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    ran = promtool("test", "rules", str(tmp_path / RULE_TESTS.name))
    assert ran.returncode != 0
    assert "VllmSidecarDiskGuardActive" in ran.stdout + ran.stderr


# --- a real Prometheus over a real daemon ---------------------------------------------------------


@dataclass
class Stack:
    """The daemon and the Prometheus that scrapes it."""

    daemon: subprocess.Popen[bytes]
    prometheus: subprocess.Popen[bytes]
    exporter_port: int
    api: str  # http://127.0.0.1:PORT/api/v1
    out: Path
    logs: Path

    def log_tail(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted(self.logs.glob("*.log")))  # fmt: skip

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.api}/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = self.get("query", query=expr)
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]  # type: ignore[no-any-return]

    def wait(self, what: str, ready: Any, timeout_s: float = READY_TIMEOUT_S) -> Any:
        """Poll `ready()` until it returns something truthy; the processes must stay up."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc in (self.daemon, self.prometheus):
                assert proc.poll() is None, f"{proc.args} exited\n{self.log_tail()}"
            try:
                if got := ready():
                    return got
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        raise AssertionError(f"no {what} after {timeout_s} s\n{self.log_tail()}")


def _stop(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, vllm_server: VllmServer) -> Iterator[Stack]:
    """One daemon and one Prometheus for the module's tests (they only read)."""
    prometheus_bin = tool("prometheus")
    tmp_path = tmp_path_factory.mktemp("prometheus-live")
    logs = tmp_path / "logs"
    logs.mkdir()
    pid_file = tmp_path / "vllm.pid"
    pid_file.write_text(f"{vllm_server.pid}\n")
    exporter_port, web_port = free_port(), free_port()
    # One 2 s window now, the next a minute later: the values stay put while the test reads them.
    daemon_args = [sys.executable, "-m", "sidecar.cli", "run", "--pid-file", str(pid_file),
                   "--out", str(tmp_path / "out"), "--exporter-listen",
                   f"127.0.0.1:{exporter_port}", "--mode", "windows", "--window", "2s",
                   "--interval", "60s", "--rate", "10", "--cpu-budget", "2%"]  # fmt: skip
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{json.dumps(str(RULES))}]\n"
        "scrape_configs:\n"
        "  - job_name: vllm-sidecar\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
        "  - job_name: vllm\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{vllm_server.port}']}}]\n"
    )
    checked = promtool("check", "config", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with (logs / "daemon.log").open("wb") as dlog, (logs / "prometheus.log").open("wb") as plog:
        daemon = subprocess.Popen(daemon_args, stdout=dlog, stderr=subprocess.STDOUT, env=env,
                                  cwd=ROOT)  # fmt: skip
        try:
            prometheus = subprocess.Popen(
                [str(prometheus_bin), f"--config.file={config}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{web_port}"],
                # In the test run's process group, as the daemon: a run killed by `timeout`
                # or Ctrl-C takes Prometheus down too (one process, no tree to signal).
                stdout=plog, stderr=subprocess.STDOUT,
            )  # fmt: skip
        except BaseException:
            _stop(daemon, signal.SIGKILL)
            raise
    running = Stack(daemon, prometheus, exporter_port, f"http://127.0.0.1:{web_port}/api/v1",
                    tmp_path / "out", logs)  # fmt: skip
    try:
        yield running
    finally:
        _stop(prometheus, signal.SIGTERM)
        _stop(daemon, signal.SIGTERM)


def summaries(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*/*/summary.json"))]


def test_prometheus_answers_phase_shares_the_daemon_wrote(stack: Stack) -> None:
    stack.wait("ready Prometheus", lambda: urllib.request.urlopen(
        stack.api.removesuffix("/api/v1") + "/-/ready", timeout=5).status == 200)  # fmt: skip
    written = stack.wait("snapshot on disk", lambda: summaries(stack.out))
    series = stack.wait("phase share in Prometheus",
                        lambda: stack.query('vllm_sidecar_phase_ratio{job="vllm-sidecar"}'))  # fmt: skip
    got = {(s["metric"]["role"], s["metric"]["phase"]): float(s["value"][1]) for s in series}
    # The shares Prometheus answers are those of a snapshot on disk (the latest one it scraped).
    on_disk = [{(role, phase): shares.get(phase, 0.0) for role, shares in s["by_role"].items()
                for phase in {p for (_, p) in got}} for s in summaries(stack.out) or written]  # fmt: skip
    assert any(got.keys() == d.keys() and all(got[k] == pytest.approx(d[k], abs=1e-12) for k in d)
               for d in on_disk), (got, on_disk)  # fmt: skip
    roles = {role for role, _ in got}
    assert "engine_core" in roles or "api_server" in roles, roles
    for role in roles:
        total = sum(v for (r, _), v in got.items() if r == role)
        assert total == pytest.approx(1.0, abs=1e-3), role
    # The same, aggregated in PromQL: one share per role, summing to 1.
    sums = stack.query('sum by (role) (vllm_sidecar_phase_ratio{job="vllm-sidecar"})')
    assert {s["metric"]["role"] for s in sums} == roles
    assert all(float(s["value"][1]) == pytest.approx(1.0, abs=1e-3) for s in sums)
    assert stack.query('up{job="vllm-sidecar"} == 1')


def test_dashboard_queries_run_and_rules_evaluate(stack: Stack) -> None:
    stack.wait("phase share in Prometheus",
               lambda: stack.query("vllm_sidecar_sampler_cpu_budget_ratio"))  # fmt: skip
    board = json.loads(DASHBOARD.read_text())
    variables = [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    for v in variables:  # label_values(metric, label): the metric must be there to list values
        metric = v.removeprefix("label_values(").split(",")[0]
        assert stack.query(metric), v
    empty = []  # panels none of whose queries has data yet
    for panel in (p for p in board["panels"] if p["type"] != "row"):
        answered = []
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, expr
            answered.append(stack.query(expr))  # parses and runs; empty where no data
        if not any(answered):
            empty.append(panel["title"])
    # A CPU vLLM has no GPU, and nothing stalls, fails or fires in a minute: those stay empty.
    # The phase, serving-independent sampler and snapshot panels must have data.
    for title in ("Phase shares: $role (all threads)", "Main-thread phase shares: $role",
                  "Sampling rate", "py-spy CPU against its budget", "Snapshot age and lateness",
                  "Findings by severity", "vLLM attached", "Output folder"):  # fmt: skip
        assert title not in empty, (title, empty)

    # Every alert rule loaded and evaluated against the live series without an error.
    def evaluated() -> list[dict[str, Any]]:
        groups = stack.get("rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r["health"] != "unknown" for r in rules) else []

    rules = stack.wait("evaluated rules", evaluated)
    assert len(rules) == 8
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
    # vLLM is up and snapshots are fresh: none of the sidecar's alerts fire.
    firing = [a for a in stack.get("alerts")["data"]["alerts"] if a["state"] == "firing"]
    assert firing == [], firing


def test_the_live_exporter_passes_promtool_check_metrics(stack: Stack) -> None:
    url = f"http://127.0.0.1:{stack.exporter_port}/metrics"
    stack.wait("a snapshot in the exporter", lambda: "vllm_sidecar_phase_ratio{" in
               urllib.request.urlopen(url, timeout=5).read().decode())  # fmt: skip
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    checked = subprocess.run([str(tool("promtool")), "check", "metrics"], input=text, text=True,
                             capture_output=True, timeout=60)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout + checked.stderr == ""
