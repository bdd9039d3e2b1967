"""The suite's time by directory, printed at its end: where `make test`'s minutes go (setup,
call and teardown of every test, by the folder of its file), beside the session's wall time."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import PurePosixPath

import pytest

_STARTED = time.monotonic()
_SECONDS: defaultdict[str, float] = defaultdict(float)
_TESTS: defaultdict[str, set[str]] = defaultdict(set)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    folder = str(PurePosixPath(report.nodeid.split("::", 1)[0]).parent)
    _SECONDS[folder] += report.duration
    _TESTS[folder].add(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _SECONDS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("time by directory")
    for folder, seconds in sorted(_SECONDS.items(), key=lambda kv: -kv[1]):
        write(f"{seconds:8.1f} s  {len(_TESTS[folder]):5d} tests  {folder}")
    write(f"{sum(_SECONDS.values()):8.1f} s  in tests; {time.monotonic() - _STARTED:.1f} s wall")
