"""The fleet's exporter endpoint (sidecar/daemon/multi_target.py): one scrape with a group of deployments,
each told apart by its labels, read by prometheus_client's parser and linted by `promtool check
metrics` (no lint the single-target exporter does not have). The summary is test_exporter's,
from the real pipeline over recorded inputs."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.exporter import ExporterGroup, ExporterState, start_exporter
from tests.integration.test_exporter import T0, FakeClock, build_summary

pytestmark = pytest.mark.integration
EMPTY = {"deployment": "", "model": "", "port": ""}


def serve(state: ExporterState | ExporterGroup) -> str:
    handle = start_exporter("127.0.0.1:0", state)
    assert handle is not None
    try:
        with urllib.request.urlopen(handle.url, timeout=5) as response:
            return response.read().decode()  # type: ignore[no-any-return]
    finally:
        handle.close()


def member(port: int, root_start: int, clock: FakeClock) -> ExporterState:
    state = ExporterState("node-7", clock, {"deployment": f"tiny@{port}", "model": "tiny",
                                            "port": str(port)})  # fmt: skip
    state.instance_labels = {"root_start": str(root_start)}
    state.update_target(True, 0, None)
    state.update_snapshot(build_summary(), "snapshot", f"/out/node-7/tiny@{port}/x")
    state.update_disk("ok", 10 << 30, 5 << 20, written_total=3, skipped_total=0, deleted_total=0)
    state.update_schedule(T0 + 60, 0.5, 0)
    return state


@pytest.fixture
def fleet_text() -> Iterator[str]:
    clock = FakeClock(T0)
    daemon = ExporterState("node-7", clock, EMPTY)
    group = ExporterGroup(daemon)
    group.add("tiny@8000", member(8000, 111, clock))
    gone = member(8001, 222, clock)
    gone.update_target(False, 0, T0 - 5)
    gone.clear_snapshot()
    group.add("tiny@8001", gone)
    yield serve(group)


def test_each_deployment_has_its_own_series(fleet_text: str) -> None:
    samples = [s for f in text_string_to_metric_families(fleet_text) for s in f.samples]
    up = {s.labels["deployment"]: s.value for s in samples if s.name == "vllm_sidecar_target_up"}
    assert up == {"tiny@8000": 1.0, "tiny@8001": 0.0}
    shares = [s for s in samples if s.name == "vllm_sidecar_phase_ratio"]
    assert shares and {s.labels["deployment"] for s in shares} == {"tiny@8000"}
    assert {s.labels["root_start"] for s in shares} == {"111"}
    # Series are unique: no two samples share a name and a label set.
    keys = [(s.name, tuple(sorted(s.labels.items()))) for s in samples]
    assert len(keys) == len(set(keys))


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian: prometheus)")
def test_promtool_finds_nothing_the_single_exporter_does_not(fleet_text: str) -> None:
    single = ExporterState("node-7", FakeClock(T0))
    single.update_snapshot(build_summary(), "snapshot", "/out/x")

    def lint(text: str) -> set[str]:
        done = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                              capture_output=True, timeout=60, check=False)  # fmt: skip
        return {line for line in (done.stdout + done.stderr).splitlines() if line.strip()}

    assert lint(fleet_text) <= lint(serve(single))
