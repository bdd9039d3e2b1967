"""Custom metrics, live: one `snapshot` window of the real vLLM CPU server with a vLLM counter and
a vLLM gauge as custom metrics, a second URL served by prometheus_client's own HTTP server in
this process (a "router"), and a URL where nothing listens.

The router's values change only in the snapshot's progress callback, which runs after the
window's first scrape and before its last, so what the window must show is known exactly: no
assertion rests on timing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from devtools.server import VllmServer, free_port
from sidecar.commands import take_snapshot
from sidecar.config import SNAPSHOT_DEFAULTS, load_config, snapshot_options
from sidecar.report import render
from sidecar.summary_io import read_summary

pytestmark = pytest.mark.integration
ROUTED_IN_WINDOW = 42


def test_custom_metrics_from_vllm_and_a_router(
    vllm_server: VllmServer, background_load: Callable[..., Any], tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    routed = Counter("router_requests", "Requests routed.", ["model"], registry=registry)
    queue = Gauge("router_queue_depth", "Requests queued.", registry=registry)
    routed.labels("tiny").inc(100)
    queue.set(3)
    port, down = free_port(), free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    router = f"http://127.0.0.1:{port}/metrics"
    try:
        config_path = tmp_path / "sidecar.yaml"
        config_path.write_text(f"""
custom_metrics:
  - {{name: tokens_out, metric: "vllm:generation_tokens"}}
  - {{name: running, metric: "vllm:num_requests_running", labels: {{model_name: tiny}}}}
  - {{name: routed, url: "{router}", metric: router_requests, labels: {{model: tiny}}}}
  - {{name: queue, url: "{router}", metric: router_queue_depth}}
  - {{name: gone, url: "http://127.0.0.1:{down}/metrics", metric: router_requests}}
""")  # fmt: skip
        config = load_config(config_path, environ={}, defaults=SNAPSHOT_DEFAULTS,
                             flags={"target.pid": vllm_server.pid, "sampling.segment_s": "2s",
                                    "gpu": False})  # fmt: skip
        options = snapshot_options({"out": str(tmp_path / "out"), "duration_s": "6s"})

        changed: list[str] = []

        def sampling(line: str) -> None:
            """Heard as each py-spy segment starts sampling: after the window's first
            scrapes and before its last. Changes the router's values once."""
            if not changed:
                routed.labels("tiny").inc(ROUTED_IN_WINDOW)
                queue.set(9)
                changed.append(line)

        with background_load(vllm_server.base_url, "mixed", 9.0) as load:
            folder, summary = take_snapshot(config, options, progress=sampling)
        assert load.error is None and changed
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

    assert read_summary(folder) == summary  # schema 4 on disk, read back whole
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
    # The router: exactly what changed inside the window.
    assert routed_m.kind == "rate" and routed_m.source == router and routed_m.window_s
    assert routed_m.value * routed_m.window_s == pytest.approx(ROUTED_IN_WINDOW)
    assert (queue_m.kind, queue_m.value, queue_m.samples) == ("mean", 6.0, 2)  # (3 + 9) / 2
    # Nothing listens there: that metric says why, and the window is whole.
    assert gone.value is None and "connection refused (is the exporter" in (gone.reason or "")
    assert summary.sampling.samples > 0 and serving.reason is None
    text = render(summary)
    assert "[Profile] Custom metrics:\n- tokens_out: " in text
    assert f"- gone: not measured (no /metrics at http://127.0.0.1:{down}/metrics" in text
