"""`make dashboard`: write deploy/grafana/vllm-sidecar.json, the Grafana dashboard over the
sidecar's exporter. The panels are data (`ROWS`);
tests/unit/project/test_grafana_dashboard.py fails when the committed JSON is stale, and
tests/integration/test_prometheus_live.py runs every query
against a real Prometheus scraping a real daemon.

Every selector carries `host=~"$host", deployment=~"$deployment"`, and every legend that names
the host names the deployment too. The `deployment` label is set by a daemon with `targets:`
(sidecar/daemon/multi_target.py); a single-target daemon sets none, and the selector then lists no
value but "All" (`.*`, which also matches a series without the label).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DASHBOARD_PATH = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "vllm-sidecar.json"
SEL = 'host=~"$host", deployment=~"$deployment"'
DS = {"type": "prometheus", "uid": "${datasource}"}
# Metric names the dashboard and the alert rules use that the exporter does not export yet; the
# README lists them under "Prometheus and Grafana". The tests allow exactly these.
LATER: tuple[str, ...] = ()  # names the README documents before any issue exports them

# (title, unit, [(expr, legend)], options): one timeseries panel each. "repeat" panels are
# repeated per role by Grafana. Row titles are the sections.
Panel = tuple[str, str, list[tuple[str, str]], dict[str, Any]]
ROWS: list[tuple[str, list[Panel]]] = [
    ("Phases", [
        ("Phase shares: $role (all threads)", "percentunit",
         [(f'vllm_sidecar_phase_ratio{{{SEL}, role=~"$role"}}', "{{phase}} {{host}}")],
         {"repeat": "role", "stack": True}),
        ("Main-thread phase shares: $role", "percentunit",
         [(f'vllm_sidecar_main_thread_phase_ratio{{{SEL}, role=~"$role"}}',
           "{{phase}} {{host}}")],
         {"repeat": "role", "stack": True}),
        ("Model-step samples by stage", "short",
         [(f"sum by (host, deployment, stage) (vllm_sidecar_stage_samples{{{SEL}}})",
           "{{stage}} {{host}}")], {}),
    ]),
    ("Serving (vLLM's figures over each window)", [
        ("Requests and tokens per second", "short",
         [(f"vllm_sidecar_serving_requests_per_second{{{SEL}}}", "requests/s {{host}}"),
          (f"vllm_sidecar_serving_prompt_tokens_per_second{{{SEL}}}", "prompt tok/s {{host}}"),
          (f"vllm_sidecar_serving_generation_tokens_per_second{{{SEL}}}",
           "generated tok/s {{host}}")], {}),
        ("Time to first token and inter-token latency", "s",
         [(f"vllm_sidecar_serving_ttft_p50_seconds{{{SEL}}}", "TTFT p50 {{host}}"),
          (f"vllm_sidecar_serving_ttft_p95_seconds{{{SEL}}}", "TTFT p95 {{host}}"),
          (f"vllm_sidecar_serving_itl_p50_seconds{{{SEL}}}", "ITL p50 {{host}}"),
          (f"vllm_sidecar_serving_itl_p95_seconds{{{SEL}}}", "ITL p95 {{host}}")], {}),
        ("Prefill and decode time per request", "s",
         [(f"vllm_sidecar_serving_prefill_mean_seconds{{{SEL}}}", "prefill {{host}}"),
          (f"vllm_sidecar_serving_decode_mean_seconds{{{SEL}}}", "decode {{host}}")], {}),
        ("KV cache usage at each window's end", "percentunit",
         [(f"vllm_sidecar_kv_cache_usage_ratio{{{SEL}}}", "{{host}}")], {"max": 1}),
    ]),
    ("Memory", [
        ("GPU memory", "bytes",
         [(f"vllm_sidecar_gpu_memory_used_bytes{{{SEL}}}", "used {{host}} {{gpu}}"),
          (f"vllm_sidecar_gpu_memory_total_bytes{{{SEL}}}", "total {{host}} {{gpu}}")], {}),
        ("GPU memory per vLLM process", "bytes",
         [(f"sum by (host, deployment, gpu, role) (vllm_sidecar_gpu_process_memory_bytes{{{SEL}}})",
           "{{role}} {{host}} {{gpu}}")], {"stack": True}),
        ("KV cache size", "bytes",
         [(f"vllm_sidecar_kv_cache_bytes{{{SEL}}}", "{{host}}")], {}),
        ("KV cache over device or host memory", "percentunit",
         [(f"vllm_sidecar_kv_cache_memory_ratio{{{SEL}}}", "of {{of}} {{host}}")], {}),
    ]),
    ("Findings (configs/advice.yaml)", [
        ("Findings by severity", "short",
         [(f"sum by (severity) (vllm_sidecar_findings{{{SEL}}})", "{{severity}}")],
         {"type": "stat"}),
        ("Active findings", "short",
         [(f"max by (host, deployment, id, severity) (vllm_sidecar_finding{{{SEL}}})",
           "{{id}} ({{severity}}) {{host}}")], {"stack": True}),
    ]),
    ("Stalls and the target", [
        # sidecar/daemon/hang.py: seconds without progress while requests wait, once raised.
        ("Stalled seconds per role", "s",
         [(f"max by (host, role) (vllm_sidecar_stalled_seconds{{{SEL}}})",
           "{{role}} {{host}}")], {}),
        ("vLLM attached", "short",
         [(f"vllm_sidecar_target_up{{{SEL}}}", "up {{host}}"),
          (f"increase(vllm_sidecar_target_restarts_total{{{SEL}}}[1h])",
           "restarts/h {{host}}")], {}),
        ("py-spy behind schedule (the host starved it)", "s",
         [(f"vllm_sidecar_sampling_behind_seconds{{{SEL}}}", "{{host}}")], {}),
    ]),
    ("Sampler health", [
        ("Sampling rate", "hertz",
         [(f"vllm_sidecar_sampling_samples_per_second{{{SEL}}}", "{{host}}")], {}),
        ("py-spy CPU against its budget", "percentunit",
         [(f"vllm_sidecar_sampler_cpu_ratio{{{SEL}}}", "used {{host}}"),
          (f"vllm_sidecar_sampler_cpu_budget_ratio{{{SEL}}}", "budget {{host}}")], {}),
        ("Failed samples", "percentunit",
         [(f"rate(vllm_sidecar_sampling_errors_total{{{SEL}}}[$__rate_interval])"
           f" / rate(vllm_sidecar_samples_total{{{SEL}}}[$__rate_interval])", "{{host}}")], {}),
        ("Snapshot age and lateness", "s",
         [(f"vllm_sidecar_snapshot_age_seconds{{{SEL}}}", "age {{kind}} {{host}}"),
          (f"vllm_sidecar_snapshot_lateness_seconds{{{SEL}}}", "lateness {{host}}")], {}),
        ("Window failures and missed windows", "short",
         [(f"increase(vllm_sidecar_window_failures_total{{{SEL}}}[1h])", "{{kind}} {{host}}"),
          (f"increase(vllm_sidecar_windows_missed_total{{{SEL}}}[1h])", "missed {{host}}")],
         {}),
        ("Output folder", "bytes",
         [(f"vllm_sidecar_disk_free_bytes{{{SEL}}}", "free {{host}}"),
          (f"vllm_sidecar_output_bytes{{{SEL}}}", "snapshots {{host}}")], {}),
        ("Disk guard (1 = low: snapshots skipped)", "short",
         [(f'vllm_sidecar_disk_state{{{SEL}, state="low"}}', "{{host}}")], {"max": 1}),
    ]),
]  # fmt: skip


def _variable(name: str, label: str, metric: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": f"label_values({metric}, {name})", "refId": f"{name}-values"},
        "definition": f"label_values({metric}, {name})",
        "refresh": 2,  # on time range change: deployments come and go
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"text": "All", "value": "$__all"},
        "sort": 1,
    }


def _panel(pid: int, panel: Panel, x: int, y: int) -> dict[str, Any]:
    title, unit, queries, options = panel
    kind = options.get("type", "timeseries")
    defaults: dict[str, Any] = {"unit": unit, "min": 0}
    if "max" in options:
        defaults["max"] = options["max"]
    if kind == "timeseries":
        defaults["custom"] = {"stacking": {"mode": "normal" if options.get("stack") else "none"},
                              "fillOpacity": 20 if options.get("stack") else 0}  # fmt: skip
    out: dict[str, Any] = {
        "id": pid,
        "type": kind,
        "title": title,
        "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DS,
                "expr": expr,
                "legendFormat": _named(legend),
            }
            for i, (expr, legend) in enumerate(queries)
        ],
    }
    if "repeat" in options:
        out.update(repeat=options["repeat"], repeatDirection="h", maxPerRow=2)
    return out


def _named(legend: str) -> str:
    """A fleet host (`targets:`) has several deployments: the legend names the one a line is
    (empty for a single-target sidecar, which sets no `deployment`)."""
    return legend.replace("{{host}}", "{{host}} {{deployment}}")


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y, pid = 0, 1
    for row_title, row_panels in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})  # fmt: skip
        pid, y = pid + 1, y + 1
        for i, panel in enumerate(row_panels):
            panels.append(_panel(pid, panel, 12 * (i % 2), y + 8 * (i // 2)))
            pid += 1
        y += 8 * ((len(row_panels) + 1) // 2)
    variables = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource",
         "query": "prometheus", "current": {}},
        _variable("host", "Host", "vllm_sidecar_build_info"),
        _variable("deployment", "Deployment", "vllm_sidecar_build_info"),
        _variable("role", "Role", "vllm_sidecar_phase_ratio"),
    ]  # fmt: skip
    return {
        "uid": "vllm-sidecar",
        "title": "vLLM sidecar",
        "description": "Phase shares, serving figures, memory, findings and sampler health "
        "from vllm-sidecar's exporter (deploy/grafana/vllm-sidecar.json).",
        "tags": ["vllm", "vllm-sidecar"],
        "timezone": "utc",
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "1m",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": variables},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> int:
    DASHBOARD_PATH.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD_PATH.write_text(render())
    print(f"wrote {DASHBOARD_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
