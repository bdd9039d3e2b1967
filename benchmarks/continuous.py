"""`make bench-continuous`: continuous mode at its defaults against a 20 Hz reference, side by side.

One tiny real vLLM under steady load (the load generator in a process of its own); the daemon
(`vllm-sidecar run` from this checkout, defaults: continuous mode, 1 % budget, 5 min periods,
hang watch on) attached in a session of its own; and, over exactly the same periods, a 20 Hz
reference: `py-spy record --subprocesses --threads --idle --nonblocking -r 20` of the whole
tree, started by this script (not a child of the daemon: its CPU is not the daemon's).

Measured over the whole periods (from the first period boundary after the daemon attached to
the last):
- the daemon's CPU, itself plus its reaped py-spy children (/proc: utime + stime + cutime +
  cstime, read at the first boundary and, after SIGTERM, from wait4's rusage at its exit), as a
  share of one core;
- its RSS (VmRSS) at each period, first and last and peak;
- each role's phase shares over the periods (the hour's baseline is these periods put
  together) against the reference's, classified by the same rules: the difference in
  percentage points, with a 95 % interval from the continuous estimate's own spread between its
  60 s segments (a ratio estimator over segments: consecutive samples of a thread are
  correlated, segments far less), and whether each share is within +-1 point.

    .venv/bin/python benchmarks/continuous.py [--minutes 60] [--interval 300] [--json-out F]

`--minutes` whole periods are measured (an hour at the defaults: the target is stated over an
hour); `--minutes 15 --interval 60` is a compressed run. A JSON record ends the output; with
`--json-out` it is also written there (tests/fixtures/bench/continuous/ keeps the runs the
README quotes, and tests/unit/project/test_bench_records.py checks them).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import calendar
import json
import math
import os
import platform
import signal
import subprocess
import tempfile
import time
from collections import Counter
from typing import Any

from devtools import sidecar_proc
from devtools.loadgen import background_load
from devtools.server import VllmServer
from sidecar.classify.aggregate import label_stacks, summarize
from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.config.settings import TargetConfig
from sidecar.parsers import parse_raw
from sidecar.records import Role
from sidecar.store.summary_io import read_summary
from sidecar.target.discovery import configured_target
from sidecar.target.procfs import ProcFs

TICKS = os.sysconf("SC_CLK_TCK")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--interval", type=float, default=300.0)
    p.add_argument("--workload", default="mixed")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--reference-hz", type=int, default=20)
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    periods = max(1, round(args.minutes * 60 / args.interval))
    work = Path(tempfile.mkdtemp(prefix="vllm-sidecar-bench-continuous-"))
    commit = _commit()  # what runs: read now, not after an hour of editing
    print(f"continuous bench: {periods} periods of {args.interval:g} s, {args.workload} load, "
          f"{os.cpu_count()} cores; work folder {work}", flush=True)  # fmt: skip
    with VllmServer() as server:
        span = (periods + 2) * args.interval + 60  # the wait for a boundary, the periods
        with background_load(server.base_url, args.workload, span, args.concurrency):
            record = _measure(server.pid, work, periods, args)
    record.update(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  machine=f"{platform.machine()}, {os.cpu_count()} cores",
                  commit=commit, workload=args.workload,
                  concurrency=args.concurrency)  # fmt: skip
    _print(record)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


def _measure(pid: int, work: Path, periods: int, args: argparse.Namespace) -> dict[str, Any]:
    out = work / "out"
    daemon = sidecar_proc.start(
        ["run", "--pid", str(pid), "--out", str(out), "--no-gpu", "--exporter-listen", "off",
         "--interval", f"{args.interval:g}s"],
        stdout=(work / "daemon.log").open("w"), stderr=subprocess.STDOUT)  # fmt: skip
    try:
        # The daemon's first period runs to the next multiple of the interval, or on to the one
        # after when that is under half an interval away (schedule.py); it attaches in a few
        # seconds. The measured periods start where its first one ends.
        started = time.time()
        first = (math.floor((started + 15) / args.interval) + 1) * args.interval
        if first - (started + 15) < args.interval / 2:
            first += args.interval
        _sleep_until(first)
        cpu0 = _cpu(daemon.pid)
        rss = [_rss(daemon.pid)]
        ref_raw = work / "reference.txt"
        ref = subprocess.Popen(
            ["py-spy" if not _beside("py-spy") else _beside("py-spy"), "record", "--pid",
             str(pid), "--subprocesses", "--threads", "--idle", "--nonblocking",
             "-r", str(args.reference_hz), "-f", "raw", "-o", str(ref_raw),
             "-d", str(int(periods * args.interval) + 30)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True)  # fmt: skip
        end = first + periods * args.interval
        while time.time() < end:
            time.sleep(min(args.interval / 4, end - time.time() + 0.01))
            rss.append(_rss(daemon.pid))
            if daemon.poll() is not None:
                raise SystemExit(f"the daemon exited: see {work}/daemon.log")
        ref.send_signal(signal.SIGINT)
        ref.wait(60)
        # The last period is written when it ends; then the daemon is stopped and reaped.
        _wait_written(out, end, args.interval)
        cpu1 = _cpu(daemon.pid)  # the last period's py-spy runs reaped, the next just begun
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(120)
    finally:
        if daemon.poll() is None:
            sidecar_proc.kill(daemon, 30)
    wall = periods * args.interval
    target = configured_target(ProcFs(), TargetConfig(pid=pid, discover=False))
    ours = _ours(out, first, end)
    theirs = _reference(ref_raw, {p.pid: p.role for p in target.processes})
    return {
        "periods": periods,
        "interval_s": args.interval,
        "span_s": wall,
        "cpu_share": (cpu1 - cpu0) / wall,
        "cpu_note": "/proc utime+stime+cutime+cstime of the daemon from the first period "
        "boundary to the last period's write: itself and its reaped py-spy runs",
        "rss_mib": {"first": rss[0] / 2**20, "last": rss[-1] / 2**20, "peak": max(rss) / 2**20},
        "snapshots": ours["names"],
        "samples": ours["samples"],
        "rates": ours["rates"],
        "reference_samples": theirs["samples"],
        "shares": _compare(ours, theirs),
    }


def _beside(name: str) -> str | None:
    path = Path(sys.executable).with_name(name)
    return str(path) if path.exists() else None


def _sleep_until(wall: float) -> None:
    while (left := wall - time.time()) > 0:
        time.sleep(min(left, 5.0))


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICKS  # utime stime cutime cstime


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _wait_written(out: Path, end: float, interval: float) -> None:
    deadline = time.time() + interval / 2 + 60
    want = time.strftime("%Y%m%dT%H%M", time.gmtime(end - interval))
    while time.time() < deadline:
        if any(d.name.startswith(want) for d in out.glob("*/2*")):
            return
        time.sleep(2)


def _ours(out: Path, first: float, end: float) -> dict[str, Any]:
    """The periods that began at or after `first` and ended by `end`, summed by role and phase,
    with each segment's counts (for the spread)."""
    counts: dict[str, Counter[str]] = {}
    blocks: list[dict[str, dict[str, int]]] = []
    names, rates, samples = [], {}, 0
    for folder in sorted(out.glob("*/2*")):
        if folder.name.endswith("-baseline"):
            continue
        s = read_summary(folder)
        when = _utc(s.name)
        if when < first - 5 or when >= end - 5:
            continue
        names.append(s.name)
        samples += s.samples
        for b in s.sampling.blocks:
            blocks.append({r: dict(c) for r, c in b.counts.items()})
            for role, by_phase in b.counts.items():
                counts.setdefault(role, Counter()).update(by_phase)
        for p in s.sampling.processes:
            r = rates.setdefault(p.role.value, {"requested_hz": [], "achieved_hz": []})
            r["requested_hz"].append(p.requested_hz)
            r["achieved_hz"].append(p.achieved_hz)
    mean = {role: {k: sum(v) / len(v) for k, v in r.items() if v and None not in v}
            for role, r in rates.items()}  # fmt: skip
    return {"counts": counts, "blocks": blocks, "names": names, "rates": mean, "samples": samples}


def _utc(name: str) -> float:
    return calendar.timegm(time.strptime(name[:16], "%Y%m%dT%H%M%SZ"))


def _reference(raw: Path, roles: dict[int, Role]) -> dict[str, Any]:
    parsed = parse_raw(raw.read_text(errors="replace"), source="reference")
    classifier = Classifier(load_rules(None))
    labelled = label_stacks(classifier, (s for s in parsed.stacks if s.frames), roles)
    counts: dict[str, Counter[str]] = {}
    for ls in labelled:
        counts.setdefault(ls.label.role.value, Counter())[ls.label.phase.value] += ls.stack.weight
    summarize(labelled)  # the same aggregation the snapshots went through (checks it runs)
    return {"counts": counts, "samples": sum(sum(c.values()) for c in counts.values())}


def _compare(ours: dict[str, Any], theirs: dict[str, Any]) -> list[dict[str, Any]]:
    """Per role and phase: both shares, the difference (points), its 95 % interval from the
    spread of the continuous share between segments (ratio estimator), within +-1 point."""
    out = []
    for role in sorted(set(ours["counts"]) & set(theirs["counts"])):
        a, b = ours["counts"][role], theirs["counts"][role]
        na, nb = sum(a.values()), sum(b.values())
        for phase in sorted(set(a) | set(b)):
            pa, pb = a[phase] / na, b[phase] / nb
            if max(pa, pb) < 0.005:
                continue
            se = _segment_se(ours["blocks"], role, phase, pa)
            d = 100 * (pa - pb)
            out.append({"role": role, "phase": phase, "continuous_pct": round(100 * pa, 2),
                        "reference_pct": round(100 * pb, 2), "diff_pts": round(d, 2),
                        "ci95_pts": round(196 * se, 2) if se is not None else None,
                        "within_1pt": abs(d) <= 1.0})  # fmt: skip
    return out


def _segment_se(blocks: list[dict[str, dict[str, int]]], role: str, phase: str,
                share: float) -> float | None:  # fmt: skip
    """The standard error of a ratio estimate sum(x)/sum(n) over segments."""
    xs = [(b.get(role, {}).get(phase, 0), sum(b.get(role, {}).values())) for b in blocks]
    xs = [(x, n) for x, n in xs if n > 0]
    k = len(xs)
    if k < 2:
        return None
    nbar = sum(n for _, n in xs) / k
    var = sum((x - share * n) ** 2 for x, n in xs) / (k - 1)
    return math.sqrt(var / k) / nbar


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=sidecar_proc.REPO,
                              check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _print(r: dict[str, Any]) -> None:
    shares = r["shares"]
    within = sum(s["within_1pt"] for s in shares)
    worst = max(shares, key=lambda s: abs(s["diff_pts"])) if shares else None
    print(
        f"span {r['span_s'] / 60:.0f} min ({r['periods']} periods): the daemon and py-spy used "
        f"{100 * r['cpu_share']:.2f}% of one core (target <= 1%)"
    )
    print(
        f"RSS {r['rss_mib']['first']:.1f} -> {r['rss_mib']['last']:.1f} MiB, peak "
        f"{r['rss_mib']['peak']:.1f} MiB (target <= 80 MB)"
    )
    print("rates (requested -> achieved, Hz): " + ", ".join(
        f"{role} {v.get('requested_hz', 0):.2f} -> {v.get('achieved_hz', 0):.2f}"
        for role, v in sorted(r["rates"].items())))  # fmt: skip
    print(f"samples: continuous {r['samples']}, reference {r['reference_samples']}")
    print(f"{'role':<12} {'phase':<20} {'cont %':>7} {'ref %':>7} {'diff':>6} {'+-95%':>6}")
    for s in shares:
        ci = "" if s["ci95_pts"] is None else f"{s['ci95_pts']:.2f}"
        print(
            f"{s['role']:<12} {s['phase']:<20} {s['continuous_pct']:>7.2f} "
            f"{s['reference_pct']:>7.2f} {s['diff_pts']:>+6.2f} {ci:>6}"
        )
    if worst:
        print(
            f"{within} of {len(shares)} shares within +-1 point; the worst "
            f"{worst['role']} {worst['phase']} {worst['diff_pts']:+.2f} points"
        )
    print(json.dumps(r))


if __name__ == "__main__":
    sys.exit(main())
