"""Help for the next rename: the frames behind `other`, each with a rule skeleton to paste.

For every stack that lands in `other` (and, with `idle_waits`, every `idle` stack decided only
because a wait had no known context, which may be work misread as waiting), the innermost frame
that no rule knows is the one a new rule would decide on. Those frames are counted by samples;
each gets a skeleton in phases.yaml's own syntax. A skeleton is validated the way an operator
would use it: pasted at the end of the `rules:` list of a copy of the rules file, which must then
load; the stacks are classified again with it, and the samples whose phase changes are what it
would move.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.classify.classifier import Classifier
from sidecar.classify.explain import ExplainedStack, explain
from sidecar.classify.rules import bare_name, parse_rules
from sidecar.errors import ConfigError
from sidecar.records import Frame, Phase, Role, StackSample

# The phase a skeleton proposes when nothing waits below the frame: the role's usual work. A guess
# for the operator to check against docs/PHASES.md; the comment in the skeleton says so.
_GUESS = {
    Role.WORKER: Phase.FORWARD,
    Role.ENGINE_CORE: Phase.SCHEDULING,
    Role.API_SERVER: Phase.INPUT_PROCESSING,
    Role.OTHER: Phase.IDLE,
}
# Where a rule's `file:` glob starts: at the last vllm or vllm_* package folder (a source
# checkout such as /vllm-workspace/vllm/vllm/v1/...), else after the installed-packages folder.
_VLLM_ROOT = re.compile(r".*/(?=(?:vllm|vllm_\w+)/)")
_PACKAGE_ROOT = re.compile(r".*/(?:site-packages|dist-packages|lib/python\d[\d.]*)/")
WAIT_WITHOUT_CONTEXT = "wait-without-context"


@dataclass(frozen=True, slots=True)
class Suggestion:
    frame: Frame  # the innermost frame no rule knows, in the stacks it would decide
    phase_now: Phase  # `other`, or `idle` for a wait without context
    samples: int  # samples whose innermost unknown frame this is
    stacks: int  # distinct stacks among them
    moved: int  # samples the skeleton decides, classified again with it pasted in
    changed: int  # of those, samples whose phase changes (an idle wait confirmed stays idle)
    share: float  # moved / all samples of the input
    phase: Phase  # the phase the skeleton proposes
    skeleton: str  # YAML text, indented as an item of `rules:`


def suggest(
    classifier: Classifier,
    stacks: Sequence[StackSample],
    roles: Sequence[Role | None] | None,
    rules_text: str,
    top: int = 10,
    idle_waits: bool = True,
) -> tuple[Suggestion, ...]:
    """The `top` most frequent frames behind `other` (and unexplained idle waits). RULES_TEXT:
    the rules file in use, each skeleton is pasted into it and loaded to count what it decides.
    Names are unique across the list, so that every skeleton shown can be pasted together."""
    explained = explain(classifier, stacks, roles)
    total = sum(e.weight for e in explained) or 1
    groups: dict[tuple[str, str, bool, Phase], list[ExplainedStack]] = {}
    for e in explained:
        target = _target(e, idle_waits)
        if target is not None:
            key = (bare_name(target.function), _file_glob(target), target.native, e.phase)
            groups.setdefault(key, []).append(e)
    ranked = sorted(groups.items(), key=lambda kv: -sum(e.weight for e in kv[1]))[:top]
    names: list[str] = []
    for (function, glob, _native, _phase_now), _members in ranked:
        names.append(_unique(rule_name(glob, function), names))
    return tuple(
        _suggestion(classifier, key, members, explained, rules_text, total, name)
        for (key, members), name in zip(ranked, names, strict=True)
    )


def _unique(name: str, taken: Sequence[str]) -> str:
    """NAME, or NAME-2, NAME-3, ...: the same function in two modules (V0's and V1's
    `engine/core.py`), or behind both `other` and an idle wait, would otherwise give two rules
    one name, which no rules file loads."""
    n, out = 1, name
    while out in taken:
        n += 1
        out = f"{name}-{n}"
    return out


def _target(e: ExplainedStack, idle_waits: bool) -> Frame | None:
    """The frame a new rule would decide on: the innermost one no rule knows (for an idle wait
    without context, that frame sits above the wait: what it waits for)."""
    wanted = e.phase is Phase.OTHER or (
        idle_waits and e.phase is Phase.IDLE and e.rule == WAIT_WITHOUT_CONTEXT
    )
    if not wanted:
        return None
    # a native frame py-spy could not name is a bare address, different in every process
    # (ASLR): a rule on it would decide nothing elsewhere, so the next frame out decides
    return next((f for f in e.unknown if not _ADDRESS.fullmatch(bare_name(f.function))), None)


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def _suggestion(
    classifier: Classifier,
    key: tuple[str, str, bool, Phase],
    members: list[ExplainedStack],
    explained: Sequence[ExplainedStack],
    rules_text: str,
    total: int,
    name: str,
) -> Suggestion:
    function, glob, native, phase_now = key
    role = max(members, key=lambda e: e.weight).role
    phase = (
        Phase.IDLE if phase_now is Phase.IDLE or all(e.waiting for e in members) else _GUESS[role]
    )
    skeleton = skeleton_text(name, phase, function, glob, native, members, role)
    moved, changed = _moved(classifier, rules_text, skeleton, name, explained)
    samples = sum(e.weight for e in members)
    frame = _target(members[0], idle_waits=True)
    assert frame is not None  # members were grouped by their target
    return Suggestion(
        frame, phase_now, samples, len(members), moved, changed, moved / total, phase, skeleton
    )


def rule_name(glob: str, function: str) -> str:
    """`suggested-anyio-asyncio-run`: the package, the module and the function."""
    parts = [p for p in glob.removesuffix(".py").split("/") if p not in ("*", "")]
    words = [*parts[:1], *parts[1:][-1:], function] if parts else ["native", function]
    return "suggested-" + re.sub(r"[^a-z0-9]+", "-", "-".join(words).lower()).strip("-")


def skeleton_text(
    name: str,
    phase: Phase,
    function: str,
    glob: str,
    native: bool,
    members: Sequence[ExplainedStack],
    role: Role,
) -> str:
    samples = sum(e.weight for e in members)
    why = (
        "waits below it: what it waits for decides (PHASES.md, decide 2)"
        if phase is Phase.IDLE
        else f"guessed from the role ({role.value}): check docs/PHASES.md"
    )
    spec = f"{{function: [{_quoted(function)}], file: {_quoted(glob)}"
    spec += ", native: true}" if native else "}"
    return "\n".join(
        [
            f"  - name: {name}",
            f"    phase: {phase.value}  # {why}",
            "    versions: [TODO]  # the vLLM version(s) these frames were read from",
            f"    # from: {members[0].frames[0].label()} ({samples} samples)",
            "    match:",
            f"      - {spec}",
            "",
        ]
    )


def _quoted(text: str) -> str:
    return text if re.fullmatch(r"[A-Za-z_][\w./-]*", text) else "'" + text.replace("'", "''") + "'"


def _file_glob(frame: Frame) -> str:
    """The path's tail from the package root (py-spy's short form), `*` for native frames."""
    if frame.native or not frame.file:
        return "*"
    path = frame.file.replace("\\", "/")
    for root in (_VLLM_ROOT, _PACKAGE_ROOT):
        if root.match(path):
            return root.sub("", path, count=1)
    parts = path.lstrip("/").split("/")
    return "/".join(parts[-2:]) if path.startswith("/") else path  # a script: its folder/name


def paste(rules_text: str, skeleton: str) -> str:
    """RULES_TEXT with SKELETON (items indented by two) pasted at the end of its `rules:` list,
    re-indented to the list's own items (`yaml.safe_dump` writes them at column 0)."""
    lines = rules_text.split("\n")
    start = next((i for i, line in enumerate(lines) if re.match(r"rules:\s*(#.*)?$", line)), None)
    if start is None:
        flow = any(re.match(r"rules:\s*\[", line) for line in lines)
        raise ConfigError(
            "the rules file's `rules:` is a flow list ([...]): write it as a block list, one "
            "`- name: ...` item per rule, to paste a suggestion into it"
            if flow
            else "the rules file has no top-level `rules:` list to paste into"
        )
    items = [
        line for line in lines[start + 1 :] if line.strip() and not line.lstrip().startswith("#")
    ]
    indent = len(items[0]) - len(items[0].lstrip()) if items else 2
    # the list ends at the next top-level key (a column-0 line that is not one of its items)
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(r"[^\s#-]", lines[i])), len(lines)
    )
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    pasted = [_reindent(line, indent - 2) for line in skeleton.rstrip("\n").split("\n")]
    return "\n".join([*lines[:end], *pasted, *lines[end:]]) + (
        "" if rules_text.endswith("\n") else "\n"
    )


def _reindent(line: str, by: int) -> str:
    return " " * by + line if by >= 0 else line[min(-by, len(line) - len(line.lstrip())) :]


def _moved(
    classifier: Classifier,
    rules_text: str,
    skeleton: str,
    name: str,
    explained: Sequence[ExplainedStack],
) -> tuple[int, int]:
    try:
        pasted = parse_rules(paste(rules_text, skeleton), source="phases.yaml + suggestion")
    except ConfigError as exc:  # a bug here, not the operator's: say which skeleton
        raise ConfigError(f"a suggested rule does not load ({exc}):\n{skeleton}") from exc
    trial = Classifier(pasted)
    moved = changed = 0
    for e in explained:
        label = trial.classify(StackSample(e.frames), None)
        if label.rule == name:
            moved += e.weight
            changed += e.weight if label.phase is not e.phase else 0
    return moved, changed


def as_text(suggestions: Sequence[Suggestion], total: int) -> str:
    if not suggestions:
        return "nothing in `other` (or unexplained idle waits): no rule to suggest\n"
    lines = [f"{total} samples; the frames behind `other`, most samples first:", ""]
    for n, s in enumerate(suggestions, 1):
        lines.append(
            f"#{n}  {s.frame.label()}  ({s.phase_now.value}: {s.samples} samples in "
            f"{s.stacks} stacks; the rule decides {s.moved} = {100 * s.share:.1f}%, "
            f"{s.changed} change phase)"
        )
        lines.append(s.skeleton)
    return "\n".join(lines)


def as_json(suggestions: Sequence[Suggestion], rules: str, total: int) -> dict[str, Any]:
    """`rules suggest --format json`: the rules' fingerprint, the samples read, each suggestion."""
    return {"rules": rules, "samples": total, "suggestions": [
        {"frame": s.frame.label(), "phase_now": s.phase_now.value, "samples": s.samples,
         "stacks": s.stacks, "moved": s.moved, "changed": s.changed, "share": round(s.share, 6),
         "phase": s.phase.value, "skeleton": s.skeleton} for s in suggestions]}  # fmt: skip
