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
from sidecar.cli import main
from sidecar.store.summary_io import read_summary

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
    """A server whose KV cache holds four long prompts: more requests than that wait for blocks, and a running one that needs another
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


# The KV cache's size on the same server (its blocks overridden): what vLLM allocated, not its
# configured budget (0.1 printed "KV Cache: 1.1 GB" for a cache of 1,536 tokens). Once a module of
# its own with a server of its own: the same flags, so one start fewer. The tiny Llama keeps
# 2 KiB per token (float32); KV_BLOCKS x block size 128 = 1,536 tokens.
def test_the_report_counts_the_blocks_allocated_beside_the_budget(
    starved: VllmServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["snapshot", "--pid", str(starved.pid), "--duration", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    (folder,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    kv = read_summary(folder).kv_cache
    assert kv is not None and (kv.num_blocks, kv.block_size, kv.tokens) == (KV_BLOCKS, 128, 1536)
    assert kv.bytes == kv.allocated_bytes == 1536 * 2048  # 3 MiB: what vLLM allocated
    assert kv.budget_bytes == 1 << 30  # VLLM_CPU_KVCACHE_SPACE=1, reported as the budget
    capsys.readouterr()
    assert main(["report", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "- KV Cache: 3.0 MiB allocated (1,536 tokens x 2.0 KiB; budget 1.0 GiB)" in text
