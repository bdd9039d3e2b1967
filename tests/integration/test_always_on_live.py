"""Always on, against the real vLLM CPU server: continuous periods, a frozen
EngineCore raising the stalled gauge with an incident and clearing on SIGCONT, an idle server
and one busy with long prompts raising nothing, and snapshots on SIGUSR1, on
`vllm-sidecar trigger` and on the queue trigger, each marked with its cause.

Each test runs its own daemon (`vllm-sidecar run` from this checkout, in a session of its own)
and kills it afterwards whatever happens; a stopped EngineCore is always continued."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from devtools import sidecar_proc
from devtools.loadgen import BackgroundLoad
from devtools.server import VllmServer, free_port
from sidecar.records import Role

pytestmark = pytest.mark.integration

# Small thresholds, so a test takes seconds: the defaults are 5 s, 30 s and 2 min.
HANG = "hang:\n  check_s: 1s\n  stack_after_s: 4s\n  stall_after_s: 30s\n"


class Daemon:
    def __init__(self, tmp: Path, pid: int, config: str, *args: str, env: dict[str, str]) -> None:
        self.out, self.port = tmp / "out", free_port()
        (tmp / "c.yaml").write_text(config)
        self.log = tmp / "daemon.log"
        with self.log.open("w") as log:
            self.proc = sidecar_proc.start(
                ["run", "--config", str(tmp / "c.yaml"), "--pid", str(pid), "--out", str(self.out),
                 "--exporter-listen", f"127.0.0.1:{self.port}", "--no-gpu", *args],
                stdout=log, stderr=subprocess.STDOUT, env=sidecar_proc.env(**env))  # fmt: skip

    def host(self) -> Path:
        dirs = [d for d in self.out.iterdir() if d.is_dir()] if self.out.exists() else []
        return dirs[0] if dirs else self.out / "missing"

    def folders(self) -> list[Path]:
        h = self.host()
        return (
            sorted(d for d in h.iterdir() if d.is_dir() and d.name[:1].isdigit())
            if h.exists()
            else []
        )

    def summaries(self) -> list[dict[str, Any]]:
        return [json.loads((f / "summary.json").read_text()) for f in self.folders()]

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return r.read().decode()  # type: ignore[no-any-return]

    def gauge(self, name: str, **labels: str) -> float | None:
        with contextlib.suppress(OSError):
            for line in self.metrics().splitlines():
                if line.startswith(f"vllm_sidecar_{name}{{") and all(
                    f'{k}="{v}"' in line for k, v in labels.items()
                ):
                    return float(line.rsplit(" ", 1)[1])
        return None

    def until(self, what: Callable[[], object], timeout_s: float, step: float = 0.25) -> float:
        """Seconds until `what()` is true; fails with the log's tail after `timeout_s`."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            if what():
                return time.monotonic() - start
            time.sleep(step)
        raise AssertionError(f"not within {timeout_s} s:\n" + self.log.read_text()[-3000:])


@pytest.fixture
def daemon(tmp_path: Path, vllm_server: VllmServer) -> Iterator[Callable[..., Daemon]]:
    made: list[Daemon] = []

    def make(config: str = "", *args: str, **env: str) -> Daemon:
        d = Daemon(tmp_path, vllm_server.pid, config, *args, env=env)
        made.append(d)
        d.until(lambda: d.gauge("engine_state", state="idle") is not None
                or d.gauge("engine_state", state="ok") is not None, 90)  # fmt: skip
        return d

    yield make
    for d in made:
        sidecar_proc.kill(d.proc, 30)


def engine_core(server: VllmServer) -> int:
    for pid in server.children_pids():
        with contextlib.suppress(OSError):
            if "EngineCore" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                return pid
    raise AssertionError(f"no EngineCore among {server.children_pids()}")


def test_continuous_periods_and_snapshots_on_a_trigger_marked_with_their_cause(
    daemon: Callable[..., Daemon],
    vllm_server: VllmServer,
    background_load: Callable[..., AbstractContextManager[BackgroundLoad]],
) -> None:
    # Periods of 15 s (segments of 5 s): compressed, the same code paths. How periods make the
    # hour's baseline is tests/unit/daemon/test_daemon_loop.py's (and the bench's: README).
    with background_load(vllm_server.base_url, "mixed", 90.0, 4, stop_on_exit=True):
        # Triggered snapshots of 3 s (20 s by default): the trigger thread takes them in turn.
        d = daemon(HANG + "trigger:\n  window_s: 3s\n", "--interval", "15s", "--baseline-every", "1h",
                   VLLM_SIDECAR_SAMPLING_CONTINUOUS_SEGMENT_S="5")  # fmt: skip
        # Two periods: the first runs on to a multiple of 15 s (up to 22.5 s), and each write
        # (a forked child importing pyarrow) took 6 to 14 s on 2 loaded cores, so up to a minute.
        d.until(lambda: len(d.summaries()) >= 2, 150)
        d.proc.send_signal(signal.SIGUSR1)
        path = subprocess.run(
            sidecar_proc.argv("trigger", "--out", str(d.out), "--reason", "the test asked"),
            capture_output=True, text=True, timeout=200, env=sidecar_proc.env(),
            cwd=sidecar_proc.REPO)  # fmt: skip
        assert path.returncode == 0, path.stderr + d.log.read_text()[-3000:]
        d.until(lambda: sum(s.get("cause") is not None for s in d.summaries()) >= 2, 60)
    summaries = {f.name: json.loads((f / "summary.json").read_text()) for f in d.folders()}
    causes = {s["cause"]["kind"]: s for s in summaries.values() if s.get("cause")}
    tail = d.log.read_text()[-3000:]  # what a failure below needs
    assert {"signal", "socket"} <= set(causes), tail
    assert causes["signal"]["cause"]["detail"] == "SIGUSR1"
    assert causes["socket"]["cause"]["detail"] == "the test asked"
    assert summaries[Path(path.stdout.strip()).name]["cause"]["kind"] == "socket"
    periods = [s for s in summaries.values() if s["kind"] == "snapshot" and not s.get("cause")]
    assert len(periods) >= 2, tail
    for s in periods:
        sampling = s["sampling"]
        assert sampling["mode"] == "continuous" and sampling["self_cpu_s"] is not None
        roles = {p["role"] for p in sampling["processes"]}
        assert roles <= {r.value for r in (Role.API_SERVER, Role.ENGINE_CORE, Role.WORKER)}
        assert Role.ENGINE_CORE.value in roles, (sampling["processes"], tail)
    metrics = d.metrics()
    assert re.search(
        r'vllm_sidecar_triggered_snapshots_total\{cause="signal",[^}]*\} 1\.0', metrics
    )
    assert re.search(r'vllm_sidecar_sidecar_cpu_ratio\{[^}]*part="self"', metrics), metrics


def test_a_frozen_engine_core_raises_the_stall_with_an_incident_and_sigcont_clears_it(
    daemon: Callable[..., Daemon],
    vllm_server: VllmServer,
    background_load: Callable[..., AbstractContextManager[BackgroundLoad]],
) -> None:
    core = engine_core(vllm_server)
    with background_load(vllm_server.base_url, "mixed", 70.0, 8, stop_on_exit=True):
        d = daemon(HANG)
        d.until(lambda: d.gauge("engine_state", state="ok") == 1.0, 30)
        # Frozen at whatever moment this is: one that falls between one batch's end and the
        # clients' next requests leaves vLLM's gauges at 0 for ever, and the watch then reads
        # the work pending from the connections the API server holds open (issue 26, item 20;
        # devtools/freeze_check.py freezes 13 times at random and aimed moments).
        os.kill(core, signal.SIGSTOP)
        try:
            raised = d.until(lambda: d.gauge("engine_state", state="stalled") == 1.0, 30)
            stalled = d.gauge("stalled_seconds", role="engine_core")
            # the API server still answers while the engine is frozen
            with urllib.request.urlopen(f"{vllm_server.base_url}/health", timeout=10) as r:
                assert r.status == 200
            d.until(lambda: (d.host() / "incidents").is_dir()
                    and any((d.host() / "incidents").iterdir()), 60)  # fmt: skip
        finally:
            os.kill(core, signal.SIGCONT)
        cleared = d.until(lambda: d.gauge("engine_state", state="stalled") == 0.0, 30)
    # Raised (within the 30 s `until` above) by the stack rule, not by the 30 s counter rule:
    # the line's reason says the stack stayed the same for at least stack_after_s. How soon on
    # the wall clock is not asserted: on 2 loaded cores a check can be late (CI saw 9.5 s).
    assert raised > 0 and cleared > 0
    assert stalled is not None and stalled >= 4, stalled
    log = d.log.read_text()
    line = next(ln for ln in log.splitlines() if "stalled in" in ln)
    assert f"engine_core {core} stalled in " in line and "stopped" in line, line
    unchanged = re.search(r"stack unchanged for (\d+) s", line)
    assert unchanged and int(unchanged.group(1)) >= 4 and "hang.stack_after_s: 4 s" in line, line
    incident = next((d.host() / "incidents").iterdir())
    dumps = {f.name: f.read_text() for f in incident.glob("dump-*.txt")}
    assert f"dump-{core}-engine_core.txt" in dumps, list(dumps)
    frame = line.split("stalled in ", 1)[1].split(" (", 1)[0]
    assert frame in dumps[f"dump-{core}-engine_core.txt"]  # the dump shows where it stopped
    summary = json.loads((incident / "summary.json").read_text())
    assert summary["kind"] == "incident" and summary["cause"]["kind"] == "stall"
    # The gauge leaves `stalled` as soon as a check sees no stall (a long step included); the
    # stall is declared cleared once progress resumes or the server idles, which on 2 loaded
    # cores can be a check or two later (a fresh clone's run saw the gauge first).
    d.until(lambda: "progressing again" in d.log.read_text(), 30)
    assert d.gauge("stall_incidents_total") == 1.0


def test_an_idle_server_and_long_prompts_raise_nothing_and_the_latency_trigger_fires(
    daemon: Callable[..., Daemon],
    vllm_server: VllmServer,
    background_load: Callable[..., AbstractContextManager[BackgroundLoad]],
) -> None:
    # Any first token over 1 ms within 5 s fires it: the tiny model on 2 cores takes longer.
    d = daemon(HANG + "trigger:\n  ttft_p95_s: 0.001\n  over_s: 5s\n  window_s: 3s\n")
    time.sleep(8)
    assert d.gauge("engine_state", state="idle") == 1.0
    assert d.gauge("triggered_snapshots_total", cause="latency") == 0.0  # idle: no first token
    with background_load(vllm_server.base_url, "prefill-heavy", 25.0, 8):
        d.until(lambda: d.gauge("triggered_snapshots_total", cause="latency") == 1.0, 40)
        states = set()
        for _ in range(15):
            states |= {s for s in ("ok", "long_step", "stalled", "idle")
                       if d.gauge("engine_state", state=s) == 1.0}  # fmt: skip
            time.sleep(1)
    assert "stalled" not in states and "ok" in states, states
    assert d.gauge("stall_incidents_total") == 0.0
    assert not (d.host() / "incidents").exists()
    d.until(lambda: any((s.get("cause") or {}).get("kind") == "latency" for s in d.summaries()), 60)
    latency = [s for s in d.summaries() if (s.get("cause") or {}).get("kind") == "latency"]
    assert len(latency) == 1  # rate-limited: min_interval_s is 10 min
    assert "p95 time to first token" in latency[0]["cause"]["detail"]
    assert "trigger.ttft_p95_s: 0.001 s" in latency[0]["cause"]["detail"]
