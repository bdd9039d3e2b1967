"""One snapshot window of the dev vLLM server under one known workload, taken the way the live
tests take it, and the figures the tests check, read from it.

The live tests (tests/integration/test_live_snapshot.py) and the noise measurement
(devtools/noise.py) both call `take_window`, so the spread recorded in tests/fixtures/noise is
the spread of exactly the windows the tests assert on.

The window starts once vLLM is idle, runs `vllm-sidecar snapshot` as a process of its own, as
an operator would, and starts the load only once it says py-spy is sampling (`SAMPLING_LINE`):
on this 2-core box the CLI's start-up and py-spy's attach take 1 to 5 s, and a load started on
a fixed timer then began before the window on some runs and well inside it on others, which
moved every share.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from devtools import sidecar_proc
from devtools.loadgen import LoadResult, run_load_process
from devtools.server import VllmServer
from sidecar.commands import SAMPLING_LINE
from sidecar.sampling.pyspy import ATTACH_GRACE_S, LATE_S
from sidecar.vllm_metrics import HttpMetricsSource, serving_figures, take_scrape

WORKLOADS = ("prefill-heavy", "decode-heavy", "mixed")
RATE_HZ = 20.0  # above the default 5 Hz, so a window has enough samples for stable shares
WINDOW_S = 14.0
# The load starts when sampling does and stops 5 s before the window ends: the requests in
# flight finish, vLLM counts them, and its "Avg prompt throughput" line for the last 2 s of
# load is printed inside the window (the tests compare both with the load generator).
LOAD_S = 9.0
LOAD_SPARE_S = 2.0  # the load generator's start-up (it starts after sampling) and a margin
CONCURRENCY = 8
# vLLM's "Avg prompt throughput" line every 2 s instead of 10 s, so a window holds several to
# compare with; and with milliseconds and on idle intervals too (devtools/vllm_logging.json):
# each line's rate covers the time since the previous line, which the event loop stretches
# beyond 2 s under load (by up to a second here), so the tokens need the real interval.
SERVER_ENV = {
    "VLLM_LOG_STATS_INTERVAL": "2",
    "VLLM_LOGGING_CONFIG_PATH": str(Path(__file__).with_name("vllm_logging.json")),
}
# docs/PHASES.md: where each role's samples are expected to go.
EXPECTED = {
    "worker": {"forward", "attention", "sampling", "kv_cache", "communication", "idle"},
    # output_processing: the EngineCore's output thread serialising outputs (docs/PHASES.md).
    # The same sets as the matrix table's `separate-worker` layout (test_matrix_fixtures.py).
    "engine_core": {
        "scheduling",
        "model_wait",
        "communication",
        "idle",
        "kv_cache",
        "output_processing",
    },
    "api_server": {"input_processing", "output_processing", "idle"},
}
_ATTACHED = re.compile(r"py-spy attached in ([\d.]+) s")


@dataclass(frozen=True, slots=True)
class LiveWindow:
    """One window: the snapshot folder, the load put on the server meanwhile, and the CLI's
    output. `load` is None when sampling never began (the window is then partial)."""

    workload: str
    seed: int
    snapshot: Path
    summary: dict[str, Any]
    load: LoadResult | None
    attach_s: float | None
    output: str

    @property
    def invalid_reason(self) -> str | None:
        """Why the sidecar itself says this window cannot be trusted, or None. The only
        grounds for taking a window again: never an assertion that failed."""
        sampling = self.summary["sampling"]
        if sampling["partial"]:
            return f"partial: {sampling['partial_reason']}"
        if sampling["behind_s"] >= LATE_S:
            return f"py-spy {sampling['behind_s']:.1f} s behind"
        return None


def take_window(server: VllmServer, workload: str, out: Path, seed: int) -> LiveWindow:
    """Run `vllm-sidecar snapshot` on SERVER, once it is idle, and put WORKLOAD on it from the
    moment py-spy samples."""
    wait_idle(server)
    args = ["snapshot", "--pid", str(server.pid), "--duration", str(WINDOW_S),
            "--rate", str(RATE_HZ), "--out", str(out),
            # one py-spy run for the whole window, as when tests/fixtures/noise was recorded
            "--segment", str(WINDOW_S)]  # fmt: skip
    # In a session of its own, as operators run it (devtools/sidecar_proc.py says why).
    proc = sidecar_proc.start(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=sidecar_proc.env(PYTHONUNBUFFERED="1"))  # fmt: skip
    watch = _Watch(proc)
    try:
        load = None
        if watch.sampling.wait(ATTACH_GRACE_S + 60) and proc.poll() is None:
            load = run_load_process(server.base_url, workload, LOAD_S, CONCURRENCY, seed)
        code = proc.wait(timeout=WINDOW_S + ATTACH_GRACE_S + 120)
    finally:
        if proc.poll() is None:
            sidecar_proc.kill(proc)
        watch.join()
    if code != 0:
        raise RuntimeError(f"vllm-sidecar snapshot exited with {code}:\n{watch.text()}")
    (folder,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    summary = json.loads((folder / "summary.json").read_text())
    return LiveWindow(workload, seed, folder, summary, load, watch.attach_s, watch.text())


def wait_idle(server: VllmServer, timeout_s: float = 120.0) -> None:
    """Return once vLLM reports no request running or waiting. On a starved host the previous
    window's last requests can outlive it (a recorded prefill-heavy load ran 19.5 s for 9 s of
    sending); their tokens, counted in the next window, made its prompt tokens in vLLM's log
    1.47 times the load generator's."""
    source = HttpMetricsSource(f"{server.base_url}/metrics")
    deadline = time.monotonic() + timeout_s
    while True:
        now = serving_figures(take_scrape(source))
        if now.requests_running == 0 and now.requests_waiting == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"vLLM not idle after {timeout_s:.0f} s: {now}")
        time.sleep(0.2)


class _Watch:
    """Reads the CLI's output in a thread; notes the line that says sampling has begun."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.sampling = threading.Event()
        self.attach_s: float | None = None
        self._lines: list[str] = []
        self._proc = proc
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.append(line)
            if line.startswith(SAMPLING_LINE):
                found = _ATTACHED.search(line)
                self.attach_s = float(found[1]) if found else None
                self.sampling.set()
        self.sampling.set()  # the CLI ended: nobody waits for a line that will not come

    def join(self) -> None:
        self._thread.join(10)
        if self._proc.stdout:
            self._proc.stdout.close()

    def text(self) -> str:
        return "".join(self._lines)


def share(summary: Mapping[str, Any], role: str, *phases: str) -> float:
    """The share of ROLE's samples (all its threads) in PHASES."""
    return float(sum(summary["by_role"].get(role, {}).get(p, 0.0) for p in phases))


def measures(summary: Mapping[str, Any], load: LoadResult | None, log: str) -> dict[str, float]:
    """Every figure a live test compares with a bound, by name (the record's keys), from a
    snapshot's summary, the load put on the server and the server's log."""
    out = {
        "samples": float(summary["sampling"]["samples"]),
        "worker_compute": share(summary, "worker", *COMPUTE),
        "api_input_processing": share(summary, "api_server", "input_processing"),
        "compute_to_step_overhead": compute_to_step_overhead(summary),
        "main_thread_step": main_thread_step(summary),
    }
    for role, allowed in EXPECTED.items():
        out[f"{role}_inside"] = share(summary, role, *sorted(allowed))
        out[f"{role}_other"] = share(summary, role, "other")
    out.update(agreement(summary, load, log))
    return out


COMPUTE = ("forward", "attention")
# Engine-step bookkeeping (docs/PHASES.md): what every step costs whatever its size.
STEP_OVERHEAD = {
    "worker": ("communication", "sampling", "kv_cache"),
    "engine_core": ("scheduling", "communication", "sampling", "kv_cache"),
}


def compute_to_step_overhead(summary: Mapping[str, Any]) -> float:
    """ln(worker compute samples / step-bookkeeping samples of the worker and EngineCore).

    What tells the workloads apart on a busy 2-core host. Long prompts make few large steps:
    much compute per step's bookkeeping. Many short decode steps: little. The worker's compute
    share alone does not (recorded in tests/fixtures/noise): when other processes contend for
    the cores, each small decode step stretches in wall time and its share rises to prefill's.
    A ratio within one window cancels that. Half a sample is added to each count (the usual
    correction), so a window without a single bookkeeping sample still has a finite value."""
    counts = summary["role_samples"]
    compute = share(summary, "worker", *COMPUTE) * counts.get("worker", 0)
    overhead = sum(share(summary, r, *p) * counts.get(r, 0) for r, p in STEP_OVERHEAD.items())
    return math.log((compute + 0.5) / (overhead + 0.5))


def main_thread_step(summary: Mapping[str, Any]) -> float:
    """The model is stepped: the worker's main thread computes, or the EngineCore's waits."""
    main = summary["main_thread"]
    step = sum(main.get("worker", {}).get(p, 0.0) for p in ("forward", "attention", "sampling"))
    return float(step + main.get("engine_core", {}).get("model_wait", 0.0))


def load_inside(load: LoadResult | None) -> bool:
    """Whether the load ran wholly inside the window, so that the counts can agree at all: its
    last response at least LOAD_SPARE_S before the window closes, by the load generator's own
    clock (which starts a moment after sampling does)."""
    return load is not None and load.elapsed_s <= WINDOW_S - LOAD_SPARE_S


def agreement(summary: Mapping[str, Any], load: LoadResult | None, log: str) -> dict[str, float]:
    """The snapshot's serving counts over the load generator's own, and vLLM's logged prompt
    tokens over the snapshot's: each 1.0 when they agree exactly."""
    serving = summary["serving"]
    if serving["reason"] is not None or load is None or not load_inside(load):
        return {}
    start = datetime.fromtimestamp(datetime.fromisoformat(summary["created_at"]).timestamp())
    logged = logged_prompt_tokens(log, start, serving["window_s"])
    return {
        "requests_ratio": serving["requests_finished"] / max(load.requests_ok, 1),
        "prompt_tokens_ratio": serving["prompt_tokens"] / max(load.prompt_tokens, 1),
        "generation_tokens_ratio": serving["generation_tokens"] / max(load.completion_tokens, 1),
        "logged_prompt_ratio": logged / max(serving["prompt_tokens"], 1),
    }


_STAT_LINE = re.compile(
    r"(?:INFO|DEBUG) (\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) .*"
    r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s"
)
_NOMINAL_INTERVAL_S = 2.0  # VLLM_LOG_STATS_INTERVAL


def stat_lines(log: str, start: datetime, span_s: float, slack_s: float = 5.0) -> list[str]:
    """The server log's stats lines from SLACK_S before START to SLACK_S after the window:
    what the noise record keeps of the log for each window."""
    lo, hi = start.timestamp() - slack_s, start.timestamp() + span_s + slack_s
    return [m[0] for m in _STAT_LINE.finditer(log) if lo <= _stamp(m[1], start) <= hi]


def logged_prompt_tokens(log: str, start: datetime, span_s: float) -> float:
    """Prompt tokens by vLLM's own account, for the stats lines stamped inside the window:
    each line's rate times the time since the line before it (vLLM divides by that)."""
    total, previous = 0.0, None
    for m in _STAT_LINE.finditer(log):
        at = _stamp(m[1], start)
        if start.timestamp() < at <= start.timestamp() + span_s:
            interval = at - previous if previous is not None else _NOMINAL_INTERVAL_S
            total += float(m[2]) * interval
        previous = at
    return total


def _stamp(text: str, like: datetime) -> float:
    """A log time stamp (local time, no year, milliseconds if configured) as Unix seconds."""
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in text else "%Y-%m-%d %H:%M:%S"
    return datetime.strptime(f"{like.year}-{text}", fmt).timestamp()
