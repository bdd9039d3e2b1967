"""The named figures the advice rules read, from one snapshot's summary.

Every figure is a number, or None with the reason it is missing (a CPU host has no NVML, a
window where no request finished has no latency). The names are the vocabulary of
`configs/advice.yaml`; `known(name)` checks a name when the rules load.

- `share.<role>.<phase>`: the phase's share of the role's samples, all threads (0..1);
  `main.<role>.<phase>`: the same over the role's main threads (engine loop, model step, event
  loop). Besides the phases: `busy` (1 - idle: working, or waiting on a step in flight),
  `host_work` (1 - idle - model_wait - gpu_wait: CPU work, not waiting on the model), `model`
  (forward + attention + prefill + decode + sampling).
  Measured against /proc (schema 5, sidecar/classify/groundtruth.py), for the role's busiest
  main thread
  that does not spin: `main.<role>.busy_measured`, the larger of `busy` and the thread's own CPU
  share of a core (an event loop working in C, uvloop's socket and HTTP work, looks idle in its
  samples; just `busy` where /proc was not read), and `main.<role>.unseen_cpu`, the CPU share its
  samples cannot show (the thread's `unseen_cpu_share` where the check flagged it `cpu_above`,
  else 0, and 0 where /proc was not read). Both are fractions of the window's time, as shares are.
- `thread.<role>.main_cpu`: that main thread's CPU share of a core from /proc (missing where /proc
  was not read: summaries before schema 5, a replayed window).
- `cpu.<role>`: the role's processes' CPU over the window, in cores (1.0 = one core).
- `serving.<figure>`: vLLM's /metrics over the window (ServingFigures in
  sidecar/records/readings.py), and derived from them: `queue_time_mean_s` (TTFT mean - prefill
  mean: the time before a request was first scheduled), `queue_share_of_ttft`, `prompt_share`
  (prompt / all tokens), `prompt_tokens_per_request`, `generation_tokens_per_request`,
  `prefill_share_of_request` (prefill / (prefill + decode) time per request).
- `step.prefill_share`, `step.decode_share`: the worker's model-step samples by stage (an
  estimate where the stack cannot tell; sidecar/analyze/computation.py).
- `kv.usage` (vLLM's, at the window's end), `kv.bytes`, `kv.tokens` (per worker), `kv.share` (of
  the target's GPU memory, or host memory), `kv.on_gpu` (1 or 0), `kv.budget_bytes` (on GPUs:
  gpu_memory_utilization x the target's GPU memory, vLLM's budget), `kv.share_of_budget`.
- `gpu.count`, `gpu.util_mean`, `gpu.util_min` (0..1, polled through the window),
  `gpu.memory_total_bytes`, `gpu.memory_used_bytes`: NVML, over the target's GPUs.
- `flag.<name>`: a serving flag as given (dashes as underscores; booleans 1/0);
  `gpu_memory_utilization` and `api_server_count` take vLLM's default when not given.
- `host.cpu_cores`: the host's logical CPUs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from sidecar.analyze.computation import step_split
from sidecar.records import MAIN_THREAD, Phase, Role
from sidecar.records.readings import ServingFigures
from sidecar.records.summary import Agreement, SnapshotSummary, ThreadCheck

ROLES = tuple(r.value for r in Role)
PHASES = tuple(p.value for p in Phase)
GROUPS = ("busy", "host_work", "model")
MEASURED = ("busy_measured", "unseen_cpu")  # main.<role>.<these>: samples with /proc's CPU
MODEL_PHASES = ("forward", "attention", "prefill", "decode", "sampling")
WAITS = ("idle", "model_wait", "gpu_wait")
# vLLM's defaults for the flags a rule may need when they were not given (vLLM 0.x, all engines).
FLAG_DEFAULTS = {"gpu_memory_utilization": 0.9, "api_server_count": 1.0}
SERVING = tuple(
    f.name for f in fields(ServingFigures) if f.name not in ("url", "cache_config", "model_name",
                                                            "reason", "missing")
)  # fmt: skip
DERIVED_SERVING = ("queue_time_mean_s", "queue_share_of_ttft", "prompt_share",
                   "prompt_tokens_per_request", "generation_tokens_per_request",
                   "prefill_share_of_request")  # fmt: skip
KV = ("usage", "bytes", "tokens", "share", "on_gpu", "budget_bytes", "share_of_budget")
GPU = ("count", "util_mean", "util_min", "memory_total_bytes", "memory_used_bytes")
STATIC = frozenset(
    [f"serving.{n}" for n in (*SERVING, *DERIVED_SERVING)]
    + [f"cpu.{r}" for r in ROLES]
    + [f"main.{r}.{n}" for r in ROLES for n in MEASURED]
    + [f"thread.{r}.main_cpu" for r in ROLES]
    + ["step.prefill_share", "step.decode_share", "host.cpu_cores"]
    + [f"kv.{n}" for n in KV]
    + [f"gpu.{n}" for n in GPU]
)
_SHARE = re.compile(rf"^(share|main)\.({'|'.join(ROLES)})\.({'|'.join((*PHASES, *GROUPS))})$")
_FLAG = re.compile(r"^flag\.[a-z][a-z0-9_]*$")


def known(name: str) -> bool:
    """Whether NAME is a figure this module can give (its value may still be missing)."""
    return name in STATIC or bool(_SHARE.match(name) or _FLAG.match(name))


@dataclass(frozen=True, slots=True)
class Figures:
    """A snapshot's figures by name; `reasons` says why a name is missing, by its prefix."""

    values: Mapping[str, float]
    reasons: Mapping[str, str]
    flags: Mapping[str, str]  # the serving flags as given (fingerprint), by their vLLM name

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    def why_missing(self, name: str) -> str:
        prefix = name.split(".", 1)[0]
        return self.reasons.get(name) or self.reasons.get(prefix) or "not in this snapshot"


def figures_of(s: SnapshotSummary) -> Figures:
    values: dict[str, float] = {}
    reasons: dict[str, str] = {}
    _shares(s, values, reasons)
    _measured(s, values, reasons)
    _cpu(s, values, reasons)
    _serving(s.serving, values, reasons)
    _kv_and_gpu(s, values, reasons)
    flags = dict(s.fingerprint.serving) if s.fingerprint else {}
    _flags(s, flags, values, reasons)
    _budget(values)
    split = step_split(s)
    if split is not None and split.prefill_share is not None:
        values["step.prefill_share"] = split.prefill_share
        values["step.decode_share"] = 1 - split.prefill_share
    else:
        reasons["step"] = "no model-step samples, or no token counts to split them by"
    if s.fingerprint and s.fingerprint.cpu_cores:
        values["host.cpu_cores"] = float(s.fingerprint.cpu_cores)
    return Figures(values, reasons, flags)


def _shares(s: SnapshotSummary, values: dict[str, float], reasons: dict[str, str]) -> None:
    for prefix, by_role in (("share", s.by_role), ("main", s.main_thread)):
        for role, shares in by_role.items():
            for phase in PHASES:
                values[f"{prefix}.{role}.{phase}"] = shares.get(phase, 0.0)
            values[f"{prefix}.{role}.busy"] = 1 - shares.get("idle", 0.0)
            values[f"{prefix}.{role}.host_work"] = 1 - sum(shares.get(p, 0.0) for p in WAITS)
            values[f"{prefix}.{role}.model"] = sum(shares.get(p, 0.0) for p in MODEL_PHASES)
    reasons["share"] = reasons["main"] = "no samples of that role in this window"


def _measured(s: SnapshotSummary, values: dict[str, float], reasons: dict[str, str]) -> None:
    """The main threads' samples next to their own CPU time (module docstring)."""
    mains: dict[str, ThreadCheck] = {}
    for t in s.threads:
        if t.name != MAIN_THREAD or t.cpu_share is None or t.agreement is Agreement.SPINS:
            continue
        best = mains.get(t.role.value)
        if best is None or t.cpu_share > (best.cpu_share or 0.0):
            mains[t.role.value] = t
    for role in s.main_thread:
        busy = values[f"main.{role}.busy"]
        check = mains.get(role)
        cpu = check.cpu_share if check is not None else None
        values[f"main.{role}.busy_measured"] = busy if cpu is None else max(busy, cpu)
        unseen = check.unseen_cpu_share if check is not None else None
        flagged = check is not None and check.agreement is Agreement.CPU_ABOVE
        values[f"main.{role}.unseen_cpu"] = (unseen or 0.0) if flagged else 0.0
        if cpu is not None:
            values[f"thread.{role}.main_cpu"] = cpu
    reasons["thread"] = ("no /proc reading of its main thread (summaries before schema 5, a "
                         "replayed window, or a thread that spins)")  # fmt: skip


def _cpu(s: SnapshotSummary, values: dict[str, float], reasons: dict[str, str]) -> None:
    for p in s.resources.processes:
        if p.cpu_share is not None:
            key = f"cpu.{p.role}"
            values[key] = values.get(key, 0.0) + p.cpu_share
    reasons["cpu"] = "no CPU reading of that role's processes"


def _serving(v: ServingFigures, values: dict[str, float], reasons: dict[str, str]) -> None:
    for name in SERVING:
        value = getattr(v, name)
        if isinstance(value, int | float):
            values[f"serving.{name}"] = float(value)
    reasons["serving"] = v.reason or (
        "no request finished during the window" if not v.requests_finished else "not reported"
    )
    ttft, prefill, decode = v.ttft_mean_s, v.prefill_time_mean_s, v.decode_time_mean_s
    if ttft is not None and prefill is not None and ttft > 0:
        queue = max(0.0, ttft - prefill)
        values["serving.queue_time_mean_s"] = queue
        values["serving.queue_share_of_ttft"] = queue / ttft
    if prefill is not None and decode is not None and prefill + decode > 0:
        values["serving.prefill_share_of_request"] = prefill / (prefill + decode)
    prompt, generated, done = v.prompt_tokens, v.generation_tokens, v.requests_finished
    if prompt is not None and generated is not None and prompt + generated > 0:
        values["serving.prompt_share"] = prompt / (prompt + generated)
    if done:
        if prompt is not None:
            values["serving.prompt_tokens_per_request"] = prompt / done
        if generated is not None:
            values["serving.generation_tokens_per_request"] = generated / done


def _kv_and_gpu(s: SnapshotSummary, values: dict[str, float], reasons: dict[str, str]) -> None:
    kv, gpu = s.kv_cache, s.gpu
    usage = kv.usage if kv and kv.usage is not None else s.serving.kv_cache_usage
    if usage is not None:
        values["kv.usage"] = usage
    if kv is not None:
        for name, value in (("bytes", kv.bytes), ("tokens", kv.tokens), ("share", kv.share)):
            if value is not None:
                values[f"kv.{name}"] = float(value)
        if kv.share_of is not None:
            values["kv.on_gpu"] = 1.0 if kv.share_of == "gpu" else 0.0
    reasons["kv"] = kv.source if kv else "KV cache not measured (no vLLM /metrics cache config)"
    if not gpu.available:
        reasons["gpu"] = f"no GPU readings ({gpu.reason or 'NVML not available'})"
        return
    labels = set(gpu.target.labels) if gpu.target else {d.label for d in gpu.devices}
    devices = [d for d in gpu.devices if d.label in labels and not d.mig] or [
        d for d in gpu.devices if d.label in labels
    ]
    values["gpu.count"] = float(len(devices))
    totals = [d.memory_total_bytes for d in devices if d.memory_total_bytes is not None]
    used = [d.memory_used_bytes for d in devices if d.memory_used_bytes is not None]
    if totals:
        values["gpu.memory_total_bytes"] = float(sum(totals))
    if used:
        values["gpu.memory_used_bytes"] = float(sum(used))
    means = [u.mean_pct for u in gpu.utilization if u.label in labels and u.mean_pct is not None]
    mins = [u.min_pct for u in gpu.utilization if u.label in labels and u.min_pct is not None]
    if means:
        values["gpu.util_mean"] = sum(means) / len(means) / 100
    if mins:
        values["gpu.util_min"] = min(mins) / 100
    reasons["gpu"] = "NVML did not report it"


def _flags(
    s: SnapshotSummary, flags: Mapping[str, str], values: dict[str, float], reasons: dict[str, str]
) -> None:
    if s.fingerprint is None:
        reasons["flag"] = "no fingerprint (a summary written before schema 3)"
        return
    for flag, text in flags.items():
        number = {"true": 1.0, "false": 0.0}.get(text.lower()) if text else None
        if number is None:
            try:
                number = float(text)
            except ValueError:
                continue
        values[f"flag.{flag.replace('-', '_')}"] = number
    for name, default in FLAG_DEFAULTS.items():
        values.setdefault(f"flag.{name}", default)
    reasons["flag"] = "not given on the command line (vLLM's default applies)"


def _budget(values: dict[str, float]) -> None:
    """vLLM's memory budget on a GPU: gpu_memory_utilization x the GPU's memory, out of which it
    takes the weights, the activations' peak (profiled at start) and CUDA graphs, and gives the
    KV cache everything left (`determine_available_memory`)."""
    total, share = values.get("gpu.memory_total_bytes"), values.get("flag.gpu_memory_utilization")
    if total is not None and share is not None and values.get("kv.on_gpu") == 1.0:
        budget = values["kv.budget_bytes"] = share * total
        if "kv.bytes" in values and budget > 0:
            values["kv.share_of_budget"] = values["kv.bytes"] / budget
