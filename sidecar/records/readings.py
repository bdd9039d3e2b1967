"""What the readers saw over a window, as frozen records: processes (psutil), the host's memory,
and vLLM's own serving figures (/metrics). The adapters that produce them live in
`sidecar.target.resources` and `sidecar.vllm_metrics`; these records import neither."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ProcessStats:
    pid: int
    role: str
    rss_bytes: int | None
    cpu_s: float | None  # user + system over the window, all threads
    cpu_share: float | None  # of one core, over the window
    threads: int | None


@dataclass(frozen=True, slots=True)
class ThreadTime:
    """One thread's CPU time so far, as `/proc/PID/task/TID/stat` gives it at one moment."""

    pid: int
    tid: int
    comm: str  # the thread's name as the kernel keeps it (15 bytes)
    state: str  # R, S, D, ...
    cpu_s: float  # utime + stime
    resolution_s: float  # one clock tick: the finest step cpu_s moves by


@dataclass(frozen=True, slots=True)
class ThreadCpu:
    """One thread's own CPU seconds over a window: the difference of two `ThreadTime`s (a
    thread born inside the window counts from zero)."""

    pid: int
    tid: int
    comm: str
    cpu_s: float
    span_s: float  # the seconds between the two reads
    resolution_s: float

    @property
    def share(self) -> float | None:
        """Of one core, over the span."""
        return self.cpu_s / self.span_s if self.span_s > 0 else None


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
    """The KV cache of one engine, per GPU (per worker) and over all of them.

    `bytes` is the headline: `allocated_bytes` when the blocks could be counted in bytes, else
    the budget over all workers when nothing overrode the blocks (then the blocks fill it),
    else None. `workers` = tensor x pipeline parallel: the GPUs (CPU workers on a CPU host)
    that each hold `num_blocks` blocks. `share` is `bytes` over the memory of the devices in
    `share_devices` (the GPUs the target uses, or `host`).
    """

    bytes: int | None
    source: str  # how `bytes` was found, so a reader can judge it
    share: float | None
    share_of: str | None  # "gpu" or "host"
    block_size: int | None = None
    num_blocks: int | None = None  # per worker
    usage: float | None = None  # vLLM's kv_cache_usage_perc at the window's end
    tokens: int | None = None  # per worker: num_blocks x block_size
    bytes_per_token: int | None = None  # per worker
    allocated_bytes_per_gpu: int | None = None
    allocated_bytes: int | None = None  # all workers together
    budget_bytes_per_gpu: int | None = None  # kv_cache_memory_bytes / cpu_kvcache_space_bytes
    budget_bytes: int | None = None  # all workers together
    budget_source: str | None = None
    blocks_overridden: bool = False  # num_gpu_blocks_override was set
    workers: int = 1
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    dtype: str | None = None
    layout: str | None = None
    share_devices: tuple[str, ...] = ()
    caveats: tuple[str, ...] = ()

    @property
    def budget_differs(self) -> bool:
        """Whether the budget and the allocation differ by a block or more (so show both)."""
        if self.budget_bytes_per_gpu is None or self.allocated_bytes_per_gpu is None:
            return False
        block = (self.block_size or 1) * (self.bytes_per_token or 1)
        return abs(self.budget_bytes_per_gpu - self.allocated_bytes_per_gpu) >= block


@dataclass(frozen=True, slots=True)
class CustomMetric:
    """One operator-listed Prometheus series over the window (config `custom_metrics`).

    `kind` says what `value` is: "rate" (a counter's increase per second between the window's
    first and last scrape of `source`), "mean" (a gauge averaged over the window's scrapes, or
    a histogram's or summary's mean observation: sum over count of the window's deltas) or
    "last" (the value at the window's last scrape). `value` None: `reason` says why (a URL that
    failed, a family not found, no series matching `labels`). `how` says which scrapes made it.
    """

    name: str  # the operator's name for it, shown everywhere
    kind: str  # "rate" | "mean" | "last"
    value: float | None
    reason: str | None = None
    unit: str | None = None  # e.g. "/s", "s", "B"; None: not known
    source: str | None = None  # the URL scraped
    metric: str = ""  # the Prometheus family name
    type: str | None = None  # the family's type as read or configured (counter, gauge, ...)
    labels: Mapping[str, str] = field(default_factory=dict)  # the label match (all given)
    series: int = 0  # label sets matched and summed
    samples: int = 0  # the scrapes the value was computed from
    window_s: float | None = None  # between the first and last of them
    how: str | None = None
