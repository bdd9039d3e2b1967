"""Findings on the real vLLM CPU server: each condition a CPU host can show is induced, and the
finding must fire; a healthy `mixed` run must yield none.

Windows are taken as an operator takes them (`vllm-sidecar snapshot`, then `report`), under a
load generator running as a process of its own, started a few seconds before the window and
killed after it, so vLLM's gauges (KV usage, requests waiting) are read under load. The
thresholds in configs/advice.yaml were set from these windows; the figures each finding fired
on here are in the README ("Findings").
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.diff_windows import REPO, cli, env
from devtools.server import VllmServer

pytestmark = pytest.mark.integration

WINDOW_S = 8.0
WARMUP_S = 3.0
RATE_HZ = 20.0
KV_BLOCKS = 12  # x 128 tokens: 1,536 tokens of KV cache, four long prompts' worth


@contextlib.contextmanager
def load(server: VllmServer, workload: str, concurrency: int) -> Iterator[None]:
    """devtools.loadgen as a process of its own (a real client), in its own session, killed
    (its whole group) when the block ends."""
    argv = [sys.executable, "-m", "devtools.loadgen", "--url", server.base_url,
            "--workload", workload, "--duration", "600", "--concurrency", str(concurrency)]  # fmt: skip
    proc = subprocess.Popen(argv, env=env(), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        time.sleep(WARMUP_S)  # the server fills up before the window opens
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def window(server: VllmServer, workload: str, concurrency: int, out: Path) -> dict[str, Any]:
    """One snapshot under the load, and its report as JSON (findings included)."""
    with load(server, workload, concurrency):
        done = cli("snapshot", "--pid", str(server.pid), "--duration", f"{WINDOW_S:g}",
                   "--rate", f"{RATE_HZ:g}", "--out", str(out), timeout_s=WINDOW_S + 180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (folder,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    report = cli("report", str(folder), "--format", "json")
    assert report.returncode == 0, report.stderr[-3000:]
    data: dict[str, Any] = json.loads(report.stdout)
    text = cli("report", str(folder)).stdout
    print(f"\n--- {workload} x{concurrency}: {folder}\n{text.split('[Profile] Software:')[0]}")
    return data


def fired(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["id"]: f for f in data["findings"]["findings"]}


@pytest.fixture(scope="module")
def starved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A server whose KV cache holds four long prompts (as tests/integration/test_kv_live.py
    starts it): more requests than that wait for blocks, and a running one that needs another
    block while it decodes preempts another."""
    server = VllmServer(
        log_path=Path(tmp_path_factory.mktemp("vllm-starved")) / "server.log",
        extra_args=("--num-gpu-blocks-override", str(KV_BLOCKS)),
    )
    server.start()  # stops what it started if it fails
    try:
        yield server
    finally:
        server.stop()


def test_a_healthy_mixed_run_has_no_finding(vllm_server: VllmServer, tmp_path: Path) -> None:
    data = window(vllm_server, "mixed", 8, tmp_path)
    assert data["throughput"]["requests_per_s"] > 0  # the load was served in the window
    assert fired(data) == {}, json.dumps(data["findings"], indent=2)


def test_a_load_above_capacity_is_queueing(vllm_server: VllmServer, tmp_path: Path) -> None:
    """64 clients of long prompts on a server that prefills about a dozen a second."""
    data = window(vllm_server, "prefill-heavy", 64, tmp_path)
    found = fired(data)
    assert "queueing-dominates-ttft" in found, json.dumps(data["findings"], indent=2)
    assert found["queueing-dominates-ttft"]["evidence"][0].startswith("time to first token ")
    assert "kv-cache-exhausted" not in found  # 1 GiB of KV cache: queueing is for compute


def test_many_concurrent_streams_saturate_the_api_servers_main_thread(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    """128 clients streaming 128 tokens each: the API server sends a chunk per token, on one
    event loop."""
    data = window(vllm_server, "streaming", 128, tmp_path)
    found = fired(data)
    assert "api-server-saturated" in found, json.dumps(data["findings"], indent=2)
    finding = found["api-server-saturated"]
    assert finding["evidence"][0].startswith("API server main thread busy ")
    assert "--api-server-count" in finding["flags"] and "--stream-interval" in finding["flags"]


# Last: the second server starts after the windows of the first are taken (an idle vLLM's
# worker spins, and would take CPU from them), and stops when the module ends.
def test_a_tiny_kv_cache_under_mixed_load_is_exhausted(starved: VllmServer, tmp_path: Path) -> None:
    data = window(starved, "mixed", 16, tmp_path)
    found = fired(data)
    assert "kv-cache-exhausted" in found, json.dumps(data["findings"], indent=2)
    finding = found["kv-cache-exhausted"]
    assert finding["severity"] == "critical" and "--max-num-seqs" in finding["flags"]
    assert data["findings"]["findings"][0]["id"] == "kv-cache-exhausted"  # most severe first
