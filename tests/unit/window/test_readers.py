"""The one wiring of a window's parts from the config (`readers_for`, `sampler_for`), as
`snapshot` and the daemon build them, and the segment laps' typed readings (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.config.custom_metrics import CustomMetricSpec
from sidecar.config.settings import Config, MetricsConfig, SamplingConfig, TargetConfig
from sidecar.parsers import parse_raw
from sidecar.records import ProcessInfo, Role
from sidecar.records.window import LapReading, SamplingMode, Segment, Window
from sidecar.sampling.continuous import RolePlanner
from sidecar.sampling.pyspy import RecordOutcome, RecordRequest
from sidecar.sampling.sampler import RateController
from sidecar.target.discovery import Deployment
from sidecar.target.fingerprint import FingerprintCache
from sidecar.target.procfs import ProcFs
from sidecar.vllm_metrics import HttpMetricsSource, MetricsScrape, MetricsSource, parse_scrape
from sidecar.window.readers import (
    SegmentLaps,
    configured_metrics,
    readers_for,
    sampler_for,
)
from sidecar.window.snapshot import build_snapshot

API = ProcessInfo(10, 1, 1, ("python", "-m", "vllm.entrypoints.openai.api_server", "--port",
                             "8123"), "vllm", Role.API_SERVER)  # fmt: skip
ENGINE = ProcessInfo(11, 1, 10, ("VLLM::EngineCore",), "VLLM::EngineCore", Role.ENGINE_CORE)
WORKERS = tuple(ProcessInfo(pid, 1, 11, ("VLLM::Worker",), "VLLM::Worker", Role.WORKER)
                for pid in (12, 13))  # fmt: skip
TARGET = Deployment(API, (API, ENGINE, *WORKERS))
CONFIG = Config(sampling=SamplingConfig(segment_s=20.0, continuous_segment_s=100.0, rate_hz=7.0,
                                        cpu_budget=0.03))  # fmt: skip


class NoPySpy:
    def record(self, request: RecordRequest, stop: object) -> RecordOutcome:
        raise AssertionError("no window is taken here")

    def dump(self, pid: int, timeout_s: float = 60.0, native: bool = False) -> tuple[int, str]:
        raise AssertionError("no dump is taken here")


def test_a_windows_sampler_segments_within_the_window_at_the_configured_rate() -> None:
    s = sampler_for(CONFIG, NoPySpy(), TARGET, 15.0, alive=lambda: True, first=False)
    assert (s.pid, s.segment_s, s.fail_fast, s.plan, s.on_segment) == (10, 15.0, False, None, None)
    assert (s.controller.rate_hz, s.controller.budget) == (7.0, 0.03)
    assert sampler_for(CONFIG, NoPySpy(), TARGET, 60.0, lambda: True).segment_s == 20.0
    kept = RateController(rate_hz=2.0)  # the daemon's, kept through reloads
    assert sampler_for(CONFIG, NoPySpy(), TARGET, 60.0, lambda: True, kept).controller is kept


def test_a_continuous_sampler_takes_the_planners_rates_per_process() -> None:
    planner = RolePlanner(budget=0.01, hz=2.0)
    s = sampler_for(CONFIG, NoPySpy(), TARGET, 600.0, lambda: True, planner=planner)
    assert s.segment_s == 100.0 and s.on_segment == planner.update and s.plan is not None
    assert [r.pid for r in s.plan()] == [10, 11, 12, 13]


def test_the_readers_find_metrics_from_vllms_flags_and_keep_the_daemons_fingerprints() -> None:
    fingerprints = FingerprintCache()  # empty, still the daemon's: kept, not replaced
    config = Config(
        target=TargetConfig(host_proc=Path("/host/proc")),
        custom_metrics=(
            CustomMetricSpec("queue", "router_waiting", url="http://router:9000/metrics"),
        ),
    )
    readers = readers_for(config, TARGET, ProcFs(Path("/proc")), None, None, fingerprints)
    assert readers.metrics is not None and readers.metrics.url == "http://127.0.0.1:8123/metrics"
    assert readers.metrics_unread is None and readers.fingerprints is fingerprints
    assert readers.host_procfs is not None and readers.host_procfs.root == Path("/host/proc")
    assert readers.custom is not None and [s.name for s in readers.custom.specs] == ["queue"]


def test_the_readers_say_why_metrics_cannot_be_read_and_keep_a_configured_url() -> None:
    uds = ProcessInfo(10, 1, 1, ("vllm", "serve", "m", "--uds", "/run/v.sock"), "vllm serve",
                      Role.API_SERVER)  # fmt: skip
    readers = readers_for(Config(), Deployment(uds, (uds,)), ProcFs(Path("/proc")), None, None)
    assert readers.metrics is None and "/run/v.sock" in (readers.metrics_unread or "")
    assert readers.custom is None and readers.host_procfs is None
    config = Config(metrics=MetricsConfig(url="http://vllm:8000/metrics", timeout_s=3.0))
    source = configured_metrics(config)
    assert isinstance(source, HttpMetricsSource) and source.url == "http://vllm:8000/metrics"
    assert configured_metrics(Config()) is None
    readers = readers_for(config, Deployment(uds, (uds,)), ProcFs(Path("/proc")), None, source)
    assert readers.metrics is source and readers.metrics_unread is None


def test_a_lap_reads_cpu_per_role_and_leaves_counters_out_when_a_scrape_failed() -> None:
    scrapes = iter([
        parse_scrape("vllm:generation_tokens_total 5\n", url="u", taken_at=1.0, wall=1.0),
        MetricsScrape("u", 2.0, 2.0, {}, error="connection refused"),
    ])  # fmt: skip
    cpu = {10: iter([1.0, 1.5, 2.0]), 11: iter([4.0, 5.0, 7.0]), 12: iter([1.0, 0.5, 1.0]),
           13: iter([2.0, 2.25, 2.5])}  # fmt: skip
    first = parse_scrape("vllm:generation_tokens_total 0\n", url="u", taken_at=0.0, wall=0.0)

    def scrape(_source: MetricsSource) -> MetricsScrape:
        return next(scrapes)

    ticks = iter([0.0, 5.0, 10.0])
    laps = SegmentLaps(TARGET.processes, HttpMetricsSource("http://127.0.0.1:1/metrics"), scrape,
                       lambda pid: next(cpu[pid]), clock=lambda: next(ticks),
                       first=first)  # fmt: skip
    with pytest.raises(RuntimeError, match="before start"):
        SegmentLaps((), None, scrape, lambda pid: None).lap()
    laps.start()
    one, two = laps.lap(), laps.lap()
    # A worker whose CPU went backwards (a PID reused) adds nothing; the workers add up.
    assert one == LapReading(5.0, {Role.API_SERVER: 0.5, Role.ENGINE_CORE: 1.0,
                                   Role.WORKER: 0.25}, 5.0, None, None)  # fmt: skip
    assert two == LapReading(5.0, {Role.API_SERVER: 0.5, Role.ENGINE_CORE: 2.0, Role.WORKER: 0.75})


def test_a_segments_reading_becomes_its_block_and_no_reading_leaves_it_bare() -> None:
    raw = 'process 11:"VLLM::EngineCore";thread (11): MainThread;run (uvloop/__init__.py:92) 3\n'
    stacks = parse_raw(raw).stacks
    counts = {s: s.weight for s in stacks}
    reading = LapReading(5.123456, {Role.ENGINE_CORE: 0.123456, Role.API_SERVER: 0.01}, 40.0,
                         None, 2.0)  # fmt: skip
    window = Window(1_780_000_000.0, 8.0, 5.0, stacks, 3, 0, 0.01, 2,
                    blocks=(Segment(4.0, counts, reading), Segment(4.00049, counts)),
                    mode=SamplingMode.CONTINUOUS)  # fmt: skip
    sampling = build_snapshot(window, TARGET.processes, Classifier(load_rules())).summary().sampling
    read, bare = sampling.blocks
    assert dict(read.cpu_s) == {"engine_core": 0.1235, "api_server": 0.01}
    assert list(read.cpu_s) == ["engine_core", "api_server"]  # the lap's order, as written
    assert (read.span_s, read.generation_tokens, read.prompt_tokens, read.requests) == (
        5.123, 40.0, None, 2.0)  # fmt: skip
    assert bare.duration_s == 4.0 and dict(bare.cpu_s) == {} and bare.span_s is None
    assert (bare.generation_tokens, bare.prompt_tokens, bare.requests) == (None, None, None)
    assert sampling.mode == "continuous" and type(sampling.mode) is str  # written as before
