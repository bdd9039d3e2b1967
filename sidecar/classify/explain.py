"""Why a stack got its phase: the rule and frame that decided, and the frames no rule knows.

`explain` groups stacks into distinct ones (same frames, same role), most samples first, and
says for each what `classify` would say plus the evidence. `suggest`
(sidecar/classify/suggest.py) builds on it to propose rules for what lands in `other`. Pure
functions over records: the CLI reads the
files and prints.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar.classify.aggregate import ROLE_ORDER, label_stacks
from sidecar.classify.classifier import STEP_PHASES, Classifier, own_frames
from sidecar.classify.rules import RuleKind, RuleSet
from sidecar.records import Frame, Label, Phase, Role, StackSample, Stage


@dataclass(frozen=True, slots=True)
class ExplainedStack:
    """One distinct stack and the verdict on it, with the evidence."""

    frames: tuple[Frame, ...]  # innermost first
    weight: int  # samples (a dump's thread counts 1)
    role: Role
    phase: Phase
    stage: Stage
    rule: str | None  # the rule that decided; None: no rule, so `other`
    frame: Frame | None  # the frame that decided (or the wait with no context)
    unknown: tuple[Frame, ...]  # the stack's own frames that no rule matches, innermost first
    threads: tuple[str, ...]  # thread ids or names that showed it (dumps; none for snapshots)
    waiting: bool  # a waiting primitive sits below the deciding frame

    @property
    def shown_stage(self) -> str | None:
        return self.stage.value if self.phase in STEP_PHASES else None


def unknown_frames(rules: RuleSet, frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """A stack's own frames (below any fork boundary) that match no rule, innermost first."""
    return tuple(f for f in own_frames(rules, frames) if not rules.candidates(f))


def explain(
    classifier: Classifier,
    stacks: Iterable[StackSample],
    roles: Sequence[Role | None] | None = None,
) -> tuple[ExplainedStack, ...]:
    """The distinct stacks of `stacks`, most samples first.

    `roles` (one per stack, parallel) are roles already known for them, e.g. the role a
    snapshot recorded from the process title; the more specific of it and the stack's own wins.
    """
    stacks = tuple(stacks)
    groups: dict[tuple[tuple[Frame, ...], Role], _Group] = {}
    for i, item in enumerate(label_stacks(classifier, stacks)):
        role = _specific(item.label.role, roles[i] if roles else None)
        group = groups.setdefault((item.stack.frames, role), _Group(item.label))
        group.weight += item.stack.weight
        thread = item.stack.thread_id or item.stack.thread_name
        if thread and thread not in group.threads:
            group.threads.append(thread)
    rules = classifier.rules
    out = [
        ExplainedStack(
            frames=frames,
            weight=g.weight,
            role=role,
            phase=g.label.phase,
            stage=g.label.stage,
            rule=g.label.rule,
            frame=g.label.frame,
            unknown=unknown_frames(rules, frames),
            threads=tuple(g.threads),
            waiting=_waits_below(frames, g.label.frame, rules),
        )
        for (frames, role), g in groups.items()
    ]
    return tuple(sorted(out, key=lambda e: -e.weight))  # stable: input order among equals


@dataclass(slots=True)
class _Group:
    """A distinct stack being gathered: its label (the same for every copy) and its counts."""

    label: Label
    weight: int = 0
    threads: list[str] = field(default_factory=list)


def _specific(a: Role, b: Role | None) -> Role:
    if b is None:
        return a
    return next(r for r in ROLE_ORDER if r in (a, b))


def _waits_below(frames: Sequence[Frame], decided: Frame | None, rules: RuleSet) -> bool:
    """A `wait` rule matches a frame leaf-ward of the deciding one (or anywhere, if none)."""
    for frame in frames:
        if decided is not None and frame == decided:
            return False
        if any(rule.kind is RuleKind.WAIT for rule, _ in rules.candidates(frame)):
            return True
    return False


# ------------------------------------------------------------------------------ rendering


def as_json(explained: Sequence[ExplainedStack], total: int | None = None) -> list[dict[str, Any]]:
    total = total or sum(e.weight for e in explained) or 1
    return [
        {
            "weight": e.weight,
            "share": round(e.weight / total, 6),
            "role": e.role.value,
            "phase": e.phase.value,
            "stage": e.shown_stage,
            "rule": e.rule,
            "frame": e.frame.label() if e.frame else None,
            "unknown_frames": [f.label() for f in e.unknown],
            "threads": list(e.threads),
            "frames": [f.label() for f in e.frames],
        }
        for e in explained
    ]


def as_text(explained: Sequence[ExplainedStack], limit: int | None = None) -> str:
    """One block per distinct stack: verdict, deciding rule and frame, unknown frames."""
    total = sum(e.weight for e in explained) or 1
    lines = []
    shown = explained if limit is None else explained[:limit]
    for n, e in enumerate(shown, 1):
        stage = f" ({e.shown_stage})" if e.shown_stage and e.shown_stage != "unknown" else ""
        threads = f"  threads {', '.join(e.threads)}" if e.threads else ""
        lines.append(
            f"#{n}  {e.weight} samples ({100 * e.weight / total:.1f}%)  {e.role.value}  "
            f"{e.phase.value}{stage}{threads}"
        )
        lines.append(f"    rule:  {e.rule or '(none: no rule matched a frame)'}")
        lines.append(f"    frame: {e.frame.label() if e.frame else '-'}")
        if e.unknown:
            lines.append(f"    no rule knows ({len(e.unknown)}, innermost first):")
            lines.extend(f"      {f.label()}" for f in e.unknown[:8])
            if len(e.unknown) > 8:
                lines.append(f"      ... and {len(e.unknown) - 8} more")
        lines.append("")
    if limit is not None and len(explained) > limit:
        lines.append(f"... and {len(explained) - limit} more distinct stacks (--limit 0: all)")
    return "\n".join(lines).rstrip() + "\n"


# ------------------------------------------------------------------------------ input


def as_document(
    explained: Sequence[ExplainedStack], rules: str, warnings: Sequence[str]
) -> dict[str, Any]:
    """`classify --explain --json`: the rules' fingerprint, the samples, the stacks, warnings."""
    return {"rules": rules, "samples": sum(e.weight for e in explained),
            "stacks": as_json(explained), "warnings": list(warnings)}  # fmt: skip
