"""The phase rules: `configs/phases.yaml` parsed and validated once into an immutable rule set.

Rules are data (docs/STYLE.md, point 3): when vLLM renames a function, the YAML changes and this
module does not. Every error names the rule and the key at fault.

A rules file's regexes (`function_re:`) run on RE2, in time linear in the name, and a file is
tried on sample frames when loaded: one too slow for the daemon's loop is refused (issue 26,
item 14).
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import re2  # google-re2: the rules' regexes, in linear time
import yaml

from sidecar.config.packaged import load_yaml, packaged_config, read_config_text
from sidecar.errors import ConfigError
from sidecar.records import Frame, Phase, Role, Stage

RULES_FILENAME = "phases.yaml"
_E = TypeVar("_E", bound=Enum)


class RuleKind(StrEnum):
    PHASE = "phase"  # the innermost matching frame decides the phase
    WAIT = "wait"  # a waiting primitive: what it waits for decides (docs/PHASES.md, decide 2)
    SKIP = "skip"  # a wrapper, passed over when looking for the innermost frame
    STAGE = "stage"  # only tells prefill from decode, anywhere in the stack


_SPEC_KEYS = frozenset(
    {
        "function",
        "function_re",
        "file",
        "native",
        "under",
        "parents",
        "waiting_only",
        "leaf",
        "stage",
    }
)
_RULE_KEYS = frozenset(
    {"name", "kind", "phase", "waiting_phase", "stage", "anywhere", "versions", "match"}
)
_ROLE_KEYS = frozenset({"role", "frames"})


@dataclass(frozen=True, slots=True)
class FunctionRegex:
    """A `function_re:` as RE2 runs it (`_regex`); compared and hashed by its pattern."""

    pattern: str
    compiled: Any = field(compare=False, repr=False)

    def search(self, function: str) -> bool:
        # Bytes: re2's str path maps every offset back to characters. A lone surrogate (a name
        # decoded with surrogateescape) passes as bytes that match no letter, not an error.
        return self.compiled.search(function.encode("utf-8", "surrogatepass")) is not None


@dataclass(frozen=True, slots=True)
class FrameSpec:
    """What one frame must look like, and the context it must sit in."""

    functions: frozenset[str] | None  # None: any function
    function_re: FunctionRegex | None
    file_glob: str | None  # None: any file
    native: bool | None
    under: tuple[FrameSpec, ...] = ()  # some frame root-ward matches one of these
    parents: tuple[FrameSpec, ...] = ()  # the next non-skip frames root-ward, in order
    waiting_only: bool = False  # only as the context of a waiting primitive
    leaf: bool = False  # only as the innermost non-skip frame
    stage: Stage | None = None

    def matches_frame(self, frame: Frame) -> bool:
        if self.native is not None and frame.native != self.native:
            return False
        if self.functions is not None and not (
            frame.function in self.functions or bare_name(frame.function) in self.functions
        ):
            return False
        if self.function_re is not None and not self.function_re.search(frame.function):
            return False
        return self.file_glob is None or path_matches(frame.file, self.file_glob)


@dataclass(frozen=True, slots=True)
class WaitFrames:
    """The frames the ground-truth check (sidecar/classify/groundtruth.py) reads, from the rules
    file's
    `ground_truth:`: a thread with a `spin` frame waits by spinning on the CPU (its CPU time
    cannot tell work from waiting); an idle sample whose leaf is a `loop_leaves` frame is an
    event loop's own frame, asleep or working in C with no Python frame above it."""

    spin: tuple[FrameSpec, ...] = ()
    loop_leaves: tuple[FrameSpec, ...] = ()

    def spins(self, frames: Iterable[Frame]) -> bool:
        return any(spec.matches_frame(f) for f in frames for spec in self.spin)

    def loop_leaf(self, frame: Frame) -> bool:
        return any(spec.matches_frame(frame) for spec in self.loop_leaves)


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    kind: RuleKind
    specs: tuple[FrameSpec, ...]
    phase: Phase | None = None
    waiting_phase: Phase | None = None
    stage: Stage | None = None
    anywhere: bool = False
    versions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RoleRule:
    """Stack markers of a role. Process titles are not here: sidecar/target/discovery.py's
    ROLE_PATTERNS alone decide a role from a title, for discovery and the classifier alike."""

    role: Role
    frames: tuple[FrameSpec, ...]


@dataclass(frozen=True, slots=True)
class FrameMatch:
    """What one frame (function, file, native; never its line) matches in a rule set."""

    candidates: tuple[tuple[Rule, FrameSpec], ...]  # (rule, spec) pairs, in file order
    roles: frozenset[Role]  # roles whose stack markers it is
    fork_boundary: bool


_MATCH_MEMO_LIMIT = 65536  # distinct frames; a window holds a few hundred


@dataclass(frozen=True, slots=True)
class RuleSet:
    rules: tuple[Rule, ...]
    roles: tuple[RoleRule, ...]
    fork_boundaries: tuple[FrameSpec, ...]
    source: str
    version: str | None = None  # the file's `version:`
    digest: str | None = None  # sha256 of the file's text: two edits of one version differ
    ground_truth: WaitFrames = field(default_factory=WaitFrames)
    # Per instance, never compared or hashed: hashing a rule set walks every rule (about
    # 160 us for the shipped file), far too slow for a key looked up once per frame.
    _matches: dict[tuple[str, str, bool], FrameMatch] = field(
        default_factory=dict, init=False, compare=False, hash=False, repr=False
    )

    @property
    def fingerprint(self) -> str:
        """`1 sha256:3f2a9c1b07de`: which rules labelled a snapshot (its fingerprint's `rules`)."""
        short = f"sha256:{self.digest[:12]}" if self.digest else "no digest"
        return f"{self.version or 'unversioned'} {short}"

    def match(self, frame: Frame) -> FrameMatch:
        """What FRAME matches: its candidate rules, the roles it marks, whether it is a fork
        boundary. Memoised per rule set on (function, file, native)."""
        key = (frame.function, frame.file, frame.native)
        found = self._matches.get(key)
        if found is None:
            if len(self._matches) >= _MATCH_MEMO_LIMIT:
                self._matches.clear()  # bounded memory: distinct frames only
            found = self._match(Frame(frame.function, frame.file, None, frame.native))
            self._matches[key] = found
        return found

    def candidates(self, frame: Frame) -> tuple[tuple[Rule, FrameSpec], ...]:
        """The (rule, spec) pairs whose frame-local part matches, in file order (memoised)."""
        return self.match(frame).candidates

    def _match(self, frame: Frame) -> FrameMatch:
        return FrameMatch(
            candidates=tuple(
                (rule, spec)
                for rule in self.rules
                for spec in rule.specs
                if spec.matches_frame(frame)
            ),
            roles=frozenset(
                r.role for r in self.roles if any(spec.matches_frame(frame) for spec in r.frames)
            ),
            fork_boundary=any(spec.matches_frame(frame) for spec in self.fork_boundaries),
        )


def bare_name(function: str) -> str:
    """`EngineCore.step` -> `step`; `collective_rpc.<locals>.get_response` -> `get_response`.

    py-spy 0.4 prints qualified names (co_qualname); rules may name either form.
    """
    return function.rsplit(".", 1)[-1] if "." in function else function


def path_matches(path: str, glob: str) -> bool:
    """A glob matched against the path's tail, on `/` boundaries.

    `vllm/v1/engine/core.py` matches py-spy's short name and any full path ending in it, but
    `threading.py` does not match `mythreading.py`.
    """
    if glob == "*":
        return True
    path = path.replace("\\", "/")
    return _glob_re(glob).search(path) is not None


@lru_cache(maxsize=4096)
def _glob_re(glob: str) -> re.Pattern[str]:
    body = fnmatch.translate(glob)  # ends with \Z; `*` crosses `/`, as wanted for folders
    return re.compile(r"(?:^|/)" + body.removeprefix("(?s:").removesuffix(")\\Z") + r"\Z", re.S)


# ---------------------------------------------------------------------------------- loading


def default_rules_path() -> Path:
    """The built-in phases.yaml (package data in sidecar/configs/, linked as configs/)."""
    return packaged_config(RULES_FILENAME)


# How long matching the sample frames may take a rules file when it is loaded. The built-in
# file takes about 10 ms; the daemon matches each distinct frame it sees this way (memoised), in
# its loop, which must not stall on a file that takes seconds.
LOAD_BUDGET_S = 2.0
_LONG = "a" * 500  # a long run of word characters, where nested repeats blow up
# Frames of the kinds the daemon sees in every window (vLLM's Python frames, the standard
# library's, native CUDA, NCCL, C++ and libc symbols), and long names, where a slow pattern shows.
_SAMPLE_FRAMES = (
    Frame("EngineCoreProc.run_busy_loop", "vllm/v1/engine/core.py"),
    Frame("Scheduler.schedule", "vllm/v1/core/sched/scheduler.py"),
    Frame("GPUModelRunner.execute_model", "vllm/v1/worker/gpu_model_runner.py"),
    Frame("LlamaForCausalLM.forward", "vllm/model_executor/models/llama.py"),
    Frame("MessageQueue.acquire_read", "vllm/distributed/device_communicators/shm_broadcast.py"),
    Frame("MPClient.start_engine_core_monitor.<locals>.monitor_engine_cores",
          "vllm/v1/engine/core_client.py"),
    Frame("OpenAIServingChat.chat_completion_stream_generator",
          "/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/openai/serving_chat.py"),
    Frame("Condition.wait", "/usr/lib/python3.12/threading.py"),
    Frame("Thread._bootstrap_inner", "threading.py"),
    Frame("_PollLikeSelector.select", "selectors.py"),
    Frame("Runner.run", "asyncio/runners.py"),
    Frame("<module>", "<string>"),
    Frame("cudaStreamSynchronize", "libcudart.so.12", native=True),
    Frame("ncclAllReduce", "libnccl.so.2", native=True),
    Frame("at::native::cpu_kernel_vec<at::native::(anonymous namespace)::add_kernel(at::"
          "TensorIteratorBase&, c10::Scalar const&)::{lambda()#1}>", "libtorch_cpu.so",
          native=True),
    Frame("__GI___poll", "libc.so.6", native=True),
    *(Frame(name, file, native=native)
      for name in (_LONG, _LONG + "!", "_".join([_LONG[:20]] * 25), "::".join(["ns"] * 200))
      for file, native in (("/".join(["pkg"] * 60) + "/mod.py", False), ("libx.so", True))),
)  # fmt: skip


def check_load_time(
    rules: RuleSet, clock: Callable[[], float] = time.perf_counter, budget_s: float = LOAD_BUDGET_S
) -> None:
    """A ConfigError when matching the sample frames against every frame spec of RULES (the
    rules, the roles, the fork boundaries, the ground truth) takes over `budget_s`, checked
    after each frame: a file that slow would stall the daemon on each frame it has not seen."""
    start = clock()
    for done, frame in enumerate(_SAMPLE_FRAMES, 1):
        rules._match(frame)
        rules.ground_truth.spins((frame,))
        rules.ground_truth.loop_leaf(frame)
        if (spent := clock() - start) > budget_s:
            raise ConfigError(
                f"{rules.source}: matching {done} of {len(_SAMPLE_FRAMES)} sample frames took "
                f"{spent:.1f} s, over {budget_s:g} s: the daemon matches every frame it has not "
                "seen this way, in its loop. Use fewer frame specs, or fewer and simpler "
                "`function_re:` patterns (names listed under `function:` cost least)"
            )


def load_rules(
    path: Path | None = None,
    *,
    clock: Callable[[], float] = time.perf_counter,
    budget_s: float = LOAD_BUDGET_S,
) -> RuleSet:
    """The rules of PATH (None: the built-in file). A file given is timed on sample frames
    (`check_load_time`): one too slow for the daemon's loop is refused."""
    given = path is not None
    path = path or default_rules_path()
    fix = "Pass --rules with a readable file, or omit it to use the built-in rules."
    text = read_config_text(path, "rules file", "a rules file", fix)
    rules = parse_rules(text, source=str(path))
    if given:
        check_load_time(rules, clock, budget_s)
    return rules


def parse_rules(text: str, source: str = "<rules>") -> RuleSet:
    try:
        # libyaml's loader when present: the pure-Python one takes seconds on a box whose cores
        # vLLM keeps busy, and the rules are parsed before sampling starts.
        data = load_yaml(text, source)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}. Fix the syntax and retry.") from exc
    if not isinstance(data, Mapping) or not isinstance(data.get("rules"), list):
        raise ConfigError(f"{source}: expected a mapping with a `rules:` list at the top level")
    unknown = set(data) - {"version", "rules", "roles", "fork_boundaries", "ground_truth"}
    if unknown:
        raise ConfigError(f"{source}: unknown top-level keys {sorted(unknown)}")
    rules = tuple(_parse_rule(raw, i, source) for i, raw in enumerate(data["rules"]))
    names = [r.name for r in rules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{source}: rule names must be unique; repeated: {dupes}")
    roles = tuple(_parse_role(raw, source) for raw in _list(data.get("roles"), f"{source}: roles"))
    forks = tuple(
        _parse_spec(s, f"{source}: fork_boundaries")
        for s in _list(data.get("fork_boundaries"), f"{source}: fork_boundaries")
    )
    version = data.get("version")
    return RuleSet(rules=rules, roles=roles, fork_boundaries=forks, source=source,
                   version=None if version is None else str(version),
                   digest=hashlib.sha256(text.encode("utf-8")).hexdigest(),
                   ground_truth=_parse_ground_truth(data.get("ground_truth"), source))  # fmt: skip


def _parse_ground_truth(raw: Any, source: str) -> WaitFrames:
    """The file's `ground_truth:`; a file without one (an operator's copy from before it)
    takes the built-in file's, so its spinning threads are not flagged as busy."""
    where = f"{source}: ground_truth"
    if raw is None:
        return _builtin_ground_truth()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping with `spin_waits:` and "
                          "`event_loop_leaves:` lists of frame specs")  # fmt: skip
    unknown = set(raw) - {"spin_waits", "event_loop_leaves"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)} (spin_waits, "
                          "event_loop_leaves)")  # fmt: skip
    spin = _specs(raw.get("spin_waits"), f"{where}: spin_waits")
    return WaitFrames(spin, _specs(raw.get("event_loop_leaves"), f"{where}: event_loop_leaves"))


def _parse_rule(raw: Any, index: int, source: str) -> Rule:
    if not isinstance(raw, Mapping) or not raw.get("name"):
        raise ConfigError(f"{source}: rule #{index + 1} needs a mapping with a `name:`")
    where = f"{source}: rule {raw['name']!r}"
    unknown = set(raw) - _RULE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_RULE_KEYS)}")
    kind = _enum(RuleKind, raw.get("kind", "phase"), f"{where}: kind")
    phase = _enum(Phase, raw["phase"], f"{where}: phase") if "phase" in raw else None
    if kind is RuleKind.PHASE and phase is None:
        raise ConfigError(f"{where}: a phase rule needs `phase:` (one of {_names(Phase)})")
    if kind is not RuleKind.PHASE and phase is not None:
        raise ConfigError(f"{where}: a {kind.value} rule takes no `phase:`")
    specs = raw.get("match")
    if not isinstance(specs, list) or not specs:
        raise ConfigError(f"{where}: `match:` must be a non-empty list of frame specs")
    return Rule(
        name=str(raw["name"]),
        kind=kind,
        specs=tuple(_parse_spec(s, where) for s in specs),
        phase=phase,
        waiting_phase=_optional_enum(Phase, raw.get("waiting_phase"), f"{where}: waiting_phase"),
        stage=_optional_enum(Stage, raw.get("stage"), f"{where}: stage"),
        anywhere=_flag(raw, "anywhere", where),
        versions=tuple(str(v) for v in _list(raw.get("versions"), f"{where}: versions")),
    )


def _parse_spec(raw: Any, where: str) -> FrameSpec:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: a frame spec must be a mapping, got {raw!r}")
    unknown = set(raw) - _SPEC_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown frame-spec keys {sorted(unknown)} in {dict(raw)}")
    if "function" not in raw and "function_re" not in raw:
        raise ConfigError(f"{where}: a frame spec needs `function:` or `function_re:`")
    return FrameSpec(
        functions=_functions(raw.get("function"), where),
        function_re=_regex(raw.get("function_re"), where),
        file_glob=None if raw.get("file", "*") == "*" else str(raw["file"]),
        native=None if raw.get("native") is None else _flag(raw, "native", where),
        under=_specs(raw.get("under"), f"{where}: under"),
        parents=_specs(raw.get("parents"), f"{where}: parents"),
        waiting_only=_flag(raw, "waiting_only", where),
        leaf=_flag(raw, "leaf", where),
        stage=_optional_enum(Stage, raw.get("stage"), f"{where}: stage"),
    )


def _parse_role(raw: Any, source: str) -> RoleRule:
    if not isinstance(raw, Mapping) or "role" not in raw:
        raise ConfigError(f"{source}: each `roles:` entry needs `role:` ({_names(Role)})")
    where = f"{source}: role {raw['role']!r}"
    role = _enum(Role, raw["role"], where)
    if "titles" in raw:
        raise ConfigError(
            f"{where}: `titles:` are no longer read from the rules file; process titles are "
            "decided by ROLE_PATTERNS in sidecar/classify/roles.py. Remove `titles:` "
            "(keep `frames:`)"
        )
    unknown = set(raw) - _ROLE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_ROLE_KEYS)}")
    frames = raw.get("frames") or ()
    if not isinstance(frames, list):
        raise ConfigError(f"{where}: `frames:` must be a list of frame specs")
    return RoleRule(role=role, frames=tuple(_parse_spec(s, where) for s in frames))


def _list(raw: Any, where: str) -> list[Any]:
    """RAW as a list: absent or empty is [], a list is itself; anything else is refused."""
    if not raw:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: expected a list, got {type(raw).__name__} {str(raw)[:40]!r}")
    return raw


def _specs(raw: Any, where: str) -> tuple[FrameSpec, ...]:
    if raw is None:
        return ()
    items = raw if isinstance(raw, list) else [raw]
    return tuple(_parse_spec(s, where) for s in items)


def _functions(raw: Any, where: str) -> frozenset[str] | None:
    if raw is None or raw == "*" or raw == ["*"]:
        return None
    if isinstance(raw, str):
        return frozenset({raw})
    if isinstance(raw, Sequence) and all(isinstance(f, str) for f in raw):
        return frozenset(raw)
    raise ConfigError(f"{where}: `function:` must be a name or a list of names, got {raw!r}")


# `function_re:` runs on RE2 (google-re2), whose time is linear in the name whatever the
# pattern: Python's `re` backtracks, and `(\w+)+!` took 10 s on a 26-character name in the
# daemon's loop (issue 26, item 14). The syntax is Python's, checked with `re` first so that a
# typo reads as it always did, less what RE2 cannot run: refused at load, naming the construct.
# RE2's `\w`, `\d` and `\b` are ASCII (function names are).
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refusal is a ConfigError, not a line on stderr
_RE2_OPTIONS.never_capture = True  # whether it matches, nothing more
_NO_BACKTRACKING = "drop the `{0}`: RE2 never backtracks, so there is nothing to prevent"
_REWRITE = ("rewrite the pattern without it: list the names under `function:`, or add a second "
            "frame spec (a rule matches a frame that any of its specs matches)")  # fmt: skip
# RE2's error, by its start, for a construct Python's syntax has and RE2 lacks; the fix.
_NOT_IN_RE2 = (
    ("invalid perl operator: (?=", "a lookahead `(?=...)`", _REWRITE),
    ("invalid perl operator: (?!", "a negative lookahead `(?!...)`", _REWRITE),
    ("invalid perl operator: (?<=", "a lookbehind `(?<=...)`", _REWRITE),
    ("invalid perl operator: (?<!", "a negative lookbehind `(?<!...)`", _REWRITE),
    ("invalid perl operator: (?P", "a backreference `(?P=name)`", _REWRITE),  # RE2 has (?P<
    ("invalid perl operator: (?(", "a conditional group `(?(1)...)`", _REWRITE),
    ("invalid perl operator: (?>", "an atomic group `(?>...)`", _NO_BACKTRACKING.format("?>")),
    ("bad repetition operator", "a possessive quantifier (`*+`, `++`, `?+`)",
     _NO_BACKTRACKING.format("+")),
    ("invalid perl operator: (?#", "a comment `(?#...)`", "remove it"),
    ("invalid perl operator: (?x", "the verbose flag `(?x)`", "remove it, with the spaces"),
    ("invalid perl operator: (?a", "the ASCII flag `(?a)`",
     "remove it: RE2's \\w, \\d and \\b are ASCII already"),
    ("invalid escape sequence: \\Z", "`\\Z`", "write `$` (the end of the name)"),
    ("invalid escape sequence: \\u", "a `\\u` escape", "write the character itself"),
    ("invalid escape sequence: \\U", "a `\\U` escape", "write the character itself"),
    ("invalid escape sequence: \\N", "a `\\N{...}` escape", "write the character itself"),
    ("invalid repetition size", "a repeat count over 1000", "use `+` or `*`"),
    ("pattern too large", "more than RE2 compiles in its 8 MiB",
     "split it over several frame specs"),
)  # fmt: skip
_OPEN_REPEAT = re.compile(r"\{,(\d+)\}")  # Python: at most N; RE2: the text itself


def _regex(raw: Any, where: str) -> FunctionRegex | None:
    if raw is None:
        return None
    pattern = str(raw)
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{where}: bad regular expression {raw!r}: {exc}") from exc
    if found := _OPEN_REPEAT.search(pattern):
        raise ConfigError(f"{where}: function_re {pattern!r}: write `{{0,{found[1]}}}` for at "
                          f"most {found[1]}: RE2, which runs the rules' regexes, reads "
                          f"`{found[0]}` as that text, not as a repeat")  # fmt: skip
    try:
        return FunctionRegex(pattern, re2.compile(pattern, _RE2_OPTIONS))
    except re2.error as exc:
        raise ConfigError(f"{where}: function_re {pattern!r} {_refusal(exc)}") from None


def _refusal(exc: Exception) -> str:
    """Why RE2 refused a pattern Python's `re` takes, and the fix."""
    said = exc.args[0] if exc.args else ""
    said = said.decode("utf-8", "replace") if isinstance(said, bytes) else str(said)
    construct, fix = "", ""
    if said.startswith("invalid escape sequence: \\") and said[-1:].isdigit():
        construct, fix = f"a backreference `{said.rsplit(' ', 1)[-1]}`", _REWRITE
    for start, name, how in _NOT_IN_RE2:
        if not construct and said.startswith(start):
            construct, fix = name, how
    why = "the rules' regexes run on RE2, so that matching a name takes time linear in its length"
    if not construct:
        return (f"cannot run on RE2: {said} ({why}); rewrite it in RE2's syntax "
                "(https://github.com/google/re2/wiki/Syntax)")  # fmt: skip
    return f"uses {construct}, which RE2 does not have ({why}); {fix}"


def _flag(raw: Mapping[str, Any], key: str, where: str) -> bool:
    """A YAML boolean, strictly: `bool("false")` is True, so a quoted "false" would silently
    turn a rule on; only true/false (unquoted) are taken."""
    value = raw.get(key, False)
    if isinstance(value, bool):
        return value
    raise ConfigError(
        f"{where}: `{key}:` must be true or false (a YAML boolean, unquoted), got {value!r}"
    )


def _enum(cls: type[_E], raw: Any, where: str) -> _E:
    try:
        return cls(raw)
    except ValueError:
        raise ConfigError(
            f"{where}: unknown value {raw!r}; expected one of {_names(cls)}"
        ) from None


def _optional_enum(cls: type[_E], raw: Any, where: str) -> _E | None:
    return None if raw is None else _enum(cls, raw, where)


def _names(cls: type[Enum]) -> list[str]:
    return [str(m.value) for m in cls]


@functools.cache
def _builtin_ground_truth() -> WaitFrames:
    path = default_rules_path()
    try:
        data = yaml.load(path.read_text(encoding="utf-8"),
                         Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # fmt: skip
    except (OSError, yaml.YAMLError):
        return WaitFrames()  # the built-in file is unreadable: load_rules says so when used
    raw = data.get("ground_truth") if isinstance(data, Mapping) else None
    return _parse_ground_truth(raw, str(path)) if raw is not None else WaitFrames()
