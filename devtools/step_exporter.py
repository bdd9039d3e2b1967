"""A Prometheus exporter whose values step once, after its first scrape: an operator's own
service (a router, say) for the live custom-metrics test, served by prometheus_client's own HTTP
server in a process (and session) of its own.

`vllm-sidecar snapshot` scrapes a custom URL once as its window starts and once as it ends, so
the window must read the step exactly (the counter's increase, the gauge's two values) whenever
its scrapes happen: nothing rests on timing, nor on a test process that a niced scheduling
group may starve (devtools/sidecar_proc.py).

    python -m devtools.step_exporter --port PORT [--step 42]

Before its first scrape: `router_requests_total{model="tiny"}` 100 and `router_queue_depth` 3;
from the second on: 100 + STEP and 9. A bare TCP connection (a readiness check) is no scrape.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

ROUTED = 100.0  # router_requests_total before the step (after: + STEP)
QUEUE = (3.0, 9.0)  # router_queue_depth before and after the step


class Stepping(Collector):
    """The router's two metrics, the counter up by `step` and the gauge from QUEUE[0] to QUEUE[1]
    after one scrape."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.scrapes = 0
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            stepped = self.scrapes > 0
            self.scrapes += 1
        routed = CounterMetricFamily("router_requests", "Requests routed.", labels=["model"])
        routed.add_metric(["tiny"], ROUTED + (self.step if stepped else 0.0))
        yield routed
        yield GaugeMetricFamily("router_queue_depth", "Requests queued.", value=QUEUE[stepped])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--step", type=float, default=42.0)
    args = parser.parse_args()
    registry = CollectorRegistry()
    registry.register(Stepping(args.step))
    _server, thread = start_http_server(args.port, addr="127.0.0.1", registry=registry)
    thread.join()  # until killed


if __name__ == "__main__":
    main()
