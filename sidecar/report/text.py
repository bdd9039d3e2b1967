"""`vllm-sidecar report SNAPSHOT`: the operator's view of one snapshot, from its typed summary.

Built from the summary alone, so a report can be made on another machine, long after, from a
snapshot of any schema version (`sidecar.store.summary_io`). A part that was not measured says so
("not measured: ...") instead of printing a zero, and any figure may be missing: a summary
with requests/s but no token rate still renders.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from sidecar.advice.findings import Evaluation, evaluate, render_findings
from sidecar.advice.findings import to_json as findings_json
from sidecar.advice.rules import AdviceRules
from sidecar.analyze.computation import PER_REQUEST_QUESTION, SPLIT_HOW, STEP_QUESTION, step_split
from sidecar.gpu import GpuFigures, figures_of
from sidecar.records import Phase
from sidecar.records.readings import CustomMetric, KvCache, ServingFigures
from sidecar.records.summary import SnapshotSummary
from sidecar.report.threads import main_cpu_line, render_threads, threads_data, unseen_lines
from sidecar.sizes import format_pair, format_share
from sidecar.tables import ROLE_COLUMNS, phase_table, table
from sidecar.target.kvcache import kv_cache_text

STEP = ("forward", "attention", "prefill", "decode", "sampling")


def report_data(s: SnapshotSummary, advice: AdviceRules | None = None) -> dict[str, Any]:
    """The report as data: what `--format json` prints and the text is rendered from.
    `advice`: the rules the findings come from (None: the packaged configs/advice.yaml)."""
    return _data(s, evaluate(s, advice))


def _data(s: SnapshotSummary, ev: Evaluation) -> dict[str, Any]:
    return {
        "snapshot": s.name,
        "schema": s.schema,
        "memory": _memory(s),
        "computation": _computation(s),
        "throughput": _throughput(s),
        "findings": findings_json(ev),
        "custom": [asdict(m) for m in s.custom],
        "software": _software(s),
        "phases": {"by_role": s.by_role, "main_thread": s.main_thread},
        "stages": _stages(s),
        "processes": _processes(s),
        "threads": threads_data(s),
        "caveats": caveats(s),
    }


def caveats(s: SnapshotSummary) -> list[str]:
    """What limits how far this snapshot's stack shares can be trusted, in the sampler's words."""
    sampling = s.sampling
    out = [f"partial window: {sampling.partial_reason}"] if sampling.partial else []
    return out + list(sampling.warnings)


def _memory(s: SnapshotSummary) -> dict[str, Any]:
    gpu, kv, host = s.gpu, s.kv_cache, s.resources.host_memory
    out: dict[str, Any] = {"device": "gpu" if gpu.available else "host"}
    figures = _gpu_figures(s)
    devices = [d for d in gpu.devices if not d.mig]
    if figures is not None and figures.devices:
        used = _sum(d.memory_used_bytes for d in figures.devices)
        total = _sum(d.memory_total_bytes for d in figures.devices)
        out.update(used_bytes=used, total_bytes=total, devices=len(figures.devices))
        only = figures.devices[0] if len(figures.devices) == len(devices) == 1 else None
        if only is not None:  # the host's one GPU: its utilisation on the GPU line itself
            out["util"] = only.utilization.text if only.utilization else None
            out["gpus"] = list(figures.target.caveats)
        else:  # a subset of the host's GPUs, or tensor parallelism: one line per GPU
            out["gpus"] = figures.lines()
    elif gpu.available and devices:  # schema 1, or no device could be told the target's
        used = _sum(d.memory_used_bytes for d in devices)
        total = _sum(d.memory_total_bytes for d in devices)
        out.update(
            used_bytes=used,
            total_bytes=total,
            devices=len(devices),
            # schema 1 said nothing of which GPUs were the target's: say so where it matters
            gpus=["all of this host's GPUs: which ones the target uses is unknown"]
            if len(devices) > 1
            else [],
        )
    elif host:
        out.update(device="host", used_bytes=host.total_bytes - host.available_bytes,
                   total_bytes=host.total_bytes,
                   note=gpu.reason or "no GPU readings")  # fmt: skip
    else:
        out["missing"] = "no memory readings in this snapshot"
    out["kv_cache"] = asdict(kv) if kv and kv.bytes else None
    if out["kv_cache"] is None:
        out["kv_cache_missing"] = kv.source if kv else _serving_reason(s.serving)
    return out


def _gpu_figures(s: SnapshotSummary) -> GpuFigures | None:
    if not s.gpu.available or s.gpu.target is None:
        return None
    return figures_of(s.gpu.devices, s.gpu.target, s.gpu.utilization)


def _computation(s: SnapshotSummary) -> dict[str, Any]:
    """Two prefill/decode figures (sidecar/analyze/computation.py): vLLM's wall time per
    request, and
    the split of the worker's model-step samples; each says which question it answers."""
    out = _per_request(s)
    split = step_split(s)
    out["model_steps"] = (
        {"prefill_share": split.prefill_share, "decode_share": split.decode_share,
         "samples": split.samples, "estimated": split.estimated,
         "how": SPLIT_HOW if split.estimated else "model-step samples by the stage their "
         "stack shows", "answers": STEP_QUESTION}
        if split is not None and split.prefill_share is not None
        else {"missing": "no model-step samples, or no token counts to split them by"}
    )  # fmt: skip
    return out


def _per_request(s: SnapshotSummary) -> dict[str, Any]:
    serving = s.serving
    prefill, decode = serving.prefill_time_mean_s, serving.decode_time_mean_s
    if prefill is None or decode is None:
        return {"missing": _serving_reason(serving)}
    total = prefill + decode
    return {
        "source": "vLLM request_prefill/decode_time_seconds, mean per request over the window",
        "answers": PER_REQUEST_QUESTION,
        "prefill_ms": prefill * 1000,
        "decode_ms": decode * 1000,
        "prefill_share": prefill / total if total else None,
        "decode_share": decode / total if total else None,
        "ttft_ms": _ms(serving.ttft_mean_s, serving.ttft_p50_s, serving.ttft_p95_s),
        "itl_ms": _ms(serving.itl_mean_s, serving.itl_p50_s, serving.itl_p95_s),
    }


def _throughput(s: SnapshotSummary) -> dict[str, Any]:
    v = s.serving
    if v.requests_per_s is None:
        return {"missing": _serving_reason(v)}
    return {"requests_per_s": v.requests_per_s, "prompt_tokens_per_s": v.prompt_tokens_per_s,
            "generation_tokens_per_s": v.generation_tokens_per_s,
            "requests_running": v.requests_running, "requests_waiting": v.requests_waiting,
            "preemptions": v.preemptions, "kv_cache_usage": v.kv_cache_usage}  # fmt: skip


def _software(s: SnapshotSummary) -> dict[str, Any]:
    """The fingerprint as recorded (None fields are "could not be read", `notes` says why)."""
    if s.fingerprint is None:
        return {"deployment": s.deployment, "missing": "not recorded (written before schema 3)"}
    return {"deployment": s.deployment, **asdict(s.fingerprint)}


def _stages(s: SnapshotSummary) -> dict[str, Any]:
    """Stack samples per stage; unknown-stage model time apportioned by token counts, flagged."""
    out: dict[str, Any] = {"samples": dict(s.stages)}
    split = step_split(s)
    if split is not None and split.estimated:
        out["estimate"] = {"prefill": split.prefill, "decode": split.decode, "how": SPLIT_HOW}
    return out


def _processes(s: SnapshotSummary) -> list[dict[str, Any]]:
    stats = {p.pid: p for p in s.resources.processes}
    gpu_mem: dict[int, int] = {}
    for d in s.gpu.devices:
        for p in d.processes:
            if p.target_pid is not None and p.used_memory_bytes:
                gpu_mem[p.target_pid] = gpu_mem.get(p.target_pid, 0) + p.used_memory_bytes
    rows = []
    for proc in s.target.processes:
        st = stats.get(proc.pid)
        rows.append({"pid": proc.pid, "role": proc.role.value,
                     "rss_bytes": st.rss_bytes if st else None,
                     "cpu_share": st.cpu_share if st else None,
                     "threads": st.threads if st else None,
                     "gpu_memory_bytes": gpu_mem.get(proc.pid)})  # fmt: skip
    return rows


# ---------------------------------------------------------------------------------- text


def profile_block(s: SnapshotSummary) -> str:
    """The `[Profile]` sections (memory, computation time, throughput, software): the text
    report's head without its findings, which the HTML page shows in a section of their own."""
    d = report_data(s)
    parts = [_render_memory(d["memory"], s.kv_cache), _render_computation(d["computation"]),
             _render_throughput(d["throughput"]), *_render_custom(s.custom),
             _render_software(d["software"])]  # fmt: skip
    return "\n".join(parts)


def render(s: SnapshotSummary, advice: AdviceRules | None = None) -> str:
    ev = evaluate(s, advice)
    d = _data(s, ev)
    findings = render_findings(ev, gpu_host=s.gpu.available)
    parts = [_render_memory(d["memory"], s.kv_cache), _render_computation(d["computation"]),
             _render_throughput(d["throughput"]), *_render_custom(s.custom), "\n".join(findings),
             _render_software(d["software"]), "",
             "Memory breakdown:",
             _render_processes(d["processes"], s.kv_cache), "",
             "Computation breakdown (share of each role's samples):", phase_table(s)]  # fmt: skip
    if s.main_thread:
        parts += [
            "",
            "Main threads only:",
            _main_table(s.main_thread),
            *main_cpu_line(s),
            *unseen_lines(s),
        ]
    if s.threads:
        parts += ["", render_threads(d["threads"])]
    parts += ["", _render_stages(d["stages"])]
    if d["caveats"]:
        parts += ["", "Caveats:", *(f"- {c}" for c in d["caveats"])]
    return "\n".join(parts)


def _render_memory(m: Mapping[str, Any], kv: KvCache | None) -> str:
    lines = ["[Profile] Memory Usage:"]
    if "missing" in m:
        lines.append(f"- Memory: not measured ({m['missing']})")
    else:
        what = "GPU" if m["device"] == "gpu" else "Host (CPU host, no GPU memory)"
        used, total = m["used_bytes"], m["total_bytes"]
        util = f"; {m['util']}" if m.get("util") else ""
        lines.append(f"- {what}: {format_pair(used, total)} ({format_share(used, total)}){util}")
    lines += [f"  - {line}" for line in m.get("gpus", ())]
    if kv and kv.bytes:
        lines.append(f"- {kv_cache_text(kv)}")
    else:
        lines.append(f"- KV Cache: not measured ({m.get('kv_cache_missing')})")
    return "\n".join(lines)


def _render_computation(c: Mapping[str, Any]) -> str:
    """The familiar two lines (vLLM's time per request), with the model steps' split beside
    them, and one line naming what each measures and which question it answers."""
    steps = c["model_steps"]
    est = " (estimate)" if steps.get("estimated") else ""
    side = ("", "") if "missing" in steps else (
        f" | model steps {_pct_share(steps['prefill_share'])}{est}",
        f" | model steps {_pct_share(steps['decode_share'])}{est}")  # fmt: skip
    if "missing" in c:
        lines = [f"- Prefill/Decoding: not measured ({c['missing']})"]
        if "missing" not in steps:
            lines.append(f"- Model steps: prefill {_pct_share(steps['prefill_share'])}, decode "
                         f"{_pct_share(steps['decode_share'])}{est}")  # fmt: skip
    else:
        prefill = f"- Prefill: {c['prefill_ms']:.0f}ms ({_pct_share(c['prefill_share'])})"
        decode = f"- Decoding: {c['decode_ms']:.0f}ms ({_pct_share(c['decode_share'])})"
        width = max(len(prefill), len(decode))
        lines = [prefill.ljust(width) + side[0], decode.ljust(width) + side[1]]
    if "missing" not in c:
        lines.append(
            f"  per request (left): vLLM's request_prefill/decode_time, {PER_REQUEST_QUESTION}"
        )
    if "missing" not in steps:
        how = "; an estimate: V1 batches mix both, split by prompt vs generated tokens"
        how = how if est else ""
        lines.append(f"  model steps (right): the worker's stack samples, {STEP_QUESTION}{how}")
    return "\n".join(["[Profile] Computation Time:", *lines])


def _render_throughput(t: Mapping[str, Any]) -> str:
    if "missing" in t:
        return f"[Profile] Throughput:\n- not measured ({t['missing']})"
    prompt = t["prompt_tokens_per_s"]
    return (f"[Profile] Throughput:\n- Requests: {t['requests_per_s']:.1f} req/s\n"
            f"- Tokens: {_rate(t['generation_tokens_per_s'])} tokens/s"
            f"{f' (prompt: {prompt:.0f} tokens/s)' if prompt is not None else ''}")  # fmt: skip


def _render_custom(metrics: tuple[CustomMetric, ...]) -> list[str]:
    """`[Profile] Custom metrics:` the config's custom_metrics (no block when none is set)."""
    if not metrics:
        return []
    lines = ["[Profile] Custom metrics:"]
    for m in metrics:
        where = f"{m.metric}{_labels(m.labels)} at {m.source or 'vLLM /metrics'}"
        if m.value is None:
            lines.append(f"- {m.name}: not measured ({m.reason or 'no value'}; {where})")
            continue
        how = f"; {m.how}" if m.how else ""
        lines.append(f"- {m.name}: {custom_value(m)} ({m.kind}; {where}{how})")
    return ["\n".join(lines)]


def custom_value(m: CustomMetric) -> str:
    """`12.5 /s`, `0.031 s`, `n/a`: a custom metric's value with its unit."""
    if m.value is None:
        return "n/a"
    unit = f" {m.unit}" if m.unit else ""
    return f"{m.value:.4g}{unit}"


def _labels(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""


def _render_software(f: Mapping[str, Any]) -> str:
    """`[Profile] Software:` vLLM, torch, Python and backend; GPUs, driver and CUDA; the CPU;
    the model and the flags given (absent ones are vLLM's defaults); sidecar and rules."""
    if "missing" in f:
        return f"[Profile] Software:\n- {f['missing']}"
    backend = f["attention_backend"] or "not seen in the stacks"
    lines = [f"- vLLM {_na(f['vllm'])}, torch {_na(f['torch'])}, Python {_na(f['python'])}; "
             f"attention backend {backend}"]  # fmt: skip
    if f["nvidia_driver"] or f["gpus"]:
        gpus = ", ".join(f"{n}x {name}" for name, n in _counted(f["gpus"])) or "n/a"
        lines.append(f"- GPUs: {gpus}; NVIDIA driver {_na(f['nvidia_driver'])}, "
                     f"CUDA {_na(f['cuda'])}")  # fmt: skip
    else:
        lines.append(f"- GPUs: no NVML ({f['notes'].get('nvidia_driver', 'no driver version')})")
    cores = f"{f['cpu_cores']} logical CPUs" if f["cpu_cores"] else "n/a CPUs"
    lines.append(f"- CPU: {_na(f['cpu_model'])}, {cores}")
    where = f" (deployment {f['deployment']})" if f["deployment"] else ""
    lines.append(f"- Model: {_na(f['model'])}{where}")
    flags = " ".join(f"--{k}" if v == "true" else f"--no-{k}" if v == "false" else f"--{k} {v}"
                     for k, v in f["serving"].items())  # fmt: skip
    given = f"{flags} (others at" if flags else "none given (all at"
    lines.append(f"- Flags: {given} vLLM's defaults)")
    lines.append(f"- vllm-sidecar {_na(f['sidecar'])}, rules {_na(f['rules'])}")
    return "\n".join(["[Profile] Software:", *lines])


def _counted(names: list[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return list(counts.items())


def _na(value: Any) -> str:
    return "n/a" if value is None else str(value)


def _render_processes(rows: list[dict[str, Any]], kv: KvCache | None) -> str:
    body = [[r["pid"], r["role"], _gb_or(r["rss_bytes"]), _gb_or(r["gpu_memory_bytes"]),
             f"{100 * r['cpu_share']:.0f}%" if r["cpu_share"] is not None else "n/a",
             r["threads"] if r["threads"] is not None else "n/a"] for r in rows]  # fmt: skip
    if kv and kv.bytes:  # on a CPU host the KV cache lives inside the worker's RSS
        on_gpu = kv.share_of == "gpu"
        size = _gb_or(kv.bytes)
        usage = f"usage {100 * kv.usage:.1f}%" if kv.usage is not None else "usage n/a"
        body.append(["-", "kv_cache", "-" if on_gpu else f"({size})", size if on_gpu else "-",
                     "-", usage])  # fmt: skip
    return table(["pid", "role", "rss GiB", "gpu GiB", "cpu", "threads"], body)


def _main_table(main: Mapping[str, Mapping[str, float]]) -> str:
    known = [ph.value for ph in Phase]
    phases = sorted({p for shares in main.values() for p in shares},
                    key=lambda p: known.index(p) if p in known else len(known))  # fmt: skip
    roles = [r for r in ROLE_COLUMNS if r in main]
    rows = [[p, *(f"{100 * main[r].get(p, 0):.1f}%" if main[r].get(p) else "-" for r in roles)]
            for p in phases]  # fmt: skip
    return table(["phase", *roles], rows)


def _render_stages(st: Mapping[str, Any]) -> str:
    samples = st["samples"]
    counts = ", ".join(f"{k} {samples.get(k, 0)}" for k in ("prefill", "decode", "unknown"))
    line = f"Stages (model-step samples): {counts}"
    est = st.get("estimate")
    if est:
        total = est["prefill"] + est["decode"]
        line += (f"\nEstimated split: prefill {100 * est['prefill'] / total:.0f}%, decode "
                 f"{100 * est['decode'] / total:.0f}% ({est['how']})")  # fmt: skip
    return line


def _serving_reason(serving: ServingFigures) -> str:
    if serving.reason:
        return serving.reason
    if not serving.requests_finished:
        return "no request finished during the window (was the server idle?)"
    return "vLLM /metrics not read"


def _ms(mean: float | None, p50: float | None, p95: float | None) -> dict[str, float | None]:
    return {q: (v * 1000 if v is not None else None)
            for q, v in (("mean", mean), ("p50", p50), ("p95", p95))}  # fmt: skip


def _sum(values: Any) -> int | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def _gb_or(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f}"


def _pct_share(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"
