"""The Grafana dashboard and the alert rules against the exporter they read (no processes).

Every metric name a query or a rule uses is one the exporter exports (`HELP`, counters with
`_total`), one vLLM's recorded /metrics has, or one the README lists as coming later (`LATER`).
That every query *parses and runs* is checked against a real Prometheus in
tests/integration/test_prometheus_live.py; `promtool test rules` checks the rules there too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.grafana_dashboard import DASHBOARD_PATH, LATER, render
from sidecar.exporter import HELP, PREFIX

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "vllm-sidecar-rules.yml"
VLLM_METRICS = ROOT / "tests" / "fixtures" / "metrics" / "v0.32.0-cpu-after.txt"
SIDECAR_NAME = re.compile(r"\bvllm_sidecar_\w+")
VLLM_NAME = re.compile(r"\bvllm:\w+")
SELECTOR = re.compile(r"(vllm_sidecar_\w+)(\{[^}]*\})?")


def exported_names() -> set[str]:
    return {PREFIX + n + ("_total" if kind == "counter" else "") for n, (kind, _) in HELP.items()}


def vllm_names() -> set[str]:
    return {m[0] for m in re.finditer(r"^vllm:\w+", VLLM_METRICS.read_text(), re.M)}


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD_PATH.read_text())  # type: ignore[no-any-return]


def panels() -> list[dict[str, Any]]:
    return [p for p in load()["panels"] if p["type"] != "row"]


def exprs() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


def test_committed_dashboard_is_the_generated_one() -> None:
    assert DASHBOARD_PATH.read_text() == render(), "stale: run `make dashboard`"


def test_structure_grafana_needs() -> None:
    board = load()
    assert board["uid"] == "vllm-sidecar"
    assert isinstance(board["schemaVersion"], int)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for p in board["panels"]:
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
    for p in panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert all(t["expr"].strip() for t in p["targets"]), p["title"]


def test_variables_select_host_deployment_and_role() -> None:
    variables = {v["name"]: v for v in load()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for name in ("host", "deployment", "role"):
        v = variables[name]
        assert v["includeAll"] and v["allValue"] == ".*", name  # "All" matches a missing label
        assert v["query"]["query"].startswith("label_values(vllm_sidecar_"), name
    repeated = [p for p in panels() if p.get("repeat")]
    assert {p["repeat"] for p in repeated} == {"role"}
    assert any("phase_ratio" in t["expr"] for p in repeated for t in p["targets"])


def test_every_selector_follows_host_and_deployment() -> None:
    for expr in exprs():
        for m in SELECTOR.finditer(expr):
            labels = m[2] or ""
            assert 'host=~"$host"' in labels and 'deployment=~"$deployment"' in labels, expr


def test_every_line_a_host_has_names_its_deployment_too() -> None:
    """A fleet host (`targets:`) has several deployments: with the selector at "All", a legend
    of the host alone would draw two servers' lines under one name."""
    legends = [t["legendFormat"] for p in panels() for t in p["targets"]]
    assert all("{{deployment}}" in x for x in legends if "{{host}}" in x), legends


@pytest.mark.parametrize("expr", exprs())
def test_query_brackets_balance(expr: str) -> None:
    for open_, close in ("()", "{}", "[]"):
        depth = 0
        for ch in expr:
            depth += (ch == open_) - (ch == close)
            assert depth >= 0, expr
        assert depth == 0, expr


def test_dashboard_names_are_exported_or_documented_later() -> None:
    used = {n for e in exprs() for n in SIDECAR_NAME.findall(e)}
    used |= {n for v in load()["templating"]["list"] for n in SIDECAR_NAME.findall(str(v))}
    unknown = used - exported_names() - set(LATER)
    assert not unknown, f"not exported and not in LATER: {sorted(unknown)}"
    assert set(LATER) <= used  # each later name has its panel waiting


def test_the_dashboard_covers_each_family_of_the_issue() -> None:
    text = " ".join(exprs())
    for name in ("phase_ratio", "serving_ttft_p95_seconds", "gpu_memory_used_bytes",
                 "finding", "stalled_seconds", "sampler_cpu_ratio", "sampling_errors_total"):  # fmt: skip
        assert f"vllm_sidecar_{name}" in text, name


def test_rule_names_are_exported_vllms_or_documented_later() -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    text = " ".join(r["expr"] for r in rules)
    unknown = set(SIDECAR_NAME.findall(text)) - exported_names() - set(LATER)
    assert not unknown, sorted(unknown)
    assert set(VLLM_NAME.findall(text)) <= vllm_names()
    assert {r["alert"] for r in rules} == {
        "VllmSidecarDown",
        "VllmTargetDown",
        "VllmSidecarSnapshotsStale",
        "VllmSidecarDiskGuardActive",
        "VllmKvCacheExhausted",
        "VllmEngineStalled",
        "VllmSidecarSamplerOverBudget",
    }
    for r in rules:
        assert r["labels"]["severity"] in {"warning", "critical"}, r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
