"""Snapshots of a real vLLM CPU server under each workload (docs/PHASES.md's expectations per role).

One window per workload, taken through the CLI in-process (py-spy and vLLM are real processes).
The load runs wholly inside the window (from 2 s after it opens to 3 s before it closes), so
the snapshot's counts can be compared with the load generator's own counts and with vLLM's own
log lines. The rate is raised above the default so a window has enough samples for shares to
be stable; the default's cost is measured by benchmarks/overhead.py, not here.
"""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from devtools.loadgen import LoadResult, run_load_process
from devtools.server import VllmServer
from sidecar.cli import main

pytestmark = pytest.mark.integration

WORKLOADS = ("prefill-heavy", "decode-heavy", "mixed")
RATE_HZ = "20"
WINDOW_S = 14.0
LOAD_START_S, LOAD_S = 2.0, 9.0

# docs/PHASES.md / the issue: where each role's samples are expected to go.
EXPECTED = {
    "worker": {"forward", "attention", "sampling", "kv_cache", "communication", "idle"},
    "engine_core": {"scheduling", "model_wait", "communication", "idle", "kv_cache"},
    "api_server": {"input_processing", "output_processing", "idle"},
}


LOADS: dict[str, LoadResult] = {}  # workload -> the load generator's own result


ATTEMPTS = 3  # windows taken per workload at most, until one is on time
LATE: dict[str, list[float]] = {}  # workload -> how far py-spy fell behind, per attempt


def _window(
    server: VllmServer, workload: str, folder: Path, attempt: int
) -> tuple[Path, LoadResult]:
    args = ["snapshot", "--pid", str(server.pid), "--duration", str(WINDOW_S),
            "--rate", RATE_HZ, "--out", str(folder)]  # fmt: skip
    codes: list[int] = []
    window = threading.Thread(target=lambda: codes.append(main(args)))
    window.start()
    time.sleep(LOAD_START_S)
    # A new seed each attempt: a retake with the same prompts would hit vLLM's prefix cache,
    # and its log line counts only the prompt tokens it computed.
    load = run_load_process(server.base_url, workload, LOAD_S, seed=attempt)
    window.join(WINDOW_S + 60)
    assert codes == [0] and load.requests_ok > 0
    (snap,) = [p for p in folder.iterdir() if not p.name.startswith(".")]
    return snap, load


@pytest.fixture(scope="module")
def snapshots(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One on-time window per workload. On this 2-core box vLLM's sched_yield spinning can stall
    any sleeping process for seconds (README, "Measured here"); py-spy then reports being
    behind and takes the missed samples in a burst, so such a window's shares lean towards
    the idle time after the load. The snapshot says so (tested below); the accuracy tests need
    a window that was on time, so a late one is taken again, up to ATTEMPTS times."""
    out: dict[str, Path] = {}
    for workload in WORKLOADS:
        late = LATE.setdefault(workload, [])
        for attempt in range(ATTEMPTS):
            snap, load = _window(vllm_server, workload, tmp_path_factory.mktemp(workload), attempt)
            late.append(json.loads((snap / "summary.json").read_text())["sampling"]["behind_s"])
            if late[-1] <= min(late):  # the best so far (on a stalling host, the least late)
                out[workload], LOADS[workload] = snap, load
            if late[-1] < 1.0:
                break
    print("py-spy lateness per attempt:", LATE)
    return out


def summary(snapshots: dict[str, Path], workload: str) -> dict[str, Any]:
    return json.loads((snapshots[workload] / "summary.json").read_text())  # type: ignore[no-any-return]


def test_target_processes_and_roles(snapshots: dict[str, Path], vllm_server: VllmServer) -> None:
    target = summary(snapshots, "mixed")["target"]
    assert target["root_pid"] == vllm_server.pid
    roles = [p["role"] for p in target["processes"]]
    assert roles[:3] == ["api_server", "engine_core", "worker"]
    assert all(p["start_time"] > 0 for p in target["processes"])


@pytest.mark.parametrize("workload", WORKLOADS)
def test_a_late_window_says_so(snapshots: dict[str, Path], workload: str) -> None:
    sampling = summary(snapshots, workload)["sampling"]
    late = [w for w in sampling["warnings"] if "behind" in w]
    assert bool(late) == (sampling["behind_s"] >= 1.0), sampling


@pytest.mark.parametrize("workload", WORKLOADS)
def test_each_role_spends_its_samples_where_phases_md_says(
    snapshots: dict[str, Path], workload: str
) -> None:
    s = summary(snapshots, workload)
    assert s["sampling"]["samples"] > 200 and not s["sampling"]["partial"], s["sampling"]
    for role, allowed in EXPECTED.items():
        shares = s["by_role"][role]
        inside = sum(v for phase, v in shares.items() if phase in allowed)
        assert inside >= 0.95, (role, shares)
        assert shares.get("other", 0.0) <= 0.03, (role, shares, s["other"])


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_workload_steps_the_model(snapshots: dict[str, Path], workload: str) -> None:
    """The model is stepped: the worker's main thread computes, or the EngineCore's waits on
    it. (Under decode-heavy the worker mostly spins in sched_yield between tiny steps: idle.)
    A window that missed the load shows about 0.005 here; on-time windows show 0.2 to 1.2;
    windows py-spy was 6 s late for under decode-heavy have shown as little as 0.048, as the
    burst after a stall lands on idle time. Hence the 2 % floor."""
    main_thread = summary(snapshots, workload)["main_thread"]
    step = sum(main_thread["worker"].get(p, 0.0) for p in ("forward", "attention", "sampling"))
    assert step + main_thread["engine_core"].get("model_wait", 0.0) >= 0.02, main_thread


def _share(s: dict[str, Any], role: str, *phases: str) -> float:
    return float(sum(s["by_role"][role].get(p, 0.0) for p in phases))


def test_workloads_differ_in_the_expected_direction(snapshots: dict[str, Path]) -> None:
    """What differs on this CPU server with a 2-layer model (measured, see README): long prompts
    make the worker compute and the API server tokenise. Many short steps (decode-heavy) leave
    the worker spinning between them; sampling and detokenising a 512-token vocabulary are too
    cheap here to tell the workloads apart."""
    prefill, decode, mixed = (summary(snapshots, w) for w in WORKLOADS)
    print({w: summary(snapshots, w)["by_role"] for w in WORKLOADS})  # shown when it fails
    compute = ("forward", "attention")
    assert _share(prefill, "worker", *compute) > _share(mixed, "worker", *compute)
    assert _share(prefill, "worker", *compute) > 2 * _share(decode, "worker", *compute)
    assert _share(prefill, "api_server", "input_processing") > _share(
        decode, "api_server", "input_processing"
    )


def test_snapshot_files(snapshots: dict[str, Path]) -> None:
    folder = snapshots["mixed"]
    s = summary(snapshots, "mixed")
    assert set(s) >= {"target", "sampling", "phases", "by_role", "stages"}
    assert set(s["stages"]) == {"prefill", "decode", "unknown"}
    table = pd.read_parquet(folder / "stacks.parquet")
    assert list(table.columns) == [
        "pid", "role", "thread_id", "thread_name", "phase", "stage", "weight", "frame", "rule",
        "stack",
    ]  # fmt: skip
    assert int(table["weight"].sum()) == sum(v["samples"] for v in s["phases"].values())
    lines = (folder / "stacks.collapsed").read_text().splitlines()
    assert len(lines) == len(table)
    role, phase, *_ = lines[0].rsplit(" ", 1)[0].split(";")
    assert role in EXPECTED or role == "other"
    assert phase in {p for p in table["phase"]}
    assert int(lines[0].rsplit(" ", 1)[1]) > 0


_LOG_LINE = re.compile(
    r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) .*Avg prompt throughput: ([\d.]+) tokens/s, "
    r"Avg generation throughput: ([\d.]+) tokens/s"
)


def _logged_prompt_tokens(log: str, start: datetime, span_s: float) -> float:
    """Prompt tokens by vLLM's own account: each line's rate times its 2 s interval."""
    total = 0.0
    for m in _LOG_LINE.finditer(log):
        at = datetime.strptime(f"{start.year}-{m[1]}", "%Y-%m-%d %H:%M:%S")
        if start.timestamp() < at.timestamp() <= start.timestamp() + span_s:
            total += float(m[2]) * 2.0
    return total


@pytest.mark.parametrize("workload", WORKLOADS)
def test_serving_figures_agree_with_the_load_generator_and_vllms_log(
    snapshots: dict[str, Path], vllm_server: VllmServer, workload: str
) -> None:
    s = summary(snapshots, workload)
    serving, load = s["serving"], LOADS[workload]
    assert serving["reason"] is None, serving
    # The whole load ran inside the window: the counts must agree.
    assert serving["requests_finished"] == pytest.approx(load.requests_ok, rel=0.10)
    assert serving["prompt_tokens"] == pytest.approx(load.prompt_tokens, rel=0.10)
    assert serving["generation_tokens"] == pytest.approx(load.completion_tokens, rel=0.10)
    # vLLM's own log line: "Avg prompt throughput" every 2 s; the intervals that ended after
    # the window opened (each covers the 2 s before its time stamp) hold the whole load. The
    # metrics window runs from the scrape before py-spy's attach to the one after its last
    # sample: longer than WINDOW_S by the attach, which on a busy host takes seconds.
    start = datetime.fromtimestamp(datetime.fromisoformat(s["created_at"]).timestamp())
    span = serving["window_s"]
    logged = _logged_prompt_tokens(vllm_server.log_path.read_text(), start, span)
    assert logged == pytest.approx(serving["prompt_tokens"], rel=0.10)


def test_kv_cache_bytes_match_the_servers_setting(snapshots: dict[str, Path]) -> None:
    """VLLM_CPU_KVCACHE_SPACE=1 (GiB) on the dev server: `Explicitly set (1.0/...) GiB`."""
    kv = summary(snapshots, "mixed")["kv_cache"]
    assert kv["bytes"] == 1 << 30
    assert kv["share_of"] == "host" and 0 < kv["share"] < 1
    assert kv["source"].startswith("vllm:cache_config_info")
