"""Custom metrics (config `custom_metrics`): validated on load, computed from recorded /metrics
texts (vLLM's, tests/fixtures/metrics, and a "router" exposed by prometheus_client itself,
record_router.py there), carried in summary schema 4 and shown by the report, diff, trend and
the exporter."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from devtools.schema import SCHEMA_PATH
from sidecar.analyze.compare import Side, compare
from sidecar.config.custom_metrics import CustomMetricSpec
from sidecar.config.load import load_config
from sidecar.diff.text import render_text, to_json
from sidecar.errors import ConfigError
from sidecar.exporter.collector import SidecarCollector
from sidecar.exporter.state import ExporterState
from sidecar.records.readings import CustomMetric
from sidecar.records.summary import SCHEMA_VERSION
from sidecar.report.text import render, report_data
from sidecar.store.summary_io import parse_summary, read_summary
from sidecar.store.trend_table import rows_to_table, summary_row
from sidecar.trend.series import select_series
from sidecar.vllm_metrics.custom import CustomReader, custom_metric
from sidecar.vllm_metrics.scrape import MetricsScrape, parse_scrape
from sidecar.vllm_metrics.source import ScrapeError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
METRICS = FIXTURES / "metrics"
PAIR = json.loads((METRICS / "v0.32.0-cpu-pair.json").read_text())
WINDOW_S = PAIR["window_s"]  # 12.80 s between the recorded vLLM scrapes
VLLM = "http://127.0.0.1:8000/metrics"
ROUTER = "http://127.0.0.1:9000/metrics"


def vllm_pair() -> list[MetricsScrape]:
    return [
        parse_scrape(
            (METRICS / f"v0.32.0-cpu-{name}.txt").read_text(),
            url=VLLM,
            taken_at=1000.0 + i * WINDOW_S,
            wall=0.0,
        )
        for i, name in enumerate(("before", "after"))
    ]


def router_pair(window_s: float = 30.0) -> list[MetricsScrape]:
    return [
        parse_scrape(
            (METRICS / f"router-{name}.txt").read_text(),
            url=ROUTER,
            taken_at=1000.0 + i * window_s,
            wall=0.0,
            vllm=False,
        )
        for i, name in enumerate(("before", "after"))
    ]


def spec(metric: str, **kw: Any) -> CustomMetricSpec:
    labels = tuple(sorted(kw.pop("labels", {}).items()))
    return CustomMetricSpec(name=kw.pop("name", "m"), metric=metric, labels=labels, **kw)


# ------------------------------------------------------------------------------ computation


def test_a_vllm_counter_is_its_increase_per_second() -> None:
    m = custom_metric(spec("vllm:generation_tokens"), vllm_pair(), VLLM)
    # 18,899 generated tokens in the recorded window (the load generator counted the same).
    assert (m.kind, m.type, m.unit, m.samples, m.series) == ("rate", "counter", "/s", 2, 1)
    assert m.value == pytest.approx(18899 / WINDOW_S) and m.reason is None
    assert m.window_s == pytest.approx(WINDOW_S)
    # The sample name (with _total) names the same family; labels narrow it.
    same = custom_metric(spec("vllm:generation_tokens_total", labels={"model_name": "tiny"}),
                         vllm_pair(), VLLM)  # fmt: skip
    assert same.value == m.value


def test_a_counter_over_several_series_is_their_sum_and_labels_select() -> None:
    every = custom_metric(spec("vllm:request_success"), vllm_pair(), VLLM)
    assert every.series == 5 and every.value == pytest.approx(358 / WINDOW_S)
    length = custom_metric(spec("vllm:request_success", labels={"finished_reason": "length"}),
                           vllm_pair(), VLLM)  # fmt: skip
    assert length.series == 1 and length.value == every.value
    router = custom_metric(spec("router_requests", labels={"model": "tiny"}), router_pair(), ROUTER)
    assert (router.series, router.value) == (2, pytest.approx(30 / 30.0))
    assert custom_metric(spec("router_requests"), router_pair(), ROUTER).value == pytest.approx(
        36 / 30.0
    )


def test_a_gauge_is_the_mean_of_the_window_scrapes() -> None:
    m = custom_metric(spec("router_requests_waiting", labels={"model": "tiny"}), router_pair(),
                      ROUTER)  # fmt: skip
    assert (m.kind, m.type, m.value, m.samples) == ("mean", "gauge", 3.0, 2)  # (4 + 2) / 2
    assert m.how == "mean of 2 scrapes: the window's first and last"
    both = custom_metric(spec("router_requests_waiting"), router_pair(), ROUTER)
    assert both.value == 5.0 and both.series == 2  # (4 + 1 + 2 + 3) / 2
    # vLLM's own URL: the segment boundaries' scrapes count too, and the text says so.
    before, after = router_pair()
    middle = parse_scrape(
        (METRICS / "router-after.txt").read_text().replace(
            'router_requests_waiting{model="tiny"} 2.0', 'router_requests_waiting{model="tiny"} 9.0'
        ), url=ROUTER, taken_at=1015.0, wall=0.0, vllm=False,
    )  # fmt: skip
    m = custom_metric(spec("router_requests_waiting", labels={"model": "tiny"}),
                      [before, middle, after], ROUTER, segments=True)  # fmt: skip
    assert m.value == pytest.approx((4 + 9 + 2) / 3) and m.samples == 3
    assert "first and last and 1 segment boundaries" in (m.how or "")
    last = custom_metric(spec("router_requests_waiting", kind="last", labels={"model": "tiny"}),
                         [before, middle, after], ROUTER)  # fmt: skip
    assert (last.kind, last.value, last.samples) == ("last", 2.0, 1)


def test_a_histogram_is_its_mean_observation_over_the_window() -> None:
    m = custom_metric(spec("vllm:e2e_request_latency_seconds"), vllm_pair(), VLLM)
    expected = (84.55488276481628 - 15.009776830673218) / (483 - 125)
    assert (m.kind, m.type, m.unit) == ("mean", "histogram", "s")
    assert m.value == pytest.approx(expected)
    router = custom_metric(spec("router_upstream_seconds"), router_pair(), ROUTER)
    assert router.value == pytest.approx((5 * 0.1 + 5 * 0.4) / 10)  # the 0.2 before is out


def test_a_counter_reset_counts_from_zero() -> None:
    before, after = router_pair()  # taken 30 s apart, replayed the other way round:
    first, last = replace(after, taken_at=1000.0), replace(before, taken_at=1030.0)
    m = custom_metric(spec("router_requests"), [first, last], ROUTER)  # every series went down
    # Went down: the exporter restarted, and counted 100 + 50 + 7 since (as increase() reads it).
    assert m.value == pytest.approx(157 / 30.0)
    assert "3 counter reset(s) counted from zero" in (m.how or "")


def test_what_cannot_be_read_is_none_with_the_reason() -> None:
    pair = vllm_pair()
    missing = custom_metric(spec("vllm:generation_token"), pair, VLLM)
    assert missing.value is None and "no metric vllm:generation_token at" in (missing.reason or "")
    assert "close: vllm:generation_tokens" in (missing.reason or "")
    unmatched = custom_metric(spec("vllm:generation_tokens", labels={"model_name": "big"}), pair,
                              VLLM)  # fmt: skip
    assert unmatched.value is None and "matches {model_name=big}" in (unmatched.reason or "")
    assert "model_name=tiny" in (unmatched.reason or "")
    failed = replace(pair[1], samples={}, types={}, error="no /metrics at x: connection refused")
    one = custom_metric(spec("vllm:generation_tokens"), [pair[0], failed], VLLM)
    assert one.value is None and "only one good scrape" in (one.reason or "")
    assert "connection refused" in (one.reason or "")
    none = custom_metric(spec("vllm:generation_tokens"), [failed], VLLM)
    assert none.reason == "no /metrics at x: connection refused"


def test_an_untyped_family_needs_its_kind_said() -> None:
    texts = [(METRICS / f"router-{n}.txt").read_text() for n in ("before", "after")]
    untyped = [
        parse_scrape("\n".join(line for line in text.splitlines()
                               if not line.startswith("# TYPE")) + "\n",
                     url=ROUTER, taken_at=1000.0 + 30 * i, wall=0.0, vllm=False)
        for i, text in enumerate(texts)
    ]  # fmt: skip
    auto = custom_metric(spec("router_requests_total"), untyped, ROUTER)
    assert auto.value is None and "set its kind in custom_metrics" in (auto.reason or "")
    said = custom_metric(spec("router_requests_total", kind="counter"), untyped, ROUTER)
    assert said.value == pytest.approx(36 / 30.0)


def test_another_exporter_is_refused_as_vllm_and_read_as_itself() -> None:
    text = (METRICS / "router-after.txt").read_text()
    assert not parse_scrape(text, url=ROUTER, taken_at=0, wall=0).ok  # no vllm: metrics
    scrape = parse_scrape(text, url=ROUTER, taken_at=0, wall=0, vllm=False)
    assert scrape.ok and scrape.types["router_requests"] == "counter"
    assert scrape.types["router_upstream_seconds"] == "histogram"


class Replay:
    """Recorded texts, one per fetch, then the last again; or a refused connection."""

    def __init__(self, url: str, texts: list[str] | None) -> None:
        self.url, self.texts = url, texts

    def fetch(self) -> str:
        if self.texts is None:
            raise ScrapeError(f"no /metrics at {self.url}: connection refused")
        return self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]


def test_a_failing_url_leaves_its_metrics_none_and_the_others_read() -> None:
    from sidecar.vllm_metrics.custom import other_scrape

    texts = [(METRICS / f"router-{n}.txt").read_text() for n in ("before", "after")]
    down = "http://127.0.0.1:9/metrics"
    reader = CustomReader(
        (spec("router_requests", name="routed", url=ROUTER),
         spec("router_requests", name="gone", url=down),
         spec("vllm:generation_tokens", name="tokens")),
        {ROUTER: Replay(ROUTER, texts), down: Replay(down, None)},
        scrape=other_scrape,
    )  # fmt: skip
    started = reader.start()
    routed, gone, tokens = reader.finish(started, VLLM, vllm_pair())
    assert routed.value is not None and routed.value > 0 and routed.source == ROUTER
    assert gone.value is None and gone.reason == f"no /metrics at {down}: connection refused"
    assert tokens.value == pytest.approx(18899 / WINDOW_S) and tokens.source == VLLM
    (unread,) = CustomReader((spec("x"),), {}).finish({}, None, [], "vLLM on a socket")
    assert unread.value is None and unread.reason == "vLLM on a socket"


def test_the_window_reads_custom_metrics_from_its_own_scrapes() -> None:
    """profile_window's wiring: vLLM's scrapes of the window feed the custom metrics on its
    URL (no extra request), the other URL is scraped at the start and the end."""
    from sidecar.classify.classifier import Classifier
    from sidecar.classify.rules import load_rules
    from sidecar.target.discovery import Deployment
    from sidecar.target.procfs import ProcFs
    from sidecar.window.pipeline import profile_window
    from sidecar.window.readers import WindowReaders
    from tests.unit.gpu.test_gpu import InstantSampler, RecordedMetrics
    from tests.unit.report.test_report import processes

    texts = [(METRICS / f"router-{n}.txt").read_text() for n in ("before", "after")]
    vllm = RecordedMetrics()
    reader = CustomReader(
        (spec("vllm:generation_tokens", name="tokens"),
         spec("router_requests_waiting", name="queue", url=ROUTER)),
        {ROUTER: Replay(ROUTER, texts)},
    )  # fmt: skip
    readers = WindowReaders(procfs=ProcFs(FIXTURES / "proc"), metrics=vllm, custom=reader)
    target = Deployment(processes()[0], processes())
    snap = profile_window(target, InstantSampler(), Classifier(load_rules()), readers, 1.0,
                          host="h")  # type: ignore[arg-type]  # fmt: skip
    tokens, queue = snap.summary().custom
    assert len(readers.window_scrapes) == 2 and tokens.samples == 2
    assert tokens.value is not None and tokens.value > 0 and tokens.source == vllm.url
    assert queue.value == 5.0 and queue.source == ROUTER


# ------------------------------------------------------------------------------ config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sidecar.yaml"
    path.write_text(text)
    return path


def test_the_config_lists_custom_metrics(tmp_path: Path) -> None:
    path = write(tmp_path, """
custom_metrics:
  - name: router_queue
    url: http://127.0.0.1:9000/metrics
    metric: router_requests_waiting
    labels: {model: tiny}
    kind: gauge
  - {name: tokens, metric: "vllm:generation_tokens"}
""")  # fmt: skip
    config = load_config(path, environ={})
    queue, tokens = config.custom_metrics
    assert queue == CustomMetricSpec("router_queue", "router_requests_waiting", ROUTER,
                                     (("model", "tiny"),), "gauge")  # fmt: skip
    assert (tokens.url, tokens.kind, tokens.labels) == (None, "auto", ())
    assert load_config(None, environ={}).custom_metrics == ()


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ("- {name: a, metric: m, url: 'ftp://x/metrics'}",
         r"custom_metrics\[0\]\.url: 'ftp://x/metrics' is not an http\(s\) URL .* give an http"),
        ("- {name: a, metric: m}\n  - {name: a, metric: n}",
         r"custom_metrics\[1\]: the name 'a' is already used by entry 0 .* a name of its own"),
        ("- {name: a, metric: m, kind: rate}",
         r"custom_metrics\[0\]\.kind: 'rate' .* give one of auto, counter, gauge, histogram"),
        ("- {name: a, metric: m, labls: {x: y}}",
         r"custom_metrics\[0\]: unknown keys \['labls'\] .* known: name, metric, url"),
        ("- {name: a}", r"custom_metrics\[0\]\.metric: missing .* needs name and metric"),
        ("- {name: a-b, metric: m}", r"custom_metrics\[0\]\.name: 'a-b' .* letters, digits"),
        ("- {name: a, metric: 'vllm generation'}", r"not a Prometheus metric name"),
        ("- {name: a, metric: m, labels: [x]}", r"custom_metrics\[0\]\.labels: is a list"),
        ("- just-a-name", r"custom_metrics\[0\]: is a str .* give a mapping"),
    ],
)  # fmt: skip
def test_a_bad_entry_is_refused_with_the_fix(tmp_path: Path, entries: str, message: str) -> None:
    path = write(tmp_path, f"custom_metrics:\n  {entries}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(path, environ={})


def test_custom_metrics_must_be_a_list(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"custom_metrics: is a mapping .* give a list"):
        load_config(write(tmp_path, "custom_metrics: {name: a}\n"), environ={})


# ------------------------------------------------------------------------------ schema 4


def custom_metrics() -> tuple[CustomMetric, ...]:
    return (
        custom_metric(spec("router_requests_waiting", name="router_queue"), router_pair(),
                      ROUTER),
        custom_metric(spec("vllm:generation_tokens", name="tokens"), vllm_pair(), VLLM),
        custom_metric(spec("nope", name="missing"), vllm_pair(), VLLM),
    )  # fmt: skip


def with_custom(values: tuple[float | None, ...] = ()) -> Any:
    from tests.unit.report.test_report import summary

    s = summary(gpu=False, metrics=True)
    metrics = custom_metrics()
    if values:
        metrics = tuple(replace(m, value=v) for m, v in zip(metrics, values, strict=True))
    return replace(s, custom=metrics)


def test_custom_metrics_round_trip_and_validate_against_the_published_schema() -> None:
    from sidecar.store.writers import to_jsonable

    s = with_custom()
    data = to_jsonable(s)
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(data)
    assert data["schema"] == SCHEMA_VERSION  # 4 brought `custom`; 5 kept it
    assert parse_summary(json.loads(json.dumps(data))) == s


def test_a_schema_3_summary_reads_with_no_custom_metrics() -> None:
    folder = next(p for p in (FIXTURES / "trend" / "schema3").iterdir() if p.is_dir())
    assert json.loads((folder / "summary.json").read_text())["schema"] == 3
    s = read_summary(folder)
    assert s.schema == SCHEMA_VERSION and s.custom == ()
    assert "Custom metrics" not in render(s)


def test_the_report_shows_a_custom_metrics_block() -> None:
    text = render(with_custom())
    block = text.split("[Profile] Custom metrics:\n", 1)[1].split("\n[Profile]", 1)[0]
    lines = block.splitlines()
    assert lines[0] == (f"- router_queue: 5 (mean; router_requests_waiting at {ROUTER}; mean of 2 "
                        "scrapes: the window's first and last)")  # fmt: skip
    assert lines[1].startswith(f"- tokens: 1476 /s (rate; vllm:generation_tokens at {VLLM}; ")
    assert lines[2].startswith("- missing: not measured (no metric nope at ")
    assert report_data(with_custom())["custom"][1]["value"] == pytest.approx(18899 / WINDOW_S)


def test_diff_shows_custom_metrics_and_tests_them_only_over_windows() -> None:
    one = compare(Side("A: one", (with_custom((5.0, 1000.0, None)),)),
                  Side("B: one", (with_custom((6.0, 1100.0, None)),)))  # fmt: skip
    queue, tokens, missing = one.custom
    assert (queue.a, queue.b, queue.change) == (5.0, 6.0, pytest.approx(1.2))
    assert not queue.tested and queue.note == "one window on a side: not tested"
    assert missing.a is None and missing.b is None
    text = render_text(one)
    assert "[Diff] Custom metrics (mean of the windows' values; tested apart" in text
    assert "own m = 0" in text and "router_queue" in text
    assert one.tested == compare(Side("A", (with_custom(),)), Side("B", (with_custom(),))).tested

    a = tuple(
        with_custom((v, w, None)) for v, w in ((5.0, 1000), (5.2, 1010), (4.9, 990), (5.1, 1005))
    )
    b = tuple(
        with_custom((v, w, None)) for v, w in ((9.0, 1002), (9.3, 995), (8.8, 1008), (9.1, 1000))
    )
    many = compare(Side("A: 4 windows", a), Side("B: 4 windows", b))
    queue, tokens, _ = many.custom
    assert queue.tested and queue.significant and queue.change == pytest.approx(9.05 / 5.05)
    assert tokens.tested and not tokens.significant
    assert "own m = 2" in render_text(many)
    assert "Custom metrics (tested apart): router_queue up 79 %" in render_text(many)
    assert [c["name"] for c in to_json(many)["custom"]] == ["router_queue", "tokens", "missing"]
    assert many.family == (*many.shares, *many.cores, *many.costs, *many.serving)


def test_trend_has_a_column_per_custom_metric() -> None:
    import pandas as pd

    row = summary_row(with_custom())
    assert row["custom.router_queue"] == 5.0 and row["custom.missing"] is None
    table = rows_to_table([row, summary_row(read_summary(next(
        p for p in (FIXTURES / "trend" / "schema3").iterdir() if p.is_dir())))])  # fmt: skip
    frame = table.to_pandas().set_index("time")
    assert frame["custom.tokens"].notna().tolist() == [True, False]
    names = select_series(frame, ())
    assert "custom.router_queue" in names and "custom.missing" not in names
    assert select_series(frame, ("custom.*",)) == ["custom.router_queue", "custom.tokens"]
    assert isinstance(frame, pd.DataFrame)


def test_the_exporter_has_one_gauge_per_custom_metric() -> None:
    state = ExporterState(host="h")
    state.update_snapshot(with_custom(), "snapshot", None)
    registry = CollectorRegistry()
    registry.register(SidecarCollector(state))
    text = generate_latest(registry).decode()
    lines = [line for line in text.splitlines() if line.startswith("vllm_sidecar_custom")]
    assert len(lines) == 2  # the one not measured is absent, never NaN
    assert not any("unit=" in line for line in lines)  # the unit ends the name, not a label
    assert any(line.startswith('vllm_sidecar_custom{') and 'name="router_queue"' in line
               and 'kind="mean"' in line and line.endswith(" 5.0") for line in lines)  # fmt: skip
    assert any(line.startswith('vllm_sidecar_custom_per_second{') and 'name="tokens"' in line
               for line in lines)  # fmt: skip


def test_a_custom_metrics_unit_ends_its_family_name() -> None:
    from sidecar.exporter.collector import custom_family

    assert [custom_family(u) for u in ("s", "B/s", "/s", "requests", None, "")] == [
        "custom_seconds", "custom_bytes_per_second", "custom_per_second", "custom_requests",
        "custom", "custom"]  # fmt: skip


def test_doctor_probes_each_custom_metric_in_one_scrape() -> None:
    from sidecar.vllm_metrics.custom import probe

    before, _ = router_pair()
    assert probe(spec("router_requests", labels={"model": "big"}), before) == (
        True, f"router_requests at {ROUTER}: a counter, 1 series (rate)"
    )  # fmt: skip
    assert probe(spec("router_upstream_seconds"), before)[0]
    found, why = probe(spec("router_requests", labels={"model": "huge"}), before)
    assert not found and "matches {model=huge}" in why
    found, why = probe(spec("router_request"), before)
    assert not found and "close: router_requests" in why


def test_doctor_warns_of_a_custom_url_that_does_not_answer() -> None:
    from devtools.server import free_port
    from sidecar.config.settings import Config
    from sidecar.doctor import Status, _custom

    url = f"http://127.0.0.1:{free_port()}/metrics"  # nothing listens there
    config = Config(custom_metrics=(spec("router_requests", name="routed", url=url),
                                    spec("vllm:generation_tokens", name="tokens")))  # fmt: skip
    routed, tokens = _custom(config, None)
    assert (routed.name, routed.status) == ("custom routed", Status.WARN)
    assert "connection refused (is the exporter running" in routed.detail
    assert "custom_metrics" in routed.fix
    assert tokens.status is Status.WARN and "no target" in tokens.detail
