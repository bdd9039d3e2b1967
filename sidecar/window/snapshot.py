"""One snapshot: a sampled window, its labelled stacks and their summary, as a frozen record."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from sidecar.classify.aggregate import LabelledStack, PhaseSummary, label_stacks, summarize
from sidecar.classify.classifier import STEP_PHASES, Classifier
from sidecar.classify.groundtruth import thread_checks
from sidecar.classify.rules import WaitFrames
from sidecar.gpu import GpuFigures, GpuReading
from sidecar.records import Label, ProcessInfo, Role, StackSample
from sidecar.records.readings import (
    CustomMetric,
    HostMemory,
    KvCache,
    ProcessStats,
    ServingFigures,
    ThreadCpu,
)
from sidecar.records.summary import (
    Cause,
    Fingerprint,
    GpuSection,
    ProcessEntry,
    ProcessSampling,
    ResourcesSection,
    SampleBlock,
    SamplingSection,
    SnapshotSummary,
    TargetSection,
)
from sidecar.records.window import LapReading, Window


@dataclass(frozen=True, slots=True)
class Readings:
    """Everything a window reads beside the stacks; each part None when it could not be read."""

    process_stats: tuple[ProcessStats, ...] = ()
    host_memory: HostMemory | None = None
    gpu: GpuReading | None = None
    gpu_figures: GpuFigures | None = None  # the target's GPUs, utilisation through the window
    gpu_util_start: float | None = None
    serving: ServingFigures | None = None
    kv_cache: KvCache | None = None
    custom: tuple[CustomMetric, ...] = ()  # the config's custom_metrics, in its order
    thread_cpu: tuple[ThreadCpu, ...] = ()  # each target thread's CPU over the window (/proc)

    def with_kv_cache(self, kv: KvCache | None) -> Readings:
        return replace(self, kv_cache=kv)


@dataclass(frozen=True, slots=True)
class Snapshot:
    name: str  # UTC timestamp, also the folder name: sorts in time order
    created_at: str
    host: str
    processes: tuple[ProcessInfo, ...]
    window: Window
    labelled: tuple[LabelledStack, ...]
    phase_summary: PhaseSummary
    rules_source: str
    readings: Readings = field(default_factory=Readings)
    wait_frames: WaitFrames = field(default_factory=WaitFrames)  # the rules' `ground_truth:`
    deployment: str | None = None
    fingerprint: Fingerprint | None = None
    cause: Cause | None = None  # why it was taken out of schedule; None: on it

    def summary(self, kind: str | None = None) -> SnapshotSummary:
        """The typed summary: what summary.json holds, and what every reader takes."""
        w, s = self.window, self.phase_summary
        return SnapshotSummary(
            name=self.name,
            created_at=self.created_at,
            host=self.host,
            kind=kind,
            deployment=self.deployment,
            fingerprint=self.fingerprint,
            target=TargetSection(
                root_pid=self.processes[0].pid if self.processes else None,
                processes=tuple(_process_entry(p) for p in self.processes),
            ),
            sampling=_sampling(w, self.labelled, self.processes),
            phases=s.phases,
            by_role=s.by_role,
            role_samples=s.role_samples,
            main_thread=s.main_thread,
            stages=s.stages,
            other=s.other_frames,
            rules=self.rules_source,
            resources=ResourcesSection(self.readings.host_memory, self.readings.process_stats),
            gpu=_gpu_section(self.readings),
            serving=self.readings.serving or ServingFigures(reason="vLLM /metrics not read"),
            kv_cache=self.readings.kv_cache,
            custom=self.readings.custom,
            threads=thread_checks(
                self.labelled, self.window.stacks, self.readings.thread_cpu, self.wait_frames
            ),
            cause=self.cause,
        )

    def stack_rows(self, kind: str | None = None) -> list[dict[str, Any]]:
        where = {"host": self.host, "deployment": self.deployment, "snapshot": self.name,
                 "time": self.created_at, "kind": kind or "snapshot"}  # fmt: skip
        return [where | _stack_row(ls) for ls in self.labelled]


def build_snapshot(
    window: Window,
    processes: tuple[ProcessInfo, ...],
    classifier: Classifier,
    host: str | None = None,
    readings: Readings | None = None,
    deployment: str | None = None,
    fingerprint: Fingerprint | None = None,
) -> Snapshot:
    roles: Mapping[int, Role] = {p.pid: p.role for p in processes if p.role is not Role.OTHER}
    # A stack without a single frame is py-spy's non-blocking read catching a thread between
    # frames: it says nothing about the phase, so it is counted as a failed read, not `other`.
    labelled = label_stacks(classifier, (s for s in window.stacks if s.frames), roles)
    started = datetime.fromtimestamp(window.started_at, tz=UTC)
    return Snapshot(
        name=started.strftime("%Y%m%dT%H%M%SZ"),
        created_at=started.isoformat(timespec="seconds"),
        host=host or socket.gethostname(),
        processes=processes,
        window=window,
        labelled=labelled,
        phase_summary=summarize(labelled),
        rules_source=classifier.rules.source,
        wait_frames=classifier.rules.ground_truth,
        readings=readings or Readings(),
        deployment=deployment,
        fingerprint=fingerprint,
    )


def _sampling(
    w: Window, labelled: tuple[LabelledStack, ...], processes: tuple[ProcessInfo, ...]
) -> SamplingSection:
    return SamplingSection(
        rate_hz=round(w.rate_hz, 3),
        duration_s=round(w.duration_s, 3),
        samples=w.samples,
        errors=w.errors,
        empty_stacks=sum(st.weight for st in w.stacks if not st.frames),
        segments=w.segments,
        sampler_cpu_s=round(w.sampler_cpu_s, 4),
        sampler_cpu_share=round(w.sampler_cpu_s / w.duration_s, 5) if w.duration_s else None,
        behind_s=round(w.behind_s, 3),
        partial=w.partial,
        partial_reason=w.partial_reason,
        warnings=w.warnings,
        blocks=_blocks(w, labelled),
        mode=w.mode.value,
        self_cpu_s=round(w.self_cpu_s, 4),
        processes=process_sampling(w, processes),
        unit_s=w.unit_s,
    )


def process_sampling(w: Window, processes: tuple[ProcessInfo, ...]) -> tuple[ProcessSampling, ...]:
    """Each sampled process: the rate asked against the rate its main thread was seen at (py-spy
    takes every thread at each tick; the main thread's TID is the PID), errors, lateness, CPU."""
    main: dict[int, int] = {}
    every: dict[int, int] = {}
    for s in w.stacks:
        if s.pid is None:
            continue
        every[s.pid] = every.get(s.pid, 0) + s.weight
        if s.thread_id == str(s.pid):
            main[s.pid] = main.get(s.pid, 0) + s.weight
    own = {o.pid: o for o in w.per_process}
    out = []
    for p in processes:
        o = own.get(p.pid)
        if o is None and (w.per_process or p.pid not in every):
            continue  # not sampled (continuous mode leaves `other` processes out)
        wall = o.wall_s if o is not None else w.duration_s
        seen = main.get(p.pid)
        out.append(ProcessSampling(
            pid=p.pid, role=p.role,
            requested_hz=round(o.requested_hz if o is not None else w.rate_hz, 3),
            achieved_hz=round(seen / wall, 3) if seen and wall > 0 else None,
            samples=every.get(p.pid, 0),
            errors=o.errors if o is not None else None,
            cpu_s=round(o.cpu_s, 4) if o is not None else None,
            behind_s=round(o.behind_s if o is not None else w.behind_s, 3),
        ))  # fmt: skip
    return tuple(out)


def _blocks(w: Window, labelled: tuple[LabelledStack, ...]) -> tuple[SampleBlock, ...]:
    """Each segment's counts by role and phase, with the labels the window's stacks got."""
    labels = {replace(ls.stack, weight=1): ls.label for ls in labelled}
    out = []
    for segment in w.blocks:
        counts = _by_phase(segment.counts, labels)
        total = sum(sum(c.values()) for c in counts.values())
        block = SampleBlock(round(segment.wall_s, 3), total, counts,
                            parts=tuple(_by_phase(p, labels) for p in segment.parts))  # fmt: skip
        out.append(_with_reading(block, segment.reading))
    return tuple(out)


def _by_phase(
    part: Mapping[StackSample, int], labels: Mapping[StackSample, Label]
) -> dict[str, dict[str, int]]:
    """One time slice's samples by role and phase (frameless reads in none)."""
    counts: dict[str, dict[str, int]] = {}
    for stack, n in part.items():
        if (label := labels.get(stack)) is not None:
            by_phase = counts.setdefault(label.role.value, {})
            by_phase[label.phase.value] = by_phase.get(label.phase.value, 0) + n
    return counts


def _with_reading(block: SampleBlock, r: LapReading | None) -> SampleBlock:
    """The block with what the segment's lap read (CPU per role, vLLM's counters, their span)."""
    if r is None:
        return block
    cpu = {role.value: round(v, 4) for role, v in r.cpu_s.items()}
    return replace(block, cpu_s=cpu, generation_tokens=r.generation_tokens,
                   prompt_tokens=r.prompt_tokens, requests=r.requests,
                   span_s=round(r.span_s, 3))  # fmt: skip


def _gpu_section(r: Readings) -> GpuSection:
    if r.gpu is None:
        return GpuSection(available=False, reason="GPU readings disabled")
    g, figures = r.gpu, r.gpu_figures
    return GpuSection(available=g.available, reason=g.reason, devices=g.devices,
                      util_gpu_pct_start=r.gpu_util_start, unsupported=g.unsupported,
                      errors=g.errors, target=figures.target if figures else None,
                      utilization=figures.utilization if figures else ())  # fmt: skip


def _process_entry(p: ProcessInfo) -> ProcessEntry:
    return ProcessEntry(pid=p.pid, ppid=p.ppid, start_time=p.start_time, role=p.role,
                        title=p.title)  # fmt: skip


def _stack_row(ls: LabelledStack) -> dict[str, Any]:
    st, lb = ls.stack, ls.label
    return {
        "pid": st.pid,
        "role": lb.role.value,
        "thread_id": st.thread_id,
        "thread_name": st.thread_name,
        "phase": lb.phase.value,
        "stage": lb.stage.value if lb.phase in STEP_PHASES else None,
        "weight": st.weight,
        "frame": lb.frame.label() if lb.frame else None,
        "rule": lb.rule,
        "stack": ";".join(f.label() for f in reversed(st.frames)),
    }
