"""Custom metrics, live: one `vllm-sidecar snapshot` window of the real vLLM CPU server with a
vLLM counter and a vLLM gauge as custom metrics, a second URL served by an operator's own
service (devtools/step_exporter.py, prometheus_client's HTTP server), and a URL where nothing
listens.

Every process runs in a session of its own, as in production: the sidecar, the load generator,
the service. The service's values step once, after its first scrape, and the window scrapes it
as it starts and as it ends, so what the window must show is known exactly: no assertion rests
on timing, nor on this test process getting CPU (a niced runner session, as CI's is, starved an
in-process window until the load had ended: 0 tokens in 6.6 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from devtools import sidecar_proc
from devtools.diff_windows import cli, steady_load
from devtools.server import VllmServer, free_port, wait_listening
from devtools.step_exporter import QUEUE
from sidecar.report.text import render
from sidecar.store.summary_io import read_summary

pytestmark = pytest.mark.integration
STEP = 42


def test_custom_metrics_from_vllm_and_a_router(vllm_server: VllmServer, tmp_path: Path) -> None:
    port, down = free_port(), free_port()
    service = sidecar_proc.spawn(
        [sys.executable, "-m", "devtools.step_exporter", "--port", str(port), "--step", str(STEP)],
        cwd=sidecar_proc.REPO, env=sidecar_proc.env(),
    )  # fmt: skip
    router = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_listening(port, service, "the operator's service (devtools.step_exporter)")
        config_path = tmp_path / "sidecar.yaml"
        config_path.write_text(f"""
gpu: false
sampling: {{segment_s: 2s}}
custom_metrics:
  - {{name: tokens_out, metric: "vllm:generation_tokens"}}
  - {{name: running, metric: "vllm:num_requests_running", labels: {{model_name: tiny}}}}
  - {{name: routed, url: "{router}", metric: router_requests, labels: {{model: tiny}}}}
  - {{name: queue, url: "{router}", metric: router_queue_depth}}
  - {{name: gone, url: "http://127.0.0.1:{down}/metrics", metric: router_requests}}
""")  # fmt: skip
        out = tmp_path / "out"
        # The load runs from before the sidecar starts until its window is written.
        with steady_load(vllm_server, "mixed", 600.0):
            done = cli("snapshot", "--pid", str(vllm_server.pid), "--config", str(config_path),
                       "--duration", "6", "--out", str(out))  # fmt: skip
        assert done.returncode == 0, done.stderr
    finally:
        sidecar_proc.kill(service, 10)

    (folder,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    summary = read_summary(folder)  # schema 4 on disk
    tokens, running, routed_m, queue_m, gone = summary.custom
    serving = summary.serving
    print("custom:", [(m.name, m.value, m.samples, m.reason) for m in summary.custom])
    print("serving window:", serving.window_s, serving.generation_tokens, summary.sampling.segments)
    # The vLLM counter: the same increase as the serving figures', over the same scrapes.
    assert tokens.kind == "rate" and tokens.type == "counter" and tokens.value is not None
    assert serving.generation_tokens and serving.window_s
    assert tokens.value * (tokens.window_s or 0) == pytest.approx(serving.generation_tokens)
    assert tokens.window_s == pytest.approx(serving.window_s)
    # The vLLM gauge: every scrape of the window, the segment boundaries' included.
    assert running.kind == "mean" and running.value is not None and running.value >= 0
    # (how many segments a 6 s window of 2 s segments gets depends on how soon py-spy attached:
    # one of 9.3 s when the runner was starved of CPU; the count, not the timing, is asserted)
    assert running.samples == summary.sampling.segments + 1 >= 2, running
    # The service: exactly its step, read by the window's first and last scrapes.
    assert routed_m.kind == "rate" and routed_m.source == router and routed_m.window_s
    assert routed_m.value * routed_m.window_s == pytest.approx(STEP)
    assert (queue_m.kind, queue_m.value, queue_m.samples) == ("mean", sum(QUEUE) / 2, 2)
    # Nothing listens there: that metric says why, and the window is whole.
    assert gone.value is None and "connection refused (is the exporter" in (gone.reason or "")
    assert summary.sampling.samples > 0 and serving.reason is None
    text = render(summary)
    assert "[Profile] Custom metrics:\n- tokens_out: " in text
    assert f"- gone: not measured (no /metrics at http://127.0.0.1:{down}/metrics" in text
