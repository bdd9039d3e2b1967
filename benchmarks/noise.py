"""`make noise`: measure how much the live tests' figures move between windows on this machine.

The live snapshot tests (tests/integration/test_live_snapshot.py) compare shares and counts of
single windows with bounds. Those bounds come from this script's record: it starts the same
tiny vLLM the tests start, takes ROUNDS windows of each workload with `take_window` (the very
function the tests call: same CLI, rate, window, load timing), and writes every window's figures
to tests/fixtures/noise/live_windows.json with where and how they were measured.
devtools/noise.py turns that record into the tests' bounds, so re-running this script on
another machine (and committing the file) re-derives them.

Workloads are interleaved (round 0: prefill, decode, mixed; round 1: ...) so that drift of the
machine over the run lands on every workload alike; round 0 is the first load on a freshly
started server, as in the tests.

    .venv/bin/python benchmarks/noise.py [--rounds 10] [--note "quiet machine"] [--append]

A record may hold several sessions (`--append`: another server, another time of day), each
with its provenance: the spread then includes what differs between them.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script (`python benchmarks/noise.py`): devtools/ is a checkout folder, not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import platform
import shlex
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

from devtools.live_window import (
    CONCURRENCY,
    LOAD_S,
    RATE_HZ,
    SERVER_ENV,
    WINDOW_S,
    WORKLOADS,
    LiveWindow,
    measures,
    stat_lines,
    take_window,
)
from devtools.noise import FIXTURE, SUMMARY_PARTS, recompute
from devtools.server import VllmServer
from devtools.vllm_env import ensure_env

_REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10, help="windows per workload")
    parser.add_argument("--out", type=Path, default=FIXTURE)
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    parser.add_argument(
        "--append", action="store_true", help="add this session's windows to the record"
    )
    parser.add_argument(
        "--recompute",
        action="store_true",
        help="no new windows: compute the record's figures again from what it kept",
    )
    args = parser.parse_args(argv)
    if args.recompute:
        print(f"{recompute(args.out)} windows' figures changed in {args.out}")
        return 0
    record = json.loads(args.out.read_text()) if args.append else {"sessions": [], "windows": []}
    session = len(record["sessions"])
    started, load_before = time.monotonic(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="noise-") as tmp:
        server = VllmServer(log_path=Path(tmp) / "server.log", extra_env=SERVER_ENV)
        with server:
            print(f"vLLM up in {server.startup_s:.1f} s", flush=True)
            windows = [
                {"session": session, **_record(server, workload, Path(tmp) / f"{workload}-{r}", r)}
                for r in range(args.rounds)
                for workload in WORKLOADS
            ]
    wall_s = time.monotonic() - started
    provenance = _provenance(argv, args.note, server.startup_s, wall_s)
    # What else ran: the machine's 1, 5 and 15 min load averages before and after.
    provenance["load_average"] = {"before": load_before, "after": os.getloadavg()}
    record["sessions"].append(provenance)
    record["windows"] += windows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    temporary = args.out.with_name(f".{args.out.name}.tmp")
    temporary.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(temporary, args.out)
    print(f"{len(windows)} windows added to {args.out}")
    return 0


def _record(server: VllmServer, workload: str, folder: Path, round_: int) -> dict[str, Any]:
    folder.mkdir()
    window = take_window(server, workload, folder, seed=round_)
    row = _row(window, round_, server.log_path.read_text(errors="replace"))
    shown = {k: row[k] for k in ("workload", "round", "invalid_reason", "attach_s")}
    print(json.dumps(shown | {k: round(v, 4) for k, v in row["measures"].items()}), flush=True)
    return row


def _row(window: LiveWindow, round_: int, log: str) -> dict[str, Any]:
    """One window: its figures, and what they were computed from (the summary's parts, the load
    generator's counts, the server log's stats lines), so that the unit tests can check the
    figures against `measures` and a new figure can be computed from an old record."""
    s = window.summary
    start = datetime.fromtimestamp(datetime.fromisoformat(s["created_at"]).timestamp())
    span = s["serving"]["window_s"] or s["sampling"]["duration_s"]
    return {
        "workload": window.workload,
        "round": round_,
        "seed": window.seed,
        "invalid_reason": window.invalid_reason,
        "attach_s": window.attach_s,
        "measures": measures(s, window.load, log),
        "summary": {k: s[k] for k in SUMMARY_PARTS},
        "load": window.load.to_dict() if window.load else None,
        "log": stat_lines(log, start, span),
    }


def _provenance(
    argv: list[str] | None, note: str, startup_s: float | None, wall_s: float
) -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python benchmarks/noise.py "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "vllm": ensure_env().vllm_version,
        "commit": _commit(),
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": _cpuinfo("model name"),
            "memory_gib": round(_meminfo_kib("MemTotal") / 2**20, 1),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "rate_hz": RATE_HZ,
        "window_s": WINDOW_S,
        "load_s": LOAD_S,
        "concurrency": CONCURRENCY,
        # File paths by name: the record is read in other checkouts.
        "server_env": {
            k: Path(v).name if k.endswith("_PATH") else v for k, v in SERVER_ENV.items()
        },
        "server_startup_s": startup_s,
        "wall_s": round(wall_s, 1),
        "note": note,
    }


def _commit() -> str:
    """The checkout's commit, and whether files differed from it: the sidecar's classification
    and sampling are part of what was measured."""

    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], capture_output=True, text=True, cwd=_REPO)
        return run.stdout.strip() if run.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" + uncommitted changes" if git("status", "--porcelain") else "")


def _cpuinfo(field: str) -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(field):
            return line.split(":", 1)[1].strip()
    return ""


def _meminfo_kib(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
