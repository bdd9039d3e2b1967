"""The advice rules' expression language: precedence, percentages, unknown figures (Kleene's
three-valued logic) and the errors a typo gets, with no `eval` anywhere."""

from __future__ import annotations

import re

import pytest

from sidecar.advice.expr import ExprError, evaluate, is_condition, names, parse
from sidecar.advice.rules import parse_advice
from sidecar.errors import ConfigError

FIG = {"a": 2.0, "b": 0.5, "zero": 0.0}


def val(text: str) -> float | bool | None:
    return evaluate(parse(text), FIG.get)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1 + 2 * 3", 7.0),
        ("(1 + 2) * 3", 9.0),
        ("-a + 3", 1.0),
        ("a / 4", 0.5),
        ("90%", 0.9),
        ("b >= 50%", True),
        ("a > 1 and b < 0.4", False),
        ("a > 1 or b < 0.4", True),
        ("not a > 1", False),
        ("a > 1 and not (b > 1 or zero > 0)", True),
        ("a == 2 and b != 2", True),
        ("1e-3 < 0.01", True),
        ("a / zero", None),  # division by zero: unknown, not an error
    ],
)
def test_values(text: str, value: float | bool | None) -> None:
    assert val(text) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("missing > 1", None),
        ("missing > 1 or a > 1", True),  # one true side decides `or`
        ("missing > 1 and a > 5", False),  # one false side decides `and`
        ("missing > 1 and a > 1", None),
        ("not missing > 1", None),
        ("missing + 1 > 0", None),
    ],
)
def test_a_missing_figure_is_unknown_not_zero(text: str, value: bool | None) -> None:
    assert val(text) is value


def test_names_and_kinds() -> None:
    node = parse("main.engine_core.scheduling + x.y >= 30% or not serving.waiting > 0")
    assert list(names(node)) == ["main.engine_core.scheduling", "x.y", "serving.waiting"]
    assert is_condition(node) and not is_condition(parse("a + 1"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a >", "ends too early"),
        ("a > 1)", "unexpected ')'"),
        ("(a > 1", "not closed"),
        ("a $ 1", "cannot read"),
        ("__import__('os').system('x')", "cannot read"),
        ("a > 1 and 2", "`and` takes a condition"),
        ("(a > 1) + 1", "`+` takes a number"),
        ("not a", "`not` takes a condition"),
        ("a < b < 1", "unexpected '<'"),
        ("and", "unexpected 'and'"),
    ],
)
def test_errors_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ExprError, match=re.escape(message)):
        parse(text)


# Issue 26, item 13: each of these raised RecursionError (exit 70) or never finished; now each
# is refused with a message, fast.
HOSTILE_EXPRESSIONS = {
    "2,000 nested parentheses": "(" * 2000 + "serving.preemptions" + ")" * 2000 + " > 0",
    "2,000 nots": "not " * 2000 + "serving.preemptions > 0",
    "a flat sum of 5,000 names": " + ".join(["serving.preemptions"] * 5000) + " > 0",
    "2,000 unary minuses": "-" * 2000 + "serving.preemptions > 0",
}


@pytest.mark.parametrize("text", HOSTILE_EXPRESSIONS.values(), ids=HOSTILE_EXPRESSIONS.keys())
def test_hostile_expressions_are_refused_not_crashed(text: str) -> None:
    with pytest.raises(ExprError, match=r"nested over|tokens, over|expands to over"):
        parse(text)


def test_a_chain_of_defines_that_doubles_is_refused_at_load() -> None:
    lines = ["version: 1", "define:", "  d0: serving.preemptions"]
    lines += [f"  d{i}: d{i - 1} + d{i - 1}" for i in range(1, 41)]
    lines += ["rules:", "  - {name: x, when: d40 > 0, say: x, fix: y}"]
    with pytest.raises(ConfigError, match="expands to over"):
        parse_advice("\n".join(lines))
