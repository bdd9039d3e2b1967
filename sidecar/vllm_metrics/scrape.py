"""One `/metrics` answer, parsed into a compact frozen record. Parsing never raises: a garbled or
empty answer becomes a scrape whose `error` says what was wrong (STYLE.md, point 7).

The text is parsed with prometheus_client's own parser. Samples are kept under their *sample*
names (`vllm:request_success_total`, `vllm:e2e_request_latency_seconds_bucket`), not family
names: the parser strips `_total` from a counter's family name only when a `# TYPE` line declares
it a counter, so sample names are the one spelling that does not depend on how the exporter
typed its families.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

LabelSet = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
Series = tuple[tuple[LabelSet, float], ...]  # one value per label set

VLLM_PREFIX = "vllm:"
# Families whose `_created` companions (exposed as gauge families in text format 0.0.4) are start
# timestamps, not measurements; dropping them halves a scrape.
_CREATED_OWNERS = ("counter", "histogram", "summary", "gaugehistogram")
# What prometheus_client's text parser raises on a line it cannot read.
_PARSE_ERRORS = (ValueError, IndexError, KeyError, TypeError)


@dataclass(frozen=True, slots=True)
class MetricsScrape:
    """One scrape of `/metrics`: when it was taken, and every sample by sample name.

    `taken_at` is on the injected monotonic clock (the midpoint of the request), `wall` is
    `time.time()` at its start. `samples` must be treated as read-only. A failed scrape has
    `error` set and no samples.
    """

    url: str
    taken_at: float
    wall: float
    samples: Mapping[str, Series]
    error: str | None = None
    fetch_s: float = 0.0
    # family name -> its `# TYPE` as prometheus_client's parser read it ("counter", "gauge",
    # "histogram", "summary", "unknown" without a TYPE line): what `kind: auto` of a custom
    # metric goes by. Counter families are named without `_total`.
    types: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    def first_present(self, names: Iterable[str]) -> str | None:
        """The first of `names` this scrape holds (newest metric names are listed first)."""
        return next((name for name in names if name in self.samples), None)


def failed_scrape(
    url: str, error: str, *, taken_at: float, wall: float, fetch_s: float = 0.0
) -> MetricsScrape:
    return MetricsScrape(url, taken_at, wall, {}, error=error, fetch_s=fetch_s)


def parse_scrape(
    text: str,
    *,
    url: str,
    taken_at: float,
    wall: float,
    fetch_s: float = 0.0,
    vllm: bool = True,
) -> MetricsScrape:
    """Parse Prometheus text format (0.0.4) into a `MetricsScrape`; never raises. `vllm`:
    refuse an answer without `vllm:` metrics (False for another exporter: a custom metric's
    router or application)."""

    def failed(error: str) -> MetricsScrape:
        return failed_scrape(url, error, taken_at=taken_at, wall=wall, fetch_s=fetch_s)

    if not text.strip():
        return failed(f"garbage: empty answer from {url} (an exporter always writes some lines)")
    if not text.endswith("\n"):
        # The text format has no end marker (OpenMetrics' `# EOF`), but prometheus_client ends
        # every exposition with a newline; without one, the last number may be cut short.
        return failed(
            f"garbage: truncated answer from {url} ({len(text)} characters, no final "
            f"newline): {_last_line(text)!r}"
        )
    try:
        families = list(text_string_to_metric_families(text))
    except _PARSE_ERRORS as error:
        return failed(
            f"garbage: {url} did not answer Prometheus text ({error}); it begins "
            f"{_first_line(text)!r}"
        )
    samples = _samples_by_name(families)
    if vllm and not any(name.startswith(VLLM_PREFIX) for name in samples):
        return failed(
            f"no vllm: metrics at {url}: it answers Prometheus text, but not vLLM's (the sidecar "
            "needs the OpenAI server's /metrics, `vllm serve`)"
        )
    created = {f"{f.name}_created" for f in families if f.type in _CREATED_OWNERS}
    types = {f.name: f.type for f in families if f.name not in created}
    return MetricsScrape(url, taken_at, wall, samples, fetch_s=fetch_s, types=types)


def _samples_by_name(families: list[Metric]) -> dict[str, Series]:
    created = {f"{f.name}_created" for f in families if f.type in _CREATED_OWNERS}
    grouped: dict[str, list[tuple[LabelSet, float]]] = {}
    for family in families:
        if family.name in created:
            continue
        for sample in family.samples:
            if sample.name.endswith("_created") and family.type in _CREATED_OWNERS:
                continue  # OpenMetrics-style: the companion is a sample of its own family
            labels = tuple(sorted(sample.labels.items()))
            grouped.setdefault(sample.name, []).append((labels, float(sample.value)))
    return {name: tuple(series) for name, series in grouped.items()}


def label_value(labels: LabelSet, name: str) -> str | None:
    return next((value for key, value in labels if key == name), None)


def finite(value: float) -> float | None:
    """NaN and infinities are legal sample values, but not figures."""
    return value if math.isfinite(value) else None


def _first_line(text: str) -> str:
    return text.lstrip().split("\n", 1)[0][:80]


def _last_line(text: str) -> str:
    return text.rsplit("\n", 1)[-1][-80:]
