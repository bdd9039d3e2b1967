"""`make bench-pyspy`: where py-spy's CPU goes on a real vLLM, option by option, side by side.

One tiny real vLLM under steady `mixed` load; py-spy records it again and again, each run with
one set of options, and its CPU (`os.wait4` of the py-spy process: user + system) is divided by
the process-ticks it took (each process sampled once per tick; the main thread's samples count
the ticks). Rounds alternate the option sets, so drift of the machine spreads over all of them.

- `tree`: one py-spy over the whole tree (`--subprocesses`), the windows mode's way;
- `each`: one py-spy per process without `--subprocesses`, continuous mode's way;
- `each, no --threads`, `each, no --idle`: what those options cost;
- `attach`: a 1 s run at 1 Hz: py-spy's start and attach, almost no sampling.

    .venv/bin/python benchmarks/pyspy_cost.py [--seconds 20] [--rate 5] [--rounds 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

from devtools.loadgen import background_load
from devtools.server import VllmServer
from sidecar.config.settings import TargetConfig
from sidecar.records import Role
from sidecar.target.discovery import configured_target
from sidecar.target.procfs import ProcFs

PY_SPY = str(Path(sys.executable).with_name("py-spy"))
SETS: dict[str, list[str]] = {
    "tree": ["--subprocesses", "--threads", "--idle", "--nonblocking"],
    "each": ["--threads", "--idle", "--nonblocking"],
    "each, no --threads": ["--idle", "--nonblocking"],
    "each, no --idle": ["--threads", "--nonblocking"],
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rate", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    per: dict[str, list[float]] = {name: [] for name in [*SETS, "attach"]}
    with VllmServer() as server:
        target = configured_target(ProcFs(), TargetConfig(pid=server.pid, discover=False))
        sampled = [q for q in target.processes if q.role is not Role.OTHER]
        span = args.rounds * (len(SETS) * (args.seconds + 3) * 2 + 30) + 60
        with background_load(server.base_url, "mixed", span, 4):
            time.sleep(5)
            for _ in range(args.rounds):
                for name, opts in SETS.items():
                    if name == "tree":
                        cpu, ticks = _run([server.pid], opts, args.rate, args.seconds)
                    else:
                        cpu, ticks = _run([q.pid for q in sampled], opts, args.rate, args.seconds)
                    per[name].append(1000 * cpu / max(ticks, 1))
                cpu, ticks = _run([q.pid for q in sampled], SETS["each"], 1, 1.0)
                per["attach"].append(1000 * cpu / len(sampled))  # ms per process started
    out = {name: round(statistics.median(v), 3) for name, v in per.items()}
    print(f"py-spy CPU, median of {args.rounds} rounds at {args.rate} Hz for {args.seconds:g} s "
          "under mixed load (ms of CPU per process-tick asked; attach: per py-spy "
          "started):")  # fmt: skip
    for name, v in out.items():
        print(f"  {name:<22} {v:8.3f}")
    print(json.dumps({"rate_hz": args.rate, "seconds": args.seconds, "ms": out,
                      "runs": {k: [round(x, 3) for x in v] for k, v in per.items()}}))  # fmt: skip
    return 0


def _run(pids: list[int], opts: list[str], rate: int, seconds: float) -> tuple[float, int]:
    """py-spy over `pids` (one each, side by side): their CPU together, and the process-ticks
    asked for (the rate times the seconds, per process it samples)."""
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for pid in pids:
            argv = [PY_SPY, "record", "--pid", str(pid), "--rate", str(rate), "--duration",
                    str(max(1, round(seconds))), "--format", "raw", "--output",
                    str(Path(tmp) / f"{pid}.txt"), *opts]  # fmt: skip
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))  # fmt: skip
        cpu = 0.0
        for proc in procs:
            _, _, usage = os.wait4(proc.pid, 0)
            cpu += usage.ru_utime + usage.ru_stime
    return cpu, round(rate * seconds) * _processes(pids, opts)


def _processes(pids: list[int], opts: list[str]) -> int:
    if "--subprocesses" not in opts:
        return len(pids)
    target = configured_target(ProcFs(), TargetConfig(pid=pids[0], discover=False))
    return len(target.processes)


if __name__ == "__main__":
    sys.exit(main())
