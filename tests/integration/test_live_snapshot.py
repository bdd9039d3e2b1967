"""Snapshots of a real vLLM CPU server under each workload (PHASES.md's expectations per role).

One window per workload, taken through the CLI in-process (py-spy and vLLM are real processes).
The rate is raised above the default so a 10 s window has enough samples for shares to be
stable; the default's cost is measured by benchmarks/overhead.py, not here.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from devtools.loadgen import background_load
from devtools.server import VllmServer
from sidecar.cli import main

pytestmark = pytest.mark.integration

WORKLOADS = ("prefill-heavy", "decode-heavy", "mixed")
RATE_HZ = "25"
WINDOW_S = 10.0

# PHASES.md / the issue: where each role's samples are expected to go.
EXPECTED = {
    "worker": {"forward", "attention", "sampling", "kv_cache", "communication", "idle"},
    "engine_core": {"scheduling", "model_wait", "communication", "idle", "kv_cache"},
    "api_server": {"input_processing", "output_processing", "idle"},
}


LOADS: dict[str, Any] = {}  # workload -> the load generator's own result


@pytest.fixture(scope="module")
def snapshots(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for workload in WORKLOADS:
        folder = tmp_path_factory.mktemp(workload)
        # The load runs 3 s before and after the window, so the window sees steady state.
        with background_load(vllm_server.base_url, workload, WINDOW_S + 6) as load:
            time.sleep(3)
            args = ["snapshot", "--pid", str(vllm_server.pid), "--duration", str(WINDOW_S),
                    "--rate", RATE_HZ, "--out", str(folder)]  # fmt: skip
            assert main(args) == 0
        assert load.error is None and load.result.requests_ok > 0, load.error
        LOADS[workload] = load.result
        (snap,) = [p for p in folder.iterdir() if not p.name.startswith(".")]
        out[workload] = snap
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
def test_every_workload_reaches_the_model(snapshots: dict[str, Path], workload: str) -> None:
    by_role = summary(snapshots, workload)["by_role"]
    assert by_role["worker"].get("forward", 0.0) > 0.01, by_role["worker"]
    assert by_role["engine_core"].get("model_wait", 0.0) >= 0.05, by_role["engine_core"]


def _share(s: dict[str, Any], role: str, *phases: str) -> float:
    return float(sum(s["by_role"][role].get(p, 0.0) for p in phases))


def test_workloads_differ_in_the_expected_direction(snapshots: dict[str, Path]) -> None:
    """What differs on this CPU server with a 2-layer model (measured, see README): long prompts
    make the worker compute and the API server tokenise; short prompts with many output tokens
    make many tiny steps, so the engine's per-step messaging and scheduling weigh more. Sampling
    and detokenisation of a 512-token vocabulary are too cheap here to be seen at all."""
    prefill, decode, mixed = (summary(snapshots, w) for w in WORKLOADS)
    print({w: summary(snapshots, w)["by_role"] for w in WORKLOADS})  # shown when it fails
    compute = ("forward", "attention")
    assert _share(prefill, "worker", *compute) > _share(mixed, "worker", *compute)
    assert _share(mixed, "worker", *compute) > _share(decode, "worker", *compute)
    assert _share(prefill, "api_server", "input_processing") > _share(
        decode, "api_server", "input_processing"
    )
    step = ("communication", "scheduling")
    assert _share(decode, "engine_core", *step) > _share(prefill, "engine_core", *step)


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


def _log_rates(log: str, start: datetime, end: datetime) -> tuple[float, float] | None:
    """vLLM's own figures (one line per 2 s interval) for the intervals inside the window."""
    rows = []
    for m in _LOG_LINE.finditer(log):
        at = datetime.strptime(f"{start.year}-{m[1]}", "%Y-%m-%d %H:%M:%S")
        if start.timestamp() + 2 <= at.timestamp() <= end.timestamp():
            rows.append((float(m[2]), float(m[3])))
    if not rows:
        return None
    return sum(r[0] for r in rows) / len(rows), sum(r[1] for r in rows) / len(rows)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_serving_figures_agree_with_the_load_generator_and_vllms_log(
    snapshots: dict[str, Path], vllm_server: VllmServer, workload: str
) -> None:
    s = summary(snapshots, workload)
    serving, load = s["serving"], LOADS[workload]
    assert serving["reason"] is None, serving
    # Steady load before, during and after the window: the rates must agree.
    assert serving["requests_per_s"] == pytest.approx(load.requests_per_s, rel=0.10)
    assert serving["prompt_tokens_per_s"] == pytest.approx(load.prompt_tokens_per_s, rel=0.10)
    if workload != "prefill-heavy":  # 1-2 tokens a request: too few to compare as a rate
        assert serving["generation_tokens_per_s"] == pytest.approx(load.tokens_per_s, rel=0.10)
    # vLLM's own log line, local time, over the 2 s intervals that ended inside the window.
    start = datetime.fromtimestamp(datetime.fromisoformat(s["created_at"]).timestamp())
    end = datetime.fromtimestamp(start.timestamp() + s["sampling"]["duration_s"])
    logged = _log_rates(vllm_server.log_path.read_text(), start, end)
    assert logged is not None, "no 'Avg prompt throughput' line inside the window"
    assert serving["prompt_tokens_per_s"] == pytest.approx(logged[0], rel=0.10)


def test_kv_cache_bytes_match_the_servers_setting(snapshots: dict[str, Path]) -> None:
    """VLLM_CPU_KVCACHE_SPACE=1 (GiB) on the dev server: `Explicitly set (1.0/...) GiB`."""
    kv = summary(snapshots, "mixed")["kv_cache"]
    assert kv["bytes"] == 1 << 30
    assert kv["share_of"] == "host" and 0 < kv["share"] < 1
    assert kv["source"].startswith("vllm:cache_config_info")
