"""The real py-spy binary behind SubprocessPySpy, against real Python processes.

py-spy `record` writes its status lines ("Sampling process ...", "Samples: N Errors: M", "1.2s
behind in sampling", "Stopped sampling because process exited") on stdout, not stderr. These
tests hold the runner to what py-spy really prints: a runner that read the wrong stream would
time its windows from launch instead of from attach and lose py-spy's own counts.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import replace

import psutil
import pytest

from sidecar.parsers import parse_raw
from sidecar.sampling.pyspy import RecordOutcome, RecordRequest, SubprocessPySpy
from tests.integration.targets import python_target

pytestmark = pytest.mark.integration

BUSY = "while True: sum(range(1000))\n"


def test_py_spys_own_counts_and_start_are_read(started: list[subprocess.Popen[bytes]]) -> None:
    pid = python_target(started, BUSY)
    request = RecordRequest(pid=pid, rate_hz=20, duration_s=3.0)
    heard: list[tuple[RecordRequest, float]] = []
    runner = replace(SubprocessPySpy.find(), on_sampling=lambda r, s: heard.append((r, s)))
    outcome = runner.record(request, stop=lambda: False)
    assert outcome.returncode == 0, outcome.output
    # The CLI's "sampling vLLM ... (py-spy attached in 0.1 s)" comes from this call, made once.
    ((said, attach_s),) = heard
    assert said == request and abs(attach_s - outcome.attach_s) < 0.05
    assert "Sampling process 20 times a second" in outcome.output
    # py-spy's own count, read from what it printed, and the stacks it wrote agree.
    assert outcome.samples is not None and outcome.errors is not None, outcome.output
    assert outcome.samples == sum(s.weight for s in parse_raw(outcome.raw, source="t").stacks)
    # The window runs from when py-spy said it was sampling, and the sidecar's SIGINT ended it
    # (not py-spy's own --duration safety net, 5 s later).
    assert "Control-C" in outcome.output
    assert 2.5 <= outcome.wall_s <= 4.5, outcome
    assert 0 < outcome.attach_s < 10


def test_a_target_exiting_is_seen_in_py_spys_words(started: list[subprocess.Popen[bytes]]) -> None:
    pid = python_target(started, "end = time.time() + 1.5\nwhile time.time() < end: pass\n")
    request = RecordRequest(pid=pid, rate_hz=20, duration_s=6.0)
    outcome = SubprocessPySpy.find().record(request, stop=lambda: False)
    assert outcome.target_exited, outcome.output
    assert outcome.wall_s < 5.0


def test_a_stalled_py_spy_reports_how_late_it_is(started: list[subprocess.Popen[bytes]]) -> None:
    """Starvation made real: py-spy is stopped (SIGSTOP) for 2.5 s mid-window, as a scheduler
    that runs other work for that long would; py-spy says how far behind it is, and the runner
    keeps that."""
    pid = python_target(started, BUSY)
    outcome: list[RecordOutcome] = []
    request = RecordRequest(pid=pid, rate_hz=20, duration_s=6.0)
    recording = threading.Thread(
        target=lambda: outcome.append(SubprocessPySpy.find().record(request, lambda: False))
    )
    recording.start()
    try:
        deadline = time.monotonic() + 10
        while not (spies := [c for c in psutil.Process().children() if c.name() == "py-spy"]):
            assert time.monotonic() < deadline, "py-spy did not start"
            time.sleep(0.05)
        time.sleep(1.5)
        spies[0].suspend()
        time.sleep(2.5)
        spies[0].resume()
    finally:
        recording.join(30)
    assert 2.0 <= outcome[0].behind_s <= 4.0, outcome[0].output


def test_a_py_spy_that_does_not_stop_on_sigint_is_killed(
    started: list[subprocess.Popen[bytes]],
) -> None:
    """py-spy frozen (SIGSTOP) once sampling: the SIGINT at the deadline stays pending, so
    after the grace period the runner kills it and the window ends instead of hanging."""
    pid = python_target(started, BUSY)
    request = RecordRequest(pid=pid, rate_hz=20, duration_s=2.0)
    runner = replace(SubprocessPySpy.find(), kill_grace_s=2.0)
    outcome: list[RecordOutcome] = []
    recording = threading.Thread(
        target=lambda: outcome.append(runner.record(request, lambda: False))
    )
    began = time.monotonic()
    recording.start()
    deadline = time.monotonic() + 10
    while not (spies := [c for c in psutil.Process().children() if c.name() == "py-spy"]):
        assert time.monotonic() < deadline, "py-spy did not start"
        time.sleep(0.05)
    time.sleep(0.5)
    spies[0].suspend()  # never resumed: only SIGKILL ends it now
    recording.join(30)
    assert not recording.is_alive(), "the runner waited for a py-spy that would never exit"
    (ended,) = outcome
    assert ended.killed_after_s is not None and 2.0 <= ended.killed_after_s < 3.0, ended
    assert ended.returncode == -9 and time.monotonic() - began < 20
