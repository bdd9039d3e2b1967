"""vLLM's /metrics, live: the URL from the real server's /proc cmdline, two scrapes around a load,
and figures within 10 % of what the load generator itself counted (the issue's acceptance check).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from devtools.loadgen import run_load
from devtools.server import VllmServer
from sidecar.target.procfs import parse_cmdline
from sidecar.vllm_metrics import (
    HttpMetricsSource,
    MetricsScrape,
    metrics_url_from_cmdline,
    serving_figures,
    take_scrape,
)

pytestmark = pytest.mark.integration
TOLERANCE = 0.10


def scrape_when_idle(source: HttpMetricsSource, timeout_s: float = 10.0) -> MetricsScrape:
    """A scrape taken once vLLM reports nothing running or waiting. vLLM records a request's
    stats after sending its response, so a scrape at the instant the load generator sees its
    last answer can miss the last few requests; idleness is the handshake that they are in."""
    deadline = time.monotonic() + timeout_s
    while True:
        scrape = take_scrape(source)
        latest = serving_figures(scrape)
        if latest.requests_running == 0 and latest.requests_waiting == 0:
            return scrape
        assert time.monotonic() < deadline, f"vLLM not idle after {timeout_s} s: {latest}"
        time.sleep(0.05)


def test_metrics_url_from_the_live_cmdline(vllm_server: VllmServer) -> None:
    cmdline = parse_cmdline(Path(f"/proc/{vllm_server.pid}/cmdline").read_bytes())
    assert metrics_url_from_cmdline(cmdline) == f"{vllm_server.base_url}/metrics"
    scrape = take_scrape(HttpMetricsSource(metrics_url_from_cmdline(cmdline)))
    assert scrape.ok, scrape.error


def test_live_window_agrees_with_the_load_generator(vllm_server: VllmServer) -> None:
    source = HttpMetricsSource(f"{vllm_server.base_url}/metrics")
    first = scrape_when_idle(source)
    # In this process, not a process of its own (`background_load`): the rates compare spans,
    # so the load starts right after the first scrape, not a process start-up later.
    result = run_load(vllm_server.base_url, "mixed", 8.0)
    last = scrape_when_idle(source)
    assert result.requests_ok > 0 and result.requests_failed == 0, result

    figures = serving_figures(first, last)
    assert figures.reason is None and figures.missing == (), figures
    assert figures.requests_finished == pytest.approx(result.requests_ok, rel=TOLERANCE)
    assert figures.prompt_tokens == pytest.approx(result.prompt_tokens, rel=TOLERANCE)
    assert figures.generation_tokens == pytest.approx(result.completion_tokens, rel=TOLERANCE)
    assert figures.requests_per_s == pytest.approx(result.requests_per_s, rel=TOLERANCE)
    assert figures.generation_tokens_per_s == pytest.approx(result.tokens_per_s, rel=TOLERANCE)
    for latency in (figures.ttft_p50_s, figures.ttft_p95_s, figures.prefill_time_mean_s):
        assert latency is not None and latency > 0
    assert figures.model_name == "tiny"
    assert figures.cache_config is not None and int(figures.cache_config["num_gpu_blocks"]) > 0


def test_a_path_without_metrics_gives_a_reason_not_an_exception(vllm_server: VllmServer) -> None:
    scrape = take_scrape(HttpMetricsSource(f"{vllm_server.base_url}/no-such-metrics"))
    figures = serving_figures(scrape, scrape)
    assert figures.reason is not None and figures.reason.startswith("no /metrics at ")
    assert figures.requests_per_s is None and figures.model_name is None
