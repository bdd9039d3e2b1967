"""`vllm-sidecar diff` with two windows a side, as an operator compares two short stretches: the
same steady load twice, another workload, and a restart with another serving flag. On real
windows of the dev vLLM recorded by `make record-diff` (tests/fixtures/diff: 30 s windows of
5 s segments), through the CLI. These assertions ran on windows taken live in every `make test`
until issue 21 (about 5 minutes of the suite): the windows only fed the assertions, so they are
the recorded ones now; `diff` on windows the current code has just taken is checked live in
tests/integration/test_live_snapshot.py.

The steady pair is judged at the diff's stated family-wise level (5 %); the rate measured on
the recorded steady pairs (test_diff_recorded.py) is what bounds how often that can fail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main

RECORD = Path(__file__).resolve().parents[2] / "fixtures" / "diff"
# Two windows a side: [since, until) over each recorded folder's UTC times.
STEADY = f"{RECORD / 'steady-mixed'}@..2026-12-01T14:46:00"  # 14:44:54, 14:45:49
PREFILL = f"{RECORD / 'prefill-heavy'}@..2026-12-01T14:54:00"  # 14:53:07, 14:53:42
ONE_SEQ = f"{RECORD / 'max-num-seqs-1'}@..2026-12-01T14:57:30"  # 14:55:49, 14:57:02


def diff(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    code = main(["diff", *args, "--format", "json"])
    assert code in (0, 10)
    return code, json.loads(capsys.readouterr().out)


def test_the_same_steady_load_twice_is_no_significant_change(
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = sorted((RECORD / "steady-mixed").iterdir())[:2]
    code, out = diff(capsys, str(a), str(b), "--fail-on", "25%")
    assert out["method"]["tested"] > 10
    assert out["significant"] == [], out["verdict"]
    assert out["fingerprint"] == []  # the same server
    assert code == 0
    assert str(out["verdict"][0]).startswith("No significant change")


def test_long_prompts_raise_compute_in_the_worker_and_the_workload_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two windows a side resolve the worker's compute; the API server's tokenisation, about 1 %
    of its samples on this tiny model, takes more windows (test_diff_recorded.py)."""
    code, out = diff(capsys, STEADY, PREFILL, "--fail-on", "10%")
    assert out["a"]["workload"]["windows"] == 2 and out["b"]["workload"]["windows"] == 2
    found = {(c["role"], c["name"]): c for c in out["significant"]}
    compute = found.get(("worker", "compute"))
    assert compute is not None and compute["change"] > 0, out["verdict"]
    assert "worker compute up" in " ".join(out["verdict"])
    workload = out["b"]["workload"], out["a"]["workload"]
    assert workload[0]["prompt_per_request"] > 1.5 * workload[1]["prompt_per_request"]
    assert "prompt tokens per request" in out["workload_differs"]
    assert code == 0  # different work, not a regression of the server


def test_a_restart_with_another_flag_is_named_first_and_costs_more(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two windows a side (time ranges): the CPU costs and latencies are tested over windows."""
    code, out = diff(capsys, STEADY, ONE_SEQ, "--fail-on", "10%")
    assert out["a"]["workload"]["windows"] == 2 and out["b"]["workload"]["windows"] == 2
    changes = out["fingerprint"]
    assert {"field": "max-num-seqs", "a": "default", "b": "1"} in changes
    assert str(out["verdict"][0]).startswith("Ran differently: ")
    assert "max-num-seqs default \u2192 1" in str(out["verdict"][0])
    # One sequence at a time: no batching, so each generated token costs more CPU and requests
    # queue for the one slot. Two windows a side show it in the estimates; the gate's exit 10
    # is checked on the whole record (test_diff_recorded.py): with two a side Welch's degrees of
    # freedom fall near 1 and the Bonferroni t quantile is in the hundreds.
    cost = next(c for c in out["costs"] if (c["role"], c["name"]) == ("worker", "all"))
    ttft = next(c for c in out["serving"] if c["name"] == "TTFT mean")
    assert cost["change"] > 1.1 and ttft["change"] > 1.1, out["verdict"]
    assert code in (0, 10)
