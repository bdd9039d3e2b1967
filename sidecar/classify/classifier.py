"""Stack -> (role, phase, stage): a pure function of the stack and the rule set, memoised.

The walk is the one docs/PHASES.md ("How to decide") describes; the rules file says which
frames mean what. The classifier knows no vLLM function name itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sidecar.classify.roles import LOGGER_ROLES, title_role
from sidecar.classify.rules import FrameSpec, Rule, RuleKind, RuleSet
from sidecar.records import Frame, Label, Phase, Role, StackSample, Stage

# Phases that belong to a model step; only these carry a stage (prefill / decode / unknown).
STEP_PHASES = frozenset(
    {Phase.PREFILL, Phase.DECODE, Phase.FORWARD, Phase.ATTENTION, Phase.SAMPLING}
)
_CACHE_LIMIT = 200_000
MOST_SPECIFIC_FIRST = (Role.WORKER, Role.ENGINE_CORE, Role.API_SERVER)


@dataclass
class Classifier:
    """Classifies stacks with one rule set; the cache is keyed by (frames, process title)."""

    rules: RuleSet
    _cache: dict[tuple[tuple[Frame, ...], str | None, str | None], Label] = field(
        default_factory=dict
    )

    def classify(self, stack: StackSample, title: str | None = None) -> Label:
        key = (stack.frames, title if title is not None else stack.process, stack.logger)
        label = self._cache.get(key)
        if label is None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()  # bounded memory: distinct stacks only, never run time
            hint = LOGGER_ROLES.get(stack.logger) if stack.logger else None
            label = classify_frames(self.rules, stack.frames, key[1], hint)
            self._cache[key] = label
        return label


def classify_frames(
    rules: RuleSet, frames: Sequence[Frame], title: str | None = None, hint: Role | None = None
) -> Label:
    """`hint`: a role named by weaker evidence (the module that logged a pasted traceback),
    taken only where neither the title nor a stack marker names one."""
    role = role_of(rules, frames, title)
    if role is Role.OTHER and hint is not None:
        role = hint
    own = own_frames(rules, frames)
    walk = _Walk(rules, own)
    decided = walk.anywhere() or walk.innermost()
    if decided is None:
        phase = Phase.IDLE if walk.waiting else Phase.OTHER
        frame = walk.wait_frame
        rule_name = "wait-without-context" if walk.waiting else None
        stage = None
    else:
        phase, stage, frame, rule_name = decided
    stage = stage or walk.stage_marker()
    return _finish(phase, stage, role, frame, rule_name)


def _finish(
    phase: Phase, stage: Stage | None, role: Role, frame: Frame | None, rule: str | None
) -> Label:
    if phase is Phase.FORWARD and stage in (Stage.PREFILL, Stage.DECODE):
        phase = Phase.PREFILL if stage is Stage.PREFILL else Phase.DECODE
    if phase is Phase.PREFILL:
        stage = Stage.PREFILL
    elif phase is Phase.DECODE:
        stage = Stage.DECODE
    return Label(phase=phase, stage=stage or Stage.UNKNOWN, role=role, frame=frame, rule=rule)


def role_of(rules: RuleSet, frames: Sequence[Frame], title: str | None) -> Role:
    """The most specific of the role the title names and the roles the stack's markers name.

    The title is read by discovery's `title_role`, the one place a role is read from a name;
    the rules file only gives stack markers. A forked child keeps its parent's title and root
    frames until it retitles itself, so the most specific marker wins (docs/PHASES.md, "Roles").
    """
    named = {title_role(title) if title else None}
    for frame in frames:
        named.update(rules.match(frame).roles)
    return next((role for role in MOST_SPECIFIC_FIRST if role in named), Role.OTHER)


def own_frames(rules: RuleSet, frames: Sequence[Frame]) -> Sequence[Frame]:
    """Drop what a forked child inherited: frames root-ward of the innermost fork boundary."""
    for i, frame in enumerate(frames):
        if rules.match(frame).fork_boundary:
            return frames[: i + 1]
    return frames


_Decision = tuple[Phase, Stage | None, Frame, str]


class _Walk:
    """One pass over a stack's own frames, leaf first."""

    def __init__(self, rules: RuleSet, frames: Sequence[Frame]) -> None:
        self.rules = rules
        self.frames = frames
        self.candidates = [rules.candidates(f) for f in frames]
        skip = [any(r.kind is RuleKind.SKIP for r, _ in c) for c in self.candidates]
        self.positions = [i for i, s in enumerate(skip) if not s]  # non-skip frame indices
        self.waiting = False
        self.wait_frame: Frame | None = None

    def anywhere(self) -> _Decision | None:
        """`anywhere` rules (startup) win over everything beneath them."""
        for pos, i in enumerate(self.positions):
            for rule, spec in self.candidates[i]:
                if rule.anywhere and rule.phase and self._context_ok(spec, pos, waiting=False):
                    return rule.phase, spec.stage or rule.stage, self.frames[i], rule.name
        return None

    def innermost(self) -> _Decision | None:
        for pos, i in enumerate(self.positions):
            for rule, spec in self.candidates[i]:
                if rule.anywhere or rule.kind in (RuleKind.SKIP, RuleKind.STAGE):
                    continue
                if not self._context_ok(spec, pos, waiting=self.waiting):
                    continue
                if rule.kind is RuleKind.WAIT:
                    self._enter_wait(i)
                    break  # this frame is a wait; what it waits for sits further root-ward
                return self._decide(rule, spec, i)
        return None

    def _enter_wait(self, i: int) -> None:
        if not self.waiting:
            self.waiting, self.wait_frame = True, self.frames[i]

    def _decide(self, rule: Rule, spec: FrameSpec, i: int) -> _Decision:
        phase = rule.waiting_phase if self.waiting and rule.waiting_phase else rule.phase
        assert phase is not None  # validated on load: phase rules have a phase
        return phase, spec.stage or rule.stage, self.frames[i], rule.name

    def stage_marker(self) -> Stage | None:
        for pos, i in enumerate(self.positions):
            for rule, spec in self.candidates[i]:
                stage = spec.stage or rule.stage
                if rule.kind is RuleKind.STAGE and stage and self._context_ok(spec, pos, False):
                    return stage
        return None

    def _context_ok(self, spec: FrameSpec, pos: int, waiting: bool) -> bool:
        if spec.waiting_only and not waiting:
            return False
        if spec.leaf and pos != 0:
            return False
        if spec.parents and not self._parents_ok(spec.parents, pos):
            return False
        return not spec.under or self._under_ok(spec.under, pos)

    def _parents_ok(self, parents: tuple[FrameSpec, ...], pos: int) -> bool:
        above = self.positions[pos + 1 : pos + 1 + len(parents)]
        if len(above) < len(parents):
            return False
        return all(p.matches_frame(self.frames[i]) for p, i in zip(parents, above, strict=True))

    def _under_ok(self, under: tuple[FrameSpec, ...], pos: int) -> bool:
        start = self.positions[pos] + 1
        return any(u.matches_frame(f) for f in self.frames[start:] for u in under)
