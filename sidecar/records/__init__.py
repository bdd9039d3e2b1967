"""Frozen records passed between the pipeline's stages.

sample -> parse -> classify -> aggregate -> snapshot -> writers. Each stage takes and returns these
records; pandas appears only in the writers (docs/STYLE.md, point 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Phase(StrEnum):
    """The fifteen serving phases of docs/PHASES.md (the classifier's contract)."""

    STARTUP = "startup"
    INPUT_PROCESSING = "input_processing"
    SCHEDULING = "scheduling"
    KV_CACHE = "kv_cache"
    PREFILL = "prefill"
    DECODE = "decode"
    FORWARD = "forward"
    ATTENTION = "attention"
    SAMPLING = "sampling"
    OUTPUT_PROCESSING = "output_processing"
    COMMUNICATION = "communication"
    MODEL_WAIT = "model_wait"
    GPU_WAIT = "gpu_wait"
    IDLE = "idle"
    OTHER = "other"


class Stage(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    UNKNOWN = "unknown"


MAIN_THREAD = "MainThread"  # Python's name for a process's first thread, as py-spy reports it


class Role(StrEnum):
    API_SERVER = "api_server"
    ENGINE_CORE = "engine_core"
    WORKER = "worker"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Frame:
    """One stack frame as py-spy (or a dump) names it.

    `file` is the path exactly as the source wrote it: py-spy's short form
    (`vllm/v1/engine/core.py`), a full path, or a native library (`libcudart.so.12`) for
    `--native` frames. Rules match it by path suffix, so both forms work.
    """

    function: str
    file: str = ""
    line: int | None = None
    native: bool = False

    def label(self) -> str:
        if not self.file:
            return self.function
        if self.line is None:
            return f"{self.function} ({self.file})"
        return f"{self.function} ({self.file}:{self.line})"


@dataclass(frozen=True, slots=True)
class StackSample:
    """One stack of one thread, innermost frame first, with how many samples it stands for.

    A dump gives one per thread with weight 1; a `py-spy record -f raw` file gives one per
    distinct stack with its sample count as weight.
    """

    frames: tuple[Frame, ...]
    weight: int = 1
    thread_id: str | None = None
    thread_name: str | None = None
    pid: int | None = None
    process: str | None = None  # the process's command line or title, when the input names it
    idle: bool | None = None  # py-spy's own (idle)/(active) flag; informative (docs/PHASES.md 2)
    source: str | None = None
    # The module whose log lines carried a pasted stack (vLLM's `[core.py:517]` header): the
    # process that logged it, when nothing else names one (sidecar/classify/roles.py).
    logger: str | None = None


@dataclass(frozen=True, slots=True)
class ParseResult:
    """What a parser could read, and what it could not (a garbled input is never a crash)."""

    stacks: tuple[StackSample, ...]
    warnings: tuple[str, ...] = ()
    format: str = "unknown"


@dataclass(frozen=True, slots=True)
class Label:
    """The classifier's verdict on one stack."""

    phase: Phase
    stage: Stage = Stage.UNKNOWN
    role: Role = Role.OTHER
    frame: Frame | None = None  # the frame that decided the phase
    rule: str | None = None  # the name of the rule that decided it


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """One process of a vLLM deployment, identified by PID *and* start time (PIDs are reused)."""

    pid: int
    start_time: int  # clock ticks since boot, field 22 of /proc/PID/stat
    ppid: int
    cmdline: tuple[str, ...]
    title: str  # what `ps` shows: the cmdline joined, or the setproctitle title
    role: Role = Role.OTHER
    nspid: tuple[int, ...] = field(default=())  # the NSpid line of /proc/PID/status

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start_time)
