"""Hang detection: an engine that stopped stepping while requests wait, told from an idle
server and from one long step by explicit thresholds.

vLLM users report EngineCores that freeze while the API server goes on answering `/health`
with 200. From outside the process two signs show it:
- vLLM's own counters stop: no token generated, no prompt token prefilled, no step counted
  (`vllm:iteration_tokens_total`), no request finished, while `num_requests_running` or
  `num_requests_waiting` says there is work;
- the EngineCore's (or a worker's) main thread shows the same stack in every dump.

The judge (`StallJudge`, pure) reads both:
- no work pending: `idle`, whatever the counters do;
- counters moving: `ok`;
- counters flat with work pending: `long_step` (a prefill of a huge prompt is one step, and no
  counter moves until it ends) until either the engine processes' main-thread stacks have stayed
  the same in every dump for `stack_after_s` (a running step moves through the model's layers;
  a frozen one does not), or the counters have stayed flat for `stall_after_s` whatever the
  stacks do (no step of a serving engine takes that long): then `stalled`;
- counters moving again clear it.

The watch (`HangWatch`, a thread of the daemon) scrapes /metrics every `check_s`, dumps the
engine processes' stacks (`py-spy dump --nonblocking`, never pausing them) only while the
counters are flat with work pending, and on a stall writes an incident with a `py-spy dump
--native` of every process. Its own dumps rather than the continuous samples: those reach the
daemon once a segment (60 s), too late for a threshold of seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from sidecar.classify.classifier import Classifier
from sidecar.parsers import InputFormat, parse_text
from sidecar.records import ProcessInfo, Role, StackSample
from sidecar.sampling.pyspy import last_line
from sidecar.target.procfs import ProcFs
from sidecar.vllm_metrics import MetricsScrape, MetricsSource, take_scrape
from sidecar.vllm_metrics.figures import (
    GENERATION_TOKENS,
    PROMPT_TOKENS,
    REQUEST_SUCCESS,
    RUNNING,
    TTFT,
    WAITING,
)

log = logging.getLogger("vllm_sidecar")

# A step counter: the histogram of tokens per engine step counts one per step (V1).
STEPS = ("vllm:iteration_tokens_total",)
ENGINE_ROLES = (Role.ENGINE_CORE, Role.WORKER)  # the processes whose main thread steps


class State(StrEnum):
    UNKNOWN = "unknown"  # /metrics not read: no judgement
    IDLE = "idle"  # no request running or waiting
    OK = "ok"  # counters moving
    LONG_STEP = "long_step"  # work pending, counters flat, below the thresholds
    STALLED = "stalled"


@dataclass(frozen=True, slots=True)
class Progress:
    """What one scrape says of the engine's progress."""

    at: float  # monotonic
    pending: float | None  # requests running + waiting; None: not read
    count: float | None  # tokens, steps and finished requests so far; None: not read
    # Clients' connections the API server has kept open while the counters sat still: how
    # many, and how long the oldest has been seen (None: not read, see `HangWatch`).
    held: int = 0
    held_s: float | None = None


# What the watch and the latency triggers read: the rest of vLLM's text is not parsed.
WATCHED = (*RUNNING, *WAITING, *GENERATION_TOKENS, *PROMPT_TOKENS, *REQUEST_SUCCESS, *STEPS,
           *TTFT)  # fmt: skip


def watch_scrape(source: MetricsSource) -> MetricsScrape:
    return take_scrape(source, only=WATCHED)


def progress_of(scrape: MetricsScrape) -> Progress:
    if not scrape.ok:
        return Progress(scrape.taken_at, None, None)

    def total(names: tuple[str, ...], suffixes: tuple[str, ...]) -> float | None:
        found = [scrape.samples[f"{n}{s}"] for n in names for s in suffixes
                 if f"{n}{s}" in scrape.samples]  # fmt: skip
        return sum(v for series in found[:1] for _, v in series) if found else None

    pending = [total(RUNNING, ("",)), total(WAITING, ("",))]
    counts = [total(GENERATION_TOKENS, ("_total", "")), total(PROMPT_TOKENS, ("_total", "")),
              total(REQUEST_SUCCESS, ("_total", "")), total(STEPS, ("_count",))]  # fmt: skip
    known_pending = [p for p in pending if p is not None]
    known = [c for c in counts if c is not None]
    return Progress(
        scrape.taken_at,
        sum(known_pending) if known_pending else None,
        sum(known) if known else None,
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    state: State
    flat_s: float = 0.0  # how long the counters have been flat with work pending
    same_stack_s: float = 0.0  # how long the engine's main-thread stacks have stayed the same
    pending: float | None = None
    why: str = ""


@dataclass
class StallJudge:
    """The stall decision over successive readings (pure: times are the readings').

    Work is pending when vLLM's gauges say requests run or wait, or when clients' connections
    have stayed open for `held_after_s` while no counter moved: the server closes a connection
    left idle for its keep-alive timeout (vLLM: 5 s), so one open longer than that with no
    request finished carries a request not yet answered. The gauges alone are the engine's
    last scheduler stats: an engine frozen between two batches leaves them at 0 for ever.
    """

    stack_after_s: float
    stall_after_s: float
    held_after_s: float = 10.0
    _count: float | None = None
    _moved_at: float | None = None
    _stacks: tuple[object, ...] | None = None
    _same_since: float | None = None

    def flat(self, p: Progress) -> bool:
        """Whether the counters sit where the last reading left them."""
        return p.count is not None and p.count == self._count

    def held(self, p: Progress) -> bool:
        """Whether clients' connections have waited long enough to carry requests."""
        return bool(p.held) and p.held_s is not None and p.held_s >= self.held_after_s

    def suspect(self, p: Progress) -> bool:
        """Whether this reading calls for dumps: work pending and the counters where they were."""
        return self.flat(p) and (bool(p.pending) or self.held(p))

    def observe(self, p: Progress, stacks: tuple[object, ...] | None = None) -> Verdict:
        """`stacks`: the engine processes' main-thread stacks now, when dumped (None: not)."""
        if p.pending is None or p.count is None:
            self._count, self._moved_at = None, None
            self._stacks = self._same_since = None
            return Verdict(State.UNKNOWN, why="vLLM's /metrics could not be read")
        moved = not self.flat(p)
        if moved or not (p.pending > 0 or self.held(p)):
            self._count, self._moved_at = p.count, p.at
            self._stacks = self._same_since = None
            state = State.OK if moved and p.pending > 0 else State.IDLE
            return Verdict(state, pending=p.pending)
        assert self._moved_at is not None
        if p.pending <= 0 and p.held_s is not None:  # waiting since the oldest connection came
            self._moved_at = min(self._moved_at, p.at - p.held_s)
        flat = p.at - self._moved_at
        if stacks is not None and stacks != self._stacks:
            self._stacks, self._same_since = stacks, p.at
        same = p.at - self._same_since if self._same_since is not None else 0.0
        work = (f"{p.pending:.0f} requests running or waiting" if p.pending > 0 else
                f"{p.held} client connections held open for up to {p.held_s or 0:.0f} s "
                f"(vLLM's gauges say none running or waiting)")  # fmt: skip
        if flat >= self.stall_after_s:
            why = (f"no token, step or finished request for {flat:.0f} s with {work} "
                   f"(hang.stall_after_s: {self.stall_after_s:g} s)")  # fmt: skip
            return Verdict(State.STALLED, flat, same, p.pending, why)
        if self._same_since is not None and same >= self.stack_after_s:
            why = (f"the engine's main-thread stack unchanged for {same:.0f} s and no step for "
                   f"{flat:.0f} s with {work} "
                   f"(hang.stack_after_s: {self.stack_after_s:g} s)")  # fmt: skip
            return Verdict(State.STALLED, flat, same, p.pending, why)
        return Verdict(State.LONG_STEP, flat, same, p.pending,
                       f"one step running for {flat:.0f} s")  # fmt: skip


# vLLM's API server (uvicorn) closes a connection left idle this long after its last answer
# (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default); a connection open longer than that, plus a
# margin for the timer, with no request finished, carries a request not yet answered.
KEEP_ALIVE_ENV, KEEP_ALIVE_S, KEEP_ALIVE_MARGIN_S = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", 5.0, 2.0


def held_after_s(procfs: ProcFs, processes: tuple[ProcessInfo, ...]) -> float:
    """How long a client's connection must stay open with nothing moving to count as a request
    waiting: the API server's keep-alive timeout (its environment's, else vLLM's default) plus
    the margin."""
    for proc in processes:
        if proc.role is Role.API_SERVER:
            value = (procfs.environ(proc.pid) or {}).get(KEEP_ALIVE_ENV, "")
            try:
                if float(value) > 0:
                    return float(value) + KEEP_ALIVE_MARGIN_S
            except ValueError:
                continue
    return KEEP_ALIVE_S + KEEP_ALIVE_MARGIN_S


# ------------------------------------------------------------------------------ the watch


@dataclass(frozen=True, slots=True)
class MainThread:
    """One engine process's main thread as a dump showed it."""

    process: ProcessInfo
    stack: StackSample | None  # None: the dump failed or had no main thread
    state: str | None  # /proc's thread state: R, S, D, T (stopped), t (traced), Z
    error: str | None = None

    @property
    def frames(self) -> tuple[object, ...]:
        return tuple(self.stack.frames) if self.stack is not None else ()


@dataclass(frozen=True, slots=True)
class Stall:
    """A stall as raised: which role, where its main thread stood, why."""

    role: Role
    pid: int
    frame: str  # the innermost frame, as py-spy names it
    verdict: Verdict
    process_state: str | None


def blame(threads: tuple[MainThread, ...], classifier: Classifier, verdict: Verdict) -> Stall:
    """Which engine process the stall is in: a stopped one (SIGSTOP, a debugger), else one whose
    main thread is not waiting for another (its frame is not `idle`), else the EngineCore."""

    def idle(t: MainThread) -> bool:
        if t.stack is None:
            return False
        label = classifier.classify(t.stack, t.process.title)
        return label.phase.value == "idle"

    order = sorted(threads, key=lambda t: (
        t.state not in ("T", "t"), idle(t), t.process.role is not Role.ENGINE_CORE))  # fmt: skip
    chosen = order[0]
    frame = chosen.stack.frames[0].label() if chosen.stack and chosen.stack.frames else "unknown"
    return Stall(chosen.process.role, chosen.process.pid, frame, verdict, chosen.state)


Dump = Callable[[int, bool], tuple[int, str]]  # (pid, native) -> (exit code, output)


@dataclass
class HangWatch:
    """The daemon's watch over one target: every `check_s` a scrape, dumps when suspect."""

    processes: tuple[ProcessInfo, ...]
    metrics: MetricsSource
    dump: Dump
    procfs: ProcFs
    classifier: Classifier
    judge: StallJudge
    check_s: float = 5.0
    on_stall: Callable[[Stall], None] = lambda s: None  # raised (once per stall)
    on_clear: Callable[[Stall, float], None] = lambda s, seconds: None
    on_verdict: Callable[[Verdict, Stall | None], None] = lambda v, s: None  # every check
    on_scrape: Callable[[MetricsScrape], None] = lambda s: None  # the latency triggers read it
    clock: Callable[[], float] = time.monotonic
    scrape: Callable[[MetricsSource], MetricsScrape] = field(default=lambda s: watch_scrape(s))
    dumps: bool = True  # False: the scrapes alone, for the latency trigger (hang.enabled off)
    # pid -> the clients' connections it holds (socket inodes); None: unreadable. Default:
    # `procfs.client_connections` (sidecar/target/sockets.py).
    connections: Callable[[int], frozenset[int] | None] | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    stall: Stall | None = None
    _thread: threading.Thread | None = None
    _seen: dict[tuple[int, int], float] = field(default_factory=dict)  # connection -> first seen
    _unreadable_said: bool = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="hang-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.check_s + 35)

    def run(self) -> None:
        deadline = self.clock()
        while not self.stop.is_set():
            try:
                self.check()
            except Exception:  # a bug here must not end the daemon: said, and the watch goes on
                log.exception("hang watch: a check failed")
            deadline += self.check_s
            while deadline <= self.clock():  # late checks are skipped, not bunched
                deadline += self.check_s
            if self.stop.wait(deadline - self.clock()):
                return

    def check(self) -> Verdict:
        scrape = self.scrape(self.metrics)
        self.on_scrape(scrape)
        p = progress_of(scrape)
        if not self.dumps:  # hang detection off: the scrape was for the latency trigger
            return Verdict(State.UNKNOWN, why="hang detection is off (hang.enabled)")
        p = self.with_connections(p) if self.judge.flat(p) else self.forget_connections(p)
        threads = self.main_threads() if self.judge.suspect(p) else None
        stacks = tuple(t.frames for t in threads) if threads is not None else None
        verdict = self.judge.observe(p, stacks)
        if verdict.state is State.STALLED and self.stall is None:
            self.stall = blame(threads or self.main_threads(), self.classifier, verdict)
            self.on_stall(self.stall)
        elif verdict.state is not State.STALLED and self.stall is not None:
            if verdict.state is not State.LONG_STEP:  # progress resumed (or the server idles)
                raised, self.stall = self.stall, None
                self.on_clear(raised, verdict.flat_s or (self.clock() - p.at))
        elif self.stall is not None:
            self.stall = Stall(self.stall.role, self.stall.pid, self.stall.frame, verdict,
                               self.stall.process_state)  # fmt: skip
        self.on_verdict(verdict, self.stall)
        return verdict

    def with_connections(self, p: Progress) -> Progress:
        """P with the clients' connections the API server processes have held open since the
        counters last moved (a connection is timed from the first check that saw it)."""
        now: set[tuple[int, int]] = set()
        unreadable = []
        for proc in self.processes:
            if proc.role is not Role.API_SERVER:
                continue
            read = self.connections or self.procfs.client_connections
            found = read(proc.pid)
            if found is None:
                unreadable.append(proc.pid)
                continue
            now.update((proc.pid, inode) for inode in found)
        if unreadable and not now:
            if not self._unreadable_said:
                self._unreadable_said = True
                log.warning("hang watch: the API server's connections cannot be read "
                            "(/proc/%s/fd needs ptrace-read access, as py-spy does): work "
                            "pending is judged from vLLM's gauges alone, which an engine frozen "
                            "between two batches leaves at 0", unreadable[0])  # fmt: skip
            return p
        self._seen = {key: self._seen.get(key, p.at) for key in now}
        oldest = min(self._seen.values(), default=p.at)
        return replace(p, held=len(now), held_s=p.at - oldest)

    def forget_connections(self, p: Progress) -> Progress:
        """The counters moved: connections are timed afresh from the next flat check."""
        self._seen = {}
        return p

    def main_threads(self) -> tuple[MainThread, ...]:
        """Each engine process's main thread now (`py-spy dump --nonblocking`: never paused)."""
        out = []
        for p in self.processes:
            if p.role not in ENGINE_ROLES:
                continue
            state = next((t.state for t in self.procfs.thread_times(p.pid) if t.tid == p.pid),
                         None)  # fmt: skip
            code, text = self.dump(p.pid, False)
            if code != 0:
                out.append(MainThread(p, None, state, text.strip()[-200:] or f"exit {code}"))
                continue
            stacks = parse_text(text, f"dump of {p.pid}", InputFormat.PYSPY_DUMP).stacks
            main = next((s for s in stacks if s.thread_id == str(p.pid)), None)
            out.append(MainThread(p, main, state))
        return tuple(out)


def stall_line(stall: Stall) -> str:
    """The log line naming where it is stuck."""
    stopped = {"T": " (the process is stopped: SIGSTOP?)", "t": " (the process is being traced)",
               "D": " (in uninterruptible sleep: I/O or a driver)"}  # fmt: skip
    extra = stopped.get(stall.process_state or "", "")
    return (f"{stall.role.value} {stall.pid} stalled in {stall.frame}{extra}: "
            f"{stall.verdict.why}")  # fmt: skip


def dumps_of(processes: tuple[ProcessInfo, ...], dump: Dump) -> Mapping[int, tuple[str, str]]:
    """An incident's dumps: `py-spy dump --native` of every process (it pauses each for the
    moment of the dump: only on a stall), falling back to `--nonblocking` without native frames
    where that fails (a process py-spy cannot pause). pid -> (how it was taken, text)."""
    out: dict[int, tuple[str, str]] = {}
    for p in processes:
        code, text = dump(p.pid, True)
        if code == 0 and text.strip():
            out[p.pid] = ("py-spy dump --native", text)
            continue
        why = last_line(text) or f"exit {code}"
        code2, text2 = dump(p.pid, False)
        how = f"py-spy dump --nonblocking (--native failed: {why})"
        out[p.pid] = (how, text2 if code2 == 0 else f"{how}\nfailed too: {text2}")
    return out
