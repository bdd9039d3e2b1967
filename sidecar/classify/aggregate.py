"""Labelled stacks -> phase shares per role and stage counts. Pure functions over records."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from sidecar.classify.classifier import STEP_PHASES, Classifier
from sidecar.records import MAIN_THREAD, Label, Phase, Role, StackSample, Stage
from sidecar.records.summary import OtherFrame, PhaseCount

# When a process's threads disagree, the most specific role wins (PHASES.md, Roles).
ROLE_ORDER = (Role.WORKER, Role.ENGINE_CORE, Role.API_SERVER, Role.OTHER)


@dataclass(frozen=True, slots=True)
class LabelledStack:
    stack: StackSample
    label: Label


@dataclass(frozen=True, slots=True)
class PhaseSummary:
    samples: int
    phases: Mapping[str, PhaseCount]  # every phase, with its samples and share of all
    by_role: Mapping[str, Mapping[str, float]]  # role -> phase -> share of that role's samples
    role_samples: Mapping[str, int]
    # The same over each process's main thread only: where the engine loop, the worker's model
    # step and the API server's event loop run. Helper threads (monitors, pools) idle by design
    # and would otherwise dilute every role's shares by their number.
    main_thread: Mapping[str, Mapping[str, float]]
    stages: Mapping[str, int]  # prefill / decode / unknown samples over model-step phases
    other_frames: Mapping[str, tuple[OtherFrame, ...]]  # role -> what `other` holds, top frames


def label_stacks(
    classifier: Classifier,
    stacks: Iterable[StackSample],
    roles_by_pid: Mapping[int, Role] | None = None,
) -> tuple[LabelledStack, ...]:
    """Classify each stack, then give every thread of a process the process's role.

    A process is its pid; a pasted dump that names none (no `Process PID:` line, no
    `(Name pid=N)` tag) is one process per source and process name, as one `py-spy dump` or
    faulthandler dump is one process's threads."""
    labelled = [LabelledStack(s, classifier.classify(s)) for s in stacks]
    roles: dict[ProcessKey, Role] = {pid: role for pid, role in (roles_by_pid or {}).items()}
    for key, role in _roles_from_stacks(labelled).items():
        if roles.get(key, Role.OTHER) is Role.OTHER:
            roles[key] = role
    return tuple(
        LabelledStack(ls.stack, replace(ls.label, role=roles[_process_key(ls.stack)]))
        if _process_key(ls.stack) in roles
        else ls
        for ls in labelled
    )


ProcessKey = int | tuple[str | None, str | None]


def _process_key(stack: StackSample) -> ProcessKey:
    return stack.pid if stack.pid is not None else (stack.source, stack.process)


def _roles_from_stacks(labelled: Iterable[LabelledStack]) -> dict[ProcessKey, Role]:
    seen: dict[ProcessKey, set[Role]] = defaultdict(set)
    for ls in labelled:
        seen[_process_key(ls.stack)].add(ls.label.role)
    return {key: next(r for r in ROLE_ORDER if r in found) for key, found in seen.items()}


def summarize(labelled: Iterable[LabelledStack], top_other: int = 5) -> PhaseSummary:
    phase_n: Counter[str] = Counter()
    role_phase: dict[str, Counter[str]] = defaultdict(Counter)
    main_phase: dict[str, Counter[str]] = defaultdict(Counter)
    stages: Counter[str] = Counter({s.value: 0 for s in Stage})
    other: dict[str, Counter[str]] = defaultdict(Counter)
    for ls in labelled:
        n, label = ls.stack.weight, ls.label
        phase_n[label.phase.value] += n
        role_phase[label.role.value][label.phase.value] += n
        if ls.stack.thread_name == MAIN_THREAD:
            main_phase[label.role.value][label.phase.value] += n
        if label.phase in STEP_PHASES:
            stages[label.stage.value] += n
        if label.phase is Phase.OTHER:
            other[label.role.value][_leaf(ls.stack)] += n
    total = sum(phase_n.values())
    return PhaseSummary(
        samples=total,
        phases={p.value: _entry(phase_n[p.value], total) for p in Phase},
        by_role={r: _shares(c) for r, c in sorted(role_phase.items())},
        role_samples={r: sum(c.values()) for r, c in sorted(role_phase.items())},
        main_thread={r: _shares(c) for r, c in sorted(main_phase.items())},
        stages=dict(stages),
        other_frames={
            r: tuple(OtherFrame(f, n) for f, n in c.most_common(top_other))
            for r, c in sorted(other.items())
        },
    )


def _entry(n: int, total: int) -> PhaseCount:
    return PhaseCount(samples=n, share=round(n / total, 4) if total else 0.0)


def _shares(counter: Counter[str]) -> dict[str, float]:
    total = sum(counter.values())
    return {p: round(n / total, 4) for p, n in counter.most_common()} if total else {}


def _leaf(stack: StackSample) -> str:
    return stack.frames[0].label() if stack.frames else "(empty stack)"
