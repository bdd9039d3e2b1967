"""A host of two vLLM servers: does `vllm-sidecar run --discover` profile both?

Issue 23, item 5, on real vLLM CPU servers: two tiny servers run on this host, then the daemon
starts as an operator starts it, `run --discover` with short windows (20 s every 30 s) and no
--pid, --config or `targets:`. Before, it waited for ever ("found 2 vLLM servers ... Pick one
with --pid"); now it must write snapshots of both, each in its own folder
(OUT/<host>/<model@port>/, as `targets: [{discover: true}]` does), within two intervals of its
start. Then one server is stopped and a second daemon, on a new output folder, must profile the
one left exactly as before: its snapshots straight in OUT/<host>/.

    .venv/bin/python -m devtools.discover_check [--window 20] [--interval 30]

Writes tests/fixtures/discover/discover-check.json (checked by
tests/unit/daemon/test_discover_record.py): when each server's first snapshot appeared, the
folders written, the daemons' log lines. It waits (up to --quiet-min) until no other vLLM server
runs on the host, since discovery would find it too, and holds the harnesses' live lock
(devtools/matrix.py). About 4 minutes; everything it starts is stopped at the end (process
groups), also when it fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

from devtools import sidecar_proc
from devtools.matrix import live_lock
from devtools.server import VllmServer, free_port
from sidecar.store.layout import INDEX_NAME, SUMMARY_NAME, OutputTree, snapshot_names
from sidecar.target.discovery import discover
from sidecar.target.procfs import ProcFs

RECORD = sidecar_proc.REPO / "tests" / "fixtures" / "discover" / "discover-check.json"
POLL_S = 0.25


def other_servers(ours: set[int]) -> list[str]:
    """The vLLM servers discovery finds on this host that are not ours (their root PIDs)."""
    return [f"pid {d.root.pid}: {d.root.title[:80]}" for d in discover(ProcFs(Path("/proc")))
            if d.root.pid not in ours]  # fmt: skip


def wait_quiet(minutes: float) -> list[str]:
    """Wait until no vLLM server runs here (another's would be discovered too); what still
    runs after `minutes`."""
    deadline = time.monotonic() + 60 * minutes
    while (others := other_servers(set())) and time.monotonic() < deadline:
        print(f"waiting for other vLLM servers to end: {others}", flush=True)
        time.sleep(15)
    return others


def start_both(work: Path, stack: ExitStack) -> list[VllmServer]:
    """Two servers started side by side (each stopped at the end, even when the other's
    start failed)."""
    servers = [VllmServer(log_path=work / f"vllm-{n}.log") for n in ("a", "b")]
    for s in servers:
        stack.callback(s.stop)
    errors: list[BaseException] = []

    def start(s: VllmServer) -> None:
        try:
            s.start()
        except BaseException as exc:  # re-raised below, in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(s,)) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return servers


class Sidecar:
    """`vllm-sidecar run --discover ...` from this checkout, in a session of its own."""

    def __init__(self, work: Path, name: str, *args: str) -> None:
        self.out, self.log = work / f"out-{name}", work / f"sidecar-{name}.log"
        self.port = free_port()
        self.args = ["run", "--discover", "--out", str(self.out), "--no-gpu",
                     "--exporter-listen", f"127.0.0.1:{self.port}", *args]  # fmt: skip
        with self.log.open("w") as handle:
            self.proc = sidecar_proc.start(self.args, stdout=handle, stderr=subprocess.STDOUT)
        self.started = time.monotonic()
        self.code: int | None = None

    def first_snapshots(self, folders: dict[str, Path], timeout_s: float) -> dict[str, float]:
        """Seconds from the start to each folder's first snapshot (its summary.json there)."""
        seen: dict[str, float] = {}
        deadline = self.started + timeout_s
        while len(seen) < len(folders) and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the daemon exited {self.proc.returncode}:\n{self.tail()}")
            for name, folder in folders.items():
                if name not in seen and _complete(folder):
                    seen[name] = round(time.monotonic() - self.started, 1)
            time.sleep(POLL_S)
        return seen

    def metrics(self) -> str:
        with (
            suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r,
        ):
            return r.read().decode()  # type: ignore[no-any-return]
        return ""

    def stop(self) -> int:
        """SIGTERM (the window in progress finishes), then its group killed whatever it did."""
        if self.proc.poll() is None:
            self.proc.terminate()
            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(60)
        self.code = self.proc.poll()
        sidecar_proc.kill(self.proc, 30)
        return self.code if self.code is not None else -9

    def tail(self) -> str:
        return self.log.read_text()[-3000:]

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()


def _complete(folder: Path) -> bool:
    return folder.is_dir() and any((folder / n / SUMMARY_NAME).is_file()
                                   for n in snapshot_names(folder))  # fmt: skip


def _folders(root: Path) -> list[str]:
    """Every snapshot folder under `root`, relative to it."""
    return sorted(str(p.parent.relative_to(root)) for p in root.rglob(SUMMARY_NAME))


def _summaries(folder: Path) -> list[dict[str, Any]]:
    paths = (folder / n / SUMMARY_NAME for n in sorted(snapshot_names(folder)))
    return [json.loads(p.read_text()) for p in paths if p.is_file()]


def _index_deployment(folder: Path) -> str | None:
    with suppress(OSError, ValueError):
        return json.loads((folder / INDEX_NAME).read_text()).get("deployment")  # type: ignore[no-any-return]
    return None


def _target_up(metrics: str) -> dict[str, float]:
    found = re.findall(r"^vllm_sidecar_target_up\{([^}]*)\} (\S+)$", metrics, re.M)
    out = {}
    for labels, value in found:
        m = re.search(r'deployment="([^"]*)"', labels)
        out[m.group(1) if m else ""] = float(value)
    return out


def _commit() -> str:
    """The checkout's commit, and whether files differed from it (as benchmarks/noise.py)."""

    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], capture_output=True, text=True,
                             cwd=sidecar_proc.REPO)  # fmt: skip
        return run.stdout.strip() if run.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" + uncommitted changes" if git("status", "--porcelain") else "")


def two_servers(work: Path, servers: list[VllmServer], window: float, interval: float,
                host: str) -> dict[str, Any]:  # fmt: skip
    """`run --discover` over both: each one's first snapshot, within two intervals."""
    d = Sidecar(work, "two", "--window", f"{window:g}s", "--interval", f"{interval:g}s")
    try:
        names = {f"tiny@{s.port}": s for s in servers}
        host_dir = d.out / host
        seen = d.first_snapshots({n: host_dir / n for n in names}, 4 * interval)
        # Until each has had its second window (the grid's second deadline, in turn).
        time.sleep(max(0.0, d.started + interval + 2 * window + 10 - time.monotonic()))
        up = _target_up(d.metrics())
    finally:
        code = d.stop()
    per_server = []
    for name, server in names.items():
        summaries = _summaries(host_dir / name)
        per_server.append({
            "deployment": name,
            "root_pid": server.pid,
            "first_snapshot_after_s": seen.get(name),
            "snapshots": len(summaries),
            "summaries_of_this_server": all(
                s.get("deployment") == name and s["target"]["root_pid"] == server.pid
                for s in summaries
            ),
            "index_names_it": _index_deployment(host_dir / name) == name,
            "target_up": up.get(name),
        })  # fmt: skip
    firsts = [seen.get(name) for name in names]
    return {
        "command": ["vllm-sidecar", *d.args[:2], "--out", "OUT", *d.args[4:]],
        "window_s": window,
        "interval_s": interval,
        "limit_s": 2 * interval,
        "both_after_s": max(f for f in firsts if f is not None) if None not in firsts else None,
        "servers": per_server,
        "host_folder_has_its_own_index": (host_dir / INDEX_NAME).exists(),
        "readers_list": OutputTree(d.out).hosts(),
        "folders": _folders(d.out),
        "exit_code_after_sigterm": code,
        "log": d.lines(),
    }


def one_server(work: Path, server: VllmServer, interval: float, host: str) -> dict[str, Any]:
    """The same command with one server: the single daemon, as before (OUT/<host>/)."""
    d = Sidecar(work, "one", "--interval", f"{interval:g}s")
    try:
        seen = d.first_snapshots({host: d.out / host}, 4 * interval)
    finally:
        code = d.stop()
    summaries = _summaries(d.out / host)
    ours = all(s["target"]["root_pid"] == server.pid for s in summaries)
    return {
        "command": ["vllm-sidecar", *d.args[:2], "--out", "OUT", *d.args[4:]],
        "deployment": f"tiny@{server.port}",
        "first_snapshot_after_s": seen.get(host),
        "snapshots_in_the_host_folder": len(summaries),
        "summaries_of_this_server": bool(summaries) and ours,
        "sampling_modes": sorted({str(s["sampling"].get("mode")) for s in summaries}),
        "readers_list": OutputTree(d.out).hosts(),
        "folders": _folders(d.out),
        "exit_code_after_sigterm": code,
        "log": d.lines(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument("--quiet-min", type=float, default=15.0)
    parser.add_argument("--record", type=Path, default=RECORD)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vllm-sidecar-discover-"))
    host = socket.gethostname()
    print(f"discover check: work folder {work}", flush=True)
    with live_lock():  # the harnesses' one-vLLM-at-a-time lock (devtools/matrix.py)
        return _check(args, work, host)


def _check(args: argparse.Namespace, work: Path, host: str) -> int:
    others = wait_quiet(args.quiet_min)
    if others:
        raise SystemExit(f"other vLLM servers still run here: {others}")
    started, commit = time.time(), _commit()  # what runs: read now
    with ExitStack() as stack:
        servers = start_both(work, stack)
        print(f"servers up: {[(s.pid, s.port) for s in servers]}; startup "
              f"{[round(s.startup_s or 0) for s in servers]} s", flush=True)  # fmt: skip
        beside = other_servers({s.pid for s in servers})
        two = two_servers(work, servers, args.window, args.interval, host)
        print(f"two servers: both snapshots after {two['both_after_s']} s "
              f"(limit {two['limit_s']:g} s)", flush=True)  # fmt: skip
        servers[1].stop()
        one = one_server(work, servers[0], args.interval, host)
        print(f"one server: first snapshot after {one['first_snapshot_after_s']} s in "
              f"{one['folders'][:1]}", flush=True)  # fmt: skip
        vllm = re.search(r"Initializing a V1 LLM engine \(v([^)]+)\)",
                         (work / "vllm-a.log").read_text())  # fmt: skip
    record = {
        "what": "issue 23, item 5: devtools/discover_check.py, `vllm-sidecar run --discover` "
        "on a host of two real vLLM CPU servers, then of one",
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "commit": commit,
        "vllm": vllm.group(1) if vllm else None,
        "cores": os.cpu_count(),
        "other_vllm_servers_on_the_host": beside,
        "two_servers": two,
        "one_server": one,
        "minutes": round((time.time() - started) / 60, 1),
    }
    args.record.parent.mkdir(parents=True, exist_ok=True)
    args.record.write_text(json.dumps(record, indent=1) + "\n")
    ok = two["both_after_s"] is not None and two["both_after_s"] <= two["limit_s"]
    print(f"wrote {args.record}: {'both within two intervals' if ok else 'NOT within two'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
