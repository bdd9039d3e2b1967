"""`custom_metrics:` in the config: extra Prometheus series the operator wants in every snapshot,
from vLLM's /metrics or another URL (a router's, an application's). Validated once on load into
frozen specs (STYLE.md 5); each error names the entry, the key and the fix.

    custom_metrics:
      - name: router_queue                  # shown in the report, diff, trend, the exporter
        url: http://127.0.0.1:9000/metrics  # optional; default: vLLM's own /metrics
        metric: router_requests_waiting     # the Prometheus family name
        labels: {model: tiny}               # optional; the matching series are summed
        kind: auto                          # auto (the family's # TYPE), counter, gauge,
                                            # histogram or last
        unit: requests                      # optional; else read from the name's suffix
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.config import units
from sidecar.config.entries import mapping_entry
from sidecar.errors import ConfigError

# auto: the family's `# TYPE` decides; counter -> a rate per second; gauge -> the mean of the
# window's scrapes; histogram (or summary) -> the mean observation; last -> the last scrape.
KINDS = ("auto", "counter", "gauge", "histogram", "last")
KEYS = ("name", "metric", "url", "labels", "kind", "unit")
# The name becomes a trend column (`custom.<name>`) and an exporter label value: keep it plain.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_METRIC = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*\Z")  # Prometheus' metric name syntax
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
EXAMPLE = "e.g. - {name: router_queue, metric: router_requests_waiting, kind: gauge}"


@dataclass(frozen=True, slots=True)
class CustomMetricSpec:
    name: str
    metric: str
    url: str | None = None  # None: vLLM's own /metrics
    labels: tuple[tuple[str, str], ...] = ()  # sorted (label, value) pairs, all must match
    kind: str = "auto"
    unit: str | None = None


def parse_custom_metrics(raw: Any, where: str) -> tuple[CustomMetricSpec, ...]:
    """The `custom_metrics` list as specs; ConfigError naming the entry and the fix."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(
            f"custom_metrics: is {units.kind_of(raw)} ({where}); give a list of entries, {EXAMPLE}"
        )
    specs = [_spec(entry, i, where) for i, entry in enumerate(raw)]
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise ConfigError(
                f"custom_metrics[{i}]: the name {spec.name!r} is already used by entry "
                f"{seen[spec.name]} ({where}); give each custom metric a name of its own"
            )
        seen[spec.name] = i
    return tuple(specs)


def _spec(entry: Any, i: int, where: str) -> CustomMetricSpec:
    at = f"custom_metrics[{i}]"
    entry = mapping_entry(entry, at, where, KEYS, EXAMPLE)
    name = _required(entry, "name", at, where)
    if not _NAME.match(name):
        raise ConfigError(
            f"{at}.name: {name!r} ({where}) is not a plain name: use letters, digits and _ "
            "(it becomes a trend column and an exporter label)"
        )
    metric = _required(entry, "metric", at, where)
    if not _METRIC.match(metric):
        raise ConfigError(f"{at}.metric: {metric!r} ({where}) is not a Prometheus metric name "
                          "([a-zA-Z_:][a-zA-Z0-9_:]*); give the family name as /metrics shows it, "
                          "e.g. vllm:generation_tokens")  # fmt: skip
    kind = str(entry.get("kind") or "auto").strip().lower()
    if kind not in KINDS:
        raise ConfigError(
            f"{at}.kind: {entry.get('kind')!r} ({where}) is not a kind; give one of "
            f"{', '.join(KINDS)} (auto reads the family's # TYPE line)"
        )
    return CustomMetricSpec(name=name, metric=metric, url=_url(entry, at, where),
                            labels=_labels(entry.get("labels"), at, where), kind=kind,
                            unit=_optional_text(entry.get("unit")))  # fmt: skip


def _required(entry: Mapping[Any, Any], key: str, at: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{at}.{key}: missing or not text ({where}); every entry needs "
                          f"name and metric, {EXAMPLE}")  # fmt: skip
    return value.strip()


def _url(entry: Mapping[Any, Any], at: str, where: str) -> str | None:
    raw = entry.get("url")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    try:
        return str(units.URL.parse(raw))
    except units.Unfit as exc:
        raise ConfigError(f"{at}.url: {raw!r} {exc} ({where}); {units.URL.hint}, or leave it "
                          "out for vLLM's own /metrics") from None  # fmt: skip


def _labels(raw: Any, at: str, where: str) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{at}.labels: is {units.kind_of(raw)} ({where}); give a mapping of "
                          "label to value, e.g. labels: {model_name: tiny}")  # fmt: skip
    out = []
    for key, value in raw.items():
        if not isinstance(key, str) or not _LABEL.match(key):
            raise ConfigError(f"{at}.labels: {key!r} ({where}) is not a label name")
        if isinstance(value, Mapping | list) or value is None:
            raise ConfigError(f"{at}.labels.{key}: give one value as text ({where})")
        out.append((key, _text(value)))
    return tuple(sorted(out))


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _optional_text(value: Any) -> str | None:
    return None if value is None or str(value).strip() == "" else str(value).strip()
