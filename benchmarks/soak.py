"""Does the daemon's memory stay flat over a long run? A time-compressed soak.

`vllm-sidecar run` in continuous mode (the default) profiles one tiny real vLLM with periods of
10 s (5 s segments) and a baseline every 60 s: 10 minutes here write ~60 periods and 10
baselines, what the default schedule (5 min periods, hourly baselines) writes in 5 hours, while
load comes and goes (every workload in turn). The daemon's RSS is read every few seconds;
printed: RSS after the first snapshots, at the end, the peak, and the growth per 100 snapshots.
Stacks are aggregated per period, the hour's periods are kept only until its baseline is written,
the classifier's cache is bounded, and pandas and pyarrow are imported only in the short-lived
write children (sidecar/outproc.py), so RSS should level off after warm-up, under 80 MB.

    .venv/bin/python benchmarks/soak.py [--minutes 10] [--interval 10] [--mode continuous]

It also prints the daemon's CPU (itself plus its reaped py-spy and write children) over the
whole run, as a share of one core: compressed, it writes thirty times as often as the default,
so this is not the default's cost (benchmarks/continuous.py measures that).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools import sidecar_proc
from devtools.loadgen import run_load
from devtools.server import VllmServer, free_port

WORKLOADS = ("mixed", "prefill-heavy", "decode-heavy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=5.0, help="windows mode only")
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--mode", default="continuous", choices=("continuous", "windows"))
    parser.add_argument("--every", type=float, default=5.0, help="RSS reading period, s")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="vllm-sidecar-soak-"))
    print(f"soak: {args.minutes:g} min, {args.mode} mode, a snapshot every {args.interval:g} s, "
          f"{os.cpu_count()} cores; output {out}", flush=True)  # fmt: skip
    with VllmServer() as server:
        pid_file = out / "vllm.pid"
        pid_file.write_text(str(server.pid))
        stop = threading.Event()
        load = threading.Thread(target=_load, args=(server.base_url, stop), daemon=True)
        load.start()
        daemon = _start_daemon(out, pid_file, args.window, args.interval, args.mode)
        try:
            readings = _watch(daemon, out, args.minutes * 60, args.every)
            cpu = _cpu_share(daemon.pid, readings[-1][0])
        finally:
            stop.set()
            daemon.send_signal(signal.SIGTERM)
            code = daemon.wait(60)
            load.join(60)
    _report(readings, code)
    print(f"daemon CPU with py-spy, whole run: {100 * cpu:.2f}% of one core")
    return 0 if code == 0 else 1


def _cpu_share(pid: int, elapsed: float) -> float:
    """user + system of the daemon and of the py-spy children it has reaped, per second."""
    t = psutil.Process(pid).cpu_times()
    return (t.user + t.system + t.children_user + t.children_system) / elapsed


def _start_daemon(
    out: Path, pid_file: Path, window: float, interval: float, mode: str
) -> subprocess.Popen[bytes]:
    args = ["run", "--mode", mode, "--pid-file", str(pid_file), "--out", str(out / "snapshots"),
            "--window", f"{window}s", "--interval", f"{interval}s", "--baseline-every", "60s",
            "--exporter-listen", f"127.0.0.1:{free_port()}", "--no-gpu"]  # fmt: skip
    log = (out / "daemon.log").open("wb")
    env = sidecar_proc.env(VLLM_SIDECAR_SAMPLING_CONTINUOUS_SEGMENT_S=str(interval / 2))
    return sidecar_proc.spawn(sidecar_proc.argv(*args), stdout=log, stderr=subprocess.STDOUT,
                              env=env, cwd=sidecar_proc.REPO)  # fmt: skip


def _load(url: str, stop: threading.Event) -> None:
    """Load that comes and goes: 20 s of each workload, then 10 s of quiet."""
    i = 0
    while not stop.is_set():
        run_load(url, WORKLOADS[i % len(WORKLOADS)], 20.0, concurrency=4, seed=i)
        i += 1
        stop.wait(10.0)


def _watch(
    daemon: subprocess.Popen[bytes], out: Path, seconds: float, every: float
) -> list[tuple[float, int, int]]:
    """(elapsed s, daemon RSS bytes, snapshots written so far) every `every` seconds."""
    proc = psutil.Process(daemon.pid)
    started = time.monotonic()
    readings = []
    while (elapsed := time.monotonic() - started) < seconds:
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon exited ({daemon.returncode}): see {out}/daemon.log")
        readings.append((elapsed, proc.memory_info().rss, _count(out)))
        time.sleep(every)
    return readings


def _count(out: Path) -> int:
    return sum(
        1 for d in (out / "snapshots").glob("*/*") if d.is_dir() and not d.name.startswith(".")
    )


def _report(readings: list[tuple[float, int, int]], code: int) -> None:
    warm = next((r for r in readings if r[2] >= 10), readings[0])  # after 10 snapshots
    end, peak = readings[-1], max(r[1] for r in readings)
    windows = end[2] - warm[2]
    growth = (end[1] - warm[1]) / windows * 100 if windows else 0.0
    mib = 2**20
    print(f"snapshots written: {end[2]} ({windows} after warm-up); daemon exit code {code}")
    print(
        f"RSS after {warm[2]} snapshots: {warm[1] / mib:.1f} MiB; at the end: "
        f"{end[1] / mib:.1f} MiB; peak {peak / mib:.1f} MiB; "
        f"growth {growth / 1024:.1f} KiB per 100 snapshots"
    )
    print(json.dumps({"windows": end[2], "rss_warm_mib": warm[1] / mib, "rss_end_mib": end[1] / mib,
                      "rss_peak_mib": peak / mib, "growth_kib_per_100_windows": growth / 1024,
                      "readings": [(round(t), r, n) for t, r, n in readings]}))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
