"""The snapshot's summary as typed records: the contract of `summary.json`.

Every reader (report, exporter, and what compares snapshots) takes a `SnapshotSummary`, never a
dict read by string key. On disk the summary is this record as JSON, with `schema` saying which
version of the contract wrote it; `sidecar.store.summary_io` reads every version written so far
(snapshots and baselines are kept for months) and `configs/summary.schema.json` publishes the
current one as JSON Schema.

Versions:
  1  vllm-sidecar 0.1 (2026-11): the same sections, kv_cache without the allocated/budget split.
  2  kv_cache splits allocated bytes from the configured budget and says per GPU or in total;
     gpu names the devices the target uses and the utilisation sampled through the window;
     serving carries the URL it was read from inside the figures.
  3  fingerprint: what the target ran (vLLM, torch, Python, attention backend, driver, GPUs,
     model, performance-shaping serving flags, host CPU, the sidecar and its rules);
     sampling.blocks: role x phase sample counts per py-spy segment, the units the comparison
     of two snapshots (`vllm-sidecar diff`) estimates its intervals from; `deployment`.
     Summaries of 1 and 2 read with no fingerprint and no blocks (a diff then says so).
  4  custom: the operator's own Prometheus series (config `custom_metrics`), each a rate, a
     mean or a last value over the window, or None with the reason. Summaries of 1 to 3 read
     with none (custom = ()).
  5  threads: per sampled thread, the share of its samples outside `idle` next to its own CPU
     time over the window from /proc/PID/task/TID/stat, and whether the two agree within the
     sampling error (sidecar.classify.groundtruth). Summaries of 1 to 4 read with none
     (threads = ()).
  6  sampling.mode, the sidecar's own CPU, each process's requested and achieved rates, and a
     triggered snapshot's `cause`.
  7  sampling.blocks[].parts: each segment's role x phase counts cut into consecutive time
     slices of `sampling.unit_s` seconds (from py-spy's ordered speedscope output), the units
     a comparison of short windows estimates the variance of phase shares from. Summaries of 1
     to 6 read with none (parts = (), unit_s = None): their segments stay the units.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from sidecar.records import Role
from sidecar.records.gpu import GpuDevice, GpuUtilization, TargetGpus
from sidecar.records.readings import (
    CustomMetric,
    HostMemory,
    KvCache,
    ProcessStats,
    ServingFigures,
)

SCHEMA_VERSION = 7


@dataclass(frozen=True, slots=True)
class ProcessEntry:
    """One process of the deployment: PID *and* start time identify it (PIDs are reused)."""

    pid: int
    ppid: int
    start_time: int
    role: Role
    title: str


@dataclass(frozen=True, slots=True)
class TargetSection:
    root_pid: int | None = None
    processes: tuple[ProcessEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class ProcessSampling:
    """How one process was sampled: the rate asked of py-spy against the rate its main thread
    was seen at (one sample per tick: py-spy's own count is per thread), its errors, lateness
    and, where it had a py-spy of its own (continuous mode), that py-spy's CPU."""

    pid: int
    role: Role
    requested_hz: float  # time-weighted over the window; below 1 Hz: 1 Hz for part of it
    achieved_hz: float | None  # main-thread samples per second; None: no main thread seen
    samples: int  # every thread's stacks of this process
    errors: int | None = None  # py-spy's failed samples; None: one py-spy took the whole tree
    cpu_s: float | None = None  # its py-spy's CPU; None: one py-spy took the whole tree
    behind_s: float = 0.0


class CauseKind(StrEnum):
    """What took a snapshot out of schedule; the value is what summary.json holds."""

    SIGNAL = "signal"  # SIGUSR1
    SOCKET = "socket"  # `vllm-sidecar trigger`, over the control socket
    LATENCY = "latency"  # trigger.ttft_p95_s crossed
    QUEUE = "queue"  # trigger.queue_length crossed
    STALL = "stall"  # an engine stalled (hang detection): an incident


@dataclass(frozen=True, slots=True)
class Cause:
    """Why a snapshot was taken out of schedule (schema 6): a signal, `vllm-sidecar trigger`,
    a latency or queue trigger, a stalled engine."""

    kind: CauseKind
    detail: str  # what fired it, in words with its figures
    at: str  # when, UTC ISO 8601


@dataclass(frozen=True, slots=True)
class SampleBlock:
    """One py-spy segment of the window: a contiguous stretch of samples. Consecutive samples of
    a thread are correlated, so the segments (not the samples) are the units a comparison of
    two windows estimates its variance from."""

    duration_s: float
    samples: int  # the stacks counted here (frameless reads excluded)
    counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # role -> phase -> n
    # Over the same stretch (from the previous segment's end, so py-spy's attach is included):
    cpu_s: Mapping[str, float] = field(default_factory=dict)  # role -> CPU seconds, all threads
    generation_tokens: float | None = None  # vLLM's counters' deltas; None: not read
    prompt_tokens: float | None = None
    requests: float | None = None  # finished
    span_s: float | None = None  # the seconds those readings cover
    # Schema 7: `counts` cut into consecutive slices of the window's `unit_s` seconds, in order
    # (their sum is `counts`); empty when py-spy's output kept no order (schema < 7, raw).
    parts: tuple[Mapping[str, Mapping[str, int]], ...] = ()


@dataclass(frozen=True, slots=True)
class SamplingSection:
    """How the window was sampled, and what limits how far its shares can be trusted."""

    rate_hz: float = 0.0
    duration_s: float = 0.0
    samples: int = 0
    errors: int = 0  # py-spy's own count of failed samples
    empty_stacks: int = 0  # frameless reads: counted here, in no phase
    segments: int = 0
    sampler_cpu_s: float = 0.0
    sampler_cpu_share: float | None = None
    behind_s: float = 0.0
    partial: bool = False
    partial_reason: str | None = None
    warnings: tuple[str, ...] = ()
    blocks: tuple[SampleBlock, ...] = ()  # schema 3; empty when read from 1 or 2
    # Schema 6: "continuous" or "windows" (None: written before, always windows); the
    # sidecar's own CPU beside py-spy's (None: not measured before schema 6); each process.
    mode: str | None = None
    self_cpu_s: float | None = None
    processes: tuple[ProcessSampling, ...] = ()
    # Schema 7: the length of the time slices the blocks' `parts` hold (None: no parts).
    unit_s: float | None = None


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What the target ran, read from outside without touching vLLM. None is "could not be
    read"; `notes` says why, per field. Two snapshots whose fingerprints differ ran different
    software, flags or hardware: `diff` reports that before any phase."""

    vllm: str | None = None  # the target's installed distribution (via /proc/PID/root)
    torch: str | None = None
    python: str | None = None  # the target interpreter's version
    attention_backend: str | None = None  # from the stacks (or vLLM's log line, where seen)
    nvidia_driver: str | None = None  # NVML
    cuda: str | None = None  # NVML's CUDA driver version
    gpus: tuple[str, ...] = ()  # the models of the GPUs the target uses
    model: str | None = None
    serving: Mapping[str, str] = field(default_factory=dict)  # flag -> value (performance-shaping)
    cpu_model: str | None = None  # the host's
    cpu_cores: int | None = None  # logical CPUs the host has
    sidecar: str | None = None  # vllm-sidecar's version
    rules: str | None = None  # the rules' version and digest
    notes: Mapping[str, str] = field(default_factory=dict)  # field -> why it is missing


@dataclass(frozen=True, slots=True)
class PhaseCount:
    samples: int = 0
    share: float = 0.0


@dataclass(frozen=True, slots=True)
class OtherFrame:
    frame: str
    samples: int


@dataclass(frozen=True, slots=True)
class ResourcesSection:
    host_memory: HostMemory | None = None
    processes: tuple[ProcessStats, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuSection:
    """NVML's devices at the window's end; `available` False says why there are none."""

    available: bool = False
    reason: str | None = None
    devices: tuple[GpuDevice, ...] = ()
    util_gpu_pct_start: float | None = None  # the target's GPUs' mean, at the window's start
    unsupported: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    target: TargetGpus | None = None  # the GPUs the target uses, and how that was decided
    utilization: tuple[GpuUtilization, ...] = ()  # polled through the window, per GPU


class Agreement(StrEnum):
    """How a thread's samples and its /proc CPU time compare (sidecar.classify.groundtruth)."""

    AGREE = "agree"  # /proc's CPU share lies inside the samples' interval
    CPU_ABOVE = "cpu_above"  # /proc saw more work than the samples show: flagged
    CPU_BELOW = "cpu_below"  # the samples show more work than /proc saw: flagged
    SPINS = "spins"  # waits by spinning (sched_yield): busy on the CPU while idle; not compared
    UNMEASURED = "unmeasured"  # no /proc reading (the thread ended, or was not readable)


@dataclass(frozen=True, slots=True)
class ThreadCheck:
    """One sampled thread: the share of its samples outside `idle` (with its sampling interval)
    next to its own CPU time over the window, measured from /proc."""

    pid: int
    tid: int
    role: Role
    name: str | None  # py-spy's thread name (MainThread, ...), else the kernel's comm
    samples: int  # its stacks with a frame
    failed_reads: int  # its frameless non-blocking reads (in no share)
    busy_samples: int  # samples outside `idle`
    busy_share: float | None  # busy_samples / samples
    busy_low: float | None  # the interval of busy_share (Wilson score, z = 2.576, ~99 %)
    busy_high: float | None
    cpu_s: float | None  # from /proc/PID/task/TID/stat over the window
    cpu_share: float | None  # of one core
    agreement: Agreement = Agreement.UNMEASURED
    reason: str | None = None  # why they disagree, where the stacks tell
    unseen_cpu_share: float | None = None  # /proc's share the samples cannot show (cpu_above)


@dataclass(frozen=True, slots=True)
class SnapshotSummary:
    """Everything `summary.json` holds. Shares are of samples; None is "not measured"."""

    name: str
    created_at: str
    host: str
    schema: int = SCHEMA_VERSION
    kind: str | None = None  # "snapshot" or "baseline" in a daemon's store; None one-shot
    deployment: str | None = None  # which vLLM: its served model and API port ("model@port")
    fingerprint: Fingerprint | None = None  # None: written before schema 3
    target: TargetSection = field(default_factory=TargetSection)
    sampling: SamplingSection = field(default_factory=SamplingSection)
    phases: Mapping[str, PhaseCount] = field(default_factory=dict)
    by_role: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    role_samples: Mapping[str, int] = field(default_factory=dict)
    # The same over each process's main thread: where the engine loop, the model step and the
    # API server's event loop run (helper threads idle by design and dilute the role's shares).
    main_thread: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    stages: Mapping[str, int] = field(default_factory=dict)
    other: Mapping[str, tuple[OtherFrame, ...]] = field(default_factory=dict)
    rules: str = ""
    resources: ResourcesSection = field(default_factory=ResourcesSection)
    gpu: GpuSection = field(default_factory=GpuSection)
    serving: ServingFigures = field(default_factory=ServingFigures)
    kv_cache: KvCache | None = None
    custom: tuple[CustomMetric, ...] = ()  # schema 4; () when none configured or read from 1-3
    threads: tuple[ThreadCheck, ...] = ()  # schema 5; () when read from 1-4
    cause: Cause | None = None  # schema 6: why a snapshot out of schedule was taken; None: on it

    @property
    def samples(self) -> int:
        return sum(p.samples for p in self.phases.values())
