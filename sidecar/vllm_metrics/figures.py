"""Serving figures over a window, from two scrapes of vLLM's `/metrics`.

Counters and histograms become deltas between the two scrapes, summed over every label set
(`model_name`, `engine`, `finished_reason`), the way `sum(rate(...))` reads them in PromQL; gauges
and `vllm:cache_config_info` come from the last scrape. Metric names are data: each figure lists
the names it accepts, newest first, because vLLM renamed several (docs/vllm-internals.md 4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sidecar.records.readings import ServingFigures
from sidecar.vllm_metrics.scrape import (
    VLLM_PREFIX,
    LabelSet,
    MetricsScrape,
    finite,
    label_value,
)

REQUEST_SUCCESS = ("vllm:request_success",)  # counter, one series per finished_reason
PROMPT_TOKENS = ("vllm:prompt_tokens",)
GENERATION_TOKENS = ("vllm:generation_tokens",)
PREEMPTIONS = ("vllm:num_preemptions",)
PREFILL_TIME = ("vllm:request_prefill_time_seconds",)  # histograms
DECODE_TIME = ("vllm:request_decode_time_seconds",)
TTFT = ("vllm:time_to_first_token_seconds",)
# Renamed 2025-09 (#24110); the old name is the same per-token gap in V0 and early V1.
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
# Renamed 2025-06 (#18354); the old name was exported until 2025-11 (#29330).
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
RUNNING = ("vllm:num_requests_running",)  # gauges; V0's vllm:num_requests_swapped is not read
WAITING = ("vllm:num_requests_waiting",)
CACHE_CONFIG = ("vllm:cache_config_info",)
# The API server's start time (prometheus_client's process collector): a change means a restart
# even when the new process has already counted past the old values.
PROCESS_START = "process_start_time_seconds"

RESET_REASON = "counter reset (server restarted) during the window"
ONLY_ONE_SCRAPE = "only one scrape"


@dataclass(frozen=True, slots=True)
class HistogramDelta:
    """A histogram's change over a window, summed over label sets."""

    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), +Inf last
    total: float  # the `_sum` delta
    count: float  # the `_count` delta

    def mean(self) -> float | None:
        return finite(self.total / self.count) if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        return histogram_quantile(q, self.buckets)


def serving_figures(first: MetricsScrape, last: MetricsScrape | None = None) -> ServingFigures:
    """Figures over the window from `first` to `last`; never raises.

    Window figures need two good scrapes of the same server; latest-value figures (gauges,
    cache config, model name) need only a good last scrape, so they survive a failed first
    scrape, a single scrape and a restart, with `reason` saying what the window lacks.
    """
    return replace(_figures(first, last), url=(last or first).url)


def _figures(first: MetricsScrape, last: MetricsScrape | None) -> ServingFigures:
    if last is None:
        return _latest(first, ONLY_ONE_SCRAPE)
    if not last.ok:
        return ServingFigures(reason=last.error)
    if not first.ok:
        return _latest(last, f"{ONLY_ONE_SCRAPE}: the first failed ({first.error})")
    window_s = last.taken_at - first.taken_at
    if window_s <= 0:
        return _latest(last, f"{ONLY_ONE_SCRAPE}: the two were not taken in time order")
    reader = _Reader(last, first)
    figures = _window(reader, window_s)
    resets = [*_restart(first, last), *reader.resets]
    if resets:
        return _latest(last, f"{RESET_REASON}: {'; '.join(resets[:3])}")
    return figures


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative `(upper bound, count)` buckets, as Prometheus'
    `histogram_quantile` computes it (`bucketQuantile` in promql/quantile.go): linear
    interpolation inside the bucket holding the rank, the first bucket starting at 0, and the
    highest finite bound when the rank falls in the +Inf bucket. None where PromQL gives NaN
    (no +Inf bucket, fewer than two buckets, no observations)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is not in [0, 1]")
    ordered = sorted(buckets)
    if len(ordered) < 2 or ordered[-1][0] != math.inf:
        return None
    counts = _monotonic([count for _, count in ordered])
    observations = counts[-1]
    if not 0 < observations < math.inf:  # also NaN, which a garbled exporter can send
        return None
    rank = q * observations
    b = next((i for i, count in enumerate(counts[:-1]) if count >= rank), len(ordered) - 1)
    if b == len(ordered) - 1:
        return ordered[-2][0]
    end = ordered[b][0]
    if b == 0 and end <= 0:
        return end
    start, below = (ordered[b - 1][0], counts[b - 1]) if b > 0 else (0.0, 0.0)
    in_bucket = counts[b] - below
    return start + (end - start) * ((rank - below) / in_bucket) if in_bucket > 0 else start


class _Reader:
    """Reads figures from the last scrape, as deltas from the first where there is one, and
    notes the metrics it did not find and the counters that went down."""

    def __init__(self, last: MetricsScrape, first: MetricsScrape | None = None) -> None:
        self.last, self.first = last, first
        self.missing: list[str] = []
        self.resets: list[str] = []

    def _find(self, names: Sequence[str], family: str) -> str | None:
        name = self.last.first_present(names)
        if name is None:
            self.missing.append(family)
        return name

    def gauge(self, families: Sequence[str], *, mean: bool = False) -> float | None:
        name = self._find(families, families[0])
        values = [value for _, value in self.last.samples[name]] if name else []
        if not values:
            return None
        return finite(sum(values) / len(values) if mean else sum(values))

    def info(self, families: Sequence[str]) -> dict[str, str] | None:
        """The labels of an info-style gauge, engine 0's when there are several engines."""
        name = self._find(families, families[0])
        if name is None or not self.last.samples[name]:
            return None
        labels = min(self.last.samples[name], key=lambda s: label_value(s[0], "engine") != "0")[0]
        return {key: value for key, value in labels if key != "engine"}

    def counter(self, families: Sequence[str]) -> float | None:
        # prometheus_client exposes a counter as `name_total`; a counter exposed without the
        # suffix (another exporter, or an untyped dump) is read under its bare name.
        name = self._find(
            [f"{f}{suffix}" for f in families for suffix in ("_total", "")], families[0]
        )
        return None if name is None else finite(sum(delta for _, delta in self._deltas(name)))

    def histogram(self, families: Sequence[str]) -> HistogramDelta | None:
        count_name = self._find([f"{f}_count" for f in families], families[0])
        if count_name is None:
            return None
        family = count_name.removesuffix("_count")
        by_bound: dict[float, float] = {}
        for labels, delta in self._deltas(f"{family}_bucket"):
            bound = _bound(label_value(labels, "le"))
            if bound is not None:
                by_bound[bound] = by_bound.get(bound, 0.0) + delta
        return HistogramDelta(
            buckets=tuple(sorted(by_bound.items())),
            total=sum(delta for _, delta in self._deltas(f"{family}_sum")),
            count=sum(delta for _, delta in self._deltas(count_name)),
        )

    def _deltas(self, name: str) -> list[tuple[LabelSet, float]]:
        """Per label set: last minus first (a series new in the window started from 0)."""
        before = dict(self.first.samples.get(name, ())) if self.first else {}
        deltas = []
        for labels, value in self.last.samples.get(name, ()):
            delta = value - before.pop(labels, 0.0)
            if delta < 0 and len(self.resets) < 3:
                self.resets.append(f"{name}{_braces(labels)} went down by {-delta:g}")
            deltas.append((labels, delta))
        if before and len(self.resets) < 3:
            self.resets.append(f"{name}{_braces(next(iter(before)))} disappeared")
        return deltas


def _window(reader: _Reader, window_s: float) -> ServingFigures:
    requests = reader.counter(REQUEST_SUCCESS)
    prompt = reader.counter(PROMPT_TOKENS)
    generation = reader.counter(GENERATION_TOKENS)
    preemptions = reader.counter(PREEMPTIONS)
    prefill, decode = reader.histogram(PREFILL_TIME), reader.histogram(DECODE_TIME)
    ttft, itl = reader.histogram(TTFT), reader.histogram(ITL)
    return replace(
        _latest_from(reader, reason=None),
        window_s=window_s,
        requests_finished=requests,
        prompt_tokens=prompt,
        generation_tokens=generation,
        requests_per_s=_rate(requests, window_s),
        prompt_tokens_per_s=_rate(prompt, window_s),
        generation_tokens_per_s=_rate(generation, window_s),
        prefill_time_mean_s=prefill.mean() if prefill else None,
        decode_time_mean_s=decode.mean() if decode else None,
        ttft_mean_s=ttft.mean() if ttft else None,
        ttft_p50_s=ttft.quantile(0.5) if ttft else None,
        ttft_p95_s=ttft.quantile(0.95) if ttft else None,
        itl_mean_s=itl.mean() if itl else None,
        itl_p50_s=itl.quantile(0.5) if itl else None,
        itl_p95_s=itl.quantile(0.95) if itl else None,
        preemptions=preemptions,
        missing=tuple(reader.missing),
    )


def _latest(scrape: MetricsScrape, reason: str | None) -> ServingFigures:
    if not scrape.ok:
        return ServingFigures(reason=scrape.error)
    return _latest_from(_Reader(scrape), reason)


def _latest_from(reader: _Reader, reason: str | None) -> ServingFigures:
    return ServingFigures(
        kv_cache_usage=reader.gauge(KV_CACHE_USAGE, mean=True),  # data-parallel: engines' mean
        requests_running=reader.gauge(RUNNING),
        requests_waiting=reader.gauge(WAITING),
        cache_config=reader.info(CACHE_CONFIG),
        model_name=_model_names(reader.last),
        reason=reason,
        missing=tuple(reader.missing),
    )


def _restart(first: MetricsScrape, last: MetricsScrape) -> list[str]:
    before, after = first.samples.get(PROCESS_START), last.samples.get(PROCESS_START)
    if before and after and before[0][1] != after[0][1]:
        return [f"the API server's {PROCESS_START} changed"]
    return []


def _model_names(scrape: MetricsScrape) -> str | None:
    names = {
        model
        for name, series in scrape.samples.items()
        if name.startswith(VLLM_PREFIX)
        for labels, _ in series
        if (model := label_value(labels, "model_name")) is not None
    }
    return ", ".join(sorted(names)) or None


def _bound(le: str | None) -> float | None:
    """A bucket's `le` label as a number ("+Inf" included); None when it is not one."""
    try:
        return None if le is None else float(le)
    except ValueError:
        return None


def _rate(count: float | None, window_s: float) -> float | None:
    return None if count is None else count / window_s


def _monotonic(counts: list[float]) -> list[float]:
    """Cumulative counts can dip where series of a sum were scraped at slightly different
    moments; PromQL's `ensureMonotonic` lifts each to the largest count below it."""
    out, highest = [], -math.inf
    for count in counts:
        highest = max(highest, count)
        out.append(highest)
    return out


def _braces(labels: LabelSet) -> str:
    return "{" + ",".join(f'{key}="{value}"' for key, value in labels) + "}" if labels else ""
