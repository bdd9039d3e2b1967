"""Freezes at random moments of a steady load, each raised? An idle server, nothing raised?

Issue 26, item 20, on the real vLLM CPU server: `vllm-sidecar run` with the default hang
thresholds (a check every 5 s, the stack rule at 30 s, the counter rule at 120 s) watches a
tiny vLLM under a steady 4-client load. The EngineCore is stopped with SIGSTOP at random moments
(after 5-25 s of load), then continued once the daemon's exporter says `stalled` (or after
`stall_after_s` plus two checks, a miss); then a few more freezes aimed at the moment the
issue's watch missed, when vLLM's gauges say nothing runs or waits (a batch just ended). Then
the load stops and the idle server is watched for 10 minutes: no stall may be raised.

    .venv/bin/python -m devtools.freeze_check [--freezes 10] [--aimed 3] [--idle-min 10]

Writes tests/fixtures/freeze/freeze-check.json (checked by
tests/unit/daemon/test_freeze_record.py) and prints each freeze's time to raise. About 25
minutes; everything it starts is killed at the end, the EngineCore always continued.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import suppress
from pathlib import Path
from typing import Any

from devtools import sidecar_proc
from devtools.loadgen import background_load
from devtools.server import VllmServer, free_port

RECORD = sidecar_proc.REPO / "tests" / "fixtures" / "freeze" / "freeze-check.json"
CHECK_S, STACK_AFTER_S, STALL_AFTER_S = 5.0, 30.0, 120.0  # the defaults (config/settings.py)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()  # type: ignore[no-any-return]


def vllm_gauges(base_url: str) -> dict[str, float]:
    """vLLM's request gauges now: what a frozen engine's last scheduler stats say."""
    text = _get(f"{base_url}/metrics")
    out = {}
    for name in ("running", "waiting"):
        found = re.findall(rf"^vllm:num_requests_{name}\{{[^}}]*\}} (\S+)$", text, re.M)
        out[name] = sum(float(v) for v in found)
    return out


class Watched:
    """The daemon under test and what its exporter says."""

    def __init__(self, work: Path, pid: int) -> None:
        self.port, self.log = free_port(), work / "daemon.log"
        with self.log.open("w") as log:
            self.proc = sidecar_proc.start(
                ["run", "--pid", str(pid), "--out", str(work / "out"), "--no-gpu",
                 "--exporter-listen", f"127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT)  # fmt: skip

    def gauge(self, name: str, **labels: str) -> float | None:
        with suppress(OSError):
            for line in _get(f"http://127.0.0.1:{self.port}/metrics").splitlines():
                if line.startswith(f"vllm_sidecar_{name}{{") and all(
                    f'{k}="{v}"' in line for k, v in labels.items()
                ):
                    return float(line.rsplit(" ", 1)[1])
        return None

    def until(self, what: Any, timeout_s: float, step: float = 0.5) -> float | None:
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.proc.poll() is not None:
                raise SystemExit(f"the daemon exited:\n{self.log.read_text()[-3000:]}")
            if what():
                return time.monotonic() - start
            time.sleep(step)
        return None

    def stall_lines(self) -> list[str]:
        return [ln for ln in self.log.read_text().splitlines() if " stalled in " in ln]


def engine_core(server: VllmServer) -> int:
    for pid in server.children_pids():
        with suppress(OSError):
            if "EngineCore" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                return pid
    raise SystemExit(f"no EngineCore among {server.children_pids()}")


def freeze(d: Watched, server: VllmServer, core: int, aimed: bool) -> dict[str, Any]:
    """One freeze: stopped, timed until the exporter says stalled, continued, cleared."""
    if aimed:  # the moment the gauges say nothing runs or waits, polled as fast as it answers
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(vllm_gauges(server.base_url).values()) > 0:
            time.sleep(0.02)
    lines_before = len(d.stall_lines())
    resumed_before = d.log.read_text().count("progressing again")
    os.kill(core, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        gauges = vllm_gauges(server.base_url)  # the API server still answers
        raised = d.until(lambda: d.gauge("engine_state", state="stalled") == 1.0,
                         STALL_AFTER_S + 2 * CHECK_S)  # fmt: skip
        raised_s = None if raised is None else round(time.monotonic() - stopped, 1)
    finally:
        os.kill(core, signal.SIGCONT)
    cleared = d.until(lambda: d.log.read_text().count("progressing again") > resumed_before, 90)
    d.until(lambda: d.gauge("engine_state", state="ok") == 1.0, 60)
    new = d.stall_lines()[lines_before:]
    return {"aimed_between_batches": aimed, "gauges_at_freeze": gauges,
            "raised_after_s": raised_s, "cleared": cleared is not None,
            "line": new[0].split(" ERROR ", 1)[-1] if new else None}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--freezes", type=int, default=10)
    parser.add_argument("--aimed", type=int, default=3)
    parser.add_argument("--idle-min", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--record", type=Path, default=RECORD)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="vllm-sidecar-freeze-"))
    print(f"freeze check: {args.freezes} random + {args.aimed} aimed freezes, then "
          f"{args.idle_min:g} min idle; work folder {work}", flush=True)  # fmt: skip
    started = time.time()
    with VllmServer(log_path=work / "vllm.log") as server:
        core = engine_core(server)
        d = Watched(work, server.pid)
        try:
            if d.until(lambda: d.gauge("engine_state", state="idle") is not None, 120) is None:
                raise SystemExit(f"the daemon never judged:\n{d.log.read_text()[-3000:]}")
            freezes = []
            total = args.freezes + args.aimed
            with background_load(server.base_url, "mixed", 3600.0, 4, stop_on_exit=True):
                d.until(lambda: d.gauge("engine_state", state="ok") == 1.0, 60)
                for i in range(total):
                    time.sleep(rng.uniform(5.0, 25.0))
                    result = freeze(d, server, core, aimed=i >= args.freezes)
                    freezes.append(result)
                    print(f"freeze {i + 1}/{total}: gauges {result['gauges_at_freeze']}, "
                          f"raised after {result['raised_after_s']} s", flush=True)  # fmt: skip
            incidents_before = d.gauge("stall_incidents_total")
            idle_start = time.monotonic()
            stalled = d.until(lambda: d.gauge("engine_state", state="stalled") == 1.0,
                              args.idle_min * 60, step=1.0)  # fmt: skip
            idle = {"seconds": round(time.monotonic() - idle_start),
                    "requests_sent": 0, "stalled_seen": stalled is not None,
                    "incidents": (d.gauge("stall_incidents_total") or 0)
                    - (incidents_before or 0),
                    "state_at_end": "idle" if d.gauge("engine_state", state="idle") == 1.0
                    else "not idle"}  # fmt: skip
            print(f"idle: {idle}", flush=True)
        finally:
            sidecar_proc.kill(d.proc, 30)
            with suppress(ProcessLookupError):
                os.kill(core, signal.SIGCONT)
        vllm_log = (work / "vllm.log").read_text()
        vllm = re.search(r"Initializing a V1 LLM engine \(v([^)]+)\)", vllm_log)
    record = {
        "what": "issue 26, item 20: devtools/freeze_check.py on the real vLLM CPU server",
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "vllm": vllm.group(1) if vllm else None,
        "cores": os.cpu_count(),
        "hang": dict(check_s=CHECK_S, stack_after_s=STACK_AFTER_S, stall_after_s=STALL_AFTER_S),
        "load": "devtools.loadgen 'mixed', 4 clients, keep-alive connections",
        "freezes": freezes,
        "idle": idle,
        "minutes": round((time.time() - started) / 60, 1),
    }
    args.record.parent.mkdir(parents=True, exist_ok=True)
    args.record.write_text(json.dumps(record, indent=1) + "\n")
    missed = [f for f in freezes if f["raised_after_s"] is None]
    print(f"wrote {args.record}: {len(freezes) - len(missed)}/{len(freezes)} raised; idle "
          f"{'clean' if not idle['stalled_seen'] else 'RAISED'}", flush=True)  # fmt: skip
    return 1 if missed or idle["stalled_seen"] else 0


if __name__ == "__main__":
    sys.exit(main())
