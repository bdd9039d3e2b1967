"""Snapshots of a real vLLM CPU server under each workload (docs/PHASES.md's expectations per role).

One window per workload, taken by devtools/live_window.py: `vllm-sidecar snapshot` as a process
of its own, with the load from the moment py-spy samples until 5 s before the window closes,
so the snapshot's counts can be compared with the load generator's and with vLLM's own log.

Every bound rests on the noise recorded on this machine (tests/fixtures/noise, written by
benchmarks/noise.py from windows taken by the same function): a comparison between workloads
asserts a margin derived from the recorded spread (devtools/noise.py), and a bound the docs
state is checked against that record by tests/unit/project/test_noise_bounds.py. A window is taken again
only when the sidecar itself reports it invalid (py-spy 1 s or more behind, or a partial
window), up to ATTEMPTS times (from the record's rate of invalid windows): never because an
assertion failed.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest

from devtools.live_window import (
    EXPECTED,
    WORKLOADS,
    LiveWindow,
    load_inside,
    measures,
    take_window,
)
from devtools.noise import CLAIMS, COMPARISONS, Claim, attempts, load_record, margin
from devtools.server import VllmServer

pytestmark = pytest.mark.integration

RECORD = load_record()
MARGINS = [margin(RECORD, *comparison) for comparison in COMPARISONS]
ATTEMPTS = attempts(RECORD)  # windows per workload at most, until one is valid
TAKEN: dict[str, list[LiveWindow]] = {}  # workload -> every window taken, in order


@pytest.fixture(scope="module")
def windows(
    vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, LiveWindow]:
    """The first valid window per workload (absent when none of ATTEMPTS was valid)."""
    out: dict[str, LiveWindow] = {}
    for workload in WORKLOADS:
        taken = TAKEN.setdefault(workload, [])
        for attempt in range(ATTEMPTS):
            # A new seed each attempt: new prompts, not the same ones again.
            folder = tmp_path_factory.mktemp(workload)
            taken.append(take_window(vllm_server, workload, folder, seed=attempt))
            if taken[-1].invalid_reason is None:
                out[workload] = taken[-1]
                break
    print(
        "windows taken:", {w: [t.invalid_reason or "valid" for t in ts] for w, ts in TAKEN.items()}
    )
    return out


def valid(windows: dict[str, LiveWindow], workload: str) -> LiveWindow:
    """WORKLOAD's valid window. Without one, the accuracy checks are skipped, not failed: the
    sidecar said why each window cannot be trusted (test_a_late_window_says_so checks that it
    says so), and failing would make the suite's colour depend on how starved the host was."""
    if workload not in windows:
        reasons = [t.invalid_reason for t in TAKEN[workload]]
        pytest.skip(
            f"the sidecar reported all {len(reasons)} {workload} windows invalid: {reasons}"
        )
    return windows[workload]


def latest(windows: dict[str, LiveWindow], workload: str) -> LiveWindow:
    """WORKLOAD's last window, valid or not: for checks that do not depend on its timing."""
    return windows.get(workload) or TAKEN[workload][-1]


@pytest.fixture(scope="module")
def figures(windows: dict[str, LiveWindow], vllm_server: VllmServer) -> dict[str, Any]:
    """Each valid window's figures, as devtools.live_window.measures computes them."""
    log = vllm_server.log_path.read_text(errors="replace")
    out = {w: measures(win.summary, win.load, log) for w, win in windows.items()}
    print("figures:", {w: {k: round(v, 4) for k, v in f.items()} for w, f in out.items()})
    return out


def check(claim: Claim, value: float, context: object) -> None:
    assert claim.holds(value), (claim, value, context)


def claims(*quantities: str) -> list[Claim]:
    return [c for c in CLAIMS if c.quantity in quantities]


def test_target_processes_and_roles(
    windows: dict[str, LiveWindow], vllm_server: VllmServer
) -> None:
    target = latest(windows, "mixed").summary["target"]
    assert target["root_pid"] == vllm_server.pid
    roles = [p["role"] for p in target["processes"]]
    assert roles[:3] == ["api_server", "engine_core", "worker"]
    assert all(p["start_time"] > 0 for p in target["processes"])


@pytest.mark.parametrize("workload", WORKLOADS)
def test_a_late_window_says_so(windows: dict[str, LiveWindow], workload: str) -> None:
    """Every window taken, valid or not: lateness is reported exactly when it is there."""
    for taken in TAKEN[workload]:
        sampling = taken.summary["sampling"]
        late = [w for w in sampling["warnings"] if "behind" in w]
        assert bool(late) == (sampling["behind_s"] >= 1.0), sampling


@pytest.mark.parametrize("workload", WORKLOADS)
def test_each_role_spends_its_samples_where_phases_md_says(
    windows: dict[str, LiveWindow], figures: dict[str, Any], workload: str
) -> None:
    s, got = valid(windows, workload).summary, figures[workload]
    assert not s["sampling"]["partial"], s["sampling"]
    for claim in claims("samples", *(f"{r}_{k}" for r in EXPECTED for k in ("inside", "other"))):
        check(claim, got[claim.quantity], (s["by_role"], s["other"]))


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_workload_steps_the_model(
    windows: dict[str, LiveWindow], figures: dict[str, Any], workload: str
) -> None:
    """The model is stepped: the worker's main thread computes, or the EngineCore's waits on
    it. (Under decode-heavy the worker mostly spins in sched_yield between tiny steps: idle.)
    A window that missed the load shows about 0.005 here; recorded valid windows 0.75 to 1.9."""
    main_thread = valid(windows, workload).summary["main_thread"]
    (claim,) = claims("main_thread_step")
    check(claim, figures[workload]["main_thread_step"], main_thread)


@pytest.mark.parametrize("m", MARGINS, ids=lambda m: f"{m.quantity}:{m.a}>{m.b}")
def test_workloads_differ_in_the_expected_direction(
    windows: dict[str, LiveWindow], figures: dict[str, Any], m: Any
) -> None:
    """Long prompts make few large steps: much worker compute per step's bookkeeping; many
    short decode steps make little. One window of each, compared with a margin the recorded
    spread gives (devtools/noise.py: K Student-t prediction standard deviations below the
    recorded mean difference, for a false failure chance of 1e-4 per comparison).

    Not asserted, as the record does not bear them out for single windows on this busy 2-core
    host (tests/unit/project/test_noise_bounds.py prints their margins): the worker's compute share
    (decode-heavy's rises to prefill-heavy's when other processes contend for the cores, as
    each tiny step stretches; the failure in the issue, 0.318 against twice 0.1615) and the API
    server's tokenising (about 20 samples a window: too few to tell)."""
    valid(windows, m.a)
    valid(windows, m.b)
    a, b = figures[m.a][m.quantity], figures[m.b][m.quantity]
    assert a - b > m.bound, (m, a, b, {w: s.summary["by_role"] for w, s in windows.items()})


def test_snapshot_files(windows: dict[str, LiveWindow]) -> None:
    window = latest(windows, "mixed")
    folder, s = window.snapshot, window.summary
    assert set(s) >= {"target", "sampling", "phases", "by_role", "stages"}
    assert set(s["stages"]) == {"prefill", "decode", "unknown"}
    table = pd.read_parquet(folder / "stacks.parquet")
    assert list(table.columns) == [
        "host", "deployment", "snapshot", "time", "kind",
        "pid", "role", "thread_id", "thread_name", "phase", "stage", "weight", "frame", "rule",
        "stack",
    ]  # fmt: skip
    assert set(table["snapshot"]) == {s["name"]} and set(table["kind"]) == {"snapshot"}
    assert set(table["host"]) == {s["host"]} and set(table["deployment"]) == {s["deployment"]}
    assert int(table["weight"].sum()) == sum(v["samples"] for v in s["phases"].values())
    lines = (folder / "stacks.collapsed").read_text().splitlines()
    assert len(lines) == len(table)
    role, phase, *_ = lines[0].rsplit(" ", 1)[0].split(";")
    assert role in EXPECTED or role == "other"
    assert phase in {p for p in table["phase"]}
    assert int(lines[0].rsplit(" ", 1)[1]) > 0


@pytest.mark.parametrize("workload", WORKLOADS)
def test_serving_figures_agree_with_the_load_generator_and_vllms_log(
    windows: dict[str, LiveWindow], figures: dict[str, Any], workload: str
) -> None:
    """The whole load ran inside the window: the snapshot's request and token counts must
    agree with the load generator's, and its prompt tokens with vLLM's "Avg prompt throughput"
    lines (each line's rate times the time since the line before it, from the millisecond
    stamps devtools/vllm_logging.json gives the dev server)."""
    window = valid(windows, workload)
    serving = window.summary["serving"]
    assert serving["reason"] is None and window.load is not None, serving
    assert window.load.requests_ok > 0, window.load
    if not load_inside(window.load):  # timed by the load generator, not read from the counts
        pytest.skip(f"the load ran {window.load.elapsed_s:.1f} s, past the window: a starved host")
    for claim in claims(*(f"{n}_ratio" for n in ("requests", "prompt_tokens",
                                                 "generation_tokens", "logged_prompt"))):  # fmt: skip
        check(claim, figures[workload][claim.quantity], (serving, window.load))


def test_kv_cache_bytes_match_the_servers_setting(windows: dict[str, LiveWindow]) -> None:
    """VLLM_CPU_KVCACHE_SPACE=1 (GiB) on the dev server: the budget, from vLLM's own labels;
    nothing overrides the blocks, so the blocks vLLM allocated (4,096 of 128 tokens x 2 KiB
    with the tiny Llama) fill it."""
    kv = latest(windows, "mixed").summary["kv_cache"]
    assert kv["budget_bytes"] == 1 << 30, kv
    assert kv["budget_source"].startswith("vllm:cache_config_info"), kv
    assert kv["bytes"] == kv["allocated_bytes"] == 1 << 30, kv
    assert kv["share_of"] == "host" and 0 < kv["share"] < 1, kv


def test_diff_reads_the_windows_just_taken(windows: dict[str, LiveWindow]) -> None:
    """`diff` on snapshots the current code has just written (its statistics are checked on the
    recorded windows, tests/unit/diff/): one window a side of one server, a mixed load against
    long prompts, runs, names no fingerprint change and says the workload differs."""
    from devtools.diff_windows import cli

    a, b = latest(windows, "mixed").snapshot, latest(windows, "prefill-heavy").snapshot
    done = cli("diff", str(a), str(b), "--format", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["fingerprint"] == []  # the same server
    assert out["a"]["workload"]["windows"] == 1 and out["b"]["workload"]["windows"] == 1
    assert "prompt tokens per request" in out["workload_differs"], out["verdict"]
    assert out["verdict"]
