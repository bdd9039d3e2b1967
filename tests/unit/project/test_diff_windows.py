"""The live diff harness's report on a CLI run that outlived its time: CI shows only the tail of
a failed run, so the main thread's innermost frames must be there, read from a real dump."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devtools.diff_windows import _innermost, _with_group

RECORDED = Path(__file__).parents[2] / "fixtures" / "recorded"


def test_innermost_frames_are_the_main_threads_not_the_first_threads() -> None:
    dumped = (RECORDED / "v0.32.0-cpu-apiserver-dump.txt").read_text()
    assert _innermost(dumped, count=2).splitlines() == [
        "Runner.run (asyncio/runners.py:118)",
        "run (uvloop/__init__.py:92)",
    ]


def test_innermost_frames_of_an_unnamed_thread_and_of_no_dump() -> None:
    # py-spy names threads only once the target imported `threading`.
    unnamed = "Process 7: python -c x\n\nThread 7 (active+gil)\n    <module> (<string>:2)\n"
    assert _innermost(unnamed) == "<module> (<string>:2)"
    assert _innermost("Error: Failed to find python version") == "(no thread in the dump)"


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroup scheduling")
def test_a_busy_process_line_names_its_scheduling_group() -> None:
    # CI's starved window: the CLI got 0.2 % of a core in a niced group; this says which group.
    mine = Path("/proc/self/autogroup").read_text().strip().lstrip("/")
    line = f"{os.getpid():>6}     1 S      0  0.5     10 python"
    assert _with_group(line) == f"{line}  [{mine}]"


def test_a_line_without_a_living_pid_is_left_as_it_is() -> None:
    header = "  PID  PPID STAT  NI %CPU ELAPSED   RSS COMMAND"
    assert _with_group(header) == header
    assert _with_group("") == ""
