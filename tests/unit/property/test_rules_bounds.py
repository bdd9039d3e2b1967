"""The phase rules loader (sidecar/classify/rules.py) on any document, in bounded time and memory.

`parse_rules` gives a RuleSet or raises ConfigError naming the file; never another exception,
never a hang. Inputs: any text, YAML-shaped token soup, documents of the rules file's own keys
with values of every kind, and parts of configs/phases.yaml (a few rules with its roles, fork
boundaries and ground truth) damaged: keys dropped, values of the wrong type, regular
expressions replaced by random ones, lines cut, dropped, doubled or garbled. Whatever loads then
classifies real and hostile frames under the same bounds, so a rule whose regular expression
backtracks for ever fails here, naming it.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, example, given
from hypothesis import strategies as st

from sidecar.classify import rules as rules_module
from sidecar.classify.classifier import classify_frames
from sidecar.classify.rules import RuleKind, RuleSet, default_rules_path, parse_rules
from sidecar.errors import ConfigError
from sidecar.parsers import parse_file
from sidecar.records import Frame, Phase, Role, Stage
from tests.unit.property.bounds import bounded, cases

PHASES_TEXT = default_rules_path().read_text(encoding="utf-8")
PHASES = yaml.load(PHASES_TEXT, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"

# Frames to classify with what loads: real stacks, and names that make a backtracking regular
# expression work hard (long runs of one class of character with no match at the end).
REAL_STACKS = [
    stack.frames
    for name in ("pyspy_dump.txt", "pyspy_dump_native.txt", "traceback_chained.txt")
    for stack in parse_file(FIXTURES / "parsers" / name).stacks
]
HOSTILE_FRAMES = (
    Frame("a" * 28, "vllm/x.py"),
    Frame("a" * 40 + "!", "x.so", None, native=True),
    Frame("_" * 300 + "(", "vllm/entrypoints/x.py"),
    Frame("EngineCore.step", "vllm/v1/engine/core.py", 1),
)

# ------------------------------------------------------------------------------- strategies

# the loader's own key sets, sorted: the strategies draw from exactly what it accepts
_SPEC_KEYS = sorted(rules_module._SPEC_KEYS)
_RULE_KEYS = sorted(rules_module._RULE_KEYS)
_TOP_KEYS = ["version", "rules", "roles", "fork_boundaries", "ground_truth"]
_WORDS = [
    *(e.value for enum in (RuleKind, Phase, Stage, Role) for e in enum),
    "*", "vllm/*", "threading.py", "step", "wait", "true", "false", "null", "1", "-1", "",
]  # fmt: skip

# Regular expressions: soup of regex characters (most do not compile), shapes that compile and
# cannot backtrack badly, and the shipped ones with a character put in somewhere.
_SHIPPED_RE: list[str] = sorted(set(re.findall(r"function_re: '([^']*)'", PHASES_TEXT)))
_REGEX_SOUP = st.from_regex(r"[\w\\^$.|?*+()\[\]{},:-]{0,24}", fullmatch=True)
_SAFE_ATOM = st.sampled_from([r"\w", "a", "_", ".", r"[a-z]", r"\d", "::", "step", r"\b"])
_SAFE_REGEX = st.lists(  # three quantified atoms at most: six \w* in a row are slow enough
    st.tuples(_SAFE_ATOM, st.sampled_from(["", "*", "+", "?", "{1,3}"])).map("".join), max_size=3
).map("".join) | st.lists(
    st.sampled_from(["step", "wait", "nccl", r"^cu\w*", "attn"]), min_size=1, max_size=4
).map("|".join)


@st.composite
def _edited_shipped(draw: st.DrawFn) -> str:
    pattern = draw(st.sampled_from(_SHIPPED_RE))
    at = draw(st.integers(0, len(pattern)))
    return pattern[:at] + draw(st.sampled_from(list("()[]{}|*+?\\^$"))) + pattern[at:]


REGEX = st.text(max_size=16) | _REGEX_SOUP | _SAFE_REGEX | _edited_shipped()

_SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=True)
    | st.sampled_from(_WORDS)
    | st.text(max_size=8)
)
_ANY = st.recursive(
    _SCALAR,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(_SPEC_KEYS) | st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def _mostly(
    valid: st.SearchStrategy[Any], wrong: st.SearchStrategy[Any] = _ANY
) -> st.SearchStrategy[Any]:
    """VALID seven times in eight, else WRONG: documents get far enough to load some rules."""
    return st.integers(0, 7).flatmap(lambda k: wrong if k == 3 else valid)


def _odd_key(document: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """DOCUMENT, one time in eight with a key the loader does not know."""
    return _mostly(document, document.map(lambda d: {**d, "bogus": True}))


_FUNCTIONS = st.sampled_from(_WORDS) | st.lists(st.sampled_from(_WORDS), min_size=1, max_size=3)
_PHASE = st.sampled_from([p.value for p in Phase])
_STAGE = st.sampled_from([s.value for s in Stage])


def _spec(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    optional: dict[str, st.SearchStrategy[Any]] = {
        "function_re": _mostly(REGEX),
        "file": _mostly(st.sampled_from(_WORDS) | st.text(max_size=10)),
        "native": _mostly(st.booleans(), _SCALAR),
        "waiting_only": _mostly(st.booleans(), _SCALAR),
        "leaf": _mostly(st.booleans(), _SCALAR),
        "stage": _mostly(_STAGE, _SCALAR),
    }
    if depth:
        optional["under"] = _mostly(
            _spec(depth - 1) | st.lists(_spec(depth - 1), max_size=2), _SCALAR
        )
        optional["parents"] = _mostly(st.lists(_spec(depth - 1), max_size=2), _SCALAR)
    return _odd_key(st.fixed_dictionaries({"function": _mostly(_FUNCTIONS)}, optional=optional))


_RULE = _odd_key(
    st.fixed_dictionaries(
        {
            "name": _mostly(st.sampled_from(["a", "b", "c", "d", "e", "f"]), _SCALAR),
            "phase": _mostly(_PHASE, _SCALAR),
            "match": _mostly(st.lists(_spec(1), min_size=1, max_size=3)),
        },
        optional={
            "kind": _mostly(st.sampled_from([k.value for k in RuleKind]), _SCALAR),
            "waiting_phase": _mostly(_PHASE, _SCALAR),
            "stage": _mostly(_STAGE, _SCALAR),
            "anywhere": _mostly(st.booleans(), _SCALAR),
            "versions": _mostly(st.lists(st.sampled_from(["U", "V1-0.11"]), max_size=2), _SCALAR),
        },
    )
)
_ROLE = st.fixed_dictionaries(
    {"role": _mostly(st.sampled_from([r.value for r in Role]), _SCALAR)},
    optional={"frames": _mostly(st.lists(_spec(0), max_size=2), _SCALAR), "titles": _SCALAR},
)
DOCUMENTS = _mostly(
    _odd_key(
        st.fixed_dictionaries(
            {
                "rules": _mostly(
                    st.lists(_RULE, max_size=4, unique_by=lambda rule: repr(rule.get("name"))),
                    _SCALAR,
                )
            },
            optional={
                "version": _SCALAR,
                "roles": _mostly(st.lists(_ROLE, max_size=2), _SCALAR),
                "fork_boundaries": _mostly(st.lists(_spec(0), max_size=2), _SCALAR),
                "ground_truth": _mostly(
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "spin_waits": _mostly(st.lists(_spec(0), max_size=2), _SCALAR),
                            "event_loop_leaves": _mostly(_spec(0), _SCALAR),
                        },
                    ),
                    _SCALAR,
                ),
            },
        )
    )
)

_YAML_TOKENS = [
    "rules:", "roles:", "match:", "- ", "{", "}", "[", "]", ", ", ": ", "\n", "  ", "&a ", "*a", "<<: *a",
    '"', "'", "!!python/object:os.system", "!!binary", "? ", "name: x", "function_re: ", "phase: idle", "#",
    "---", "...", "%YAML 1.1", "\t", "|", ">-",
]  # fmt: skip
YAMLISH = st.lists(st.sampled_from(_YAML_TOKENS) | st.text(max_size=4), max_size=40).map("".join)


def _dump(document: Any) -> str:
    return yaml.dump(document, Dumper=_DUMPER, allow_unicode=True, sort_keys=False)


# -------------------------------------------------------------- configs/phases.yaml, damaged


@st.composite
def shipped_parts(draw: st.DrawFn) -> Any:
    """A few of configs/phases.yaml's rules with its other sections, then damaged in place."""
    picked = draw(
        st.lists(st.sampled_from(range(len(PHASES["rules"]))), min_size=1, max_size=5, unique=True)
    )
    document = copy.deepcopy({**PHASES, "rules": [PHASES["rules"][i] for i in sorted(picked)]})
    for _ in range(draw(st.integers(0, 3))):
        places = list(_places(document))
        container, key = draw(st.sampled_from(places))
        action = draw(st.sampled_from(["drop", "wrong type", "regex", "duplicate", "rename"]))
        if action == "drop":
            del container[key]
        elif action == "wrong type":
            container[key] = draw(_ANY)
        elif action == "regex":
            container[key] = draw(REGEX)
        elif action == "duplicate" and isinstance(container, list):
            container.insert(key, copy.deepcopy(container[key]))
        elif action == "rename" and isinstance(container, dict):
            container[draw(st.sampled_from(_SPEC_KEYS + _RULE_KEYS + _TOP_KEYS))] = container.pop(
                key
            )
    if draw(st.booleans()):  # a regular expression of its own on some frame spec
        specs = [
            place
            for place in _places(document)
            if isinstance(place[0], dict) and "file" in place[0]
        ]
        if specs:
            spec = draw(st.sampled_from(specs))[0]
            spec["function_re"] = draw(REGEX)
    return document


def _places(node: Any) -> Any:
    """(container, key) for every value in NODE, depth first."""
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, value in list(items):
        yield node, key
        yield from _places(value)


_NOISE = st.sampled_from(_YAML_TOKENS) | st.text(max_size=12)


@st.composite
def damaged_text(draw: st.DrawFn) -> str:
    """A part of configs/phases.yaml as text, with lines cut, dropped, doubled or garbled."""
    lines = _dump(draw(shipped_parts())).split("\n")
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["cut", "drop", "double", "insert", "garble", "indent"]))
        if action == "cut":
            lines = [*lines[:i], lines[i][: draw(st.integers(0, len(lines[i])))]]
        elif action == "drop" and len(lines) > 1:
            del lines[i]
        elif action == "double":
            lines.insert(i, lines[i])
        elif action == "insert":
            lines.insert(i, draw(_NOISE))
        elif action == "garble":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + draw(_NOISE) + lines[i][at:]
        elif action == "indent":
            lines[i] = " " * draw(st.integers(0, 9)) + lines[i].lstrip()
    return "\n".join(lines)


# ------------------------------------------------------------------------------- properties


def _load_and_classify(
    text: str, stacks: tuple[tuple[Frame, ...], ...] = (*REAL_STACKS, HOSTILE_FRAMES)
) -> RuleSet | None:
    """TEXT's rule set, and STACKS classified with it; None when it is refused with
    ConfigError. Any other exception fails the test."""
    try:
        rules = parse_rules(text, "rules.yaml")
    except ConfigError as error:
        assert str(error).startswith("rules.yaml"), error  # it names the file
        return None
    assert isinstance(rules, RuleSet)
    for frames in stacks:
        classify_frames(rules, frames)
    return rules


# Found by these properties (issue 26): `roles:`, `fork_boundaries:` or a rule's `versions:`
# holding a number or `true` raised TypeError ("'int' object is not iterable"), an exit 70 as a
# bug, instead of a ConfigError naming the key.
WHERE_A_LIST_GOES = {
    "roles: true": "rules: []\nroles: true\n",
    "fork_boundaries: 1.5": "rules: []\nfork_boundaries: 1.5\n",
    "versions: 3": "rules: [{name: x, phase: idle, versions: 3, match: [{function: f}]}]\n",
}


@pytest.mark.parametrize("text", WHERE_A_LIST_GOES.values(), ids=WHERE_A_LIST_GOES.keys())
def test_a_number_where_a_list_goes_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^rules\.yaml"):
        parse_rules(text, "rules.yaml")


@cases(100)
@given(st.text(max_size=200) | YAMLISH)
@example("rules: []")
@example("rules: [{name: x, phase: idle, match: [{function: '*'}]}]\nroles: [{role: worker}]")
@example("&a [*a]")
@example("rules: " + "[" * 5000)
def test_any_text_is_a_rule_set_or_a_config_error(text: str) -> None:
    with bounded(f"parse_rules({text[:60]!r})"):
        loaded = _load_and_classify(text)
    event("loaded and classified" if loaded else "refused")


@cases(100)
@given(DOCUMENTS.map(_dump))
def test_documents_of_the_rules_keys_load_or_are_refused(text: str) -> None:
    with bounded(f"parse_rules of\n{text[:400]}"):
        loaded = _load_and_classify(text)
    event("loaded and classified" if loaded else "refused")


@cases(40)
@given(shipped_parts().map(_dump) | damaged_text())
@example(PHASES_TEXT)  # the shipped file itself, whole
def test_damaged_parts_of_the_shipped_rules_load_or_are_refused(text: str) -> None:
    with bounded(f"parse_rules of\n{text[:400]}"):
        loaded = _load_and_classify(text)
    event("loaded and classified" if loaded else "refused")


# --------------------------------------------------------- catastrophic regular expressions

# Issue 26, item 14: a `function_re:` that backtracks exponentially on a frame name it does not
# match: rules.py runs user patterns on RE2 (linear time), so each finishes at once. The CPU bound is small: loading one rule and classifying four frames takes a
# millisecond or two.
CATASTROPHIC = {
    "nested plus": r"(\w+)+!",
    "overlapping alternation": r"^(a|aa)+$",
    "nested quantifier": r"(a+)+$",
}


@pytest.mark.parametrize("pattern", CATASTROPHIC.values(), ids=CATASTROPHIC.keys())
def test_a_catastrophic_user_regex_is_refused_or_bounded(pattern: str) -> None:
    text = _dump({"rules": [{"name": "x", "phase": "idle", "match": [{"function_re": pattern}]}]})
    with bounded(f"function_re {pattern!r}", cpu_s=0.15):
        _load_and_classify(text, (HOSTILE_FRAMES,))
