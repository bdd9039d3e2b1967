"""Continuous mode's parts: the rate planner, per-process py-spy outcomes merged, a window of
periods put together, the periods' schedule, the per-process efficiency, and schema 6."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.config.load import load_config, validate
from sidecar.config.settings import Config, SamplingConfig, ScheduleConfig
from sidecar.daemon.schedule import Schedule
from sidecar.errors import ConfigError
from sidecar.parsers import parse_raw
from sidecar.records import ProcessInfo, Role
from sidecar.records.window import SamplingMode, Window, merge_windows
from sidecar.sampling.continuous import AIM, MAX_HZ, RolePlanner, is_continuous
from sidecar.sampling.pyspy import ProcessRate, RecordOutcome, merge_outcomes
from sidecar.store.summary_io import parse_summary
from sidecar.store.writers import to_jsonable
from sidecar.window.snapshot import build_snapshot, process_sampling

MATRIX = Path(__file__).resolve().parents[2] / "fixtures" / "matrix" / "0.32.0" / "mixed"
RAW = (MATRIX / "record.raw.txt").read_text()


def proc(pid: int, role: Role, title: str = "") -> ProcessInfo:
    return ProcessInfo(pid=pid, start_time=1, ppid=1, cmdline=(title,), title=title, role=role)


PROCS = (proc(10, Role.API_SERVER, "vllm serve"), proc(11, Role.OTHER, "resource_tracker"),
         proc(12, Role.ENGINE_CORE, "VLLM::EngineCore"), proc(13, Role.WORKER, "VLLM::Worker"))  # fmt: skip


class Meter:
    def __init__(self) -> None:
        self.t = 0.0
        self.cpu = 0.0

    def clock(self) -> float:
        return self.t

    def own(self) -> float:
        return self.cpu


def outcome(cpu_s: float, wall_s: float) -> RecordOutcome:
    return RecordOutcome("", 0, "", 0, 0, cpu_s, wall_s, False)


def test_the_plan_gives_each_role_its_weight_and_leaves_other_processes_out() -> None:
    planner = RolePlanner(budget=0.01, hz=4.0)
    plan = {p.pid: p for p in planner.plan(PROCS)}
    assert set(plan) == {10, 12, 13}  # the resource tracker is not sampled
    assert (plan[12].rate_hz, plan[12].share) == (4, 1.0) and plan[13].rate_hz == 4
    assert (plan[10].rate_hz, plan[10].share) == (1, 1.0)  # a quarter of 4 Hz
    slow = {p.pid: p for p in RolePlanner(budget=0.01, hz=0.6).plan(PROCS)}
    # below py-spy's least rate: 1 Hz for part of the segment
    assert (slow[12].rate_hz, slow[12].share) == (1, pytest.approx(0.6))
    assert (slow[10].rate_hz, slow[10].share) == (1, pytest.approx(0.15))
    assert planner.requested() == 9.0


def test_the_planner_spends_the_budget_left_after_the_sidecars_own_cpu() -> None:
    m = Meter()
    planner = RolePlanner(budget=0.01, hz=1.0, clock=m.clock, self_cpu=m.own)
    planner.plan(PROCS)  # 2.25 samples/s asked
    planner.started()
    # 60 s: py-spy spent 0.27 s (2 ms a sample), the sidecar 0.12 s (0.2 % of a core)
    m.t, m.cpu = 60.0, 0.12
    hz = planner.update(outcome(0.27, 60.0))
    # it aims at 90 % of 1 %: 0.9 % - 0.2 % = 0.7 % left -> 3.5 samples/s at 2 ms each
    assert hz == pytest.approx(3.5 / 2.25)
    assert planner.last_cost_share == pytest.approx((0.27 + 0.12) / 60)
    planner.plan(PROCS)  # 2 + 2 + 0.39 samples/s now
    asked = planner.requested()
    m.t, m.cpu = 120.0, 0.24
    # over the horizon (both segments): 0.81 s of py-spy for 2.25*60 + asked*60 samples
    per_sample = (0.27 + 0.54) / (2.25 * 60 + asked * 60)
    expected = hz * ((AIM * 0.01 - 0.24 / 120) / per_sample) / asked
    assert planner.update(outcome(0.54, 60.0)) == pytest.approx(expected)


def test_the_planner_counts_what_happens_between_windows_and_keeps_its_floor() -> None:
    m = Meter()
    planner = RolePlanner(budget=0.01, min_hz=0.5, hz=1.0, clock=m.clock, self_cpu=m.own)
    planner.plan(PROCS)
    planner.started()
    m.t, m.cpu = 60.0, 0.0
    planner.update(outcome(0.135, 60.0))
    # a snapshot written between two windows: 0.9 s of the sidecar's CPU, before the next
    planner.started()  # no effect: the first start only
    m.t, m.cpu = 130.0, 0.9
    planner.plan(PROCS)
    hz = planner.update(outcome(0.27, 60.0))
    assert hz == 1.0  # the write's cost is seen: over budget, the rate halves (2 -> 1)
    for _ in range(10):  # whatever the cost, never below the floor
        m.t, m.cpu = m.t + 60, m.cpu + 5.0
        planner.plan(PROCS)
        hz = planner.update(outcome(0.5, 60.0))
    assert hz == 0.5
    assert RolePlanner(budget=1.0, hz=MAX_HZ).plan(PROCS)[0].rate_hz <= MAX_HZ


def test_per_process_outcomes_merge_as_one_subprocesses_run_would_read() -> None:
    raw12 = "thread (12): MainThread;step (vllm/v1/engine/core.py:1) 3\n"
    raw13 = 'process 13:"VLLM::Worker";thread (13): MainThread;execute_model (a.py:1) 2\n'
    plan = (ProcessRate(12, 2, 1.0, 'VLLM::"EngineCore"'), ProcessRate(13, 1, 0.5, "VLLM::Worker"))
    merged = merge_outcomes(plan, {
        12: RecordOutcome(raw12, 0, "", 3, 1, 0.2, 60.0, False, behind_s=1.5),
        13: RecordOutcome(raw13, 0, "", 2, 0, 0.1, 30.0, False)})  # fmt: skip
    stacks = parse_raw(merged.raw).stacks
    assert {(s.pid, s.weight) for s in stacks} == {(12, 3), (13, 2)}
    assert merged.raw.startswith("process 12:\"VLLM::'EngineCore'\";thread")
    assert (merged.samples, merged.errors, merged.wall_s) == (5, 1, 60.0)
    assert merged.cpu_s == pytest.approx(0.3)
    assert merged.returncode == 0 and not merged.target_exited and merged.behind_s == 1.5
    worker = merged.per_process[1]
    assert (worker.requested_hz, worker.wall_s, worker.cpu_s) == (0.5, 60.0, 0.1)
    # one process gone (a worker restarting): the segment goes on; all gone: the target exited
    one = merge_outcomes(plan, {12: RecordOutcome(raw12, 1, "Error: no such process", None,
                                                  None, 0.0, 1.0, True),
                                13: RecordOutcome(raw13, 0, "", 2, 0, 0.1, 30.0, False)})  # fmt: skip
    assert one.returncode == 0 and not one.target_exited


def _window(
    start: float, seconds: float, raw: str, mode: SamplingMode = SamplingMode.CONTINUOUS
) -> Window:
    stacks = parse_raw(raw).stacks
    return Window(started_at=start, duration_s=seconds, rate_hz=1.0, stacks=stacks,
                  samples=sum(s.weight for s in stacks), errors=1, sampler_cpu_s=0.1,
                  segments=5, elapsed_s=seconds, self_cpu_s=0.05, mode=mode)  # fmt: skip


def test_periods_put_together_keep_every_sample_and_their_order() -> None:
    a, b = _window(1000.0, 300.0, RAW), _window(1300.0, 300.0, RAW)
    hour = merge_windows([a, b])
    assert hour.samples == 2 * a.samples and hour.duration_s == 600.0
    assert sum(s.weight for s in hour.stacks) == 2 * sum(s.weight for s in a.stacks)
    assert len(hour.stacks) == len(a.stacks)  # the same stacks, counted together
    assert (hour.started_at, hour.elapsed_s, hour.segments) == (1000.0, 600.0, 10)
    assert hour.self_cpu_s == pytest.approx(0.1) and hour.mode == "continuous"


def test_merging_period_by_period_gives_the_hours_merge() -> None:
    """HourRun merges each period as it comes (one window's stacks held, not twelve)."""
    other = "thread (12): MainThread;step (vllm/v1/engine/core.py:1) 4\n"
    periods = [_window(1000.0 + 300 * i, 300.0 - i, RAW if i % 2 else other) for i in range(4)]
    step = periods[0]
    for w in periods[1:]:
        step = merge_windows([step, w])
    whole = merge_windows(periods)
    assert {s: s.weight for s in step.stacks} == {s: s.weight for s in whole.stacks}
    assert replace(step, stacks=()) == replace(whole, stacks=())


def test_each_process_gets_its_achieved_rate_from_its_main_thread() -> None:
    stacks = parse_raw(RAW).stacks
    pids = sorted({s.pid for s in stacks if s.pid is not None})
    processes = tuple(proc(pid, Role.OTHER) for pid in pids)
    w = Window(started_at=0.0, duration_s=8.0, rate_hz=20.0, stacks=stacks,
               samples=sum(s.weight for s in stacks), errors=0, sampler_cpu_s=0.0, segments=1)  # fmt: skip
    out = {p.pid: p for p in process_sampling(w, processes)}
    for pid in pids:
        main = sum(s.weight for s in stacks if s.pid == pid and s.thread_id == str(pid))
        assert out[pid].achieved_hz == pytest.approx(round(main / 8.0, 3))
        assert out[pid].requested_hz == 20.0 and out[pid].errors is None  # one py-spy: unknown


def test_continuous_periods_end_on_the_wall_grid() -> None:
    wall = [1_780_000_000.0]
    s = Schedule(ScheduleConfig(interval_s=300, baseline_every_s=3600), lambda: 0.0,
                 lambda: wall[0], random.Random(0), continuous=True)  # fmt: skip
    assert s.plan().duration_s == 200.0  # to 1_780_000_200, a multiple of 300
    wall[0] = 1_780_000_100.0 + 0.5  # 99.5 s before the boundary: less than half -> runs on
    assert s.plan().duration_s == pytest.approx(399.5)


def test_continuous_mode_needs_periods_that_make_the_hour(tmp_path: Path) -> None:
    bad = Config(schedule=ScheduleConfig(interval_s=420.0, baseline_every_s=3600.0))
    with pytest.raises(ConfigError, match="not a whole multiple"):
        validate(bad)
    validate(Config(schedule=ScheduleConfig(interval_s=420.0, baseline_every_s=3600.0),
                    sampling=SamplingConfig(mode=SamplingMode.WINDOWS)))  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text("sampling:\n  mode: always\n")
    with pytest.raises(ConfigError, match=r"sampling.mode.*give continuous or windows"):
        load_config(path, {})
    assert is_continuous(Config()) and not is_continuous(
        Config(sampling=SamplingConfig(mode=SamplingMode.WINDOWS))
    )


def test_the_sampling_mode_is_read_as_its_enum_and_a_dump_is_no_mode_to_configure(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("sampling:\n  mode: Windows\n")
    assert load_config(path, {}).sampling.mode is SamplingMode.WINDOWS
    assert Config().sampling.mode is SamplingMode.CONTINUOUS
    environ = {"VLLM_SIDECAR_SAMPLING_MODE": "continuous"}
    assert load_config(path, environ).sampling.mode is SamplingMode.CONTINUOUS
    path.write_text("sampling:\n  mode: dump\n")  # a stall incident's, never the sampler's
    with pytest.raises(ConfigError, match=r"sampling.mode.*give continuous or windows"):
        load_config(path, {})


def test_a_schema_5_summary_reads_as_7_with_nothing_guessed() -> None:
    stacks = parse_raw(RAW).stacks
    w = _window(1000.0, 8.0, RAW)
    procs = tuple(proc(pid, Role.OTHER) for pid in sorted({s.pid for s in stacks if s.pid}))
    summary = build_snapshot(w, procs, Classifier(load_rules(None))).summary("snapshot")
    data = json.loads(json.dumps(to_jsonable(summary)))
    assert data["schema"] == 7
    old = dict(data, schema=5)
    old.pop("cause")
    old["sampling"] = {k: v for k, v in data["sampling"].items()
                       if k not in ("mode", "self_cpu_s", "processes", "unit_s")}  # fmt: skip
    for block in old["sampling"]["blocks"]:
        block.pop("parts", None)
    read = parse_summary(old)
    assert read.schema == 7 and read.cause is None
    assert read.sampling.unit_s is None and all(not b.parts for b in read.sampling.blocks)
    assert read.sampling.mode is None and read.sampling.self_cpu_s is None
    assert read.sampling.processes == ()


def test_doctor_reports_each_process_asked_and_got_and_the_cpu_against_the_budget(
    tmp_path: Path,
) -> None:
    from sidecar.config.settings import OutputConfig
    from sidecar.doctor import Status, sampler_checks
    from sidecar.records.window import ProcessOutcome
    from sidecar.store.writers import write_snapshot

    stacks = parse_raw(RAW).stacks
    pids = sorted({s.pid for s in stacks if s.pid is not None})
    processes = tuple(proc(pid, Role.ENGINE_CORE if i == 0 else Role.OTHER)
                      for i, pid in enumerate(pids))  # fmt: skip
    own = (ProcessOutcome(pids[0], 2.0, 40, 3, 0.05, 8.0, 1.5),)
    w = Window(started_at=1_780_000_000.0, duration_s=8.0, rate_hz=2.0, stacks=stacks,
               samples=sum(s.weight for s in stacks), errors=3, sampler_cpu_s=0.05,
               segments=1, self_cpu_s=0.03, per_process=own,
               mode=SamplingMode.CONTINUOUS)  # fmt: skip
    write_snapshot(build_snapshot(w, processes, Classifier(load_rules(None))), tmp_path / "host")
    (check,) = sampler_checks(Config(output=OutputConfig(dir=tmp_path)))
    assert check.name == "sampler host" and "(continuous)" in check.detail
    assert "the sidecar used 1.00% of a core (py-spy's and its own), budget 1%" in check.detail
    assert f"engine_core {pids[0]}: asked 2.00/s, got" in check.detail
    assert "3 errors, 1.5 s behind" in check.detail
    assert check.status is Status.OK or "CPU weight" in check.fix


def test_per_process_slices_merge_by_time_with_their_process_frame() -> None:
    k12 = "thread (12): MainThread;step (vllm/v1/engine/core.py:1)"
    k13 = "thread (13): MainThread;execute_model (a.py:1)"
    plan = (ProcessRate(12, 2, 1.0, "VLLM::EngineCore"), ProcessRate(13, 1, 1.0, "VLLM::Worker"))
    merged = merge_outcomes(plan, {
        12: RecordOutcome(f"{k12} 3\n", 0, "", 3, 0, 0.2, 4.0, False, parts=({k12: 2}, {k12: 1})),
        13: RecordOutcome(f"{k13} 1\n", 0, "", 1, 0, 0.1, 4.0, False, parts=({k13: 1},))})  # fmt: skip
    assert merged.parts == (
        {f'process 12:"VLLM::EngineCore";{k12}': 2, f'process 13:"VLLM::Worker";{k13}': 1},
        {f'process 12:"VLLM::EngineCore";{k12}': 1},
    )
    # a process whose py-spy kept no order: the segment has none either
    plain = merge_outcomes(plan, {
        12: RecordOutcome(f"{k12} 3\n", 0, "", 3, 0, 0.2, 4.0, False, parts=({k12: 3},)),
        13: RecordOutcome(f"{k13} 1\n", 0, "", 1, 0, 0.1, 4.0, False)})  # fmt: skip
    assert plain.parts == ()
