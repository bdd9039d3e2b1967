"""The report's sections as frozen records, built once from the summary (sidecar/report/build.py).

`--format json` is `to_jsonable(ReportView)`; the text (sidecar/report/text.py) and the HTML page
(sidecar/report/page.py) read the same records' attributes, so mypy checks that the three agree.

The JSON keeps the shape the report had when it was a dict: the same keys in the same order, and
a key that some branches leave out stays out rather than turning null. Two field markers say how:
a part whose keys vary by branch is a union of variant records spliced into its parent
(`INLINE`: the variant's keys take the field's place), and `OMIT_NONE` leaves a key out when it
is None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from sidecar.advice.findings import Finding, Unevaluated
from sidecar.records import Role
from sidecar.records.readings import CustomMetric, KvCache
from sidecar.records.summary import Fingerprint, ThreadCheck

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_JSON = "json"
INLINE: Final = MappingProxyType({_JSON: "inline"})  # a record's keys spliced into its parent
OMIT_NONE: Final = MappingProxyType({_JSON: "omit_if_none"})  # no key at all when None


@dataclass(frozen=True, slots=True)
class NotMeasured:
    """A section, or a part of one, the snapshot holds no figures for: why."""

    missing: str


class Device(StrEnum):
    """Whose memory the report's memory line shows."""

    GPU = "gpu"
    HOST = "host"


# ---------------------------------------------------------------------------------- memory


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """The target's GPUs (or, in schema 1 or where none could be told the target's, all of the
    host's): `gpus`, the lines under the GPU line, one per GPU, or the caveats."""

    used_bytes: int | None
    total_bytes: int | None
    devices: int
    gpus: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OneGpuMemory:
    """The host's one GPU, the target's: its utilisation goes on the GPU line itself (`util`
    None: not polled), and `gpus` holds only the attribution's caveats."""

    used_bytes: int | None
    total_bytes: int | None
    devices: int
    util: str | None
    gpus: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class HostOnlyMemory:
    """No GPU reading: the host's memory instead, and `note` says why there is no GPU's."""

    used_bytes: int
    total_bytes: int
    note: str


MemoryReading = GpuMemory | OneGpuMemory | HostOnlyMemory | NotMeasured


@dataclass(frozen=True, slots=True)
class MemoryView:
    """`kv_cache` None: not measured, and `kv_cache_missing` says why."""

    device: Device
    reading: MemoryReading = field(metadata=INLINE)
    kv_cache: KvCache | None
    kv_cache_missing: str | None = field(default=None, metadata=OMIT_NONE)

    @property
    def gpu_lines(self) -> tuple[str, ...]:
        """The lines under the GPU line (none without a GPU reading)."""
        reading = self.reading
        return reading.gpus if isinstance(reading, GpuMemory | OneGpuMemory) else ()


# ----------------------------------------------------------------------------- computation


@dataclass(frozen=True, slots=True)
class Latency:
    """In milliseconds; None: not in the scrape."""

    mean: float | None
    p50: float | None
    p95: float | None


@dataclass(frozen=True, slots=True)
class PerRequest:
    """vLLM's own wall time per request, mean over the window (sidecar/analyze/computation.py)."""

    source: str
    answers: str  # the question this figure answers
    prefill_ms: float
    decode_ms: float
    prefill_share: float | None
    decode_share: float | None
    ttft_ms: Latency
    itl_ms: Latency


@dataclass(frozen=True, slots=True)
class ModelSteps:
    """The worker's model-step samples split by stage; `estimated`: unknown-stage samples were
    apportioned by token counts (`how` says so)."""

    prefill_share: float | None
    decode_share: float | None
    samples: int
    estimated: bool
    how: str
    answers: str


@dataclass(frozen=True, slots=True)
class ComputationView:
    per_request: PerRequest | NotMeasured = field(metadata=INLINE)
    model_steps: ModelSteps | NotMeasured


# ------------------------------------------------------------------------ the other sections


@dataclass(frozen=True, slots=True)
class ThroughputView:
    requests_per_s: float
    prompt_tokens_per_s: float | None
    generation_tokens_per_s: float | None
    requests_running: float | None
    requests_waiting: float | None
    preemptions: float | None
    kv_cache_usage: float | None


@dataclass(frozen=True, slots=True)
class FindingsView:
    """The advice rules' verdicts: `rules` evaluated from `source`, the findings that fired and
    the rules that could not be decided."""

    rules: int
    source: str
    findings: tuple[Finding, ...]
    not_evaluated: tuple[Unevaluated, ...]


@dataclass(frozen=True, slots=True)
class SoftwareView:
    """The fingerprint as recorded (None fields: could not be read, its `notes` say why)."""

    deployment: str | None
    recorded: Fingerprint | NotMeasured = field(metadata=INLINE)


@dataclass(frozen=True, slots=True)
class PhasesView:
    by_role: Mapping[str, Mapping[str, float]]
    main_thread: Mapping[str, Mapping[str, float]]


@dataclass(frozen=True, slots=True)
class StageEstimate:
    """Unknown-stage model time apportioned by token counts, in samples."""

    prefill: float
    decode: float
    how: str


@dataclass(frozen=True, slots=True)
class StagesView:
    samples: Mapping[str, int]
    estimate: StageEstimate | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True)
class ProcessRow:
    """One process of the target; None: not measured."""

    pid: int
    role: Role
    rss_bytes: int | None
    cpu_share: float | None
    threads: int | None
    gpu_memory_bytes: int | None


@dataclass(frozen=True, slots=True)
class ThreadsView:
    """Sampled threads against /proc: how many per agreement, the flagged ones, and `how`."""

    counts: Mapping[str, int]
    flagged: tuple[ThreadCheck, ...]
    how: str


@dataclass(frozen=True, slots=True)
class HeaderView:
    """Which snapshot the report is of, and how it was taken: the text report's first lines.
    `source`: the snapshot folder chosen when the report was pointed at an output, host or
    deployment folder (its latest snapshot); None when pointed at the snapshot itself."""

    kind: str  # snapshot, baseline, incident; "one-shot" for `vllm-sidecar snapshot`'s
    host: str
    deployment: str | None
    started: str  # the window's start, UTC (summary.json's created_at)
    duration_s: float
    rate_hz: float
    mode: str  # continuous or windows (windows before schema 6)
    cause: str | None = field(default=None, metadata=OMIT_NONE)  # why out of schedule
    source: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True)
class ReportView:
    """The whole report, in the order `--format json` prints it."""

    snapshot: str
    schema: int
    header: HeaderView
    memory: MemoryView
    computation: ComputationView
    throughput: ThroughputView | NotMeasured
    findings: FindingsView
    custom: tuple[CustomMetric, ...]
    software: SoftwareView
    phases: PhasesView
    stages: StagesView
    processes: tuple[ProcessRow, ...]
    threads: ThreadsView | NotMeasured
    caveats: tuple[str, ...]


# ------------------------------------------------------------------------------------ JSON


def to_jsonable(value: object) -> Any:
    """A view (or any record) as JSON-ready values: records as objects in field order with the
    markers applied, mappings with string keys, tuples as lists, enums by value."""
    if is_dataclass(value) and not isinstance(value, type):
        return _record(value)
    if isinstance(value, Mapping):
        return {str(to_jsonable(k)): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return getattr(value, "value", value)  # an enum's value; anything else as it is


def _record(record: DataclassInstance) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        marker = f.metadata.get(_JSON)
        if marker == INLINE[_JSON]:
            out.update(_record(value))
        elif value is not None or marker != OMIT_NONE[_JSON]:
            out[f.name] = to_jsonable(value)
    return out
