"""Custom metrics over a window: the operator's extra Prometheus series (config
`custom_metrics`, sidecar/config/custom_metrics.py), from vLLM's /metrics or another URL.

    reader = CustomReader(specs, vllm_url, sources)   # sources: URL -> MetricsSource
    started = reader.start()                          # the other URLs' first scrapes
    ...                                               # the window (vLLM's scrapes kept)
    metrics = reader.finish(started, vllm_scrapes)    # their last scrapes; the records

What each becomes (the way PromQL reads them, summed over the matching series):
- a counter: its increase per second between the window's first and last good scrape of its
  URL, like `sum(rate(x[window]))`; a series that goes down was reset (the exporter restarted)
  and counts from zero, as `increase()` does. vLLM's URL has the segment boundaries' scrapes
  in between, so a reset there loses at most one segment's increase.
- a gauge: the mean of the window's good scrapes of its URL: the first and last, plus every
  segment boundary's for vLLM's own /metrics (the scrapes the window already takes).
- a histogram or summary: the mean observation, the `_sum` increase over the `_count` one.
- `kind: last`: the value at the window's last good scrape.
A URL that fails, a family that is not there or no matching series leave that metric None with
the reason, never the window (STYLE.md 7). Nothing here raises.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sidecar.config.custom_metrics import CustomMetricSpec
from sidecar.records.readings import CustomMetric
from sidecar.vllm_metrics.scrape import LabelSet, MetricsScrape, finite
from sidecar.vllm_metrics.source import HttpMetricsSource, MetricsSource, take_scrape

KIND_OF_TYPE = {"counter": "rate", "gauge": "mean", "histogram": "mean", "summary": "mean",
                "gaugehistogram": "mean", "last": "last"}  # fmt: skip
_SUFFIX_UNITS = (("_seconds", "s"), ("_bytes", "B"), ("_ratio", "ratio"), ("_perc", "ratio"))


@dataclass(frozen=True, slots=True)
class _Family:
    name: str  # as the spec named it, `_total` stripped when that is how the parser names it
    type: str  # counter, gauge, histogram, summary, last


def custom_metric(
    spec: CustomMetricSpec, scrapes: Sequence[MetricsScrape], url: str, *, segments: bool = False
) -> CustomMetric:
    """`spec` over `scrapes` (the window's scrapes of `url`, oldest first, failed ones too).
    `segments`: the scrapes include the segment boundaries' (vLLM's own URL)."""
    base = CustomMetric(name=spec.name, kind=_record_kind(spec.kind), value=None, source=url,
                        metric=spec.metric, labels=dict(spec.labels), unit=spec.unit)  # fmt: skip
    good = [s for s in scrapes if s.ok]
    if not good:
        why = next((s.error for s in reversed(scrapes) if s.error), None) or "not scraped"
        return _replace(base, reason=why)
    family = _family(spec, good[-1])
    if isinstance(family, str):
        return _replace(base, reason=family)
    kind = KIND_OF_TYPE[family.type]
    unit = spec.unit or _unit(family)
    out = _replace(base, kind=kind, type=family.type, unit=unit)
    if family.type == "last":
        return _last(out, family, good[-1])
    if family.type == "gauge":
        return _mean(out, family, good, segments, scrapes)
    if len(good) < 2:
        failed = next((s.error for s in scrapes if s.error), None)
        why = f"only one good scrape of {url} in the window" + (f" ({failed})" if failed else "")
        return _replace(out, reason=why + ": a rate or a mean observation needs two")
    window_s = good[-1].taken_at - good[0].taken_at
    if window_s <= 0:
        return _replace(out, reason="the scrapes were not taken in time order")
    if family.type == "counter":
        return _rate(out, family, good, window_s, segments)
    return _observation_mean(out, family, good, window_s)


# ------------------------------------------------------------------------------ the kinds


def _last(out: CustomMetric, family: _Family, last: MetricsScrape) -> CustomMetric:
    name = _sample_name(family, last)
    matched = _matching(last.samples.get(name, ()), out.labels)
    if not matched:
        return _replace(out, kind="last", reason=_no_series(name, last, out.labels))
    return _replace(out, kind="last", value=finite(sum(v for _, v in matched)),
                    series=len(matched), samples=1,
                    how="the value at the window's last scrape")  # fmt: skip


def _mean(
    out: CustomMetric,
    family: _Family,
    good: list[MetricsScrape],
    segments: bool,
    scrapes: Sequence[MetricsScrape],
) -> CustomMetric:
    name = family.name
    sums, series = [], 0
    for scrape in good:
        matched = _matching(scrape.samples.get(name, ()), out.labels)
        if matched:
            sums.append(sum(v for _, v in matched))
            series = max(series, len(matched))
    if not sums:
        return _replace(out, reason=_no_series(name, good[-1], out.labels))
    failed = len(scrapes) - len(good)
    how = f"mean of {len(sums)} scrapes: " + _which(len(sums), segments)
    how += f"; {failed} failed scrapes left out" if failed else ""
    return _replace(out, value=finite(sum(sums) / len(sums)), series=series, samples=len(sums),
                    window_s=_span(good), how=how)  # fmt: skip


def _rate(
    out: CustomMetric, family: _Family, good: list[MetricsScrape], window_s: float, segments: bool
) -> CustomMetric:
    name = _sample_name(family, good[-1])
    increase, resets, series = _increase(name, good, out.labels)
    if series == 0:
        return _replace(out, reason=_no_series(name, good[-1], out.labels))
    how = f"increase per second over {window_s:.1f} s, the window's first to last scrape"
    if segments and len(good) > 2:
        how += f" (summed over {len(good) - 1} steps between {len(good)} scrapes)"
    if resets:
        how += f"; {resets} counter reset(s) counted from zero"
    return _replace(out, value=finite(increase / window_s), series=series, samples=len(good),
                    window_s=window_s, how=how)  # fmt: skip


def _observation_mean(
    out: CustomMetric, family: _Family, good: list[MetricsScrape], window_s: float
) -> CustomMetric:
    total, resets, series = _increase(f"{family.name}_sum", good, out.labels)
    count, _, _ = _increase(f"{family.name}_count", good, out.labels)
    if series == 0:
        return _replace(out, reason=_no_series(f"{family.name}_sum", good[-1], out.labels))
    if count <= 0:
        return _replace(out, series=series, samples=len(good), window_s=window_s,
                        reason=f"no observations of {family.name} in the window")  # fmt: skip
    how = f"mean observation: the _sum over the _count increase in {window_s:.1f} s"
    how += f"; {resets} counter reset(s) counted from zero" if resets else ""
    return _replace(out, value=finite(total / count), series=series, samples=len(good),
                    window_s=window_s, how=how)  # fmt: skip


def _increase(
    name: str, good: list[MetricsScrape], labels: Mapping[str, str]
) -> tuple[float, int, int]:
    """(the increase summed over matching series, resets seen, series matched), step by step
    between consecutive scrapes; a series new in a scrape started from zero."""
    total, resets = 0.0, 0
    seen: set[LabelSet] = set()
    previous: dict[LabelSet, float] = {}
    for i, scrape in enumerate(good):
        current = dict(_matching(scrape.samples.get(name, ()), labels))
        seen.update(current)
        if i > 0:
            for key, value in current.items():
                before = previous.get(key, 0.0)
                if value >= before:
                    total += value - before
                else:  # reset: the exporter restarted and counted up from zero since
                    total += value
                    resets += 1
        previous = current
    return total, resets, len(seen)


# ------------------------------------------------------------------------------ helpers


def _record_kind(kind: str) -> str:
    return {"counter": "rate", "last": "last"}.get(kind, "mean")


def _family(spec: CustomMetricSpec, scrape: MetricsScrape) -> _Family | str:
    """The family `spec` names in `scrape`, with the type it is read as; or why not."""
    names = [spec.metric, spec.metric.removesuffix("_total")]
    found = next((n for n in names if n in scrape.types), None)
    if found is None and spec.metric in scrape.samples:
        found = spec.metric  # a sample name without a family of its own name
    if found is None:
        return _not_found(spec.metric, scrape)
    typed = scrape.types.get(found, "unknown")
    if spec.kind == "auto":
        if typed not in KIND_OF_TYPE or typed == "last":
            return (
                f"{spec.metric} at {scrape.url} is of type {typed!r} (no # TYPE it can read "
                "as a counter, gauge or histogram): set its kind in custom_metrics"
            )
        return _Family(found, typed)
    if spec.kind == "histogram" and f"{found}_count" not in scrape.samples:
        return f"{spec.metric} at {scrape.url} has no {found}_count series: it is no histogram"
    return _Family(found, spec.kind)


def _sample_name(family: _Family, scrape: MetricsScrape) -> str:
    """A counter's series are `name_total` (prometheus_client), or the bare name elsewhere."""
    if family.type == "counter" and f"{family.name}_total" in scrape.samples:
        return f"{family.name}_total"
    return family.name


def _matching(
    series: Iterable[tuple[LabelSet, float]], labels: Mapping[str, str]
) -> list[tuple[LabelSet, float]]:
    return [(ls, v) for ls, v in series if all((k, w) in ls for k, w in labels.items())]


def _not_found(metric: str, scrape: MetricsScrape) -> str:
    known = [*scrape.types, *scrape.samples]
    close = difflib.get_close_matches(metric, known, n=3, cutoff=0.6)
    hint = f"; close: {', '.join(dict.fromkeys(close))}" if close else ""
    return f"no metric {metric} at {scrape.url}{hint}"


def _no_series(name: str, scrape: MetricsScrape, labels: Mapping[str, str]) -> str:
    series = scrape.samples.get(name, ())
    if not series:
        return f"no series of {name} at {scrape.url}"
    seen = "; ".join(",".join(f"{k}={v}" for k, v in ls) or "{}" for ls, _ in series[:3])
    want = ",".join(f"{k}={v}" for k, v in labels.items())
    return f"no series of {name} at {scrape.url} matches {{{want}}}: it has {seen}"


def _which(n: int, segments: bool) -> str:
    if n == 1:
        return "one scrape only"
    if segments and n > 2:
        return f"the window's first and last and {n - 2} segment boundaries"
    return "the window's first and last"


def _unit(family: _Family) -> str | None:
    base = next((u for suffix, u in _SUFFIX_UNITS if family.name.endswith(suffix)), None)
    if family.type == "counter":
        return f"{base}/s" if base else "/s"
    return base


def _span(good: list[MetricsScrape]) -> float | None:
    return good[-1].taken_at - good[0].taken_at if len(good) > 1 else None


def _replace(m: CustomMetric, **changes: Any) -> CustomMetric:
    return replace(m, **changes)


# ------------------------------------------------------------------------------ the reader


Scrape = Callable[[MetricsSource], MetricsScrape]


def other_scrape(source: MetricsSource) -> MetricsScrape:
    return take_scrape(source, vllm=False)


@dataclass(frozen=True, slots=True)
class CustomReader:
    """The window's custom metrics: the other URLs scraped at its start and end, vLLM's own
    from the scrapes the window takes anyway (no extra request to vLLM)."""

    specs: tuple[CustomMetricSpec, ...]
    sources: Mapping[str, MetricsSource]  # the other URLs' sources, by URL
    scrape: Scrape = other_scrape

    def start(self) -> dict[str, MetricsScrape]:
        return {url: self.scrape(source) for url, source in self.sources.items()}

    def finish(
        self,
        started: Mapping[str, MetricsScrape],
        vllm_url: str | None,
        vllm_scrapes: Sequence[MetricsScrape],
        vllm_unread: str | None = None,
    ) -> tuple[CustomMetric, ...]:
        ended = {url: self.scrape(source) for url, source in self.sources.items()}
        out = []
        for spec in self.specs:
            url = spec.url
            if url is not None and url != vllm_url:
                scrapes = [s for s in (started.get(url), ended.get(url)) if s is not None]
                out.append(custom_metric(spec, scrapes, url))
            elif vllm_url is not None:
                out.append(custom_metric(spec, vllm_scrapes, vllm_url, segments=True))
            else:
                why = vllm_unread or "vLLM /metrics not read"
                out.append(CustomMetric(name=spec.name, kind=_record_kind(spec.kind), value=None,
                                        reason=why, metric=spec.metric, labels=dict(spec.labels),
                                        unit=spec.unit))  # fmt: skip
        return tuple(out)


def other_source(url: str, timeout_s: float) -> MetricsSource:
    """Another exporter's /metrics (its errors do not send the operator looking for vLLM)."""
    return HttpMetricsSource(url, timeout_s=timeout_s, vllm=False)


def custom_reader(
    specs: tuple[CustomMetricSpec, ...],
    timeout_s: float,
    vllm_url: str | None = None,
    make: Callable[[str, float], MetricsSource] = other_source,
) -> CustomReader | None:
    """The reader of `specs` (None without any); a source per distinct URL other than vLLM's
    (a spec that names vLLM's URL reads the window's own scrapes of it)."""
    if not specs:
        return None
    urls = dict.fromkeys(s.url for s in specs if s.url is not None and s.url != vllm_url)
    return CustomReader(specs, {url: make(url, timeout_s) for url in urls})


def probe(spec: CustomMetricSpec, scrape: MetricsScrape) -> tuple[bool, str]:
    """(found, what): whether one scrape holds `spec`'s family with matching series (for
    `doctor`, before any window)."""
    if not scrape.ok:
        return False, scrape.error or "not scraped"
    family = _family(spec, scrape)
    if isinstance(family, str):
        return False, family
    name = _sample_name(family, scrape)
    if family.type in ("histogram", "summary", "gaugehistogram"):
        name = f"{family.name}_sum"
    matched = _matching(scrape.samples.get(name, ()), dict(spec.labels))
    if not matched:
        return False, _no_series(name, scrape, dict(spec.labels))
    kind = KIND_OF_TYPE[family.type]
    return True, f"{spec.metric} at {scrape.url}: a {family.type}, {len(matched)} series ({kind})"
