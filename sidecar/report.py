"""`vllm-sidecar report SNAPSHOT`: the operator's view of one snapshot, from its summary.json.

Built from the summary alone, so a report can be made on another machine, long after. A part
that was not measured says so ("not measured: ...") instead of printing a zero.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecar.errors import InputError
from sidecar.records import Phase
from sidecar.render import ROLE_COLUMNS, phase_table, table

GB = 1e9
STEP = ("forward", "attention", "prefill", "decode", "sampling")


def load_summary(folder: Path) -> dict[str, Any]:
    path = folder / "summary.json" if folder.is_dir() else folder
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(
            f"no summary.json in {folder}: point at a snapshot folder written by "
            "`vllm-sidecar snapshot` or `run`"
        ) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or "phases" not in data:
        raise InputError(f"{path} is not a vllm-sidecar summary (no `phases`)")
    return data


def report_data(s: Mapping[str, Any]) -> dict[str, Any]:
    """The report as data: what `--format json` prints and the text is rendered from."""
    return {
        "snapshot": s.get("name"),
        "memory": _memory(s),
        "computation": _computation(s),
        "throughput": _throughput(s),
        "phases": {"by_role": s.get("by_role"), "main_thread": s.get("main_thread")},
        "stages": _stages(s),
        "processes": _processes(s),
        "caveats": caveats(s),
    }


def caveats(s: Mapping[str, Any]) -> list[str]:
    """What limits how far this snapshot's stack shares can be trusted, in the sampler's words."""
    sampling = s.get("sampling") or {}
    out = [f"partial window: {sampling['partial_reason']}"] if sampling.get("partial") else []
    return out + [str(w) for w in sampling.get("warnings") or ()]


def _memory(s: Mapping[str, Any]) -> dict[str, Any]:
    gpu, kv = s.get("gpu") or {}, s.get("kv_cache")
    host = (s.get("resources") or {}).get("host_memory")
    out: dict[str, Any] = {"device": "gpu" if gpu.get("available") else "host"}
    if gpu.get("available"):
        devices = [d for d in gpu.get("devices", []) if not d.get("mig")]
        used = _sum(d.get("memory_used_bytes") for d in devices)
        total = _sum(d.get("memory_total_bytes") for d in devices)
        out.update(used_bytes=used, total_bytes=total, devices=len(devices))
    elif host:
        out.update(used_bytes=host["total_bytes"] - host["available_bytes"],
                   total_bytes=host["total_bytes"],
                   note=gpu.get("reason") or "no GPU readings")  # fmt: skip
    else:
        out["missing"] = "no memory readings in this snapshot"
    out["kv_cache"] = kv if kv and kv.get("bytes") else None
    if out["kv_cache"] is None:
        out["kv_cache_missing"] = (kv or {}).get("source") or _serving_reason(s)
    return out


def _computation(s: Mapping[str, Any]) -> dict[str, Any]:
    serving = s.get("serving") or {}
    prefill, decode = serving.get("prefill_time_mean_s"), serving.get("decode_time_mean_s")
    if prefill is None or decode is None:
        return {"missing": _serving_reason(s)}
    total = prefill + decode
    return {
        "source": "vLLM request_prefill/decode_time_seconds, mean per request over the window",
        "prefill_ms": prefill * 1000,
        "decode_ms": decode * 1000,
        "prefill_share": prefill / total if total else None,
        "decode_share": decode / total if total else None,
        "ttft_ms": _ms(serving, "ttft"),
        "itl_ms": _ms(serving, "itl"),
    }


def _throughput(s: Mapping[str, Any]) -> dict[str, Any]:
    serving = s.get("serving") or {}
    if serving.get("requests_per_s") is None:
        return {"missing": _serving_reason(s)}
    keys = ("requests_per_s", "prompt_tokens_per_s", "generation_tokens_per_s",
            "requests_running", "requests_waiting", "preemptions", "kv_cache_usage")  # fmt: skip
    return {k: serving.get(k) for k in keys}


def _stages(s: Mapping[str, Any]) -> dict[str, Any]:
    """Stack samples per stage; unknown-stage model time apportioned by token counts, flagged."""
    stages = dict(s.get("stages") or {})
    serving = s.get("serving") or {}
    prompt, gen = serving.get("prompt_tokens"), serving.get("generation_tokens")
    unknown = stages.get("unknown", 0)
    out: dict[str, Any] = {"samples": stages}
    if unknown and prompt is not None and gen is not None and prompt + gen > 0:
        out["estimate"] = {
            "prefill": stages.get("prefill", 0) + unknown * prompt / (prompt + gen),
            "decode": stages.get("decode", 0) + unknown * gen / (prompt + gen),
            "how": "model-step samples whose stage the stack cannot tell (V1 mixes prefill "
            "and decode in one batch), split by the window's prompt vs generated tokens: "
            "an estimate",
        }
    return out


def _processes(s: Mapping[str, Any]) -> list[dict[str, Any]]:
    stats = {p["pid"]: p for p in (s.get("resources") or {}).get("processes", [])}
    gpu_mem: dict[int, int] = {}
    for d in (s.get("gpu") or {}).get("devices", []):
        for p in d.get("processes", []):
            if p.get("target_pid") and p.get("used_memory_bytes"):
                gpu_mem[p["target_pid"]] = gpu_mem.get(p["target_pid"], 0) + p["used_memory_bytes"]
    rows = []
    for proc in (s.get("target") or {}).get("processes", []):
        st = stats.get(proc["pid"], {})
        rows.append({"pid": proc["pid"], "role": proc["role"], "rss_bytes": st.get("rss_bytes"),
                     "cpu_share": st.get("cpu_share"), "threads": st.get("threads"),
                     "gpu_memory_bytes": gpu_mem.get(proc["pid"])})  # fmt: skip
    return rows


# ---------------------------------------------------------------------------------- text


def render(s: Mapping[str, Any]) -> str:
    d = report_data(s)
    parts = [_render_memory(d["memory"]), _render_computation(d["computation"]),
             _render_throughput(d["throughput"]), "", "Memory breakdown:",
             _render_processes(d["processes"], d["memory"]), "",
             "Computation breakdown (share of each role's samples):", phase_table(s)]  # fmt: skip
    if s.get("main_thread"):
        parts += ["", "Main threads only:", _main_table(s["main_thread"])]
    parts += ["", _render_stages(d["stages"])]
    if d["caveats"]:
        parts += ["", "Caveats:", *(f"- {c}" for c in d["caveats"])]
    return "\n".join(parts)


def _render_memory(m: Mapping[str, Any]) -> str:
    lines = ["[Profile] Memory Usage:"]
    if "missing" in m:
        lines.append(f"- Memory: not measured ({m['missing']})")
    else:
        what = "GPU" if m["device"] == "gpu" else "Host (CPU host, no GPU memory)"
        lines.append(f"- {what}: {_gb(m['used_bytes'])}/{_gb(m['total_bytes'])} GB "
                     f"({_pct(m['used_bytes'], m['total_bytes'])})")  # fmt: skip
    kv = m.get("kv_cache")
    if kv:
        of = "of GPU" if kv.get("share_of") == "gpu" else "of host memory"
        share = f" ({100 * kv['share']:.1f}% {of})" if kv.get("share") is not None else ""
        lines.append(f"- KV Cache: {_gb(kv['bytes'])} GB{share}")
    else:
        lines.append(f"- KV Cache: not measured ({m.get('kv_cache_missing')})")
    return "\n".join(lines)


def _render_computation(c: Mapping[str, Any]) -> str:
    if "missing" in c:
        return f"[Profile] Computation Time:\n- Prefill/Decoding: not measured ({c['missing']})"
    prefill, decode = 100 * (c["prefill_share"] or 0), 100 * (c["decode_share"] or 0)
    return (
        "[Profile] Computation Time:\n"
        f"- Prefill: {c['prefill_ms']:.0f}ms ({prefill:.0f}%)\n"
        f"- Decoding: {c['decode_ms']:.0f}ms ({decode:.0f}%)"
    )


def _render_throughput(t: Mapping[str, Any]) -> str:
    if "missing" in t:
        return f"[Profile] Throughput:\n- not measured ({t['missing']})"
    return (f"[Profile] Throughput:\n- Requests: {t['requests_per_s']:.1f} req/s\n"
            f"- Tokens: {t['generation_tokens_per_s']:.0f} tokens/s "
            f"(prompt: {t['prompt_tokens_per_s']:.0f} tokens/s)")  # fmt: skip


def _render_processes(rows: list[dict[str, Any]], memory: Mapping[str, Any]) -> str:
    body = [[r["pid"], r["role"], _gb_or(r["rss_bytes"]), _gb_or(r["gpu_memory_bytes"]),
             f"{100 * r['cpu_share']:.0f}%" if r["cpu_share"] is not None else "n/a",
             r["threads"] if r["threads"] is not None else "n/a"] for r in rows]  # fmt: skip
    kv = memory.get("kv_cache")
    if kv:  # on a CPU host the KV cache lives inside the worker's RSS
        on_gpu = kv.get("share_of") == "gpu"
        size = _gb_or(kv["bytes"])
        body.append(["-", "kv_cache", "-" if on_gpu else f"({size})", size if on_gpu else "-",
                     "-", f"usage {100 * (kv.get('usage') or 0):.1f}%"])  # fmt: skip
    return table(["pid", "role", "rss GB", "gpu GB", "cpu", "threads"], body)


def _main_table(main: Mapping[str, Mapping[str, float]]) -> str:
    known = [ph.value for ph in Phase]
    phases = sorted({p for shares in main.values() for p in shares}, key=known.index)
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


def _serving_reason(s: Mapping[str, Any]) -> str:
    serving = s.get("serving") or {}
    if serving.get("reason"):
        return str(serving["reason"])
    if serving and not serving.get("requests_finished"):
        return "no request finished during the window (was the server idle?)"
    return "vLLM /metrics not read"


def _ms(serving: Mapping[str, Any], name: str) -> dict[str, float | None]:
    return {q: (v * 1000 if (v := serving.get(f"{name}_{q}_s")) is not None else None)
            for q in ("mean", "p50", "p95")}  # fmt: skip


def _sum(values: Any) -> int | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def _gb(n: float | None) -> str:
    return "n/a" if n is None else f"{n / GB:.1f}"


def _gb_or(n: float | None) -> str:
    return "n/a" if n is None else f"{n / GB:.2f}"


def _pct(a: float | None, b: float | None) -> str:
    return "n/a" if not a or not b else f"{100 * a / b:.1f}%"
