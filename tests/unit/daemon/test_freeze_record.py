"""The recorded freeze check (devtools/freeze_check.py, `make freeze-check`) holds what issue 26,
item 20 asks: on the real vLLM CPU server under a steady load, at least 10 freezes of the
EngineCore at random moments, every one raised within `stall_after_s`, some of them where
vLLM's own gauges said nothing ran or waited (the freeze the gauge-only watch missed); then 10
minutes of an idle server with nothing raised."""

from __future__ import annotations

import json
from pathlib import Path

RECORD = Path(__file__).resolve().parents[2] / "fixtures" / "freeze" / "freeze-check.json"


def test_every_recorded_freeze_was_raised_within_stall_after_and_the_idle_server_never() -> None:
    record = json.loads(RECORD.read_text())
    hang, freezes = record["hang"], record["freezes"]
    assert hang == {"check_s": 5.0, "stack_after_s": 30.0, "stall_after_s": 120.0}  # defaults
    random_ones = [f for f in freezes if not f["aimed_between_batches"]]
    assert len(random_ones) >= 10
    for f in freezes:
        assert f["raised_after_s"] is not None, f
        assert f["raised_after_s"] <= hang["stall_after_s"] + hang["check_s"], f
        assert f["cleared"] and f["line"] and "stalled in" in f["line"], f
    between = [f for f in freezes if sum(f["gauges_at_freeze"].values()) == 0]
    assert len(between) >= 3  # frozen where the gauges said idle: raised all the same
    for f in between:
        assert "client connections held open" in f["line"], f
    idle = record["idle"]
    assert idle["seconds"] >= 600 and idle["requests_sent"] == 0
    assert not idle["stalled_seen"] and idle["incidents"] == 0 and idle["state_at_end"] == "idle"
