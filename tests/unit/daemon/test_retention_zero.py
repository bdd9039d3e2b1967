"""`retention_days: 0` keeps snapshots for ever and says so at start (issue 26, item 6): it used
to delete every earlier snapshot at each write, silently."""

from __future__ import annotations

import logging

import pytest

from sidecar.config.load import load_config
from sidecar.daemon.parts import retention_of


def test_zero_days_keeps_for_ever_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    config = load_config(environ={}, flags={"output.retention_days": 0})
    with caplog.at_level(logging.WARNING, logger="vllm_sidecar"):
        retention = retention_of(config)
    assert retention.max_age_s is None
    assert retention.baseline_max_age_s == 90 * 86400
    assert "retention_days is 0: those snapshots are kept for ever" in caplog.text


def test_other_values_are_ages() -> None:
    retention = retention_of(load_config(environ={}, flags={"output.retention_days": 0.5}))
    assert retention.max_age_s == 0.5 * 86400
