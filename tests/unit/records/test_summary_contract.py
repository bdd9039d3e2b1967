"""The summary contract: typed records, the published JSON Schema, and one reader for every
schema version written so far (snapshots and baselines are kept for months)."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.schema import SCHEMA_PATH
from devtools.schema import render as render_schema
from sidecar.errors import InputError
from sidecar.records.summary import SCHEMA_VERSION, SnapshotSummary
from sidecar.report.text import render, report_data
from sidecar.store.summary_io import parse_summary, read_summary
from sidecar.store.writers import write_snapshot
from tests.unit.report.test_report import processes, serving, summary, window

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SCHEMA1 = FIXTURES / "schema1"


def schema1_folder() -> Path:
    (folder,) = [p for p in SCHEMA1.iterdir() if p.is_dir()]
    return folder


def test_the_published_schema_is_the_records_schema() -> None:
    assert SCHEMA_PATH.read_text() == render_schema(), "stale: run `make schema`"


def test_a_written_summary_validates_against_the_published_schema(tmp_path: Path) -> None:
    from sidecar.classify.classifier import Classifier
    from sidecar.classify.rules import load_rules
    from sidecar.window.snapshot import Readings, build_snapshot

    snap = build_snapshot(window(), processes(), Classifier(load_rules()), host="h",
                          readings=Readings(serving=serving()))  # fmt: skip
    folder = write_snapshot(snap, tmp_path, kind="baseline")
    data = json.loads((folder / "summary.json").read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(data)
    assert data["schema"] == SCHEMA_VERSION and data["kind"] == "baseline"
    assert read_summary(folder) == snap.summary("baseline")  # the round trip loses nothing


def test_a_schema1_snapshot_written_by_vllm_sidecar_0_1_is_read_and_reported() -> None:
    folder = schema1_folder()
    raw = json.loads((folder / "summary.json").read_text())
    assert raw["schema"] == 1
    s = read_summary(folder)
    assert s.schema == SCHEMA_VERSION and s.name == raw["name"]
    assert s.custom == ()  # schema 4's custom metrics: 1 recorded none
    assert s.sampling.samples == raw["sampling"]["samples"]
    assert {r: dict(v) for r, v in s.by_role.items()} == raw["by_role"]
    assert s.serving.requests_per_s == raw["serving"]["requests_per_s"]
    assert [p.pid for p in s.target.processes] == [p["pid"] for p in raw["target"]["processes"]]
    text = render(s)
    assert text.startswith("[Profile] Memory Usage:\n- Host (CPU host, no GPU memory): ")
    assert "- Requests: " in text and "req/s" in text
    assert report_data(s)["schema"] == SCHEMA_VERSION
    # Schema 1's KV `bytes` was vLLM's configured budget (1 GiB here): kept as the budget,
    # with a caveat, since 1 did not count the blocks vLLM allocated.
    kv = s.kv_cache
    assert kv is not None and kv.bytes == raw["kv_cache"]["bytes"] == kv.budget_bytes == 1 << 30
    assert kv.allocated_bytes is None and "schema 1" in kv.caveats[0]


def test_the_report_command_reads_a_schema1_folder(capsys: pytest.CaptureFixture[str]) -> None:
    from sidecar.cli import main

    assert main(["report", str(schema1_folder())]) == 0
    assert "\n\n[Profile] Memory Usage:\n" in capsys.readouterr().out  # after the header


def test_a_newer_schema_is_refused_with_the_fix() -> None:
    data = json.loads((schema1_folder() / "summary.json").read_text())
    data["schema"] = SCHEMA_VERSION + 1
    with pytest.raises(InputError, match=r"newer vllm-sidecar .* upgrade vllm-sidecar"):
        parse_summary(data, "s.json")


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("sampling", "samples"), "many", "`sampling.samples`"),
        (("target", "processes"), {"pid": 1}, "`target.processes`"),
        (("phases",), [1, 2], "`phases`"),
        (("serving", "requests_per_s"), {"x": 1}, "`serving.requests_per_s`"),
    ],
)
def test_a_garbled_summary_is_an_input_error_naming_the_field(
    path: tuple[str, ...], value: Any, message: str
) -> None:
    data = json.loads((schema1_folder() / "summary.json").read_text())
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(InputError, match=message.replace(".", r"\.")):
        parse_summary(data, "s.json")


def test_not_a_summary_at_all() -> None:
    with pytest.raises(InputError, match="not a vllm-sidecar summary"):
        parse_summary([1, 2, 3])
    with pytest.raises(InputError, match="`schema` is 'one'"):
        parse_summary({"phases": {}, "schema": "one"})


# ------------------------------------------------------------------------------ properties

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


_REAL = json.loads((schema1_folder() / "summary.json").read_text())
_REAL_PATHS = _paths(_REAL)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_REAL_PATHS), _JSON), min_size=1, max_size=4))
def test_a_mutated_real_summary_is_read_or_refused_never_a_crash(
    mutations: list[tuple[tuple[Any, ...], Any]],
) -> None:
    data = copy.deepcopy(_REAL)
    for path, value in mutations:
        node = data
        try:
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation replaced the path's parent
    try:
        s = parse_summary(data, "mutated")
    except InputError:
        return
    render(s)  # whatever validated renders
    report_data(s)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.from_type(SnapshotSummary))
def test_the_report_renders_every_typed_summary(s: SnapshotSummary) -> None:
    """Any combination of missing or odd figures (requests/s without a token rate, shares
    without samples, NaN) renders: a partial summary is a report that says what is missing."""
    text = render(s)
    assert text.startswith("[Profile] Memory Usage:")
    report_data(s)


def test_requests_known_but_token_rates_missing_renders() -> None:
    """It crashed on 0.1 (`None:.0f`)."""
    s = summary(gpu=False, metrics=True)
    s = replace(s, serving=replace(s.serving, generation_tokens_per_s=None,
                                   prompt_tokens_per_s=None))  # fmt: skip
    text = render(s)
    assert "- Tokens: n/a tokens/s" in text and "- Requests: " in text
    assert not math.isnan(report_data(s)["throughput"]["requests_per_s"])


# ------------------------------------------------------------------------ older schemas read

# A summary of every schema written before this one, each recorded by the vllm-sidecar of its
# day from a real vLLM server (schema 4: tests/fixtures/schema4, devtools.groundtruth_probe).
OLDER = {
    1: SCHEMA1,
    2: FIXTURES / "trend" / "schema2",
    3: FIXTURES / "trend" / "schema3",
    4: FIXTURES / "schema4",
}


@pytest.mark.parametrize("version", sorted(OLDER))
def test_every_older_schema_reads_with_no_thread_checks(version: int) -> None:
    """Schema 5 added `threads` (each thread's samples against its /proc CPU time): older
    summaries measured none, and read with none; their report says it was not measured."""
    (folder,) = [p for p in OLDER[version].iterdir() if p.is_dir()]
    raw = json.loads((folder / "summary.json").read_text())
    assert raw["schema"] == version and "threads" not in raw
    s = read_summary(folder)
    assert s.schema == SCHEMA_VERSION and s.threads == ()
    assert s.name == raw["name"] and s.sampling.samples == raw["sampling"]["samples"]
    assert "not measured" in report_data(s)["threads"]["missing"]
    assert "Threads against /proc" not in render(s)
