"""A triggered snapshot's cause: its kind is a `CauseKind` in the records and the same plain
string in summary.json as before the enum, so summaries written earlier read unchanged."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.errors import InputError
from sidecar.records.summary import Cause, CauseKind
from sidecar.store.summary_io import parse_summary, read_summary
from sidecar.store.writers import write_snapshot
from sidecar.window.snapshot import build_snapshot
from tests.unit.report.test_report import processes, window


def test_the_kinds_are_the_strings_summaries_hold() -> None:
    assert [k.value for k in CauseKind] == ["signal", "socket", "latency", "queue", "stall"]


@pytest.mark.parametrize("kind", list(CauseKind))
def test_a_cause_is_written_as_its_string_and_read_back_as_its_kind(
    kind: CauseKind, tmp_path: Path
) -> None:
    snap = build_snapshot(window(), processes(), Classifier(load_rules()), host="h")
    snap = replace(snap, cause=Cause(kind, "why", "2026-12-02T12:00:00+00:00"))
    folder = write_snapshot(snap, tmp_path, kind="snapshot")
    raw = json.loads((folder / "summary.json").read_text())
    assert raw["cause"] == {"kind": kind.value, "detail": "why", "at": "2026-12-02T12:00:00+00:00"}
    read = read_summary(folder)
    assert read.cause is not None and read.cause.kind is kind
    assert read == snap.summary("snapshot")


def test_an_unknown_cause_kind_is_an_input_error_naming_the_field(tmp_path: Path) -> None:
    snap = build_snapshot(window(), processes(), Classifier(load_rules()), host="h")
    snap = replace(snap, cause=Cause(CauseKind.SIGNAL, "why", "2026-12-02T12:00:00+00:00"))
    folder = write_snapshot(snap, tmp_path, kind="snapshot")
    raw = json.loads((folder / "summary.json").read_text())
    raw["cause"]["kind"] = "telepathy"
    with pytest.raises(InputError, match=r"`cause\.kind`"):
        parse_summary(raw)
