"""A rules file's regexes run in time linear in the name (RE2), what RE2 cannot run is refused
at load naming the construct, and a rules file too slow on sample frames is refused at load
(issue 26, item 14: `(\\w+)+!` took 10 s on a 26-character name in the daemon's loop)."""

from __future__ import annotations

import itertools
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import default_rules_path, load_rules, parse_rules
from sidecar.errors import ConfigError
from sidecar.records import Frame, Phase, StackSample

_T = TypeVar("_T")


def rules_with(pattern: str) -> str:
    return (
        "rules:\n"
        "  - name: user\n    phase: scheduling\n"
        f"    match: [{{function_re: '{pattern}', file: '*'}}]\n"
    )


def _within(seconds: float, work: Callable[[], _T]) -> _T:
    """WORK's result, or a failed test when it runs past SECONDS (no pytest-timeout here). A
    SIGALRM, not a thread: `re` holds the GIL while it matches, but checks for signals."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still matching after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return work()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("length", [26, 40, 4000])
def test_a_backtracking_pattern_runs_in_linear_time(tmp_path: Path, length: int) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(rules_with(r"(\w+)+!"))
    classifier = Classifier(load_rules(path))
    name = "a" * length  # no `!`: a backtracking engine tries every split of the name

    def classify() -> tuple[object, Phase]:
        stack = StackSample((Frame(name, "x.py"), Frame(name + "!", "x.py")))
        return (classifier.rules.match(Frame(name, "x.py")).candidates,
                classifier.classify(stack).phase)  # fmt: skip

    candidates, phase = _within(1.0, classify)
    assert candidates == () and phase is Phase.SCHEDULING  # the frame with `!` matched


@pytest.mark.parametrize(
    ("pattern", "construct", "fix"),
    [
        (r"(a)\1", "a backreference", "RE2"),
        (r"(?P<n>a)(?P=n)", "a backreference", "RE2"),
        (r"foo(?=bar)", "a lookahead", "RE2"),
        (r"(?<!_)step", "lookbehind", "RE2"),
        (r"a*+", "a possessive quantifier", "drop the"),
        (r"(?>a+)b", "an atomic group", "drop the"),
        (r"step\Z", r"\Z", "write `$`"),
        (r"a{,3}", "{,3}", "{0,3}"),
    ],
)
def test_a_pattern_re2_cannot_run_is_refused_naming_the_construct(
    pattern: str, construct: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_rules(rules_with(pattern), "mine.yaml")
    message = str(raised.value)
    assert "mine.yaml: rule 'user'" in message and construct in message and fix in message


def test_a_python_syntax_error_is_still_a_bad_regular_expression() -> None:
    with pytest.raises(ConfigError, match="bad regular expression"):
        parse_rules(rules_with("(unclosed"))


def test_a_rules_file_too_slow_on_sample_frames_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(rules_with("step"))
    ticks = itertools.count(0.0, 0.5)  # every frame matched takes half a second
    with pytest.raises(ConfigError) as raised:
        load_rules(path, clock=lambda: next(ticks))
    message = str(raised.value)
    assert str(path) in message and "over 2 s" in message and "function_re" in message
    assert next(ticks) < 10  # it stopped once over the budget, not after every sample frame


def test_the_built_in_rules_are_within_the_budget_when_loaded_as_a_users_file() -> None:
    rules = load_rules(default_rules_path(), budget_s=2.0)
    assert rules.rules  # the shipped file, as a user's copy of it, loads
