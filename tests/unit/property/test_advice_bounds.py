"""The advice expressions (sidecar/advice/expr.py) on any text, in bounded time and memory.

`parse` either gives a tree or raises ExprError (which the rules loader turns into a ConfigError
naming the rule); never RecursionError or any other exception, and never a hang. Inputs: any
text, text of the language's own tokens, expressions built by its grammar, shapes stretched
around its bounds (MAX_TOKENS, MAX_NESTING, MAX_DEPTH, MAX_SIZE: nested parentheses, `not` and
`-` chains, long sums), and whole advice files whose `define:` entries use each other. What
parses is evaluated with figures that are missing, zero, huge or not numbers.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable

import pytest
import yaml
from hypothesis import event, example, given
from hypothesis import strategies as st

from sidecar.advice.expr import (
    MAX_DEPTH,
    MAX_NESTING,
    MAX_SIZE,
    MAX_TOKENS,
    ExprError,
    Node,
    evaluate,
    is_condition,
    names,
    parse,
)
from sidecar.advice.rules import AdviceRules, Placeholder, load_advice, parse_advice
from sidecar.errors import ConfigError
from tests.unit.property.bounds import bounded, cases

# The figures the shipped rules read.
FIGURES = sorted({n for rule in load_advice().rules for n in names(rule.when)})
NUMBERS = ["0", "1", "2.5", ".5", "1.", "90%", ".5%", "1e3", "1e-3%", "1e999", "1e-999", "5e-324"]
_COMPARE = ["<", "<=", ">", ">=", "==", "!="]
_ARITH = ["+", "-", "*", "/"]
_TOKENS = [*FIGURES[:8], *NUMBERS, *_COMPARE, *_ARITH, "(", ")", "and", "or", "not", "%", "x"]

# ------------------------------------------------------------------------------- strategies

_NUMBER = st.sampled_from(NUMBERS) | st.floats(min_value=0, allow_nan=False).map(repr)
_NAME = st.sampled_from(FIGURES) | st.from_regex(
    r"[a-z_][a-z0-9_]{0,6}(\.[a-z0-9_]{1,6}){0,3}", fullmatch=True
)


def _numbers(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, st.sampled_from(_ARITH), inner).map(" ".join),
        inner.map(lambda s: f"({s})"),
        inner.map(lambda s: f"-{s}"),
    )


# Well-typed: a number is compared, a comparison combined (most of them parse).
NUMBER_EXPR = st.recursive(_NUMBER | _NAME, _numbers, max_leaves=12)
_COMPARISON = st.tuples(NUMBER_EXPR, st.sampled_from(_COMPARE), NUMBER_EXPR).map(" ".join)


def _conditions(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(st.sampled_from([" and ", " or "]), st.lists(inner, min_size=2, max_size=4)).map(
            lambda pair: pair[0].join(pair[1])
        ),
        inner.map(lambda s: f"({s})"),
        inner.map(lambda s: f"not {s}"),
    )


CONDITION = st.recursive(_COMPARISON, _conditions, max_leaves=10)
# Untyped: the same pieces put together without regard to kinds (most are refused).
TOKEN_SOUP = st.lists(st.sampled_from(_TOKENS), max_size=30).map(" ".join)

# Around the bounds: counts just under, at and over each, and far over.
_NEAR = sorted(
    {n + d for n in (MAX_NESTING, MAX_DEPTH, MAX_TOKENS // 2, MAX_TOKENS) for d in (-1, 0, 1)}
)
_COUNT = st.sampled_from(_NEAR) | st.integers(0, 3 * MAX_TOKENS)
_BIG = st.integers(0, 300_000)  # cheap tokens, many of them: the reader's own cost


@st.composite
def stretched(draw: st.DrawFn) -> str:
    """One shape repeated COUNT times: the inputs that raised RecursionError or ran for ever."""
    shape = draw(st.sampled_from(sorted(_SHAPES)))
    count = draw(_BIG if shape in _CHEAP else _COUNT)
    return _SHAPES[shape](count, draw(_COMPARISON), draw(_NUMBER | _NAME))


_SHAPES: dict[str, Callable[[int, str, str], str]] = {
    "parentheses": lambda n, cond, num: "(" * n + cond + ")" * n,
    "unclosed": lambda n, cond, num: "(" * n + cond + ")" * (n // 2),
    "nots": lambda n, cond, num: "not " * n + cond,
    "not-parens": lambda n, cond, num: "not (" * n + cond + ")" * n,
    "minuses": lambda n, cond, num: "-" * n + num + " > 0",
    "neg-parens": lambda n, cond, num: "-(" * n + num + ")" * n + " > 0",
    "sum": lambda n, cond, num: " + ".join([num] * max(n, 1)) + " > 0",
    "product": lambda n, cond, num: " * ".join([num] * max(n, 1)) + " > 0",
    "ands": lambda n, cond, num: " and ".join([cond] * max(n, 1)),
    "ors-of-parens": lambda n, cond, num: " or ".join([f"({cond})"] * max(n, 1)),
    "spaces": lambda n, cond, num: cond + " " * n,
    "names": lambda n, cond, num: "a " * n,
    "one-long-name": lambda n, cond, num: "a" * n + " > 0",
    "dotted-name": lambda n, cond, num: "a." * n + "b > 0",
    "one-long-number": lambda n, cond, num: "1" * n + " > 0",
    "junk-after": lambda n, cond, num: cond + " ?" * n,
}
_CHEAP = frozenset(
    {"spaces", "names", "one-long-name", "dotted-name", "one-long-number", "junk-after"}
)

# Figure values: missing, zero (a divisor), huge, tiny, infinite and not a number.
_VALUE = (
    st.none()
    | st.sampled_from([0.0, -0.0, 1.0, 1e308, -1e308, 5e-324, math.inf, -math.inf, math.nan])
    | st.floats()
)
_LOOKUP = st.dictionaries(st.sampled_from(FIGURES), _VALUE)


# ------------------------------------------------------------------------------- properties


def _parsed(text: str) -> Node | None:
    """TEXT's tree, or None when it is refused with ExprError; anything else fails the test."""
    try:
        node = parse(text)
    except ExprError as error:
        assert str(error)  # it says what is wrong
        event("refused")
        return None
    event("parsed and evaluated")
    assert isinstance(node, Node)
    return node


def _evaluated(node: Node, figures: dict[str, float | None]) -> None:
    value = evaluate(node, figures.get)
    if is_condition(node):
        assert value is None or isinstance(value, bool), (node, value)
    else:
        assert value is None or isinstance(value, float), (node, value)


@cases(150)
@given(st.text(max_size=300) | TOKEN_SOUP | CONDITION | NUMBER_EXPR, _LOOKUP)
@example("(" * 2000 + "a" + ")" * 2000 + " > 0", {})
@example("not " * 2000 + "a > 0", {})
@example(" + ".join(["a"] * 5000) + " > 0", {})
@example("-" * 2000 + "a > 0", {})
@example("1e999 * 1e999 - 1e999 * 1e999 > 0 or 1 / 0 > 0", {})
@example("a / b > 1", {"a": 1.0, "b": 5e-324})
def test_any_text_parses_or_is_refused(text: str, figures: dict[str, float | None]) -> None:
    with bounded(f"parse({text[:60]!r})"):
        node = _parsed(text)
        if node is not None:
            _evaluated(node, figures)


@cases(100)
@given(stretched(), _LOOKUP)
@example("a " * 300_000, {})  # read token by token to the end, rest copied at each: 3 s
def test_stretched_shapes_are_refused_or_read_within_bounds(
    text: str, figures: dict[str, float | None]
) -> None:
    with bounded(f"parse({text[:60]!r}..., {len(text)} characters)"):
        node = _parsed(text)
        if node is not None:
            _evaluated(node, figures)


# ------------------------------------------------------------------- whole files with defines

_RULE = {
    "id": "x",
    "severity": "info",
    "title": "t",
    "evidence": ["e"],
    "knob": "k",
    "flags": ["--max-num-seqs"],
    "why": "w",
    "docs": "https://docs.vllm.ai/x",
}


@st.composite
def advice_files(draw: st.DrawFn) -> str:
    """An advice file whose defines each use earlier ones, some doubling the one before (past
    MAX_SIZE after 14 doublings), the last maybe a condition; one in eight files has a define
    that is wrong (unknown names, a later define, any text). A rule uses the last define in
    `when:` and prints others in its evidence."""
    count = draw(st.integers(1, 40))
    wrong_at = draw(
        st.integers(0, 7).flatmap(lambda k: st.integers(0, count - 1) if k == 3 else st.none())
    )
    defines: dict[str, str] = {}
    for i in range(count):
        earlier = [f"d{j}" for j in range(i)]
        use = st.sampled_from(earlier + FIGURES) if earlier else st.sampled_from(FIGURES)
        if i == wrong_at:
            defines[f"d{i}"] = draw(
                TOKEN_SOUP
                | NUMBER_EXPR
                | st.text(max_size=20)
                | st.just(f"d{i} + 1")
                | st.just(f"d{count} * 2")
            )
        elif i == count - 1 and draw(st.booleans()):
            defines[f"d{i}"] = f"{draw(use)} {draw(st.sampled_from(_COMPARE))} {draw(_NUMBER)}"
        elif draw(st.booleans()) and earlier:
            defines[f"d{i}"] = f"{earlier[-1]} {draw(st.sampled_from(_ARITH))} {earlier[-1]}"
        else:
            terms = draw(st.lists(use, min_size=1, max_size=4))
            defines[f"d{i}"] = f" {draw(st.sampled_from(_ARITH))} ".join(terms)
    last, first = f"d{count - 1}", draw(st.sampled_from(sorted(defines)))
    when = draw(
        st.sampled_from(
            [f"{last} > 0", f"not {last}", f"{last} and {first} > 1", f"-{last} < 1 or {last}"]
        )
        | CONDITION
    )
    evidence = [f"{{{first}:pct}}", f"{{{last}}}"]
    document = {
        "version": 1,
        "define": defines,
        "rules": [{**_RULE, "when": when, "evidence": evidence}],
    }
    return yaml.safe_dump(document, sort_keys=False)


def many_uses(uses: int) -> str:
    """Found by the property below: a big define used by many; each use walked all of it again."""
    lines = ["define:", "  d0: serving.preemptions"]
    lines += [f"  d{i}: d{i - 1} + d{i - 1}" for i in range(1, 14)]  # 16,383 terms inlined
    lines += [f"  e{i}: d13 + {i}" for i in range(uses)]
    return "\n".join([*lines, "rules: []"])


@cases(50)
@given(advice_files(), _LOOKUP)
@example(many_uses(1000), {})  # 5 s before
def test_advice_files_with_defines_load_or_are_refused(
    text: str, figures: dict[str, float | None]
) -> None:
    with bounded("parse_advice"):
        try:
            rules = parse_advice(text, "advice.yaml")
        except ConfigError as error:
            assert str(error).startswith("advice.yaml")  # it names the file
            event("refused")
            return
        event("loaded and evaluated")
        assert isinstance(rules, AdviceRules)
        for rule in rules.rules:
            _evaluated(rule.when, figures)
            for line in rule.evidence:
                for part in line.parts:
                    if isinstance(part, Placeholder) and part.node is not None:
                        _evaluated(part.node, figures)


# ------------------------------------------------------------------ found by the properties


def test_a_long_expression_is_refused_in_linear_time() -> None:
    """The reader looked at the whole rest of the text again after every token, and read every
    token before counting them: 400,000 tokens (800 kB) took seconds; it now stops past
    MAX_TOKENS."""
    text = "a " * 400_000
    started = time.process_time()
    with pytest.raises(ExprError, match="tokens, over"):
        parse(text)
    assert time.process_time() - started < 0.5  # milliseconds now


def test_an_error_quotes_a_long_expression_shortened() -> None:
    """Every message quoted the whole expression: a refused 1 MB condition gave a 1 MB error."""
    with pytest.raises(ExprError) as error:
        parse("a > 1 )" + " " * 1_000_000)
    assert len(str(error.value)) < 300


def test_defines_used_many_times_load_in_linear_time() -> None:
    """Each use of a define walked its whole inlined tree again (for its figures' names and its
    bounds): 4,000 lines of `eN: d13 + N` after a doubling chain took 20 s. Each define is
    measured once now, where it is defined."""
    started = time.process_time()
    parse_advice(many_uses(4000))
    assert time.process_time() - started < 1.0  # 0.15 s


@pytest.mark.parametrize(
    ("step", "refused", "bound"),
    [
        ("d{p} + d{p}", "d14", f"expands to over {MAX_SIZE}"),
        ("d{p} + 1", "d200", f"nested over {MAX_DEPTH}"),
    ],
)
def test_a_define_still_counts_as_what_it_stands_for(step: str, refused: str, bound: str) -> None:
    """Measured once, a define still counts at each use with its own size and depth."""
    lines = ["define:", "  d0: serving.preemptions"]
    lines += [f"  d{i}: " + step.format(p=i - 1) for i in range(1, 250)]
    with pytest.raises(ConfigError, match=re.escape(f"a.yaml: define '{refused}': {bound}")):
        parse_advice("\n".join([*lines, "rules: []"]), "a.yaml")
