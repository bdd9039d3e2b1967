"""The systemd scenario's record (devtools/deploy/systemd_scenario.py, issue 24 item 4): the units
ran under a real systemd as PID 1, and every check passed with figures that fit the units'
settings. The record names the unit files it ran with by their digests: changing a unit without
running the scenario again fails here."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devtools.deploy.systemd_checks import CHECKS, CUSTOM, RELOADED, WINDOWS

ROOT = Path(__file__).resolve().parents[3]
RECORD = ROOT / "tests" / "fixtures" / "deploy" / "systemd.json"


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    return json.loads(RECORD.read_text())  # type: ignore[no-any-return]


def test_every_check_ran_and_passed(record: dict[str, Any]) -> None:
    assert set(record["checks"]) == set(CHECKS)
    failed = {n: c["detail"] for n, c in record["checks"].items() if not c["passed"]}
    assert not failed
    assert record["passed"] is True and "error" not in record


def test_recorded_on_a_commit_of_this_project(record: dict[str, Any]) -> None:
    assert re.fullmatch(r"[0-9a-f]{40}", record["commit"])
    when = datetime.strptime(record["recorded_utc"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert datetime(2026, 11, 1, tzinfo=UTC) < when <= datetime.now(UTC)


def test_it_ran_with_these_unit_files(record: dict[str, Any]) -> None:
    files = {**{f"systemd/{p.name}": p for p in (ROOT / "systemd").iterdir()},
             **{str(p.relative_to(ROOT)): p
                for p in (ROOT / "deploy" / "systemd-test").rglob("*") if p.is_file()}}  # fmt: skip
    assert set(record["files"]) == set(files)
    for name, path in files.items():
        assert record["files"][name] == hashlib.sha256(path.read_bytes()).hexdigest(), name


def test_systemd_was_pid_1(record: dict[str, Any]) -> None:
    assert record["facts"]["pid1"] == "systemd"
    assert record["facts"]["systemd"].startswith("systemd 25")


def test_ready_and_reload_figures(record: dict[str, Any]) -> None:
    f = record["figures"]
    assert 0 < f["ready_s"] <= f["systemctl_start_s"] < 180  # TimeoutStartSec
    assert 0 < f["reload_applied_s"] < WINDOWS[1]  # between windows: before the next one starts
    good, bad = record["checks"]["reload_good"]["detail"], record["checks"]["reload_bad"]["detail"]
    assert f"window_s {WINDOWS[0]} -> {RELOADED[0]}" in good and f"has {CUSTOM}" in good
    assert f"still has {CUSTOM}: True" in bad
    assert any("reload failed" in line for line in record["journal"]["reload_bad"])


def test_the_watchdog_restarted_the_frozen_sidecar_in_time(record: dict[str, Any]) -> None:
    f = record["figures"]
    watchdog_s, restart_s = 60.0, 15.0  # systemd/vllm-sidecar.service
    assert record["unit"]["WatchdogUSec"] == "1min" and record["unit"]["RestartUSec"] == "15s"
    assert 0 < f["frozen_to_watchdog_s"] <= watchdog_s + 1
    assert 0 <= f["watchdog_to_exit_s"] < 30  # TimeoutAbortSec: TimeoutStopSec's 30 s
    assert restart_s - 1 <= f["exit_to_restart_s"] <= restart_s + 5
    assert f["frozen_to_ready_again_s"] <= watchdog_s + 30 + restart_s + f["ready_s"] + 5
    assert any("Watchdog timeout" in line for line in record["journal"]["watchdog"])


def test_stop_was_clean(record: dict[str, Any]) -> None:
    assert 0 < record["figures"]["systemctl_stop_s"] < 30  # TimeoutStopSec
    assert "Result=success, exit status 0" in record["checks"]["stop"]["detail"]


def test_vllm_was_profiled(record: dict[str, Any]) -> None:
    first = record["facts"]["first_snapshot"]
    assert {"api_server", "engine_core", "worker"} <= set(first["roles"])
    assert first["samples"] > 0
    busy = {k for k, v in first["phases"].items() if v > 0 and k not in ("idle", "other")}
    assert busy


def test_journal_priorities(record: dict[str, Any]) -> None:
    lines = record["figures"]["sidecar_journal_lines"]
    assert lines["INFO"] > 0 and lines["ERROR"] > 0
    assert any("reload failed" in line for line in record["journal"]["journalctl_p_err"])
