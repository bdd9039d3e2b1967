"""The per-case bounds themselves (tests/unit/property/bounds.py): each turns its kind of trouble
into a failing test, raised inside the call, and leaves no alarm or tracing behind."""

from __future__ import annotations

import contextlib
import re
import signal
import time
import tracemalloc
from collections.abc import Callable

import pytest

from tests.unit.property.bounds import bounded


def _backtracks() -> None:
    re.search(r"(\w+)+!", "a" * 40)  # 2**40 steps: never ends on its own


def _swallows() -> None:
    with contextlib.suppress(Exception):  # code that catches everything cannot hide a hang
        _backtracks()


def _sleeps() -> None:
    time.sleep(30)


def _allocates() -> None:
    bytearray(8 * 2**20)


CASES: dict[str, tuple[Callable[[], None], dict[str, float], str]] = {
    "a regex that backtracks": (_backtracks, {"cpu_s": 0.1}, "over 0.1 s of CPU time"),
    "a hang inside `except Exception`": (_swallows, {"cpu_s": 0.1}, "over 0.1 s of CPU time"),
    "a call that blocks": (_sleeps, {"wall_s": 0.2}, "over 0.2 s of wall-clock time"),
    "a blow-up in memory": (_allocates, {"peak_bytes": 2**20}, "8 MiB allocated at the peak"),
}


@pytest.mark.parametrize(("call", "limits", "message"), CASES.values(), ids=CASES.keys())
def test_a_case_past_its_bound_fails_naming_it(
    call: Callable[[], None], limits: dict[str, float], message: str
) -> None:
    failed = pytest.raises(pytest.fail.Exception, match=re.escape(f"the case: {message}"))
    with failed, bounded("the case", **limits):  # type: ignore[arg-type]
        call()
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGPROF) == signal.SIG_DFL
    assert not tracemalloc.is_tracing()


def test_a_case_within_its_bounds_passes_and_its_own_errors_pass_through() -> None:
    with bounded("the case"):
        assert re.search(r"(\w+)+!", "a" * 10 + "!")
    with pytest.raises(KeyError), bounded("the case"):
        raise KeyError("the code's own error")
