"""vLLM's own Prometheus metrics: where to scrape them, one scrape, and figures over a window.

    url = metrics_url_from_cmdline(api_server.cmdline)
    source = HttpMetricsSource(url)
    first = take_scrape(source)
    ...                                   # the profiling window
    figures = serving_figures(first, take_scrape(source))

Nothing here raises into the sampling loop: a server without `/metrics`, or one answering
garbage, gives `ServingFigures` whose figures are None and whose `reason` says why.
"""

from sidecar.records.readings import ServingFigures
from sidecar.vllm_metrics.endpoint import DEFAULT_PORT, metrics_url_from_cmdline
from sidecar.vllm_metrics.figures import (
    HistogramDelta,
    histogram_quantile,
    serving_figures,
)
from sidecar.vllm_metrics.scrape import MetricsScrape, parse_scrape
from sidecar.vllm_metrics.source import (
    HttpMetricsSource,
    MetricsSource,
    ScrapeError,
    take_scrape,
)

__all__ = [
    "DEFAULT_PORT",
    "HistogramDelta",
    "HttpMetricsSource",
    "MetricsScrape",
    "MetricsSource",
    "ScrapeError",
    "ServingFigures",
    "histogram_quantile",
    "metrics_url_from_cmdline",
    "parse_scrape",
    "serving_figures",
    "take_scrape",
]
