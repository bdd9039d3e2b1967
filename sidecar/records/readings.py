"""What the readers saw over a window, as frozen records: processes (psutil), the host's memory,
and vLLM's own serving figures (/metrics). The adapters that produce them live in
`sidecar.resources` and `sidecar.vllm_metrics`; these records import neither."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProcessStats:
    pid: int
    role: str
    rss_bytes: int | None
    cpu_s: float | None  # user + system over the window, all threads
    cpu_share: float | None  # of one core, over the window
    threads: int | None


@dataclass(frozen=True, slots=True)
class HostMemory:
    total_bytes: int
    available_bytes: int
    used_bytes: int


@dataclass(frozen=True, slots=True)
class ServingFigures:
    """What vLLM says it did over a window. Every figure is None when it cannot be known;
    `reason` says why window figures are missing, `missing` names absent metrics."""

    url: str | None = None  # the /metrics they were read from
    window_s: float | None = None
    requests_finished: float | None = None  # deltas over the window
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    requests_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    prefill_time_mean_s: float | None = None  # per request
    decode_time_mean_s: float | None = None
    ttft_mean_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    itl_mean_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    preemptions: float | None = None
    kv_cache_usage: float | None = None  # latest, 1.0 = full
    requests_running: float | None = None
    requests_waiting: float | None = None
    cache_config: dict[str, str] | None = None  # vllm:cache_config_info labels; read-only
    model_name: str | None = None
    reason: str | None = None
    missing: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class KvCache:
    bytes: int | None
    source: str  # which figure it came from, so a reader can judge it
    share: float | None  # of GPU memory (GPU hosts) or of host memory (CPU hosts)
    share_of: str | None  # "gpu" or "host"
    block_size: int | None = None
    num_blocks: int | None = None
    usage: float | None = None  # vLLM's kv_cache_usage_perc at the window's end
