"""Hang detection (sidecar/daemon/hang.py) on real /metrics scrapes and real py-spy dumps of vLLM.

The scrapes are tests/fixtures/metrics' recorded ones; a state the recording did not catch
(requests waiting while nothing moves) is that scrape with its two request gauges set, the only
lines changed. The dumps are the matrix's recorded dumps of a real EngineCore and worker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.daemon.hang import (
    HangWatch,
    MainThread,
    Progress,
    StallJudge,
    State,
    blame,
    dumps_of,
    progress_of,
    stall_line,
)
from sidecar.records import ProcessInfo, Role, StackSample
from sidecar.records.readings import ThreadTime
from sidecar.vllm_metrics import MetricsScrape, parse_scrape

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
AFTER = (FIXTURES / "metrics" / "v0.32.0-cpu-after.txt").read_text()
BEFORE = (FIXTURES / "metrics" / "v0.32.0-cpu-before.txt").read_text()
DUMPS = FIXTURES / "matrix" / "0.32.0" / "mixed"


def scrape(
    text: str, at: float, running: float | None = None, waiting: float | None = None
) -> MetricsScrape:
    for name, value in (("running", running), ("waiting", waiting)):
        if value is not None:
            text = re.sub(rf"(vllm:num_requests_{name}{{[^}}]*}}) \S+", rf"\g<1> {value}", text)
    return parse_scrape(text, url="http://127.0.0.1:8000/metrics", taken_at=at, wall=at)


def test_progress_reads_pending_requests_and_every_counter_of_a_real_scrape() -> None:
    before, after = progress_of(scrape(BEFORE, 0.0)), progress_of(scrape(AFTER, 10.0))
    assert before.pending == 0 and after.pending == 0
    assert before.count is not None and after.count is not None
    # tokens, steps and finished requests all moved between the two recorded scrapes
    assert after.count - before.count > (25754 - 6855) + (7164 - 1803)
    busy = progress_of(scrape(AFTER, 11.0, running=4, waiting=3))
    assert busy.pending == 7 and busy.count == after.count


def test_a_failed_scrape_gives_no_judgement() -> None:
    failed = parse_scrape("not prometheus {", url="u", taken_at=1.0, wall=1.0)
    judge = StallJudge(stack_after_s=5, stall_after_s=20)
    assert judge.observe(progress_of(failed)).state is State.UNKNOWN


def test_an_idle_server_is_never_stalled_however_long_its_counters_stay_flat() -> None:
    judge = StallJudge(stack_after_s=5, stall_after_s=20)
    for t in range(0, 600, 5):
        v = judge.observe(progress_of(scrape(AFTER, float(t), running=0, waiting=0)), ("same",))
        assert v.state is State.IDLE


def test_a_long_step_is_not_a_stall_while_the_stack_moves_and_below_stall_after() -> None:
    judge = StallJudge(stack_after_s=5, stall_after_s=60)
    assert judge.observe(progress_of(scrape(BEFORE, 0.0, running=1))).state is State.OK
    for t in range(5, 60, 5):  # one huge prefill: no counter moves, the frames do
        v = judge.observe(progress_of(scrape(BEFORE, float(t), running=1)), (f"layer {t}",))
        assert v.state is State.LONG_STEP and v.flat_s == t
    # past stall_after_s no step of a serving engine is that long: stalled, whatever the stack
    v = judge.observe(progress_of(scrape(BEFORE, 60.0, running=1)), ("layer 60",))
    assert v.state is State.STALLED and "hang.stall_after_s" in v.why


def test_a_frozen_stack_with_work_pending_is_a_stall_after_stack_after_s_and_clears() -> None:
    judge = StallJudge(stack_after_s=10, stall_after_s=120)
    assert judge.observe(progress_of(scrape(BEFORE, 0.0, running=2, waiting=6))).state is State.OK
    states = [judge.observe(progress_of(scrape(BEFORE, float(t), running=2, waiting=6)),
                            ("frozen",)).state for t in (2, 7, 12, 13)]  # fmt: skip
    # the stack is first seen at 2 s: unchanged for 10 s at 12 s
    assert states == [State.LONG_STEP, State.LONG_STEP, State.STALLED, State.STALLED]
    v = judge.observe(progress_of(scrape(AFTER, 14.0, running=2, waiting=6)))
    assert v.state is State.OK  # the counters moved: progress resumed


def test_suspect_only_while_work_is_pending_and_the_counters_sit_still() -> None:
    judge = StallJudge(stack_after_s=5, stall_after_s=20)
    first = progress_of(scrape(BEFORE, 0.0, running=1))
    assert not judge.suspect(first)
    judge.observe(first)
    assert judge.suspect(progress_of(scrape(BEFORE, 5.0, running=1)))
    assert not judge.suspect(progress_of(scrape(AFTER, 5.0, running=1)))
    assert not judge.suspect(progress_of(scrape(BEFORE, 5.0, running=0)))


def _process(pid: int, role: Role, title: str) -> ProcessInfo:
    return ProcessInfo(pid=pid, start_time=1, ppid=1, cmdline=(title,), title=title, role=role)


ENGINE = _process(5078, Role.ENGINE_CORE, "VLLM::EngineCore")
WORKER = _process(5090, Role.WORKER, "VLLM::Worker")


class FakeProcFs:
    def __init__(self, states: dict[int, str]) -> None:
        self.states = states

    def thread_times(self, pid: int) -> tuple[ThreadTime, ...]:
        return (ThreadTime(pid, pid, "x", self.states.get(pid, "S"), 1.0, 0.01),)


def recorded_dump(pid: int, native: bool) -> tuple[int, str]:
    name = {5078: "enginecore"}[pid] + ("-native" if native else "")
    return 0, (DUMPS / f"dump-{name}.txt").read_text()


def test_the_watch_raises_once_names_the_frame_and_clears_on_progress() -> None:
    text = (DUMPS / "dump-worker.txt").read_text()
    worker_pid = int(re.search(r"Process (\d+)", text)[1])  # type: ignore[index]
    worker = _process(worker_pid, Role.WORKER, "VLLM::Worker")

    def dump(pid: int, native: bool) -> tuple[int, str]:
        name = "enginecore" if pid == ENGINE.pid else "worker"
        return 0, (DUMPS / f"dump-{name}.txt").read_text()

    texts = [scrape(BEFORE, 0.0, running=3)] + [scrape(BEFORE, float(t), running=3)
                                                for t in range(1, 9)] + [scrape(AFTER, 9.0)]  # fmt: skip
    raised, cleared = [], []

    class Source:
        url = "http://127.0.0.1:8000/metrics"

        def fetch(self) -> str:
            raise AssertionError("not used")

    watch = HangWatch(processes=(ENGINE, worker), metrics=Source(), dump=dump,
                      procfs=FakeProcFs({ENGINE.pid: "T"}),  # type: ignore[arg-type]
                      classifier=Classifier(load_rules(None)),
                      judge=StallJudge(stack_after_s=3, stall_after_s=60),
                      on_stall=raised.append,
                      on_clear=lambda s, seconds: cleared.append(s),
                      scrape=lambda source: next(feed))  # fmt: skip
    feed = iter(texts)
    states = [watch.check().state for _ in texts]
    # flat for 3 s of unchanged stacks (first dumped at 1 s): stalled from 4 s; the counters
    # moved in the last scrape (and nothing is left to do): cleared
    assert states[:4] == [State.OK, State.LONG_STEP, State.LONG_STEP, State.LONG_STEP]
    assert set(states[4:-1]) == {State.STALLED} and states[-1] is State.IDLE
    assert len(raised) == 1 and len(cleared) == 1
    stall = raised[0]
    assert stall.role is Role.ENGINE_CORE and stall.process_state == "T"
    assert stall.frame == "sched_yield (vllm/distributed/utils.py:46)"
    assert "stopped" in stall_line(stall) and "hang.stack_after_s" in stall_line(stall)


def test_blame_prefers_a_stopped_process_then_one_not_waiting_then_the_engine() -> None:
    classifier = Classifier(load_rules(None))
    from sidecar.parsers import InputFormat, parse_text

    def main(name: str, pid: int) -> StackSample:
        stacks = parse_text((DUMPS / f"dump-{name}.txt").read_text(), None,
                            InputFormat.PYSPY_DUMP).stacks  # fmt: skip
        return next(s for s in stacks if s.thread_name == "MainThread")

    from sidecar.daemon.hang import Verdict

    v = Verdict(State.STALLED, 30.0, 30.0, 4.0, "why")
    engine_main, worker_main = main("enginecore", ENGINE.pid), main("worker", WORKER.pid)
    stopped_worker = blame((MainThread(ENGINE, engine_main, "S"),
                            MainThread(WORKER, worker_main, "T")), classifier, v)  # fmt: skip
    assert stopped_worker.role is Role.WORKER
    none_stopped = blame((MainThread(ENGINE, engine_main, "S"),
                          MainThread(WORKER, None, "S")), classifier, v)  # fmt: skip
    assert none_stopped.role in (Role.ENGINE_CORE, Role.WORKER)


def test_an_incident_dump_falls_back_to_nonblocking_and_says_why() -> None:
    def dump(pid: int, native: bool) -> tuple[int, str]:
        if native:
            return 1, "Error: Failed to suspend process\n"
        return recorded_dump(pid, False)

    out = dumps_of((ENGINE,), dump)
    how, text = out[ENGINE.pid]
    assert how == "py-spy dump --nonblocking (--native failed: Error: Failed to suspend process)"
    assert "Thread 5078" in text
    ok = dumps_of((ENGINE,), recorded_dump)
    assert ok[ENGINE.pid][0] == "py-spy dump --native"


@pytest.mark.parametrize("state, words", [("T", "stopped"), ("D", "uninterruptible"), ("S", "")])
def test_the_stall_line_says_what_the_kernel_says_of_the_process(state: str, words: str) -> None:
    from sidecar.daemon.hang import Stall, Verdict

    line = stall_line(Stall(Role.ENGINE_CORE, 7, "f (a.py:1)", Verdict(State.STALLED, why="w"),
                            state))  # fmt: skip
    assert line.startswith("engine_core 7 stalled in f (a.py:1)") and words in line
    assert Progress(0, 1, 1).pending == 1


# ---------------------------------------------------------------- a freeze between two batches
# Issue 26, item 20: an EngineCore frozen after one batch ends and before the clients' next
# requests reach it leaves vLLM's gauges at 0 for ever. The clients' connections the API server
# holds open are the evidence it cannot freeze (tests/fixtures/sockets: recorded from a real
# API server with its EngineCore stopped and two completions sent).

SOCKETS = FIXTURES / "sockets"
API = _process(4415, Role.API_SERVER, "python -m vllm.entrypoints.openai.api_server")


def recorded_connections(moment: str) -> frozenset[int]:
    from sidecar.target.sockets import parse_net_tcp, served_connections, socket_inode

    tables = [parse_net_tcp((SOCKETS / f"{moment}-net-tcp{v}.txt").read_text()) for v in ("", "6")]
    fds = [
        line.split(" ", 1)[1] for line in (SOCKETS / f"{moment}-fd.txt").read_text().splitlines()
    ]
    held = frozenset(i for i in map(socket_inode, fds) if i is not None)
    return served_connections([s for t in tables for s in t], held)


def test_the_api_servers_open_client_connections_are_read_from_its_proc_tables() -> None:
    # two completions waiting on the frozen engine; none once answered (the listening socket,
    # vLLM's own ZMQ and the other processes' loopback sockets are not clients' connections)
    assert recorded_connections("frozen") == {205938, 205942}
    assert recorded_connections("idle") == frozenset()


def test_connections_held_with_the_gauges_at_zero_are_work_and_a_frozen_stack_a_stall() -> None:
    judge = StallJudge(stack_after_s=30, stall_after_s=120, held_after_s=7)
    assert judge.observe(progress_of(scrape(BEFORE, 0.0, running=0, waiting=0))).state is State.IDLE
    # the clients' next requests are held: too young at 5 and 10 s (a keep-alive connection the
    # server may not have closed yet), work from 15 s, timed from when first seen (5 s)
    for t in (5.0, 10.0):
        young = Progress(t, 0.0, progress_of(scrape(BEFORE, t)).count, held=2, held_s=t - 5.0)
        assert not judge.suspect(young) and judge.observe(young).state is State.IDLE
    states = []
    for t in range(15, 55, 5):
        p = Progress(float(t), 0.0, young.count, held=2, held_s=t - 5.0)
        assert judge.suspect(p)
        states.append((t, judge.observe(p, ("waiting for input",))))
    assert [v.state for _, v in states[:6]] == [State.LONG_STEP] * 6
    assert states[0][1].flat_s == 10.0  # waiting since the connections were first seen
    t, raised = states[6]
    assert raised.state is State.STALLED and t == 45  # the stack unchanged for 30 s
    assert "2 client connections held open" in raised.why and "gauges say none" in raised.why
    # answered: the counters moved, the gauges still at 0
    assert judge.observe(progress_of(scrape(AFTER, 50.0))).state is State.IDLE


def test_an_idle_server_without_connections_never_dumps_nor_stalls() -> None:
    judge = StallJudge(stack_after_s=5, stall_after_s=20, held_after_s=7)
    count = progress_of(scrape(AFTER, 0.0)).count
    for t in range(0, 600, 5):
        p = Progress(float(t), 0.0, count, held=0, held_s=0.0)
        assert not judge.suspect(p) and judge.observe(p).state is State.IDLE


def test_the_watch_raises_a_freeze_between_batches_from_the_held_connections() -> None:
    dumped: list[int] = []

    def dump(pid: int, native: bool) -> tuple[int, str]:
        dumped.append(pid)
        return recorded_dump(pid, native)

    # vLLM's gauges at 0 and its counters flat in every scrape: the frozen engine's last stats
    feed = iter([scrape(AFTER, float(t), running=0, waiting=0) for t in range(0, 60, 5)])
    connections = {API.pid: recorded_connections("frozen")}
    raised: list[object] = []
    watch = HangWatch(processes=(API, ENGINE), metrics=None,  # type: ignore[arg-type]
                      dump=dump, procfs=FakeProcFs({ENGINE.pid: "T"}),  # type: ignore[arg-type]
                      classifier=Classifier(load_rules(None)),
                      judge=StallJudge(stack_after_s=20, stall_after_s=120, held_after_s=7),
                      on_stall=raised.append, scrape=lambda source: next(feed),
                      connections=connections.get)  # fmt: skip
    states = [watch.check().state for _ in range(12)]
    # connections first seen at 5 s, work from 15 s (held 10 s >= 7 s), dumps from then, the
    # same stack for 20 s: raised at 35 s
    assert states[:3] == [State.IDLE] * 3 and states[3:7] == [State.LONG_STEP] * 4
    assert states[7:] == [State.STALLED] * 5 and len(raised) == 1
    assert dumped and API.pid not in dumped  # only the engine's stacks are dumped
    line = stall_line(raised[0])  # type: ignore[arg-type]
    assert line.startswith(f"engine_core {ENGINE.pid} stalled in ") and "stopped" in line
    assert "2 client connections held open" in line


def test_held_after_s_is_the_api_servers_keep_alive_plus_a_margin() -> None:
    from sidecar.daemon.hang import held_after_s

    class Env:
        def __init__(self, env: dict[str, str] | None) -> None:
            self.env = env

        def environ(self, pid: int) -> dict[str, str] | None:
            return self.env

    assert held_after_s(Env({}), (API, ENGINE)) == 7.0  # type: ignore[arg-type]
    assert held_after_s(Env(None), (API,)) == 7.0  # type: ignore[arg-type]
    assert held_after_s(Env({"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "30"}), (API,)) == 32.0  # type: ignore[arg-type]
    assert held_after_s(Env({"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "x"}), (API,)) == 7.0  # type: ignore[arg-type]
